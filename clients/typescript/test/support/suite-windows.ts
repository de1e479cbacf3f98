// The behaviour tests of prompt-cache-friendly histories (stable windows,
// breakpoints, the anthropic format and anthropicRequest), run inside
// clientSuite against the real binary on each store.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { type TurnstoreClient, anthropicRequest } from "turnstore-client";
import { id, turnstoreError } from "./assertions.js";
import type { SuiteContext } from "./suite-v11.js";

const SUMMARY_PREFIX = "Summary of the conversation so far:\n";
const EPHEMERAL = { type: "ephemeral" } as const;
/** A stable window of 5 turns at most, in blocks of 3. */
const STABLE = { format: "turns", limit: 5, window: "stable", stride: 3 } as const;

/** Answers 1 to n. */
const answers = (n: number): string[] => Array.from({ length: n }, (_, i) => `answer ${i + 1}`);

export function windowSuites(context: SuiteContext): void {
  const client = (): TurnstoreClient => context.client;

  describe("stable windows", () => {
    it("keep the first turn of a growing conversation until a stride boundary", async () => {
      const sessionId = id("s");
      const firsts: number[] = [];
      let previous: number[] | undefined;
      for (let n = 1; n <= 14; n += 1) {
        const started = await client().startTurn({ sessionId, userQuery: `question ${n}` });
        await client().finalizeTurn(sessionId, started.turn_id, `answer ${n}`);
        const history = await client().getHistory(sessionId, STABLE);
        const shown = history.turns.map((t) => t.seq);
        const sliding = await client().getHistory(sessionId, { format: "turns", limit: 5 });
        // The sliding window without its oldest turns: at most stride - 1 of them.
        const leftOut = history.window.left_out;
        assert.deepEqual(shown, sliding.turns.map((t) => t.seq).slice(leftOut));
        assert.ok(leftOut < 3, `${leftOut}`);
        assert.deepEqual(history.window, { stride: 3, from_seq: shown[0], left_out: leftOut });
        if (leftOut > 0) assert.equal(((shown[0] ?? 0) - 1) % 3, 0, `${shown}`);
        // A read that begins where the last one did holds it whole, then the new turn.
        if (previous?.[0] === shown[0]) assert.deepEqual(shown, [...(previous ?? []), n]);
        assert.deepEqual(history.breakpoint, { seq: n });
        firsts.push(shown[0] ?? 0);
        previous = shown;
      }
      // Turns 1 to 5 all fit; then the first turn moves by a stride, every third read.
      assert.deepEqual(firsts, [1, 1, 1, 1, 1, 4, 4, 4, 7, 7, 7, 10, 10, 10]);
      const sliding = await client().getHistory(sessionId, { limit: 5 });
      assert.equal("window" in sliding || "breakpoint" in sliding, false);
    });

    it("are the same in a start and in the text/plain rendering", async () => {
      const sessionId = await context.sessionWith(answers(9));
      const read = await client().getHistory(sessionId, STABLE);
      const started = await client().startTurn({ sessionId, userQuery: "question 10", history: STABLE });
      assert.deepEqual(
        started.history.turns.map((t) => t.seq),
        [7, 8, 9],
      );
      assert.deepEqual(started.history.window, read.window);
      assert.deepEqual(read.window, { stride: 3, from_seq: 7, left_out: 2 });
      await client().abortTurn(sessionId, started.turn_id);

      const text = await client().getHistory(sessionId, { limit: 5, window: "stable", stride: 3 });
      assert.equal(text.breakpoint?.bytes, Buffer.byteLength(text.rendered));
      const plain = await client().getHistoryText(sessionId, { limit: 5, window: "stable", stride: 3 });
      assert.equal(plain.text, text.rendered);
      assert.equal(plain.tokenCount, text.token_count);
    });
  });

  describe("the anthropic format", () => {
    it("returns the Messages API's blocks, marked with cache_control: true", async () => {
      const sessionId = await context.sessionWith(answers(3));
      const plain = await client().getHistory(sessionId, { format: "anthropic" });
      assert.equal(plain.format, "anthropic");
      assert.deepEqual(plain.anthropic, {
        messages: [1, 2, 3].flatMap((n) => [
          { role: "user", content: [{ type: "text", text: `question ${n}` }] },
          { role: "assistant", content: [{ type: "text", text: `answer ${n}` }] },
        ]),
      });
      assert.equal("messages" in plain || "breakpoint" in plain || "window" in plain, false);
      // Budgeted as the messages format is.
      assert.equal(plain.token_count, (await client().getHistory(sessionId, { format: "messages" })).token_count);

      await client().putSummary(sessionId, { summary: "Asked three questions.", throughSeq: 1 });
      const marked = await client().getHistory(sessionId, { format: "anthropic", summary: true, cache_control: true });
      assert.deepEqual(marked.anthropic.system, [
        { type: "text", text: `${SUMMARY_PREFIX}Asked three questions.`, cache_control: EPHEMERAL },
      ]);
      const listed = marked.anthropic.messages;
      assert.deepEqual(
        listed.map((m) => m.role),
        ["user", "assistant", "user", "assistant"],
      );
      // The one mark of the messages: on the last block of the last message.
      assert.deepEqual(listed.at(-1)?.content, [{ type: "text", text: "answer 3", cache_control: EPHEMERAL }]);
      assert.ok(listed.slice(0, -1).every((m) => m.content.every((b) => !("cache_control" in b))));
      assert.deepEqual(marked.breakpoint, { seq: 3, messages: 4 });

      // An empty history: no messages, no breakpoint.
      const empty = await client().getHistory(id("s"), { format: "anthropic", cache_control: true });
      assert.deepEqual(empty.anthropic, { messages: [] });
      assert.equal(empty.breakpoint, null);
    });

    it("anthropicRequest appends the question, after the system prompt and the summary", async () => {
      const sessionId = await context.sessionWith(["A graph index."]);
      const history = await client().getHistory(sessionId, { format: "anthropic", cache_control: true });
      const request = anthropicRequest({ history, userQuery: "question 2" });
      assert.deepEqual(request, {
        messages: [
          { role: "user", content: [{ type: "text", text: "question 1" }] },
          { role: "assistant", content: [{ type: "text", text: "A graph index.", cache_control: EPHEMERAL }] },
          { role: "user", content: [{ type: "text", text: "question 2" }] },
        ],
      });
      // Fresh objects: changing the request leaves the history as it was.
      const first = request.messages[0]?.content[0];
      if (first) first.text = "changed";
      assert.equal(history.anthropic.messages[0]?.content[0]?.text, "question 1");
      assert.equal(history.anthropic.messages.length, 2);

      await client().putSummary(sessionId, { summary: "Asked about HNSW.", throughSeq: 1 });
      const done = await client().turn(
        { sessionId, userQuery: "question 2", history: { format: "anthropic", summary: true } },
        (turn) => {
          const built = anthropicRequest({ system: "Be brief.", history: turn.history, userQuery: turn.userQuery });
          assert.deepEqual(built.system, [
            { type: "text", text: "Be brief." },
            { type: "text", text: `${SUMMARY_PREFIX}Asked about HNSW.` },
          ]);
          // Its `anthropic` field will do too; an empty system prompt is none.
          assert.deepEqual(anthropicRequest({ system: "", history: turn.history.anthropic, userQuery: "q" }), {
            system: [{ type: "text", text: `${SUMMARY_PREFIX}Asked about HNSW.` }],
            messages: [{ role: "user", content: [{ type: "text", text: "q" }] }],
          });
          return `${built.messages.length} messages`;
        },
      );
      assert.equal(done.turn.final_answer, "1 messages");

      const messages = await client().getHistory(sessionId, { format: "messages" });
      assert.throws(
        () => anthropicRequest({ history: messages, userQuery: "q" }),
        /anthropic format, got format "messages"/,
      );
    });
  });

  describe("window and cache_control errors", () => {
    it("are 422 validation_failed naming the field; a start writes nothing", async () => {
      const sessionId = id("s");
      const cases: [query: Record<string, unknown>, field: string][] = [
        [{ stride: 3 }, "stride"],
        [{ window: "stable", stride: 0 }, "stride"],
        [{ window: "stable", stride: 10_001 }, "stride"],
        [{ cache_control: true }, "cache_control"],
        [{ format: "messages", cache_control: true }, "cache_control"],
        [{ format: "anthropic", template: "xml" }, "format"],
        [{ window: "fixed" }, "window"],
      ];
      for (const [query, field] of cases) {
        // As untyped data might hold them: the types rule these out.
        const error = await turnstoreError(client().getHistory(sessionId, query as never));
        assert.equal(error.status, 422);
        assert.equal(error.code, "validation_failed");
        assert.ok(
          error.errors.some((e) => e.field === field),
          `${JSON.stringify(query)}: ${JSON.stringify(error.errors)}`,
        );
      }
      const start = await turnstoreError(
        // @ts-expect-error stride needs window: "stable"
        client().startTurn({ sessionId, userQuery: "q", history: { stride: 2 } }),
      );
      assert.deepEqual(
        start.errors.map((e) => e.field),
        ["history.stride"],
      );
      const after = await client().getHistory(sessionId);
      assert.deepEqual([after.total_turns, after.pending_turns], [0, 0]);
    });
  });
}
