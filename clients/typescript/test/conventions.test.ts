// The defaults and the client's own error codes, as clients/conventions.json
// states them for both clients (the Python client's tests/test_conventions.py
// holds it to the same file): they cannot drift apart again. Also: a client
// built with no arguments reads the environment.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { type Server, createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, describe, it } from "node:test";
import { CLIENT_DEFAULTS, TurnstoreClient, TurnstoreError, backoffDelay } from "turnstore-client";

interface Conventions {
  environment: { base_url: string; api_key: string };
  default_base_url: string;
  max_retries: number;
  timeout_seconds: number;
  initial_backoff_seconds: number;
  max_backoff_seconds: number;
  retried_conflicts: { fork: { status: number; code: string } };
  codes: { no_response: string; no_response_in_time: string; export_cut: string; not_the_contract: string };
}

// From dist-test/ (the compiled tests) up to clients/.
const conventions = JSON.parse(
  readFileSync(new URL("../../conventions.json", import.meta.url), "utf8"),
) as Conventions;

/** Runs `body` with the environment variables set (undefined: unset), then restores them. */
async function withEnvironment(values: Record<string, string | undefined>, body: () => Promise<void>): Promise<void> {
  const saved = Object.fromEntries(Object.keys(values).map((name) => [name, process.env[name]]));
  const assign = (vars: Record<string, string | undefined>): void => {
    for (const [name, value] of Object.entries(vars)) {
      if (value === undefined) delete process.env[name];
      else process.env[name] = value;
    }
  };
  assign(values);
  try {
    await body();
  } finally {
    assign(saved);
  }
}

async function failure(promise: Promise<unknown>): Promise<TurnstoreError> {
  try {
    await promise;
  } catch (error) {
    assert.ok(error instanceof TurnstoreError, String(error));
    return error;
  }
  assert.fail("expected a TurnstoreError");
}

