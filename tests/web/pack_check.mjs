// Run from a folder where `npm install <visionmoe-pgms tarball> three @sparkjsdev/spark` was done:
//   PGMS_FIXTURES=DIR node pack_check.mjs
// Imports the package by its name (its "exports"), decodes every level of every fixture and
// compares the float32 values to the Python decoder's bit for bit, streams one file in chunks,
// and hands each finest level to Spark with the "visionmoe-pgms/spark" loader, checking what
// Spark decodes back. Prints one JSON line; any mismatch throws (exit status 1).
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { decodePgms, PgmsStream, FormatError } from "visionmoe-pgms";
import { sceneToExtSplats, sceneToSplatMesh } from "visionmoe-pgms/spark";
import { SplatMesh, utils } from "@sparkjsdev/spark";

const dir = process.env.PGMS_FIXTURES;
const manifest = JSON.parse(fs.readFileSync(path.join(dir, "manifest.json"), "utf8"));
const ARRAYS = { means: "means", quats: "quats", log_scales: "logScales", opacity_logits: "opacityLogits", sh_dc: "shDc", sh_rest: "shRest" };
const SH_C0 = 0.28209479177387814;

function assertBitExact(scene, name, level) {
  for (const [py, js] of Object.entries(ARRAYS)) {
    const b = fs.readFileSync(path.join(dir, `${name}.L${level}.${py}.f32`));
    const ref = new Uint32Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.length));
    const got = new Uint32Array(scene[js].buffer, scene[js].byteOffset, scene[js].length);
    assert.equal(got.length, ref.length, `${name} L${level} ${py}: length`);
    for (let i = 0; i < ref.length; i++) assert.equal(got[i], ref[i], `${name} L${level} ${py}[${i}]`);
  }
}

/** Spark's decode of the loader's splats against the scene (Spark stores half floats and 8-bit SH mantissas). */
function assertSparkHolds(scene) {
  const ext = sceneToExtSplats(scene);
  assert.equal(ext.numSplats, scene.count);
  assert.equal(ext.getNumSh(), scene.shDegree);
  const K = (scene.shDegree + 1) ** 2 - 1;
  const near = (a, b, tol, what) => assert.ok(Math.abs(a - b) <= tol, `${what}: ${a} vs ${b}`);
  for (let i = 0; i < scene.count; i++) {
    const s = ext.getSplat(i);
    const m = scene.means.subarray(3 * i, 3 * i + 3);
    assert.deepEqual([s.center.x, s.center.y, s.center.z], Array.from(m), `centre ${i}`); // float32 as is
    near(s.opacity, 1 / (1 + Math.exp(-scene.opacityLogits[i])), 1e-3, `opacity ${i}`);
    near(Math.log(s.scales.x), scene.logScales[3 * i], 4e-3 * Math.max(1, Math.abs(scene.logScales[3 * i])), `log-scale ${i}`);
    near(s.color.g, 0.5 + SH_C0 * scene.shDc[3 * i + 1], 2e-3 * Math.max(1, Math.abs(s.color.g)), `colour ${i}`);
    const q = scene.quats.subarray(4 * i, 4 * i + 4); // w, x, y, z; the same rotation up to sign
    const dot = Math.abs(q[0] * s.quaternion.w + q[1] * s.quaternion.x + q[2] * s.quaternion.y + q[3] * s.quaternion.z);
    near(dot / Math.hypot(...q), 1, 1e-4, `quaternion ${i}`);
  }
  // SH words in the order Spark's shaders read them: sh1 = band 1 + first of band 2, sh2, sh3a, sh3b
  const slots = [["sh1", 0], ["sh1", 1], ["sh1", 2], ["sh1", 3], ["sh2", 0], ["sh2", 1], ["sh2", 2], ["sh2", 3],
    ["sh3a", 0], ["sh3a", 1], ["sh3a", 2], ["sh3a", 3], ["sh3b", 0], ["sh3b", 1], ["sh3b", 2]];
  for (let k = 0; k < K; k++) {
    const [key, j] = slots[k];
    for (let i = 0; i < scene.count; i++) {
      const c = utils.decodeExtRgb(ext.extra[key][4 * i + j]);
      const v = scene.shRest.subarray(3 * (i * K + k), 3 * (i * K + k) + 3);
      const tol = Math.max(...Array.from(v, Math.abs)) / 250 + 1e-6;
      near(c.r, v[0], tol, `SH ${k} red ${i}`); near(c.g, v[1], tol, `SH ${k} green ${i}`); near(c.b, v[2], tol, `SH ${k} blue ${i}`);
    }
  }
  assert.equal(sceneToExtSplats(scene, { maxSh: 0 }).getNumSh(), 0);
  return ext;
}

const report = { files: 0, levels: 0, splats: 0 };
for (const f of manifest.files) {
  const bytes = new Uint8Array(fs.readFileSync(path.join(dir, f.file)));
  for (let l = 0; l < f.levels; l++) {
    const { scene } = decodePgms(bytes, { level: l });
    assertBitExact(scene, f.name, l);
    report.levels++;
  }
  const finest = decodePgms(bytes).scene;
  assertBitExact(finest, f.name, f.levels - 1);
  report.splats += assertSparkHolds(finest).numSplats;
  report.files++;
}
// streamed in chunks: every level once, in order, the last one bit-exact
const first = manifest.files[0];
const bytes = new Uint8Array(fs.readFileSync(path.join(dir, first.file)));
const stream = new PgmsStream({ fileSize: bytes.length });
const seen = [];
for (let pos = 0; pos < bytes.length; pos += 4096) {
  for (const { level, scene } of stream.push(bytes.subarray(pos, pos + 4096))) {
    seen.push(level);
    if (level === first.levels - 1) assertBitExact(scene, first.name, level);
  }
}
stream.end();
assert.deepEqual(seen, [...Array(first.levels).keys()]);
assert.throws(() => decodePgms(bytes.subarray(0, 100)), FormatError);
assert.throws(() => sceneToExtSplats({ count: 1, shDegree: 0, means: new Float32Array(2) }), /scene\.means: expected a Float32Array of 3 values/);
assert.ok(sceneToSplatMesh(decodePgms(bytes).scene) instanceof SplatMesh);
console.log(JSON.stringify(report));
