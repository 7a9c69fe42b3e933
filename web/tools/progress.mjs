#!/usr/bin/env node
// Watch the viewer page load a (throttled) stream: a screenshot each time a new level is shown.
//   node tools/progress.mjs --url URL --dir OUTDIR [--width W] [--height H] [--timeout MS]
// Prints one JSON line: the viewer's final state plus {shots: [{level, file, received}], wallMs}.
import path from "node:path";
import { launch, waitDone } from "./browser.mjs";

const args = Object.fromEntries(process.argv.slice(2).reduce((acc, a, i, all) => {
  if (a.startsWith("--")) acc.push([a.slice(2), all[i + 1]]);
  return acc;
}, []));
const width = Number(args.width || 512), height = Number(args.height || 512);
const timeout = Number(args.timeout || 120000);
const browser = await launch({ width, height });
try {
  const page = await browser.newPage();
  const logs = [];
  page.on("console", (m) => logs.push(`${m.type()}: ${m.text()}`));
  page.on("pageerror", (e) => logs.push(`pageerror: ${e.message}`));
  const t0 = Date.now();
  await page.goto(args.url);
  const shots = [];
  let seen = 0;
  for (;;) {
    const st = await page.evaluate(() => window.pgmsViewer && { n: window.pgmsViewer.shown.length, done: window.pgmsViewer.done, error: window.pgmsViewer.error, shown: window.pgmsViewer.shown });
    if (st && st.error) throw new Error(`viewer: ${st.error}\n${logs.join("\n")}`);
    if (st && st.n > seen) {
      const last = st.shown[st.n - 1];
      const file = path.join(args.dir, `level_${last.level}.png`);
      await page.screenshot({ path: file, clip: { x: 0, y: 0, width, height } });
      const after = await page.evaluate(() => ({ bytes: window.pgmsViewer.bytes, level: window.pgmsViewer.shown.at(-1).level }));
      // shotBytes/levelAfter: bytes received and level shown once the picture was taken
      shots.push({ level: last.level, file, received: last.received, shotBytes: after.bytes, levelAfter: after.level });
      seen = st.n;
    }
    if (st && st.done && st.n === seen) break;
    if (Date.now() - t0 > timeout) throw new Error(`timed out\n${logs.join("\n")}`);
    await new Promise((r) => setTimeout(r, 40));
  }
  const st = await waitDone(page, timeout);
  // the renderer sorts splats asynchronously after a level is shown: a last picture once it settled
  await new Promise((r) => setTimeout(r, 1500));
  await page.evaluate(() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r))));
  const file = path.join(args.dir, "final.png");
  await page.screenshot({ path: file, clip: { x: 0, y: 0, width, height } });
  shots.push({ level: st.shown.at(-1).level, file, received: st.bytes, settled: true });
  console.log(JSON.stringify({ ...st, shots, wallMs: Date.now() - t0 }));
} finally {
  await browser.close();
}
