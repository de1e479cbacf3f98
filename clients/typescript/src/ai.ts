// `turnstore-client/ai`: the Vercel AI SDK adapter. One `streamText` call is
// one turn: started with the question (the history for the prompt comes back
// with the start), finalized with the final text when the model is done,
// aborted when the generation fails or is aborted. Imports `ai`, an optional
// peer dependency: only this entry point does, never the package's main one.
import {
  type Instructions,
  type ModelMessage,
  type OutputInterface,
  type StreamTextResult,
  type SystemModelMessage,
  type ToolSet,
  streamText,
} from "ai";
import { historyChatMessages } from "./chat.js";
import type { CallOptions, StartTurnInput, StartedTurn, TurnstoreClient } from "./client.js";
import { abortQuietly, answerRejected, cleanupCall, inMessagesFormat } from "./turn-steps.js";
import type { FinalizeTurnResponse, HistoryMessage, HistoryResponse, MessagesHistoryOptions } from "./types.js";

/** The runtime context of a `streamText` call (the AI SDK's `Context`). */
type Context = Record<string, unknown>;
/** `streamText`'s default output: text. */
type TextOutput = OutputInterface<string, string, never>;
/** The options of `streamText` for these tools, runtime context and output. */
type StreamTextOptions<TOOLS extends ToolSet, CONTEXT extends Context, OUTPUT extends OutputInterface> = Parameters<
  typeof streamText<TOOLS, CONTEXT, OUTPUT>
>[0];

/**
 * The options of `streamText` that `streamTurn` passes on: all of them but
 * `prompt` and `messages`, which the turn makes (the history, then the
 * question). `instructions` (or the older `system`) come first in the
 * prompt, a `summary: true` history's summary after them; the callbacks
 * (`onEnd`/`onFinish`, `onError`, `onAbort`, …) are called as usual, after
 * the turn's own handling.
 */
export type StreamTurnOptions<
  TOOLS extends ToolSet = ToolSet,
  CONTEXT extends Context = Context,
  OUTPUT extends OutputInterface = TextOutput,
> = Omit<StreamTextOptions<TOOLS, CONTEXT, OUTPUT>, "prompt" | "messages">;

/** The turn of a `streamTurn` call. */
export interface StreamTurnInput extends Omit<StartTurnInput, "history"> {
  /**
   * The history the model gets, read by the start in the same round trip:
   * its selection and exact budget (`max_tokens` with the `model` or
   * `encoding` that counts it, `limit`, `summary`, …), always in `messages`
   * format. Absent: the server's defaults.
   */
  history?: MessagesHistoryOptions | undefined;
  /**
   * Read the model's stream to its end even when nothing else reads it (a
   * client that went away), as the AI SDK's `result.consumeStream()` does,
   * so that the turn is always finalized or aborted. Default true. With
   * false the turn ends only when the response is read to its end (or
   * `abortSignal` fires): a response nobody reads leaves the turn pending
   * until the server's pending TTL.
   */
  consumeStream?: boolean | undefined;
}

/** How the turn ended: finalized with the answer, or aborted (removed) with the reason. */
export type TurnOutcome =
  | ({ status: "finalized" } & FinalizeTurnResponse)
  | {
      status: "aborted";
      session_id: string;
      turn_id: string;
      /** What ended it: the model's error, the abort signal's reason, or the TurnstoreError that refused the answer. */
      reason: unknown;
    };

/** What `streamTurn` returns. */
export interface TurnStream<
  TOOLS extends ToolSet = ToolSet,
  CONTEXT extends Context = Context,
  OUTPUT extends OutputInterface = TextOutput,
> {
  /** `streamText`'s result: stream it to the client (`toTextStream`, `toUIMessageStream`). */
  result: StreamTextResult<TOOLS, CONTEXT, OUTPUT>;
  /** The started turn: `session_id`, `turn_id`, `seq`, and the `history` the model got. */
  turn: StartedTurn<{ format: "messages" }>;
  /**
   * Settles once the turn has ended: finalized, or aborted. It rejects only
   * when a finalize failed otherwise than by a refused answer (the turn is
   * then left alone, as `TurnstoreClient.turn()` leaves it); an unawaited
   * rejection is not reported as unhandled. On a serverless platform, keep
   * the function alive for it (`waitUntil(done)`).
   */
  done: Promise<TurnOutcome>;
}

