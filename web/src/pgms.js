// Decoder of .pgms (PGMS) bitstreams, formats 4.x and 5.x, in plain JavaScript (ES module).
//
// The normative description is docs/FORMAT.md; the Python reference decoder is
// visionmoe/splat (decompress). Every level decodes to exactly the float32 values of the
// Python decoder: the arithmetic below is the same IEEE double arithmetic in the same order
// (only +, -, *, /, sqrt, plus exp and log whose results are rounded to float32).
//
//   import { decodePgms, PgmsStream } from "./pgms.js";
//   const { header, scene } = decodePgms(bytes);           // finest level
//   const coarse = decodePgms(prefixBytes, { level: 0 });   // any prefix holding level 0
//   const s = new PgmsStream(); s.push(chunk) -> [{ level, scene }, ...] as levels complete

import { decompress as zstdDecompress } from "fzstd";
import { FormatError, ransDecode, MAX_ALPHABET } from "./rans.js";
import { checkMemory, DecodeMemoryError } from "./memory.js";

export { FormatError, DecodeMemoryError };

export const MAGIC = [0x89, 0x50, 0x47, 0x4d, 0x53, 0x0d, 0x0a, 0x1a];
export const READABLE_MAJORS = [4, 5];
const GLOBAL_LEVEL = 255;
const MAX_NODES = 2 ** 28;
const MAX_SYMBOLS = 2 ** 30;
const MAX_CHILDREN = 255;
const FLAG_COPIES = 1; // HEAD flags (offset 38, format 5.1+): the fine tier ends with the stream `copies`
const MAX_COPIES = 16; // source rows one fine-tier node may stand for
const MAX_PALETTE = 4096;
const BIG = 2 ** 40;
const MAX_ABS_LOG_SCALE = 80; // every decoded log-scale, before and after XFRM (exp finite in float32)
const MAX_ABS_DC_TABLE = 1e37; // PALT tables of DC colours (colours stay finite in float32)
const CODER_RAW = 0, CODER_ZSTD = 1, CODER_LZMA = 2, CODER_CONSTRICTION = 3, CODER_RANS = 4;
const KIND_INT = 0, KIND_F16 = 1, KIND_F32 = 2;
const PALETTE_CHANNELS = ["dc0", "dc1", "dc2", "op", "ls0", "ls1", "ls2"];
const PALETTE_PREDICTED = 2;
const f32 = Math.fround;

// ------------------------------------------------------------------------------ CRC-32

const CRC_TABLE = (() => {
  const t = new Int32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    t[n] = c;
  }
  return t;
})();

export function crc32(bytes, crc = 0) {
  let c = ~crc;
  for (let i = 0; i < bytes.length; i++) c = CRC_TABLE[(c ^ bytes[i]) & 0xff] ^ (c >>> 8);
  return ~c >>> 0;
}

// ------------------------------------------------------------------------------ helpers

function halfToFloat(h) {
  const s = h & 0x8000 ? -1 : 1;
  const e = (h >> 10) & 0x1f;
  const m = h & 0x3ff;
  if (e === 0) return s * m * 2 ** -24;
  if (e === 31) return m ? NaN : s * Infinity;
  return s * (1 + m / 1024) * 2 ** (e - 15);
}

// The frame rules of the Python decoder (pgms/coders.py, zstd_decompress) and of libzstd, which
// fzstd does not apply: one frame and nothing after it, no reserved bits or block types, no
// dictionary, a window of at most 2^27 bytes (libzstd's default limit), a declared content size
// (if any) equal to the stream's, and at most 32768 output bytes per input byte (+64).
const ZSTD_MAX_EXPANSION = 32768;
const ZSTD_MAX_WINDOW = 2 ** 27;

function checkZstdFrame(b, size, where) {
  const bad = (why) => new FormatError(`${where}: corrupt zstd stream (${why})`);
  if (size > ZSTD_MAX_EXPANSION * b.length + 64) throw new FormatError(`${where}: zstd stream of ${b.length} bytes cannot hold the ${size} bytes it claims`);
  if (!size) return;
  if (b.length < 5 || b[0] !== 0x28 || b[1] !== 0xb5 || b[2] !== 0x2f || b[3] !== 0xfd) throw bad("no zstd frame magic");
  const fhd = b[4], fcsFlag = fhd >> 6, single = (fhd >> 5) & 1, checksum = (fhd >> 2) & 1, dictFlag = fhd & 3;
  if (fhd & 0x08) throw bad("reserved frame header bit set");
  const fcsBytes = [single, 2, 4, 8][fcsFlag];
  let pos = 5 + (single ? 0 : 1) + [0, 1, 2, 4][dictFlag] + fcsBytes;
  if (pos > b.length) throw bad("truncated frame header");
  let p = 5;
  if (!single) {
    const wd = b[p++], windowLog = 10 + (wd >> 3), base = 2 ** windowLog;
    if (base + (base / 8) * (wd & 7) > ZSTD_MAX_WINDOW) throw bad("window larger than 2^27 bytes");
  }
  let dict = 0;
  for (let k = 0; k < [0, 1, 2, 4][dictFlag]; k++) dict += b[p++] * 2 ** (8 * k);
  if (dict) throw bad("frame needs a dictionary");
  if (fcsBytes) {
    let fcs = 0;
    for (let k = 0; k < fcsBytes; k++) fcs += b[p + k] * 2 ** (8 * k);
    if (fcsFlag === 1) fcs += 256;
    if (fcs !== size) throw bad(`its frame declares ${fcs} bytes, expected ${size}`);
  }
  for (;;) {
    if (pos + 3 > b.length) throw bad("truncated block header");
    const h = b[pos] | (b[pos + 1] << 8) | (b[pos + 2] << 16);
    const last = h & 1, type = (h >> 1) & 3, bsize = h >>> 3;
    if (type === 3) throw bad("reserved block type");
    pos += 3 + (type === 1 ? 1 : bsize);
    if (last) break;
  }
  pos += checksum ? 4 : 0;
  if (pos !== b.length) throw new FormatError(`${where}: zstd stream of ${b.length} bytes: ${b.length - pos} bytes follow its frame`);
}

function unzstd(body, size, where) {
  checkZstdFrame(body, size, where);
  let out;
  try {
    out = zstdDecompress(body);
  } catch (e) {
    throw new FormatError(`${where}: corrupt zstd stream (${e.message})`);
  }
  if (out.length !== size) throw new FormatError(`${where}: zstd stream decoded to ${out.length} bytes, expected ${size}`);
  return out;
}

/** Unsigned integers of `width` bytes stored as byte planes -> Float64Array (exact below 2^53). */
function unplanes(raw, n, width, where) {
  const out = new Float64Array(n);
  for (let b = 0; b < width; b++) {
    const plane = raw.subarray(b * n, (b + 1) * n);
    const mul = 2 ** (8 * b);
    if (b >= 7) {
      for (let i = 0; i < n; i++) if (plane[i]) throw new FormatError(`${where}: value beyond 2^53`);
    } else if (b === 6) {
      for (let i = 0; i < n; i++) {
        if (plane[i] > 0x1f) throw new FormatError(`${where}: value beyond 2^53`);
        out[i] += plane[i] * mul;
      }
    } else {
      for (let i = 0; i < n; i++) out[i] += plane[i] * mul;
    }
  }
  return out;
}

