// Client behaviour that needs no server.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { TurnstoreClient, TurnstoreError, backoffDelay } from "turnstore-client";

describe("backoffDelay", () => {
  const policy = { baseDelayMs: 100, maxDelayMs: 1_000 };
  it("doubles per retry, within [ceiling/2, ceiling]", () => {
    assert.equal(backoffDelay(0, policy, () => 0), 50);
    assert.equal(backoffDelay(0, policy, () => 1), 100);
    assert.equal(backoffDelay(2, policy, () => 0), 200);
    assert.equal(backoffDelay(2, policy, () => 1), 400);
  });
  it("is bounded by maxDelayMs", () => {
    assert.equal(backoffDelay(30, policy, () => 1), 1_000);
    assert.equal(backoffDelay(30, policy, () => 0), 500);
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
