// Progressive .pgms viewer: streams the file, shows each pyramid level as soon as its section
// has arrived (coarse to fine), rendered by Spark (three.js). The build bundles this page with its
// npm packages (tools/bundle.mjs), so it is served as plain files. Query parameters:
//   file=URL          the .pgms to show (default ../scene.pgms)
//   level=L           stop refining after level L
//   camera=JSON       {"viewmat": [16 numbers, row-major world-to-camera, OpenCV axes], "fovx": degrees}
//                     (default: the orbit camera of `visionmoe-splat render --views 1`, from level 0)
//   hud=0             hide the overlay (screenshots)
//   maxsh=D           render SH bands up to degree D only
//   width=W&height=H  fixed canvas size in CSS pixels (default: the window)
// window.pgmsViewer reports progress to tests: {shown: [{level, bytes, count, ms, drawMs}], done, error, ...}
// (drawMs: from adding a level's splats to the scene until they were sorted and drawn).

import * as THREE from "three";
import { OrbitControls } from "three/addons/controls/OrbitControls.js";
import { SparkRenderer } from "@sparkjsdev/spark";
import { PgmsStream } from "../src/pgms.js";
import { orbitCamera } from "../src/scene.js";
import { sceneToSplatMesh } from "../src/loader.js";

const params = new URLSearchParams(location.search);
const fileUrl = params.get("file") || "../scene.pgms";
const maxLevel = params.has("level") ? Number(params.get("level")) : Infinity;
const fixedW = Number(params.get("width")) || 0;
const fixedH = Number(params.get("height")) || 0;
const hud = document.getElementById("hud");
const statusEl = document.getElementById("status");
const errorEl = document.getElementById("error");
if (params.get("hud") === "0") hud.classList.add("hidden");

const state = (window.pgmsViewer = { shown: [], done: false, error: null, bytes: 0, total: null, levels: null, t0: performance.now() });

const width = () => fixedW || window.innerWidth;
const height = () => fixedH || window.innerHeight;
const renderer = new THREE.WebGLRenderer({ antialias: false, preserveDrawingBuffer: true });
renderer.setPixelRatio(fixedW ? 1 : window.devicePixelRatio);
renderer.setSize(width(), height());
renderer.setClearColor(0x000000, 1);
document.body.appendChild(renderer.domElement);
const scene = new THREE.Scene();
// 3DGS semantics of the Python rasteriser: 3 sigma extent, alpha >= 1/255, depth sort, and the
// 0.3 px low-pass added to the 2D covariance without opacity compensation (Spark's blurAmount
// rescales opacity by sqrt(det ratio), Mip-Splatting style; its preBlurAmount does not)
const spark = new SparkRenderer({ renderer, maxStdDev: 3, minAlpha: 1 / 255, preBlurAmount: 0.3, blurAmount: 0, sortRadial: false, accumExtSplats: true });
scene.add(spark);
const camera = new THREE.PerspectiveCamera(50, width() / height(), 0.01, 1e6);
const controls = new OrbitControls(camera, renderer.domElement);
controls.enableDamping = true;
let cameraSet = false;

function setCamera(viewmat, fovx, target) {
  // OpenCV world-to-camera -> three.js camera (x right, y up, looking down -z)
  const V = new THREE.Matrix4().set(...viewmat);
  const C = V.clone().invert().multiply(new THREE.Matrix4().makeScale(1, -1, -1));
  C.decompose(camera.position, camera.quaternion, camera.scale);
  const aspect = width() / height();
  camera.fov = THREE.MathUtils.radToDeg(2 * Math.atan(Math.tan(THREE.MathUtils.degToRad(fovx) / 2) / aspect));
  camera.aspect = aspect;
  camera.updateProjectionMatrix();
  // orbit around the scene centre (or a point ahead of the camera)
  if (target) controls.target.set(...target);
  else controls.target.copy(camera.position).add(new THREE.Vector3(0, 0, -1).applyQuaternion(camera.quaternion));
  camera.up.set(0, 1, 0).applyQuaternion(camera.quaternion);
  controls.update();
  cameraSet = true;
}

const given = params.get("camera");
if (given) {
  const c = JSON.parse(given);
  setCamera(c.viewmat, c.fovx, c.target);
}

window.addEventListener("resize", () => {
  if (fixedW) return;
  renderer.setSize(width(), height());
  camera.aspect = width() / height();
  camera.updateProjectionMatrix();
});