function unzigzag(u) {
  // u even -> u / 2, odd -> -(u + 1) / 2
  const v = new Float64Array(u.length);
  for (let i = 0; i < u.length; i++) {
    const x = u[i];
    v[i] = x % 2 === 0 ? x / 2 : -(x + 1) / 2;
  }
  return v;
}

// ------------------------------------------------------------------------------ streams

/** Bytes per value of an integer stream whose largest zigzag symbol is `maxval` (FORMAT.md: the smallest that holds it). */
function byteWidth(maxval) {
  return maxval < 2 ** 8 ? 1 : maxval < 2 ** 16 ? 2 : maxval < 2 ** 32 ? 4 : 8;
}

class StreamReader {
  constructor(payload, where) {
    this.b = payload;
    this.dv = new DataView(payload.buffer, payload.byteOffset, payload.byteLength);
    this.pos = 0;
    this.where = where;
  }

  head(name) {
    const { b, dv, where } = this;
    if (this.pos + 20 > b.length) {
      throw new FormatError(`${where}: stream '${name}' truncated (needs 20 header bytes, ${b.length - this.pos} remain)`);
    }
    const p = this.pos;
    const kind = b[p], coder = b[p + 1], width = b[p + 2], pad = b[p + 3];
    const n = dv.getUint32(p + 4, true);
    const alphabet = dv.getUint32(p + 8, true) + dv.getUint32(p + 12, true) * 2 ** 32;
    const size = dv.getUint32(p + 16, true);
    this.pos += 20;
    if (pad || coder > 4 || ![1, 2, 4, 8].includes(width) || n >= MAX_SYMBOLS) {
      throw new FormatError(`${where}: stream '${name}' has an invalid header (coder ${coder}, width ${width}, n ${n})`);
    }
    if (this.pos + size > b.length) {
      throw new FormatError(`${where}: stream '${name}' declares ${size} bytes, ${b.length - this.pos} remain`);
    }
    const body = b.subarray(this.pos, this.pos + size);
    this.pos += size;
    return { kind, coder, width, n, alphabet, body };
  }

  peek(name) {
    const p = this.pos;
    try {
      return this.head(name);
    } finally {
      this.pos = p;
    }
  }

  /** Signed integer stream -> Float64Array of exact integers. */
  ints(name, nExpected, lo, hi) {
    const { kind, coder, width, n, alphabet, body } = this.head(name);
    const where = `${this.where}: stream '${name}'`;
    if (kind !== KIND_INT) throw new FormatError(`${where} is not an integer stream`);
    if (nExpected !== undefined && n !== nExpected) throw new FormatError(`${where} holds ${n} values, expected ${nExpected}`);
    if (alphabet > 2 ** (8 * width) || (n && alphabet === 0) || (n && width !== byteWidth(alphabet - 1))) {
      throw new FormatError(`${where} alphabet ${alphabet} does not fit width ${width}`);
    }
    const size = n * width;
    let u;
    if (coder === CODER_RAW) {
      if (body.length !== size) throw new FormatError(`${where}: raw stream has ${body.length} bytes, expected ${size}`);
      u = unplanes(body, n, width, where);
    } else if (coder === CODER_ZSTD) {
      u = unplanes(unzstd(body, size, where), n, width, where);
    } else if (coder === CODER_RANS) {
      if (alphabet > MAX_ALPHABET) throw new FormatError(`${where}: rANS alphabet ${alphabet} exceeds ${MAX_ALPHABET}`);
      const s = ransDecode(body, n, alphabet);
      u = Float64Array.from(s);
    } else {
      const what = coder === CODER_LZMA ? "LZMA" : coder === CODER_CONSTRICTION ? "constriction rANS" : `coder ${coder}`;
      throw new FormatError(`${where}: ${what} streams belong to format 1-3, not 4`);
    }
    let mn = Infinity, mx = -Infinity;
    for (let i = 0; i < n; i++) {
      if (u[i] >= alphabet) throw new FormatError(`${where} holds a symbol outside its declared alphabet`);
    }
    const v = unzigzag(u);
    for (let i = 0; i < n; i++) {
      if (v[i] < mn) mn = v[i];
      if (v[i] > mx) mx = v[i];
    }
    if (n && ((lo !== undefined && mn < lo) || (hi !== undefined && mx > hi))) {
      throw new FormatError(`${where} values [${mn}, ${mx}] outside [${lo}, ${hi}]`);
    }
    return v;
  }

  /** float16/float32 table -> Float32Array. */
  floats(name, nExpected) {
    const { kind, coder, width, n, body } = this.head(name);
    const where = `${this.where}: stream '${name}'`;
    if (!(kind === KIND_F16 || kind === KIND_F32) || width !== (kind === KIND_F16 ? 2 : 4) || !(coder === CODER_RAW || coder === CODER_ZSTD)) {
      throw new FormatError(`${where} is not a float stream`);
    }
    if (nExpected !== undefined && n !== nExpected) throw new FormatError(`${where} holds ${n} values, expected ${nExpected}`);
    const size = n * width;
    const raw = coder === CODER_RAW ? body : unzstd(body, size, where);
    if (raw.length !== size) throw new FormatError(`${where}: float stream has ${raw.length} bytes, expected ${size}`);
    const out = new Float32Array(n);
    if (width === 2) {
      for (let i = 0; i < n; i++) out[i] = halfToFloat(raw[i] | (raw[n + i] << 8));
    } else {
      const u = new Uint32Array(n);
      for (let i = 0; i < n; i++) u[i] = (raw[i] | (raw[n + i] << 8) | (raw[2 * n + i] << 16) | (raw[3 * n + i] << 24)) >>> 0;
      out.set(new Float32Array(u.buffer));
    }
    for (let i = 0; i < n; i++) if (!Number.isFinite(out[i])) throw new FormatError(`${where}: float stream holds NaN/Inf`);
    return out;
  }

  done() {
    if (this.pos !== this.b.length) throw new FormatError(`${this.where}: ${this.b.length - this.pos} unexpected bytes after the last stream`);
  }
}

// ------------------------------------------------------------------------------ container

export function readPreamble(bytes) {
  if (bytes.length < 12) throw new FormatError(`not a .pgms file: ${bytes.length} bytes, shorter than the 12-byte preamble`);
  for (let i = 0; i < 8; i++) if (bytes[i] !== MAGIC[i]) throw new FormatError("not a .pgms file: bad magic");
  const major = bytes[8] | (bytes[9] << 8);
  const minor = bytes[10] | (bytes[11] << 8);
  if (!READABLE_MAJORS.includes(major)) {
    throw new FormatError(`.pgms format version ${major}.${minor} is not supported by this decoder (reads 4.x and 5.x); re-encode with visionmoe >= format 4`);
  }
  return { major, minor };
}

