// The behaviour tests of API v1.1 (translations, summaries, templates,
// chat templates, import and export), run inside clientSuite against the
// real binary on each store.
import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import {
  type ExportedSession,
  type ImportMessage,
  TurnstoreClient,
  type TurnstoreClientOptions,
  type TurnstoreError,
} from "turnstore-client";
import { id, turnstoreError } from "./assertions.js";
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
async function drain(sessions: AsyncIterable<ExportedSession>): Promise<ExportedSession[]> {
  const seen: ExportedSession[] = [];
  for await (const session of sessions) seen.push(session);
  return seen;
}

/** The sessions an export yields before it throws, and the TurnstoreError it throws. */
async function drainUntilError(
  sessions: AsyncIterable<ExportedSession>,
  onSession: (seen: number) => Promise<void> | void = () => undefined,
): Promise<{ seen: ExportedSession[]; error: TurnstoreError }> {
  const seen: ExportedSession[] = [];
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
}

/** The headers of a rewritten export: its type and request id. */
function ndjsonHeaders(response: Response): Record<string, string> {
  return {
    "content-type": response.headers.get("content-type") ?? "",
    "x-request-id": response.headers.get("x-request-id") ?? "",
  };
}
