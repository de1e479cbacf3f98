import createClient, { type Client } from "openapi-fetch";
import { TurnstoreError } from "./errors.js";
import { type ExportLineKind, SESSION_LINES, TRANSCRIPT_LINES, exportedLines } from "./export.js";
import { type AttemptResult, type Delivered, type RetryPolicy, type SendOptions, sendWithRetries } from "./retry.js";
import type { paths } from "./schema.js";
import { type OpenTelemetryApi, addTraceContext, importOpenTelemetry } from "./tracing.js";
import type {
  EraseUserResponse,
  ExportedSession,
  ExportedTranscript,
  FinalizeTurnBody,
  FinalizeTurnResponse,
  ForkBody,
  ForkResponse,
  HistoryFor,
  HistoryOptions,
  DroppedReport,
  ImportBody,
  ImportMessage,
  ImportResponse,
  JsonMediaType,
  ListUserSessionsOptions,
  PutSummaryBody,
  RegenerateTurnBody,
  RegenerateTurnResponse,
  Session,
  StartTurnBody,
  StartTurnResponse,
  Summary,
  TextHistoryOptions,
  TranscriptMessage,
  UserSession,
  UserSessionsPage,
  WireHistoryQuery,
} from "./types.js";

export interface TurnstoreClientOptions {
  /** Where turnstore listens (no `/v1`). Default: `TURNSTORE_URL` from the environment,
   * else `http://127.0.0.1:8080`. */
  baseUrl?: string | undefined;
  /** Sent as `Authorization: Bearer <apiKey>` when the server has keys. Default:
   * `TURNSTORE_API_KEY` from the environment (unset or empty: no key). */
  apiKey?: string | undefined;
  /** A fetch to use instead of `globalThis.fetch` (proxies, tests). */
  fetch?: ((request: Request) => Promise<Response>) | undefined;
  /** Retries after the first attempt, for connection errors, timeouts and 502/503/504.
   * Default 2 (three attempts in all). */
  maxRetries?: number | undefined;
  /** Bound on each attempt, in ms. Default 10 000: above the server's own 5 s request timeout,
   * so a slow server answers 503 `request_timeout` (retried) before the client gives up. */
  timeoutMs?: number | undefined;
  /** Largest wait before the first retry, in ms (doubles per retry; the wait is drawn
   * between 0 and it). Default 250. */
  retryBaseDelayMs?: number | undefined;
  /** Largest wait between attempts, in ms, `Retry-After` included. Default 4 000. */
  retryMaxDelayMs?: number | undefined;
  /** Send the active OpenTelemetry span's `traceparent` and `tracestate` with each request
   * (retries included), when there is one. Default true. false: never, and nothing is imported. */
  propagateTrace?: boolean | undefined;
  /** The `@opentelemetry/api` module to read the active span from (`import * as api from
   * "@opentelemetry/api"`). Default: imported on the first request, if it can be (it is an
   * optional peer dependency). Give it in bundled code, or to use your application's copy. */
  openTelemetry?: OpenTelemetryApi | undefined;
}

/** Per-call options. */
export interface CallOptions {
  /** Cancels the call, retries included; the signal's reason is thrown. */
  signal?: AbortSignal | undefined;
  /** Sent as `x-request-id` (1 to 128 visible ASCII characters), to follow a call in the server's logs. */
  requestId?: string | undefined;
}

export interface StartTurnInput<O extends HistoryOptions | undefined = HistoryOptions | undefined> {
  userQuery: string;
  /** An English copy of the question, for a pipeline that translates; `lang: "en"` histories render it. */
  userQueryEn?: string | undefined;
  /** Omit for a new session: the client then makes its id (a UUID), so that retries stay safe. */
  sessionId?: string | undefined;
  /** The session's owner; a session belongs to the first user it is started with. */
  userId?: string | undefined;
  /** Also return the history as it stood before this turn (one round trip per request). */
  history?: O;
  /** Reuse one key to make a start you repeat yourself idempotent (e.g. after a crash);
   * by default each call gets a fresh one, reused only across its own retries. */
  idempotencyKey?: string | undefined;
}

/** A started (pending) turn. */
export type StartedTurn<O> = Omit<StartTurnResponse, "history"> & {
  /** True when a retry found the first attempt's turn (`Idempotent-Replayed: true`). */
  replayed: boolean;
  history: O extends HistoryOptions ? HistoryFor<O> : undefined;
};

/** A final answer with its English copy (`lang: "en"` histories render the copy). */
export interface FinalAnswer {
  finalAnswer: string;
  finalAnswerEn?: string | undefined;
}

/** The `text` rendering of a history, as `Accept: text/plain` returns it. */
export interface HistoryText {
  text: string;
  /** Exact token count of `text` (`x-token-count`). */
  tokenCount: number;
  /** The encoding it is counted in (`x-encoding`). */
  encoding: string;
}

