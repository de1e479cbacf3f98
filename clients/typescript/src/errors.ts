import type { FieldError, Problem } from "./types.js";

/**
 * Codes the client makes itself, for failures that never produced a problem
 * document. They are disjoint from the server's codes.
 */
export type ClientErrorCode =
  /** No response: connection refused or reset, DNS, TLS (status 0). */
  | "connection_error"
  /** No response within `timeoutMs` on the last attempt (status 0). */
  | "timeout"
  /** A response that is not what the contract promises: an error without a
   * problem document (a proxy's HTML 502), or a success without its body. */
  | "unexpected_response"
  /** An export whose stream ended before its end: the connection broke, or
   * the body ended without its last line's newline (the server cuts an export
   * so on a store failure or at `TURNSTORE_EXPORT_TIMEOUT`). `status` is the
   * export's (200): the sessions already yielded are whole, the rest is missing. */
  | "export_incomplete";

/**
 * A server problem `code` (see API.md) or one of the client's own. `string & {}`
 * keeps the known codes as completions while admitting codes a newer server
 * adds, which do arrive at run time.
 */
export type ErrorCode = Problem["code"] | ClientErrorCode | (string & {});

/** Status of a TurnstoreError that has no HTTP response behind it. */
export const TRANSPORT_FAILURE_STATUS = 0;

export interface TurnstoreErrorInit {
  status: number;
  code: ErrorCode;
  title: string;
  detail: string;
  type?: string | undefined;
  errors?: readonly FieldError[] | undefined;
  requestId?: string | undefined;
  retryAfter?: number | undefined;
  attempts?: number | undefined;
  cause?: unknown;
}

/**
 * Every failure of a TurnstoreClient call: an error response (its problem
 * document's fields), or a transport failure that outlasted the retries
 * (`status` 0, `code` `connection_error` or `timeout`, the last error as
 * `cause`).
 */
export class TurnstoreError extends Error {
  override readonly name = "TurnstoreError";
  /** HTTP status, or 0 when no response arrived. */
  readonly status: number;
  readonly code: ErrorCode;
  readonly title: string;
  readonly detail: string;
  /** The problem's `type` URI, when the server sent one. */
  readonly type: string | undefined;
  /** Field errors of a 422 `validation_failed` (empty otherwise). */
  readonly errors: readonly FieldError[];
  /** The response's `x-request-id`, to find the request in the server's logs. */
  readonly requestId: string | undefined;
  /** Seconds from `Retry-After` (a 429 `too_many_pending_turns`, a 503, or a fork's 409
   * `session_exists` while another fork into the id is under way). */
  readonly retryAfter: number | undefined;
  /** Attempts made, retries included. */
  readonly attempts: number;

  constructor(init: TurnstoreErrorInit) {
    super(`${init.status || "transport"} ${init.code}: ${init.detail || init.title}`, {
      cause: init.cause,
    });
    this.status = init.status;
    this.code = init.code;
    this.title = init.title;
    this.detail = init.detail;
    this.type = init.type;
    this.errors = init.errors ?? [];
    this.requestId = init.requestId;
    this.retryAfter = init.retryAfter;
    this.attempts = init.attempts ?? 1;
  }

  /** Builds the error for a non-2xx response from its (parsed) body. */
  static fromResponse(response: Response, body: unknown, attempts = 1): TurnstoreError {
    const requestId = response.headers.get("x-request-id") ?? undefined;
    const retryAfter = parseRetryAfter(response.headers.get("retry-after"));
    if (isProblem(body)) {
      return new TurnstoreError({
        status: response.status,
        code: body.code,
        title: body.title,
        detail: body.detail,
        type: body.type,
        errors: (body.errors ?? []).filter(isFieldError),
        requestId,
        retryAfter,
        attempts,
      });
    }
    // Not from turnstore itself (a load balancer's page, a truncated body):
    // keep a bounded excerpt so the error stays loggable.
    const excerpt = typeof body === "string" ? body.slice(0, 200) : "";
    return new TurnstoreError({
      status: response.status,
      code: "unexpected_response",
      title: response.statusText || `HTTP ${response.status}`,
      detail: excerpt || `HTTP ${response.status} without a problem document`,
      requestId,
      retryAfter,
      attempts,
    });
  }
}

function isProblem(body: unknown): body is Problem {
  if (typeof body !== "object" || body === null) return false;
  const p = body as Record<string, unknown>;
  return (
    typeof p["code"] === "string" &&
    typeof p["status"] === "number" &&
    typeof p["title"] === "string" &&
    typeof p["detail"] === "string" &&
    typeof p["type"] === "string" &&
    (p["errors"] === undefined || p["errors"] === null || Array.isArray(p["errors"]))
  );
}

function isFieldError(value: unknown): value is FieldError {
  if (typeof value !== "object" || value === null) return false;
  const e = value as Record<string, unknown>;
  return typeof e["field"] === "string" && typeof e["message"] === "string";
}

function parseRetryAfter(header: string | null): number | undefined {
  if (header === null || !/^\d+$/.test(header.trim())) return undefined;
  return Number(header.trim());
}
