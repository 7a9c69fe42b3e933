// Types of visionmoe-pgms/spark: decoded levels handed to Spark (three.js) without a .ply.
import type { ExtSplats, SplatMesh, SplatMeshOptions } from "@sparkjsdev/spark";
import type { PgmsScene } from "./index.js";

/** Spark ExtSplats holding a decoded level (SH bands up to the scene's degree or `maxSh`). */
export function sceneToExtSplats(scene: PgmsScene, options?: { maxSh?: number }): ExtSplats;

/** A Spark SplatMesh (a three.js Object3D) showing a decoded level; other options go to SplatMesh. */
export function sceneToSplatMesh(
  scene: PgmsScene,
  options?: { maxSh?: number } & Omit<SplatMeshOptions, "extSplats">,
): SplatMesh;

/** One SH coefficient's RGB as the word Spark's shaders decode (shared exponent, 8-bit magnitudes). */
export function encodeShRgb(r: number, g: number, b: number): number;