export interface EraseUserOptions {
  /** Calls to make at most while the server answers `complete: false`. Default 100. */
  maxRounds?: number | undefined;
}

export interface ErasedUser extends EraseUserResponse {
  /** Calls made; `deleted_sessions` is their sum. */
  rounds: number;
}

/** What `turn()` hands the generation callback. */
export type TurnContext<O> = StartedTurn<O> & { userQuery: string };

export interface PutSummaryInput {
  /** The summary of every turn with `seq <= throughSeq`: not empty, at most `TURNSTORE_MAX_SUMMARY_BYTES`. */
  summary: string;
  /** At least 1, at most the newest finalized turn's `seq` (422), never below the stored summary's (409). */
  throughSeq: number;
  /** Write only if the stored summary covers exactly this far (0: there is none yet), else 409
   * `summary_conflict`: the compare-and-set that keeps two summarizers from overwriting each other. */
  expectedThroughSeq?: number | undefined;
  /** Write only to this incarnation of the session: the `generation` of the history the summary
   * was folded from. A session cleared, erased or expired since (even if started again under the
   * same id) answers 409 `summary_conflict`, and nothing is written. Send it with
   * `expectedThroughSeq`: 0 alone cannot tell a session started again from the one read. `null`
   * (the generation of an unknown session's history, which has nothing to fold) sends none. */
  expectedGeneration?: string | null | undefined;
  /** Checked against the session's owner (403 `session_owner_mismatch`); does not claim the session. */
  userId?: string | undefined;
}

/** A `strict` import: user and assistant messages in pairs, their contents strings. */
export interface StrictImportInput {
  /** `strict`, the default (sent only when given). */
  mode?: "strict" | undefined;
  /** Oldest first: each user message followed by its assistant message becomes one turn. */
  messages: readonly ImportMessage[];
  /** The session's owner, as in a start: the first claims it, another is a 403. */
  userId?: string | undefined;
}

/**
 * A `distill` import: an agent loop's messages as the OpenAI or Anthropic
 * SDKs write them (an SDK's own message type fits `M`), each exchange kept
 * as one turn, the rest dropped and reported (`dropped`).
 */
export interface DistillImportInput<M extends TranscriptMessage = TranscriptMessage> {
  mode: "distill";
  /**
   * Oldest first. An exchange's question is its user texts in a row (joined
   * by a blank line), its answer the last assistant text before the next
   * question. System and developer prompts, tool calls and results,
   * thinking, refusals, parts that are not text, replaced answers and a last
   * question without an answer are dropped. A message's `timestamp` (RFC 3339
   * with its zone) becomes its turn's `started_at` (the question's) or
   * `finalized_at` (the answer's); given for one exchange, needed for all.
   */
  messages: readonly M[];
  /** The session's owner, as in a start: the first claims it, another is a 403. */
  userId?: string | undefined;
}

/** What `importMessages` appends: strict user/assistant pairs, or (`mode: "distill"`) an agent loop's messages. */
export type ImportInput<M extends TranscriptMessage = TranscriptMessage> = StrictImportInput | DistillImportInput<M>;

export interface ImportOptions {
  /** Reuse one key to make an import you repeat yourself idempotent (e.g. after a crash);
   * by default each call gets a fresh one, reused only across its own retries. */
  idempotencyKey?: string | undefined;
}

/** An import's result; `dropped` only for a `distill` import. */
export type ImportResult = ImportResponse & {
  /** True when the key's earlier import answered (`Idempotent-Replayed: true`): nothing new was written. */
  replayed: boolean;
};

/** A `distill` import's result: with what it dropped, a report per reason (`[]` when nothing). */
export type DistilledImportResult = ImportResult & { dropped: DroppedReport[] };

/** What `forkSession` makes: a new session of the source's finalized turns through a seq. */
export interface ForkInput {
  /** The new session's id: no live session may have it (409 `session_exists`), nor may the source (422). */
  newSessionId: string;
  /** The newest seq copied (1 or more); default the newest finalized turn's. Past it, or below
   * the oldest turn the session kept (nothing to copy), a 422. The fork's next start takes the seq after it. */
  throughSeq?: number | undefined;
  /** As in a start: checked against the source's owner (403 `session_owner_mismatch`); the owner
   * of the fork of an unowned session. */
  userId?: string | undefined;
}

export interface ForkOptions {
  /** Reuse one key to make a fork you repeat yourself idempotent (e.g. after a crash, or after
   * a 409 with `retryAfter` that outlasted the retries); by default each call gets a fresh one,
   * reused only across its own retries. */
  idempotencyKey?: string | undefined;
}

/** A fork's result (`session_id` is the new session's). */
export type ForkResult = ForkResponse & {
  /** True when the key's earlier fork answered (`Idempotent-Replayed: true`): nothing new was written. */
  replayed: boolean;
};

