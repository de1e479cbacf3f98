// The lens: a read-only inspector of turnstore's sessions, served by turnstore
// itself (see docs/API.md). Only GET requests to the public API; every text
// shown from it goes through the redactor unless the server says mode=full,
// and always into the DOM as textContent.
import { redactor } from "./redact.js";

const $ = (id) => document.getElementById(id);
const KEY = "turnstore-lens-key";
const PAGE = 50; // sessions and turns per page
const ALL_TOKENS = 10000000; // the largest max_tokens: a read bounded by limit only
const PARALLEL = 6; // per-turn token reads in flight

const config = readConfig();
// The API is beside the lens: /lens/ → /, /prefix/lens/ → /prefix/.
const base = location.pathname.replace(/lens(\/[^/]*)?$/, "");
const engine = config && config.mode !== "full" ? redactor(config.rules) : null;

function readConfig() {
  try {
    const value = JSON.parse($("lens-config").textContent);
    return typeof value === "object" && value && Array.isArray(value.rules) ? value : null;
  } catch {
    return null;
  }
}

// ---- masks on the screen: each part of the page counts its own ----------

const masks = new Map();

/** A part of the page: `text()` redacts what it shows, and counts it. */
function part(name) {
  masks.set(name, 0);
  showMasks();
  return {
    text(value) {
      const text = value == null ? "" : String(value);
      if (!engine) return text;
      const { text: out, count } = engine.redact(text);
      if (count) {
        masks.set(name, masks.get(name) + count);
        showMasks();
      }
      return out;
    },
  };
}

/** `text` as nodes, its masks in <mark> elements (still only textContent). */
function marked(text) {
  if (!engine) return [text];
  return text.split(/(\[redacted:[A-Za-z0-9_-]+\])/).map((piece, i) =>
    i % 2 ? el("mark", { class: "mask", text: piece }) : piece,
  );
}

function showMasks() {
  const badge = $("masked");
  if (!engine) {
    badge.textContent = "nothing masked (full mode)";
    return;
  }
  let total = 0;
  for (const n of masks.values()) total += n;
  badge.textContent = `${total} masked`;
  badge.dataset.count = String(total);
  badge.classList.toggle("hot", total > 0);
}

// ---- DOM helpers (text only, never innerHTML) ---------------------------

function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(props)) {
    if (value == null || value === false) continue;
    if (name === "text") node.textContent = value;
    else if (name === "class") node.className = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (name.startsWith("data-")) node.dataset[name.slice(5)] = value;
    else node[name] = value;
  }
  node.append(...children.filter((c) => c != null));
  return node;
}

function fields(dl, rows) {
  dl.replaceChildren();
  for (const [name, value, field] of rows) {
    dl.append(el("div", {}, el("dt", { text: name }), el("dd", { text: value, "data-field": field ?? name })));
  }
}

const time = (t) => (t ? t.replace("T", " ").replace(/\.\d+Z$/, "Z") : "—");
const show = (v) => (v == null ? "—" : String(v));

// ---- the API ------------------------------------------------------------

class ApiError extends Error {
  constructor(status, problem) {
    super(problem?.detail ?? `HTTP ${status}`);
    this.status = status;
    this.code = problem?.code ?? String(status);
  }
}
class Locked extends Error {}

const seg = (id) => encodeURIComponent(id);

function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== "") q.set(k, String(v));
  const s = q.toString();
  return s ? `?${s}` : "";
}

async function api(path, params = {}) {
  const headers = { Accept: "application/json" };
  const key = sessionStorage.getItem(KEY);
  if (key) headers.Authorization = `Bearer ${key}`;
  const response = await fetch(base + path + query(params), { headers, cache: "no-store" });
  if (response.status === 401) {
    lock(key ? "The key was refused." : "");
    throw new Locked();
  }
  const body = await response.json().catch(() => null);
  if (!response.ok) throw new ApiError(response.status, body);
  return body;
}