/**
 * The next complete section at `pos`, or null when the bytes end before it does.
 * Checks the header and the CRC.
 */
export function nextSection(bytes, pos) {
  if (pos + 16 > bytes.length) return null;
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const tag = String.fromCharCode(bytes[pos], bytes[pos + 1], bytes[pos + 2], bytes[pos + 3]);
  if (!/^[A-Za-z0-9]{4}$/.test(tag)) throw new FormatError(`corrupt .pgms: section tag at byte ${pos}`);
  const level = bytes[pos + 4];
  if (bytes[pos + 5] || dv.getUint16(pos + 6, true)) throw new FormatError(`corrupt .pgms: reserved bytes of section ${tag} at byte ${pos} are not zero`);
  const length = dv.getUint32(pos + 8, true);
  const crc = dv.getUint32(pos + 12, true);
  if (pos + 16 + length > bytes.length) return null;
  const payload = bytes.subarray(pos + 16, pos + 16 + length);
  if (crc32(payload, crc32(bytes.subarray(pos, pos + 12))) !== crc) {
    throw new FormatError(`corrupt .pgms: checksum mismatch in section ${tag} (level ${level}) at byte ${pos}`);
  }
  if ((tag === "LEVL") === (level === GLOBAL_LEVEL)) {
    throw new FormatError(`corrupt .pgms: section ${tag} at byte ${pos} has level byte ${level}, expected `
      + (tag === "LEVL" ? "0-254" : `${GLOBAL_LEVEL} (a global section)`));
  }
  return { tag, level, payload, offset: pos, end: pos + 16 + length };
}

export function parseHeader(payload, fileSize, version = { major: 5, minor: 0 }) {
  if (payload.length !== 68) throw new FormatError(`HEAD section has ${payload.length} bytes, expected 68`);
  const dv = new DataView(payload.buffer, payload.byteOffset, payload.byteLength);
  const u32 = (o) => dv.getUint32(o, true);
  const h = {
    numLevels: payload[0], shDegree: payload[1], opBits: payload[2], rotBits: payload[3],
    level0: u32(4), totalNodes: u32(8), sourceGaussians: u32(12), shapeCodebook: u32(16),
    posRel: dv.getFloat32(20, true), dcStep: dv.getFloat32(24, true), lsStep: dv.getFloat32(28, true),
    minStep: dv.getFloat32(32, true), hasShCodebook: payload[36], shCodebookDegree: payload[37],
    shCodebook: u32(40),
    origin: [dv.getFloat32(48, true), dv.getFloat32(52, true), dv.getFloat32(56, true)],
    referenceBytes: u32(60) + u32(64) * 2 ** 32,
  };
  const flags = dv.getUint16(38, true);
  const known = version.major === 5 && version.minor >= 1 ? FLAG_COPIES : 0;
  if ((flags & ~known) || u32(44)) throw new FormatError("HEAD reserved fields are not zero");
  h.copies = (flags & FLAG_COPIES) !== 0;
  if (!(h.numLevels >= 1 && h.numLevels <= 32)) throw new FormatError(`HEAD declares ${h.numLevels} levels, expected 1-32`);
  if (h.shDegree > 3) throw new FormatError(`HEAD declares SH degree ${h.shDegree}, expected 0-3`);
  if (!(h.level0 > 0 && h.level0 <= h.totalNodes && h.totalNodes <= Math.min(MAX_NODES, 64 * fileSize))) {
    throw new FormatError(`HEAD node counts (level 0: ${h.level0}, total: ${h.totalNodes}) are impossible for a ${fileSize}-byte file`);
  }
  const hs = h.hasShCodebook;
  if (!(h.shapeCodebook >= 1 && h.shapeCodebook <= 65536) || h.shCodebook > 65536 || hs > 1 || (hs && (h.shCodebook === 0 || h.shDegree === 0))) {
    throw new FormatError(`HEAD codebook sizes invalid (shape ${h.shapeCodebook}, SH ${h.shCodebook}, flag ${hs})`);
  }
  if ((hs && !(h.shCodebookDegree >= 1 && h.shCodebookDegree <= h.shDegree)) || (!hs && (h.shCodebookDegree || h.shCodebook))) {
    throw new FormatError(`HEAD SH codebook degree ${h.shCodebookDegree} invalid for SH degree ${h.shDegree}`);
  }
  if (!h.origin.every(Number.isFinite)) throw new FormatError("HEAD origin is not finite");
  for (const k of ["posRel", "dcStep", "lsStep", "minStep"]) {
    if (!(Number.isFinite(h[k]) && h[k] > 0 && h[k] < 1e6)) throw new FormatError(`quantiser ${k}=${h[k]} outside (0, 1e6)`);
  }
  if (!(h.opBits >= 1 && h.opBits <= 16) || !(h.rotBits >= 2 && h.rotBits <= 16)) {
    throw new FormatError(`quantiser bits out of range (opacity ${h.opBits}, rotation ${h.rotBits})`);
  }
  return h;
}

// ------------------------------------------------------------------------------ geometry (float64)

/** Unit quaternion of 4 doubles (identity when the norm is <= 1e-12), in place into out[o..o+4). */
function unit(w, x, y, z, out, o) {
  const n = Math.sqrt(w * w + x * x + y * y + z * z);
  if (n > 1e-12) {
    const d = Math.max(n, 1e-12);
    out[o] = w / d; out[o + 1] = x / d; out[o + 2] = y / d; out[o + 3] = z / d;
  } else {
    out[o] = 1; out[o + 1] = 0; out[o + 2] = 0; out[o + 3] = 0;
  }
}

/** Row-major rotation matrix of a unit wxyz quaternion. */
function rotmat(w, x, y, z, R) {
  R[0] = 1 - 2 * (y * y + z * z); R[1] = 2 * (x * y - w * z); R[2] = 2 * (x * z + w * y);
  R[3] = 2 * (x * y + w * z); R[4] = 1 - 2 * (x * x + z * z); R[5] = 2 * (y * z - w * x);
  R[6] = 2 * (x * z - w * y); R[7] = 2 * (y * z + w * x); R[8] = 1 - 2 * (x * x + y * y);
}

/** Proper rotation matrix (row-major) -> unit wxyz quaternion with w >= 0, in float64. */
function rotmatToQuat(m, out, o) {
  const [m00, m01, m02, m10, m11, m12, m20, m21, m22] = m;
  const diag = [m00 + m11 + m22, m00, m11, m22];
  let best = 0;
  for (let k = 1; k < 4; k++) if (diag[k] > diag[best]) best = k;
  let q;
  if (best === 0) q = [1 + m00 + m11 + m22, m21 - m12, m02 - m20, m10 - m01];
  else if (best === 1) q = [m21 - m12, 1 + m00 - m11 - m22, m01 + m10, m02 + m20];
  else if (best === 2) q = [m02 - m20, m01 + m10, 1 - m00 + m11 - m22, m12 + m21];
  else q = [m10 - m01, m02 + m20, m12 + m21, 1 - m00 - m11 + m22];
  unit(q[0], q[1], q[2], q[3], out, o);
  if (out[o] < 0) for (let k = 0; k < 4; k++) out[o + k] = -out[o + k];
}

