// Starts the real turnstore binary (and a redis-server), fills data through
// the public API, and launches the system Chromium. Same approach as
// clients/typescript/test/support/processes.ts.
import { spawn } from "node:child_process";
import { mkdirSync } from "node:fs";
import { createServer } from "node:net";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import puppeteer from "puppeteer-core";

export const ARTIFACTS = join(dirname(fileURLToPath(import.meta.url)), "artifacts");
export const CHROMIUM = process.env.CHROMIUM ?? "/usr/bin/chromium";
const STARTUP_TIMEOUT_MS = 20_000;
const children = new Set();

process.on("exit", () => {
  for (const child of children) child.kill("SIGKILL");
});

export function turnstoreBinary() {
  const bin = process.env.TURNSTORE_BIN;
  if (!bin) throw new Error("TURNSTORE_BIN is not set: point it at a turnstore binary");
  return bin;
}

/** `turnstore serve` on a free port; the in-memory store unless `env` names a Redis. */
export async function startTurnstore(env = {}) {
  const inherited = Object.fromEntries(Object.entries(process.env).filter(([n]) => !n.startsWith("TURNSTORE_")));
  const child = spawn(turnstoreBinary(), ["serve"], {
    env: { ...inherited, TURNSTORE_LISTEN: "127.0.0.1:0", TURNSTORE_LOG_FORMAT: "json", ...env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  const lines = watch(child);
  const port = await waitFor(child, lines, "turnstore", (line) => {
    const record = parseJson(line);
    return record?.message === "turnstore serving" && typeof record.port === "number" ? record.port : undefined;
  });
  return { baseUrl: `http://127.0.0.1:${port}`, ...handle(child, lines) };
}

/** A throwaway redis-server (no persistence) on a free port. */
export async function startRedis() {
  for (let tries = 1; ; tries += 1) {
    const port = await freePort();
    const child = spawn("redis-server", ["--port", String(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"], {
      stdio: ["ignore", "pipe", "pipe"],
    });
    const lines = watch(child);
    try {
      await waitFor(child, lines, "redis-server", (l) => (l.includes("Ready to accept connections") ? true : undefined));
      return { url: `redis://127.0.0.1:${port}`, ...handle(child, lines) };
    } catch (error) {
      if (tries >= 3) throw error;
    }
  }
}

/** A seeded PRNG (mulberry32), so that a failure can be replayed. */
export function random(seed) {
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** Runs `turnstore redact` on `text`: {text, count}. */
export function runRedact(text, env = {}) {
  return new Promise((resolve, reject) => {
    const child = spawn(turnstoreBinary(), ["redact"], { env: { PATH: process.env.PATH, ...env } });
    const out = [];
    const err = [];
    child.stdout.on("data", (c) => out.push(c));
    child.stderr.on("data", (c) => err.push(c));
    child.on("error", reject);
    child.on("close", (code) => {
      const stderr = Buffer.concat(err).toString("utf8");
      const masked = /^masked (\d+)$/m.exec(stderr);
      if (code !== 0 || !masked) reject(new Error(`turnstore redact exited ${code}: ${stderr}`));
      else resolve({ text: Buffer.concat(out).toString("utf8"), count: Number(masked[1]) });
    });
    child.stdin.end(text);
  });
}

function watch(child) {
  children.add(child);
  child.on("exit", () => children.delete(child));
  const lines = [];
  for (const stream of [child.stdout, child.stderr]) {
    let rest = "";
    stream.setEncoding("utf8");
    stream.on("data", (chunk) => {
      const parts = (rest + chunk).split("\n");
      rest = parts.pop();
      lines.push(...parts);
      if (lines.length > 2000) lines.splice(0, lines.length - 2000);
    });
  }
  return lines;
}

function waitFor(child, lines, name, match) {
  return new Promise((resolve, reject) => {
    let seen = 0;
    const fail = (why) => {
      clearInterval(poll);
      clearTimeout(timer);
      child.kill("SIGKILL");
      reject(new Error(`${name} ${why}; its output:\n${lines.join("\n")}`));
    };
    const poll = setInterval(() => {
      for (; seen < lines.length; seen += 1) {
        const found = match(lines[seen]);
        if (found !== undefined) {
          clearInterval(poll);
          clearTimeout(timer);
          resolve(found);
          return;
        }
      }
      if (child.exitCode !== null || child.signalCode !== null) fail(`exited (${child.exitCode ?? child.signalCode}) before it was ready`);
    }, 20);
    const timer = setTimeout(() => fail(`was not ready within ${STARTUP_TIMEOUT_MS} ms`), STARTUP_TIMEOUT_MS);
    child.once("error", (error) => fail(`could not be started: ${error.message}`));
  });
}

function handle(child, lines) {
  return {
    output: () => lines.join("\n"),
    stop: () =>
      new Promise((resolve) => {
        if (child.exitCode !== null || child.signalCode !== null) return resolve();
        const killer = setTimeout(() => child.kill("SIGKILL"), 5_000);
        child.once("exit", () => {
          clearTimeout(killer);
          resolve();
        });
        child.kill("SIGTERM");
      }),
  };
}

function freePort() {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

function parseJson(line) {
  try {
    const value = JSON.parse(line);
    return typeof value === "object" && value !== null ? value : undefined;
  } catch {
    return undefined;
  }
}

// ---- the API, from Node ---------------------------------------------------

export function client(baseUrl, key) {
  const call = async (method, path, body) => {
    const response = await fetch(baseUrl + path, {
      method,
      headers: { Authorization: `Bearer ${key}`, "Content-Type": "application/json" },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await response.text();
    if (!response.ok) throw new Error(`${method} ${path}: ${response.status} ${text}`);
    return text ? JSON.parse(text) : null;
  };
  return {
    get: (path, params = {}) => call("GET", path + (Object.keys(params).length ? `?${new URLSearchParams(params)}` : "")),
    post: (path, body) => call("POST", path, body),
    put: (path, body) => call("PUT", path, body),
    async turn(session, user, q, a, extra = {}) {
      const started = await call("POST", "/v1/turns", { session_id: session, user_id: user, user_query: q, ...extra.start });
      await call("POST", `/v1/sessions/${session}/turns/${started.turn_id}/finalize`, { final_answer: a, ...extra.finalize });
      return started.seq;
    },
  };
}

export const PLANTED_KEY = "sk-proj-Z9xQ4tLmW2rB7nV1cK8pJ3sD";
export const PLANTED_CARD = "4111 1111 1111 1111";

/**
 * A user with a few sessions; `long` has 30 turns (a key and a card planted
 * in them, an English copy on one) and a summary of its first 5.
 */
export async function fill(api, user) {
  const long = `${user}-long`;
  for (let i = 1; i <= 30; i += 1) {
    let q = `Question ${i}: how does the vector index behave when the corpus grows to ${i * 100} thousand documents?`;
    let a = `Answer ${i}: it stays fast; recall drops slightly, so rebuild the graph every ${i} days. `.repeat(1 + (i % 3));
    const extra = {};
    if (i === 7) q = `My OpenAI key is ${PLANTED_KEY}, is it safe to paste it here?`;
    if (i === 12) a = `The card ${PLANTED_CARD} was charged; the test card 4111 1111 1111 1112 was not.`;
    if (i === 20) extra.finalize = { final_answer_en: "An English copy of answer 20." };
    await api.turn(long, user, q, a, extra);
  }
  await api.put(`/v1/sessions/${long}/summary`, {
    summary: "The user asked about vector indexes for growing corpora; HNSW was recommended.",
    through_seq: 5,
    expected_through_seq: 0,
  });
  for (let s = 1; s <= 3; s += 1) {
    for (let i = 1; i <= s; i += 1) await api.turn(`${user}-short-${s}`, user, `Short ${s}.${i}?`, `Reply ${s}.${i}.`);
  }
  // The long session last, so that it is the most recently active.
  await api.turn(long, user, "And one more question?", "One more answer.");
  return { long, shorts: [1, 2, 3].map((s) => `${user}-short-${s}`), turns: 31 };
}

// ---- the browser ------------------------------------------------------------

export async function launch() {
  return puppeteer.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: ["--no-sandbox", "--disable-dev-shm-usage", "--no-first-run", "--no-default-browser-check"],
  });
}

/** A page that records every request and console error it sees. */
export async function recordingPage(browser) {
  const page = await browser.newPage();
  await page.setViewport({ width: 1360, height: 900 });
  const requests = [];
  const problems = [];
  page.on("request", (r) => requests.push({ url: r.url(), method: r.method() }));
  // An API error shows as "Failed to load resource": those are checked by
  // status instead (a 401 before the key, a 404 of a session without summary).
  page.on("console", (m) => m.type() === "error" && !m.text().startsWith("Failed to load resource") && problems.push(m.text()));
  page.on("pageerror", (e) => problems.push(String(e)));
  page.on("response", (r) => {
    const path = new URL(r.url()).pathname;
    const expected = r.status() < 400 || r.status() === 401 || (r.status() === 404 && path.endsWith("/summary"));
    if (!expected) problems.push(`${r.status()} ${r.url()}`);
  });
  return { page, requests, problems };
}

export async function screenshot(page, name) {
  mkdirSync(ARTIFACTS, { recursive: true });
  const path = join(ARTIFACTS, `${name}.png`);
  await page.screenshot({ path, fullPage: false });
  return path;
}
