// The behaviour tests of API v1.1 (translations, regenerated answers, forks,
// summaries, templates, chat templates, import and export), run inside
// clientSuite against the real binary on each store.
import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import {
  type DroppedReport,
  type ExportedSession,
  type ExportedTranscript,
  type ForkResult,
  type ImportInput,
  type ImportMessage,
  type TranscriptMessage,
  type Turn,
  TurnstoreClient,
  type TurnstoreClientOptions,
  type TurnstoreError,
} from "turnstore-client";
import { UUID, id, turnstoreError } from "./assertions.js";
import { type Fault, type FaultyFetch, problem } from "./faults.js";
import type { Backend } from "./suite.js";

/** What clientSuite shares with these tests (getters: set in its `before`). */
export interface SuiteContext {
  readonly baseUrl: string;
  readonly client: TurnstoreClient;
  faulty(
    plan: (request: { method: string; path: string }, index: number) => Fault | undefined,
    options?: Partial<TurnstoreClientOptions>,
  ): { client: TurnstoreClient; faults: FaultyFetch };
  /** A session holding finalized turns (question i / answer i). */
  sessionWith(answers: string[]): Promise<string>;
  /** Another server on the same kind of store, with these settings added; the caller stops it. */
  startBackend(env: Record<string, string>): Promise<Backend>;
}

/** The suite server's TURNSTORE_TEMPLATES_DIR: API.md's example, and one that fails on its line 2. */
const TEMPLATE_FILES: Record<string, string> = {
  "tagged.jinja":
    "{% macro header() %}<conversation>{% endmacro %}\n" +
    '{% macro turn(turn) %}<q n="{{ turn.seq }}">{{ turn.user_query }}</q><a>{{ turn.final_answer }}</a>{% endmacro %}\n' +
    "{% macro separator() %}\n{% endmacro %}\n" +
    "{% macro footer() %}</conversation>{% endmacro %}\n" +
    '{% macro summary(summary) %}<summary upto="{{ summary.through_seq }}">{{ summary.text }}</summary>{% endmacro %}\n',
  "failing.jinja": "{% macro turn(turn) %}{{ turn.user_query }}\n{{ no_such_name }}{% endmacro %}\n",
};

export function writeTemplates(dir: string): void {
  for (const [name, text] of Object.entries(TEMPLATE_FILES)) writeFileSync(join(dir, name), text);
}

/** ChatML, the chat template of the `chat` tokenizer (Jinja turns each `\\n` into a newline). */
const CHATML =
  "{%- for message in messages %}" +
  "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}" +
  "{%- endfor %}" +
  "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

/**
 * Writes `chat` into a TURNSTORE_TOKENIZERS_DIR: the repository's tiny BPE
 * fixture with ChatML's special tokens added, and ChatML as its chat template.
 */
export function writeChatTokenizer(dir: string): void {
  const fixture = new URL("../../../../tests/fixtures/tiny-tokenizer.json", import.meta.url);
  const tokenizer = JSON.parse(readFileSync(fixture, "utf8")) as Record<string, unknown>;
  tokenizer["added_tokens"] = ["<|im_start|>", "<|im_end|>"].map((content, i) => ({
    id: 261 + i,
    content,
    single_word: false,
    lstrip: false,
    rstrip: false,
    normalized: false,
    special: true,
  }));
  mkdirSync(join(dir, "chat"));
  writeFileSync(join(dir, "chat", "tokenizer.json"), JSON.stringify(tokenizer));
  writeFileSync(
    join(dir, "chat", "tokenizer_config.json"),
    JSON.stringify({ chat_template: CHATML, eos_token: "<|im_end|>" }),
  );
}

/** What ChatML renders of these messages (without a generation prompt). */
const chatml = (...messages: [role: string, content: string][]): string =>
  messages.map(([role, content]) => `<|im_start|>${role}\n${content}<|im_end|>\n`).join("");

const HEADER = "### Conversation history:\n";

/** Every session an export yields, in order. */
async function drain<T>(sessions: AsyncIterable<T>): Promise<T[]> {
  const seen: T[] = [];
  for await (const session of sessions) seen.push(session);
  return seen;
}

/** The sessions an export yields before it throws, and the TurnstoreError it throws. */
async function drainUntilError<T>(
  sessions: AsyncIterable<T>,
  onSession: (seen: number) => Promise<void> | void = () => undefined,
): Promise<{ seen: T[]; error: TurnstoreError }> {
  const seen: T[] = [];
  const error = await turnstoreError(
    (async () => {
      for await (const session of sessions) {
        seen.push(session);
        await onSession(seen.length);
      }
    })(),
  );
  return { seen, error };
}

/** A transcript as untyped data might hold it (roles the types rule out). */
const fromWire = (json: string): ImportMessage[] => JSON.parse(json) as ImportMessage[];

const TRANSCRIPT: readonly ImportMessage[] = [
  { role: "user", content: "What is a vector index?" },
  { role: "assistant", content: "An index over vectors." },
  { role: "user", content: "Which one should I use?" },
  { role: "assistant", content: "HNSW." },
];

/**
 * One of the repository's agent-loop transcripts (tests/fixtures/transcripts,
 * the server's distill fixtures: tests/api/distill.rs holds it to the same
 * results), as an SDK would hand them over.
 */
const agentLoop = (name: "openai_agent_loop" | "anthropic_tool_loop"): TranscriptMessage[] =>
  JSON.parse(
    readFileSync(new URL(`../../../../tests/fixtures/transcripts/${name}.json`, import.meta.url), "utf8"),
  ) as TranscriptMessage[];

const OPENAI_DROPPED: DroppedReport[] = [
  { reason: "instructions", count: 2, first_indexes: [0, 1] },
  { reason: "tool_result", count: 4, first_indexes: [4, 9, 10, 14] },
  { reason: "tool_call", count: 2, first_indexes: [3, 8] },
  { reason: "refusal", count: 1, first_indexes: [13] },
  { reason: "non_text", count: 3, first_indexes: [2, 7, 16] },
  { reason: "unanswered", count: 1, first_indexes: [16] },
];
const ANTHROPIC_DROPPED: DroppedReport[] = [
  { reason: "tool_result", count: 2, first_indexes: [2, 5] },
  { reason: "tool_call", count: 2, first_indexes: [1, 5] },
  { reason: "thinking", count: 2, first_indexes: [1, 5] },
  { reason: "non_text", count: 1, first_indexes: [4] },
  { reason: "superseded", count: 1, first_indexes: [1] },
];