let errorPart = part("error");
function fail(error) {
  if (error instanceof Locked) return;
  errorPart = part("error");
  const box = $("error");
  box.textContent =
    error instanceof ApiError ? `${error.code}: ${errorPart.text(error.message)}` : String(error.message ?? error);
  box.hidden = false;
}
function clearError() {
  $("error").hidden = true;
  errorPart = part("error");
}

// ---- key ----------------------------------------------------------------

function lock(message) {
  sessionStorage.removeItem(KEY);
  $("app").hidden = true;
  $("forget-key").hidden = true;
  const box = $("error");
  box.textContent = message;
  box.hidden = !message;
  $("key-form").hidden = false;
  $("key").focus();
}

$("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem(KEY, $("key").value);
  $("key").value = "";
  $("key-form").hidden = true;
  start();
});

$("forget-key").addEventListener("click", () => {
  sessionStorage.removeItem(KEY);
  location.reload();
});

async function start() {
  clearError();
  try {
    await api("healthz");
    // Whether a key is needed: an API route answers 401 without a good one.
    await api("v1/users/lens/sessions", { limit: 1 });
  } catch (error) {
    fail(error);
    return;
  }
  $("forget-key").hidden = !sessionStorage.getItem(KEY);
  $("app").hidden = false;
}

// ---- sessions of a user -------------------------------------------------

const list = { user: "", cursors: [undefined], page: 0, current: null };

$("user-form").addEventListener("submit", (event) => {
  event.preventDefault();
  list.user = $("user").value.trim();
  list.cursors = [undefined];
  list.page = 0;
  loadSessions();
});
$("sessions-newer").addEventListener("click", () => {
  list.page -= 1;
  loadSessions();
});
$("sessions-older").addEventListener("click", () => {
  list.page += 1;
  loadSessions();
});
$("open-form").addEventListener("submit", (event) => {
  event.preventDefault();
  openSession($("open-id").value.trim());
});

async function loadSessions() {
  clearError();
  $("sessions-status").textContent = "Loading…";
  let page;
  try {
    page = await api(`v1/users/${seg(list.user)}/sessions`, { limit: PAGE, cursor: list.cursors[list.page] });
  } catch (error) {
    $("sessions-status").textContent = "";
    fail(error);
    return;
  }
  list.cursors[list.page + 1] = page.next_cursor ?? undefined;
  const p = part("sessions");
  $("session-list").replaceChildren(
    ...page.sessions.map((s) =>
      el(
        "li",
        { "data-id": s.session_id, class: s.session_id === list.current ? "active" : null },
        el(
          "button",
          { type: "button", onclick: () => openSession(s.session_id) },
          el("span", { class: "sid", text: p.text(s.session_id) }),
          el("span", { class: "meta", text: `${time(s.last_active_at)} · ${s.turn_count} turns` }),
        ),
      ),
    ),
  );
  $("sessions-status").textContent =
    page.sessions.length || page.next_cursor ? `Sessions of ${p.text(list.user)}` : `No sessions for ${p.text(list.user)}`;
  $("sessions-page").textContent = `page ${list.page + 1}`;
  $("sessions-newer").disabled = list.page === 0;
  $("sessions-older").disabled = !page.next_cursor;
}

// ---- one session --------------------------------------------------------

const view = { id: null, summary: null, stack: [], page: null, marks: null, run: 0 };

