// redact.js and the server's redaction are twins: for the rules the server
// hands the page (built-in ones and TURNSTORE_REDACT_PATTERNS'), redact.js
// must give what `turnstore redact` gives, text and count, on every input.
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { redactor } from "../redact.js";
import { random, runRedact, startTurnstore } from "./support.mjs";

// Operator rules that use what the translation to JavaScript must get right:
// (?i), a secret group, \d and \w (Unicode in Rust), `.`, \s; and an
// optional group that can match empty, which Rust takes as it is where
// RegExp would refuse the empty iteration and take a digit more.
const OPERATOR_RULES = [
  "# operator rules",
  String.raw`ticket = (?i)ticket[ #:]*(?<secret>\d{4,})`,
  String.raw`codename = project\s+(?<secret>\w+)`,
  String.raw`note = SECRET\(.{3,12}\)`,
  String.raw`refno = ref-(?:\b[0-9]*?)?`,
].join("\n");

const pieces = {
  secret: [
    "sk-proj-Z9xQ4tLmW2rB7nV1cK8pJ3sD",
    "sk-abcdefghijklmnop1234",
    "pk-live_0123456789abcdefXYZ",
    "AKIAIOSFODNN7EXAMPLE",
    "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
    "xoxb-1234567890-abcdefghij",
    "AIzaSyA1234567890abcdefghijklmnopqrstuv",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "Bearer abc.def-ghi_jkl123",
    "bearer   0123456789abcdef",
    "redis://:hunter2@cache:6379/0",
    "postgres://app:s3cr3t@db/x",
    "https://user:p%40ss@host.example/path",
    "alice@example.com",
    "bob.smith+rag@mail.example.co.uk",
    "4111 1111 1111 1111",
    "4111-1111-1111-1111",
    "4111111111111111",
    "5500 0000 0000 0004",
    "378282246310005",
    "4111 1111 1111 1112",
    "1234 5678 9012 3456",
    "GB82 WEST 1234 5698 7654 32",
    "GB82WEST12345698765432",
    "DE89 3704 0044 0532 0130 00",
    "DE89 3704 0044 0532 0130 01",
    "FR14 2004 1010 0505 0001 3M02 606",
    "ticket #48213",
    "TICKET: 99123",
    "Ticket ٤٥٦٧٨",
    "project Zébulon",
    "project  naïve_42",
    "SECRET(abc def)",
    "SECRET(été 2024)",
    "SECRET(a\nb)",
    "ref-7",
    "ref-123x",
    "[redacted:email]",
    "[redacted:api_key]",
  ],
  prose: [
    "What is a vector index?",
    "It finds the nearest stored vectors.",
    "naïve café",
    "Größe 42",
    "数字 ١٢٣٤٥٦٧٨٩٠١٢٣",
    "call 555-0100",
    "order 20240101",
    "v1.2.3",
    "https://example.com/docs",
    "x@y",
    "sk-short",
    "emoji 🎉 here",
    "ＡＢＣ１２３",
    "<b>&amp;</b>",
  ],
  glue: [" ", "  ", "\n", ", ", "", ".", "\u00a0", "\u0085", "\ufeff", " — ", "\t", ":", "/", "_"],
};

function corpus(seed, n) {
  const next = random(seed);
  const pick = (list) => list[Math.floor(next() * list.length)];
  const texts = [...pieces.secret, ...pieces.prose];
  for (let i = 0; i < n; i += 1) {
    const parts = [];
    const length = 1 + Math.floor(next() * 8);
    for (let j = 0; j < length; j += 1) {
      parts.push(next() < 0.45 ? pick(pieces.secret) : pick(pieces.prose));
      parts.push(pick(pieces.glue));
    }
    texts.push(parts.join(""));
  }
  return texts;
}

