// The lens page in headless Chromium against the real turnstore binary, on
// the memory store and on a real redis-server: TURNSTORE_BIN=… node --test
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { request as httpRequest, createServer } from "node:http";
import { readFileSync } from "node:fs";
import { after, before, describe, test } from "node:test";
import {
  PLANTED_CARD,
  PLANTED_KEY,
  client,
  fill,
  launch,
  recordingPage,
  screenshot,
  startRedis,
  startTurnstore,
} from "./support.mjs";

const KEY = `lens-test-${randomUUID()}`;
const MASK = /\[redacted:[A-Za-z0-9_-]+\]/g;

/** The text the page shows (what a person could read), and its masks. */
const screenText = (page) => page.$eval("body", (b) => b.innerText);
const badge = (page) => page.$eval("#masked", (e) => Number(e.dataset.count));
const field = (page, root, name) => page.$eval(`${root} dd[data-field="${name}"]`, (e) => e.textContent);
const marks = (page, mark) =>
  page.$$eval(`#turns li[data-mark="${mark}"]`, (items) => items.map((li) => Number(li.dataset.seq)));

async function logIn(page) {
  await page.waitForSelector("#key-form:not([hidden])");
  await page.type("#key", KEY);
  await page.click('#key-form button[type="submit"]');
  try {
    await page.waitForSelector("#app:not([hidden])", { timeout: 10_000 });
  } catch (error) {
    const shown = await page.$eval("#error", (e) => e.textContent);
    throw new Error(`no app after the key; the page says: ${shown}`, { cause: error });
  }
}

async function waitTokens(page) {
  await page.waitForFunction(
    () => [...document.querySelectorAll("#turns .tokens")].every((e) => e.dataset.tokens !== undefined),
    { timeout: 20_000 },
  );
}

async function preview(page, options) {
  await page.$eval("#preview-form", (form) => form.reset());
  for (const [name, value] of Object.entries(options)) {
    const input = await page.$(`#preview-form [name="${name}"]`);
    const type = await input.evaluate((e) => e.type ?? e.tagName);
    if (type === "checkbox") {
      if (value) await input.click();
    } else if (type === "select-one") await input.select(String(value));
    else await input.type(String(value));
  }
  const before = await page.$eval("#preview-stats", (e) => e.textContent);
  await page.click('#preview-form button[type="submit"]');
  await page.waitForFunction(
    (old) => !document.getElementById("preview").hidden && document.getElementById("preview-stats").textContent !== old,
    { timeout: 20_000 },
    before,
  );
  // The marks are set once both reads have answered.
  await page.waitForFunction(() => document.querySelector("#turns li")?.dataset.mark, { timeout: 20_000 });
}