async function openSession(id) {
  clearError();
  list.current = id;
  for (const li of $("session-list").children) li.classList.toggle("active", li.dataset.id === id);
  Object.assign(view, { id, summary: null, stack: [], page: null, marks: null });
  view.run += 1; // what was loading for the previous session is dropped
  $("turns").replaceChildren();
  $("turns-status").textContent = "Loading…";
  $("preview").hidden = true;
  part("preview");
  const path = `v1/sessions/${seg(id)}`;
  let info;
  try {
    [info, view.summary] = await Promise.all([
      api(path),
      api(`${path}/summary`).catch((e) => (e.code === "summary_not_found" ? null : Promise.reject(e))),
    ]);
  } catch (error) {
    $("session-view").hidden = true;
    $("placeholder").hidden = false;
    fail(error);
    return;
  }
  $("placeholder").hidden = true;
  $("session-view").hidden = false;
  const p = part("info");
  $("session-title").textContent = p.text(info.session_id);
  fields($("session-info"), [
    ["user", p.text(info.user_id ?? "—"), "user_id"],
    ["created", time(info.created_at), "created_at"],
    ["last active", time(info.last_active_at), "last_active_at"],
    ["expires", time(info.expires_at), "expires_at"],
    ["turns", show(info.turn_count), "turn_count"],
    ["pending", show(info.pending_count), "pending_count"],
    ["generation", p.text(info.generation), "generation"],
  ]);
  const s = part("summary");
  const sum = view.summary;
  $("summary").replaceChildren(
    sum
      ? el(
          "div",
          {},
          el("p", {
            class: "muted",
            text: `covers seq ≤ ${sum.through_seq} · ${sum.token_count} tokens · updated ${time(sum.updated_at)}`,
            "data-through": String(sum.through_seq),
          }),
          el("pre", { class: "summary" }, ...marked(s.text(sum.summary))),
        )
      : el("p", { class: "muted", text: "No summary." }),
  );
  await loadTurns();
}

$("turns-older").addEventListener("click", () => {
  view.stack.push(view.page.through);
  loadTurns(Math.min(...view.page.turns.map((t) => t.seq)) - 1);
});
$("turns-newer").addEventListener("click", () => loadTurns(view.stack.pop(), true));

/** Shows the (at most) 50 turns up to `through` (the newest when undefined). */
async function loadTurns(through, back = false) {
  const run = ++view.run;
  $("turns-status").textContent = "Loading…";
  let history;
  try {
    history = await api(`v1/sessions/${seg(view.id)}/history`, {
      format: "turns",
      limit: PAGE,
      max_tokens: ALL_TOKENS,
      through_seq: through,
    });
  } catch (error) {
    if (!back && through !== undefined) view.stack.pop();
    fail(error);
    return;
  }
  if (run !== view.run) return;
  const turns = history.turns;
  view.page = { through, turns, older: history.stopped_by !== null && turns.length > 0 };
  const p = part("turns");
  $("turns").replaceChildren(...turns.map((t) => turnItem(t, p)));
  const range = turns.length ? `seq ${turns[0].seq}–${turns[turns.length - 1].seq}` : "no turns";
  $("turns-status").textContent = `${range} · ${history.total_turns} in range · ${history.pending_turns} pending`;
  $("turns-older").disabled = !view.page.older;
  $("turns-newer").disabled = view.stack.length === 0;
  markTurns();
  loadTokens(run);
}

function turnItem(t, p) {
  const toggle = () => item.classList.toggle("open");
  const text = (cls, label, value) =>
    value == null
      ? null
      : el("div", { class: `text ${cls}`, onclick: toggle }, el("b", { text: label }), el("span", {}, ...marked(p.text(value))));
  const item = el(
    "li",
    { class: "turn", "data-seq": String(t.seq) },
    el(
      "div",
      { class: "turn-head" },
      el("button", { type: "button", class: "toggle", title: "Expand", onclick: toggle, text: "▸" }),
      el("span", { class: "seq", text: `#${t.seq}` }),
      el("span", { class: "meta", text: `${time(t.started_at)} → ${time(t.finalized_at)}` }),
      el("span", { class: "tokens", text: "… tokens" }),
      t.truncated ? el("span", { class: "tag", text: "truncated" }) : null,
      el("span", { class: "spacer" }),
      el("span", { class: "mark" }),
    ),
    text("q", "Q", t.user_query),
    text("a", "A", t.final_answer),
    text("q en", "Q·en", t.user_query_en),
    text("a en", "A·en", t.final_answer_en),
  );
  return item;
}

