// Run a browser example of web/README.md against a .pgms, as a web developer would:
//   node readme_example.mjs --web WEB --dir DIR --out OUT.png [--timeout MS]
// DIR holds example.mjs (the README's code, importing "visionmoe-pgms"), node_modules/visionmoe-pgms
// (a link to WEB) and scene.pgms. The example is bundled with esbuild (the npm packages from
// WEB/node_modules), served from DIR on 127.0.0.1 and opened in headless Chromium until its
// canvas shows something (a screenshot is polled). Prints one JSON line {lit, ms, errors}.
import fs from "node:fs";
import http from "node:http";
import path from "node:path";
import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";

const args = Object.fromEntries(process.argv.slice(2).reduce((acc, a, i, all) => {
  if (a.startsWith("--")) acc.push([a.slice(2), all[i + 1]]);
  return acc;
}, []));
const web = path.resolve(args.web), dir = path.resolve(args.dir), timeout = Number(args.timeout || 90000);
const esbuild = createRequire(path.join(web, "package.json"))("esbuild");
const { launch } = await import(pathToFileURL(path.join(web, "tools", "browser.mjs")));

await esbuild.build({
  entryPoints: [path.join(dir, "example.mjs")], outfile: path.join(dir, "example.js"), bundle: true, format: "esm",
  target: ["es2022"], nodePaths: [path.join(web, "node_modules")], logLevel: "error",
});
fs.writeFileSync(path.join(dir, "index.html"), '<!doctype html><link rel="icon" href="data:,"><body style="margin:0;background:#000">'
  + '<script type="module" src="example.js"></script>');

const types = { ".html": "text/html", ".js": "text/javascript", ".pgms": "application/octet-stream" };
const server = http.createServer((req, res) => {
  const name = path.basename(new URL(req.url, "http://x").pathname) || "index.html";
  const file = path.join(dir, name);
  if (!(name in { "index.html": 1, "example.js": 1, "scene.pgms": 1 }) || !fs.existsSync(file)) {
    res.writeHead(404).end();
    return;
  }
  res.writeHead(200, { "Content-Type": types[path.extname(name)] }).end(fs.readFileSync(file));
});
await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));

const browser = await launch({ width: 300, height: 150 });
const errors = [];
let lit = 0;
const start = Date.now();
try {
  const page = await browser.newPage();
  page.on("pageerror", (e) => errors.push(e.message));
  page.on("console", (m) => m.type() === "error" && errors.push(m.text()));
  await page.goto(`http://127.0.0.1:${server.address().port}/index.html`);
  while (Date.now() - start < timeout && !errors.length) {
    await new Promise((r) => setTimeout(r, 1000));
    const png = await page.screenshot({ encoding: "base64" });
    fs.writeFileSync(args.out, Buffer.from(png, "base64"));
    lit = await page.evaluate(async (b64) => { // the share of pixels brighter than the background
      const img = new Image();
      img.src = `data:image/png;base64,${b64}`;
      await img.decode();
      const g = new OffscreenCanvas(img.width, img.height).getContext("2d");
      g.drawImage(img, 0, 0);
      const d = g.getImageData(0, 0, img.width, img.height).data;
      let n = 0;
      for (let i = 0; i < d.length; i += 4) if (Math.max(d[i], d[i + 1], d[i + 2]) > 20) n++;
      return n / (d.length / 4);
    }, png);
    if (lit > 0.05) break;
  }
} finally {
  await browser.close();
  server.close();
}
console.log(JSON.stringify({ lit, ms: Date.now() - start, errors }));