/** Determinant of a row-major n x n matrix (Gaussian elimination, partial pivoting, float64). Only
 * its sign is used, on matrices orthogonal within 1e-5 (|det| within 1e-4 of 1): rounding cannot flip it. */
function determinant(M, n) {
  const a = Float64Array.from(M);
  let det = 1;
  for (let c = 0; c < n; c++) {
    let p = c;
    for (let r = c + 1; r < n; r++) if (Math.abs(a[r * n + c]) > Math.abs(a[p * n + c])) p = r;
    if (a[p * n + c] === 0) return 0;
    if (p !== c) {
      for (let k = 0; k < n; k++) [a[c * n + k], a[p * n + k]] = [a[p * n + k], a[c * n + k]];
      det = -det;
    }
    det *= a[c * n + c];
    for (let r = c + 1; r < n; r++) {
      const f = a[r * n + c] / a[c * n + c];
      for (let k = c; k < n; k++) a[r * n + k] -= f * a[c * n + k];
    }
  }
  return det;
}

/**
 * Section XFRM (format 5): the coded scene's way back to the scene's frame, validated as the
 * Python decoder does: 9 float64 (quaternion w x y z, translation, scale, log(scale)), then per
 * SH band l = 1..shDegree a float32 [2l+1, 2l+1] matrix (row-major).
 */
export function readTransform(payload, shDegree) {
  let need = 72;
  for (let l = 1; l <= shDegree; l++) need += 4 * (2 * l + 1) ** 2;
  if (payload.length !== need) throw new FormatError(`XFRM: section has ${payload.length} bytes, expected ${need} for SH degree ${shDegree}`);
  const dv = new DataView(payload.buffer, payload.byteOffset, payload.byteLength);
  const v = Array.from({ length: 9 }, (_, i) => dv.getFloat64(8 * i, true));
  if (!v.every(Number.isFinite)) throw new FormatError("XFRM: non-finite transform");
  const [w, x, y, z, tx, ty, tz, scale, logScale] = v;
  const norm = Math.sqrt(w * w + x * x + y * y + z * z);
  if (Math.abs(norm - 1) > 1e-9) throw new FormatError(`XFRM: rotation quaternion of norm ${norm}, expected 1`);
  if (!(scale >= 1e-30 && scale <= 1e30) || Math.max(Math.abs(tx), Math.abs(ty), Math.abs(tz)) > 1e30) {
    throw new FormatError(`XFRM: scale ${scale} or translation out of range`);
  }
  if (Math.abs(Math.log(scale) - logScale) > 1e-9 * Math.max(1, Math.abs(logScale))) {
    throw new FormatError(`XFRM: log-scale ${logScale} is not the log of the scale ${scale}`);
  }
  const bands = [];
  let pos = 72;
  for (let l = 1; l <= shDegree; l++) {
    const n = 2 * l + 1;
    const D = new Float64Array(n * n);
    for (let k = 0; k < n * n; k++, pos += 4) D[k] = dv.getFloat32(pos, true);
    for (let i = 0; i < n; i++) {
      for (let j = 0; j < n; j++) {
        let dot = 0;
        for (let k = 0; k < n; k++) dot += D[i * n + k] * D[j * n + k];
        if (!Number.isFinite(dot) || Math.abs(dot - (i === j ? 1 : 0)) > 1e-5) throw new FormatError(`XFRM: SH band ${l} matrix is not a rotation (orthogonal within 1e-5, determinant +1)`);
      }
    }
    if (!(determinant(D, n) > 0)) throw new FormatError(`XFRM: SH band ${l} matrix is not a rotation (orthogonal within 1e-5, determinant +1)`);
    bands.push(D);
  }
  const R = new Float64Array(9);
  rotmat(w, x, y, z, R);
  return { quat: [w, x, y, z], R, t: [tx, ty, tz], scale, logScale, bands };
}

/**
 * Map a decoded scene (in place) from the file's coded frame to the scene's: the same float64
 * operations in the same order as the Python decoder (pgms/file_transform.py, apply_file_transform_), one
 * float32 rounding per value, so both give the same bits.
 */
function applyTransform(s, xf) {
  const { R, t, scale, bands } = xf;
  const [w, x, y, z] = xf.quat;
  const ls = f32(xf.logScale);
  const K = (s.shDegree + 1) ** 2 - 1;
  const acc = new Float64Array(7);
  for (let i = 0; i < s.count; i++) {
    const m0 = s.means[3 * i], m1 = s.means[3 * i + 1], m2 = s.means[3 * i + 2];
    for (let a = 0; a < 3; a++) {
      s.means[3 * i + a] = scale * (R[3 * a] * m0 + R[3 * a + 1] * m1 + R[3 * a + 2] * m2) + t[a];
      if (!Number.isFinite(s.means[3 * i + a])) throw new FormatError("corrupt .pgms: positions are not finite in the scene's frame (XFRM)");
    }
    const bw = s.quats[4 * i], bx = s.quats[4 * i + 1], by = s.quats[4 * i + 2], bz = s.quats[4 * i + 3];
    s.quats[4 * i] = w * bw - x * bx - y * by - z * bz;
    s.quats[4 * i + 1] = w * bx + x * bw + y * bz - z * by;
    s.quats[4 * i + 2] = w * by - x * bz + y * bw + z * bx;
    s.quats[4 * i + 3] = w * bz + x * by - y * bx + z * bw;
    for (let a = 0; a < 3; a++) {
      s.logScales[3 * i + a] = s.logScales[3 * i + a] + ls;
      if (!(Math.abs(s.logScales[3 * i + a]) <= MAX_ABS_LOG_SCALE)) {
        throw new FormatError(`corrupt .pgms: log-scales leave [-${MAX_ABS_LOG_SCALE}, ${MAX_ABS_LOG_SCALE}] in the scene's frame (XFRM)`);
      }
    }
    for (let l = 1; l <= bands.length; l++) {
      const D = bands[l - 1], n = 2 * l + 1, lo = l * l - 1;
      for (let c = 0; c < 3; c++) {
        const at = (k) => s.shRest[(i * K + lo + k) * 3 + c];
        for (let r = 0; r < n; r++) {
          let v = D[r * n] * at(0);
          for (let k = 1; k < n; k++) v = v + D[r * n + k] * at(k);
          acc[r] = v;
        }
        for (let r = 0; r < n; r++) s.shRest[(i * K + lo + r) * 3 + c] = acc[r];
      }
    }
  }
}

