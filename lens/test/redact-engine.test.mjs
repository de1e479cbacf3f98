// redact.js runs a rule as a program in a Pike VM (linear in the text) where
// JavaScript's RegExp would backtrack (quadratic on long runs). The two must
// find the same matches: random patterns of the portable syntax, random
// texts, every match and `secret` group compared with RegExp's own search.
// (`turnstore redact` is the reference of the rules themselves: see
// redact-twin.test.mjs.)
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { matcher, redactor, toJsRegExp } from "../redact.js";
import { random } from "./support.mjs";

const ATOMS = ["a", "b", "c", "-", "\\.", "@", "[ab]", "[^a]", "[a-c]", "[A-Z]", "\\d", "\\w", "\\s", "\\S", ".", "é", "\\pL"];
const ASSERTIONS = ["\\b", "\\B", "^", "$"];
const QUANTIFIERS = ["*", "+", "?", "{2}", "{1,3}", "{2,}", "*?", "+?", "??", "{1,2}?"];
const ALPHABET = ["a", "b", "c", "A", "Z", "1", "-", ".", "@", " ", "\n", "é", "_", "😀"];

/**
 * A random pattern; `secret` marks one group (never inside a repetition:
 * RegExp forgets a group's capture at each new iteration, Rust does not,
 * and the VM does as Rust). A repeated group never matches the empty text
 * (RegExp refuses an empty iteration and backtracks into it, Rust takes it;
 * redact-twin.test.mjs shows the VM does as Rust).
 */
function pattern(next, depth = 0, secretLeft = { value: next() < 0.5 }, repeated = false) {
  const pick = (list) => list[Math.floor(next() * list.length)];
  const items = [];
  const length = 1 + Math.floor(next() * (depth ? 3 : 5));
  for (let i = 0; i < length; i += 1) {
    const roll = next();
    let item;
    if (roll < 0.1) item = pick(ASSERTIONS);
    else if (roll < 0.25 && depth < 2) {
      const secret = secretLeft.value && !repeated && next() < 0.5;
      if (secret) secretLeft.value = false;
      const quantify = !secret && next() < 0.5;
      const branches = [pattern(next, depth + 1, secretLeft, repeated || quantify)];
      if (next() < 0.4) branches.push(pattern(next, depth + 1, secretLeft, repeated || quantify));
      const body = branches.join("|");
      item = `(${secret ? "?<secret>" : "?:"}${body})`;
      if (quantify && !canBeEmpty(body)) item += pick(QUANTIFIERS);
    } else {
      item = pick(ATOMS);
      if (next() < 0.4) item += pick(QUANTIFIERS);
    }
    items.push(item);
  }
  const source = items.join("");
  return depth === 0 && next() < 0.2 ? `(?i)${source}` : source;
}

/** Whether `body` can match the empty text somewhere (its assertions as if they held). */
const canBeEmpty = (body) => toJsRegExp(`^(?:${body.replace(/\\[bB]|\^|\$/g, "")})$`).test("");

function text(next) {
  const length = Math.floor(next() * 24);
  return Array.from({ length }, () => ALPHABET[Math.floor(next() * ALPHABET.length)]).join("");
}

/**
 * Every non-empty match from the start, as [start, end, secret start,
 * secret end]. (An empty match masks nothing; RegExp even finds some in the
 * middle of a surrogate pair, `\B` between 😀's halves.)
 */
function allMatches(find, subject) {
  const out = [];
  for (let at = 0, m = find(subject, 0); m; m = find(subject, at)) {
    if (m.end > m.start) out.push([m.start, m.end, ...(m.secret ?? [])]);
    at = m.end > m.start ? m.end : m.end + (subject.codePointAt(m.end) > 0xffff ? 2 : 1);
    if (at > subject.length) break;
  }
  return out;
}

function regExpFind(pattern) {
  const re = toJsRegExp(pattern);
  return (subject, from) => {
    re.lastIndex = from;
    const m = re.exec(subject);
    if (!m) return null;
    return { start: m.index, end: m.index + m[0].length, secret: m.indices.groups?.secret ?? null };
  };
}

// RegExp's \b under `i` counts ſ and K (Kelvin) as word characters; the
// alphabet has neither, so RegExp's \b is ASCII's here, as the server's is.
describe("the Pike VM finds what RegExp finds", () => {
  test("random patterns and texts: every match, every secret group", () => {
    const seed = Number(process.env.ENGINE_SEED ?? 20261127);
    const next = random(seed);
    let compared = 0;
    let matched = 0;
    let withSecret = 0;
    for (let i = 0; i < 3000; i += 1) {
      const source = pattern(next);
      let find;
      try {
        find = matcher(source).find;
      } catch {
        continue; // not a pattern JavaScript reads (e.g. a quantified assertion)
      }
      const reference = regExpFind(source);
      for (let j = 0; j < 8; j += 1) {
        const subject = text(next);
        const ours = allMatches(find, subject);
        const theirs = allMatches(reference, subject);
        assert.deepEqual(ours, theirs, `seed ${seed}: /${source}/ on ${JSON.stringify(subject)}`);
        compared += 1;
        if (theirs.length) matched += 1;
        if (theirs.some((m) => m.length === 4)) withSecret += 1;
      }
    }
    assert.ok(compared > 15000, `only ${compared} comparisons`);
    assert.ok(matched > compared / 5, `only ${matched} of ${compared} found a match`);
    assert.ok(withSecret > compared / 100, `only ${withSecret} of ${compared} matched a secret group`);
  });

  test("the rules' own shapes: the quadratic runs of RegExp, the same matches", () => {
    const email = String.raw`[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}`;
    const url = String.raw`[A-Za-z][A-Za-z0-9+.-]*://[^\s/:@]*:(?<secret>[^\s/@]+)@`;
    for (const [source, subject] of [
      [email, `${"a".repeat(2000)}@example.com and x@y.zz`],
      [email, `${"b.".repeat(1000)}@c.de`],
      [url, `${"1a".repeat(1000)}://u:p@h https://me:pw@host/`],
    ]) {
      assert.deepEqual(allMatches(matcher(source).find, subject), allMatches(regExpFind(source), subject), source);
    }
  });

  test("a program too large to run in step falls back to RegExp, with the same result", () => {
    const huge = String.raw`(?:[a-z]{100}){120}`;
    const m = matcher(huge);
    assert.equal(m.linear, false);
    const subject = `${"x".repeat(12000)} y`;
    assert.deepEqual(allMatches(m.find, subject), [[0, 12000]]);
    assert.equal(matcher("[a-z]{100}").linear, true);
  });

  test("the redactor masks through the VM as it did through RegExp", () => {
    const engine = redactor([{ name: "email", pattern: String.raw`[a-z]+@[a-z]+\.[a-z]{2,}`, check: null }]);
    assert.deepEqual(engine.redact(`${"a".repeat(100000)}@x.io, b@c.de`), { text: "[redacted:email], [redacted:email]", count: 2 });
  });
});
