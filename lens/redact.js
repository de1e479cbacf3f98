// The lens' redaction engine: the server sends the rules (lens-config), this
// applies them. An ES module, imported by the page and by the Node tests.
//
// A rule is {name, pattern, check}: `pattern` is written for Rust's `regex`
// crate and JavaScript alike (no lookaround, no backreferences, named groups
// as (?<name>…), case-insensitivity only as a leading (?i)). Rules apply in
// order, each to the output of the previous one, in passes until one masks
// nothing; a match is replaced whole by `[redacted:<name>]`, or only its
// `secret` group when the pattern has one (an empty one is left alone).
// `check: "luhn"` / `"iban"` masks a match only when it passes that checksum.
// A span that is a mask already is left alone (redacting twice adds nothing).

// Rust's \d, \w, \s and `.` are Unicode's, JavaScript's (even with `u`) are
// ASCII's or slightly different sets: they are rewritten to mean what they
// mean in Rust. (`\b` is left alone: the server reads it as ASCII's, as
// JavaScript does.)
const WORD = "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}";
const SPACE = "\\t\\n\\v\\f\\r \\x85\\xA0\\u1680\\u2000-\\u200A\\u2028\\u2029\\u202F\\u205F\\u3000";
const OUTSIDE = {
  d: "\\p{Nd}",
  D: "\\P{Nd}",
  w: `[${WORD}]`,
  W: `[^${WORD}]`,
  s: `[${SPACE}]`,
  S: `[^${SPACE}]`,
  A: "^",
  z: "$",
};
const INSIDE = { d: "\\p{Nd}", D: "\\P{Nd}", w: WORD, s: SPACE };
const SPACES = new RegExp(`[${SPACE}]`, "gu");
const MASK = /^\[redacted:[A-Za-z0-9_-]+\]$/;

/** Translates a Rust `regex` pattern to JavaScript source and flags. */
export function toJsRegExp(pattern) {
  let flags = "dgu";
  let source = pattern;
  if (source.startsWith("(?i)")) {
    source = source.slice(4);
    flags += "i";
  }
  let out = "";
  let inClass = false;
  for (let i = 0; i < source.length; i += 1) {
    const c = source[i];
    if (c === "\\") {
      const n = source[i + 1] ?? "";
      i += 1;
      const table = inClass ? INSIDE : OUTSIDE;
      if (Object.hasOwn(table, n)) out += table[n];
      else if ((n === "p" || n === "P") && /[A-Za-z]/.test(source[i + 1] ?? "")) {
        out += `\\${n}{${source[i + 1]}}`; // \pL → \p{L}
        i += 1;
      } else if (n === "x" && source[i + 1] === "{") out += "\\u"; // \x{…} → \u{…}
      else out += c + n;
    } else if (inClass) {
      if (c === "]") inClass = false;
      out += c;
    } else if (c === "[") {
      inClass = true;
      out += c;
      if (source[i + 1] === "^") out += source[++i];
      if (source[i + 1] === "]") out += "\\" + source[++i]; // a leading ] is literal
    } else if (c === ".") out += "[^\\n]";
    else out += c;
  }
  return new RegExp(out, flags);
}

export function luhn(text) {
  const digits = [...text].filter((c) => c >= "0" && c <= "9").map(Number);
  if (digits.length < 13 || digits.length > 19) return false;
  let sum = 0;
  digits.reverse().forEach((d, i) => {
    const v = i % 2 === 1 ? d * 2 : d;
    sum += v > 9 ? v - 9 : v;
  });
  return sum % 10 === 0;
}

export function iban(text) {
  const s = text.replace(SPACES, "");
  if (s.length < 15 || s.length > 34 || !/^[0-9A-Za-z]+$/.test(s)) return false;
  let rest = 0;
  for (const c of s.slice(4) + s.slice(0, 4)) {
    const v = parseInt(c, 36); // 0–9, then A (or a) = 10 … Z = 35
    rest = (rest * (v > 9 ? 100 : 10) + v) % 97;
  }
  return rest === 1;
}

const CHECKS = { luhn, iban };

export function redactor(rules) {
  const compiled = rules.map((rule) => {
    const check = rule.check == null ? () => true : CHECKS[rule.check];
    if (!check) throw new Error(`rule ${rule.name}: unknown check ${rule.check}`);
    return { re: toJsRegExp(rule.pattern), check, mask: `[redacted:${rule.name}]` };
  });
  return {
    // Passes over the rules until one masks nothing: a mask can open a
    // match a rule did not see (a word boundary after it). Each mask takes
    // text that was not a mask, so the passes end.
    redact(text) {
      let count = 0;
      for (;;) {
        const pass = passOver(text);
        if (pass.count === 0) return { text, count };
        text = pass.text;
        count += pass.count;
      }
    },
  };

  // One pass: each rule in order, over what the ones before left.
  function passOver(text) {
    let count = 0;
    for (const { re, check, mask } of compiled) {
      let out = "";
      let last = 0;
      re.lastIndex = 0;
      for (let m = re.exec(text); m; m = re.exec(text)) {
        if (m[0] === "") {
          re.lastIndex += text.codePointAt(re.lastIndex) > 0xffff ? 2 : 1;
          continue;
        }
        if (!check(m[0])) continue; // the whole match is checked
        const span = (m.indices.groups && m.indices.groups.secret) || m.indices[0];
        if (span[0] === span[1] || MASK.test(text.slice(span[0], span[1]))) continue;
        out += text.slice(last, span[0]) + mask;
        last = span[1];
        count += 1;
      }
      text = out + text.slice(last);
    }
    return { text, count };
  }
}
