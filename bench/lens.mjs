// Times the lens page on a large user (bench/lens prepares it): the first
// page of their sessions, the next one, a session of many turns (its first
// page of turns with their token counts), and a history preview; and what
// the browser moved and held. Run by bench/lens with node, from lens/
// (puppeteer-core comes from lens/node_modules).
import { launch } from "../lens/test/support.mjs";

const [base, user, session, rounds = "3"] = process.argv.slice(2);

async function timed(what, page, act, until, ...args) {
  const t0 = performance.now();
  await act();
  await page.waitForFunction(until, { timeout: 60_000 }, ...args);
  return [what, performance.now() - t0];
}

const browser = await launch();
const results = {};
try {
  for (let round = 0; round < Number(rounds); round += 1) {
    const page = await browser.newPage();
    await page.setViewport({ width: 1360, height: 900 });
    let bytes = 0;
    page.on("response", async (r) => {
      try {
        bytes += (await r.buffer()).length;
      } catch {
        // a redirect has no body
      }
    });
    const steps = [];
    steps.push(
      await timed("load", page, () => page.goto(`${base}/lens/`), () => !document.getElementById("app").hidden),
    );
    steps.push(
      await timed(
        "sessions",
        page,
        async () => {
          await page.type("#user", user);
          await page.click('#user-form button[type="submit"]');
        },
        () => document.querySelectorAll("#session-list li").length >= 50,
      ),
    );
    const first = await page.$eval("#session-list li", (li) => li.textContent);
    steps.push(
      await timed(
        "older",
        page,
        () => page.click("#sessions-older"),
        (was) => document.querySelector("#session-list li")?.textContent !== was,
        first,
      ),
    );
    steps.push(
      await timed(
        "session",
        page,
        async () => {
          await page.type("#open-id", session);
          await page.click('#open-form button[type="submit"]');
        },
        () => {
          const cells = [...document.querySelectorAll("#turns .tokens")];
          return cells.length >= 50 && cells.every((e) => e.dataset.tokens !== undefined);
        },
      ),
    );
    steps.push(
      await timed(
        "preview",
        page,
        () => page.click('#preview-form button[type="submit"]'),
        () => !document.getElementById("preview").hidden && document.querySelector("#turns li")?.dataset.mark,
      ),
    );
    const { JSHeapUsedSize } = await page.metrics();
    const nodes = await page.$$eval("*", (all) => all.length);
    for (const [what, ms] of steps) (results[what] ??= []).push(ms);
    (results.bytes ??= []).push(bytes);
    (results.heap ??= []).push(JSHeapUsedSize);
    (results.nodes ??= []).push(nodes);
    await page.close();
  }
} finally {
  await browser.close();
}
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const ms = (what) => `${what} ${median(results[what]).toFixed(0)} ms`;
console.log(
  `median of ${rounds}: ${["load", "sessions", "older", "session", "preview"].map(ms).join(", ")}; ` +
    `${(median(results.bytes) / 1024).toFixed(0)} KiB received, ` +
    `${(median(results.heap) / 1048576).toFixed(1)} MiB of JS heap, ${median(results.nodes)} DOM nodes`,
);