/**
 * Streams one answer as one turn: starts the turn with `input.userQuery`
 * (the start returns the history, `input.history`'s budget), calls
 * `streamText` with `options` and the history's messages followed by the
 * question, and ends the turn:
 *
 * - finalized with the final step's text in `onEnd` (before the stream
 *   closes, so that the next question's history has this turn);
 * - aborted when the model fails (`onStepError`, or an error part that no
 *   stream retry recovered: the answer would be partial), when `abortSignal`
 *   fires (`onAbort`), when `streamText` throws, or when the stream ends
 *   without an answer. An empty answer is refused by turnstore (422), and
 *   the turn aborted too.
 *
 * `call` applies to the start; the finalize and abort keep its `requestId`
 * only, never its signal.
 */
export async function streamTurn<
  TOOLS extends ToolSet = ToolSet,
  CONTEXT extends Context = Context,
  OUTPUT extends OutputInterface = TextOutput,
>(
  turnstore: TurnstoreClient,
  input: StreamTurnInput,
  options: StreamTurnOptions<TOOLS, CONTEXT, OUTPUT>,
  call?: CallOptions,
): Promise<TurnStream<TOOLS, CONTEXT, OUTPUT>> {
  // The work is the same for every tool set and output: typed once, with streamText's defaults.
  const streamed = await streamDefaultTurn(turnstore, input, options as unknown as StreamTurnOptions, call);
  return streamed as unknown as TurnStream<TOOLS, CONTEXT, OUTPUT>;
}

async function streamDefaultTurn(
  turnstore: TurnstoreClient,
  input: StreamTurnInput,
  options: StreamTurnOptions,
  call: CallOptions | undefined,
): Promise<TurnStream> {
  const { history, consumeStream = true, ...start } = input;
  const turn: StartedTurn<{ format: "messages" }> = await turnstore.startTurn(
    { ...start, history: inMessagesFormat(history) },
    call,
  );
  const ending = new TurnEnding(turnstore, turn.session_id, turn.turn_id, cleanupCall(call));
  const {
    instructions,
    system,
    onError,
    onEnd,
    onFinish,
    onAbort,
    onStepError,
    onLanguageModelCallStart,
    experimental_onLanguageModelCallStart,
    ...settings
  } = options;
  const prompt = modelPrompt({ instructions: instructions ?? system, history: turn.history, userQuery: input.userQuery });
  const onCallStart = onLanguageModelCallStart ?? experimental_onLanguageModelCallStart;
  const onEndOrFinish = onEnd ?? onFinish;
  const streamOptions: StreamTextOptions<ToolSet, Context, TextOutput> = {
    ...settings,
    messages: prompt.messages,
    onError: async (event) => {
      // Without stream retries an error part is final: end the turn before the stream does.
      if (options.streamRetries === undefined) await ending.abort(event.error);
      else ending.failed(event.error);
      if (onError === undefined) {
        console.error(event.error); // streamText's own default
        return undefined;
      }
      return onError(event);
    },
    onLanguageModelCallStart: async (event) => {
      // A new model call (a stream retry, or the next step): errors before it were recovered.
      ending.attempt();
      await onCallStart?.(event);
    },
    onStepError: async (event) => {
      await ending.abort(event.error);
      await onStepError?.(event);
    },
    onEnd: async (event) => {
      await ending.end(event.finishReason, event.text);
      await onEndOrFinish?.(event);
    },
    onAbort: async (event) => {
      await ending.abort(event.reason ?? new Error("the generation was aborted"));
      await onAbort?.(event);
    },
  };
  if (prompt.instructions.length > 0) streamOptions.instructions = prompt.instructions;
  let result: StreamTextResult<ToolSet, Context, TextOutput>;
  try {
    result = streamText(streamOptions);
  } catch (error) {
    await ending.abort(error);
    throw error;
  }
  const signal = options.abortSignal;
  if (signal !== undefined) {
    const aborted = (): void => void ending.abort(signal.reason);
    if (signal.aborted) aborted();
    signal.addEventListener("abort", aborted, { once: true });
    void ending.done.finally(() => signal.removeEventListener("abort", aborted)).catch(() => undefined);
  }
  if (consumeStream) {
    // Nothing but this reader may be left: when the stream ends without
    // onEnd, onStepError or onAbort having ended the turn, abort it.
    void Promise.resolve(result.consumeStream()).then(() =>
      ending.abort(new Error("the model's stream ended without an answer")),
    );
  }
  return { result, turn, done: ending.done };
}

