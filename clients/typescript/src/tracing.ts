// Trace context for the client's requests: when the caller has an active
// OpenTelemetry span, each request carries its W3C `traceparent` and
// `tracestate` (as the application's propagator writes them), so that the
// server's span of the request joins the caller's trace.
//
// `@opentelemetry/api` is an optional peer dependency: imported on the first
// request, once per process; without it, requests carry no trace headers.

/**
 * The part of `@opentelemetry/api` the client uses. The module itself fits
 * (`import * as api from "@opentelemetry/api"`).
 */
export interface OpenTelemetryApi {
  context: { active(): unknown };
  trace: {
    getSpanContext(context: unknown): SpanContextLike | undefined;
    isSpanContextValid(spanContext: SpanContextLike): boolean;
  };
  propagation: { inject(context: unknown, carrier: Record<string, string>): void };
}

/** What the client reads of a span context: whether it is a trace to join. */
export interface SpanContextLike {
  traceId: string;
  spanId: string;
}

/**
 * The headers sent, whatever else the propagator writes (`baggage`, B3):
 * the server reads no other, its CORS allows no other, and baggage may hold
 * what an application would not send to a store.
 */
const TRACE_HEADERS: readonly string[] = ["traceparent", "tracestate"];

/**
 * Held in a variable, not written in `import()`: a bundler then does not try
 * to resolve a package the application may not have (a bundled client is
 * given the module as `openTelemetry` instead).
 */
const OPENTELEMETRY_API = "@opentelemetry/api";

let imported: Promise<OpenTelemetryApi | undefined> | undefined;

/** `@opentelemetry/api`, or undefined where it cannot be imported; tried once per process. */
export function importOpenTelemetry(): Promise<OpenTelemetryApi | undefined> {
  imported ??= (import(OPENTELEMETRY_API) as Promise<typeof import("@opentelemetry/api")>).then(
    (api): OpenTelemetryApi => api,
    () => undefined,
  );
  return imported;
}

/** Adds the active span's `traceparent` and `tracestate` to `headers`; nothing without a valid active span. */
export function addTraceContext(api: OpenTelemetryApi, headers: Record<string, string>): void {
  const active = api.context.active();
  const span = api.trace.getSpanContext(active);
  // A composite propagator (baggage) writes headers even without a span;
  // only a valid span is a trace to join.
  if (span === undefined || !api.trace.isSpanContextValid(span)) return;
  const carrier: Record<string, string> = {};
  api.propagation.inject(active, carrier);
  for (const [name, value] of Object.entries(carrier)) {
    const lower = name.toLowerCase();
    if (TRACE_HEADERS.includes(lower)) headers[lower] = value;
  }
}
