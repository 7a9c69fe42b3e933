// The decoder's memory budget, the rule of the Python decoder (visionmoe/splat/pgms/decode.py):
// a file whose checked node counts would need more memory than max(64 MiB, 256 x its size) is
// refused before anything is decoded (a decompression bomb, unless the caller trusts the file
// and raises maxMemory). The estimate is Python's peak per node, so both decoders draw the line
// at the same file.
import { FormatError } from "./rans.js";

const MiB = 2 ** 20;
const WORK_BYTES_PER_NODE = 200;
const GRID_BYTES_PER_COEFFICIENT = 12;
const FIXED_BYTES = 24 * MiB;
export const BUDGET_PER_FILE_BYTE = 256;

/** A file that would need more memory to decode than its size justifies (or than maxMemory). */
export class DecodeMemoryError extends FormatError {
  constructor(message) {
    super(message);
    this.name = "DecodeMemoryError";
  }
}

/** Bytes a decode of `fileSize` bytes may need by default: max(64 MiB, 256 x fileSize). */
export function decodeBudget(fileSize) {
  return Math.max(64 * MiB, BUDGET_PER_FILE_BYTE * fileSize);
}

/** The decoder's peak estimate for `nodes` decoded nodes (Python's decode_bytes_needed). */
export function decodeBytesNeeded(nodes, shDegree, gridCoefficients = 0) {
  const kRest = (shDegree + 1) ** 2 - 1;
  return FIXED_BYTES + nodes * (4 * (14 + 3 * kRest) + WORK_BYTES_PER_NODE + GRID_BYTES_PER_COEFFICIENT * gridCoefficients);
}

/** Throws DecodeMemoryError when `nodes` need more than the budget of a file of `fileSize` bytes. */
export function checkMemory(nodes, shDegree, gridCoefficients, fileSize, maxMemory) {
  const need = decodeBytesNeeded(nodes, shDegree, gridCoefficients);
  const limit = maxMemory === undefined ? decodeBudget(fileSize) : maxMemory;
  if (need > limit) {
    const why = maxMemory === undefined ? `the limit for a file of this size, max(64 MiB, ${BUDGET_PER_FILE_BYTE} x its size)` : "maxMemory";
    throw new DecodeMemoryError(`decoding ${nodes} nodes from ${fileSize} bytes needs about ${Math.round(need / MiB)} MiB, `
      + `more than ${why} (${Math.round(limit / MiB)} MiB); raise maxMemory only for a file you trust`);
  }
}