/**
 * Decode CBSR rows (format 4 rule, float64): [l1 l2 l3 | c1 | c2] ->
 * log-scales and unit quaternions as float32.
 */
export function decodeShapeRows(cb, k) {
  const ls = new Float32Array(k * 3);
  const quats = new Float32Array(k * 4);
  const R = new Float64Array(9);
  const q = new Float64Array(4);
  for (let i = 0; i < k; i++) {
    const r = 9 * i;
    ls[3 * i] = cb[r]; ls[3 * i + 1] = cb[r + 1]; ls[3 * i + 2] = cb[r + 2];
    let a0 = cb[r + 3], a1 = cb[r + 4], a2 = cb[r + 5];
    let d = Math.max(Math.sqrt(a0 * a0 + a1 * a1 + a2 * a2), 1e-12);
    const c10 = a0 / d, c11 = a1 / d, c12 = a2 / d;
    const b0 = cb[r + 6], b1 = cb[r + 7], b2 = cb[r + 8];
    const dot = b0 * c10 + b1 * c11 + b2 * c12;
    // c2 = b - (b.c1) c1 + 1e-9 roll(c1, 1)   (roll: (c1_2, c1_0, c1_1))
    a0 = (b0 - dot * c10) + 1e-9 * c12;
    a1 = (b1 - dot * c11) + 1e-9 * c10;
    a2 = (b2 - dot * c12) + 1e-9 * c11;
    d = Math.max(Math.sqrt(a0 * a0 + a1 * a1 + a2 * a2), 1e-12);
    const c20 = a0 / d, c21 = a1 / d, c22 = a2 / d;
    const c30 = c11 * c22 - c12 * c21, c31 = c12 * c20 - c10 * c22, c32 = c10 * c21 - c11 * c20;
    // R = [c1 c2 c3] as columns
    R[0] = c10; R[1] = c20; R[2] = c30;
    R[3] = c11; R[4] = c21; R[5] = c31;
    R[6] = c12; R[7] = c22; R[8] = c32;
    rotmatToQuat(R, q, 0);
    quats[4 * i] = q[0]; quats[4 * i + 1] = q[1]; quats[4 * i + 2] = q[2]; quats[4 * i + 3] = q[3];
  }
  return { ls, quats };
}

/** Index of the entry of a sorted float32 table nearest to x (ties to the lower index). */
function nearestIndex(t, x) {
  const n = t.length;
  if (n === 1) return 0;
  let lo = 0, hi = n; // searchsorted (left): first i with t[i] >= x
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if (t[mid] < x) lo = mid + 1;
    else hi = mid;
  }
  const j = Math.min(Math.max(lo, 1), n - 1);
  return Math.abs(x - t[j - 1]) <= Math.abs(t[j] - x) ? j - 1 : j;
}

// ------------------------------------------------------------------------------ decoder

function readPalettes(payload) {
  const r = new StreamReader(payload, "PALT");
  const modes = r.ints("palette_mode", PALETTE_CHANNELS.length, 0, 2);
  const values = {}, mode = {};
  PALETTE_CHANNELS.forEach((c, i) => {
    const m = modes[i];
    if (m === 0) return;
    if (m === PALETTE_PREDICTED && !c.startsWith("dc")) throw new FormatError(`PALT: channel ${c} cannot be parent-predicted (only dc0-dc2)`);
    const { kind, n } = r.peek(`palette_${c}`);
    if (!(n >= 1 && n <= MAX_PALETTE)) throw new FormatError(`PALT: palette ${c} has ${n} entries, expected 1-${MAX_PALETTE}`);
    const v = r.floats(`palette_${c}`, n);
    if (kind !== KIND_F32) throw new FormatError(`PALT: palette ${c} is not a strictly increasing float32 table`);
    for (let k = 1; k < n; k++) if (!(v[k] > v[k - 1])) throw new FormatError(`PALT: palette ${c} is not a strictly increasing float32 table`);
    if (c.startsWith("ls")) for (let k = 0; k < n; k++) if (Math.abs(v[k]) > MAX_ABS_LOG_SCALE) throw new FormatError(`PALT: palette ${c} holds log-scales out of range`);
    if (c.startsWith("dc")) for (let k = 0; k < n; k++) if (Math.abs(v[k]) > MAX_ABS_DC_TABLE) throw new FormatError(`PALT: palette ${c} holds colours out of range (beyond +-1e37)`);
    values[c] = v;
    mode[c] = m;
  });
  r.done();
  if (!Object.keys(values).length) throw new FormatError("PALT: section present but no channel has a palette");
  return { values, mode };
}

/**
 * Incremental decoder: push() bytes as they arrive; each completed LEVL section is decoded at
 * once and reported with the scene at that level (terminal nodes of coarser levels + its nodes).
 */
export class PgmsStream {
  /**
   * @param {{fileSize?: number, maxMemory?: number}} options fileSize: the whole file's size when
   *   known (bounds the node count); with it (or maxMemory) each level is checked against the
   *   memory budget before it is decoded, max(64 MiB, 256 x fileSize) or maxMemory
   *   (DecodeMemoryError)
   */
  constructor({ fileSize, maxMemory } = {}) {
    this.fileSize = fileSize;
    this._budget = fileSize !== undefined || maxMemory !== undefined ? { fileSize: fileSize ?? 0, maxMemory } : null;
    this.buf = new Uint8Array(1 << 16);
    this.len = 0;
    this.pos = 12; // next section
    this.version = null;
    this.header = null;
    this.books = {};
    this.levels = []; // per level: node arrays + terminal mask
    this.finished = false;
    this.bytesUsed = 0;
  }

  get bytesReceived() {
    return this.len;
  }

  /** Append bytes; returns [{ level, scene, bytes }] for the levels completed by them. */
  push(chunk) {
    if (this.finished && chunk.length) throw new FormatError(`corrupt .pgms: ${chunk.length} unexpected bytes after the END0 section`);
    if (this.len + chunk.length > this.buf.length) {
      let cap = this.buf.length;
      while (cap < this.len + chunk.length) cap *= 2;
      const nb = new Uint8Array(cap);
      nb.set(this.buf.subarray(0, this.len));
      this.buf = nb;
    }
    this.buf.set(chunk, this.len);
    this.len += chunk.length;
    const bytes = this.buf.subarray(0, this.len);
    const done = [];
    if (this.version === null) {
      if (this.len < 12) return done;
      this.version = readPreamble(bytes);
    }
    for (;;) {
      if (this.finished) {
        if (this.len !== this.pos) throw new FormatError(`corrupt .pgms: ${this.len - this.pos} unexpected bytes after the END0 section`);
        break;
      }
      const sec = nextSection(bytes, this.pos);
      if (!sec) break;
      this.pos = sec.end;
      const lv = this._section(sec, bytes.length);
      if (lv !== null) done.push({ level: lv, scene: this.scene(lv), bytes: sec.end });
    }
    return done;
  }