export function v11Suites(context: SuiteContext): void {
  const client = (): TurnstoreClient => context.client;

  describe("translations", () => {
    it("keeps English copies beside the originals and renders them with lang: en", async () => {
      const sessionId = id("s");
      const one = await client().startTurn({
        sessionId,
        userQuery: "Was ist ein Vektorindex?",
        userQueryEn: "What is a vector index?",
      });
      const finalized = await client().finalizeTurn(sessionId, one.turn_id, {
        finalAnswer: "Ein Index über Vektoren.",
        finalAnswerEn: "An index over vectors.",
      });
      assert.equal(finalized.turn.user_query, "Was ist ein Vektorindex?");
      assert.equal(finalized.turn.user_query_en, "What is a vector index?");
      assert.equal(finalized.turn.final_answer_en, "An index over vectors.");
      // Only an English answer; then no copies at all.
      const two = await client().startTurn({ sessionId, userQuery: "Und HNSW?" });
      await client().finalizeTurn(sessionId, two.turn_id, { finalAnswer: "Ein Graph.", finalAnswerEn: "A graph." });
      const three = await client().startTurn({ sessionId, userQuery: "Danke!" });
      await client().finalizeTurn(sessionId, three.turn_id, "Bitte.");

      const turns = await client().getHistory(sessionId, { format: "turns" });
      assert.deepEqual(
        turns.turns.map((t) => [t.user_query, t.user_query_en, t.final_answer, t.final_answer_en]),
        [
          ["Was ist ein Vektorindex?", "What is a vector index?", "Ein Index über Vektoren.", "An index over vectors."],
          ["Und HNSW?", undefined, "Ein Graph.", "A graph."],
          ["Danke!", undefined, "Bitte.", undefined],
        ],
      );
      const english = await client().getHistory(sessionId, { lang: "en" });
      assert.equal(
        english.rendered,
        HEADER +
          "User: What is a vector index?\nAssistant: An index over vectors.\n\n" +
          "User: Und HNSW?\nAssistant: A graph.\n\n" +
          "User: Danke!\nAssistant: Bitte.",
      );
      // In a lang=en history, Turn objects hold the rendered texts, and the
      // *_en fields where a turn has English copies.
      const englishTurns = await client().getHistory(sessionId, { lang: "en", format: "turns" });
      assert.deepEqual(
        englishTurns.turns.map((t) => [t.user_query, t.final_answer, "user_query_en" in t, "final_answer_en" in t]),
        [
          ["What is a vector index?", "An index over vectors.", true, true],
          ["Und HNSW?", "A graph.", false, true],
          ["Danke!", "Bitte.", false, false],
        ],
      );
      // A start's history takes lang too.
      const four = await client().startTurn({
        sessionId,
        userQuery: "Noch etwas?",
        history: { lang: "en", format: "messages", limit: 2 },
      });
      assert.deepEqual(
        four.history.messages.map((m) => m.content),
        ["Und HNSW?", "A graph.", "Danke!", "Bitte."],
      );
    });

    it("finalizes again with the same English copy, not with another", async () => {
      const started = await client().startTurn({ userQuery: "Frage" });
      const answer = { finalAnswer: "Antwort", finalAnswerEn: "Answer" };
      const first = await client().finalizeTurn(started.session_id, started.turn_id, answer);
      assert.deepEqual(await client().finalizeTurn(started.session_id, started.turn_id, answer), first);
      const other = await turnstoreError(
        client().finalizeTurn(started.session_id, started.turn_id, { ...answer, finalAnswerEn: "Reply" }),
      );
      assert.equal(other.status, 409);
      assert.equal(other.code, "turn_already_finalized");
    });

    it("turn() stores the English copies of the question and of the answer the callback returns", async () => {
      const done = await client().turn({ userQuery: "Frage", userQueryEn: "Question" }, () => ({
        finalAnswer: "Antwort",
        finalAnswerEn: "Answer",
      }));
      assert.deepEqual(
        [done.turn.user_query, done.turn.user_query_en, done.turn.final_answer, done.turn.final_answer_en],
        ["Frage", "Question", "Antwort", "Answer"],
      );
    });

    it("reports a blank English copy and another lang as 422, naming the field", async () => {
      const blank = await turnstoreError(client().startTurn({ sessionId: id("s"), userQuery: "q", userQueryEn: " " }));
      assert.equal(blank.status, 422);
      assert.deepEqual(
        blank.errors.map((e) => e.field),
        ["user_query_en"],
      );
      // @ts-expect-error only "en" is a language
      const lang = await turnstoreError(client().getHistory(id("s"), { lang: "de" }));
      assert.deepEqual(
        lang.errors.map((e) => e.field),
        ["lang"],
      );
    });
  });

  describe("regenerate", () => {
    /** A session of three finalized turns (question i / ai), and its turns. */
    const threeTurns = async () => {
      const sessionId = await context.sessionWith(["a1", "a2", "a3"]);
      const { turns } = await client().getHistory(sessionId, { format: "turns" });
      const [first, second, third] = turns;
      assert.ok(first && second && third);
      return { sessionId, first, second, third };
    };
    const answers = async (sessionId: string): Promise<string[]> =>
      (await client().getHistory(sessionId, { format: "turns" })).turns.map((t) => t.final_answer);

    it("replaces a finalized turn's answer in place: same seq, question and start", async () => {
      const { sessionId, second, third } = await threeTurns();
      const replaced = await client().regenerateTurn(sessionId, second.turn_id, "b2");
      assert.equal(replaced.session_id, sessionId);
      const { turn } = replaced;
      assert.deepEqual(
        [turn.turn_id, turn.seq, turn.user_query, turn.started_at, turn.final_answer],
        [second.turn_id, 2, "question 2", second.started_at, "b2"],
      );
      assert.ok(turn.finalized_at >= second.finalized_at);
      // The newest turn too; the same answer again is the same answer.
      await client().regenerateTurn(sessionId, third.turn_id, "b3");
      const again = await client().regenerateTurn(sessionId, third.turn_id, "b3");
      assert.deepEqual([again.turn.seq, again.turn.final_answer], [3, "b3"]);
      const after = await client().getHistory(sessionId, { format: "turns" });
      assert.deepEqual(
        after.turns.map((t) => [t.seq, t.final_answer]),
        [
          [1, "a1"],
          [2, "b2"],
          [3, "b3"],
        ],
      );
      assert.deepEqual(after.turns[1], turn);
      assert.equal((await client().getSession(sessionId)).turn_count, 3);
      // The session goes on after the regenerated turns.
      assert.equal((await client().startTurn({ sessionId, userQuery: "q4" })).seq, 4);
    });

    it("keeps the question's English copy; the answer's is the new answer's, or none", async () => {
      const sessionId = id("s");
      const started = await client().startTurn({ sessionId, userQuery: "Was ist das?", userQueryEn: "What is it?" });
      await client().finalizeTurn(sessionId, started.turn_id, { finalAnswer: "Ein Baum.", finalAnswerEn: "A tree." });
      const plain = await client().regenerateTurn(sessionId, started.turn_id, "Ein Graph.");
      assert.equal(plain.turn.user_query_en, "What is it?");
      assert.equal(plain.turn.final_answer_en ?? null, null);
      const copied = await client().regenerateTurn(sessionId, started.turn_id, {
        finalAnswer: "Eine Liste.",
        finalAnswerEn: "A list.",
      });
      assert.deepEqual([copied.turn.user_query_en, copied.turn.final_answer_en], ["What is it?", "A list."]);
      const english = await client().getHistoryText(sessionId, { lang: "en" });
      assert.ok(english.text.endsWith("User: What is it?\nAssistant: A list."), english.text);
    });

    it("refuses a turn the summary covers (409 turn_summarized), a pending one (409 turn_pending), an unknown one (404)", async () => {
      const { sessionId, first, second, third } = await threeTurns();
      await client().putSummary(sessionId, { summary: "q1 and q2.", throughSeq: 2 });
      const covered = await turnstoreError(client().regenerateTurn(sessionId, second.turn_id, "b2"));
      assert.equal(covered.status, 409);
      assert.equal(covered.code, "turn_summarized");
      assert.match(covered.detail, /through seq 2/);
      assert.ok(covered.requestId);
      assert.equal(covered.attempts, 1, "a 409 is not retried");
      assert.equal((await turnstoreError(client().regenerateTurn(sessionId, first.turn_id, "b1"))).code, "turn_summarized");
      const pending = await client().startTurn({ sessionId, userQuery: "q4" });
      const notYet = await turnstoreError(client().regenerateTurn(sessionId, pending.turn_id, "b4"));
      assert.deepEqual([notYet.status, notYet.code], [409, "turn_pending"]);
      const unknown = await turnstoreError(client().regenerateTurn(sessionId, "0193a6f4-5c2e-7b1a-9a41-2f6d8e0c4b7a", "b"));
      assert.deepEqual([unknown.status, unknown.code], [404, "turn_not_found"]);
      const elsewhere = await turnstoreError(client().regenerateTurn(id("s"), third.turn_id, "b"));
      assert.deepEqual([elsewhere.status, elsewhere.code], [404, "turn_not_found"]);
      const blank = await turnstoreError(client().regenerateTurn(sessionId, third.turn_id, "   "));
      assert.deepEqual(
        [blank.status, blank.errors.map((e) => e.field)],
        [422, ["final_answer"]],
      );
      const large = await turnstoreError(client().regenerateTurn(sessionId, third.turn_id, "x".repeat(200_000)));
      assert.deepEqual([large.status, large.code], [413, "payload_too_large"]);
      // Nothing changed; without the summary, the covered turns may change too.
      assert.deepEqual(await answers(sessionId), ["a1", "a2", "a3"]);
      await client().deleteSummary(sessionId);
      await client().regenerateTurn(sessionId, first.turn_id, "b1");
      await client().regenerateTurn(sessionId, second.turn_id, "b2");
      assert.deepEqual(await answers(sessionId), ["b1", "b2", "a3"]);
    });

    it("retries a regenerate whose reply was lost, to the same answer", async () => {
      const { sessionId, third } = await threeTurns();
      const { client: lossy, faults } = context.faulty((_, index) => (index === 0 ? { kind: "lose-reply" } : undefined));
      const { turn } = await lossy.regenerateTurn(sessionId, third.turn_id, { finalAnswer: "b3", finalAnswerEn: "b3 (en)" });
      assert.deepEqual([turn.seq, turn.final_answer, turn.final_answer_en], [3, "b3", "b3 (en)"]);
      const [first, second] = faults.seen;
      assert.ok(first && second && faults.seen.length === 2);
      assert.ok(first.path.endsWith(`/turns/${third.turn_id}/regenerate`), first.path);
      assert.equal(second.body, first.body);
      assert.deepEqual(JSON.parse(first.body), { final_answer: "b3", final_answer_en: "b3 (en)" });
      assert.deepEqual(await answers(sessionId), ["a1", "a2", "b3"]);
    });
  });

  describe("fork", () => {
    /** Every finalized turn of the session, whole. */
    const allTurns = async (sessionId: string): Promise<Turn[]> =>
      (await client().getHistory(sessionId, { format: "turns", limit: 1_000, max_tokens: 10_000_000 })).turns;
    /** A session of `userId` with `count` finalized turns, English copies included. */
    const ownedSession = async (userId: string, count: number): Promise<string> => {
      const sessionId = id("s");
      for (let n = 1; n <= count; n += 1) {
        const started = await client().startTurn({
          sessionId,
          userId,
          userQuery: `Frage ${n}?`,
          userQueryEn: `Question ${n}?`,
        });
        await client().finalizeTurn(sessionId, started.turn_id, { finalAnswer: `Antwort ${n}.`, finalAnswerEn: `Answer ${n}.` });
      }
      return sessionId;
    };
    /** A 409 `session_exists` with `Retry-After`, as the server answers while another fork into the id is under way. */
    const busy = (): Fault => problem(409, "session_exists", { "retry-after": "1" });

    it("copies the turns through a seq, as they are, with the summary and the owner; the fork goes on after them", async () => {
      const userId = id("u");
      const sessionId = await ownedSession(userId, 4);
      await client().putSummary(sessionId, { summary: "The first two.", throughSeq: 2 });
      await client().startTurn({ sessionId, userQuery: "pending, not copied" });
      const source = await allTurns(sessionId);

      const newSessionId = id("s");
      const fork = await client().forkSession(sessionId, { newSessionId, throughSeq: 3, userId });
      assert.deepEqual(fork, {
        session_id: newSessionId,
        forked_from: sessionId,
        user_id: userId,
        through_seq: 3,
        copied_turns: 3,
        summary: true,
        replayed: false,
      } satisfies ForkResult);
      // Seqs, turn ids, texts, English copies, times.
      assert.deepEqual(await allTurns(newSessionId), source.slice(0, 3));
      assert.deepEqual(await client().getSummary(newSessionId), await client().getSummary(sessionId));
      const session = await client().getSession(newSessionId);
      assert.deepEqual([session.user_id, session.turn_count, session.pending_count], [userId, 3, 0]);
      assert.notEqual(session.generation, (await client().getSession(sessionId)).generation);
      const listed: string[] = [];
      for await (const s of client().iterateUserSessions(userId)) listed.push(s.session_id);
      assert.ok(listed.includes(newSessionId));
      // "Edit question 4": the fork goes on at seq 4; the source is as it was.
      assert.equal((await client().startTurn({ sessionId: newSessionId, userQuery: "Frage 4, bearbeitet?" })).seq, 4);
      assert.deepEqual(await allTurns(sessionId), source);
      assert.equal((await client().getSession(sessionId)).pending_count, 1);

      // Through 1 the summary (through 2) stays behind; without throughSeq, through the newest.
      const early = await client().forkSession(sessionId, { newSessionId: id("s"), throughSeq: 1 });
      assert.deepEqual([early.copied_turns, early.summary, early.user_id], [1, false, userId]);
      assert.equal(await turnstoreError(client().getSummary(early.session_id)).then((e) => e.code), "summary_not_found");
      const whole = await client().forkSession(sessionId, { newSessionId: id("s") });
      assert.deepEqual([whole.through_seq, whole.copied_turns, whole.summary], [4, 4, true]);
      assert.deepEqual(await allTurns(whole.session_id), source);
    });

    it("gives an unowned session's fork to the user given, if any", async () => {
      const sessionId = await context.sessionWith(["a1"]);
      const userId = id("u");
      const fork = await client().forkSession(sessionId, { newSessionId: id("s"), userId });
      assert.equal(fork.user_id, userId);
      assert.equal((await client().getSession(fork.session_id)).user_id, userId);
      assert.equal((await client().getSession(sessionId)).user_id ?? null, null);
      assert.equal((await client().forkSession(sessionId, { newSessionId: id("s") })).user_id, null);
    });

    it("replays a fork sent again with its key, even once the source is gone", async () => {
      const sessionId = await ownedSession(id("u"), 3);
      const newSessionId = id("s");
      const key = id("k");
      const first = await client().forkSession(sessionId, { newSessionId, throughSeq: 2 }, { idempotencyKey: key });
      const again = await client().forkSession(sessionId, { newSessionId, throughSeq: 2 }, { idempotencyKey: key });
      assert.equal(first.replayed, false);
      assert.deepEqual(again, { ...first, replayed: true });
      await client().clearSession(sessionId);
      assert.deepEqual(await client().forkSession(sessionId, { newSessionId, throughSeq: 2 }, { idempotencyKey: key }), again);
      assert.equal((await client().getSession(newSessionId)).turn_count, 2);
      // The key with another body; another key: the id is taken, and that is not retried.
      const reused = await turnstoreError(
        client().forkSession(sessionId, { newSessionId, throughSeq: 1 }, { idempotencyKey: key }),
      );
      assert.deepEqual([reused.status, reused.code], [422, "idempotency_key_reused"]);
      const taken = await turnstoreError(client().forkSession(sessionId, { newSessionId, throughSeq: 2 }));
      assert.deepEqual([taken.status, taken.code, taken.retryAfter, taken.attempts], [409, "session_exists", undefined, 1]);
    });

    it("refuses an unknown source (404), another owner (403), a taken id (409), a wrong through_seq (422)", async () => {
      const userId = id("u");
      const sessionId = await ownedSession(userId, 2);
      const taken = await context.sessionWith(["a"]);
      const newSessionId = id("s");
      const unknown = await turnstoreError(client().forkSession(id("s"), { newSessionId }));
      assert.deepEqual([unknown.status, unknown.code], [404, "session_not_found"]);
      const other = await turnstoreError(client().forkSession(sessionId, { newSessionId, userId: id("u") }));
      assert.deepEqual([other.status, other.code], [403, "session_owner_mismatch"]);
      const exists = await turnstoreError(client().forkSession(sessionId, { newSessionId: taken }));
      assert.deepEqual([exists.status, exists.code, exists.attempts], [409, "session_exists", 1]);
      const cases: [newSessionId: string, throughSeq: number | undefined, field: string][] = [
        [newSessionId, 0, "through_seq"],
        [newSessionId, 3, "through_seq"], // past the newest finalized turn (2)
        [sessionId, undefined, "new_session_id"], // the source's own
        ["bad id!", undefined, "new_session_id"],
      ];
      for (const [target, throughSeq, field] of cases) {
        const invalid = await turnstoreError(client().forkSession(sessionId, { newSessionId: target, throughSeq }));
        assert.deepEqual([invalid.status, invalid.code], [422, "validation_failed"]);
        assert.ok(
          invalid.errors.some((e) => e.field === field),
          `${target} ${throughSeq}: ${JSON.stringify(invalid.errors)}`,
        );
      }
      // Below the oldest turn kept: nothing to copy.
      const [first] = await allTurns(sessionId);
      assert.ok(first);
      await client().abortTurn(sessionId, first.turn_id);
      const below = await turnstoreError(client().forkSession(sessionId, { newSessionId, throughSeq: 1 }));
      assert.match(below.detail, /oldest finalized seq \(2\)/);
      // None of these made the fork.
      assert.equal((await turnstoreError(client().getSession(newSessionId))).code, "session_not_found");
      assert.deepEqual(
        (await allTurns(taken)).map((t) => t.final_answer),
        ["a"],
      );
    });

    it("sends the fields given and one Idempotency-Key; a lost reply is replayed, not a 409", async () => {
      const sessionId = await ownedSession(id("u"), 2);
      const { client: recorded, faults: sent } = context.faulty(() => undefined);
      await recorded.forkSession(sessionId, { newSessionId: `${sessionId}-a` });
      await recorded.forkSession(sessionId, { newSessionId: `${sessionId}-b`, throughSeq: 1, userId: "" }, { idempotencyKey: "k-1" });
      assert.deepEqual(
        sent.seen.map((r) => JSON.parse(r.body) as unknown),
        [{ new_session_id: `${sessionId}-a` }, { new_session_id: `${sessionId}-b`, through_seq: 1, user_id: "" }],
      );
      assert.equal(sent.seen[0]?.path, `/v1/sessions/${sessionId}/fork`);
      assert.match(sent.seen[0]?.headers.get("idempotency-key") ?? "", UUID);
      assert.equal(sent.seen[1]?.headers.get("idempotency-key"), "k-1");

      const newSessionId = id("s");
      const { client: lossy, faults } = context.faulty((_, index) => (index < 2 ? { kind: "lose-reply" } : undefined));
      const fork = await lossy.forkSession(sessionId, { newSessionId, throughSeq: 1 });
      assert.deepEqual([fork.replayed, fork.session_id, fork.copied_turns], [true, newSessionId, 1]);
      assert.equal(faults.seen.length, 3);
      assert.equal(new Set(faults.seen.map((r) => r.headers.get("idempotency-key"))).size, 1);
      assert.deepEqual(await allTurns(newSessionId), (await allTurns(sessionId)).slice(0, 1));
    });

    it("waits out a 409 session_exists with Retry-After (a fork into the id under way) and tries again", async () => {
      const sessionId = await ownedSession(id("u"), 2);
      const { client: told, faults } = context.faulty((_, index) => (index < 2 ? busy() : undefined));
      const fork = await told.forkSession(sessionId, { newSessionId: id("s") });
      assert.deepEqual([fork.replayed, fork.copied_turns], [false, 2]);
      assert.deepEqual(
        faults.seen.map((r) => r.path),
        Array(3).fill(`/v1/sessions/${sessionId}/fork`),
      );
      assert.equal(new Set(faults.seen.map((r) => r.headers.get("idempotency-key"))).size, 1);
      // Only a fork waits so.
      const { client: other, faults: once } = context.faulty(() => busy());
      assert.equal((await turnstoreError(other.getSession(sessionId))).attempts, 1);
      assert.equal(once.seen.length, 1);
      // The retries run out: the error says when to call again.
      const { client: always } = context.faulty(() => busy(), { maxRetries: 2 });
      const error = await turnstoreError(always.forkSession(sessionId, { newSessionId: id("s") }));
      assert.deepEqual([error.status, error.code, error.retryAfter, error.attempts], [409, "session_exists", 1, 3]);
    });
  });

  describe("summaries", () => {
    it("writes, reads and deletes a summary; none is a 404 summary_not_found", async () => {
      const sessionId = await context.sessionWith(["a1", "a2", "a3"]);
      const none = await turnstoreError(client().getSummary(sessionId));
      assert.equal(none.status, 404);
      assert.equal(none.code, "summary_not_found");
      const written = await client().putSummary(sessionId, {
        summary: "Two questions were answered.",
        throughSeq: 2,
        expectedThroughSeq: 0,
      });
      assert.equal(written.summary, "Two questions were answered.");
      assert.equal(written.through_seq, 2);
      assert.ok(written.token_count > 0);
      assert.ok(Number.isFinite(Date.parse(written.updated_at)));
      assert.deepEqual(await client().getSummary(sessionId), written);
      await client().deleteSummary(sessionId);
      assert.equal((await turnstoreError(client().getSummary(sessionId))).code, "summary_not_found");
      await client().deleteSummary(sessionId);
      // A clear of the session deletes its summary too.
      await client().putSummary(sessionId, { summary: "again", throughSeq: 1 });
      await client().clearSession(sessionId);
      assert.equal((await turnstoreError(client().getSummary(sessionId))).code, "summary_not_found");
    });

    it("begins a summary: true history with the summary, in every format and in a start", async () => {
      const sessionId = await context.sessionWith(["answer one", "answer two", "answer three"]);
      await client().putSummary(sessionId, { summary: "Two questions were answered.", throughSeq: 2 });
      const text = await client().getHistory(sessionId, { summary: true });
      assert.equal(
        text.rendered,
        "### Conversation summary:\nTwo questions were answered.\n\n" + HEADER + "User: question 3\nAssistant: answer three",
      );
      assert.equal(text.total_turns, 1);
      assert.equal(text.unsummarized, null);
      const messages = await client().getHistory(sessionId, { summary: true, format: "messages" });
      assert.deepEqual(messages.messages, [
        { role: "system", content: "Summary of the conversation so far:\nTwo questions were answered." },
        { role: "user", content: "question 3" },
        { role: "assistant", content: "answer three" },
      ]);
      const turns = await client().getHistory(sessionId, { summary: true, format: "turns" });
      assert.deepEqual(
        turns.turns.map((t) => t.seq),
        [3],
      );
      assert.equal(turns.summary?.summary, "Two questions were answered.");
      assert.equal(turns.summary?.through_seq, 2);
      // Without summary: true, the history is as always.
      const plain = await client().getHistory(sessionId, { format: "turns" });
      assert.deepEqual(
        plain.turns.map((t) => t.seq),
        [1, 2, 3],
      );
      assert.equal(plain.summary, undefined);
      const started = await client().startTurn({
        sessionId,
        userQuery: "question 4",
        history: { summary: true, format: "messages" },
      });
      assert.equal(started.history.messages[0]?.role, "system");
      assert.equal(started.history.messages.length, 3);
    });

    it("reports the turns neither returned nor summarized in unsummarized, readable by range", async () => {
      const sessionId = await context.sessionWith(["a1", "a2", "a3", "a4"]);
      assert.equal((await client().getHistory(sessionId)).unsummarized, null);
      const recent = await client().getHistory(sessionId, { limit: 1 });
      const left = recent.unsummarized;
      assert.ok(left, "a history that leaves turns out has unsummarized");
      assert.deepEqual([left.after_seq, left.through_seq, left.turns], [0, 3, 3]);
      // Their blocks as `text` renders them, without the header line.
      const range = await client().getHistory(sessionId, { after_seq: left.after_seq, through_seq: left.through_seq });
      assert.equal(range.included_turns, 3);
      assert.ok(left.tokens !== null && left.tokens > 0 && left.tokens < range.token_count, `tokens ${left.tokens}`);
      // The rolling-summary step: read those turns, fold them, write with the previous coverage.
      const fold = await client().getHistory(sessionId, {
        format: "turns",
        after_seq: left.after_seq,
        through_seq: left.through_seq,
      });
      assert.deepEqual(
        fold.turns.map((t) => t.seq),
        [1, 2, 3],
      );
      await client().putSummary(sessionId, {
        summary: fold.turns.map((t) => t.final_answer).join(" "),
        throughSeq: left.through_seq,
        expectedThroughSeq: left.after_seq,
      });
      const after = await client().getHistory(sessionId, { limit: 1, summary: true });
      assert.equal(after.rendered, "### Conversation summary:\na1 a2 a3\n\n" + HEADER + "User: question 4\nAssistant: a4");
      assert.equal(after.unsummarized, null);
      // limit counts turns only: the summary alone, and turn 4 left over.
      const alone = await client().getHistory(sessionId, { limit: 0, summary: true });
      assert.deepEqual(alone.unsummarized, { after_seq: 3, through_seq: 4, turns: 1, tokens: alone.unsummarized?.tokens });
      assert.equal(typeof alone.unsummarized?.tokens, "number");
      // In another encoding than the server's, the turns are counted in that one.
      const other = await client().getHistory(sessionId, { limit: 0, summary: true, encoding: "cl100k_base" });
      assert.equal(other.unsummarized?.turns, 1);
      assert.equal(typeof other.unsummarized?.tokens, "number");
    });

    it("refuses a write that expected another coverage, or goes backwards: 409 summary_conflict", async () => {
      const sessionId = await context.sessionWith(["a1", "a2", "a3"]);
      await client().putSummary(sessionId, { summary: "first", throughSeq: 2, expectedThroughSeq: 0 });
      // A second summarizer that read before the first one wrote.
      const stale = await turnstoreError(
        client().putSummary(sessionId, { summary: "second", throughSeq: 3, expectedThroughSeq: 0 }),
      );
      assert.equal(stale.status, 409);
      assert.equal(stale.code, "summary_conflict");
      assert.equal(stale.attempts, 1);
      const backwards = await turnstoreError(client().putSummary(sessionId, { summary: "older", throughSeq: 1 }));
      assert.equal(backwards.status, 409);
      assert.equal(backwards.code, "summary_conflict");
      assert.equal((await client().getSummary(sessionId)).summary, "first");
      // The loser reads again and folds what is left.
      const next = await client().putSummary(sessionId, {
        summary: "first, then a3",
        throughSeq: 3,
        expectedThroughSeq: 2,
      });
      assert.equal(next.through_seq, 3);
      // The same coverage again rewrites the text.
      assert.equal((await client().putSummary(sessionId, { summary: "rewritten", throughSeq: 3 })).summary, "rewritten");
    });

    it("refuses a summary beyond the newest finalized turn, or empty: 422 naming the field", async () => {
      const sessionId = await context.sessionWith(["a1", "a2"]);
      await client().startTurn({ sessionId, userQuery: "pending" }); // seq 3, not finalized
      const fields = async (promise: Promise<unknown>): Promise<string[]> => {
        const error = await turnstoreError(promise);
        assert.equal(error.status, 422);
        assert.equal(error.code, "validation_failed");
        return error.errors.map((e) => e.field);
      };
      assert.deepEqual(await fields(client().putSummary(sessionId, { summary: "s", throughSeq: 3 })), ["through_seq"]);
      assert.deepEqual(await fields(client().putSummary(sessionId, { summary: "s", throughSeq: 0 })), ["through_seq"]);
      assert.deepEqual(await fields(client().putSummary(id("s"), { summary: "s", throughSeq: 1 })), ["through_seq"]);
      assert.deepEqual(await fields(client().putSummary(sessionId, { summary: " ", throughSeq: 1 })), ["summary"]);
      assert.equal((await turnstoreError(client().getSummary(sessionId))).code, "summary_not_found");
    });

    it("checks the session's owner on a write", async () => {
      const sessionId = id("s");
      await client().importMessages(sessionId, { messages: TRANSCRIPT, userId: "alice" });
      const error = await turnstoreError(
        client().putSummary(sessionId, { summary: "s", throughSeq: 1, userId: "mallory" }),
      );
      assert.equal(error.status, 403);
      assert.equal(error.code, "session_owner_mismatch");
      assert.equal((await client().putSummary(sessionId, { summary: "s", throughSeq: 1, userId: "alice" })).through_seq, 1);
    });

    it("returns a compare-and-set write whose reply was lost, not the 409 its retry gets", async () => {
      const sessionId = await context.sessionWith(["a1", "a2"]);
      const { client: lossy, faults } = context.faulty((_, index) => (index === 0 ? { kind: "lose-reply" } : undefined));
      const written = await lossy.putSummary(sessionId, { summary: "s", throughSeq: 2, expectedThroughSeq: 0 });
      assert.deepEqual(
        faults.seen.map((r) => r.method),
        ["PUT", "PUT", "GET"],
      );
      assert.equal(written.summary, "s");
      assert.equal(written.through_seq, 2);
      assert.deepEqual(await client().getSummary(sessionId), written);
    });

    it("still reports a real conflict that a retry runs into", async () => {
      const sessionId = await context.sessionWith(["a1", "a2"]);
      await client().putSummary(sessionId, { summary: "theirs", throughSeq: 1, expectedThroughSeq: 0 });
      // The first attempt never reaches the server; the retry meets the other writer's summary.
      const { client: flaky, faults } = context.faulty((_, index) =>
        index === 0 ? problem(503, "store_unavailable") : undefined,
      );
      const error = await turnstoreError(
        flaky.putSummary(sessionId, { summary: "mine", throughSeq: 2, expectedThroughSeq: 0 }),
      );
      assert.equal(error.code, "summary_conflict");
      assert.equal(error.attempts, 2);
      assert.deepEqual(
        faults.seen.map((r) => r.method),
        ["PUT", "PUT", "GET"],
      );
      assert.equal((await client().getSummary(sessionId)).summary, "theirs");
    });

    it("names the session's generation in its histories and its info; another after a clear", async () => {
      const sessionId = await context.sessionWith(["a1", "a2"]);
      const { generation } = await client().getSession(sessionId);
      assert.equal(typeof generation, "string");
      assert.ok(generation.length > 0);
      assert.equal((await client().getHistory(sessionId)).generation, generation);
      assert.equal((await client().getHistory(sessionId, { summary: true, format: "turns" })).generation, generation);
      const started = await client().startTurn({ sessionId, userQuery: "question 3", history: {} });
      assert.equal(started.history.generation, generation);
      // The same in every read of this incarnation, whatever was written since.
      await client().finalizeTurn(sessionId, started.turn_id, "a3");
      await client().putSummary(sessionId, { summary: "s", throughSeq: 1 });
      assert.equal((await client().getSession(sessionId)).generation, generation);
      assert.equal((await client().getHistory(sessionId, { summary: true })).generation, generation);
      // An unknown session's history has none.
      assert.equal((await client().getHistory(id("s"))).generation, null);

      // Cleared and started again under the same id: another incarnation.
      await client().clearSession(sessionId);
      assert.equal((await client().getHistory(sessionId)).generation, null);
      const again = await client().startTurn({ sessionId, userQuery: "question 1", history: {} });
      const next = (await client().getSession(sessionId)).generation;
      assert.notEqual(next, generation);
      assert.equal(again.history.generation, next);
      assert.equal((await client().getHistory(sessionId)).generation, next);
    });

    it("refuses a summary folded from a session cleared and started again since: 409, nothing written", async () => {
      const sessionId = await context.sessionWith(["a1", "a2", "a3"]);
      const read = await client().getHistory(sessionId, { summary: true, limit: 1 });
      assert.deepEqual([read.unsummarized?.after_seq, read.unsummarized?.through_seq], [0, 2]);
      await client().clearSession(sessionId);
      for (const answer of ["b1", "b2", "b3"]) {
        const started = await client().startTurn({ sessionId, userQuery: "another question" });
        await client().finalizeTurn(sessionId, started.turn_id, answer);
      }
      // The new conversation looks the same to a summarizer; only the generation differs.
      const now = await client().getHistory(sessionId, { summary: true, limit: 1 });
      assert.deepEqual([now.unsummarized?.after_seq, now.unsummarized?.through_seq], [0, 2]);
      assert.notEqual(now.generation, read.generation);

      const stale = await turnstoreError(
        client().putSummary(sessionId, {
          summary: "a1 a2",
          throughSeq: 2,
          expectedThroughSeq: 0,
          expectedGeneration: read.generation,
        }),
      );
      assert.equal(stale.status, 409);
      assert.equal(stale.code, "summary_conflict");
      assert.match(stale.detail ?? "", /generation/);
      assert.equal((await turnstoreError(client().getSummary(sessionId))).code, "summary_not_found");

      const written = await client().putSummary(sessionId, {
        summary: "b1 b2",
        throughSeq: 2,
        expectedThroughSeq: 0,
        expectedGeneration: now.generation,
      });
      assert.deepEqual(await client().getSummary(sessionId), written);
      // A generation is 1 to 64 characters.
      const tooLong = await turnstoreError(
        client().putSummary(sessionId, { summary: "s", throughSeq: 3, expectedGeneration: "g".repeat(65) }),
      );
      assert.equal(tooLong.status, 422);
      assert.deepEqual(
        tooLong.errors.map((e) => e.field),
        ["expected_generation"],
      );
    });

    it("returns a lost write to a generation, but not the same summary in a session started again", async () => {
      const sessionId = await context.sessionWith(["a1", "a2"]);
      const { generation } = await client().getHistory(sessionId);
      const input = { summary: "s", throughSeq: 2, expectedThroughSeq: 0, expectedGeneration: generation };
      const { client: lossy, faults } = context.faulty((_, index) => (index === 0 ? { kind: "lose-reply" } : undefined));
      const written = await lossy.putSummary(sessionId, input);
      // One history read gives the summary and the generation together.
      assert.deepEqual(
        faults.seen.map((r) => `${r.method} ${r.path.split("/").at(-1)}`),
        ["PUT summary", "PUT summary", "GET history"],
      );
      assert.deepEqual(await client().getSummary(sessionId), written);

      // The first attempt writes and its reply is lost; before the retry the
      // session is cleared, started again, and given the very same summary.
      await client().deleteSummary(sessionId);
      const replacing = context.faulty((_, index) =>
        index === 0
          ? {
              kind: "rewrite",
              rewrite: async () => {
                await client().clearSession(sessionId);
                await client().importMessages(sessionId, { messages: TRANSCRIPT });
                await client().putSummary(sessionId, { summary: "s", throughSeq: 2, expectedThroughSeq: 0 });
                throw new TypeError("fetch failed", { cause: new Error("socket hang up (simulated)") });
              },
            }
          : undefined,
      );
      const error = await turnstoreError(replacing.client.putSummary(sessionId, input));
      assert.equal(error.code, "summary_conflict");
      assert.equal(error.attempts, 2);
      assert.deepEqual(
        replacing.faults.seen.map((r) => r.method),
        ["PUT", "PUT", "GET"],
      );
      assert.notEqual((await client().getSession(sessionId)).generation, generation);
    });
  });

  describe("templates", () => {
    let sessionId: string;
    before(async () => {
      sessionId = id("s");
      await client().importMessages(sessionId, {
        messages: [
          { role: "user", content: "Is 1 < 2 & 3 > 2?" },
          { role: "assistant", content: `Yes: "both", it's true` },
          { role: "user", content: "q2" },
          { role: "assistant", content: "a2" },
        ],
      });
    });

    it("renders with the built-in xml template, every text escaped", async () => {
      const history = await client().getHistory(sessionId, { template: "xml" });
      assert.equal(history.format, "text");
      assert.equal(
        history.rendered,
        '<history><turn role="user">Is 1 &lt; 2 &amp; 3 &gt; 2?</turn>' +
          '<turn role="assistant">Yes: &quot;both&quot;, it&apos;s true</turn>' +
          '<turn role="user">q2</turn><turn role="assistant">a2</turn></history>',
      );
      // The count is the rendering's, as text/plain reports it.
      const text = await client().getHistoryText(sessionId, { template: "xml" });
      assert.equal(text.text, history.rendered);
      assert.equal(text.tokenCount, history.token_count);
      assert.notEqual(history.token_count, (await client().getHistory(sessionId)).token_count);
    });

    it("renders with the built-in markdown template, in a start's history too", async () => {
      const expected =
        "## Conversation history\n\n" +
        `**User:** Is 1 < 2 & 3 > 2?\n\n**Assistant:** Yes: "both", it's true\n\n` +
        "**User:** q2\n\n**Assistant:** a2";
      assert.equal((await client().getHistory(sessionId, { template: "markdown" })).rendered, expected);
      const forked = id("s");
      await client().importMessages(forked, { messages: TRANSCRIPT });
      const started = await client().startTurn({
        sessionId: forked,
        userQuery: "q3",
        history: { template: "markdown", format: "text" },
      });
      assert.equal(
        started.history.rendered,
        "## Conversation history\n\n**User:** What is a vector index?\n\n**Assistant:** An index over vectors.\n\n" +
          "**User:** Which one should I use?\n\n**Assistant:** HNSW.",
      );
    });

    it("renders with a template of TURNSTORE_TEMPLATES_DIR, the summary first, under the budget rule", async () => {
      const all = await client().getHistory(sessionId, { template: "tagged" });
      assert.equal(
        all.rendered,
        '<conversation><q n="1">Is 1 < 2 & 3 > 2?</q><a>Yes: "both", it\'s true</a>\n<q n="2">q2</q><a>a2</a></conversation>',
      );
      const summarized = id("s");
      await client().importMessages(summarized, { messages: TRANSCRIPT });
      await client().putSummary(summarized, { summary: "Vector indexes.", throughSeq: 1 });
      const withSummary = await client().getHistory(summarized, { template: "tagged", summary: true });
      assert.equal(
        withSummary.rendered,
        '<summary upto="1">Vector indexes.</summary><conversation><q n="2">Which one should I use?</q><a>HNSW.</a></conversation>',
      );
      const xml = await client().getHistory(summarized, { template: "xml", summary: true, limit: 0 });
      assert.equal(xml.rendered, "<summary>Vector indexes.</summary>");
      const newest = await client().getHistory(sessionId, { template: "tagged", limit: 1 });
      assert.equal(newest.rendered, '<conversation><q n="2">q2</q><a>a2</a></conversation>');
      assert.equal(newest.stopped_by, "limit");
      assert.equal((await client().getHistoryText(sessionId, { template: "tagged", limit: 1 })).tokenCount, newest.token_count);
    });

    it("reports an unknown template as 404 template_not_found, on a read and on a start that writes nothing", async () => {
      const read = await turnstoreError(client().getHistory(sessionId, { template: "no-such-template" }));
      assert.equal(read.status, 404);
      assert.equal(read.code, "template_not_found");
      const started = id("s");
      const start = await turnstoreError(
        client().startTurn({ sessionId: started, userQuery: "q", history: { template: "no-such-template" } }),
      );
      assert.equal(start.status, 404);
      assert.equal(start.code, "template_not_found");
      assert.equal((await turnstoreError(client().getSession(started))).code, "session_not_found");
    });

    it("reports a template failing while it renders as 422 template_error naming its line; a start's turn is removed", async () => {
      const read = await turnstoreError(client().getHistory(sessionId, { template: "failing" }));
      assert.equal(read.status, 422);
      assert.equal(read.code, "template_error");
      assert.match(read.detail, /line 2/);
      const start = await turnstoreError(
        client().startTurn({ sessionId, userQuery: "q3", history: { template: "failing" } }),
      );
      assert.equal(start.code, "template_error");
      const session = await client().getSession(sessionId);
      assert.equal(session.pending_count, 0);
      assert.equal(session.turn_count, 2);
      // An empty history renders no turn, so nothing fails.
      assert.equal((await client().getHistory(id("s"), { template: "failing" })).rendered, "");
    });

    it(
      "leaves nothing behind after a start whose template fails (API.md), not even an owner claim",
      async () => {
        const unowned = id("s");
        await client().importMessages(unowned, { messages: TRANSCRIPT });
        const before = await client().getSession(unowned);
        const userId = id("u");
        const error = await turnstoreError(
          client().startTurn({ sessionId: unowned, userId, userQuery: "q", history: { template: "failing" } }),
        );
        assert.equal(error.code, "template_error");
        // expires_at is read as now + the TTL left: it moves by the ms.
        const after = await client().getSession(unowned);
        assert.deepEqual({ ...after, expires_at: before.expires_at }, before);
        assert.deepEqual((await client().listUserSessions(userId)).sessions, []);
      },
    );

    it("refuses a template with a format other than text (422, and a type error)", async () => {
      for (const format of ["messages", "turns"] as const) {
        // @ts-expect-error a template renders text only
        const error = await turnstoreError(client().getHistory(sessionId, { template: "xml", format }));
        assert.equal(error.status, 422);
        assert.equal(error.code, "validation_failed");
        assert.deepEqual(
          error.errors.map((e) => e.field),
          ["format"],
        );
      }
    });
  });

  describe("chat templates", () => {
    let tokenizersDir: string;
    let chatBackend: Backend;
    let chat: TurnstoreClient;
    const CHAT = { encoding: "chat", chat_template: true, prompt: true } as const;
    /** A session of the chat server holding these finalized turns. */
    const chatSession = async (...turns: [question: string, answer: string][]): Promise<string> => {
      const sessionId = id("s");
      for (const [question, answer] of turns) {
        const started = await chat.startTurn({ sessionId, userQuery: question });
        await chat.finalizeTurn(sessionId, started.turn_id, answer);
      }
      return sessionId;
    };

    before(async () => {
      tokenizersDir = mkdtempSync(join(tmpdir(), "turnstore-tokenizers-"));
      writeChatTokenizer(tokenizersDir);
      chatBackend = await context.startBackend({ TURNSTORE_TOKENIZERS_DIR: tokenizersDir });
      chat = new TurnstoreClient({ baseUrl: chatBackend.baseUrl });
    });
    after(async () => {
      await chatBackend?.stop();
      if (tokenizersDir) rmSync(tokenizersDir, { recursive: true, force: true });
    });

    it("budgets a messages history as its chat template's prompt, and returns the prompt with prompt: true", async () => {
      const sessionId = await chatSession(["What is HNSW?", "A graph index."]);
      const history = await chat.getHistory(sessionId, { ...CHAT, system: "Be brief." });
      assert.equal(
        history.prompt,
        chatml(["system", "Be brief."], ["user", "What is HNSW?"], ["assistant", "A graph index."]),
      );
      assert.equal(history.format, "messages");
      assert.equal(history.encoding, "chat");
      assert.deepEqual(history.messages, [
        { role: "system", content: "Be brief." },
        { role: "user", content: "What is HNSW?" },
        { role: "assistant", content: "A graph index." },
      ]);
      assert.ok(Number.isInteger(history.token_count) && history.token_count > 0, `${history.token_count}`);
      // The same count without the prompt, which is then absent; and none without chat_template.
      const counted = await chat.getHistory(sessionId, { encoding: "chat", chat_template: true, system: "Be brief." });
      assert.equal(counted.token_count, history.token_count);
      assert.equal("prompt" in counted, false);
      assert.equal("prompt" in (await chat.getHistory(sessionId, { encoding: "chat", format: "messages" })), false);
    });

    it("keeps the newest turns whose prompt fits max_tokens", async () => {
      const sessionId = await chatSession(["q1", "a1"], ["q2", "a2"]);
      const whole = await chat.getHistory(sessionId, CHAT);
      assert.equal(whole.included_turns, 2);
      const cut = await chat.getHistory(sessionId, { ...CHAT, max_tokens: whole.token_count - 1 });
      assert.equal(cut.included_turns, 1);
      assert.equal(cut.stopped_by, "max_tokens");
      assert.ok(cut.token_count > 0 && cut.token_count < whole.token_count, `${cut.token_count}`);
      assert.equal(cut.prompt, chatml(["user", "q2"], ["assistant", "a2"]));
    });

    it("joins the summary to the system message after a blank line", async () => {
      const sessionId = await chatSession(["q1", "a1"], ["q2", "a2"]);
      await chat.putSummary(sessionId, { summary: "Asked q1.", throughSeq: 1 });
      const history = await chat.getHistory(sessionId, { ...CHAT, summary: true, system: "Be brief." });
      const system = "Be brief.\n\nSummary of the conversation so far:\nAsked q1.";
      assert.deepEqual(history.messages[0], { role: "system", content: system });
      assert.equal(history.prompt, chatml(["system", system], ["user", "q2"], ["assistant", "a2"]));
    });

    it("ends a start's prompt with the new question and the generation prompt", async () => {
      const sessionId = await chatSession(["What is HNSW?", "A graph index."]);
      const started = await chat.startTurn({ sessionId, userQuery: "And IVF?", history: CHAT });
      assert.ok(started.history.prompt.endsWith("<|im_start|>user\nAnd IVF?<|im_end|>\n<|im_start|>assistant\n"));
      assert.equal(
        started.history.prompt,
        chatml(["user", "What is HNSW?"], ["assistant", "A graph index."], ["user", "And IVF?"]) +
          "<|im_start|>assistant\n",
      );
      // The messages are the history's alone, without the new question.
      assert.deepEqual(
        started.history.messages.map((m) => m.content),
        ["What is HNSW?", "A graph index."],
      );
      // turn() hands the prompt over too.
      const done = await chat.turn({ sessionId, userQuery: "Which is faster?", history: CHAT }, (t) => {
        assert.ok(t.history.prompt.endsWith("<|im_start|>user\nWhich is faster?<|im_end|>\n<|im_start|>assistant\n"));
        return "HNSW, usually.";
      });
      assert.equal(done.turn.seq, 3);
    });

    it("reports chat_template without a tokenizer that has one as 422 naming it; a start writes nothing", async () => {
      const sessionId = await chatSession(["q", "a"]);
      const read = await turnstoreError(chat.getHistory(sessionId, { encoding: "o200k_base", chat_template: true }));
      assert.equal(read.status, 422);
      assert.equal(read.code, "validation_failed");
      assert.deepEqual(
        read.errors.map((e) => e.field),
        ["chat_template"],
      );
      const start = await turnstoreError(
        chat.startTurn({ sessionId, userQuery: "q2", history: { encoding: "o200k_base", chat_template: true } }),
      );
      assert.equal(start.code, "validation_failed");
      assert.deepEqual(
        start.errors.map((e) => e.field),
        ["history.chat_template"],
      );
      const session = await chat.getSession(sessionId);
      assert.deepEqual([session.turn_count, session.pending_count], [1, 0]);
    });

    it("refuses prompt and system without chat_template: true (422, and a type error)", async () => {
      const error = await turnstoreError(
        // @ts-expect-error prompt and system need chat_template: true
        chat.getHistory(id("s"), { encoding: "chat", prompt: true, system: "Be brief." }),
      );
      assert.equal(error.status, 422);
      assert.equal(error.code, "validation_failed");
      assert.deepEqual(error.errors.map((e) => e.field).sort(), ["prompt", "system"]);
    });
  });

  describe("import", () => {
    it("appends a transcript as finalized turns at the next seqs, claiming the session", async () => {
      const sessionId = id("s");
      const userId = id("u");
      const imported = await client().importMessages(sessionId, { messages: TRANSCRIPT, userId });
      assert.deepEqual(imported, {
        session_id: sessionId,
        user_id: userId,
        imported_turns: 2,
        first_seq: 1,
        last_seq: 2,
        replayed: false,
      });
      assert.deepEqual((await client().getHistory(sessionId, { format: "messages" })).messages, TRANSCRIPT);
      const session = await client().getSession(sessionId);
      assert.equal(session.user_id, userId);
      assert.equal(session.turn_count, 2);
      // After a started turn, an import takes the seqs after it.
      const pending = await client().startTurn({ sessionId, userQuery: "q3" });
      assert.equal(pending.seq, 3);
      const more = await client().importMessages(sessionId, { messages: TRANSCRIPT.slice(0, 2) });
      assert.deepEqual([more.first_seq, more.last_seq, more.user_id], [4, 4, userId]);
    });

    it("rejects malformed messages with index-qualified fields, writing nothing", async () => {
      const sessionId = id("s");
      const malformed = fromWire(
        JSON.stringify([
          { role: "user", content: "q1" },
          { role: "system", content: "You are helpful." },
          { role: "user", content: "   " },
          { role: "assistant", content: "a2" },
          { role: "user", content: "q3" },
        ]),
      );
      const error = await turnstoreError(client().importMessages(sessionId, { messages: malformed }));
      assert.equal(error.status, 422);
      assert.equal(error.code, "validation_failed");
      assert.deepEqual(
        error.errors.map((e) => e.field),
        ["messages[1].role", "messages[2].content", "messages[4]"],
      );
      assert.equal(error.attempts, 1);
      assert.equal((await turnstoreError(client().getSession(sessionId))).code, "session_not_found");
      const empty = await turnstoreError(client().importMessages(sessionId, { messages: [] }));
      assert.deepEqual(
        empty.errors.map((e) => e.field),
        ["messages"],
      );
      const swapped = await turnstoreError(
        client().importMessages(sessionId, {
          messages: [
            { role: "assistant", content: "an answer first" },
            { role: "user", content: "then the question" },
          ],
        }),
      );
      assert.deepEqual(
        swapped.errors.map((e) => e.field),
        ["messages[0].role", "messages[1].role"],
      );
    });

    it("replays an import sent again with the same idempotency key: same result, nothing new", async () => {
      const sessionId = id("s");
      const key = id("k");
      const first = await client().importMessages(sessionId, { messages: TRANSCRIPT, userId: "alice" }, { idempotencyKey: key });
      const again = await client().importMessages(sessionId, { messages: TRANSCRIPT, userId: "alice" }, { idempotencyKey: key });
      assert.equal(first.replayed, false);
      assert.deepEqual(again, { ...first, replayed: true });
      assert.equal((await client().getSession(sessionId)).turn_count, 2);
      const reused = await turnstoreError(
        client().importMessages(sessionId, { messages: TRANSCRIPT.slice(0, 2), userId: "alice" }, { idempotencyKey: key }),
      );
      assert.equal(reused.status, 422);
      assert.equal(reused.code, "idempotency_key_reused");
      // Without a key of the caller's, each call is its own import.
      const { client: counted, faults } = context.faulty(() => undefined);
      await counted.importMessages(sessionId, { messages: TRANSCRIPT });
      await counted.importMessages(sessionId, { messages: TRANSCRIPT });
      assert.equal(new Set(faults.seen.map((r) => r.headers.get("idempotency-key"))).size, 2);
      assert.equal((await client().getSession(sessionId)).turn_count, 6);
    });

    it("retries an import whose reply was lost: one import, replayed", async () => {
      const sessionId = id("s");
      const { client: lossy, faults } = context.faulty((_, index) => (index === 0 ? { kind: "lose-reply" } : undefined));
      const imported = await lossy.importMessages(sessionId, { messages: TRANSCRIPT });
      assert.equal(imported.replayed, true);
      assert.deepEqual([imported.first_seq, imported.last_seq], [1, 2]);
      const [first, second] = faults.seen;
      assert.ok(first && second && faults.seen.length === 2);
      assert.equal(second.headers.get("idempotency-key"), first.headers.get("idempotency-key"));
      assert.equal((await client().getSession(sessionId)).turn_count, 2);
    });

    it("refuses an import into another user's session (403)", async () => {
      const sessionId = id("s");
      await client().startTurn({ sessionId, userId: "alice", userQuery: "q" });
      const error = await turnstoreError(client().importMessages(sessionId, { messages: TRANSCRIPT, userId: "mallory" }));
      assert.equal(error.status, 403);
      assert.equal(error.code, "session_owner_mismatch");
    });
  });

  describe("distilled import (mode: distill)", () => {
    /** Every turn of the session, as [question, answer]. */
    const kept = async (sessionId: string): Promise<[string, string][]> =>
      (await client().getHistory(sessionId, { format: "turns", limit: 1000 })).turns.map((t) => [
        t.user_query,
        t.final_answer,
      ]);

    it("keeps an OpenAI agent loop's questions and final answers, and reports what it dropped", async () => {
      const sessionId = id("s");
      const userId = id("u");
      const imported = await client().importMessages(sessionId, {
        mode: "distill",
        messages: agentLoop("openai_agent_loop"),
        userId,
      });
      assert.deepEqual(imported, {
        session_id: sessionId,
        user_id: userId,
        imported_turns: 3,
        first_seq: 1,
        last_seq: 3,
        dropped: OPENAI_DROPPED,
        replayed: false,
      });
      assert.deepEqual(await kept(sessionId), [
        [
          "How do I rotate an API key?",
          "Open Settings > API keys and choose Rotate; the old key keeps working for 24 hours.",
        ],
        [
          "And if it leaked?\n\nIt was in a public repository.",
          "Revoke it at once (done),\n\nthen audit the usage log for the last 24 hours.",
        ],
        ["Can you show me the key?", "I can't show secrets; rotate it again to get a new one."],
      ]);
      // The unanswered last question is no pending turn.
      const session = await client().getSession(sessionId);
      assert.deepEqual([session.turn_count, session.pending_count], [3, 0]);
    });

    it("keeps an Anthropic tool loop's questions and final answers; strict imports report nothing", async () => {
      const sessionId = id("s");
      const imported = await client().importMessages(sessionId, {
        mode: "distill",
        messages: agentLoop("anthropic_tool_loop"),
      });
      assert.deepEqual([imported.imported_turns, imported.first_seq, imported.last_seq], [2, 1, 2]);
      assert.deepEqual(imported.dropped, ANTHROPIC_DROPPED);
      assert.deepEqual(await kept(sessionId), [
        ["What's the weather like in San Francisco?", "It's 15 °C in San Francisco, with fog."],
        ["Is this the Golden Gate Bridge?", "Yes: the Golden Gate Bridge, seen from the Marin side."],
      ]);
      // Strict pairs distil to themselves: nothing dropped, [].
      const plain = await client().importMessages(id("s"), { mode: "distill", messages: TRANSCRIPT });
      assert.deepEqual([plain.imported_turns, plain.dropped], [2, []]);
      // A strict import has no report at all, with or without its mode named.
      const strict = await client().importMessages(id("s"), { messages: TRANSCRIPT });
      assert.equal(strict.dropped, undefined);
      assert.ok(!("dropped" in strict));
      const named = await client().importMessages(id("s"), { mode: "strict", messages: TRANSCRIPT });
      assert.equal(named.dropped, undefined);
    });

    it("sends mode only when given: a strict import's body is unchanged", async () => {
      const { client: recorded, faults } = context.faulty(() => undefined);
      await recorded.importMessages(id("s"), { messages: TRANSCRIPT, userId: "alice" });
      await recorded.importMessages(id("s"), { mode: "distill", messages: TRANSCRIPT });
      assert.deepEqual(
        faults.seen.map((r) => JSON.parse(r.body) as unknown),
        [
          { messages: TRANSCRIPT, user_id: "alice" },
          { messages: TRANSCRIPT, mode: "distill" },
        ],
      );
    });

    it("replays a distilled import sent again with its key, report included", async () => {
      const sessionId = id("s");
      const key = id("k");
      const messages = agentLoop("anthropic_tool_loop");
      const first = await client().importMessages(sessionId, { mode: "distill", messages }, { idempotencyKey: key });
      const again = await client().importMessages(sessionId, { mode: "distill", messages }, { idempotencyKey: key });
      assert.equal(first.replayed, false);
      assert.deepEqual(again, { ...first, replayed: true });
      assert.deepEqual(again.dropped, ANTHROPIC_DROPPED);
      assert.equal((await client().getSession(sessionId)).turn_count, 2);
      // The same key with other messages is another request.
      const reused = await turnstoreError(
        client().importMessages(sessionId, { mode: "distill", messages: messages.slice(0, -1) }, { idempotencyKey: key }),
      );
      assert.equal(reused.code, "idempotency_key_reused");
    });

    it("names every malformed message by its index, writing nothing", async () => {
      const sessionId = id("s");
      const malformed = JSON.parse(
        JSON.stringify([
          "hello",
          { content: "no role" },
          { role: "user", content: 42 },
          { role: "wizard", content: "hi" },
          { role: "user", content: [{ text: "no type" }] },
          { role: "user", content: [{ type: "text" }] },
        ]),
      ) as TranscriptMessage[];
      const error = await turnstoreError(client().importMessages(sessionId, { mode: "distill", messages: malformed }));
      assert.equal(error.status, 422);
      assert.equal(error.code, "validation_failed");
      assert.deepEqual(
        error.errors.map((e) => e.field),
        [
          "messages[0]",
          "messages[1].role",
          "messages[2].content",
          "messages[3].role",
          "messages[4].content",
          "messages[5].content",
        ],
      );
      assert.equal(error.attempts, 1);
      // Nothing to import: instructions, and a question without its answer.
      const nothing = await turnstoreError(
        client().importMessages(sessionId, {
          mode: "distill",
          messages: [
            { role: "system", content: "s" },
            { role: "user", content: "q" },
          ],
        }),
      );
      assert.deepEqual(
        nothing.errors.map((e) => e.field),
        ["messages"],
      );
      assert.equal((await turnstoreError(client().getSession(sessionId))).code, "session_not_found");
      // A mode the server does not know is named too.
      const fuzzy = JSON.parse(JSON.stringify({ mode: "fuzzy", messages: TRANSCRIPT })) as ImportInput;
      const unknown = await turnstoreError(client().importMessages(sessionId, fuzzy));
      assert.deepEqual(
        unknown.errors.map((e) => e.field),
        ["mode"],
      );
    });

    it("takes the messages' timestamps as the turns' times", async () => {
      const sessionId = id("s");
      const imported = await client().importMessages(sessionId, {
        mode: "distill",
        messages: [
          { role: "system", content: "Be brief.", timestamp: "2026-11-20T08:59:00Z" },
          { role: "user", content: "Hello?", timestamp: "2026-11-20T09:00:00Z" },
          { role: "assistant", content: "Hi!", timestamp: "2026-11-20T10:00:04.250+01:00" },
          { role: "user", content: "Bye.", timestamp: "2026-11-20T09:05:00Z" },
          { role: "assistant", content: "Goodbye.", timestamp: "2026-11-20T09:05:00.5Z" },
        ],
      });
      assert.deepEqual(imported.dropped, [{ reason: "instructions", count: 1, first_indexes: [0] }]);
      const { turns } = await client().getHistory(sessionId, { format: "turns" });
      assert.deepEqual(
        turns.map((t) => [t.user_query, t.started_at, t.finalized_at]),
        [
          ["Hello?", "2026-11-20T09:00:00.000Z", "2026-11-20T09:00:04.250Z"],
          ["Bye.", "2026-11-20T09:05:00.000Z", "2026-11-20T09:05:00.500Z"],
        ],
      );
      // Times given for one exchange only: named, and nothing is written.
      const partial = id("s");
      const error = await turnstoreError(
        client().importMessages(partial, {
          mode: "distill",
          messages: [
            { role: "user", content: "q1", timestamp: "2026-11-20T09:00:00Z" },
            { role: "assistant", content: "a1", timestamp: "2026-11-20T09:00:01Z" },
            { role: "user", content: "q2" },
            { role: "assistant", content: "a2" },
          ],
        }),
      );
      assert.ok(
        error.errors.some((e) => e.field === "messages[2].timestamp"),
        JSON.stringify(error.errors),
      );
      assert.equal((await turnstoreError(client().getSession(partial))).code, "session_not_found");
    });
  });

  describe("export", () => {
    /** A user with `count` sessions of two imported turns each. */
    const userWithSessions = async (count: number): Promise<string> => {
      const userId = id("u");
      for (let i = 0; i < count; i += 1) {
        await client().importMessages(id("s"), { messages: TRANSCRIPT, userId });
      }
      return userId;
    };

    it("exports a user's sessions in the sessions-list order, with their turns and summary", async () => {
      const userId = id("u");
      const translated = id("s");
      const first = await client().startTurn({ sessionId: translated, userId, userQuery: "Frage", userQueryEn: "Question" });
      await client().finalizeTurn(translated, first.turn_id, { finalAnswer: "Antwort", finalAnswerEn: "Answer" });
      await client().startTurn({ sessionId: translated, userQuery: "pending, not exported" });
      const summarized = id("s");
      await client().importMessages(summarized, { messages: TRANSCRIPT, userId });
      await client().putSummary(summarized, { summary: "About vector indexes.", throughSeq: 1 });
      const empty = id("s");
      await client().startTurn({ sessionId: empty, userId, userQuery: "only pending" });

      const listed: string[] = [];
      for await (const session of client().iterateUserSessions(userId)) listed.push(session.session_id);
      const exported = await drain(client().exportUser(userId));
      assert.deepEqual(
        exported.map((s) => s.session_id),
        listed,
      );
      assert.deepEqual(new Set(listed), new Set([translated, summarized, empty]));
      for (const session of exported) {
        const meta = await client().getSession(session.session_id);
        assert.equal(session.created_at, meta.created_at);
        assert.equal(session.last_active_at, meta.last_active_at);
        const stored = await client().getHistory(session.session_id, { format: "turns", limit: 10_000, max_tokens: 10_000_000 });
        assert.deepEqual(session.turns, stored.turns);
      }
      const byId = new Map(exported.map((s) => [s.session_id, s]));
      assert.deepEqual(byId.get(summarized)?.summary, await client().getSummary(summarized));
      assert.equal(byId.get(translated)?.summary, undefined);
      assert.deepEqual(
        byId.get(translated)?.turns.map((t) => [t.user_query_en, t.final_answer_en]),
        [["Question", "Answer"]],
      );
      assert.deepEqual(byId.get(empty)?.turns, []);
      assert.deepEqual(
        byId.get(summarized)?.turns.map((t) => t.seq),
        [1, 2],
      );
    });

    it("exports nothing for an unknown user, and reports an invalid user id as 422", async () => {
      assert.deepEqual(await drain(client().exportUser(id("u"))), []);
      const error = await turnstoreError(drain(client().exportUser("not an id!")));
      assert.equal(error.status, 422);
      assert.deepEqual(
        error.errors.map((e) => e.field),
        ["user_id"],
      );
    });

    it("retries the request until its status arrives", async () => {
      const userId = await userWithSessions(2);
      const { client: flaky, faults } = context.faulty((_, index) =>
        index === 0 ? problem(503, "overloaded") : undefined,
      );
      assert.equal((await drain(flaky.exportUser(userId))).length, 2);
      assert.equal(faults.seen.length, 2);
    });

    it("throws export_incomplete when the server cuts a large export at TURNSTORE_EXPORT_TIMEOUT", async () => {
      const cutting = await context.startBackend({ TURNSTORE_EXPORT_TIMEOUT: "1s" });
      try {
        const exporter = new TurnstoreClient({ baseUrl: cutting.baseUrl });
        const userId = id("u");
        // About 31 MB: far more than the socket buffers between server and
        // client hold, so the server is still writing when its timeout strikes.
        const sessions = 32;
        // Words, not one repeated character: tokenizing long runs is slow.
        const answer = "lorem ipsum dolor sit amet ".repeat(5_000).slice(0, 120_000);
        for (let i = 0; i < sessions; i += 1) {
          const messages: ImportMessage[] = [];
          for (let j = 0; j < 8; j += 1) {
            messages.push({ role: "user", content: `q${j}` }, { role: "assistant", content: answer });
          }
          await exporter.importMessages(`big-${i}-${id("s")}`, { messages, userId });
        }
        const { seen, error } = await drainUntilError(exporter.exportUser(userId), async (count) => {
          // Stall after the first session, well past the server's timeout.
          if (count === 1) await sleep(2_500);
        });
        assert.equal(error.code, "export_incomplete", error.message);
        assert.equal(error.status, 200);
        assert.ok(seen.length >= 1 && seen.length < sessions, `${seen.length} sessions before the cut`);
        for (const session of seen) assert.equal(session.turns.length, 8);
      } finally {
        await cutting.stop();
      }
    });

    it("throws export_incomplete, never a partial session, when the body ends inside a line", async () => {
      const userId = await userWithSessions(3);
      // Cut off the final newline only, then half of the last line too.
      for (const cut of [1, 40]) {
        const { client: cutting } = context.faulty(() => ({
          kind: "rewrite",
          rewrite: async (response) => new Response((await response.text()).slice(0, -cut), { headers: ndjsonHeaders(response) }),
        }));
        const { seen, error } = await drainUntilError(cutting.exportUser(userId));
        assert.equal(error.code, "export_incomplete");
        assert.match(error.detail, /inside a line/);
        assert.equal(seen.length, 2);
        assert.ok(error.requestId, "the error carries the export's request id");
      }
    });

    it("throws export_incomplete when the connection breaks mid-body", async () => {
      const userId = await userWithSessions(3);
      const reset = new TypeError("terminated", { cause: new Error("other side closed (simulated)") });
      const { client: broken } = context.faulty(() => ({
        kind: "rewrite",
        rewrite: async (response) => {
          const text = await response.text();
          const firstLine = text.indexOf("\n") + 1;
          // The first line and a bit of the next, then the reset.
          let sent = false;
          const body = new ReadableStream<Uint8Array>({
            pull(controller) {
              if (sent) {
                controller.error(reset);
                return;
              }
              sent = true;
              controller.enqueue(new TextEncoder().encode(text.slice(0, firstLine + 10)));
            },
          });
          return new Response(body, { headers: ndjsonHeaders(response) });
        },
      }));
      const { seen, error } = await drainUntilError(broken.exportUser(userId));
      assert.equal(error.code, "export_incomplete");
      assert.equal(error.cause, reset);
      assert.match(error.detail, /terminated: other side closed/);
      assert.equal(seen.length, 1);
    });

    it("throws export_incomplete when no data comes for timeoutMs while reading", async () => {
      const userId = await userWithSessions(2);
      const { client: stalled } = context.faulty(
        () => ({
          kind: "rewrite",
          rewrite: async (response) => {
            const text = await response.text();
            const firstLine = text.indexOf("\n") + 1;
            // One line, then silence: a connection that hangs.
            const body = new ReadableStream<Uint8Array>({
              start(controller) {
                controller.enqueue(new TextEncoder().encode(text.slice(0, firstLine)));
              },
            });
            return new Response(body, { headers: ndjsonHeaders(response) });
          },
        }),
        { timeoutMs: 300 },
      );
      const { seen, error } = await drainUntilError(stalled.exportUser(userId));
      assert.equal(error.code, "export_incomplete");
      assert.match(error.detail, /no data for 300 ms/);
      assert.equal(seen.length, 1);
    });

    it("reports a line that is not a session as unexpected_response", async () => {
      const { client: garbled } = context.faulty(() => ({
        kind: "rewrite",
        rewrite: async (response) => new Response('{"session_id":"s","turns":[]}\nnot json\n', { headers: ndjsonHeaders(response) }),
      }));
      const { seen, error } = await drainUntilError(garbled.exportUser(id("u")));
      assert.equal(error.code, "unexpected_response");
      assert.equal(seen.length, 1);
    });

    it("stops with the caller's reason when the signal aborts mid-export", async () => {
      const userId = await userWithSessions(3);
      const controller = new AbortController();
      const seen: ExportedSession[] = [];
      await assert.rejects(
        (async () => {
          for await (const session of client().exportUser(userId, { signal: controller.signal })) {
            seen.push(session);
            controller.abort(new Error("caller gave up"));
          }
        })(),
        /caller gave up/,
      );
      assert.equal(seen.length, 1);
    });
  });

  describe("export as transcripts (format=messages)", () => {
    /** A transcript's messages as an exported session's turns make them. */
    const asMessages = (session: ExportedSession): ExportedTranscript => {
      const { turns, ...rest } = session;
      return {
        ...rest,
        messages: turns.flatMap((t) => [
          { role: "user" as const, content: t.user_query, timestamp: t.started_at },
          { role: "assistant" as const, content: t.final_answer, timestamp: t.finalized_at },
        ]),
      };
    };
    /** Every turn of a session: question, answer and times. */
    const turnsOf = async (sessionId: string): Promise<string[][]> =>
      (await client().getHistory(sessionId, { format: "turns", limit: 1_000 })).turns.map((t) => [
        t.user_query,
        t.final_answer,
        t.started_at,
        t.finalized_at,
      ]);

    it("exports the sessions of exportUser, in its order, their turns as messages at the turns' times", async () => {
      const userId = id("u");
      const timed = id("s");
      await client().importMessages(timed, {
        mode: "distill",
        userId,
        messages: [
          { role: "user", content: "Hello?", timestamp: "2026-11-20T09:00:00Z" },
          { role: "assistant", content: "Hi.", timestamp: "2026-11-20T09:00:04.250Z" },
          { role: "user", content: "Bye.", timestamp: "2026-11-20T10:05:00+01:00" },
          { role: "assistant", content: "Goodbye.", timestamp: "2026-11-20T09:05:00.5Z" },
        ],
      });
      const summary = await client().putSummary(timed, { summary: "Greetings.", throughSeq: 1 });
      const live = id("s");
      const started = await client().startTurn({ sessionId: live, userId, userQuery: "Wie?", userQueryEn: "How?" });
      await client().finalizeTurn(live, started.turn_id, { finalAnswer: "So.", finalAnswerEn: "Like so." });
      await client().startTurn({ sessionId: live, userQuery: "pending, not exported" });
      const pendingOnly = id("s");
      await client().startTurn({ sessionId: pendingOnly, userId, userQuery: "only pending" });

      const transcripts = await drain(client().exportTranscripts(userId));
      const sessions = await drain(client().exportUser(userId));
      assert.deepEqual(transcripts, sessions.map(asMessages));
      const byId = new Map(transcripts.map((t) => [t.session_id, t]));
      assert.deepEqual(new Set(byId.keys()), new Set([timed, live, pendingOnly]));
      assert.deepEqual(byId.get(timed)?.summary, summary);
      assert.deepEqual(byId.get(timed)?.messages, [
        { role: "user", content: "Hello?", timestamp: "2026-11-20T09:00:00.000Z" },
        { role: "assistant", content: "Hi.", timestamp: "2026-11-20T09:00:04.250Z" },
        { role: "user", content: "Bye.", timestamp: "2026-11-20T09:05:00.000Z" },
        { role: "assistant", content: "Goodbye.", timestamp: "2026-11-20T09:05:00.500Z" },
      ]);
      // The originals, not the English copies; no summary, no key.
      assert.deepEqual(
        byId.get(live)?.messages.map((m) => [m.role, m.content]),
        [
          ["user", "Wie?"],
          ["assistant", "So."],
        ],
      );
      assert.equal("summary" in (byId.get(live) ?? {}), false);
      assert.deepEqual(byId.get(pendingOnly)?.messages, []);
      assert.deepEqual(await drain(client().exportTranscripts(id("u"))), []);
    });

    it("imports back as it was: each transcript's messages, with mode distill, make the same turns at the same times", async () => {
      const userId = id("u");
      const copies = id("u");
      const timed = id("s");
      await client().importMessages(timed, {
        mode: "distill",
        userId,
        messages: [
          { role: "user", content: "q1", timestamp: "2026-11-20T09:00:00Z" },
          { role: "assistant", content: "a1", timestamp: "2026-11-20T09:00:01.5Z" },
          { role: "user", content: "q2", timestamp: "2026-11-20T09:01:00.001Z" },
          { role: "assistant", content: "a2", timestamp: "2026-11-20T09:01:00.001Z" },
        ],
      });
      const live = id("s");
      let last = "";
      for (const n of [1, 2, 3]) {
        const started = await client().startTurn({ sessionId: live, userId, userQuery: `live q${n}` });
        await client().finalizeTurn(live, started.turn_id, `live a${n}`);
        last = started.turn_id;
      }
      await client().regenerateTurn(live, last, "live a3, again");

      const copied = new Map<string, string>();
      for await (const { session_id, messages } of client().exportTranscripts(userId)) {
        const copy = id("s");
        const imported = await client().importMessages(copy, { mode: "distill", messages, userId: copies });
        assert.deepEqual([imported.imported_turns, imported.dropped], [messages.length / 2, []]);
        copied.set(session_id, copy);
      }
      assert.deepEqual(new Set(copied.keys()), new Set([timed, live]));
      for (const [original, copy] of copied) assert.deepEqual(await turnsOf(copy), await turnsOf(original));
      assert.deepEqual((await turnsOf(copied.get(live) ?? "")).at(-1)?.slice(0, 2), ["live q3", "live a3, again"]);
    });

    it("asks for format=messages (exportUser for no format), and refuses a line of sessions", async () => {
      const userId = id("u");
      await client().importMessages(id("s"), { messages: TRANSCRIPT, userId });
      const queries: string[] = [];
      const watching = new TurnstoreClient({
        baseUrl: context.baseUrl,
        fetch: (request) => {
          queries.push(new URL(request.url).search);
          return fetch(request);
        },
      });
      assert.equal((await drain(watching.exportTranscripts(userId))).length, 1);
      assert.equal((await drain(watching.exportUser(userId))).length, 1);
      assert.deepEqual(queries, ["?format=messages", ""]);

      const { client: garbled } = context.faulty(() => ({
        kind: "rewrite",
        rewrite: async (response) =>
          new Response('{"session_id":"s","turns":[]}\n', { headers: ndjsonHeaders(response) }),
      }));
      const { seen, error } = await drainUntilError(garbled.exportTranscripts(userId));
      assert.equal(error.code, "unexpected_response");
      assert.match(error.detail, /not a transcript \(session_id, messages\)/);
      assert.equal(seen.length, 0);
    });

    it("throws export_incomplete after the whole transcripts when the body ends inside a line", async () => {
      const userId = id("u");
      for (let i = 0; i < 3; i += 1) await client().importMessages(id("s"), { messages: TRANSCRIPT, userId });
      const { client: cutting } = context.faulty(() => ({
        kind: "rewrite",
        rewrite: async (response) => new Response((await response.text()).slice(0, -40), { headers: ndjsonHeaders(response) }),
      }));
      const { seen, error } = await drainUntilError(cutting.exportTranscripts(userId));
      assert.equal(error.code, "export_incomplete");
      assert.equal(error.status, 200);
      assert.equal(seen.length, 2);
      for (const transcript of seen) assert.equal(transcript.messages.length, 4);
    });
  });
}

/** The headers of a rewritten export: its type and request id. */
function ndjsonHeaders(response: Response): Record<string, string> {
  return {
    "content-type": response.headers.get("content-type") ?? "",
    "x-request-id": response.headers.get("x-request-id") ?? "",
  };
}
