// The JavaScript decoder against the Python decoder, bit for bit, on every level of every
// fixture file; prefixes, streamed chunks, corrupt input, and the coder-4 vectors.
// Fixtures: $PGMS_FIXTURES (written by tests/web/make_fixtures.py); without it the quick set is
// generated into a temporary folder with $VISIONMOE_PYTHON (default ../.venv/bin/python).
import { test, before } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { execFileSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import { decodePgms, PgmsStream, FormatError } from "../src/pgms.js";
import { ransDecode } from "../src/rans.js";

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, "..", "..");
const ARRAYS = { means: "means", quats: "quats", log_scales: "logScales", opacity_logits: "opacityLogits", sh_dc: "shDc", sh_rest: "shRest" };
let dir;
let manifest;

before(() => {
  dir = process.env.PGMS_FIXTURES;
  if (!dir) {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), "pgms-fixtures-"));
    const py = process.env.VISIONMOE_PYTHON || path.join(repo, ".venv", "bin", "python");
    execFileSync(py, [path.join(repo, "tests", "web", "make_fixtures.py"), "--out", dir], { stdio: "inherit", env: { ...process.env, HF_HUB_OFFLINE: "1" } });
  }
  manifest = JSON.parse(fs.readFileSync(path.join(dir, "manifest.json"), "utf8"));
});

const read = (f) => new Uint8Array(fs.readFileSync(path.join(dir, f)));

function assertBitExact(scene, name, level) {
  for (const [py, js] of Object.entries(ARRAYS)) {
    const b = fs.readFileSync(path.join(dir, `${name}.L${level}.${py}.f32`));
    const ref = new Uint32Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.length));
    const got = new Uint32Array(scene[js].buffer, scene[js].byteOffset, scene[js].length);
    assert.equal(got.length, ref.length, `${name} level ${level} ${py}: length`);
    let bad = 0, first = -1;
    for (let i = 0; i < ref.length; i++) if (got[i] !== ref[i]) { bad++; if (first < 0) first = i; }
    assert.equal(bad, 0, `${name} level ${level} ${py}: ${bad} of ${ref.length} values differ (first at ${first})`);
  }
}

test("every level of every fixture decodes to the Python decoder's float32 values", () => {
  assert.ok(manifest.files.length > 0);
  for (const f of manifest.files) {
    const bytes = read(f.file);
    const t = performance.now();
    const full = decodePgms(bytes);
    const ms = performance.now() - t;
    assert.equal(full.levels, f.levels);
    console.log(`# ${f.name}: ${f.bytes} bytes, ${f.levels} levels, ${full.scene.count} Gaussians, JS ${ms.toFixed(1)} ms, Python ${f.python_decode_ms.at(-1).toFixed(1)} ms`);
    assertBitExact(full.scene, f.name, f.levels - 1);
    for (let l = 0; l < f.levels; l++) {
      const { scene } = decodePgms(bytes, { level: l });
      assert.equal(scene.count, f.counts[l]);
      assertBitExact(scene, f.name, l);
    }
  }
});

test("the fixtures cover every optional section and a one-level file", () => {
  if (process.env.PGMS_FIXTURES) return; // a custom set (e.g. the shared scenes) covers what it covers
  const tags = new Set(manifest.files.flatMap((f) => f.sections));
  for (const t of ["CBSH", "SHQP", "PALT", "XFRM"]) assert.ok(tags.has(t), `no fixture has a ${t} section`);
  assert.ok(manifest.files.some((f) => !f.sections.includes("XFRM")), "no fixture is coded in its own frame");
  assert.ok(manifest.files.some((f) => f.levels === 1));
  assert.ok(manifest.files.every((f) => f.version[0] === 5), "fixtures must be format 5");
});

test("a prefix that ends with a level's section decodes that level, one byte less does not", () => {
  for (const f of manifest.files) {
    const bytes = read(f.file);
    for (let l = 0; l < f.levels; l++) {
      const end = f.level_ends[l];
      const { scene } = decodePgms(bytes.subarray(0, end), { level: l });
      assertBitExact(scene, f.name, l);
      assert.throws(() => decodePgms(bytes.subarray(0, end - 1), { level: l }), FormatError);
    }
    assert.throws(() => decodePgms(bytes.subarray(0, f.level_ends.at(-1))), FormatError); // no END0
  }
});

test("streamed in small chunks, each level is reported once, in order, when its bytes arrived", () => {
  for (const f of manifest.files) {
    const bytes = read(f.file);
    const s = new PgmsStream({ fileSize: bytes.length });
    const got = [];
    let pos = 0, k = 0;
    while (pos < bytes.length) {
      const step = 1 + ((k++ * 7919) % 997);
      for (const ev of s.push(bytes.subarray(pos, pos + step))) {
        assert.ok(pos + step >= f.level_ends[ev.level] && pos < f.level_ends[ev.level], `level ${ev.level} reported at byte ${pos + step}`);
        got.push(ev.level);
        if (ev.level === f.levels - 1) assertBitExact(ev.scene, f.name, ev.level);
      }
      pos += step;
    }
    s.end();
    assert.deepEqual(got, [...Array(f.levels).keys()]);
  }
});

test("corrupt input raises FormatError, never another error", () => {
  const f = manifest.files[0];
  const bytes = read(f.file);
  let rng = 12345;
  const rand = (n) => { rng = (rng * 1103515245 + 12345) % 2 ** 31; return rng % n; };
  for (let t = 0; t < 300; t++) {
    const b = bytes.slice();
    const mode = t % 3;
    let input = b;
    if (mode === 0) { let i = rand(b.length - 2); if (i >= 10) i += 2; b[i] ^= 1 + rand(255); } // not the minor version
    else if (mode === 1) input = b.subarray(0, rand(b.length));
    else input = Uint8Array.from([...b, ...Array.from({ length: 1 + rand(8) }, () => rand(256))]);
    assert.throws(() => decodePgms(input), (e) => e instanceof FormatError, `case ${t} (mode ${mode})`);
  }
  const v3 = bytes.slice();
  v3[8] = 3;
  assert.throws(() => decodePgms(v3), /version 3\.0 is not supported/);
});

test("coder-4 vectors written by the Python encoder decode to their symbols", () => {
  const vecs = JSON.parse(fs.readFileSync(path.join(dir, "rans.json"), "utf8"));
  for (const v of vecs) {
    const body = Uint8Array.from(Buffer.from(v.body, "hex"));
    const out = ransDecode(body, v.n, v.alphabet);
    assert.deepEqual(Array.from(out), v.symbols);
    // (a certain symbol costs nothing, so only streams of two symbols or more know their length)
    if (new Set(v.symbols).size > 1) assert.throws(() => ransDecode(body, v.n + 1, v.alphabet), FormatError);
    const cut = body.subarray(0, body.length - 2);
    if (cut.length >= 8) assert.throws(() => ransDecode(cut, v.n, v.alphabet), FormatError);
  }
});
