// Client behaviour that needs no server.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { type ExportedSession, TurnstoreClient, TurnstoreError, backoffDelay } from "turnstore-client";

describe("backoffDelay", () => {
  const policy = { baseDelayMs: 100, maxDelayMs: 1_000 };
  it("doubles per retry, within [0, ceiling]", () => {
    assert.equal(backoffDelay(0, policy, () => 0), 0);
    assert.equal(backoffDelay(0, policy, () => 1), 100);
    assert.equal(backoffDelay(2, policy, () => 0.5), 200);
    assert.equal(backoffDelay(2, policy, () => 1), 400);
  });
  it("is bounded by maxDelayMs, Retry-After included", () => {
    assert.equal(backoffDelay(30, policy, () => 1), 1_000);
    assert.equal(backoffDelay(0, policy, () => 0, 500), 500);
    assert.equal(backoffDelay(0, policy, () => 0, 30_000), 1_000);
  });
});

describe("TurnstoreClient options", () => {
  it("rejects a base URL that is not http(s), and bad retry settings", () => {
    assert.throws(() => new TurnstoreClient({ baseUrl: "localhost:8080" }), TypeError);
    assert.throws(() => new TurnstoreClient({ baseUrl: "not a url" }), TypeError);
    assert.throws(() => new TurnstoreClient({ baseUrl: "http://x", maxRetries: -1 }), RangeError);
    assert.throws(() => new TurnstoreClient({ baseUrl: "http://x", maxRetries: 1.5 }), RangeError);
    assert.throws(() => new TurnstoreClient({ baseUrl: "http://x", timeoutMs: 0 }), RangeError);
  });
});

describe("TurnstoreError.fromResponse", () => {
  it("keeps every field of a problem document", () => {
    const response = new Response(null, {
      status: 429,
      headers: { "x-request-id": "r-1", "retry-after": "12" },
    });
    const error = TurnstoreError.fromResponse(response, {
      type: "urn:turnstore:problem:too_many_pending_turns",
      title: "Too many pending turns",
      status: 429,
      detail: "the session holds 64 pending turns",
      code: "too_many_pending_turns",
      errors: [{ field: "x", message: "y" }, { bogus: true }],
    });
    assert.ok(error instanceof Error);
    assert.equal(error.name, "TurnstoreError");
    assert.equal(error.status, 429);
    assert.equal(error.code, "too_many_pending_turns");
    assert.equal(error.retryAfter, 12);
    assert.equal(error.requestId, "r-1");
    assert.deepEqual(error.errors, [{ field: "x", message: "y" }]);
    assert.match(error.message, /429 too_many_pending_turns: the session holds 64 pending turns/);
  });
});

describe("putSummary's body", () => {
  it("sends expected_generation when given, and none for undefined or null", async () => {
    const bodies: unknown[] = [];
    const client = new TurnstoreClient({
      baseUrl: "http://turnstore.test",
      maxRetries: 0,
      fetch: async (request) => {
        bodies.push(JSON.parse(await request.text()));
        const summary = { summary: "S", through_seq: 2, token_count: 1, updated_at: "2026-11-25T10:20:41.210Z" };
        return Response.json(summary);
      },
    });
    await client.putSummary("s", { summary: "S", throughSeq: 2, expectedThroughSeq: 0, expectedGeneration: "g-1" });
    await client.putSummary("s", { summary: "S", throughSeq: 2 });
    await client.putSummary("s", { summary: "S", throughSeq: 2, expectedGeneration: null });
    assert.deepEqual(bodies, [
      { summary: "S", through_seq: 2, expected_through_seq: 0, expected_generation: "g-1" },
      { summary: "S", through_seq: 2 },
      { summary: "S", through_seq: 2 },
    ]);
  });
});

describe("exportUser's NDJSON reading", () => {
  /** A client whose every request is answered by `respond`. */
  const answering = (respond: () => Response): TurnstoreClient =>
    new TurnstoreClient({ baseUrl: "http://turnstore.test", fetch: async () => respond(), maxRetries: 0 });
  const ndjson = (body: ReadableStream<Uint8Array> | string | null, headers: Record<string, string> = {}): Response =>
    new Response(body, { headers: { "content-type": "application/x-ndjson", ...headers } });
  const session = (n: number): ExportedSession => ({
    session_id: `s-${n}`,
    created_at: "2026-11-25T10:15:30.123Z",
    last_active_at: "2026-11-25T10:15:30.123Z",
    turns: [],
    summary: { summary: `Grüße ✓ 🌍 ${n}`, through_seq: n, token_count: 3, updated_at: "2026-11-25T10:15:30.123Z" },
  });
  const drain = async (sessions: AsyncIterable<ExportedSession>): Promise<ExportedSession[]> => {
    const seen: ExportedSession[] = [];
    for await (const s of sessions) seen.push(s);
    return seen;
  };

  it("splits lines however the bytes are chunked, multi-byte characters and CRLF included", async () => {
    const expected = [session(1), session(2), session(3)];
    const bytes = new TextEncoder().encode(
      `${JSON.stringify(expected[0])}\n${JSON.stringify(expected[1])}\r\n${JSON.stringify(expected[2])}\n`,
    );
    for (const size of [1, 2, 3, 7, 64, bytes.length]) {
      let offset = 0;
      const body = new ReadableStream<Uint8Array>({
        pull(controller) {
          if (offset >= bytes.length) {
            controller.close();
            return;
          }
          controller.enqueue(bytes.slice(offset, offset + size));
          offset += size;
        },
      });
      assert.deepEqual(await drain(answering(() => ndjson(body)).exportUser("u")), expected, `chunks of ${size}`);
    }
  });

  it("reads the body as it is consumed, and releases it when the consumer stops early", async () => {
    let pulls = 0;
    let cancelled = false;
    // An endless export: only a reader that never buffers the whole body can get through it.
    const body = new ReadableStream<Uint8Array>({
      pull(controller) {
        pulls += 1;
        controller.enqueue(new TextEncoder().encode(`${JSON.stringify(session(pulls))}\n`));
      },
      cancel() {
        cancelled = true;
      },
    });
    const seen: string[] = [];
    for await (const s of answering(() => ndjson(body)).exportUser("u")) {
      seen.push(s.session_id);
      if (seen.length === 3) break;
    }
    assert.deepEqual(seen, ["s-1", "s-2", "s-3"]);
    assert.ok(pulls < 10, `${pulls} chunks pulled for 3 sessions`);
    assert.equal(cancelled, true);
  });

  it("takes an empty body as the empty export, and refuses another content type", async () => {
    assert.deepEqual(await drain(answering(() => ndjson(null, { "content-length": "0" })).exportUser("u")), []);
    assert.deepEqual(await drain(answering(() => ndjson("")).exportUser("u")), []);
    const html = answering(() => new Response("<h1>Hello</h1>", { headers: { "content-type": "text/html" } }));
    await assert.rejects(drain(html.exportUser("u")), (error) => {
      assert.ok(error instanceof TurnstoreError);
      assert.equal(error.code, "unexpected_response");
      assert.match(error.detail, /text\/html/);
      return true;
    });
  });
});