describe("the clients' shared conventions (clients/conventions.json)", () => {
  it("has the shared defaults", () => {
    assert.deepEqual(
      { ...CLIENT_DEFAULTS },
      {
        baseUrl: conventions.default_base_url,
        maxRetries: conventions.max_retries,
        timeoutMs: conventions.timeout_seconds * 1000,
        retryBaseDelayMs: conventions.initial_backoff_seconds * 1000,
        retryMaxDelayMs: conventions.max_backoff_seconds * 1000,
      },
    );
  });

  it("backs off with full jitter, raised to Retry-After within the largest wait", () => {
    const policy = { baseDelayMs: CLIENT_DEFAULTS.retryBaseDelayMs, maxDelayMs: CLIENT_DEFAULTS.retryMaxDelayMs };
    const first = conventions.initial_backoff_seconds * 1000;
    assert.deepEqual(
      [0, 1, 2].map((n) => backoffDelay(n, policy, () => 1)),
      [first, first * 2, first * 4],
    );
    assert.equal(backoffDelay(30, policy, () => 1), conventions.max_backoff_seconds * 1000);
    assert.equal(backoffDelay(0, policy, () => 0), 0);
    assert.equal(backoffDelay(0, policy, () => 0, 1_000), 1_000);
    assert.equal(backoffDelay(0, policy, () => 0, 60_000), conventions.max_backoff_seconds * 1000);
  });

  it("reports no response, after the default retries, as connection_error", async () => {
    let calls = 0;
    const client = new TurnstoreClient({
      baseUrl: "http://turnstore.test",
      // Only the backoff is shortened: the number of attempts is the default's.
      retryBaseDelayMs: 1,
      fetch: async () => {
        calls += 1;
        throw new TypeError("fetch failed");
      },
    });
    const error = await failure(client.getSession("s-1"));
    assert.equal(error.status, 0);
    assert.equal(error.code, conventions.codes.no_response);
    assert.equal(calls, conventions.max_retries + 1);
    assert.equal(error.attempts, conventions.max_retries + 1);
  });

  it("retries a fork told to come back (Retry-After), not a taken id nor another operation", async () => {
    const busy = conventions.retried_conflicts.fork;
    const seen: Request[] = [];
    let retryAfter: string | undefined = "1";
    const client = new TurnstoreClient({
      baseUrl: "http://turnstore.test",
      // Only the waits are shortened: the number of attempts is the default's.
      retryBaseDelayMs: 1,
      retryMaxDelayMs: 1,
      fetch: async (request) => {
        seen.push(request);
        const body = { type: "t", title: "t", status: busy.status, detail: "d", code: busy.code };
        const headers: Record<string, string> = { "content-type": "application/problem+json" };
        if (retryAfter !== undefined) headers["retry-after"] = retryAfter;
        return new Response(JSON.stringify(body), { status: busy.status, headers });
      },
    });
    const error = await failure(client.forkSession("s-1", { newSessionId: "s-2" }));
    assert.deepEqual([error.code, error.retryAfter, error.attempts], [busy.code, 1, conventions.max_retries + 1]);
    assert.equal(seen.length, conventions.max_retries + 1);
    assert.equal(new Set(seen.map((r) => r.headers.get("idempotency-key"))).size, 1);
    seen.length = 0;
    assert.equal((await failure(client.getSession("s-1"))).attempts, 1);
    retryAfter = undefined;
    assert.equal((await failure(client.forkSession("s-1", { newSessionId: "s-2" }))).attempts, 1);
    assert.equal(seen.length, 2);
  });

  it("reports no response in time as timeout", async () => {
    const client = new TurnstoreClient({
      baseUrl: "http://turnstore.test",
      timeoutMs: 20,
      maxRetries: 0,
      fetch: (request) =>
        new Promise((_, reject) => request.signal.addEventListener("abort", () => reject(request.signal.reason))),
    });
    // AbortSignal.timeout's timer does not keep the event loop alive: this one does.
    const keepAlive = setTimeout(() => undefined, 5_000);
    try {
      const error = await failure(client.getSession("s-1"));
      assert.equal(error.code, conventions.codes.no_response_in_time);
    } finally {
      clearTimeout(keepAlive);
    }
  });

  it("reports a cut export as export_incomplete, and an answer off the contract as unexpected_response", async () => {
    const answering = (response: () => Response): TurnstoreClient =>
      new TurnstoreClient({ baseUrl: "http://turnstore.test", maxRetries: 0, fetch: async () => response() });
    const cut = answering(
      () => new Response('{"session_id": "s-1"', { headers: { "content-type": "application/x-ndjson" } }),
    );
    const exported = await failure(
      (async () => {
        for await (const _ of cut.exportUser("u-1")) void _;
      })(),
    );
    assert.equal(exported.code, conventions.codes.export_cut);
    const proxied = answering(() => new Response("<h1>oops</h1>", { status: 500, headers: { "content-type": "text/html" } }));
    assert.equal((await failure(proxied.getSession("s-1"))).code, conventions.codes.not_the_contract);
  });

  describe("a client built with no arguments", () => {
    let server: Server;
    let url: string;
    const seen: { path: string; authorization: string | undefined }[] = [];
    before(async () => {
      server = createServer((request, response) => {
        seen.push({ path: request.url ?? "", authorization: request.headers.authorization });
        response.writeHead(200, { "content-type": "application/json" });
        response.end(
          JSON.stringify({
            session_id: "s-1",
            user_id: null,
            created_at: "2025-01-01T00:00:00Z",
            last_active_at: "2025-01-01T00:00:00Z",
            turn_count: 0,
            pending_count: 0,
          }),
        );
      });
      await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
      url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    });
    after(() => new Promise<void>((resolve) => server.close(() => resolve())));

    it("talks to TURNSTORE_URL and sends TURNSTORE_API_KEY", async () => {
      const names = conventions.environment;
      await withEnvironment({ [names.base_url]: url, [names.api_key]: "k-env" }, async () => {
        seen.length = 0;
        await new TurnstoreClient().getSession("s-1");
        assert.deepEqual(seen, [{ path: "/v1/sessions/s-1", authorization: "Bearer k-env" }]);
      });
    });

    it("sends no key when TURNSTORE_API_KEY is unset or empty; options win over the environment", async () => {
      const names = conventions.environment;
      await withEnvironment({ [names.base_url]: url, [names.api_key]: "" }, async () => {
        seen.length = 0;
        await new TurnstoreClient({}).getSession("s-1");
        assert.deepEqual(seen, [{ path: "/v1/sessions/s-1", authorization: undefined }]);
      });
      await withEnvironment({ [names.base_url]: "http://127.0.0.1:9", [names.api_key]: "k-env" }, async () => {
        seen.length = 0;
        await new TurnstoreClient({ baseUrl: url, apiKey: "k-given" }).getSession("s-1");
        assert.deepEqual(seen, [{ path: "/v1/sessions/s-1", authorization: "Bearer k-given" }]);
      });
    });
  });
});