  /** Call at the end of the input: checks that the file was complete. */
  end() {
    if (!this.finished) throw new FormatError(`truncated .pgms: ${this.len} bytes, the END0 section was not reached`);
  }

  _section(sec, available) {
    const { tag } = sec;
    if (!this.header) {
      if (tag !== "HEAD") throw new FormatError(`corrupt .pgms: first section is '${tag}', expected 'HEAD'`);
      // HEAD bounds the node count by 64 x the file size; a stream of unknown size is bounded
      // by the format's node limit only (every level is still checked against HEAD's total)
      this.header = parseHeader(sec.payload, this.fileSize ?? MAX_NODES, this.version);
      return null;
    }
    const order = ["XFRM", "CBSR", "CBSH", "SHQP", "PALT"];
    if (order.includes(tag) && (tag !== "XFRM" || this.version.major >= 5)) {
      if (this.levels.length || this.books[tag] || Object.keys(this.books).some((t) => order.indexOf(t) > order.indexOf(tag))) {
        throw new FormatError(`corrupt .pgms: global section ${tag} out of order`);
      }
      this.books[tag] = sec.payload.slice();
      return null;
    }
    if (tag === "LEVL") {
      if (sec.level !== this.levels.length) throw new FormatError(`corrupt .pgms: level section ${sec.level} where level ${this.levels.length} was expected`);
      if (this.levels.length >= this.header.numLevels) throw new FormatError(`corrupt .pgms: more level sections than the ${this.header.numLevels} HEAD declares`);
      if (this.levels.length === 0) this._prepare();
      this._decodeLevel(sec.payload);
      return this.levels.length - 1;
    }
    if (tag === "END0") {
      if (sec.payload.length) throw new FormatError("corrupt .pgms: END0 section has a payload");
      if (this.levels.length !== this.header.numLevels) {
        throw new FormatError(`corrupt .pgms: ${this.levels.length} level sections, HEAD declares ${this.header.numLevels}`);
      }
      this.finished = true;
      return null;
    }
    throw new FormatError(`corrupt .pgms: unknown section '${tag}'`);
  }

  _prepare() {
    const h = this.header;
    if (!this.books.CBSR) throw new FormatError("corrupt .pgms: missing the scale-rotation codebook section CBSR");
    let r = new StreamReader(this.books.CBSR, "CBSR");
    const cb = r.floats("shape_codebook", h.shapeCodebook * 9);
    r.done();
    this.shape = decodeShapeRows(cb, h.shapeCodebook);
    this.kRest = (h.shDegree + 1) ** 2 - 1;
    this.shCb = null;
    if (h.hasShCodebook) {
      if (!this.books.CBSH) throw new FormatError("corrupt .pgms: HEAD declares an SH codebook but section CBSH is missing");
      r = new StreamReader(this.books.CBSH, "CBSH");
      const kcb = (h.shCodebookDegree + 1) ** 2 - 1;
      this.shCb = { k: kcb, rows: h.shCodebook, v: r.floats("sh_codebook", h.shCodebook * kcb * 3) };
      r.done();
    }
    this.pal = this.books.PALT ? readPalettes(this.books.PALT) : null;
    this.xfrm = this.books.XFRM ? readTransform(this.books.XFRM, h.shDegree) : null;
    this.shq = null;
    if (this.books.SHQP) {
      const p = this.books.SHQP;
      if (this.shCb || p.length !== 8) throw new FormatError("SHQP: section has the wrong size or comes with an SH codebook");
      const dv = new DataView(p.buffer, p.byteOffset, 8);
      const d = p[0], step = dv.getFloat32(4, true);
      if (p[1] || dv.getUint16(2, true) || !(d >= 1 && d <= h.shDegree)) {
        throw new FormatError(`SHQP: degree ${d} invalid for SH degree ${h.shDegree} (or reserved bytes set)`);
      }
      if (!(Number.isFinite(step) && step > 1e-6 && step < 1e3)) throw new FormatError(`SHQP: step ${step} out of range`);
      this.shq = { degree: d, step, k: (d + 1) ** 2 - 1 };
    }
    const n = h.level0;
    this.parent = {
      n,
      means: new Float32Array(3 * n).map((_, i) => h.origin[i % 3]),
      dcq: new Float64Array(3 * n),
      quats: new Float32Array(4 * n).map((_, i) => (i % 4 === 0 ? 1 : 0)),
      ls: new Float32Array(3 * n),
    };
    this.seen = 0;
  }

