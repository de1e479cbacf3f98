import { TRANSPORT_FAILURE_STATUS, TurnstoreError } from "./errors.js";

export interface RetryPolicy {
  /** Retries after the first attempt (0: none). */
  maxRetries: number;
  /** Bound on one attempt, from sending to the last byte of the reply. */
  timeoutMs: number;
  /** Backoff before retry n (from 0) is drawn from [0, d], d = min(max, base * 2^n),
   * and raised to a `Retry-After` within `maxDelayMs`. */
  baseDelayMs: number;
  maxDelayMs: number;
}

/**
 * Statuses that say "the server (or a proxy) could not handle it now":
 * turnstore answers 503 for `store_unavailable`, `request_timeout` and
 * `overloaded`; a load balancer answers 502/504 when an instance died. Every
 * other status is a verdict on the request itself, so a retry would get the
 * same answer (but for what an operation's `retryAlso` names: a fork told
 * to come back after `Retry-After`).
 */
const RETRYABLE_STATUSES: ReadonlySet<number> = new Set([502, 503, 504]);

/** One attempt's outcome, as openapi-fetch returns it. */
export interface AttemptResult<D> {
  data?: D;
  error?: unknown;
  response: Response;
}

export interface Delivered<D> {
  data: D | undefined;
  response: Response;
}

export interface SendOptions<D> {
  policy: RetryPolicy;
  /** `METHOD /path` for messages. */
  label: string;
  /** The caller's cancellation: never retried, its reason is rethrown. */
  signal?: AbortSignal | undefined;
  attempt: (signal: AbortSignal) => Promise<AttemptResult<D>>;
  /**
   * Lets an error answer to a retry count as success, for operations whose
   * earlier attempt may have taken effect without its reply arriving (an
   * abort whose retry finds the turn gone).
   */
  acceptOnRetry?: (error: TurnstoreError) => boolean;
  /**
   * Lets an error answer be retried like a 503, for operations that know it
   * is transient: a fork's 409 `session_exists` with `Retry-After` (another
   * attempt of a fork into that id, likeliest this call's own, is still
   * writing). The wait honours its `Retry-After` as a 503's does.
   */
  retryAlso?: (error: TurnstoreError) => boolean;
}

/**
 * Runs `attempt` until it gets a 2xx, a non-retryable error, or the policy's
 * retries run out. Only use it for requests that are safe to repeat: reads,
 * deletes, finalize with one answer, and starts, imports and forks carrying
 * an Idempotency-Key.
 */
export async function sendWithRetries<D>(options: SendOptions<D>): Promise<Delivered<D>> {
  const { policy, signal, label } = options;
  for (let attempt = 0; ; attempt += 1) {
    signal?.throwIfAborted();
    const timeout = AbortSignal.timeout(policy.timeoutMs);
    const combined = signal ? AbortSignal.any([signal, timeout]) : timeout;
    let failure: TurnstoreError;
    let retryable: boolean;
    let retryAfterMs: number | undefined;
    try {
      const result = await options.attempt(combined);
      if (result.response.ok) return { data: result.data, response: result.response };
      failure = TurnstoreError.fromResponse(result.response, result.error, attempt + 1);
      if (attempt > 0 && options.acceptOnRetry?.(failure)) {
        return { data: undefined, response: result.response };
      }
      retryable = RETRYABLE_STATUSES.has(failure.status) || (options.retryAlso?.(failure) ?? false);
      retryAfterMs = failure.retryAfter === undefined ? undefined : failure.retryAfter * 1000;
    } catch (error) {
      // The caller gave up: surface their reason, as fetch itself would.
      if (signal?.aborted) throw signal.reason;
      // No response: the request may or may not have reached the server.
      failure = transportFailure(label, error, timeout.aborted, attempt + 1, policy);
      retryable = true;
    }
    if (!retryable || attempt >= policy.maxRetries) throw failure;
    await sleep(backoffDelay(attempt, policy, Math.random, retryAfterMs), signal);
  }
}

function transportFailure(
  label: string,
  cause: unknown,
  timedOut: boolean,
  attempts: number,
  policy: RetryPolicy,
): TurnstoreError {
  const reason = cause instanceof Error ? cause.message : String(cause);
  return new TurnstoreError({
    status: TRANSPORT_FAILURE_STATUS,
    code: timedOut ? "timeout" : "connection_error",
    title: timedOut ? "Request timed out" : "Connection failed",
    detail: timedOut
      ? `${label}: no reply within ${policy.timeoutMs} ms (attempt ${attempts})`
      : `${label}: ${reason} (attempt ${attempts})`,
    attempts,
    cause,
  });
}

/**
 * The wait before retry `attempt` (0 for the first): exponential backoff
 * with "full jitter" (a random time in [0, ceiling], so that clients failing
 * together do not retry in lockstep), raised to the server's `Retry-After`
 * within `maxDelayMs`. The Python client waits the same (clients/conventions.json).
 */
export function backoffDelay(
  attempt: number,
  policy: Pick<RetryPolicy, "baseDelayMs" | "maxDelayMs">,
  random: () => number = Math.random,
  retryAfterMs?: number,
): number {
  const ceiling = Math.min(policy.maxDelayMs, policy.baseDelayMs * 2 ** attempt);
  const wait = random() * ceiling;
  return retryAfterMs === undefined ? wait : Math.max(wait, Math.min(retryAfterMs, policy.maxDelayMs));
}

function sleep(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    const onAbort = (): void => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}
