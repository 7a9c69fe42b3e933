// Helpers for decoded scenes (see pgms.js for the scene layout): an in-memory INRIA .ply for
// renderers that read one, and the default orbit camera of `visionmoe-splat render --views 1`.

/** INRIA-layout binary little-endian .ply bytes of a decoded scene (f_rest channel-major). */
export function sceneToPly(sc) {
  const N = sc.count;
  const K = (sc.shDegree + 1) ** 2 - 1;
  const props = ["x", "y", "z", "nx", "ny", "nz", "f_dc_0", "f_dc_1", "f_dc_2"];
  for (let i = 0; i < 3 * K; i++) props.push(`f_rest_${i}`);
  props.push("opacity", "scale_0", "scale_1", "scale_2", "rot_0", "rot_1", "rot_2", "rot_3");
  const header = `ply\nformat binary_little_endian 1.0\nelement vertex ${N}\n${props.map((p) => `property float ${p}`).join("\n")}\nend_header\n`;
  const head = new TextEncoder().encode(header);
  const P = props.length;
  const body = new Float32Array(N * P);
  for (let i = 0; i < N; i++) {
    const o = i * P;
    body[o] = sc.means[3 * i]; body[o + 1] = sc.means[3 * i + 1]; body[o + 2] = sc.means[3 * i + 2];
    body[o + 6] = sc.shDc[3 * i]; body[o + 7] = sc.shDc[3 * i + 1]; body[o + 8] = sc.shDc[3 * i + 2];
    for (let c = 0; c < 3; c++) {
      for (let k = 0; k < K; k++) body[o + 9 + c * K + k] = sc.shRest[(i * K + k) * 3 + c];
    }
    const t = o + 9 + 3 * K;
    body[t] = sc.opacityLogits[i];
    body[t + 1] = sc.logScales[3 * i]; body[t + 2] = sc.logScales[3 * i + 1]; body[t + 3] = sc.logScales[3 * i + 2];
    for (let k = 0; k < 4; k++) body[t + 4 + k] = sc.quats[4 * i + k];
  }
  const out = new Uint8Array(head.length + body.byteLength);
  out.set(head);
  out.set(new Uint8Array(body.buffer), head.length);
  return out;
}

const sub = (a, b) => [a[0] - b[0], a[1] - b[1], a[2] - b[2]];
const dot = (a, b) => a[0] * b[0] + a[1] * b[1] + a[2] * b[2];
const scale = (a, s) => [a[0] * s, a[1] * s, a[2] * s];
const norm = (a) => Math.sqrt(dot(a, a));
const cross = (a, b) => [a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0]];

/**
 * The first orbit view of visionmoe.splat.cameras.orbit_cameras (azimuth 0): centre = the
 * opacity-weighted mean, size = the weighted 0.9-quantile of the distances to it, distance
 * 1.15 size / sin(fov/2), world up -y. -> {viewmat (row-major 16, OpenCV), fovx, target}.
 */
export function orbitCamera(sc, { fovDeg = 50, elevationDeg = 20, radiusScale = 1.15, quantile = 0.9 } = {}) {
  const N = sc.count;
  const w = new Float64Array(N);
  let ws = 0;
  const c = [0, 0, 0];
  for (let i = 0; i < N; i++) {
    w[i] = 1 / (1 + Math.exp(-sc.opacityLogits[i]));
    ws += w[i];
    for (let a = 0; a < 3; a++) c[a] += w[i] * sc.means[3 * i + a];
  }
  let size = 1;
  let centre = [0, 0, 0];
  if (N && ws > 0) {
    centre = scale(c, 1 / ws);
    const dist = new Float64Array(N);
    for (let i = 0; i < N; i++) dist[i] = norm(sub([sc.means[3 * i], sc.means[3 * i + 1], sc.means[3 * i + 2]], centre));
    const order = Array.from(dist.keys()).sort((a, b) => dist[a] - dist[b]);
    let cum = 0;
    let idx = order.length - 1;
    for (let k = 0; k < order.length; k++) {
      cum += w[order[k]];
      if (cum / ws >= quantile) { idx = k; break; }
    }
    size = dist[order[idx]] > 0 ? dist[order[idx]] : 1;
  }
  const up = [0, -1, 0];
  const e1 = [1, 0, 0];
  const e2 = cross(up, e1);
  const distance = (radiusScale * size) / Math.sin((fovDeg * Math.PI) / 360);
  const el = (elevationDeg * Math.PI) / 180;
  const dir = [0, 1, 2].map((a) => Math.cos(el) * e1[a] + Math.sin(el) * up[a]);
  void e2; // azimuth 0: cos(0) e1 + sin(0) e2
  const eye = centre.map((v, a) => v + distance * dir[a]);
  const fw = sub(centre, eye);
  const z = scale(fw, 1 / norm(fw));
  const mu = scale(up, -1);
  const down = sub(mu, scale(z, dot(mu, z)));
  const y = scale(down, 1 / norm(down));
  const x = cross(y, z);
  const t = [-dot(x, eye), -dot(y, eye), -dot(z, eye)];
  return {
    viewmat: [x[0], x[1], x[2], t[0], y[0], y[1], y[2], t[1], z[0], z[1], z[2], t[2], 0, 0, 0, 1],
    fovx: fovDeg,
    target: centre,
  };
}