for (const store of ["memory", "redis"]) {
  describe(`the lens on the ${store} store`, () => {
    let redis;
    let server;
    let api;
    let browser;
    let data;
    const user = `alice-${store}`;

    before(async () => {
      redis = store === "redis" ? await startRedis() : undefined;
      server = await startTurnstore({
        TURNSTORE_LENS: "redacted",
        TURNSTORE_API_KEYS: KEY,
        ...(redis ? { TURNSTORE_REDIS_URL: redis.url, TURNSTORE_KEY_PREFIX: `lens${randomUUID().slice(0, 8)}` } : {}),
      });
      api = client(server.baseUrl, KEY);
      data = await fill(api, user);
      browser = await launch();
    });

    after(async () => {
      await browser?.close();
      await server?.stop();
      await redis?.stop();
    });

    test("/lens redirects to lens/, and the files carry the contract's headers", async () => {
      const r = await fetch(`${server.baseUrl}/lens`, { redirect: "manual" });
      assert.ok(r.status >= 300 && r.status < 400, `status ${r.status}`);
      assert.equal(r.headers.get("location"), "lens/");
      for (const [file, type] of [
        ["", "text/html"],
        ["lens.js", "text/javascript"],
        ["redact.js", "text/javascript"],
        ["lens.css", "text/css"],
      ]) {
        const f = await fetch(`${server.baseUrl}/lens/${file}`);
        assert.equal(f.status, 200, file);
        assert.ok(f.headers.get("content-type").startsWith(type), `${file}: ${f.headers.get("content-type")}`);
        assert.match(f.headers.get("content-security-policy"), /default-src 'none'; script-src 'self'/);
        assert.equal(f.headers.get("x-content-type-options"), "nosniff");
        assert.equal(f.headers.get("cache-control"), "no-store");
        const body = await f.text();
        if (file === "") assert.ok(!body.includes("__LENS_CONFIG__"), "the configuration is injected");
        else {
          const ours = readFileSync(new URL(`../${file}`, import.meta.url), "utf8");
          assert.ok(body === ours, `the binary serves another lens/${file} than this checkout's: rebuild it`);
        }
      }
    });

    test("log in, browse, preview: what the API answers, secrets masked, nothing external", async () => {
      const { page, requests, problems } = await recordingPage(browser);
      await page.goto(`${server.baseUrl}/lens`, { waitUntil: "networkidle0" });
      assert.equal(new URL(page.url()).pathname, "/lens/");

      // The server has keys: the page asks for one.
      await page.waitForSelector("#key-form:not([hidden])");
      await screenshot(page, `${store}-1-key`);
      await logIn(page);
      assert.equal(await page.evaluate(() => sessionStorage.getItem("turnstore-lens-key")), KEY);
      assert.equal(await page.evaluate(() => localStorage.length), 0);
      assert.equal(await page.evaluate(() => document.cookie), "");

      // The user's sessions, most recent first.
      await page.type("#user", user);
      await page.click('#user-form button[type="submit"]');
      await page.waitForFunction((n) => document.querySelectorAll("#session-list li").length === n, {}, 4);
      const listed = await page.$$eval("#session-list li", (items) => items.map((li) => li.dataset.id));
      const fromApi = await api.get(`/v1/users/${user}/sessions`, { limit: 50 });
      assert.deepEqual(listed, fromApi.sessions.map((s) => s.session_id));
      assert.ok(listed.includes(data.long));

      // One session: info, summary, its turns with per-turn tokens.
      await page.click(`#session-list li[data-id="${data.long}"] button`);
      await page.waitForFunction((n) => document.querySelectorAll("#turns li").length === n, {}, data.turns);
      assert.equal(await field(page, "#session-info", "turn_count"), String(data.turns));
      assert.equal(await page.$eval("#summary [data-through]", (e) => e.dataset.through), "5");
      await waitTokens(page);
      for (const seq of [1, 7, 12, data.turns]) {
        const one = await api.get(`/v1/sessions/${data.long}/history`, {
          format: "messages", after_seq: seq - 1, through_seq: seq, limit: 1, max_tokens: 10000000,
        });
        const shown = await page.$eval(`#turns li[data-seq="${seq}"] .tokens`, (e) => e.dataset.tokens);
        assert.equal(shown, String(one.token_count), `tokens of turn ${seq}`);
      }

      // The planted key and card are masked; the badge counts what is shown.
      let text = await screenText(page);
      assert.ok(!text.includes(PLANTED_KEY), "the API key is masked");
      assert.ok(!text.includes(PLANTED_CARD), "the card number is masked");
      assert.ok(text.includes("[redacted:api_key]") && text.includes("[redacted:card]"));
      assert.ok(text.includes("4111 1111 1111 1112"), "a number failing Luhn stays");
      assert.equal(await badge(page), text.match(MASK).length);
      await page.click('#turns li[data-seq="7"] .toggle');
      await screenshot(page, `${store}-2-session`);

      // A preview with a tight budget (text): its count and its turns are the API's.
      const tight = { format: "text", max_tokens: 400 };
      await preview(page, tight);
      const textRead = await api.get(`/v1/sessions/${data.long}/history`, tight);
      const turnsRead = await api.get(`/v1/sessions/${data.long}/history`, { ...tight, format: "turns" });
      assert.equal(textRead.stopped_by, "max_tokens");
      assert.equal(await field(page, "#preview-stats", "token_count"), String(textRead.token_count));
      assert.equal(await field(page, "#preview-stats", "stopped_by"), "max_tokens");
      assert.deepEqual(await marks(page, "included"), turnsRead.turns.map((t) => t.seq));
      const stopped = await marks(page, "stopped");
      assert.equal(stopped.length, data.turns - turnsRead.turns.length);
      assert.ok(Math.max(...stopped) < Math.min(...turnsRead.turns.map((t) => t.seq)));
      assert.equal(await page.$eval("#preview-output pre", (e) => e.textContent), textRead.rendered);

      // The curl box reproduces the read, with the key's variable, never the key.
      const curl = await page.$eval("#curl", (e) => e.textContent);
      assert.ok(curl.includes('-H "Authorization: Bearer $TURNSTORE_API_KEY"'), curl);
      assert.ok(!curl.includes(KEY));
      const url = /'(http[^']+)'/.exec(curl)[1];
      const again = await (await fetch(url, { headers: { Authorization: `Bearer ${KEY}` } })).json();
      assert.equal(again.token_count, textRead.token_count);

      // messages + summary + a stable window: the marks follow the API's answer.
      // (a budget whose stable window leaves turns out, found from Node)
      let stable;
      let m;
      for (let max = 900; max > 300 && !(m?.window?.left_out > 0); max -= 37) {
        stable = { format: "messages", max_tokens: max, summary: true, window: "stable", stride: 4 };
        m = await api.get(`/v1/sessions/${data.long}/history`, { ...stable, summary: "true" });
      }
      await preview(page, stable);
      assert.equal(await field(page, "#preview-stats", "token_count"), String(m.token_count));
      assert.ok(m.window && m.window.left_out > 0, `the window leaves turns out: ${JSON.stringify(m.window)}`);
      const all = await api.get(`/v1/sessions/${data.long}/history`, { format: "turns", limit: 100, max_tokens: 10000000 });
      const seqOf = new Map(all.turns.map((t) => [t.user_query, t.seq]));
      const included = m.messages.filter((x) => x.role === "user").map((x) => seqOf.get(x.content));
      assert.deepEqual(await marks(page, "included"), included);
      assert.deepEqual(await marks(page, "summary"), [1, 2, 3, 4, 5]);
      const windowed = await marks(page, "window");
      assert.equal(windowed.length, m.window.left_out);
      assert.ok(Math.max(...windowed) < m.window.from_seq);
      assert.equal(included[0], m.window.from_seq);
      const shownMessages = await page.$$eval("#preview-output .message pre", (items) => items.map((e) => e.textContent));
      assert.equal(shownMessages.length, m.messages.length);

      text = await screenText(page);
      assert.ok(!text.includes(PLANTED_KEY) && !text.includes(PLANTED_CARD));
      assert.equal(await badge(page), text.match(MASK).length);
      await page.$eval("#preview", (e) => e.scrollIntoView());
      await screenshot(page, `${store}-3-preview`);

      // Everything the page loaded is its own or the API's, and only GETs.
      const origin = new URL(server.baseUrl).origin;
      const foreign = requests.filter((r) => !r.url.startsWith("data:") && new URL(r.url).origin !== origin);
      assert.deepEqual(foreign, [], "no external resource");
      assert.deepEqual(requests.filter((r) => r.method !== "GET"), [], "read-only");
      assert.deepEqual(problems, [], "no console errors (CSP violations among them)");
      await page.close();
    });

    test("behind a path prefix, the page and its API calls stay under the prefix", async (t) => {
      if (store !== "memory") return t.skip("once is enough");
      // A reverse proxy serving turnstore under /pfx/, as nginx would.
      const upstream = new URL(server.baseUrl);
      const proxy = createServer((req, res) => {
        if (!req.url.startsWith("/pfx/")) return res.writeHead(404).end();
        const up = httpRequest(
          { host: upstream.hostname, port: upstream.port, path: req.url.slice(4), method: req.method, headers: req.headers },
          (answer) => {
            res.writeHead(answer.statusCode, answer.headers);
            answer.pipe(res);
          },
        );
        req.pipe(up);
      });
      await new Promise((resolve) => proxy.listen(0, "127.0.0.1", resolve));
      const origin = `http://127.0.0.1:${proxy.address().port}`;
      try {
        const { page, requests, problems } = await recordingPage(browser);
        await page.goto(`${origin}/pfx/lens`, { waitUntil: "networkidle0" });
        assert.equal(new URL(page.url()).pathname, "/pfx/lens/");
        await logIn(page);
        await page.type("#user", user);
        await page.click('#user-form button[type="submit"]');
        await page.waitForFunction(() => document.querySelectorAll("#session-list li").length === 4);
        const outside = requests.filter((r) => !r.url.startsWith(`${origin}/pfx/`));
        assert.deepEqual(outside, []);
        assert.deepEqual(problems, []);
        await page.close();
      } finally {
        proxy.closeAllConnections();
        await new Promise((resolve) => proxy.close(resolve));
      }
    });

    test("sessions and turns are paged: 50 a page, tokens only for the page shown", async () => {
      const many = `many-${store}`;
      for (let i = 0; i < 120; i += 1) await api.post("/v1/turns", { session_id: `${many}-${i}`, user_id: many, user_query: "q" });
      const big = `${many}-big`;
      for (let i = 1; i <= 120; i += 1) await api.turn(big, undefined, `Big question ${i}?`, `Big answer ${i}.`);

      const { page, requests, problems } = await recordingPage(browser);
      await page.goto(`${server.baseUrl}/lens/`, { waitUntil: "networkidle0" });
      await logIn(page);
      await page.type("#user", many);
      await page.click('#user-form button[type="submit"]');
      const pageOf = async () => {
        await page.waitForFunction(() => document.getElementById("sessions-status").textContent !== "Loading…");
        return page.$$eval("#session-list li", (items) => items.length);
      };
      let seen = await pageOf();
      let total = seen;
      while (!(await page.$eval("#sessions-older", (b) => b.disabled))) {
        await page.click("#sessions-older");
        seen = await pageOf();
        assert.ok(seen <= 50);
        total += seen;
      }
      assert.equal(total, 120);

      await page.type("#open-id", big);
      await page.click('#open-form button[type="submit"]');
      const range = async () => {
        await page.waitForFunction(() => /^(seq|no turns)/.test(document.getElementById("turns-status").textContent));
        return page.$$eval("#turns li", (items) => items.map((li) => Number(li.dataset.seq)));
      };
      let seqs = await range();
      assert.deepEqual([seqs.length, seqs[0], seqs.at(-1)], [50, 71, 120]);
      await waitTokens(page);
      const tokenReads = requests.filter((r) => r.url.includes("format=messages") && r.url.includes("limit=1&"));
      assert.equal(tokenReads.length, 50, "tokens of the page shown only");
      await page.click("#turns-older");
      seqs = await range();
      assert.deepEqual([seqs.length, seqs[0], seqs.at(-1)], [50, 21, 70]);
      await page.click("#turns-older");
      seqs = await range();
      assert.deepEqual([seqs.length, seqs[0], seqs.at(-1)], [20, 1, 20]);
      assert.equal(await page.$eval("#turns-older", (b) => b.disabled), true);
      await page.click("#turns-newer");
      seqs = await range();
      assert.deepEqual([seqs[0], seqs.at(-1)], [21, 70]);
      await screenshot(page, `${store}-4-paged`);
      assert.deepEqual(problems, []);
      await page.close();
    });

    test("the worst texts the limits allow: a session of them opens, masked", async () => {
      // Maximal questions and answers, each one long run of a rule's first
      // characters: RegExp's backtracking took 15 to 22 s a text on these.
      const fill = (size, unit, tail = "") => unit.repeat(Math.floor((size - tail.length) / unit.length)) + tail;
      const shapes = [fill(131072, "a", "@example.com"), fill(131072, "1a"), fill(131072, "eyJ-"), `x@${fill(131070, "b.")}`];
      const answers = [...shapes, ...shapes];
      const worst = `worst-${store}`;
      for (const answer of answers) await api.turn(worst, "worst", fill(32768, "a"), answer);

      const { page, problems } = await recordingPage(browser);
      await page.goto(`${server.baseUrl}/lens/`, { waitUntil: "networkidle0" });
      await logIn(page);
      await page.type("#open-id", worst);
      await page.click('#open-form button[type="submit"]');
      await page.waitForFunction(() => document.querySelectorAll("#turns li").length === 8, { timeout: 20_000 });
      const shown = await page.$$eval("#turns li .text.a:not(.en) span", (items) => items.map((e) => e.textContent));
      assert.deepEqual(
        shown.map((text) => (text.length > 131000 ? "long" : text)),
        ["[redacted:email]", "long", "long", "long", "[redacted:email]", "long", "long", "long"],
      );
      assert.ok((await badge(page)) >= 1);
      assert.deepEqual(problems, []);
      await page.close();
    });
  });
}