/** What `modelPrompt` takes. */
export interface ModelPromptInput {
  /** Your instructions, before the history's own (its summary's). */
  instructions?: Instructions | undefined;
  /** A history in `messages` format (a history response, or its `messages`). Absent: none. */
  history?: HistoryResponse | readonly HistoryMessage[] | undefined;
  /** The new question, the last user message. */
  userQuery: string;
}

/** The `instructions` and `messages` of an AI SDK call (`streamText`, `generateText`). */
export interface ModelPrompt {
  /** Your instructions, then the history's system messages (a `summary: true` history's summary). */
  instructions: SystemModelMessage[];
  /** The history's user and assistant messages, oldest first, then the question. */
  messages: ModelMessage[];
}

/**
 * The prompt of an AI SDK call from a turnstore history in `messages`
 * format: `generateText({ model, ...modelPrompt({ history: turn.history,
 * userQuery }) })` inside `TurnstoreClient.turn()`. The history's system
 * messages go to `instructions`, since the AI SDK refuses system messages
 * among `messages` unless `allowSystemInMessages` is set.
 */
export function modelPrompt(input: ModelPromptInput): ModelPrompt {
  const instructions: SystemModelMessage[] = systemMessages(input.instructions);
  const messages: ModelMessage[] = [];
  for (const message of historyChatMessages(input.history)) {
    if (message.role === "system") instructions.push(message);
    else messages.push(message);
  }
  messages.push({ role: "user", content: input.userQuery });
  return { instructions, messages };
}

function systemMessages(instructions: Instructions | undefined): SystemModelMessage[] {
  if (instructions === undefined) return [];
  if (typeof instructions === "string") return instructions === "" ? [] : [{ role: "system", content: instructions }];
  return Array.isArray(instructions) ? [...instructions] : [instructions];
}

/**
 * How a streamed turn ends, once: the first of finalize and abort wins, and
 * `done` settles with it.
 */
class TurnEnding {
  readonly done: Promise<TurnOutcome>;
  readonly #client: TurnstoreClient;
  readonly #sessionId: string;
  readonly #turnId: string;
  readonly #call: CallOptions;
  #resolve!: (outcome: TurnOutcome) => void;
  #reject!: (error: unknown) => void;
  #ending: Promise<void> | undefined;
  /** An error of the current model call, not (yet) recovered by a retry. */
  #error: { error: unknown } | undefined;

  constructor(client: TurnstoreClient, sessionId: string, turnId: string, call: CallOptions) {
    this.#client = client;
    this.#sessionId = sessionId;
    this.#turnId = turnId;
    this.#call = call;
    this.done = new Promise<TurnOutcome>((resolve, reject) => {
      this.#resolve = resolve;
      this.#reject = reject;
    });
    // Awaiting `done` is optional: a rejection nobody awaits is not an unhandled one.
    this.done.catch(() => undefined);
  }

  failed(error: unknown): void {
    this.#error = { error };
  }

  attempt(): void {
    this.#error = undefined;
  }

  /** The generation ended: finalize with its text, unless it failed. */
  end(finishReason: string, text: string): Promise<void> {
    if (this.#error !== undefined) return this.abort(this.#error.error);
    if (finishReason === "error") return this.abort(new Error("the model's answer ended with an error"));
    return this.#once(async () => {
      try {
        const finalized = await this.#client.finalizeTurn(this.#sessionId, this.#turnId, text, this.#call);
        this.#resolve({ status: "finalized", ...finalized });
      } catch (error) {
        if (!answerRejected(error)) {
          this.#reject(error);
          return;
        }
        // A blank or oversized answer: nothing was written, so nothing stays.
        await abortQuietly(this.#client, this.#sessionId, this.#turnId, this.#call);
        this.#aborted(error);
      }
    });
  }

  abort(reason: unknown): Promise<void> {
    return this.#once(async () => {
      await abortQuietly(this.#client, this.#sessionId, this.#turnId, this.#call);
      this.#aborted(reason);
    });
  }

  #aborted(reason: unknown): void {
    this.#resolve({ status: "aborted", session_id: this.#sessionId, turn_id: this.#turnId, reason });
  }

  #once(step: () => Promise<void>): Promise<void> {
    this.#ending ??= step();
    return this.#ending;
  }
}
