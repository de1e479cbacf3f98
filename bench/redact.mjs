// Times the lens' redaction (lens/redact.js) against the server's
// (`turnstore redact`, a process per text: its figure includes the start)
// on the worst texts the limits allow and on prose:
//   node bench/redact.mjs TURNSTORE_BIN [label=path/to/redact.js ...]
// Run by bench/redact. Each engine gets the rules exactly as the server
// hands them to the page (its lens-config); each text is redacted ROUNDS
// times, engines interleaved, and the median is reported; an engine that
// takes longer than CAP_MS on a text is not run on it again. Every engine
// must give the server's text and count, or the run fails.
import { spawn, spawnSync } from "node:child_process";
import { resolve } from "node:path";
import { pathToFileURL } from "node:url";

const [bin, ...engineArgs] = process.argv.slice(2);
const ROUNDS = Number(process.env.ROUNDS ?? 5);
const CAP_MS = Number(process.env.CAP_MS ?? 5000);
const SIZE = Number(process.env.SIZE ?? 131072); // TURNSTORE_MAX_ANSWER_BYTES' default

async function rules() {
  const child = spawn(bin, ["serve"], {
    env: { PATH: process.env.PATH, TURNSTORE_LISTEN: "127.0.0.1:0", TURNSTORE_LOG_FORMAT: "json", TURNSTORE_LENS: "redacted" },
    stdio: ["ignore", "pipe", "inherit"],
  });
  try {
    const port = await new Promise((done, fail) => {
      let buffered = "";
      child.stdout.on("data", (chunk) => {
        buffered += chunk;
        const m = /"message":"turnstore serving"[^\n]*"port":(\d+)/.exec(buffered);
        if (m) done(Number(m[1]));
      });
      child.on("exit", (code) => fail(new Error(`turnstore exited ${code}`)));
    });
    const html = await (await fetch(`http://127.0.0.1:${port}/lens/`)).text();
    return JSON.parse(/id="lens-config">([\s\S]*?)<\/script>/.exec(html)[1]).rules;
  } finally {
    child.kill();
  }
}

/** `unit` repeated to SIZE bytes (ASCII units). */
const fill = (unit, head = "", tail = "") => head + unit.repeat(Math.floor((SIZE - head.length - tail.length) / unit.length)) + tail;

const prose = (() => {
  const words = ["the", "vector", "index", "finds", "nearest", "stored", "chunks,", "and", "ranks", "them.", "See", "https://example.com/docs", "v1.2.3", "Größe", "café"];
  const secrets = ["alice@example.com", "sk-proj-Z9xQ4tLmW2rB7nV1cK8pJ3sD", "4111 1111 1111 1111", "GB82 WEST 1234 5698 7654 32", "Bearer abc.def-ghi_jkl123", "redis://:hunter2@cache:6379/0"];
  let out = "";
  for (let i = 0; out.length < SIZE - 64; i += 1) out += (i % 97 === 0 ? secrets[(i / 97) % secrets.length] : words[(i * 7) % words.length]) + " ";
  return out;
})();

const plain = prose.replace(/\S*[@:]\S*|sk-\S+|Bearer \S+|\d[\d ]{11,}/g, "word");

const TEXTS = [
  ["prose", plain],
  ["prose with secrets", prose],
  ["one word: a…a", fill("a")],
  ["1a1a…", fill("1a")],
  ["b.b.b… after x@", fill("b.", "x@")],
  ["eyJ-eyJ-…", fill("eyJ-")],
  ["digits 1 1 1 …", fill("1 ")],
  ["AA11 AA11 …", fill("AA11 ")],
  ["bearer bearer …", fill("bearer ")],
];

function theirs(text) {
  const t0 = performance.now();
  const run = spawnSync(bin, ["redact"], { input: text, maxBuffer: 64 << 20, env: { PATH: process.env.PATH } });
  const ms = performance.now() - t0;
  const count = Number(/masked (\d+)/.exec(run.stderr.toString())?.[1]);
  return { ms, text: run.stdout.toString(), count };
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

const list = await rules();
const engines = [];
for (const arg of engineArgs.length ? engineArgs : ["redact.js=lens/redact.js"]) {
  const [label, path] = arg.split("=");
  const module = await import(pathToFileURL(resolve(path)).href);
  engines.push({ label, engine: module.redactor(list) });
}

console.log(`# ${new Date().toISOString().slice(0, 16)}Z node ${process.version}; ${ROUNDS} rounds, median ms; texts of ${SIZE} bytes`);
console.log(["text", "masks", "turnstore redact", ...engines.map((e) => e.label)].join(" | "));
let failed = false;
for (const [name, text] of TEXTS) {
  const reference = theirs(text);
  const times = engines.map(() => []);
  const capped = engines.map(() => false);
  const rust = [reference.ms];
  for (let round = 0; round < ROUNDS; round += 1) {
    engines.forEach(({ label, engine }, i) => {
      if (capped[i]) return;
      const t0 = performance.now();
      const out = engine.redact(text);
      const ms = performance.now() - t0;
      times[i].push(ms);
      if (ms > CAP_MS) capped[i] = true;
      if (out.text !== reference.text || out.count !== reference.count) {
        console.error(`${label} differs from turnstore redact on "${name}": ${out.count} vs ${reference.count} masks`);
        failed = true;
      }
    });
    if (round > 0) rust.push(theirs(text).ms);
  }
  const cells = times.map((t, i) => `${median(t).toFixed(1)}${capped[i] ? ` (${t.length} run)` : ""}`);
  console.log([name, reference.count, median(rust).toFixed(1), ...cells].join(" | "));
}
if (failed) process.exit(1);