let mesh = null;
let frames = 0;
renderer.setAnimationLoop(() => {
  controls.update();
  renderer.render(scene, camera);
  frames++;
});

function fmtBytes(b) {
  return b < 1024 ? `${b} B` : b < 1048576 ? `${(b / 1024).toFixed(1)} KiB` : `${(b / 1048576).toFixed(2)} MiB`;
}

function updateHud() {
  const shown = state.shown.at(-1);
  const lv = shown ? `level ${shown.level + 1} of ${state.levels} (${shown.count.toLocaleString()} splats)` : "waiting for level 1";
  const total = state.total ? ` of ${fmtBytes(state.total)}` : "";
  statusEl.textContent = `${lv}\n${fmtBytes(state.bytes)}${total} received${state.done ? " - complete" : ""}`;
}

const nextFrames = (k) => new Promise((resolve) => {
  const start = frames;
  const poll = () => (frames >= start + k ? resolve() : requestAnimationFrame(poll));
  requestAnimationFrame(poll);
});

// Spark generates and depth-sorts splats asynchronously (a timer after the frame, then a worker
// whose first start loads WebAssembly), so a fixed number of frames is not enough on a loaded
// machine: wait until the splats of `next` are generated, sorted and displayed, then draw twice.
// These are SparkRenderer's own fields (Spark 2.2, pinned in package-lock.json); where a later
// Spark lacks them the viewer falls back to waiting three frames.
const SORT_WAIT_MS = 20000;
const sortStateKnown = () => spark.current !== undefined && "sortDirty" in spark && "activeSplats" in spark;
const settled = (next) => spark.current.numSplats === next.numSplats && spark.display === spark.current
  && !spark.sorting && !spark.sortDirty && spark.activeSplats > 0;
async function sortedAndDrawn(next) {
  const start = performance.now();
  await nextFrames(1);
  if (!sortStateKnown()) {
    await nextFrames(2);
    return performance.now() - start;
  }
  while (!settled(next)) {
    if (performance.now() - start > SORT_WAIT_MS) {
      console.warn(`splats not sorted after ${SORT_WAIT_MS} ms; showing the level anyway`);
      break;
    }
    await nextFrames(1);
  }
  await nextFrames(2);
  return performance.now() - start;
}

let showing = Promise.resolve();
function show(level, sc, bytes) {
  showing = showing.then(async () => {
    if (!cameraSet) {
      const c = orbitCamera(sc, { fovDeg: 50, elevationDeg: 20 });
      setCamera(c.viewmat, c.fovx, c.target);
    }
    const next = sceneToSplatMesh(sc, params.has("maxsh") ? { maxSh: Number(params.get("maxsh")) } : {});
    await next.initialized;
    scene.add(next);
    if (mesh) {
      scene.remove(mesh);
      mesh.dispose();
    }
    mesh = next;
    const drawMs = await sortedAndDrawn(next);
    state.shown.push({ level, bytes, received: state.bytes, count: sc.count, ms: performance.now() - state.t0, drawMs });
    updateHud();
  });
  return showing;
}

async function run() {
  const res = await fetch(fileUrl);
  if (!res.ok) throw new Error(`${fileUrl}: HTTP ${res.status}`);
  const len = Number(res.headers.get("content-length"));
  if (len) state.total = len;
  // a known size bounds the node count and the memory each level may need (DecodeMemoryError)
  const stream = new PgmsStream(len ? { fileSize: len } : {});
  const reader = res.body.getReader();
  state.t0 = performance.now();
  let pending = null;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    state.bytes += value.length;
    if (state.firstByteMs === undefined) state.firstByteMs = performance.now() - state.t0;
    const levels = stream.push(value);
    if (stream.header) state.levels = stream.header.numLevels;
    const want = levels.filter((l) => l.level <= maxLevel);
    if (want.length) {
      pending = want.at(-1);
      show(pending.level, pending.scene, pending.bytes);
    }
    updateHud();
    if (stream.levels.length > maxLevel) {
      reader.cancel();
      break;
    }
  }
  if (stream.levels.length <= Math.min(maxLevel, (stream.header?.numLevels ?? 1) - 1)) stream.end();
  await showing;
  state.done = true;
  updateHud();
}

run().catch((e) => {
  state.error = String(e && e.message ? e.message : e);
  errorEl.textContent = `\n${state.error}`;
  console.error(e);
});
