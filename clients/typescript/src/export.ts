// Reading a user's export (`GET /v1/users/{id}/export`): NDJSON, one session
// a line (with its turns, or with `format=messages` as a transcript), split
// as the bytes arrive so that memory holds one line and one chunk, never the
// whole body.
import { TurnstoreError } from "./errors.js";
import type { ExportedSession, ExportedTranscript } from "./types.js";

/** What a line of an export holds, and how to recognise one. */
export interface ExportLineKind<T> {
  /** Whether a parsed line is one (a shallow check, for an answer off the contract). */
  is: (value: unknown) => value is T;
  /** Named in the error of a line that is not one. */
  what: string;
}

/** A line of an export of sessions (the default format, `turns`). */
export const SESSION_LINES: ExportLineKind<ExportedSession> = {
  is: (value): value is ExportedSession => hasArray(value, "turns"),
  what: "a session (session_id, turns)",
};

/** A line of an export of transcripts (`format=messages`). */
export const TRANSCRIPT_LINES: ExportLineKind<ExportedTranscript> = {
  is: (value): value is ExportedTranscript => hasArray(value, "messages"),
  what: "a transcript (session_id, messages)",
};

export interface ExportStreamOptions {
  /** The export's response (status 200), for the errors' request id. */
  response: Response;
  /** `METHOD /path` for messages. */
  label: string;
  /** Bound on each wait for the next chunk while the consumer is reading. */
  idleTimeoutMs: number;
  /** Closes the connection (an idle timeout, or a consumer that stops early). */
  abort: (reason: unknown) => void;
  /** The caller's cancellation: its reason is thrown as is. */
  signal?: AbortSignal | undefined;
}

/** Thrown into a pending read when no chunk arrived within `idleTimeoutMs`. */
class IdleTimeout extends Error {
  override readonly name = "IdleTimeout";
}

/**
 * Yields the sessions of an export body one line at a time, each checked to
 * be a `kind`. Ends only when the body ends right after a line's newline; a
 * body that ends inside a line (the server's cut) or breaks (a reset
 * connection) throws a TurnstoreError `export_incomplete`, after the whole
 * lines before it were yielded.
 */
export async function* exportedLines<T>(
  body: ReadableStream<Uint8Array>,
  kind: ExportLineKind<T>,
  options: ExportStreamOptions,
): AsyncGenerator<T, void, undefined> {
  const reader = body.getReader();
  // fatal: a broken UTF-8 sequence is a broken export, not U+FFFD in a turn.
  const decoder = new TextDecoder("utf-8", { fatal: true });
  /** The current, unfinished line, in the pieces it arrived in (no quadratic concatenation). */
  let pieces: string[] = [];
  let yielded = 0;
  let finished = false;
  try {
    for (;;) {
      const chunk = await readChunk(reader, options, () => yielded);
      if (chunk === undefined) break;
      const text = decode(decoder, chunk, true, options, yielded);
      let start = 0;
      for (let newline = text.indexOf("\n"); newline !== -1; newline = text.indexOf("\n", start)) {
        pieces.push(text.slice(start, newline));
        start = newline + 1;
        const line = pieces.join("");
        pieces = [];
        // NDJSON readers skip blank lines; turnstore sends none.
        if (line.trim() === "") continue;
        // Lines of a chunk already read must not outlive a cancellation.
        options.signal?.throwIfAborted();
        yield parseLine(line, kind, options, yielded);
        yielded += 1;
      }
      if (start < text.length) pieces.push(text.slice(start));
    }
    const rest = pieces.join("") + decode(decoder, undefined, false, options, yielded);
    if (rest.trim() !== "") {
      throw incomplete(options, yielded, "the body ended inside a line (without its newline): the server cut the export");
    }
    options.signal?.throwIfAborted();
    finished = true;
  } finally {
    if (!finished) {
      // The consumer stopped early (break, return, a throw in its loop) or the
      // stream failed: close the connection rather than leave it to the GC.
      reader.cancel().catch(() => undefined);
      options.abort(new Error("export no longer read"));
    }
  }
}

async function readChunk(
  reader: ReadableStreamDefaultReader<Uint8Array>,
  options: ExportStreamOptions,
  yielded: () => number,
): Promise<Uint8Array | undefined> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const idle = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new IdleTimeout(`no data for ${options.idleTimeoutMs} ms`)), options.idleTimeoutMs);
  });
  try {
    for (;;) {
      const { done, value } = await Promise.race([reader.read(), idle]);
      if (done) return undefined;
      if (value.byteLength > 0) return value;
    }
  } catch (error) {
    if (options.signal?.aborted) throw options.signal.reason;
    if (error instanceof IdleTimeout) options.abort(error);
    const reason = error instanceof Error ? describe(error) : String(error);
    throw incomplete(options, yielded(), `the stream broke (${reason})`, error);
  } finally {
    clearTimeout(timer);
  }
}

function decode(
  decoder: InstanceType<typeof TextDecoder>,
  chunk: Uint8Array | undefined,
  stream: boolean,
  options: ExportStreamOptions,
  yielded: number,
): string {
  try {
    return decoder.decode(chunk, { stream });
  } catch (error) {
    throw unexpected(options, yielded, "a line that is not UTF-8", error);
  }
}

function parseLine<T>(line: string, kind: ExportLineKind<T>, options: ExportStreamOptions, yielded: number): T {
  let value: unknown;
  try {
    value = JSON.parse(line);
  } catch (error) {
    throw unexpected(options, yielded, "a line that is not JSON", error);
  }
  if (!kind.is(value)) {
    throw unexpected(options, yielded, `a line that is not ${kind.what}`);
  }
  return value;
}

/** An object with a string `session_id` and an array `field`. */
function hasArray(value: unknown, field: "turns" | "messages"): boolean {
  if (typeof value !== "object" || value === null) return false;
  const v = value as Record<string, unknown>;
  return typeof v["session_id"] === "string" && Array.isArray(v[field]);
}

/** "terminated (other side closed)": undici's message and its cause's. */
function describe(error: Error): string {
  const cause = error.cause instanceof Error ? error.cause.message : undefined;
  return cause && cause !== error.message ? `${error.message}: ${cause}` : error.message;
}

function incomplete(options: ExportStreamOptions, yielded: number, why: string, cause?: unknown): TurnstoreError {
  return new TurnstoreError({
    status: options.response.status,
    code: "export_incomplete",
    title: "Export incomplete",
    detail: `${options.label}: ${why}; ${yielded} whole session(s) came before it, the rest is missing`,
    requestId: options.response.headers.get("x-request-id") ?? undefined,
    cause,
  });
}

function unexpected(options: ExportStreamOptions, yielded: number, what: string, cause?: unknown): TurnstoreError {
  return new TurnstoreError({
    status: options.response.status,
    code: "unexpected_response",
    title: "Unexpected response",
    detail: `${options.label}: ${what}, after ${yielded} session(s)`,
    requestId: options.response.headers.get("x-request-id") ?? undefined,
    cause,
  });
}