/** Per-turn tokens of the page shown: what the turn adds to a messages history. */
async function loadTokens(run) {
  const options = renderingOptions();
  const queue = [...$("turns").children];
  const worker = async () => {
    for (let li = queue.shift(); li && run === view.run; li = queue.shift()) {
      const seq = Number(li.dataset.seq);
      const cell = li.querySelector(".tokens");
      try {
        const h = await api(`v1/sessions/${seg(view.id)}/history`, {
          ...options,
          format: "messages",
          after_seq: seq - 1,
          through_seq: seq,
          limit: 1,
          max_tokens: ALL_TOKENS,
        });
        cell.textContent = `${h.token_count} tokens`;
        cell.dataset.tokens = String(h.token_count);
      } catch (error) {
        cell.textContent = "? tokens";
        if (!(error instanceof ApiError)) return fail(error);
        cell.title = error.code;
      }
    }
  };
  await Promise.all(Array.from({ length: PARALLEL }, worker));
}

// ---- prompt preview ------------------------------------------------------

const form = $("preview-form");

function formValues() {
  const data = new FormData(form);
  const v = (name) => String(data.get(name) ?? "").trim();
  const format = v("format");
  const window = v("window");
  return {
    format,
    template: v("template"),
    encoding: v("encoding"),
    model: v("model"),
    limit: v("limit"),
    max_tokens: v("max_tokens"),
    max_query_chars: v("max_query_chars"),
    max_answer_chars: v("max_answer_chars"),
    lang: v("lang"),
    summary: data.get("summary") ? "true" : undefined,
    keep_first: data.get("keep_first") ? "true" : undefined,
    window: window === "stable" ? "stable" : undefined,
    stride: window === "stable" ? v("stride") : undefined,
    cache_control: format === "anthropic" && data.get("cache_control") ? "true" : undefined,
  };
}

/** The options that change how a turn renders and counts. */
function renderingOptions() {
  const o = formValues();
  return {
    encoding: o.encoding,
    model: o.model,
    lang: o.lang,
    max_query_chars: o.max_query_chars,
    max_answer_chars: o.max_answer_chars,
  };
}

form.addEventListener("submit", async (event) => {
  event.preventDefault();
  clearError();
  const options = formValues();
  const path = `v1/sessions/${seg(view.id)}/history`;
  let history;
  let picked;
  try {
    history = await api(path, options);
    // Which seqs: a format=turns read of the same candidates. The kept run
    // is the newest `included_turns` of them (after the keep_first turn);
    // the stable window's left-outs are just older than the run.
    const leftOut = history.window?.left_out ?? 0;
    const want = history.included_turns + leftOut;
    picked = await api(path, {
      format: "turns",
      limit: want,
      max_tokens: ALL_TOKENS,
      summary: options.summary,
      keep_first: options.keep_first,
      lang: options.lang,
      max_query_chars: options.max_query_chars,
      max_answer_chars: options.max_answer_chars,
    });
  } catch (error) {
    fail(error);
    return;
  }
  const turns = pickTurns(picked, history, Boolean(options.keep_first));
  view.marks = {
    included: new Set(turns.included.map((t) => t.seq)),
    window: new Set(turns.window.map((t) => t.seq)),
    truncated: new Set(picked.turns.filter((t) => t.truncated).map((t) => t.seq)),
    summaryThrough: options.summary ? (picked.summary?.through_seq ?? 0) : 0,
    stoppedBy: history.stopped_by,
  };
  showPreview(options, history);
  markTurns();
  loadTokens(view.run);
});

function pickTurns(picked, history, keepFirst) {
  let rest = picked.turns;
  const included = [];
  let n = history.included_turns;
  if (n > 0 && keepFirst && rest.length) {
    included.push(rest[0]);
    rest = rest.slice(1);
    n -= 1;
  }
  const end = rest.length;
  included.push(...rest.slice(end - n));
  const left = history.window?.left_out ?? 0;
  return { included, window: rest.slice(Math.max(0, end - n - left), end - n) };
}