/**
 * The defaults of `TurnstoreClientOptions`, the Python client's too
 * (clients/conventions.json): `baseUrl` when neither the options nor
 * `TURNSTORE_URL` give one.
 */
export const CLIENT_DEFAULTS = Object.freeze({
  baseUrl: "http://127.0.0.1:8080",
  maxRetries: 2,
  timeoutMs: 10_000,
  retryBaseDelayMs: 250,
  retryMaxDelayMs: 4_000,
} as const);

/**
 * A history read of the summary alone, with the session's generation: how a
 * retried summary write that named a generation checks both at once (no
 * stored summary fills the budget: it is at most 32 KiB).
 */
const STORED_SUMMARY = { summary: true, format: "turns", limit: 0, max_tokens: 10_000_000 } as const;

/** The environment variables a client reads when its options leave a value out. */
const ENVIRONMENT = { baseUrl: "TURNSTORE_URL", apiKey: "TURNSTORE_API_KEY" } as const;

/** A variable of the environment, where there is one (Node; not a browser); empty is unset. */
function fromEnvironment(name: string): string | undefined {
  const value = globalThis.process?.env?.[name];
  return value === undefined || value === "" ? undefined : value;
}

/**
 * A typed client of the turnstore HTTP API. Every call is retried on network
 * errors, timeouts and 502/503/504 (all of them are safe to repeat: starts,
 * imports and forks carry an Idempotency-Key), and every failure is a
 * `TurnstoreError`, except a cancellation through `CallOptions.signal`, which
 * throws the signal's reason.
 */
export class TurnstoreClient {
  readonly #api: Client<paths, JsonMediaType>;
  readonly #policy: RetryPolicy;
  /** Where the trace context comes from: a given module, the one imported on first use, or nowhere. */
  readonly #tracing: OpenTelemetryApi | "import" | undefined;