  _decodeLevel(payload) {
    const h = this.header;
    const lv = this.levels.length;
    const P = this.parent;
    const n = P.n;
    this.seen += n;
    if (this.seen > h.totalNodes) throw new FormatError(`corrupt .pgms: level ${lv} exceeds the ${h.totalNodes} nodes HEAD declares`);
    const b = this._budget;
    if (b) checkMemory(this.seen, h.shDegree, this.shq ? this.shq.k : 0, b.fileSize, b.maxMemory);
    const where = `level ${lv}`;
    const r = new StreamReader(payload, where);
    const fine = lv === h.numLevels - 1;
    const fpal = fine && this.pal ? this.pal.values : {};
    const ls = new Float32Array(3 * n);
    const quats = new Float32Array(4 * n);
    const q = new Float64Array(4);
    const tmp = new Float64Array(4);
    const tmp2 = new Float64Array(4);
    if (fine) {
      for (let a = 0; a < 3; a++) {
        const tab = fpal[`ls${a}`];
        if (tab) {
          const idx = r.ints(`ls${a}`, n, 0, tab.length - 1);
          for (let i = 0; i < n; i++) ls[3 * i + a] = tab[idx[i]];
        } else {
          const lsq = r.ints(`ls${a}`, n, -BIG, BIG);
          for (let i = 0; i < n; i++) ls[3 * i + a] = P.ls[3 * i + a] + lsq[i] * h.lsStep;
        }
      }
      const big = r.ints("rot_i", n, 0, 3);
      const levels = 2 ** h.rotBits - 1;
      const u = [0, 1, 2].map((a) => r.ints(`rot${a}`, n, 0, levels));
      const s = 1 / Math.sqrt(2);
      for (let i = 0; i < n; i++) {
        const o0 = (u[0][i] / levels) * 2 * s - s;
        const o1 = (u[1][i] / levels) * 2 * s - s;
        const o2 = (u[2][i] / levels) * 2 * s - s;
        const largest = Math.sqrt(Math.min(Math.max(1 - (o0 * o0 + o1 * o1 + o2 * o2), 0), 1));
        const b = big[i];
        const others = [o0, o1, o2];
        for (let k = 0, m = 0; k < 4; k++) q[k] = k === b ? largest : others[m++];
        // relative quaternion as float32, then compose with the parent (float64)
        const rw = f32(q[0]), rx = f32(q[1]), ry = f32(q[2]), rz = f32(q[3]);
        unit(P.quats[4 * i], P.quats[4 * i + 1], P.quats[4 * i + 2], P.quats[4 * i + 3], tmp, 0);
        unit(rw, rx, ry, rz, tmp2, 0);
        const [aw, ax, ay, az] = tmp;
        const [bw, bx, by, bz] = tmp2;
        unit(
          aw * bw - ax * bx - ay * by - az * bz,
          aw * bx + ax * bw + ay * bz - az * by,
          aw * by - ax * bz + ay * bw + az * bx,
          aw * bz + ax * by - ay * bx + az * bw,
          quats, 4 * i,
        );
      }
    } else {
      const idx = r.ints("shape", n, 0, h.shapeCodebook - 1);
      const { ls: sls, quats: sq } = this.shape;
      for (let i = 0; i < n; i++) {
        const k = idx[i];
        ls[3 * i] = sls[3 * k]; ls[3 * i + 1] = sls[3 * k + 1]; ls[3 * i + 2] = sls[3 * k + 2];
        quats[4 * i] = sq[4 * k]; quats[4 * i + 1] = sq[4 * k + 1]; quats[4 * i + 2] = sq[4 * k + 2]; quats[4 * i + 3] = sq[4 * k + 3];
      }
    }
    for (let i = 0; i < 3 * n; i++) {
      if (!(Math.abs(ls[i]) <= MAX_ABS_LOG_SCALE)) throw new FormatError(`${where}: decoded log-scales out of range`);
    }
    // positions: offsets along the parent's axes, step from the node's own size
    const off = [0, 1, 2].map((a) => r.ints(`pos${a}`, n, -BIG, BIG));
    const means = new Float32Array(3 * n);
    const R = new Float64Array(9);
    for (let i = 0; i < n; i++) {
      const mean = (ls[3 * i] + ls[3 * i + 1] + ls[3 * i + 2]) / 3;
      const step = Math.max(h.posRel * Math.exp(mean), h.minStep);
      unit(P.quats[4 * i], P.quats[4 * i + 1], P.quats[4 * i + 2], P.quats[4 * i + 3], tmp, 0);
      rotmat(tmp[0], tmp[1], tmp[2], tmp[3], R);
      const v0 = off[0][i] * step, v1 = off[1][i] * step, v2 = off[2][i] * step;
      for (let a = 0; a < 3; a++) {
        const w = R[3 * a] * v0 + R[3 * a + 1] * v1 + R[3 * a + 2] * v2;
        means[3 * i + a] = P.means[3 * i + a] + w;
      }
    }
    // colour
    const d = [0, 1, 2].map((a) => r.ints(`dc${a}`, n, -BIG, BIG));
    const dcPal = [0, 1, 2].some((c) => fpal[`dc${c}`]);
    let res = d;
    if (!dcPal) res = [d[1].map((v, i) => v + d[0][i]), d[0], d[2].map((v, i) => v + d[0][i])];
    const dcq = new Float64Array(3 * n);
    const dc = new Float32Array(3 * n);
    for (let i = 0; i < n; i++) {
      for (let c = 0; c < 3; c++) {
        const v = P.dcq[3 * i + c] + res[c][i];
        dcq[3 * i + c] = v;
        dc[3 * i + c] = v * h.dcStep;
      }
    }
    for (let c = 0; c < 3; c++) {
      const tab = fpal[`dc${c}`];
      if (!tab) continue;
      const predicted = this.pal.mode[`dc${c}`] === PALETTE_PREDICTED;
      for (let i = 0; i < n; i++) {
        let idx = res[c][i];
        if (predicted) idx += nearestIndex(tab, P.dcq[3 * i + c] * h.dcStep);
        if (idx < 0 || idx >= tab.length) throw new FormatError(`${where}: stream 'dc${c}' indexes outside its ${tab.length}-entry palette`);
        dc[3 * i + c] = tab[idx];
      }
    }
    // opacity
    const opTab = fpal.op;
    const opq = r.ints("op", n, 0, (opTab ? opTab.length : 2 ** h.opBits) - 1);
    const logit = new Float32Array(n);
    if (opTab) {
      for (let i = 0; i < n; i++) logit[i] = opTab[opq[i]];
    } else {
      const lvls = 2 ** h.opBits - 1;
      for (let i = 0; i < n; i++) {
        const a = f32(Math.min(Math.max(opq[i] / lvls, 0.25 / lvls), 0.995));
        logit[i] = Math.log(a / (1 - a));
      }
    }
    // view-dependent SH
    const K = this.kRest;
    const rest = new Float32Array(n * K * 3);
    if (fine && this.shCb) {
      const flag = r.ints("sh_flag", n, 0, 1);
      let m = 0;
      for (let i = 0; i < n; i++) m += flag[i];
      const sidx = r.ints("sh_idx", m, 0, this.shCb.rows - 1);
      const kc = this.shCb.k;
      for (let i = 0, t = 0; i < n; i++) {
        if (!flag[i]) continue;
        const row = sidx[t++];
        for (let j = 0; j < kc * 3; j++) rest[i * K * 3 + j] = this.shCb.v[row * kc * 3 + j];
      }
    }
    if (fine && this.shq) {
      const flag = r.ints("sh_flag", n, 0, 1);
      let m = 0;
      for (let i = 0; i < n; i++) m += flag[i];
      const kq = this.shq.k;
      const cols = [];
      for (let j = 0; j < 3 * kq; j++) cols.push(r.ints(`sh${j}`, m, -(2 ** 20), 2 ** 20));
      for (let i = 0, t = 0; i < n; i++) {
        if (!flag[i]) continue;
        for (let j = 0; j < 3 * kq; j++) rest[i * K * 3 + j] = cols[j][t] * this.shq.step;
        t++;
      }
    }
    let cc;
    if (fine) cc = new Float64Array(n);
    else cc = r.ints("child_count", n, 0, MAX_CHILDREN);
    // format 5.1: a fine-tier node coded once for several identical source rows (repeated by scene())
    const copies = fine && h.copies ? r.ints("copies", n, 0, MAX_COPIES - 1) : null;
    r.done();
    let extra = 0;
    if (copies) {
      for (let i = 0; i < n; i++) extra += copies[i];
      if (b) checkMemory(this.seen + extra, h.shDegree, this.shq ? this.shq.k : 0, b.fileSize, b.maxMemory);
    }
    for (let i = 0; i < 3 * n; i++) {
      if (!Number.isFinite(means[i]) || !Number.isFinite(dc[i])) throw new FormatError(`${where}: decoded positions or colours are not finite`);
    }
    let nNext = 0;
    for (let i = 0; i < n; i++) nNext += cc[i];
    if (fine && nNext) throw new FormatError(`${where}: the finest level declares children`);
    if (this.seen + nNext > h.totalNodes) {
      throw new FormatError(`corrupt .pgms: level ${lv} declares ${nNext} children, more than the ${h.totalNodes} nodes HEAD declares`);
    }
    // only the finest level may be empty; with it, the levels must hold exactly HEAD's total
    if (!fine && nNext === 0 && lv + 1 !== h.numLevels - 1) throw new FormatError(`${where}: no node has children, but level ${lv + 1} follows`);
    if (fine && this.seen !== h.totalNodes) {
      throw new FormatError(`corrupt .pgms: HEAD declares ${h.totalNodes} nodes, the level sections hold ${this.seen}`);
    }
    this.levels.push({ n, means, quats, ls, logit, dc, rest, copies, extra, terminal: cc.map((c) => (c === 0 ? 1 : 0)) });
    // children inherit their parent's decoded frame (float32 values)
    const np = {
      n: nNext,
      means: new Float32Array(3 * nNext), dcq: new Float64Array(3 * nNext),
      quats: new Float32Array(4 * nNext), ls: new Float32Array(3 * nNext),
    };
    for (let i = 0, c = 0; i < n; i++) {
      for (let k = 0; k < cc[i]; k++, c++) {
        for (let a = 0; a < 3; a++) {
          np.means[3 * c + a] = means[3 * i + a];
          np.dcq[3 * c + a] = dcq[3 * i + a];
          np.ls[3 * c + a] = ls[3 * i + a];
        }
        for (let a = 0; a < 4; a++) np.quats[4 * c + a] = quats[4 * i + a];
      }
    }
    this.parent = np;
  }

