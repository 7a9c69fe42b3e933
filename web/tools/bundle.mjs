#!/usr/bin/env node
// Build the viewer site that ships as package data of visionmoe.splat.viewer (setup.py runs this):
//   node tools/bundle.mjs --out DIR [--stamp TEXT]
// DIR/viewer/index.html + viewer.js   the page, one ES module holding the decoder (src/), three,
//                                     Spark and fzstd: a browser needs nothing else
// DIR/tools/screenshot.mjs            the headless-Chromium screenshot tool with puppeteer-core
//                                     (Node only; Chromium is the system's)
// DIR/THIRD_PARTY_LICENSES.md         name, version, licence and licence text of every npm
//                                     package inside the two bundles (from esbuild's metafile)
// DIR/bundle.json                     {stamp, packages}: setup.py compares the stamp (a hash of
//                                     the inputs) to decide whether to build again
// DIR is replaced as a whole, so a failed build never leaves half a site.
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import * as esbuild from "esbuild";

const WEB = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");

function parseArgs(argv) {
  const args = {};
  for (let i = 0; i < argv.length; i += 2) {
    if (!argv[i].startsWith("--") || argv[i + 1] === undefined) throw new Error(`bad argument ${argv[i]}`);
    args[argv[i].slice(2)] = argv[i + 1];
  }
  if (!args.out) throw new Error("usage: bundle.mjs --out DIR [--stamp TEXT]");
  return args;
}

const common = { bundle: true, format: "esm", minify: true, legalComments: "none", metafile: true, logLevel: "warning", absWorkingDir: WEB };

async function buildPage(dir) {
  fs.mkdirSync(path.join(dir, "viewer"), { recursive: true });
  fs.copyFileSync(path.join(WEB, "viewer", "index.html"), path.join(dir, "viewer", "index.html"));
  const res = await esbuild.build({
    ...common, entryPoints: [path.join(WEB, "viewer", "viewer.js")], outfile: path.join(dir, "viewer", "viewer.js"),
    platform: "browser", target: ["es2022"],
  });
  return res.metafile;
}

async function buildScreenshotTool(dir) {
  // puppeteer-core loads some modules with require(): give the ES module bundle a require()
  const banner = "import { createRequire as __vmCreateRequire } from 'node:module'; const require = __vmCreateRequire(import.meta.url);";
  const res = await esbuild.build({
    ...common, entryPoints: [path.join(WEB, "tools", "screenshot.mjs")], outfile: path.join(dir, "tools", "screenshot.mjs"),
    platform: "node", target: ["node20"], banner: { js: banner },
  });
  return res.metafile;
}

/** The npm packages (folder under node_modules, name, version, licence) whose files a metafile lists. */
function packagesOf(metafiles) {
  const roots = new Map();
  for (const meta of metafiles) {
    for (const input of Object.keys(meta.inputs)) {
      const m = input.match(/^(.*node_modules\/(?:@[^/]+\/)?[^/]+)\//);
      if (m) roots.set(m[1], true);
    }
  }
  return [...roots.keys()].sort().map((root) => {
    const folder = path.join(WEB, root);
    const pkg = JSON.parse(fs.readFileSync(path.join(folder, "package.json"), "utf8"));
    const file = fs.readdirSync(folder).find((f) => /^(licen[cs]e|copying)(\.(md|txt))?$/i.test(f));
    return { name: pkg.name, version: pkg.version, license: pkg.license, text: file ? fs.readFileSync(path.join(folder, file), "utf8").trim() : null };
  });
}

function licenceFile(packages) {
  const parts = ["# Third-party packages in this viewer bundle\n",
    "The page (viewer/viewer.js) and the screenshot tool (tools/screenshot.mjs) are esbuild bundles of these npm packages.\n"];
  for (const p of packages) {
    parts.push(`## ${p.name} ${p.version} (${p.license})\n`);
    parts.push(p.text ? "```\n" + p.text + "\n```\n" : `(no licence file in the package; licence: ${p.license})\n`);
  }
  return parts.join("\n");
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  const out = path.resolve(args.out);
  const tmp = `${out}.tmp-${process.pid}`;
  fs.rmSync(tmp, { recursive: true, force: true });
  try {
    const metas = [await buildPage(tmp), await buildScreenshotTool(tmp)];
    const packages = packagesOf(metas);
    const unlicensed = packages.filter((p) => !p.license);
    if (unlicensed.length) throw new Error(`bundled packages without a licence field: ${unlicensed.map((p) => p.name).join(", ")}`);
    fs.writeFileSync(path.join(tmp, "THIRD_PARTY_LICENSES.md"), licenceFile(packages));
    const summary = packages.map(({ name, version, license }) => ({ name, version, license }));
    fs.writeFileSync(path.join(tmp, "bundle.json"), JSON.stringify({ stamp: args.stamp ?? null, packages: summary }, null, 1) + "\n");
    fs.rmSync(out, { recursive: true, force: true });
    fs.renameSync(tmp, out);
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
  const size = (f) => fs.statSync(path.join(out, f)).size;
  console.log(`viewer bundle: ${out} (viewer.js ${size("viewer/viewer.js")} B, screenshot.mjs ${size("tools/screenshot.mjs")} B)`);
}

main().catch((e) => {
  console.error(`bundle.mjs: ${e.message}`);
  process.exit(1);
});
