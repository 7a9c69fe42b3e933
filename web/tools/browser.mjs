// Headless Chromium (the system's, never a downloaded one) driven by puppeteer-core.
import fs from "node:fs";
import puppeteer from "puppeteer-core";

export function findChromium() {
  const cands = [process.env.CHROMIUM, "/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"];
  for (const c of cands) if (c && fs.existsSync(c)) return c;
  throw new Error("no Chromium found: install the distribution's package (apt-get install chromium) or set CHROMIUM");
}

export async function launch({ width = 512, height = 512 } = {}) {
  return puppeteer.launch({
    executablePath: findChromium(),
    headless: true,
    args: [
      "--no-sandbox", "--disable-dev-shm-usage", "--use-angle=swiftshader", "--enable-unsafe-swiftshader",
      "--ignore-gpu-blocklist", `--window-size=${width},${height}`, "--hide-scrollbars",
    ],
    defaultViewport: { width, height, deviceScaleFactor: 1 },
  });
}

/** Wait until window.pgmsViewer says done (or failed); returns its state. */
export async function waitDone(page, timeoutMs = 120000) {
  await page.waitForFunction(() => window.pgmsViewer && (window.pgmsViewer.done || window.pgmsViewer.error), { timeout: timeoutMs, polling: 50 });
  const st = await page.evaluate(() => window.pgmsViewer);
  if (st.error) throw new Error(`viewer: ${st.error}`);
  return st;
}
