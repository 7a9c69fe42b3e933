// The rules the JavaScript decoder shares with the Python one (docs/FORMAT.md), on small files
// written here from the format description alone: each edit of a valid file must give a
// FormatError. tests/conformance/ checks the same rules against the Python decoder, file by file.
import { test } from "node:test";
import assert from "node:assert/strict";
import { crc32, decodePgms, DecodeMemoryError, FormatError, PgmsStream } from "../src/pgms.js";
import { decodeBudget, decodeBytesNeeded } from "../src/memory.js";

const GLOBAL = 255;

function section(tag, payload, level = GLOBAL) {
  const head = new Uint8Array(16);
  const dv = new DataView(head.buffer);
  for (let i = 0; i < 4; i++) head[i] = tag.charCodeAt(i);
  head[4] = level;
  dv.setUint32(8, payload.length, true);
  dv.setUint32(12, crc32(payload, crc32(head.subarray(0, 12))), true);
  return concat([head, payload]);
}

function concat(parts) {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let o = 0;
  for (const p of parts) { out.set(p, o); o += p.length; }
  return out;
}

/** A raw integer stream (zigzag, byte planes) of `values`, `width` bytes each (default: the smallest). */
function ints(values, width) {
  const u = values.map((v) => (v >= 0 ? 2 * v : -2 * v - 1));
  const alphabet = values.length ? Math.max(...u) + 1 : 0;
  width ??= alphabet - 1 < 256 ? 1 : alphabet - 1 < 65536 ? 2 : 4;
  const body = new Uint8Array(values.length * width);
  u.forEach((x, i) => { for (let b = 0; b < width; b++) body[b * values.length + i] = Math.floor(x / 256 ** b) & 255; });
  return stream(0, width, values.length, alphabet, body);
}

function stream(kind, width, n, alphabet, body) {
  const h = new Uint8Array(20);
  const dv = new DataView(h.buffer);
  h[0] = kind; h[1] = 0; h[2] = width;
  dv.setUint32(4, n, true);
  dv.setUint32(8, alphabet, true);
  dv.setUint32(16, body.length, true);
  return concat([h, body]);
}

/** float16 stream of values exactly representable in float16 (-3, 0, 1). */
function halfs(values) {
  const bits = values.map((v) => (v === 0 ? 0 : v === 1 ? 0x3c00 : v === -3 ? 0xc200 : NaN));
  const body = new Uint8Array(values.length * 2);
  bits.forEach((b, i) => { body[i] = b & 255; body[values.length + i] = b >> 8; });
  return stream(1, 2, values.length, 0, body);
}

function head({ levels = 1, shDegree = 1, level0 = 4, total = 4 } = {}) {
  const p = new Uint8Array(68);
  const dv = new DataView(p.buffer);
  p[0] = levels; p[1] = shDegree; p[2] = 8; p[3] = 8;
  dv.setUint32(4, level0, true); dv.setUint32(8, total, true); dv.setUint32(12, total, true); dv.setUint32(16, 1, true);
  dv.setFloat32(20, 0.5, true); dv.setFloat32(24, 0.02, true); dv.setFloat32(28, 0.05, true); dv.setFloat32(32, 1e-3, true);
  return p;
}

/** XFRM: identity rotation, no translation, scale s (log-scale ln s), band 1 matrix D (row-major). */
function xfrm(s = 1, D = [1, 0, 0, 0, 1, 0, 0, 0, 1]) {
  const p = new Uint8Array(72 + 36);
  const dv = new DataView(p.buffer);
  [1, 0, 0, 0, 0, 0, 0, s, Math.log(s)].forEach((v, i) => dv.setFloat64(8 * i, v, true));
  D.forEach((v, i) => dv.setFloat32(72 + 4 * i, v, true));
  return p;
}

function fineLevel(n, { wide = false, logScale = 0 } = {}) {
  const z = new Array(n).fill(0);
  const ls = new Array(n).fill(Math.round(logScale / 0.05));
  return concat([ints(ls), ints(z), ints(z), ints(z), ...[0, 1, 2].map(() => ints(new Array(n).fill(127))),
    ints(z, wide ? 8 : undefined), ints(z), ints(z), ints(z), ints(z), ints(z), ints(new Array(n).fill(128))]);
}

