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
//
// Matching takes time linear in the text, as Rust's does: JavaScript's
// RegExp backtracks, and retries a rule at every position of a long run of
// the characters it starts with (one 128 KiB word took 22 s under the e-mail
// rule). So a pattern is translated to JavaScript's syntax (which checks it),
// parsed, and compiled to a program that a Pike VM runs: every thread in
// step over the text, one per instruction at most, in priority order, which
// gives the leftmost-first match and groups backtracking gives. RegExp still
// decides what one character matches (a class, an escape, a literal under
// (?i)), so characters mean what they meant.

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

/** A Rust `regex` pattern as a JavaScript RegExp (which checks its syntax). */
export function toJsRegExp(pattern) {
  const { source, flags } = translate(pattern);
  return new RegExp(source, flags);
}

/** A Rust `regex` pattern translated to JavaScript source and flags. */
function translate(pattern) {
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
  return { source: out, flags };
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

// ---- the program: parsed from the JavaScript source, run by a Pike VM ----

const CHAR = 0; // a[pc]: the character test
const SPLIT = 1; // a[pc] first, then b[pc]
const JMP = 2; // to a[pc]
const SAVE = 3; // slot a[pc] (1, 2: the `secret` group's bounds) = here
const ASSERT = 4; // a[pc]: one of ASSERTS
const MATCH = 5;
const ASSERTS = ["^", "$", "b", "B"];
/** Instructions a program may have: beyond, a rule runs on RegExp itself. */
const MAX_PROGRAM = 10000;
/** Non-ASCII characters a test remembers. */
const MAX_REMEMBERED = 4096;

/** The syntax tree of a JavaScript (`u` flag) source, checked by RegExp already. */
function parse(source) {
  let i = 0;
  const alternation = () => {
    const items = [sequence()];
    while (source[i] === "|") {
      i += 1;
      items.push(sequence());
    }
    return items.length === 1 ? items[0] : { t: "alt", items };
  };
  const sequence = () => {
    const items = [];
    while (i < source.length && source[i] !== "|" && source[i] !== ")") items.push(quantified());
    return { t: "cat", items };
  };
  const quantified = () => {
    const body = atom();
    let min;
    let max;
    const c = source[i];
    if (c === "*") [min, max] = [0, Infinity];
    else if (c === "+") [min, max] = [1, Infinity];
    else if (c === "?") [min, max] = [0, 1];
    else if (c === "{") {
      const m = /^\{(\d+)(,(\d*))?\}/.exec(source.slice(i));
      [min, max] = [Number(m[1]), m[2] ? (m[3] ? Number(m[3]) : Infinity) : Number(m[1])];
      i += m[0].length - 1;
    } else return body;
    i += 1;
    const greedy = source[i] !== "?";
    if (!greedy) i += 1;
    return { t: "rep", min, max, greedy, body };
  };
  const atom = () => {
    const c = source[i];
    if (c === "(") {
      let secret = false;
      if (source.startsWith("(?:", i)) i += 3;
      else if (source.startsWith("(?<", i)) {
        const end = source.indexOf(">", i);
        secret = source.slice(i + 3, end) === "secret";
        i = end + 1;
      } else i += 1;
      const body = alternation();
      i += 1; // )
      return { t: "group", secret, body };
    }
    if (c === "^" || c === "$") {
      i += 1;
      return { t: "assert", kind: c };
    }
    let length;
    if (c === "[") {
      length = 1;
      while (source[i + length] !== "]") length += source[i + length] === "\\" ? 2 : 1;
      length += 1;
    } else if (c === "\\") {
      const n = source[i + 1];
      if (n === "b" || n === "B") {
        i += 2;
        return { t: "assert", kind: n };
      }
      if (source[i + 2] === "{" && (n === "p" || n === "P" || n === "u")) length = source.indexOf("}", i) - i + 1;
      else if (n === "u") length = /^\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F]/.test(source.slice(i, i + 10)) ? 12 : 6;
      else if (n === "x") length = 4;
      else if (n === "c") length = 3;
      else length = 2;
    } else length = source.codePointAt(i) > 0xffff ? 2 : 1;
    const src = source.slice(i, i + length);
    i += length;
    return { t: "char", src };
  };
  return alternation();
}