async function inParallel(items, limit, work) {
  const results = new Array(items.length);
  let next = 0;
  await Promise.all(
    Array.from({ length: limit }, async () => {
      for (let i = next++; i < items.length; i = next++) results[i] = await work(items[i], i);
    }),
  );
  return results;
}

describe("redact.js and `turnstore redact` are twins", () => {
  let dir;
  let env;
  let rules;

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), "lens-twin-"));
    const file = join(dir, "rules.txt");
    writeFileSync(file, OPERATOR_RULES);
    env = { TURNSTORE_REDACT_PATTERNS: file };
    // The rules exactly as the server hands them to the page.
    const server = await startTurnstore({ TURNSTORE_LENS: "redacted", ...env });
    try {
      const html = await (await fetch(`${server.baseUrl}/lens/`)).text();
      const json = /<script type="application\/json" id="lens-config">([\s\S]*?)<\/script>/.exec(html)[1];
      const config = JSON.parse(json);
      assert.equal(config.mode, "redacted");
      rules = config.rules;
    } finally {
      await server.stop();
    }
  });

  after(() => rmSync(dir, { recursive: true, force: true }));

  test("the page receives the built-in rules, then the operator's", () => {
    const names = rules.map((r) => r.name);
    for (const name of ["api_key", "card", "iban"]) assert.ok(names.includes(name), names.join());
    assert.deepEqual(names.slice(-4), ["ticket", "codename", "note", "refno"]);
    assert.equal(rules.find((r) => r.name === "card").check, "luhn");
    assert.equal(rules.find((r) => r.name === "iban").check, "iban");
  });

  test("the same text and count on a corpus of secrets and prose", async () => {
    const engine = redactor(rules);
    const texts = corpus(Number(process.env.TWIN_SEED ?? 20261127), 300);
    const theirs = await inParallel(texts, 4, (text) => runRedact(text, env));
    const differences = [];
    texts.forEach((text, i) => {
      const ours = engine.redact(text);
      if (ours.text !== theirs[i].text || ours.count !== theirs[i].count) {
        differences.push({ input: text, js: ours, rust: theirs[i] });
      }
    });
    assert.deepEqual(differences.slice(0, 5), [], `${differences.length} of ${texts.length} differ`);
    // The corpus does exercise the rules.
    const masked = theirs.filter((r) => r.count > 0).length;
    assert.ok(masked > texts.length / 3, `only ${masked} texts had a mask`);
  });

  test("the worst texts the limits allow: the same masks, in time linear in the text", async () => {
    // Long runs of a rule's first characters, TURNSTORE_MAX_ANSWER_BYTES
    // long: RegExp retried the rule at every position of the run (one such
    // answer froze the page for 22 s); bench/redact times them.
    const size = 128 * 1024;
    const fill = (unit, tail = "") => unit.repeat(Math.floor((size - tail.length) / unit.length)) + tail;
    const texts = [
      fill("a"),
      fill("a", "@example.com"),
      fill("1a"),
      `x@${fill("b.")}`,
      fill("eyJ-"),
      fill("ref-"),
      fill("bearer "),
      fill("4111 "),
    ];
    const engine = redactor(rules);
    const theirs = await inParallel(texts, 2, (text) => runRedact(text, env));
    texts.forEach((text, i) => {
      const ours = engine.redact(text);
      assert.ok(ours.text === theirs[i].text && ours.count === theirs[i].count, `text ${i}: ${ours.count} vs ${theirs[i].count} masks`);
    });
    assert.deepEqual(engine.redact(texts[1]), { text: "[redacted:email]", count: 1 });
  });

  test("their own output again: nothing more is masked, by either", async () => {
    const engine = redactor(rules);
    const once = corpus(7, 100).map((text) => engine.redact(text).text);
    const theirs = await inParallel(once, 4, (text) => runRedact(text, env));
    once.forEach((text, i) => {
      assert.deepEqual(engine.redact(text), { text, count: 0 }, text);
      assert.deepEqual(theirs[i], { text, count: 0 }, text);
    });
  });
});