  /**
   * `new TurnstoreClient()` talks to `TURNSTORE_URL` (else
   * `http://127.0.0.1:8080`) with the key in `TURNSTORE_API_KEY` (if any);
   * options win over the environment.
   */
  constructor(options: TurnstoreClientOptions = {}) {
    const baseUrl = options.baseUrl ?? fromEnvironment(ENVIRONMENT.baseUrl) ?? CLIENT_DEFAULTS.baseUrl;
    const apiKey = options.apiKey ?? fromEnvironment(ENVIRONMENT.apiKey);
    // Fail at construction, not as a retried "connection error" on first use.
    const base = new URL(baseUrl);
    if (base.protocol !== "http:" && base.protocol !== "https:") {
      throw new TypeError(`baseUrl must be an http(s) URL, got ${baseUrl}`);
    }
    this.#policy = {
      maxRetries: nonNegativeInteger("maxRetries", options.maxRetries ?? CLIENT_DEFAULTS.maxRetries),
      timeoutMs: positive("timeoutMs", options.timeoutMs ?? CLIENT_DEFAULTS.timeoutMs),
      baseDelayMs: positive("retryBaseDelayMs", options.retryBaseDelayMs ?? CLIENT_DEFAULTS.retryBaseDelayMs),
      maxDelayMs: positive("retryMaxDelayMs", options.retryMaxDelayMs ?? CLIENT_DEFAULTS.retryMaxDelayMs),
    };
    this.#tracing = options.propagateTrace === false ? undefined : (options.openTelemetry ?? "import");
    this.#api = createClient<paths, JsonMediaType>({
      baseUrl,
      ...(options.fetch && { fetch: options.fetch }),
      ...(apiKey !== undefined && { headers: { Authorization: `Bearer ${apiKey}` } }),
    });
  }

  /**
   * Starts a turn (`POST /v1/turns`). Safe to retry: the request carries a
   * session id (the caller's or a new UUID) and an Idempotency-Key, so a
   * retry after a lost reply returns the same turn with `replayed: true`.
   */
  async startTurn<O extends HistoryOptions | undefined = undefined>(
    input: StartTurnInput<O>,
    call?: CallOptions,
  ): Promise<StartedTurn<O>> {
    const idempotencyKey = input.idempotencyKey ?? crypto.randomUUID();
    const body: StartTurnBody = {
      // API.md: an Idempotency-Key needs a session_id; a server-made id would
      // not survive a lost reply, so the client makes it.
      session_id: input.sessionId ?? crypto.randomUUID(),
      user_query: input.userQuery,
    };
    if (input.userId !== undefined) body.user_id = input.userId;
    if (input.userQueryEn !== undefined) body.user_query_en = input.userQueryEn;
    if (input.history !== undefined) body.history = input.history as WireHistoryQuery;
    const { data, response } = await this.#send("POST /v1/turns", call, (signal, headers) =>
      this.#api.POST("/v1/turns", {
        body,
        params: { header: { "Idempotency-Key": idempotencyKey } },
        headers,
        signal,
      }),
    );
    const started = required(data, response);
    return {
      ...started,
      replayed: response.headers.get("idempotent-replayed") === "true",
      // The server returns `history` exactly when it was asked for.
      history: (started.history ?? undefined) as StartedTurn<O>["history"],
    };
  }

  /**
   * Finalizes a turn with its answer: a string, or `{ finalAnswer,
   * finalAnswerEn }` to keep an English copy too. Retrying with the same
   * answer (and copy) returns the same turn, so this is retried like a read.
   */
  async finalizeTurn(
    sessionId: string,
    turnId: string,
    answer: string | FinalAnswer,
    call?: CallOptions,
  ): Promise<FinalizeTurnResponse> {
    const body: FinalizeTurnBody = answerBody(answer);
    const { data, response } = await this.#send("POST finalize", call, (signal, headers) =>
      this.#api.POST("/v1/sessions/{session_id}/turns/{turn_id}/finalize", {
        params: { path: { session_id: sessionId, turn_id: turnId } },
        body,
        headers,
        signal,
      }),
    );
    return required(data, response);
  }

  /**
   * Replaces the answer of a finalized turn (a chat UI's "regenerate"): a
   * string, or `{ finalAnswer, finalAnswerEn }` (the new answer's English
   * copy; without one the turn has none). The turn keeps its `seq`, its
   * question and the question's English copy; its `finalized_at` becomes now.
   * A turn the session's summary covers is a 409 `turn_summarized` (`detail`
   * says through which seq: delete the summary, or write one that covers less,
   * first), a pending one a 409 `turn_pending`, an unknown one a 404
   * `turn_not_found`; nothing is written then. Retried like a finalize: the
   * same answer again replaces the answer with itself.
   */
  async regenerateTurn(
    sessionId: string,
    turnId: string,
    answer: string | FinalAnswer,
    call?: CallOptions,
  ): Promise<RegenerateTurnResponse> {
    const body: RegenerateTurnBody = answerBody(answer);
    const { data, response } = await this.#send("POST regenerate", call, (signal, headers) =>
      this.#api.POST("/v1/sessions/{session_id}/turns/{turn_id}/regenerate", {
        params: { path: { session_id: sessionId, turn_id: turnId } },
        body,
        headers,
        signal,
      }),
    );
    return required(data, response);
  }

  /**
   * Removes a pending turn (the pipeline failed) or a finalized one. A retry
   * answered 404 `turn_not_found` counts as done: an earlier attempt whose
   * reply was lost may have removed it.
   */
  async abortTurn(sessionId: string, turnId: string, call?: CallOptions): Promise<void> {
    await this.#send(
      "DELETE turn",
      call,
      (signal, headers) =>
        this.#api.DELETE("/v1/sessions/{session_id}/turns/{turn_id}", {
          params: { path: { session_id: sessionId, turn_id: turnId } },
          headers,
          signal,
        }),
      { acceptOnRetry: (error) => error.status === 404 && error.code === "turn_not_found" },
    );
  }

  /**
   * Reads the history (`GET .../history`). The result's type follows
   * `options.format`: `rendered` for text (the default, and with a
   * `template`), `messages`, `turns`. Every history has `unsummarized`.
   * An unknown `template` is a 404 `template_not_found`, one that fails while
   * rendering a 422 `template_error`. `chat_template: true` budgets the
   * prompt the messages make through the chat template of the tokenizer
   * named by `encoding` (or `model`), `system` beginning it: a `messages`
   * history, with that prompt as `prompt` when `prompt: true`.
   * `format: "anthropic"` returns a Messages API request as `anthropic`
   * (see `anthropicRequest`), its prompt-cache breakpoints marked with
   * `cache_control: true`; `window: "stable"` begins the history at a stride
   * boundary, so that consecutive reads begin alike (`window`, `breakpoint`).
   */
  async getHistory<O extends HistoryOptions = Record<never, never>>(
    sessionId: string,
    options?: O,
    call?: CallOptions,
  ): Promise<HistoryFor<O>> {
    const query = { ...options } as WireHistoryQuery;
    const { data, response } = await this.#send("GET history", call, (signal, headers) =>
      this.#api.GET("/v1/sessions/{session_id}/history", {
        params: { path: { session_id: sessionId }, query },
        headers,
        signal,
      }),
    );
    return required(data, response) as HistoryFor<O>;
  }

  /** Reads the `text` rendering alone (`Accept: text/plain`), with its token count (no
   * chat template: a chat template's prompt is `getHistory`'s `prompt`), in a stable window
   * with `window: "stable"`. */
  async getHistoryText(
    sessionId: string,
    options?: TextHistoryOptions,
    call?: CallOptions,
  ): Promise<HistoryText> {
    const query = { ...options } as WireHistoryQuery;
    const { data, response } = await this.#send("GET history (text)", call, (signal, headers) =>
      this.#api.GET("/v1/sessions/{session_id}/history", {
        params: { path: { session_id: sessionId }, query },
        headers: { ...headers, Accept: "text/plain" },
        parseAs: "text",
        signal,
      }),
    );
    const tokenCount = response.headers.get("x-token-count");
    const encoding = response.headers.get("x-encoding");
    if (tokenCount === null || !/^\d+$/.test(tokenCount) || encoding === null) {
      throw unexpected(response, "a text/plain history without x-token-count or x-encoding");
    }
    // A 200 with an empty body (the empty history) comes back as undefined.
    return { text: data ?? "", tokenCount: Number(tokenCount), encoding };
  }

  /** Session metadata; 404 `session_not_found` for an unknown or expired session. */
  async getSession(sessionId: string, call?: CallOptions): Promise<Session> {
    const { data, response } = await this.#send("GET session", call, (signal, headers) =>
      this.#api.GET("/v1/sessions/{session_id}", {
        params: { path: { session_id: sessionId } },
        headers,
        signal,
      }),
    );
    return required(data, response);
  }

  /** Deletes the session and all its turns; done for an unknown session too. */
  async clearSession(sessionId: string, call?: CallOptions): Promise<void> {
    await this.#send("DELETE session", call, (signal, headers) =>
      this.#api.DELETE("/v1/sessions/{session_id}", {
        params: { path: { session_id: sessionId } },
        headers,
        signal,
      }),
    );
  }

  /**
   * The session's summary. A session without one (or no live session) is a
   * 404 `summary_not_found`, thrown as a TurnstoreError, as `getSession`
   * throws its 404.
   */
  async getSummary(sessionId: string, call?: CallOptions): Promise<Summary> {
    const { data, response } = await this.#send("GET summary", call, (signal, headers) =>
      this.#api.GET("/v1/sessions/{session_id}/summary", {
        params: { path: { session_id: sessionId } },
        headers,
        signal,
      }),
    );
    return required(data, response);
  }

  /**
   * Writes the session's rolling summary (`PUT .../summary`). With
   * `expectedThroughSeq` it is a compare-and-set: a 409 `summary_conflict`
   * when the stored summary covers another range (read again, fold what is
   * left, write again). With `expectedGeneration` (the history's
   * `generation`) it is a 409 too when the session was cleared, erased or
   * expired since, even if started again under the same id. A retry whose
   * first attempt was written but its reply lost is answered 409 too; the
   * client then reads the summary, and returns it when it is this very write
   * (in the `expectedGeneration` of the session, when given).
   */
  async putSummary(sessionId: string, input: PutSummaryInput, call?: CallOptions): Promise<Summary> {
    const body: PutSummaryBody = { summary: input.summary, through_seq: input.throughSeq };
    if (input.expectedThroughSeq !== undefined) body.expected_through_seq = input.expectedThroughSeq;
    if (input.expectedGeneration != null) body.expected_generation = input.expectedGeneration;
    if (input.userId !== undefined) body.user_id = input.userId;
    try {
      const { data, response } = await this.#send("PUT summary", call, (signal, headers) =>
        this.#api.PUT("/v1/sessions/{session_id}/summary", {
          params: { path: { session_id: sessionId } },
          body,
          headers,
          signal,
        }),
      );
      return required(data, response);
    } catch (error) {
      if (error instanceof TurnstoreError && error.code === "summary_conflict" && error.attempts > 1) {
        const stored = await this.#lostWrite(sessionId, input, call).catch(() => undefined);
        if (stored?.summary === input.summary && stored.through_seq === input.throughSeq) return stored;
      }
      throw error;
    }
  }

  /**
   * The stored summary a lost attempt of `input` may have written. When the
   * write named a generation, one history read gives the summary and the
   * generation together: the same summary in a later generation (the session
   * started again) is not this write's, whose summary the clear deleted.
   */
  async #lostWrite(sessionId: string, input: PutSummaryInput, call?: CallOptions): Promise<Summary | undefined> {
    if (input.expectedGeneration == null) return this.getSummary(sessionId, call);
    const history = await this.getHistory(sessionId, STORED_SUMMARY, call);
    return history.generation === input.expectedGeneration ? history.summary : undefined;
  }

  /** Deletes the session's summary; done when it has none too. */
  async deleteSummary(sessionId: string, call?: CallOptions): Promise<void> {
    await this.#send("DELETE summary", call, (signal, headers) =>
      this.#api.DELETE("/v1/sessions/{session_id}/summary", {
        params: { path: { session_id: sessionId } },
        headers,
        signal,
      }),
    );
  }

  /**
   * Appends a transcript made elsewhere as finalized turns (`POST
   * .../import`), all or nothing: user and assistant messages in pairs
   * (`strict`, the default), or with `mode: "distill"` an agent loop's
   * OpenAI or Anthropic messages, each exchange kept as its question and
   * final answer; system, tool and thinking content, tool calls, refusals
   * and parts that are not text are dropped, and the result's `dropped`
   * reports them by reason. Safe to retry: the call sends one
   * Idempotency-Key on all its attempts, so a retry after a lost reply
   * returns the first import's result (and report) with `replayed: true`.
   * Invalid messages are a 422 whose `errors` name them (`messages[3].role`).
   */
  async importMessages<M extends TranscriptMessage>(
    sessionId: string,
    input: DistillImportInput<M>,
    options?: ImportOptions,
    call?: CallOptions,
  ): Promise<DistilledImportResult>;
  async importMessages<M extends TranscriptMessage>(
    sessionId: string,
    input: ImportInput<M>,
    options?: ImportOptions,
    call?: CallOptions,
  ): Promise<ImportResult>;
  async importMessages(
    sessionId: string,
    input: ImportInput,
    options?: ImportOptions,
    call?: CallOptions,
  ): Promise<ImportResult> {
    const idempotencyKey = options?.idempotencyKey ?? crypto.randomUUID();
    const body: ImportBody = { messages: [...input.messages] };
    if (input.userId !== undefined) body.user_id = input.userId;
    // Sent only when given: a strict import's body is what it was before modes.
    if (input.mode !== undefined) body.mode = input.mode;
    const { data, response } = await this.#send("POST import", call, (signal, headers) =>
      this.#api.POST("/v1/sessions/{session_id}/import", {
        params: { path: { session_id: sessionId }, header: { "Idempotency-Key": idempotencyKey } },
        body,
        headers,
        signal,
      }),
    );
    return {
      ...required(data, response),
      replayed: response.headers.get("idempotent-replayed") === "true",
    };
  }

  /**
   * Makes `input.newSessionId` a branch of the conversation (`POST
   * .../fork`): a new session of this one's finalized turns with `seq <=
   * throughSeq` (default: through the newest), as they are (seqs, turn ids,
   * texts, English copies, times), with the session's summary when it covers
   * no later turn (`summary: true`), and its owner (or, for an unowned
   * session, `userId`). The fork's next start takes `through_seq + 1`; the
   * source does not change. A chat UI's "edit question N" is a fork through
   * N − 1, then a start in the fork (its "regenerate" is `regenerateTurn`).
   * Errors: 404 `session_not_found` (unknown or expired source), 403
   * `session_owner_mismatch`, 409 `session_exists` (the new id is taken),
   * 422 `validation_failed` (`through_seq`, `new_session_id`) or
   * `idempotency_key_reused`.
   *
   * Safe to retry: the call sends one Idempotency-Key on all its attempts,
   * so a retry after a lost reply returns the first fork's result with
   * `replayed: true` (even once the source is gone), not a 409 for the
   * session it made. A 409 `session_exists` *with* `Retry-After` is retried
   * too, after that wait (within the policy, as a 503 is): the server
   * answers so while another attempt of a fork into that id may still be
   * writing, likeliest this call's own attempt cut off by a timeout, and the
   * retry with the same key gets that fork once it is done, or (5 s after
   * the stopped attempt's last write) takes over and completes it. A plain
   * 409 (the id is taken; no `Retry-After`) is thrown at once.
   */
  async forkSession(
    sessionId: string,
    input: ForkInput,
    options?: ForkOptions,
    call?: CallOptions,
  ): Promise<ForkResult> {
    const idempotencyKey = options?.idempotencyKey ?? crypto.randomUUID();
    const body: ForkBody = { new_session_id: input.newSessionId };
    // Sent only when given: absent, the server's defaults.
    if (input.throughSeq !== undefined) body.through_seq = input.throughSeq;
    if (input.userId !== undefined) body.user_id = input.userId;
    const { data, response } = await this.#send(
      "POST fork",
      call,
      (signal, headers) =>
        this.#api.POST("/v1/sessions/{session_id}/fork", {
          params: { path: { session_id: sessionId }, header: { "Idempotency-Key": idempotencyKey } },
          body,
          headers,
          signal,
        }),
      { retryAlso: forkUnderWay },
    );
    return {
      ...required(data, response),
      replayed: response.headers.get("idempotent-replayed") === "true",
    };
  }

  /**
   * Every live session of a user with its summary and finalized turns
   * (`GET /v1/users/{id}/export`), in the order of the sessions list, one
   * session at a time as the NDJSON stream arrives: memory holds one line,
   * never the whole export. The request is retried like any read until its
   * status arrives, not after: an export that breaks off (a reset connection,
   * a body ending inside a line, which is how the server cuts an export on a
   * store failure or at its `TURNSTORE_EXPORT_TIMEOUT`, or no data for
   * `timeoutMs` while reading) throws a TurnstoreError `export_incomplete`
   * after the whole sessions before it. `timeoutMs` bounds the wait for the
   * status and each wait for more data, not the whole export; stopping the
   * iteration early closes the connection.
   */
  exportUser(userId: string, call?: CallOptions): AsyncGenerator<ExportedSession, void, undefined> {
    return this.#export(userId, undefined, SESSION_LINES, call);
  }

  /**
   * The export of `exportUser`, with each session's turns as a chat
   * transcript (`?format=messages`): `{ session_id, created_at,
   * last_active_at, summary?, messages }`, the messages a user and an
   * assistant `{ role, content, timestamp }` a turn, oldest first (the
   * question at the turn's `started_at`, the answer at its `finalized_at`;
   * the originals, not the English copies). Imported with `mode: "distill"`,
   * a transcript's `messages` make the same turns at the same times.
   * Streamed, retried and cut exactly as `exportUser`.
   */
  exportTranscripts(userId: string, call?: CallOptions): AsyncGenerator<ExportedTranscript, void, undefined> {
    return this.#export(userId, "messages", TRANSCRIPT_LINES, call);
  }

  async *#export<T>(
    userId: string,
    format: "messages" | undefined,
    kind: ExportLineKind<T>,
    call?: CallOptions,
  ): AsyncGenerator<T, void, undefined> {
    const label = `GET /v1/users/${userId}/export${format === undefined ? "" : `?format=${format}`}`;
    // Sent only for transcripts: an export of sessions is the request it was.
    const query = format === undefined ? {} : { query: { format } };
    // Each attempt gets its own controller: the attempt's timeout bounds the
    // wait for the status, and must not abort the body that follows it.
    let connection: AbortController | undefined;
    const { data, response } = await this.#send("GET export", call, async (signal, headers) => {
      const controller = new AbortController();
      connection = controller;
      const forward = (): void => controller.abort(signal.reason);
      if (signal.aborted) forward();
      signal.addEventListener("abort", forward, { once: true });
      try {
        return await this.#api.GET("/v1/users/{user_id}/export", {
          params: { path: { user_id: userId }, ...query },
          headers: { ...headers, Accept: "application/x-ndjson" },
          parseAs: "stream",
          signal: controller.signal,
        });
      } finally {
        signal.removeEventListener("abort", forward);
      }
    });
    const contentType = response.headers.get("content-type") ?? "";
    if (!/^application\/x-ndjson\s*(;|$)/i.test(contentType)) {
      await response.body?.cancel().catch(() => undefined);
      throw unexpected(response, `an export of content type ${JSON.stringify(contentType)}, not application/x-ndjson`);
    }
    // No body at all (Content-Length: 0) is the empty export, complete.
    if (data === undefined || data === null) return;
    const open = connection;
    const abort = (reason: unknown): void => open?.abort(reason);
    const onCallerAbort = (): void => abort(call?.signal?.reason);
    call?.signal?.addEventListener("abort", onCallerAbort, { once: true });
    if (call?.signal?.aborted) onCallerAbort();
    try {
      yield* exportedLines(data, kind, {
        response,
        label,
        idleTimeoutMs: this.#policy.timeoutMs,
        abort,
        signal: call?.signal,
      });
    } finally {
      call?.signal?.removeEventListener("abort", onCallerAbort);
    }
  }

  /**
   * One page of a user's sessions, most recently active first. A page may be
   * short, even empty, and still have a `next_cursor`: see iterateUserSessions.
   */
  async listUserSessions(
    userId: string,
    options?: ListUserSessionsOptions,
    call?: CallOptions,
  ): Promise<UserSessionsPage> {
    const query: ListUserSessionsOptions = { ...options };
    const { data, response } = await this.#send("GET user sessions", call, (signal, headers) =>
      this.#api.GET("/v1/users/{user_id}/sessions", {
        params: { path: { user_id: userId }, query },
        headers,
        signal,
      }),
    );
    return required(data, response);
  }

  /** Every live session of a user, following `next_cursor` until it is null. */
  async *iterateUserSessions(
    userId: string,
    options?: { pageSize?: number | undefined },
    call?: CallOptions,
  ): AsyncGenerator<UserSession, void, undefined> {
    let cursor: string | undefined;
    do {
      const query: ListUserSessionsOptions = {};
      if (options?.pageSize !== undefined) query.limit = options.pageSize;
      if (cursor !== undefined) query.cursor = cursor;
      const page = await this.listUserSessions(userId, query, call);
      yield* page.sessions;
      cursor = page.next_cursor ?? undefined;
    } while (cursor !== undefined);
  }

  /**
   * Erases every session of a user (right to erasure), calling again while
   * the server answers `complete: false` (it continues where it stopped).
   * Returns `complete: false` only if `maxRounds` calls were not enough.
   */
  async eraseUser(userId: string, options?: EraseUserOptions, call?: CallOptions): Promise<ErasedUser> {
    const maxRounds = options?.maxRounds ?? 100;
    if (!Number.isInteger(maxRounds) || maxRounds < 1) throw new RangeError("maxRounds must be an integer >= 1");
    let deleted = 0;
    for (let round = 1; ; round += 1) {
      const { data, response } = await this.#send("DELETE user", call, (signal, headers) =>
        this.#api.DELETE("/v1/users/{user_id}", {
          params: { path: { user_id: userId } },
          headers,
          signal,
        }),
      );
      const result = required(data, response);
      deleted += result.deleted_sessions;
      if (result.complete || round >= maxRounds) {
        return { ...result, deleted_sessions: deleted, rounds: round };
      }
    }
  }

  /**
   * One RAG request: starts the turn (with `input.history`, available to
   * `generate` as `turn.history`), runs `generate`, and finalizes the turn
   * with the answer it returns (a string, or `{ finalAnswer, finalAnswerEn }`).
   * If `generate` throws, the turn is aborted
   * and the error rethrown as is. If the server rejects the answer (422
   * empty, 413 too large) the turn is aborted too, since nothing was written;
   * after any other finalize failure it is left alone (it may have been
   * finalized: aborting could delete a finished turn) and expires by itself
   * if it was not.
   */
  async turn<O extends HistoryOptions | undefined = undefined>(
    input: StartTurnInput<O>,
    generate: (turn: TurnContext<O>) => Promise<string | FinalAnswer> | string | FinalAnswer,
    call?: CallOptions,
  ): Promise<FinalizeTurnResponse> {
    const started = await this.startTurn(input, call);
    // Cleanup must not be cancelled by the caller's signal, which may be the
    // very reason the callback threw.
    const cleanup: CallOptions = { requestId: call?.requestId };
    let answer: string | FinalAnswer;
    try {
      answer = await generate({ ...started, userQuery: input.userQuery });
    } catch (error) {
      await this.#abortQuietly(started.session_id, started.turn_id, cleanup);
      throw error;
    }
    try {
      return await this.finalizeTurn(started.session_id, started.turn_id, answer, call);
    } catch (error) {
      if (error instanceof TurnstoreError && (error.status === 413 || error.status === 422)) {
        await this.#abortQuietly(started.session_id, started.turn_id, cleanup);
      }
      throw error;
    }
  }

  async #abortQuietly(sessionId: string, turnId: string, call: CallOptions): Promise<void> {
    try {
      await this.abortTurn(sessionId, turnId, call);
    } catch {
      // The caller gets the error that made us abort, not this one; a pending
      // turn that could not be aborted expires after the pending TTL.
    }
  }

  async #send<D>(
    label: string,
    call: CallOptions | undefined,
    attempt: (signal: AbortSignal, headers: Record<string, string>) => Promise<AttemptResult<D>>,
    errors: Pick<SendOptions<D>, "acceptOnRetry" | "retryAlso"> = {},
  ): Promise<Delivered<D>> {
    const headers: Record<string, string> = {};
    if (call?.requestId !== undefined) headers["x-request-id"] = call.requestId;
    const tracing = this.#tracing === "import" ? await importOpenTelemetry() : this.#tracing;
    if (tracing !== undefined) addTraceContext(tracing, headers);
    return sendWithRetries({
      policy: this.#policy,
      label,
      signal: call?.signal,
      attempt: (signal) => attempt(signal, headers),
      ...errors,
    });
  }
}

