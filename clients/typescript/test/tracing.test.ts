// Trace context: inside an active OpenTelemetry span (a real SDK tracer
// provider, registered as an application registers it), every request the
// client sends, retries included, carries the span's `traceparent` and
// `tracestate`; outside one, or switched off, none. The headers are read
// where they arrive: a recording reverse proxy in front of the real server
// (the server's own tracing is not what is tested here).
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { type IncomingHttpHeaders, type Server, createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import * as api from "@opentelemetry/api";
import { NodeTracerProvider } from "@opentelemetry/sdk-trace-node";
import { type OpenTelemetryApi, TurnstoreClient } from "turnstore-client";
import { id } from "./support/assertions.js";
import { type RunningTurnstore, startTurnstore } from "./support/processes.js";

// The AsyncLocalStorage context manager and the W3C trace context and
// baggage propagators, as NodeSDK registers them.
new NodeTracerProvider().register();
const tracer = api.trace.getTracer("turnstore-tests");

// The module fits the option's type as it is.
const given: OpenTelemetryApi = api;

/** The upstream request the caller's span continues: a vendor's tracestate, and baggage. */
const UPSTREAM = api.propagation.setBaggage(
  api.trace.setSpanContext(api.ROOT_CONTEXT, {
    traceId: "4bf92f3577b34da6a3ce929d0e0e4736",
    spanId: "00f067aa0ba902b7",
    traceFlags: api.TraceFlags.SAMPLED,
    isRemote: true,
    traceState: api.createTraceState("congo=t61rcWkgMzE"),
  }),
  api.propagation.createBaggage({ user: { value: "alice" } }),
);

/** Runs `body` in a new active span (a child of `parent`); returns the span's traceparent too. */
async function inSpan<T>(
  body: () => Promise<T>,
  parent: api.Context = api.ROOT_CONTEXT,
): Promise<{ result: T; traceparent: string }> {
  return tracer.startActiveSpan("rag request", {}, parent, async (span) => {
    try {
      const { traceId, spanId } = span.spanContext();
      return { result: await body(), traceparent: `00-${traceId}-${spanId}-01` };
    } finally {
      span.end();
    }
  });
}

/** A reverse proxy in front of turnstore that records the headers of each request it receives,
 * and answers 503 itself to the first `unavailable` ones (the client's retries then pass). */
class RecordingProxy {
  readonly received: IncomingHttpHeaders[] = [];
  unavailable = 0;
  readonly #server: Server;

  private constructor(upstream: string) {
    this.#server = createServer((request, response) => {
      void (async () => {
        this.received.push(request.headers);
        if (this.received.length <= this.unavailable) {
          response.writeHead(503, { "content-type": "application/problem+json" });
          response.end(JSON.stringify({ status: 503, code: "overloaded" }));
          return;
        }
        const chunks: Buffer[] = [];
        for await (const chunk of request) chunks.push(chunk as Buffer);
        const headers = Object.entries(request.headers).filter(
          (entry): entry is [string, string] =>
            typeof entry[1] === "string" && !HOP_BY_HOP.has(entry[0]) && entry[0] !== "host",
        );
        const answer = await fetch(new URL(request.url ?? "/", upstream), {
          method: request.method ?? "GET",
          headers,
          ...(chunks.length > 0 && { body: Buffer.concat(chunks) }),
        });
        const body = Buffer.from(await answer.arrayBuffer());
        response.writeHead(
          answer.status,
          [...answer.headers].filter(([name]) => !HOP_BY_HOP.has(name)).flat(),
        );
        response.end(body);
      })().catch((error: unknown) => {
        response.destroy(error instanceof Error ? error : new Error(String(error)));
      });
    });
  }

  static async start(upstream: string): Promise<RecordingProxy> {
    const proxy = new RecordingProxy(upstream);
    await new Promise<void>((resolve) => proxy.#server.listen(0, "127.0.0.1", resolve));
    return proxy;
  }

  get url(): string {
    return `http://127.0.0.1:${(this.#server.address() as AddressInfo).port}`;
  }

  /** The trace headers of each request received. */
  traceHeaders(): { traceparent: string | undefined; tracestate: string | undefined }[] {
    return this.received.map((h) => ({
      traceparent: h["traceparent"] as string | undefined,
      tracestate: h["tracestate"] as string | undefined,
    }));
  }

  stop(): Promise<void> {
    this.#server.closeAllConnections();
    return new Promise((resolve) => this.#server.close(() => resolve()));
  }
}

/** Headers a proxy does not pass on as they are (fetch decodes the body, and frames it anew). */
const HOP_BY_HOP = new Set([
  "connection",
  "keep-alive",
  "transfer-encoding",
  "content-length",
  "content-encoding",
  "accept-encoding",
]);

const NONE = { traceparent: undefined, tracestate: undefined };

describe("trace context", () => {
  let server: RunningTurnstore;
  let proxy: RecordingProxy;
  before(async () => {
    server = await startTurnstore();
  });
  after(() => server?.stop());

  const withProxy = (name: string, body: () => Promise<void>): void => {
    it(name, async () => {
      proxy = await RecordingProxy.start(server.baseUrl);
      try {
        await body();
      } finally {
        await proxy.stop();
      }
    });
  };

  withProxy("every request in an active span carries its traceparent and tracestate, never baggage", async () => {
    const client = new TurnstoreClient({ baseUrl: proxy.url });
    const sessionId = id("s");
    const userId = id("u");
    const { traceparent } = await inSpan(async () => {
      const written: Record<string, string> = {};
      api.propagation.inject(api.context.active(), written);
      assert.deepEqual(Object.keys(written).sort(), ["baggage", "traceparent", "tracestate"]);

      const started = await client.startTurn({ sessionId, userId, userQuery: "q" });
      await client.finalizeTurn(sessionId, started.turn_id, "a");
      await client.getHistory(sessionId, { format: "turns" });
      await client.getHistoryText(sessionId);
      const exported: string[] = [];
      for await (const session of client.exportUser(userId)) exported.push(session.session_id);
      assert.deepEqual(exported, [sessionId]);
      await client.getSession(sessionId);
      await client.clearSession(sessionId);
    }, UPSTREAM);

    assert.ok(traceparent.startsWith("00-4bf92f3577b34da6a3ce929d0e0e4736-"), traceparent);
    assert.deepEqual(proxy.traceHeaders(), Array(7).fill({ traceparent, tracestate: "congo=t61rcWkgMzE" }));
    assert.ok(proxy.received.every((headers) => headers["baggage"] === undefined));
  });

  withProxy("a retried request carries it on every attempt", async () => {
    proxy.unavailable = 1;
    const client = new TurnstoreClient({ baseUrl: proxy.url, retryBaseDelayMs: 1, retryMaxDelayMs: 5 });
    const { result: started, traceparent } = await inSpan(() =>
      client.startTurn({ sessionId: id("s"), userQuery: "q" }),
    );
    assert.equal(started.seq, 1);
    assert.deepEqual(proxy.traceHeaders(), Array(2).fill({ traceparent, tracestate: undefined }));
    assert.equal(new Set(proxy.received.map((h) => h["idempotency-key"])).size, 1);
  });

  withProxy("no trace headers without an active span", async () => {
    const client = new TurnstoreClient({ baseUrl: proxy.url });
    const sessionId = id("s");
    await inSpan(async () => undefined);
    await client.startTurn({ sessionId, userQuery: "q" });
    await client.getHistory(sessionId);
    assert.deepEqual(proxy.traceHeaders(), [NONE, NONE]);
  });

  withProxy("none with propagateTrace: false", async () => {
    const client = new TurnstoreClient({ baseUrl: proxy.url, propagateTrace: false });
    await inSpan(() => client.getSession(id("s")).catch(() => undefined), UPSTREAM);
    assert.deepEqual(proxy.traceHeaders(), [NONE]);
  });

  withProxy("the openTelemetry option is the module used", async () => {
    let injected = 0;
    const counted: OpenTelemetryApi = {
      ...given,
      propagation: {
        inject: (context, carrier) => {
          injected += 1;
          api.propagation.inject(context as api.Context, carrier);
        },
      },
    };
    const client = new TurnstoreClient({ baseUrl: proxy.url, openTelemetry: counted });
    const { traceparent } = await inSpan(() => client.getHistory(id("s")));
    assert.equal(injected, 1);
    assert.deepEqual(proxy.traceHeaders(), [{ traceparent, tracestate: undefined }]);
  });
});

describe("without @opentelemetry/api", () => {
  it("imports it once, on the first request, and the requests go out without trace headers", () => {
    const script = fileURLToPath(new URL("./support/without-opentelemetry.js", import.meta.url));
    const output = execFileSync(process.execPath, [script], { encoding: "utf8" });
    assert.deepEqual(JSON.parse(output), {
      afterImport: [],
      afterUntracedRequest: [],
      afterRequests: ["@opentelemetry/api"],
      traceHeaders: [[], [], [], []],
    });
  });

  it("is an optional peer dependency", () => {
    const manifest = JSON.parse(readFileSync(new URL("../package.json", import.meta.url), "utf8")) as {
      peerDependencies: Record<string, string>;
      peerDependenciesMeta: Record<string, { optional?: boolean }>;
      dependencies: Record<string, string>;
    };
    assert.ok(manifest.peerDependencies["@opentelemetry/api"]);
    assert.equal(manifest.peerDependenciesMeta["@opentelemetry/api"]?.optional, true);
    assert.equal(manifest.dependencies["@opentelemetry/api"], undefined);
  });
});