function showPreview(options, h) {
  const p = part("preview");
  const u = h.unsummarized;
  fields($("preview-stats"), [
    ["format", h.format],
    ["encoding", h.encoding],
    ["token_count", show(h.token_count)],
    ["turns", `${h.included_turns} of ${h.total_turns} (${h.omitted_turns} omitted)`, "included_turns"],
    ["pending", show(h.pending_turns), "pending_turns"],
    ["stopped_by", show(h.stopped_by)],
    ["unsummarized", u ? `seq ${u.after_seq + 1}–${u.through_seq} · ${u.turns} turns · ${show(u.tokens)} tokens` : "—"],
    ...(h.window ? [["window", `from seq ${h.window.from_seq} · stride ${h.window.stride} · ${h.window.left_out} left out`]] : []),
    ...(h.breakpoint !== undefined
      ? [["breakpoint", h.breakpoint ? Object.entries(h.breakpoint).map(([k, v]) => `${k} ${v}`).join(" · ") : "—"]]
      : []),
  ]);
  const url = new URL(base + `v1/sessions/${seg(view.id)}/history` + query(options), location.origin);
  const auth = sessionStorage.getItem(KEY) ? ` -H "Authorization: Bearer $TURNSTORE_API_KEY"` : "";
  $("curl").textContent = p.text(`curl -sS${auth} '${url.href.replaceAll("'", "'\\''")}'`);
  const out = $("preview-output");
  if (h.rendered !== undefined) out.replaceChildren(el("pre", {}, ...marked(p.text(h.rendered))));
  else if (h.messages) out.replaceChildren(messageList(h.messages, p));
  else if (h.anthropic) {
    const system = (h.anthropic.system ?? []).map((b) => ({ role: "system", content: b.text, cache: b.cache_control }));
    const messages = h.anthropic.messages.map((m) => ({
      role: m.role,
      content: m.content.map((b) => b.text).join("\n"),
      cache: m.content.some((b) => b.cache_control),
    }));
    out.replaceChildren(messageList([...system, ...messages], p));
  } else if (h.turns) {
    out.replaceChildren(messageList(h.turns.flatMap((t) => [
      { role: `user #${t.seq}`, content: t.user_query },
      { role: `assistant #${t.seq}`, content: t.final_answer },
    ]), p));
  }
  $("preview").hidden = false;
}

function messageList(messages, p) {
  return el(
    "ol",
    { class: "messages" },
    ...messages.map((m) =>
      el(
        "li",
        { class: `message ${m.role.split(" ")[0]}` },
        el("b", { text: m.cache ? `${m.role} · cache breakpoint` : m.role }),
        el("pre", {}, ...marked(p.text(m.content))),
      ),
    ),
  );
}

/** Marks each turn of the page by what the last preview did with it. */
function markTurns() {
  const m = view.marks;
  for (const li of $("turns").children) {
    const seq = Number(li.dataset.seq);
    let mark = "";
    if (m) {
      if (seq <= m.summaryThrough) mark = "summary";
      else if (m.included.has(seq)) mark = "included";
      else if (m.window.has(seq)) mark = "window";
      else mark = "stopped";
    }
    const label = {
      summary: "covered by the summary",
      included: m?.truncated.has(seq) ? "included (truncated)" : "included",
      window: "left out by the stable window",
      stopped: `left out by ${m?.stoppedBy ?? "the budget"}`,
    }[mark];
    li.dataset.mark = mark;
    li.querySelector(".mark").textContent = label ?? "";
  }
}

// ---- start ----------------------------------------------------------------

if (!config) {
  $("error").textContent = "This page has no lens configuration: it must be served by turnstore (TURNSTORE_LENS).";
  $("error").hidden = false;
} else {
  $("mode").textContent = config.mode === "full" ? "full: texts unmasked" : "redacted";
  $("mode").classList.toggle("warn", config.mode === "full");
  showMasks();
  start();
}
