// visionmoe-pgms: decode .pgms (PGMS) progressive Gaussian-splat bitstreams in any JavaScript
// runtime. The renderer-specific loader is a subpath of its own ("visionmoe-pgms/spark"), so that
// decoding needs no three.js or Spark.
export { decodePgms, PgmsStream, FormatError, DecodeMemoryError, readPreamble, MAGIC, READABLE_MAJORS } from "./src/pgms.js";
export { orbitCamera, sceneToPly } from "./src/scene.js";