/** The program of `tree`: instructions in op/a/b, character tests by source. */
function compile(tree, ignoreCase) {
  const op = [];
  const a = [];
  const b = [];
  const tests = [];
  const sources = [];
  const testOf = new Map();
  const emit = (o, x = 0, y = 0) => {
    if (op.length >= MAX_PROGRAM) throw new RangeError("program too large");
    op.push(o);
    a.push(x);
    b.push(y);
    return op.length - 1;
  };
  const node = (n) => {
    switch (n.t) {
      case "char": {
        if (!testOf.has(n.src)) {
          testOf.set(n.src, tests.length);
          tests.push(characterTest(n.src, ignoreCase));
          sources.push(n.src);
        }
        emit(CHAR, testOf.get(n.src));
        break;
      }
      case "assert":
        emit(ASSERT, ASSERTS.indexOf(n.kind));
        break;
      case "cat":
        n.items.forEach(node);
        break;
      case "alt": {
        const jumps = [];
        n.items.forEach((item, k) => {
          if (k === n.items.length - 1) return node(item);
          const split = emit(SPLIT, op.length + 1);
          node(item);
          jumps.push(emit(JMP));
          b[split] = op.length;
        });
        for (const j of jumps) a[j] = op.length;
        break;
      }
      case "group":
        if (n.secret) emit(SAVE, 1);
        node(n.body);
        if (n.secret) emit(SAVE, 2);
        break;
      case "rep": {
        for (let k = 0; k < n.min; k += 1) node(n.body);
        // Each optional copy: SPLIT(into it, past them all), greedy first.
        const choose = (split, into, past) => {
          [a[split], b[split]] = n.greedy ? [into, past] : [past, into];
        };
        if (n.max === Infinity) {
          const loop = emit(SPLIT);
          node(n.body);
          emit(JMP, loop);
          choose(loop, loop + 1, op.length);
        } else {
          const splits = [];
          for (let k = n.min; k < n.max; k += 1) {
            splits.push(emit(SPLIT));
            node(n.body);
          }
          for (const s of splits) choose(s, s + 1, op.length);
        }
        break;
      }
    }
  };
  node(tree);
  emit(MATCH);
  return { op: Int8Array.from(op), a: Int32Array.from(a), b: Int32Array.from(b), tests, sources };
}

/** What one character (a code point) matches: RegExp decides, once per ASCII one. */
function characterTest(src, ignoreCase) {
  const re = new RegExp(`^(?:${src})$`, ignoreCase ? "ui" : "u");
  const ascii = new Uint8Array(128);
  for (let c = 0; c < 128; c += 1) ascii[c] = re.test(String.fromCharCode(c)) ? 1 : 0;
  const remembered = new Map();
  return {
    ascii,
    other(cp) {
      let yes = remembered.get(cp);
      if (yes === undefined) {
        yes = re.test(String.fromCodePoint(cp));
        if (remembered.size < MAX_REMEMBERED) remembered.set(cp, yes);
      }
      return yes;
    },
  };
}

/** JavaScript's `\b` (with `u`, without `i`), and the server's: ASCII's word characters. */
function isWordAt(text, i) {
  if (i < 0 || i >= text.length) return false;
  const c = text.charCodeAt(i);
  return (c >= 48 && c <= 57) || (c >= 65 && c <= 90) || (c >= 97 && c <= 122) || c === 95;
}

function holds(kind, text, pos) {
  switch (kind) {
    case 0:
      return pos === 0;
    case 1:
      return pos === text.length;
    case 2:
      return isWordAt(text, pos - 1) !== isWordAt(text, pos);
    default:
      return isWordAt(text, pos - 1) === isWordAt(text, pos);
  }
}

/**
 * A rule's matcher: `find(text, from)` gives the leftmost-first match at or
 * after `from` as {start, end, secret: [start, end] | null}, or null.
 */
export function matcher(pattern) {
  const re = toJsRegExp(pattern);
  const ignoreCase = re.flags.includes("i");
  const tree = parse(translate(pattern).source);
  let program;
  try {
    program = compile(tree, ignoreCase);
  } catch (error) {
    if (!(error instanceof RangeError)) throw error;
    return backtracking(re); // too large to run in step: as JavaScript does
  }
  const vm = pikeVm(program, ignoreCase);
  // Characters every match holds: where the rest of a text lacks one of
  // them, RegExp's quick scan says so, and the program need not run.
  const needed = [...new Set(required(tree))].map((src) => new RegExp(src, ignoreCase ? "gui" : "gu"));
  return {
    linear: true,
    find(text, from) {
      for (const re of needed) {
        re.lastIndex = from;
        if (!re.test(text)) return null;
      }
      return vm.find(text, from);
    },
  };
}