/**
 * A fork's 409 `session_exists` that says when to try again: an attempt of a
 * fork into the new id may still be writing (without `Retry-After`, the id is
 * simply taken).
 */
function forkUnderWay(error: TurnstoreError): boolean {
  return error.status === 409 && error.code === "session_exists" && error.retryAfter !== undefined;
}

/** The body of a finalize or a regenerate. */
function answerBody(answer: string | FinalAnswer): FinalizeTurnBody {
  if (typeof answer === "string") return { final_answer: answer };
  const body: FinalizeTurnBody = { final_answer: answer.finalAnswer };
  if (answer.finalAnswerEn !== undefined) body.final_answer_en = answer.finalAnswerEn;
  return body;
}

function required<D>(data: D | undefined, response: Response): D {
  if (data === undefined) throw unexpected(response, "a success without a body");
  return data;
}

function unexpected(response: Response, what: string): TurnstoreError {
  return new TurnstoreError({
    status: response.status,
    code: "unexpected_response",
    title: "Unexpected response",
    detail: `${response.url}: ${what}`,
    requestId: response.headers.get("x-request-id") ?? undefined,
  });
}

function nonNegativeInteger(name: string, value: number): number {
  if (!Number.isInteger(value) || value < 0) throw new RangeError(`${name} must be an integer >= 0`);
  return value;
}

function positive(name: string, value: number): number {
  if (!(value > 0) || !Number.isFinite(value)) throw new RangeError(`${name} must be a finite number > 0`);
  return value;
}
