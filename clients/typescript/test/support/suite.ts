// The behaviour tests, run against the real binary once per store
// (client.memory.test.ts, client.redis.test.ts).
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { type HistoryResponse, TurnstoreClient, type TurnstoreClientOptions } from "turnstore-client";
import { UUID, id, turnstoreError } from "./assertions.js";
import { type Fault, FaultyFetch, problem } from "./faults.js";
import { type SuiteContext, v11Suites, writeTemplates } from "./suite-v11.js";
import { windowSuites } from "./suite-windows.js";

export interface Backend {
  baseUrl: string;
  stop(): Promise<void>;
}

/** Starts the server on the store under test, with these settings added to the suite's. */
export type StartBackend = (env: Record<string, string>) => Promise<Backend>;

/** Server settings the suite relies on (passed to startTurnstore). */
export const SUITE_SERVER_ENV = {
  // Small enough to reach in a test, large enough for every other test's
  // sessions (none holds more than 3 pending turns).
  TURNSTORE_MAX_PENDING_TURNS: "4",
} as const;

export function clientSuite(store: string, startBackend: StartBackend): void {
  describe(`TurnstoreClient against the real server (${store} store)`, () => {
    let backend: Backend;
    let client: TurnstoreClient;
    /** TURNSTORE_TEMPLATES_DIR of the suite's server. */
    let templatesDir: string | undefined;
    /** A client whose requests go through a FaultyFetch following `plan`. */
    const faulty = (
      plan: (request: { method: string; path: string }, index: number) => Fault | undefined,
      options: Partial<TurnstoreClientOptions> = {},
    ): { client: TurnstoreClient; faults: FaultyFetch } => {
      const faults = new FaultyFetch(plan);
      return {
        faults,
        client: new TurnstoreClient({
          baseUrl: backend.baseUrl,
          fetch: faults.fetch,
          retryBaseDelayMs: 1,
          retryMaxDelayMs: 5,
          ...options,
        }),
      };
    };
    /** A session holding finalized turns (question i / answer i). */
    const sessionWith = async (answers: string[]): Promise<string> => {
      const sessionId = id("s");
      for (const [i, answer] of answers.entries()) {
        const started = await client.startTurn({ sessionId, userQuery: `question ${i + 1}` });
        await client.finalizeTurn(sessionId, started.turn_id, answer);
      }
      return sessionId;
    };

    before(async () => {
      templatesDir = mkdtempSync(join(tmpdir(), "turnstore-templates-"));
      writeTemplates(templatesDir);
      backend = await startBackend({ ...SUITE_SERVER_ENV, TURNSTORE_TEMPLATES_DIR: templatesDir });
      client = new TurnstoreClient({ baseUrl: backend.baseUrl });
    });
    after(async () => {
      await backend?.stop();
      if (templatesDir) rmSync(templatesDir, { recursive: true, force: true });
    });

    const context: SuiteContext = {
      get baseUrl() {
        return backend.baseUrl;
      },
      get client() {
        return client;
      },
      faulty: (plan, options) => faulty(plan, options),
      sessionWith: (answers) => sessionWith(answers),
      startBackend: (env) => startBackend({ ...SUITE_SERVER_ENV, ...env }),
    };

    describe("turns", () => {
      it("starts a turn in a session the client names when the caller gives none", async () => {
        const started = await client.startTurn({ userQuery: "What is a vector index?" });
        assert.match(started.session_id, UUID);
        assert.match(started.turn_id, UUID);
        assert.equal(started.seq, 1);
        assert.equal(started.replayed, false);
        assert.equal(started.history, undefined);
        const session = await client.getSession(started.session_id);
        assert.equal(session.pending_count, 1);
      });

      it("returns the history before the turn, in the format asked for", async () => {
        const sessionId = await sessionWith(["answer 1"]);
        const started = await client.startTurn({
          sessionId,
          userId: id("u"),
          userQuery: "question 2",
          history: { format: "messages", limit: 20, max_tokens: 2000, model: "gpt-4o" },
        });
        assert.equal(started.seq, 2);
        assert.equal(started.history.format, "messages");
        assert.deepEqual(started.history.messages, [
          { role: "user", content: "question 1" },
          { role: "assistant", content: "answer 1" },
        ]);
        assert.equal(started.history.pending_turns, 0);
        assert.equal(started.history.encoding, "o200k_base");
      });

      it("finalizes a turn, and again with the same answer, but not with another", async () => {
        const started = await client.startTurn({ sessionId: id("s"), userQuery: "q" });
        const first = await client.finalizeTurn(started.session_id, started.turn_id, "a");
        assert.equal(first.session_id, started.session_id);
        assert.equal(first.turn.turn_id, started.turn_id);
        assert.equal(first.turn.seq, 1);
        assert.equal(first.turn.user_query, "q");
        assert.equal(first.turn.final_answer, "a");
        assert.equal(first.turn.truncated, false);
        const again = await client.finalizeTurn(started.session_id, started.turn_id, "a");
        assert.deepEqual(again, first);
        const error = await turnstoreError(client.finalizeTurn(started.session_id, started.turn_id, "b"));
        assert.equal(error.status, 409);
        assert.equal(error.code, "turn_already_finalized");
      });

      it("puts turns in the history by seq, not by finalize order", async () => {
        const sessionId = id("s");
        const one = await client.startTurn({ sessionId, userQuery: "q1" });
        const two = await client.startTurn({ sessionId, userQuery: "q2" });
        assert.equal(two.seq, 2);
        await client.finalizeTurn(sessionId, two.turn_id, "a2");
        await client.finalizeTurn(sessionId, one.turn_id, "a1");
        const history = await client.getHistory(sessionId, { format: "turns" });
        assert.deepEqual(
          history.turns.map((t) => [t.seq, t.final_answer]),
          [
            [1, "a1"],
            [2, "a2"],
          ],
        );
      });

      it("aborts a pending turn and deletes a finalized one", async () => {
        const sessionId = await sessionWith(["a1"]);
        const pending = await client.startTurn({ sessionId, userQuery: "q2" });
        await client.abortTurn(sessionId, pending.turn_id);
        assert.equal((await client.getSession(sessionId)).pending_count, 0);
        const [first] = (await client.getHistory(sessionId, { format: "turns" })).turns;
        assert.ok(first);
        await client.abortTurn(sessionId, first.turn_id);
        assert.equal((await client.getHistory(sessionId)).total_turns, 0);
        const error = await turnstoreError(client.abortTurn(sessionId, first.turn_id));
        assert.equal(error.status, 404);
        assert.equal(error.code, "turn_not_found");
      });
    });

    describe("history", () => {
      let sessionId: string;
      before(async () => {
        sessionId = await sessionWith(["answer one", "answer two", "answer three"]);
      });

      it("renders text by default, exactly as API.md specifies", async () => {
        const history = await client.getHistory(sessionId);
        assert.equal(history.format, "text");
        assert.equal(
          history.rendered,
          "### Conversation history:\n" +
            "User: question 1\nAssistant: answer one\n\n" +
            "User: question 2\nAssistant: answer two\n\n" +
            "User: question 3\nAssistant: answer three",
        );
        assert.equal(history.total_turns, 3);
        assert.equal(history.included_turns, 3);
        assert.equal(history.stopped_by, null);
        assert.ok(history.token_count > 0);
      });

      it("selects with limit, keep_first, after_seq and through_seq", async () => {
        const seqs = (h: HistoryResponse): number[] => (h.turns ?? []).map((t) => t.seq);
        const limited = await client.getHistory(sessionId, { format: "turns", limit: 1 });
        assert.deepEqual(seqs(limited), [3]);
        assert.equal(limited.stopped_by, "limit");
        assert.equal(limited.omitted_turns, 2);
        const first = await client.getHistory(sessionId, { format: "turns", limit: 1, keep_first: true });
        assert.deepEqual(seqs(first), [1]);
        const range = await client.getHistory(sessionId, { format: "turns", after_seq: 1, through_seq: 2 });
        assert.deepEqual(seqs(range), [2]);
        assert.equal(range.total_turns, 1);
      });

      it("budgets with max_tokens and truncates with max_query_chars / max_answer_chars", async () => {
        const none = await client.getHistory(sessionId, { max_tokens: 0 });
        assert.equal(none.included_turns, 0);
        assert.equal(none.token_count, 0);
        assert.equal(none.stopped_by, "max_tokens");
        assert.equal(none.rendered, "");
        const cut = await client.getHistory(sessionId, {
          format: "turns",
          max_query_chars: 4,
          max_answer_chars: 6,
        });
        const [turn] = cut.turns;
        assert.ok(turn);
        assert.equal(turn.user_query, "ques [truncated]");
        assert.equal(turn.final_answer, "answer [truncated]");
        assert.equal(turn.truncated, true);
      });

      it("counts with the encoding asked for, directly or through a model", async () => {
        assert.equal((await client.getHistory(sessionId, { encoding: "cl100k_base" })).encoding, "cl100k_base");
        assert.equal((await client.getHistory(sessionId, { model: "gpt-4" })).encoding, "cl100k_base");
        assert.equal((await client.getHistory(sessionId, { model: "gpt-4o" })).encoding, "o200k_base");
      });

      it("returns the text rendering alone with its token count (Accept: text/plain)", async () => {
        const json = await client.getHistory(sessionId, { limit: 2, encoding: "cl100k_base" });
        const text = await client.getHistoryText(sessionId, { limit: 2, encoding: "cl100k_base" });
        assert.equal(text.text, json.rendered);
        assert.equal(text.tokenCount, json.token_count);
        assert.equal(text.encoding, "cl100k_base");
        const empty = await client.getHistoryText(id("s"));
        assert.deepEqual(empty, { text: "", tokenCount: 0, encoding: "o200k_base" });
      });

      it("has an empty history for an unknown session", async () => {
        const history = await client.getHistory(id("s"), { format: "messages" });
        assert.deepEqual(history.messages, []);
        assert.equal(history.total_turns, 0);
      });
    });

    describe("sessions", () => {
      it("reads a session, clears it, and clears an unknown one too", async () => {
        const userId = id("u");
        const sessionId = id("s:with@chars.");
        const started = await client.startTurn({ sessionId, userId, userQuery: "q" });
        await client.finalizeTurn(sessionId, started.turn_id, "a");
        await client.startTurn({ sessionId, userQuery: "q2" });
        const session = await client.getSession(sessionId);
        assert.equal(session.session_id, sessionId);
        assert.equal(session.user_id, userId);
        assert.equal(session.turn_count, 1);
        assert.equal(session.pending_count, 1);
        assert.ok(Date.parse(session.expires_at) > Date.parse(session.last_active_at));
        await client.clearSession(sessionId);
        const error = await turnstoreError(client.getSession(sessionId));
        assert.equal(error.status, 404);
        assert.equal(error.code, "session_not_found");
        await client.clearSession(sessionId);
      });
    });

    describe("users", () => {
      it("pages through a user's sessions and iterates over all of them", async () => {
        const userId = id("u");
        const created = new Set<string>();
        for (let i = 0; i < 7; i += 1) {
          created.add((await client.startTurn({ userId, userQuery: `q${i}` })).session_id);
        }
        const page = await client.listUserSessions(userId, { limit: 3 });
        assert.equal(page.user_id, userId);
        assert.ok(page.sessions.length <= 3);
        assert.equal(typeof page.next_cursor, "string");
        const seen: string[] = [];
        for await (const session of client.iterateUserSessions(userId, { pageSize: 3 })) {
          seen.push(session.session_id);
        }
        assert.equal(seen.length, 7);
        assert.deepEqual(new Set(seen), created);
        const unknown = await client.listUserSessions(id("u"));
        assert.deepEqual(unknown.sessions, []);
        assert.equal(unknown.next_cursor ?? null, null);
      });

      it("erases a user's sessions", async () => {
        const userId = id("u");
        const sessions: string[] = [];
        for (let i = 0; i < 3; i += 1) {
          sessions.push((await client.startTurn({ userId, userQuery: `q${i}` })).session_id);
        }
        const erased = await client.eraseUser(userId);
        assert.deepEqual(erased, { user_id: userId, deleted_sessions: 3, complete: true, rounds: 1 });
        assert.deepEqual((await client.listUserSessions(userId)).sessions, []);
        for (const sessionId of sessions) {
          assert.equal((await turnstoreError(client.getSession(sessionId))).status, 404);
        }
      });

      it("calls the erasure again while the server answers complete: false", async () => {
        const userId = id("u");
        for (let i = 0; i < 2; i += 1) await client.startTurn({ userId, userQuery: `q${i}` });
        // The real first reply (2 deleted) is presented as incomplete, as a
        // server out of time would answer; the second call finds nothing left.
        const { client: partial, faults } = faulty((request, index) =>
          index === 0 && request.method === "DELETE"
            ? {
                kind: "rewrite",
                rewrite: async (response) => {
                  const body = (await response.json()) as Record<string, unknown>;
                  const requestId = response.headers.get("x-request-id") ?? "";
                  return Response.json({ ...body, complete: false }, { headers: { "x-request-id": requestId } });
                },
              }
            : undefined,
        );
        const erased = await partial.eraseUser(userId);
        assert.deepEqual(erased, { user_id: userId, deleted_sessions: 2, complete: true, rounds: 2 });
        assert.equal(faults.count("DELETE", "/v1/users/"), 2);
      });
    });

    describe("errors", () => {
      it("reports 422 validation errors with their fields and the request id", async () => {
        const blank = await turnstoreError(client.startTurn({ sessionId: id("s"), userQuery: "   " }));
        assert.equal(blank.status, 422);
        assert.equal(blank.code, "validation_failed");
        assert.equal(blank.type, "urn:turnstore:problem:validation_failed");
        assert.ok(blank.title.length > 0);
        assert.ok(blank.detail.length > 0);
        assert.deepEqual(
          blank.errors.map((e) => e.field),
          ["user_query"],
        );
        assert.match(blank.requestId ?? "", UUID);
        const limit = await turnstoreError(
          client.startTurn({ sessionId: id("s"), userQuery: "q", history: { limit: 10_001 } }),
        );
        assert.deepEqual(
          limit.errors.map((e) => e.field),
          ["history.limit"],
        );
        const query = await turnstoreError(client.getHistory(id("s"), { max_query_chars: 0 }));
        assert.deepEqual(
          query.errors.map((e) => e.field),
          ["max_query_chars"],
        );
        const badId = await turnstoreError(client.getSession("not an id!"));
        assert.equal(badId.status, 422);
        assert.ok(badId.errors.length > 0);
      });

      it("keeps the caller's request id", async () => {
        const error = await turnstoreError(client.getSession(id("s"), { requestId: "trace-42" }));
        assert.equal(error.requestId, "trace-42");
      });

      it("reports 404 for an unknown turn and 403 for another user's session", async () => {
        const missing = await turnstoreError(client.finalizeTurn(id("s"), randomUUID(), "a"));
        assert.equal(missing.status, 404);
        assert.equal(missing.code, "turn_not_found");
        const sessionId = id("s");
        await client.startTurn({ sessionId, userId: "alice", userQuery: "q" });
        const other = await turnstoreError(client.startTurn({ sessionId, userId: "mallory", userQuery: "q" }));
        assert.equal(other.status, 403);
        assert.equal(other.code, "session_owner_mismatch");
      });

      it("reports 413 for a question over the size limit", async () => {
        const error = await turnstoreError(client.startTurn({ sessionId: id("s"), userQuery: "x".repeat(40_000) }));
        assert.equal(error.status, 413);
        assert.equal(error.code, "payload_too_large");
      });

      it("reports 429 with Retry-After at the pending cap, without retrying it", async () => {
        const sessionId = id("s");
        for (let i = 0; i < Number(SUITE_SERVER_ENV.TURNSTORE_MAX_PENDING_TURNS); i += 1) {
          await client.startTurn({ sessionId, userQuery: `q${i}` });
        }
        const { client: counted, faults } = faulty(() => undefined);
        const error = await turnstoreError(counted.startTurn({ sessionId, userQuery: "one more" }));
        assert.equal(error.status, 429);
        assert.equal(error.code, "too_many_pending_turns");
        assert.ok(error.retryAfter !== undefined && error.retryAfter >= 1);
        assert.equal(error.attempts, 1);
        assert.equal(faults.seen.length, 1);
      });
    });

    describe("retries", () => {
      it("retries a start whose reply was lost and gets the same turn back, replayed", async () => {
        const { client: lossy, faults } = faulty((_, index) => (index === 0 ? { kind: "lose-reply" } : undefined));
        const started = await lossy.startTurn({ userQuery: "q", history: { format: "text" } });
        assert.equal(started.replayed, true);
        assert.equal(started.seq, 1);
        assert.equal(started.history.rendered, "");
        const [first, second] = faults.seen;
        assert.ok(first && second && faults.seen.length === 2);
        assert.equal(second.headers.get("idempotency-key"), first.headers.get("idempotency-key"));
        assert.match(first.headers.get("idempotency-key") ?? "", UUID);
        assert.equal(second.body, first.body);
        const session = await client.getSession(started.session_id);
        assert.equal(session.pending_count, 1);
        assert.equal(session.turn_count, 0);
        assert.equal((await client.getHistory(started.session_id)).pending_turns, 1);
      });

      it("retries a start that timed out after the server acted", async () => {
        const { client: slow, faults } = faulty((_, index) => (index === 0 ? { kind: "stall" } : undefined), {
          timeoutMs: 300,
        });
        const sessionId = id("s");
        const started = await slow.startTurn({ sessionId, userQuery: "q" });
        assert.equal(started.replayed, true);
        assert.equal(faults.seen.length, 2);
        assert.equal((await client.getSession(sessionId)).pending_count, 1);
      });

      it("uses a fresh Idempotency-Key per logical start, or the caller's", async () => {
        const { client: counted, faults } = faulty(() => undefined);
        const sessionId = id("s");
        await counted.startTurn({ sessionId, userQuery: "q" });
        await counted.startTurn({ sessionId, userQuery: "q" });
        const keys = faults.seen.map((r) => r.headers.get("idempotency-key"));
        assert.equal(new Set(keys).size, 2);
        const key = id("k");
        const a = await counted.startTurn({ sessionId, userQuery: "q3", idempotencyKey: key });
        const b = await counted.startTurn({ sessionId, userQuery: "q3", idempotencyKey: key });
        assert.equal(b.turn_id, a.turn_id);
        assert.equal(b.replayed, true);
      });

      for (const status of [502, 503, 504]) {
        it(`retries after a ${status} and never sends the request twice to the server`, async () => {
          const { client: flaky, faults } = faulty((_, index) =>
            index === 0 ? problem(status, "store_unavailable") : undefined,
          );
          const started = await flaky.startTurn({ userQuery: "q" });
          assert.equal(started.replayed, false);
          assert.equal(faults.seen.length, 2);
        });
      }

      it("does not retry a 4xx", async () => {
        const { client: counted, faults } = faulty(() => undefined);
        const error = await turnstoreError(counted.startTurn({ userQuery: "" }));
        assert.equal(error.status, 422);
        assert.equal(faults.seen.length, 1);
      });

      it("gives up after maxRetries with a transport TurnstoreError (status 0)", async () => {
        const { client: down, faults } = faulty(() => ({ kind: "refuse" }), { maxRetries: 2 });
        const error = await turnstoreError(down.getSession(id("s")));
        assert.equal(error.status, 0);
        assert.equal(error.code, "connection_error");
        assert.equal(error.attempts, 3);
        assert.ok(error.cause instanceof TypeError);
        assert.equal(faults.seen.length, 3);
      });

      it("reports a proxy's non-problem error page as unexpected_response", async () => {
        const { client: proxied, faults } = faulty(
          () => ({ kind: "respond", status: 502, contentType: "text/html", body: "<h1>502 Bad Gateway</h1>" }),
          { maxRetries: 1 },
        );
        const error = await turnstoreError(proxied.getHistory(id("s")));
        assert.equal(error.status, 502);
        assert.equal(error.code, "unexpected_response");
        assert.match(error.detail, /Bad Gateway/);
        assert.equal(faults.seen.length, 2);
      });

      it("reports a timeout as code timeout once the retries are spent", async () => {
        const { client: slow } = faulty(() => ({ kind: "stall" }), { timeoutMs: 100, maxRetries: 1 });
        const error = await turnstoreError(slow.getHistory(id("s")));
        assert.equal(error.status, 0);
        assert.equal(error.code, "timeout");
      });

      it("retries a finalize whose reply was lost: same turn", async () => {
        const started = await client.startTurn({ userQuery: "q" });
        const { client: lossy, faults } = faulty((_, index) => (index === 0 ? { kind: "lose-reply" } : undefined));
        const finalized = await lossy.finalizeTurn(started.session_id, started.turn_id, "a");
        assert.equal(finalized.turn.turn_id, started.turn_id);
        assert.equal(finalized.turn.final_answer, "a");
        assert.equal(faults.seen.length, 2);
      });

      it("counts an abort whose retry finds the turn gone as done", async () => {
        const started = await client.startTurn({ userQuery: "q" });
        const { client: lossy, faults } = faulty((_, index) => (index === 0 ? { kind: "lose-reply" } : undefined));
        await lossy.abortTurn(started.session_id, started.turn_id);
        assert.equal(faults.seen.length, 2);
        assert.equal((await client.getSession(started.session_id)).pending_count, 0);
      });

      it("stops at once when the caller's signal aborts", async () => {
        const controller = new AbortController();
        const { client: down, faults } = faulty(
          () => {
            controller.abort(new Error("caller gave up"));
            return { kind: "refuse" };
          },
          { retryBaseDelayMs: 10_000, retryMaxDelayMs: 10_000 },
        );
        await assert.rejects(down.getSession(id("s"), { signal: controller.signal }), /caller gave up/);
        assert.equal(faults.seen.length, 1);
      });
    });

    describe("turn helper", () => {
      it("starts, hands over the history, and finalizes with the returned answer", async () => {
        const sessionId = await sessionWith(["a1"]);
        const finalized = await client.turn(
          { sessionId, userQuery: "q2", history: { format: "messages" } },
          async (turn) => {
            assert.equal(turn.userQuery, "q2");
            assert.equal(turn.seq, 2);
            assert.deepEqual(
              turn.history.messages.map((m) => m.content),
              ["question 1", "a1"],
            );
            // The turn is pending while the answer is generated.
            assert.equal((await client.getSession(sessionId)).pending_count, 1);
            return "a2";
          },
        );
        assert.equal(finalized.turn.seq, 2);
        assert.equal(finalized.turn.final_answer, "a2");
        const session = await client.getSession(sessionId);
        assert.equal(session.turn_count, 2);
        assert.equal(session.pending_count, 0);
      });

      it("aborts the turn and rethrows when the callback throws", async () => {
        const sessionId = await sessionWith(["a1"]);
        const failure = new Error("the model is down");
        await assert.rejects(
          client.turn({ sessionId, userQuery: "q2" }, () => {
            throw failure;
          }),
          (error) => error === failure,
        );
        const session = await client.getSession(sessionId);
        assert.equal(session.pending_count, 0);
        assert.equal(session.turn_count, 1);
      });

      it("aborts the turn when the server rejects the answer", async () => {
        const sessionId = id("s");
        const error = await turnstoreError(client.turn({ sessionId, userQuery: "q" }, () => " "));
        assert.equal(error.status, 422);
        assert.equal((await client.getSession(sessionId)).pending_count, 0);
      });
    });

    v11Suites(context);
    windowSuites(context);
  });
}
