// A decoded .pgms level handed to Spark (three.js) directly: the scene's typed arrays are
// encoded into Spark's ExtSplats (float32 centres, half-float colour, opacity, log-scales and
// SH, 32-bit quaternions) without an intermediate .ply.
//
//   import { sceneToSplatMesh } from "visionmoe-pgms/spark";
//   scene3.add(sceneToSplatMesh(decodePgms(bytes).scene));

import { ExtSplats, SplatMesh, utils } from "@sparkjsdev/spark";

const SH_C0 = 0.28209479177387814; // the degree-0 SH basis constant: colour = 0.5 + SH_C0 * f_dc
// Spark's extended SH words, four per splat and texture, by coefficient (band-major; the
// order its shaders read them): sh1 = band 1 and the first band-2 coefficient, sh2 = the other
// four band-2 coefficients, sh3a/sh3b = band 3 (seven coefficients, the last word unused).
const SH_WORDS = [
  { key: "sh1", first: 0, count: 4 },
  { key: "sh2", first: 4, count: 4 },
  { key: "sh3a", first: 8, count: 4 },
  { key: "sh3b", first: 12, count: 3 },
];
const SH_COEFFS = [0, 3, 8, 15]; // coefficients per splat by SH degree

/**
 * One SH coefficient's RGB as a word Spark's shaders decode: three 8-bit magnitudes times
 * 2^(e-15)/255 with a shared 5-bit exponent e, and three sign bits. Spark 2.2's own encoder
 * (utils.encodeExtRgb) takes e = floor(log2 max), which clips the largest channel to 2^e (up to
 * half of it lost); the smallest e with max <= 2^e keeps every channel within max/255.
 */
export function encodeShRgb(r, g, b) {
  const max = Math.max(Math.abs(r), Math.abs(g), Math.abs(b));
  if (!(max > 0)) return 0;
  const e = Math.min(31, Math.max(0, Math.ceil(Math.log2(max)) + 15));
  const unit = 2 ** (e - 15) / 255;
  const q = (v) => Math.min(255, Math.round(Math.abs(v) / unit));
  const signs = (r < 0 ? 1 : 0) | (g < 0 ? 2 : 0) | (b < 0 ? 4 : 0);
  return (q(r) | (q(g) << 8) | (q(b) << 16) | (((e << 3) | signs) << 24)) >>> 0;
}

function checkScene(scene) {
  const N = scene?.count;
  if (!Number.isInteger(N) || N < 0) throw new TypeError("expected a decoded scene ({count, means, ...} from decodePgms or PgmsStream)");
  const K = SH_COEFFS[scene.shDegree];
  if (K === undefined) throw new RangeError(`scene.shDegree must be 0-3, got ${scene.shDegree}`);
  const sizes = { means: 3 * N, quats: 4 * N, logScales: 3 * N, opacityLogits: N, shDc: 3 * N, shRest: 3 * K * N };
  for (const [k, n] of Object.entries(sizes)) {
    if (!(scene[k] instanceof Float32Array) || scene[k].length !== n) {
      throw new RangeError(`scene.${k}: expected a Float32Array of ${n} values, got ${scene[k]?.length ?? typeof scene[k]}`);
    }
  }
  return K;
}

/**
 * Spark ExtSplats holding a decoded scene (3DGS semantics: sigmoid opacity, exp scales,
 * w,x,y,z quaternions, SH up to the scene's degree or `maxSh`).
 * @param {object} scene a level from decodePgms(...).scene or PgmsStream.push(...)[i].scene
 * @param {{maxSh?: number}} options maxSh: keep SH bands up to this degree (default: all)
 */
export function sceneToExtSplats(scene, { maxSh = 3 } = {}) {
  const K = checkScene(scene);
  const degree = Math.min(scene.shDegree, maxSh);
  const N = scene.count;
  const { maxSplats } = utils.getTextureSize(Math.max(N, 1));
  const ext = [new Uint32Array(4 * maxSplats), new Uint32Array(4 * maxSplats)];
  const { means: m, quats: q, logScales: s, opacityLogits: o, shDc: dc } = scene;
  for (let i = 0; i < N; i++) {
    const i3 = 3 * i, i4 = 4 * i;
    utils.encodeExtSplat(ext, i, m[i3], m[i3 + 1], m[i3 + 2], Math.exp(s[i3]), Math.exp(s[i3 + 1]), Math.exp(s[i3 + 2]),
      q[i4 + 1], q[i4 + 2], q[i4 + 3], q[i4], 1 / (1 + Math.exp(-o[i])),
      0.5 + SH_C0 * dc[i3], 0.5 + SH_C0 * dc[i3 + 1], 0.5 + SH_C0 * dc[i3 + 2]);
  }
  const extra = {};
  const used = SH_COEFFS[degree];
  for (const { key, first, count } of SH_WORDS) {
    if (first >= used) break;
    const words = new Uint32Array(4 * maxSplats);
    const rest = scene.shRest;
    const n = Math.min(count, used - first); // degree 1 fills three of sh1's four words
    for (let i = 0; i < N; i++) {
      for (let j = 0; j < n; j++) {
        const at = 3 * (i * K + first + j);
        words[4 * i + j] = encodeShRgb(rest[at], rest[at + 1], rest[at + 2]);
      }
    }
    extra[key] = words;
  }
  return new ExtSplats({ extArrays: ext, numSplats: N, extra });
}

/**
 * A Spark SplatMesh (a three.js Object3D) showing a decoded scene; add it to a THREE.Scene.
 * @param {object} scene a decoded level (see sceneToExtSplats)
 * @param {{maxSh?: number} & object} options maxSh as in sceneToExtSplats; the rest goes to SplatMesh
 */
export function sceneToSplatMesh(scene, { maxSh = 3, ...meshOptions } = {}) {
  return new SplatMesh({ enableLod: false, ...meshOptions, extSplats: sceneToExtSplats(scene, { maxSh }) });
}