describe("the lens off, and in full mode", () => {
  test("/lens is a 404 problem when TURNSTORE_LENS is unset", async () => {
    const server = await startTurnstore({});
    try {
      for (const path of ["/lens", "/lens/", "/lens/lens.js"]) {
        const r = await fetch(server.baseUrl + path, { redirect: "manual" });
        assert.equal(r.status, 404, path);
        assert.ok(r.headers.get("content-type").startsWith("application/problem+json"));
      }
    } finally {
      await server.stop();
    }
  });

  test("full mode shows texts unmasked, and says so; no key asked when the API is open", async () => {
    const server = await startTurnstore({ TURNSTORE_LENS: "full" });
    const browser = await launch();
    try {
      const api = client(server.baseUrl, "none");
      await api.turn("full-1", "bob", `Here: ${PLANTED_KEY}`, "Noted.");
      const { page, problems } = await recordingPage(browser);
      await page.goto(`${server.baseUrl}/lens/`, { waitUntil: "networkidle0" });
      await page.waitForSelector("#app:not([hidden])");
      assert.equal(await page.$eval("#key-form", (e) => e.hidden), true);
      await page.type("#user", "bob");
      await page.click('#user-form button[type="submit"]');
      await page.waitForSelector("#session-list li button");
      await page.click("#session-list li button");
      await page.waitForSelector('#turns li[data-seq="1"]');
      const text = await screenText(page);
      assert.ok(text.includes(PLANTED_KEY));
      assert.match(await page.$eval("#mode", (e) => e.textContent), /full/);
      assert.match(await page.$eval("#masked", (e) => e.textContent), /nothing masked/);
      assert.deepEqual(problems, []);
    } finally {
      await browser.close();
      await server.stop();
    }
  });
});
