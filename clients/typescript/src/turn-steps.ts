// The finalize and abort steps of a turn, as `TurnstoreClient.turn()` takes
// them, for the framework adapters (not exported from the package's index).
import type { CallOptions, FinalAnswer, TurnstoreClient } from "./client.js";
import { TurnstoreError } from "./errors.js";
import type { FinalizeTurnResponse, MessagesHistoryOptions } from "./types.js";

/**
 * Finalizes the turn with `answer`. When the server rejects the answer (422
 * blank, 413 too large) nothing was written, so the turn is aborted too and
 * the error rethrown. After any other failure the turn is left alone: the
 * finalize may have gone through, and an abort would delete a finished turn
 * (a pending one expires after the server's pending TTL).
 */
export async function finalizeOrAbort(
  client: TurnstoreClient,
  sessionId: string,
  turnId: string,
  answer: string | FinalAnswer,
  call: CallOptions,
): Promise<FinalizeTurnResponse> {
  try {
    return await client.finalizeTurn(sessionId, turnId, answer, call);
  } catch (error) {
    if (answerRejected(error)) await abortQuietly(client, sessionId, turnId, call);
    throw error;
  }
}

/** A finalize the server refused for its answer: nothing was written. */
export function answerRejected(error: unknown): boolean {
  return error instanceof TurnstoreError && (error.status === 413 || error.status === 422);
}

/**
 * Aborts the turn; a failure is swallowed, since the caller reports the error
 * that made it abort (a pending turn that could not be aborted expires after
 * the pending TTL).
 */
export async function abortQuietly(
  client: TurnstoreClient,
  sessionId: string,
  turnId: string,
  call: CallOptions,
): Promise<void> {
  try {
    await client.abortTurn(sessionId, turnId, call);
  } catch {
    // See above.
  }
}

/** The options of the calls that end a turn: the request id, never the caller's signal, which
 * may be the very reason the turn ends (a client that went away). */
export function cleanupCall(call: CallOptions | undefined): CallOptions {
  return { requestId: call?.requestId };
}

/** History options as a read in `messages` format, the one format the adapters read. */
export function inMessagesFormat(options: MessagesHistoryOptions | undefined): MessagesHistoryOptions & { format: "messages" } {
  return { ...options, format: "messages" } as MessagesHistoryOptions & { format: "messages" };
}