/** A valid one-level 5.0 file of 4 Gaussians (SH degree 1, no SH coded), with optional edits. */
function file({ total = 4, headLevel = GLOBAL, xfrmLevel = GLOBAL, scale = 1, D, wide = false, logScale = 0 } = {}) {
  const pre = new Uint8Array([0x89, 0x50, 0x47, 0x4d, 0x53, 0x0d, 0x0a, 0x1a, 5, 0, 0, 0]);
  return concat([pre, section("HEAD", head({ total }), headLevel), section("XFRM", xfrm(scale, D), xfrmLevel),
    section("CBSR", halfs([-3, -3, -3, 1, 0, 0, 0, 1, 0])), section("LEVL", fineLevel(4, { wide, logScale }), 0),
    section("END0", new Uint8Array(0))]);
}

function refused(bytes, pattern) {
  assert.throws(() => decodePgms(bytes), (e) => e instanceof FormatError && pattern.test(e.message));
}

test("the hand-written file decodes", () => {
  const { scene } = decodePgms(file());
  assert.equal(scene.count, 4);
  assert.ok(scene.logScales.every((v) => v === 0));
});

test("HEAD declaring more nodes than the levels hold is refused", () => {
  refused(file({ total: 5 }), /HEAD declares 5 nodes, the level sections hold 4/);
});

test("a global section with a level byte other than 255 is refused", () => {
  refused(file({ headLevel: 0 }), /section HEAD .* level byte 0/);
  refused(file({ xfrmLevel: 0 }), /section XFRM .* level byte 0/);
});

test("a stream wider than its alphabet needs is refused", () => {
  refused(file({ wide: true }), /alphabet 1 does not fit width 8/);
});

test("a band matrix with determinant -1 is refused", () => {
  refused(file({ D: [-1, 0, 0, 0, 1, 0, 0, 0, 1] }), /not a rotation \(orthogonal within 1e-5, determinant \+1\)/);
  refused(file({ D: [0, 1, 0, 1, 0, 0, 0, 0, 1] }), /not a rotation/);
});

test("log-scales beyond +-80 after XFRM are refused; within, they decode", () => {
  refused(file({ scale: 1e30, logScale: 20 }), /log-scales leave \[-80, 80\]/);
  const { scene } = decodePgms(file({ scale: 1e30 }));
  assert.ok(scene.logScales.every((v) => Math.abs(v - Math.fround(Math.log(1e30))) < 1e-4));
});

test("the memory rule is Python's: budget max(64 MiB, 256 x size), the same per-node estimate", () => {
  assert.equal(decodeBudget(1000), 64 * 2 ** 20);
  assert.equal(decodeBudget(2 ** 20), 256 * 2 ** 20);
  // 340,000 SH-0 nodes: 24 MiB + 256 bytes each (the Python decoder says "about 107 MiB")
  assert.equal(decodeBytesNeeded(340000, 0), 24 * 2 ** 20 + 340000 * 256);
  assert.equal(decodeBytesNeeded(10, 3, 15) - decodeBytesNeeded(10, 3), 10 * 12 * 15);
});

test("maxMemory below a file's need refuses it before decoding; a trusted budget decodes it", () => {
  assert.throws(() => decodePgms(file(), { maxMemory: 2 ** 20 }),
    (e) => e instanceof DecodeMemoryError && e instanceof FormatError && /needs about 24 MiB, more than maxMemory \(1 MiB\)/.test(e.message));
  assert.equal(decodePgms(file(), { maxMemory: 2 ** 26 }).scene.count, 4);
  assert.throws(() => decodePgms(file(), { maxMemory: 0 }), RangeError);
});

test("a stream of known size (or given maxMemory) checks each level against the budget first", () => {
  const f = file();
  assert.throws(() => new PgmsStream({ maxMemory: 2 ** 20 }).push(f), DecodeMemoryError);
  assert.equal(new PgmsStream({ fileSize: f.length }).push(f).at(-1).scene.count, 4);
  assert.equal(new PgmsStream().push(f).at(-1).scene.count, 4); // size unknown: no budget
});
