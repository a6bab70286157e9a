// Loads a self-contained HTML page (a file path) in headless Chromium through Playwright and fails on anything a
// reader would see go wrong: a console error or warning, an uncaught page error, or any network request (a
// self-contained page fetches nothing). Writes a full-page screenshot and prints one JSON line:
// {"title", "svgs", "console": [...], "errors": [...], "requests": [...], "screenshot"}.
// Usage: node render-page.mjs PAGE.html SCREENSHOT.png   (CHROMIUM=/usr/bin/chromium, PLAYWRIGHT_CORE=dir)
import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";
import { join, resolve } from "node:path";

const [page_path, shot] = process.argv.slice(2);
if (!page_path || !shot) {
  console.error("usage: node render-page.mjs PAGE.html SCREENSHOT.png");
  process.exit(2);
}
const require = createRequire(join(resolve(process.env.PLAYWRIGHT_CORE || "."), "package.json"));
const { chromium } = require("playwright-core");
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  // Playwright gives it a fresh profile. On a closed network, Chromium's own background connections fail noisily
  // without these.
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"],
});
const out = { console: [], errors: [], requests: [] };
try {
  const page = await browser.newPage({ viewport: { width: 1200, height: 900 } });
  page.on("console", (m) => { if (m.type() === "error" || m.type() === "warning") out.console.push(`${m.type()}: ${m.text()}`); });
  page.on("pageerror", (e) => out.errors.push(String(e)));
  const url = pathToFileURL(resolve(page_path)).href;
  page.on("request", (r) => { if (r.url() !== url) out.requests.push(r.url()); });
  const resp = await page.goto(url, { waitUntil: "load" });
  if (!resp || !resp.ok()) out.errors.push(`load: ${resp ? resp.status() : "no response"}`);
  out.title = await page.title();
  out.svgs = await page.locator("svg").count();
  await page.screenshot({ path: shot, fullPage: true });
  out.screenshot = shot;
} finally {
  await browser.close();
}
console.log(JSON.stringify(out));
process.exit(out.console.length || out.errors.length || out.requests.length ? 1 : 0);
