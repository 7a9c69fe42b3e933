#!/usr/bin/env node
// Render a .pgms in the viewer page in headless Chromium and save a PNG.
//   node tools/screenshot.mjs --url http://127.0.0.1:PORT/viewer/index.html?file=... --out OUT.png
//        [--width 512] [--height 512] [--timeout 120000]
// Prints the viewer's final state (levels shown, bytes, times) as one JSON line. `visionmoe-splat view
// --screenshot` passes a new temporary file in the output's folder as --out and renames it over the
// output itself (the project's one output writer): this tool only fills the file it is given.
// A failure ends with one `error: ...` line on stderr (after the page's console, when it has one).
import { launch, waitDone } from "./browser.mjs";

const args = Object.fromEntries(process.argv.slice(2).reduce((acc, a, i, all) => {
  if (a.startsWith("--")) acc.push([a.slice(2), all[i + 1]]);
  return acc;
}, []));
if (!args.url || !args.out) {
  console.error("usage: screenshot.mjs --url URL --out OUT.png [--width W] [--height H] [--timeout MS]");
  process.exit(2);
}
const width = Number(args.width || 512), height = Number(args.height || 512);

async function shoot() {
  const browser = await launch({ width, height });
  try {
    const page = await browser.newPage();
    const logs = [];
    page.on("console", (m) => logs.push(`${m.type()}: ${m.text()}`));
    page.on("pageerror", (e) => logs.push(`pageerror: ${e.message}`));
    await page.goto(args.url);
    let st;
    try {
      st = await waitDone(page, Number(args.timeout || 120000));
    } catch (e) {
      if (logs.length) console.error(logs.join("\n"));
      throw e;
    }
    await page.screenshot({ path: args.out, clip: { x: 0, y: 0, width, height } });
    return st;
  } finally {
    await browser.close();
  }
}

try {
  console.log(JSON.stringify(await shoot()));
} catch (e) {
  console.error(`error: ${String(e && e.message ? e.message : e).split("\n")[0]}`);
  process.exit(1);
}
