// Types of visionmoe-pgms (the decoder). The Spark loader's are in spark.d.ts.

/** One decoded level: float32 arrays in the Python decoder's layout and values, bit for bit. */
export interface PgmsScene {
  /** number of Gaussians */
  count: number;
  /** spherical-harmonics degree, 0-3 */
  shDegree: number;
  /** the pyramid level these Gaussians form (0 = coarsest) */
  level: number;
  /** [count * 3] centres x, y, z */
  means: Float32Array;
  /** [count * 4] rotations as quaternions w, x, y, z */
  quats: Float32Array;
  /** [count * 3] natural-log scales */
  logScales: Float32Array;
  /** [count] opacity logits (opacity = sigmoid) */
  opacityLogits: Float32Array;
  /** [count * 3] SH degree-0 coefficients, RGB */
  shDc: Float32Array;
  /** [count * K * 3] higher SH coefficients, K = (shDegree + 1)^2 - 1, band-major, RGB innermost */
  shRest: Float32Array;
}

/** The HEAD section: pyramid and quantiser parameters. */
export interface PgmsHeader {
  numLevels: number;
  shDegree: number;
  opBits: number;
  rotBits: number;
  level0: number;
  totalNodes: number;
  sourceGaussians: number;
  shapeCodebook: number;
  posRel: number;
  dcStep: number;
  lsStep: number;
  minStep: number;
  hasShCodebook: number;
  shCodebookDegree: number;
  shCodebook: number;
  origin: [number, number, number];
  referenceBytes: number;
}

export interface PgmsVersion {
  major: number;
  minor: number;
}

export interface DecodedPgms {
  header: PgmsHeader;
  version: PgmsVersion;
  /** levels decoded */
  levels: number;
  /** the finest decoded level (or the one asked for) */
  scene: PgmsScene;
}

/** A completed level, as PgmsStream.push reports it. */
export interface PgmsLevel {
  level: number;
  scene: PgmsScene;
  /** bytes of the file that hold this level (the end of its section) */
  bytes: number;
}

/** Every decoding error: the message names the section or stream at fault. */
export class FormatError extends Error {}

/** The 8-byte .pgms signature. */
export const MAGIC: readonly number[];
/** The format major versions this decoder reads. */
export const READABLE_MAJORS: readonly number[];

/**
 * A (possibly valid) file whose declared node counts need more memory to decode than its size
 * justifies, max(64 MiB, 256 x its size), or than `maxMemory`: a decompression bomb unless the
 * caller trusts the file. Thrown before anything is decoded; the Python decoder's rule.
 */
export class DecodeMemoryError extends FormatError {}

/**
 * Decode a whole .pgms, or a prefix of one up to `level`. Throws FormatError on bad input and
 * DecodeMemoryError when the file needs more than `maxMemory` bytes (default
 * max(64 MiB, 256 x bytes.length)).
 */
export function decodePgms(bytes: Uint8Array | ArrayBuffer, options?: { level?: number; maxMemory?: number }): DecodedPgms;

/** The format version of a file's first 12 bytes (FormatError if not a readable .pgms). */
export function readPreamble(bytes: Uint8Array): PgmsVersion;

/** Incremental decoder: push bytes as they arrive; each completed level is decoded at once. */
export class PgmsStream {
  /**
   * @param options.fileSize the whole file's size when known: bounds the node count, and each
   *   level is checked against the memory budget max(64 MiB, 256 x fileSize) before it is decoded
   * @param options.maxMemory the bytes the decode may need instead of that budget
   */
  constructor(options?: { fileSize?: number; maxMemory?: number });
  /** null until the HEAD section has arrived */
  readonly header: PgmsHeader | null;
  /** null until the first 12 bytes have arrived */
  readonly version: PgmsVersion | null;
  readonly bytesReceived: number;
  /** true once the END0 section has arrived */
  readonly finished: boolean;
  /** Append bytes; returns the levels they completed (often none, sometimes several). */
  push(chunk: Uint8Array): PgmsLevel[];
  /** Call at the end of the input: throws FormatError if the file was incomplete. */
  end(): void;
  /** The scene at a decoded level (its own nodes and the terminal nodes of coarser levels). */
  scene(level: number): PgmsScene;
}

/** A camera looking at the scene: the first orbit view of `visionmoe-splat render --views 1`. */
export function orbitCamera(
  scene: PgmsScene,
  options?: { fovDeg?: number; elevationDeg?: number; radiusScale?: number; quantile?: number },
): { viewmat: number[]; fovx: number; target: number[] };

/** An INRIA-layout binary .ply of a decoded scene (for renderers that only read files). */
export function sceneToPly(scene: PgmsScene): Uint8Array;