/** The sources of characters that every match of `node` holds. */
function required(node) {
  switch (node.t) {
    case "char":
      return [node.src];
    case "cat":
      return node.items.flatMap(required);
    case "group":
      return required(node.body);
    case "rep":
      return node.min > 0 ? required(node.body) : [];
    default:
      return []; // an assertion; an alternation (each branch may hold others)
  }
}

/** RegExp's own search, for a program too large to run in step. */
function backtracking(re) {
  return {
    linear: false,
    find(text, from) {
      re.lastIndex = from;
      const m = re.exec(text);
      if (!m) return null;
      const secret = m.indices.groups && m.indices.groups.secret;
      return { start: m.index, end: m.index + m[0].length, secret: secret || null };
    },
  };
}

/** The program, run in step over the text: a matcher's `find`. */
function pikeVm({ op, a, b, tests, sources }, ignoreCase) {
  const n = op.length;
  // The instructions a list (one position's threads) holds: seen[pc] is the
  // list's generation.
  const seen = new Int32Array(n);
  let generation = 0;
  const fresh = () => {
    if (generation === 0x3fffffff) {
      seen.fill(0);
      generation = 0;
    }
    generation += 1;
  };
  // What each test says of each ASCII character, test by test: the fast path.
  const ascii = new Uint8Array(tests.length * 128);
  tests.forEach((test, t) => ascii.set(test.ascii, t * 128));
  // The characters a match can begin with; null when it can be empty.
  const skip = firstCharacters(op, a, b);
  const skipper = skip && new RegExp(`(?:${skip.map((t) => sources[t]).join("|")})`, ignoreCase ? "gui" : "gu");
  // Thread lists: an instruction and its groups, as the start (a number) or,
  // once the `secret` group is entered, [start, secret start, secret end].
  let here = { pcs: new Int32Array(n), caps: new Array(n), length: 0 };
  let next = { pcs: new Int32Array(n), caps: new Array(n), length: 0 };
  const stackPcs = new Int32Array(2 * n + 2);
  const stackCaps = new Array(2 * n + 2);
  const closure = plainClosures(op, a, b);

  /** Adds the thread (pc, caps) to `list`, following every jump and split in order. */
  function add(list, pc0, caps0, text, pos) {
    let depth = 0;
    stackPcs[0] = pc0;
    stackCaps[0] = caps0;
    depth = 1;
    while (depth > 0) {
      depth -= 1;
      const pc = stackPcs[depth];
      const caps = stackCaps[depth];
      if (seen[pc] === generation) continue;
      seen[pc] = generation;
      switch (op[pc]) {
        case CHAR:
        case MATCH:
          list.pcs[list.length] = pc;
          list.caps[list.length] = caps;
          list.length += 1;
          break;
        case JMP:
          stackPcs[depth] = a[pc];
          stackCaps[depth] = caps;
          depth += 1;
          break;
        case SPLIT:
          stackPcs[depth] = b[pc];
          stackCaps[depth] = caps;
          stackPcs[depth + 1] = a[pc];
          stackCaps[depth + 1] = caps;
          depth += 2;
          break;
        case SAVE: {
          const saved = typeof caps === "number" ? [caps, -1, -1] : caps.slice();
          saved[a[pc]] = pos;
          stackPcs[depth] = pc + 1;
          stackCaps[depth] = saved;
          depth += 1;
          break;
        }
        default:
          if (holds(a[pc], text, pos)) {
            stackPcs[depth] = pc + 1;
            stackCaps[depth] = caps;
            depth += 1;
          }
      }
    }
  }

  /** `add`, through the closure of `pc` when it has no SAVE or assertion. */
  function step(list, pc, caps, text, pos) {
    const targets = closure(pc);
    if (targets === null) return add(list, pc, caps, text, pos);
    for (let j = 0; j < targets.length; j += 1) {
      const to = targets[j];
      if (seen[to] === generation) continue;
      seen[to] = generation;
      list.pcs[list.length] = to;
      list.caps[list.length] = caps;
      list.length += 1;
    }
  }

  return {
    find(text, from) {
      let found = null;
      let pos = from;
      here.length = 0;
      for (;;) {
        if (found === null) {
          if (here.length === 0) {
            fresh(); // a fresh list, maybe at another position
            if (skipper) {
              skipper.lastIndex = pos;
              const m = skipper.exec(text);
              if (!m) return null;
              pos = m.index;
            }
          }
          step(here, 0, pos, text, pos); // the lowest priority: a later start
        }
        const cp = pos < text.length ? text.codePointAt(pos) : -1;
        if (here.length === 0) {
          if (found !== null || cp < 0) break;
          pos += cp > 0xffff ? 2 : 1; // no start here (an assertion failed)
          continue;
        }
        const after = pos + (cp > 0xffff ? 2 : 1);
        fresh();
        next.length = 0;
        const { pcs, caps } = here;
        for (let k = 0; k < here.length; k += 1) {
          const pc = pcs[k];
          if (op[pc] === MATCH) {
            const c = caps[k];
            found =
              typeof c === "number"
                ? { start: c, end: pos, secret: null }
                : { start: c[0], end: pos, secret: c[1] >= 0 && c[2] >= 0 ? [c[1], c[2]] : null };
            break; // the threads after it have a lower priority
          }
          if (cp < 0 || !(cp < 128 ? ascii[a[pc] * 128 + cp] === 1 : tests[a[pc]].other(cp))) continue;
          step(next, pc + 1, caps[k], text, after);
        }
        const done = here;
        here = next;
        next = done;
        if (pos >= text.length) break;
        pos = after;
      }
      return found;
    },
  };
}