  /**
   * The decoded scene at level `lv` (<= the last decoded level): the nodes of that level and the
   * childless nodes of the levels before it, in level order, as float32 arrays:
   * means [N*3], quats [N*4] (w, x, y, z), logScales [N*3], opacityLogits [N], shDc [N*3],
   * shRest [N*K*3] (K = (shDegree+1)^2 - 1, band-major, RGB innermost).
   */
  scene(lv) {
    if (!(lv >= 0 && lv < this.levels.length)) throw new RangeError(`level ${lv} has not been decoded (${this.levels.length} decoded)`);
    const K = this.kRest;
    let N = 0;
    for (let l = 0; l <= lv; l++) {
      const L = this.levels[l];
      if (l === lv) N += L.n + L.extra;
      else for (let i = 0; i < L.n; i++) N += L.terminal[i];
    }
    const s = {
      count: N, shDegree: this.header.shDegree, level: lv,
      means: new Float32Array(3 * N), quats: new Float32Array(4 * N), logScales: new Float32Array(3 * N),
      opacityLogits: new Float32Array(N), shDc: new Float32Array(3 * N), shRest: new Float32Array(N * K * 3),
    };
    let o = 0;
    for (let l = 0; l <= lv; l++) {
      const L = this.levels[l];
      for (let i = 0; i < L.n; i++) {
        if (l !== lv && !L.terminal[i]) continue;
        for (let c = L.copies ? L.copies[i] : 0; c >= 0; c--) {
          s.means.set(L.means.subarray(3 * i, 3 * i + 3), 3 * o);
          s.quats.set(L.quats.subarray(4 * i, 4 * i + 4), 4 * o);
          s.logScales.set(L.ls.subarray(3 * i, 3 * i + 3), 3 * o);
          s.opacityLogits[o] = L.logit[i];
          s.shDc.set(L.dc.subarray(3 * i, 3 * i + 3), 3 * o);
          if (K) s.shRest.set(L.rest.subarray(i * K * 3, (i + 1) * K * 3), o * K * 3);
          o++;
        }
      }
    }
    if (this.xfrm) applyTransform(s, this.xfrm); // the file codes the scene in its canonical frame
    return s;
  }
}

/**
 * Decode a whole .pgms or a prefix of one.
 * @param {Uint8Array} bytes
 * @param {{level?: number, maxMemory?: number}} options level: decode levels 0..level only (the
 *   bytes may end after it); maxMemory: the bytes the decode may need (default
 *   max(64 MiB, 256 x the input's size)); a file that needs more throws DecodeMemoryError before
 *   anything is decoded
 * @returns {{header: object, version: object, levels: number, scene: object}}
 */
export function decodePgms(bytes, { level, maxMemory } = {}) {
  if (!(bytes instanceof Uint8Array)) bytes = new Uint8Array(bytes);
  if (level !== undefined && !(Number.isInteger(level) && level >= 0)) throw new RangeError(`level must be an integer >= 0, got ${level}`);
  if (maxMemory !== undefined && !(Number.isSafeInteger(maxMemory) && maxMemory > 0)) throw new RangeError(`maxMemory must be a positive integer (bytes), got ${maxMemory}`);
  const nodes = declaredNodes(bytes, level);
  if (nodes) checkMemory(nodes.count, nodes.shDegree, nodes.grid, bytes.length, maxMemory);
  const s = new PgmsStream({ fileSize: bytes.length });
  s._budget = null; // checked above for the levels asked for (the stream would count every level the bytes hold)
  s.push(bytes);
  if (s.header === null) throw new FormatError(`truncated .pgms: ${bytes.length} bytes hold no HEAD section`);
  const want = level === undefined ? s.header.numLevels - 1 : Math.min(level, s.header.numLevels - 1);
  if (s.levels.length <= want) {
    throw new FormatError(`truncated .pgms: ${bytes.length} bytes hold ${s.levels.length} of the levels up to ${want}`);
  }
  if (level === undefined) s.end();
  // the fine tier's repeated copies (format 5.1), known once its streams are read
  if (nodes && s.levels[want].extra) {
    checkMemory(nodes.count + s.levels[want].extra, nodes.shDegree, nodes.grid, bytes.length, maxMemory);
  }
  const scene = s.scene(want);
  if (scene.count === 0) throw new FormatError("corrupt .pgms: the decoded scene holds no Gaussians");
  return { header: s.header, version: s.version, levels: s.levels.length, scene };
}

/**
 * What the memory rule needs, read before any stream is decoded (the Python decoder's order):
 * the node counts of the level sections up to `level` (each section's first stream header),
 * the SH degree and the per-primitive SH grid's coefficients. null where the bytes are not a
 * well-formed container up to there: the decode itself then says what is wrong.
 */
function declaredNodes(bytes, level) {
  try {
    readPreamble(bytes);
    let pos = 12, header = null, grid = 0, count = 0;
    for (let sec = nextSection(bytes, pos); sec; sec = nextSection(bytes, pos)) {
      pos = sec.end;
      if (!header) {
        if (sec.tag !== "HEAD") return null;
        header = parseHeader(sec.payload, bytes.length, readPreamble(bytes));
      } else if (sec.tag === "SHQP" && sec.payload.length === 8) {
        grid = (sec.payload[0] + 1) ** 2 - 1;
      } else if (sec.tag === "LEVL") {
        if (level !== undefined && sec.level > level) break;
        if (sec.payload.length < 20) return null;
        count += new DataView(sec.payload.buffer, sec.payload.byteOffset + 4, 4).getUint32(0, true);
      } else if (sec.tag === "END0") {
        break;
      }
    }
    return header && count ? { count, shDegree: header.shDegree, grid } : null;
  } catch (e) {
    if (e instanceof FormatError) return null;
    throw e;
  }
}
