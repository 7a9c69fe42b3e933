// The JavaScript decoder over a conformance corpus (tests/conformance/make_corpus.py):
//   node tests/conformance/decode_js.mjs DIR   -> JSON on stdout: one outcome per manifest entry,
// in manifest order: {outcome: "ok", count, digest} (SHA-256 of the decoded float32 arrays in the
// Python order: means, quats, log_scales, opacity_logits, sh_dc, sh_rest) or {outcome:
// "FormatError" | <any other error name>, message}.
import fs from "node:fs";
import path from "node:path";
import { createHash } from "node:crypto";
import { decodePgms, FormatError } from "../../web/src/pgms.js";

const dir = process.argv[2];
const manifest = JSON.parse(fs.readFileSync(path.join(dir, "manifest.json"), "utf8"));
const ARRAYS = ["means", "quats", "logScales", "opacityLogits", "shDc", "shRest"];

function outcome(entry) {
  const bytes = new Uint8Array(fs.readFileSync(path.join(dir, entry.file)));
  try {
    const { scene } = decodePgms(bytes, entry.level === null ? {} : { level: entry.level });
    const sha = createHash("sha256");
    // float32 arrays on a little-endian host: the bytes Python hashes
    for (const k of ARRAYS) sha.update(new Uint8Array(scene[k].buffer, scene[k].byteOffset, scene[k].byteLength));
    return { outcome: "ok", count: scene.count, digest: sha.digest("hex") };
  } catch (e) {
    return { outcome: e instanceof FormatError ? "FormatError" : (e && e.name) || "Error", message: String(e && e.message) };
  }
}

const t = performance.now();
const results = manifest.files.map(outcome);
process.stdout.write(JSON.stringify({ seconds: (performance.now() - t) / 1000, results }));