/**
 * `closure(pc)`: the CHAR and MATCH instructions the jumps and splits from
 * `pc` lead to, in priority order, worked out on first use; null where a
 * SAVE or an assertion is on the way (the thread must go through `add`).
 */
function plainClosures(op, a, b) {
  const known = new Array(op.length).fill(undefined);
  const visited = new Int32Array(op.length);
  let stamp = 0;
  return (start) => {
    if (known[start] !== undefined) return known[start];
    stamp += 1;
    const out = [];
    const stack = [start];
    let plain = true;
    while (stack.length && plain) {
      const pc = stack.pop();
      if (visited[pc] === stamp) continue;
      visited[pc] = stamp;
      if (op[pc] === CHAR || op[pc] === MATCH) out.push(pc);
      else if (op[pc] === JMP) stack.push(a[pc]);
      else if (op[pc] === SPLIT) stack.push(b[pc], a[pc]);
      else plain = false;
    }
    known[start] = plain ? Int32Array.from(out) : null;
    return known[start];
  };
}

/** The tests a match's first character passes, or null when a match can be empty. */
function firstCharacters(op, a, b) {
  const found = new Set();
  const visited = new Uint8Array(op.length);
  const stack = [0];
  while (stack.length) {
    const pc = stack.pop();
    if (visited[pc]) continue;
    visited[pc] = 1;
    switch (op[pc]) {
      case MATCH:
        return null;
      case CHAR:
        found.add(a[pc]);
        break;
      case JMP:
        stack.push(a[pc]);
        break;
      case SPLIT:
        stack.push(a[pc], b[pc]);
        break;
      default:
        stack.push(pc + 1); // SAVE, ASSERT: a start is still one of these
    }
  }
  return found.size ? [...found] : null;
}

export function redactor(rules) {
  const compiled = rules.map((rule) => {
    const check = rule.check == null ? () => true : CHECKS[rule.check];
    if (!check) throw new Error(`rule ${rule.name}: unknown check ${rule.check}`);
    return { matcher: matcher(rule.pattern), check, mask: `[redacted:${rule.name}]` };
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
    for (const { matcher, check, mask } of compiled) {
      let out = "";
      let last = 0;
      for (let at = 0, m = matcher.find(text, 0); m; m = matcher.find(text, at)) {
        if (m.end === m.start) {
          // An empty match masks nothing; the search goes on after it.
          at = m.end + (text.codePointAt(m.end) > 0xffff ? 2 : 1);
          if (at > text.length) break;
          continue;
        }
        at = m.end;
        if (!check(text.slice(m.start, m.end))) continue; // the whole match is checked
        const [from, to] = m.secret || [m.start, m.end];
        if (from === to || MASK.test(text.slice(from, to))) continue;
        out += text.slice(last, from) + mask;
        last = to;
        count += 1;
      }
      text = out + text.slice(last);
    }
    return { text, count };
  }
}
