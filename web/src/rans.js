// Coder 4 of the .pgms format: interleaved rANS with stored integer frequencies.
// Specification: docs/FORMAT.md ("Coder 4: interleaved rANS"); Python: visionmoe/splat/pgms/rans.py.
//
//   body = lanes u16 | precision u8 | table_coder u8 | table_len u32 | table
//          | state[lanes] u32 | word u16 ...
//
// Symbol i belongs to lane i mod lanes. Decoding one symbol from a lane with state x:
//   slot = x & (2^M - 1); s = symbol whose [cum, cum + freq) holds slot
//   x = freq[s] * (x >> M) + slot - cum[s]; if x < 2^16: x = (x << 16) | next word
// A valid stream uses every word and leaves every lane at 2^16.

import { decompress as zstdDecompress } from "fzstd";

export class FormatError extends Error {
  constructor(message) {
    super(message);
    this.name = "FormatError";
  }
}

const STATE_LOW = 0x10000;
const MAX_PRECISION = 16;
export const MAX_ALPHABET = 1 << 16;

function parseTable(b, alphabet, precision) {
  const freqs = new Uint32Array(alphabet);
  let pos = 0;
  const varint = () => {
    let v = 0;
    for (let shift = 0; ; shift += 7) {
      if (shift > 28) throw new FormatError("rANS frequency table holds an over-long varint");
      if (pos >= b.length) throw new FormatError("rANS frequency table is truncated");
      const byte = b[pos++];
      v += (byte & 0x7f) * 2 ** shift;
      if (!(byte & 0x80)) return v;
    }
  };
  const total = 2 ** precision;
  let s = 0;
  let sum = 0;
  while (s < alphabet) {
    const v = varint();
    if (v === 0) {
      const run = varint() + 1;
      if (s + run > alphabet) throw new FormatError(`rANS frequency table zero run passes the alphabet of ${alphabet}`);
      s += run;
    } else {
      if (v > total) throw new FormatError(`rANS frequency ${v} exceeds 2^${precision}`);
      freqs[s++] = v;
      sum += v;
    }
  }
  if (pos !== b.length) throw new FormatError(`rANS frequency table has ${b.length - pos} bytes after its last entry`);
  if (sum !== total) throw new FormatError(`rANS frequencies sum to ${sum}, expected 2^${precision}`);
  return freqs;
}

function unzstdTable(b, limit) {
  let out;
  try {
    out = zstdDecompress(b);
  } catch (e) {
    throw new FormatError(`corrupt zstd rANS table (${e.message})`);
  }
  if (out.length > limit) throw new FormatError(`rANS table decodes to more than ${limit} bytes`);
  return out;
}

/**
 * Decode n symbols (< alphabet) of a coder-4 stream body.
 * @param {Uint8Array} body
 * @param {number} n symbol count from the stream header
 * @param {number} alphabet from the stream header
 * @returns {Uint32Array}
 */
export function ransDecode(body, n, alphabet) {
  if (!(alphabet >= 0 && alphabet <= MAX_ALPHABET)) throw new FormatError(`rANS alphabet ${alphabet} outside [0, ${MAX_ALPHABET}]`);
  if (body.length < 8) throw new FormatError(`rANS stream of ${body.length} bytes is shorter than its 8-byte header`);
  const dv = new DataView(body.buffer, body.byteOffset, body.byteLength);
  const lanes = dv.getUint16(0, true);
  const precision = body[2];
  const tcoder = body[3];
  const tlen = dv.getUint32(4, true);
  if (n === 0) {
    if (lanes || tlen || body.length !== 8) throw new FormatError("empty rANS stream must be a bare header with 0 lanes");
    return new Uint32Array(0);
  }
  if (!(lanes >= 1 && lanes <= n)) throw new FormatError(`rANS stream declares ${lanes} lanes for ${n} symbols`);
  if (!(precision >= 1 && precision <= MAX_PRECISION)) throw new FormatError(`rANS precision ${precision} outside [1, ${MAX_PRECISION}]`);
  if (alphabet === 0) throw new FormatError("rANS stream with symbols but an empty alphabet");
  let pos = 8;
  if (pos + tlen + 4 * lanes > body.length) {
    throw new FormatError(`rANS table (${tlen} bytes) and ${lanes} lane states pass the end of the ${body.length}-byte stream`);
  }
  let table = body.subarray(pos, pos + tlen);
  pos += tlen;
  if (tcoder === 1) table = unzstdTable(table, 3 * alphabet + 8);
  else if (tcoder !== 0) throw new FormatError(`rANS table coder ${tcoder} unknown (0 varint, 1 zstd)`);
  const freqs = parseTable(table, alphabet, precision);
  const size = 1 << precision;
  // slot -> symbol, and per slot the frequency and (slot - cum)
  const slotSym = new Uint32Array(size);
  const slotFreq = new Float64Array(size);
  const slotBias = new Float64Array(size);
  for (let s = 0, c = 0; s < alphabet; s++) {
    const f = freqs[s];
    for (let k = 0; k < f; k++) {
      slotSym[c + k] = s;
      slotFreq[c + k] = f;
      slotBias[c + k] = k;
    }
    c += f;
  }
  const state = new Float64Array(lanes);
  for (let j = 0; j < lanes; j++, pos += 4) {
    state[j] = dv.getUint32(pos, true);
    if (state[j] < STATE_LOW) throw new FormatError("rANS lane state below 2^16");
  }
  if ((body.length - pos) % 2) throw new FormatError("rANS word stream has an odd number of bytes");
  const nw = (body.length - pos) / 2;
  const wbase = pos;
  const mask = size - 1;
  const scale = 2 ** precision;
  const out = new Uint32Array(n);
  let w = 0;
  let j = 0;
  for (let i = 0; i < n; i++) {
    let x = state[j];
    const slot = x & mask; // x < 2^32: & works on its uint32 value
    out[i] = slotSym[slot];
    x = slotFreq[slot] * Math.floor(x / scale) + slotBias[slot];
    if (x < STATE_LOW) {
      if (w >= nw) throw new FormatError(`rANS word stream exhausted at symbol ${i} (${nw} words)`);
      x = x * 65536 + (body[wbase + 2 * w] | (body[wbase + 2 * w + 1] << 8));
      w++;
    }
    state[j] = x;
    if (++j === lanes) j = 0;
  }
  if (w !== nw) throw new FormatError(`rANS stream has ${nw - w} unused words`);
  for (let k = 0; k < lanes; k++) {
    if (state[k] !== STATE_LOW) throw new FormatError("rANS lanes do not end in the initial state (corrupt stream)");
  }
  return out;
}
