// The one place that names the API's types. Every alias is reached through
// `paths` (operation, status, media type), never through a component name:
// the spec may rename its schemas or move responses into
// components/responses (both happened once) without any change here.
import type { components, paths } from "./schema.js";

/**
 * The media types of the API's JSON bodies: `application/json`,
 * `application/problem+json` and the export's `application/x-ndjson` lines.
 * For openapi-fetch on the generated `paths`: `createClient<paths,
 * JsonMediaType>()` types each `data` and `error` from them alone. With
 * openapi-fetch's default (every media type) a history's `data` is
 * `HistoryResponse | string`, since its 200 also offers the `text/plain`
 * rendering (`Accept: text/plain`, which `parseAs: "text"` reads).
 */
export type JsonMediaType = `${string}/${string}json`;

type JsonBody<R> = R extends { content: { "application/json": infer T } } ? T : never;
type ProblemBody<R> = R extends { content: { "application/problem+json": infer T } } ? T : never;
type NdjsonLine<R> = R extends { content: { "application/x-ndjson": infer T } } ? T : never;

type StartTurnOp = paths["/v1/turns"]["post"];
type FinalizeTurnOp = paths["/v1/sessions/{session_id}/turns/{turn_id}/finalize"]["post"];
type RegenerateTurnOp = paths["/v1/sessions/{session_id}/turns/{turn_id}/regenerate"]["post"];
type GetHistoryOp = paths["/v1/sessions/{session_id}/history"]["get"];
type GetSessionOp = paths["/v1/sessions/{session_id}"]["get"];
type ListUserSessionsOp = paths["/v1/users/{user_id}/sessions"]["get"];
type EraseUserOp = paths["/v1/users/{user_id}"]["delete"];
type GetSummaryOp = paths["/v1/sessions/{session_id}/summary"]["get"];
type PutSummaryOp = paths["/v1/sessions/{session_id}/summary"]["put"];
type ImportOp = paths["/v1/sessions/{session_id}/import"]["post"];
type ForkOp = paths["/v1/sessions/{session_id}/fork"]["post"];
type ExportOp = paths["/v1/users/{user_id}/export"]["get"];

/** The JSON body of `POST /v1/turns`, as sent on the wire. */
export type StartTurnBody = StartTurnOp["requestBody"]["content"]["application/json"];
/** The reply to a start (201, or 200 for a replay). */
export type StartTurnResponse = JsonBody<StartTurnOp["responses"][201]>;
/** The JSON body of a finalize, as sent on the wire. */
export type FinalizeTurnBody = FinalizeTurnOp["requestBody"]["content"]["application/json"];
export type FinalizeTurnResponse = JsonBody<FinalizeTurnOp["responses"][200]>;
/** A finalized turn; `user_query_en` / `final_answer_en` when it has English copies. */
export type Turn = FinalizeTurnResponse["turn"];
/** The JSON body of a regenerate (a finalize's), as sent on the wire. */
export type RegenerateTurnBody = RegenerateTurnOp["requestBody"]["content"]["application/json"];
/** The reply to a regenerate: the turn with its new answer (a finalize's shape). */
export type RegenerateTurnResponse = JsonBody<RegenerateTurnOp["responses"][200]>;

/** The query parameters of get_history, as the spec states them, but for
 * `encoding`: one of the built-in encodings the checked-in document lists,
 * or the name of a tokenizer a server loaded (`TURNSTORE_TOKENIZERS_DIR`;
 * that server's own document lists them). */
type HistoryQuery = Omit<NonNullable<GetHistoryOp["parameters"]["query"]>, "encoding"> & {
  encoding?: Encoding | (string & {});
};
/** A built-in encoding's name. */
export type Encoding = components["schemas"]["Encoding"];
/** The query as the generated types state it (built-in encodings only):
 * what the client hands openapi-fetch, a loaded tokenizer's name cast. */
export type WireHistoryQuery = NonNullable<GetHistoryOp["parameters"]["query"]>;

/** The options of a read through a loaded tokenizer's chat template. */
type ChatTemplateOption = "chat_template" | "prompt" | "system";
/** Without `chat_template: true`, `prompt` and `system` are refused (422). */
interface NoChatTemplate {
  chat_template?: false;
  prompt?: never;
  system?: never;
}
/** The options of a window, and the one of the `anthropic` format. */
type WindowOption = "window" | "stride" | "cache_control";
/** Without `format: "anthropic"`, `cache_control: true` is refused (422). */
interface NoCacheControl {
  cache_control?: false;
}
/** `stride` needs `window: "stable"` (422 otherwise). */
type WindowChoice =
  | { window?: "sliding"; stride?: never }
  | {
      /** Once the budget leaves turns out, begin at a stride boundary (seqs 1, 1 + `stride`, …)
       * instead of the oldest turn that fits, so that consecutive reads of a growing conversation
       * begin with the same turns and a provider's prompt cache keeps serving them: about one read
       * in `stride` begins elsewhere. The summary and the `keep_first` turn stay in front. The
       * history then has `window` and `breakpoint`. */
      window: "stable";
      /** Turns per block, 1 to 10 000 (default 10): well below the turns the budget holds. */
      stride?: number;
    };
/** The formats without options of their own. */
type PlainFormat = Exclude<HistoryQuery["format"], "anthropic" | undefined>;
/** What every variant of the options shares. */
type SharedOptions = Omit<HistoryQuery, "template" | "format" | ChatTemplateOption | WindowOption>;

/**
 * How to select and render a history: the query parameters of get_history,
 * also accepted as a start's `history` (same names, same rules). A
 * `template` renders text only, so it admits no other `format` (the server
 * answers 422 to one); `chat_template: true` renders messages only, without
 * a `template`, and is what `prompt` and `system` need; `cache_control`
 * needs `format: "anthropic"`, and `stride` `window: "stable"`.
 */
export type HistoryOptions = WindowChoice &
  (
    | (SharedOptions & NoChatTemplate & NoCacheControl & { format?: PlainFormat; template?: never })
    | (SharedOptions &
        NoChatTemplate &
        NoCacheControl & {
          /** Render with this template (built-ins `xml`, `markdown`; others from the
           * server's `TURNSTORE_TEMPLATES_DIR`) instead of the `text` format. */
          template: string;
          format?: "text";
        })
    | (SharedOptions &
        NoCacheControl & {
          /** Budget and count the prompt the messages make through the chat template of the
           * loaded tokenizer named by `encoding` (or `model`), special tokens and all: `token_count`
           * is the prompt's. In a start, the prompt ends with the new question and the template's
           * generation prompt. A tokenizer without one: 422 `validation_failed`. */
          chat_template: true;
          /** Also return the rendered prompt (`prompt`). */
          prompt?: boolean;
          /** A system message the prompt (and `messages`) begins with, at most 64 KiB, counted in
           * `max_tokens`; a `summary` joins it after a blank line. */
          system?: string;
          format?: "messages";
          template?: never;
        })
    | (SharedOptions &
        NoChatTemplate & {
          /** The `system` and `messages` of Anthropic's Messages API (`anthropic`), budgeted as
           * the `messages` format. */
          format: "anthropic";
          /** Mark the prompt-cache breakpoints (`cache_control: { type: "ephemeral" }`) on the
           * summary's block in `system` and on the last block of the last message. */
          cache_control?: boolean;
          template?: never;
        })
  );
/**
 * History options of a read in `messages` format, as the framework adapters
 * (`turnstore-client/langchain`, `turnstore-client/ai`) take them: the
 * selection and the exact budget (`max_tokens` with `model` or `encoding`,
 * `limit`, `summary`, `keep_first`, `window`, `chat_template`, …). The format
 * is always `messages`: another `format`, or a `template`, does not fit.
 */
export type MessagesHistoryOptions = HistoryOptions & { format?: "messages"; template?: never };
/** History options of the text/plain rendering, which has one format (and no chat template). */
export type TextHistoryOptions = Omit<HistoryQuery, "format" | ChatTemplateOption | WindowOption> &
  WindowChoice;
export type HistoryResponse = JsonBody<GetHistoryOp["responses"][200]>;
export type HistoryFormat = HistoryResponse["format"];
export type HistoryMessage = NonNullable<HistoryResponse["messages"]>[number];
/** The language of a rendering (`lang`): `en` for the English copies. */
export type HistoryLanguage = NonNullable<HistoryQuery["lang"]>;
/** How a history's window moves: `sliding` (the default) or `stable`. */
export type WindowKind = NonNullable<HistoryQuery["window"]>;
/** Where a stable window begins (`from_seq`), and the turns that fit it left out (`left_out`). */
export type HistoryWindow = NonNullable<HistoryResponse["window"]>;
/** The end of the part of a history that the next read begins with: where a prompt cache's
 * breakpoint goes (`seq`; `bytes` of `rendered`, or `messages`). */
export type Breakpoint = NonNullable<HistoryResponse["breakpoint"]>;
/** The `system` and `messages` of a Messages API request, as `format: "anthropic"` returns them. */
export type AnthropicHistory = NonNullable<HistoryResponse["anthropic"]>;
/** A user or assistant message of the Messages API, its content text blocks. */
export type AnthropicMessage = AnthropicHistory["messages"][number];
/** A text block, with `cache_control` where a breakpoint is marked. */
export type TextBlock = AnthropicMessage["content"][number];
/**
 * The finalized turns a history neither returns nor covers with its summary
 * (`HistoryResponse["unsummarized"]` when not null): what to fold next.
 */
export type Unsummarized = NonNullable<HistoryResponse["unsummarized"]>;

/** A session's rolling summary. */
export type Summary = JsonBody<GetSummaryOp["responses"][200]>;
/** The JSON body of `PUT .../summary`, as sent on the wire. */
export type PutSummaryBody = PutSummaryOp["requestBody"]["content"]["application/json"];

/** The JSON body of `POST .../import`, as sent on the wire. */
export type ImportBody = ImportOp["requestBody"]["content"]["application/json"];
/** How an import reads its messages: `strict` (the default) or `distill`. */
export type ImportMode = NonNullable<ImportBody["mode"]>;
/**
 * A message of a transcript as the spec states it, what a `distill` import
 * reads: any `role` (`system`, `developer`, `tool`, `function` are dropped,
 * `orchestrator` is an assistant), a `content` that is a string, an array
 * of parts or `null`, and an optional `timestamp` (RFC 3339 with its zone).
 * The server ignores the other fields agent loops write (`tool_calls`,
 * `refusal`, `name`, …).
 */
export type TranscriptMessage = ImportBody["messages"][number];
/** A part of a message's content: `text` parts are kept, any other `type` is dropped. */
export type TranscriptContentPart = Extract<NonNullable<TranscriptMessage["content"]>, readonly unknown[]>[number];
/**
 * One message of a `strict` import: a `user` message, or the `assistant`
 * message that answers it, with its text. (The spec reads any role, so that
 * the server can name every wrong one by its index; a strict import refuses
 * all but these two, and any other field.)
 */
export type ImportMessage = { role: "user" | "assistant"; content: string };
/** The reply to an import (201, or 200 for a replay). */
export type ImportResponse = JsonBody<ImportOp["responses"][201]>;
/** What a `distill` import dropped for one reason: how many, and the indexes of the first five. */
export type DroppedReport = NonNullable<ImportResponse["dropped"]>[number];
/** Why a `distill` import dropped a message, or a part of one. */
export type DroppedReason = DroppedReport["reason"];

/** The JSON body of `POST .../fork`, as sent on the wire. */
export type ForkBody = ForkOp["requestBody"]["content"]["application/json"];
/**
 * The reply to a fork (201, or 200 for a replay): the new session
 * (`session_id`), the session it was forked from, its owner (`null`: none),
 * the seq it copied through, the finalized turns copied, and whether the
 * summary came along.
 */
export type ForkResponse = JsonBody<ForkOp["responses"][201]>;

/** A line of a user's export, of either format. */
type ExportLine = NdjsonLine<ExportOp["responses"][200]>;
/** One line of a user's export: a session, its summary, its finalized turns oldest first. */
export type ExportedSession = Extract<ExportLine, { turns: unknown }>;
/**
 * One line of a user's export as transcripts (`format=messages`): a session,
 * its summary, and its finalized turns oldest first as `messages`, a user and
 * an assistant message each. The messages are an import's: with `mode:
 * "distill"` they make the same turns at the same times.
 */
export type ExportedTranscript = Extract<ExportLine, { messages: unknown }>;
/**
 * A message of an exported transcript: a turn's question (`user`, at its
 * `started_at`) or its answer (`assistant`, at its `finalized_at`).
 */
export type ExportedMessage = ExportedTranscript["messages"][number];

export type Session = JsonBody<GetSessionOp["responses"][200]>;
export type ListUserSessionsOptions = NonNullable<ListUserSessionsOp["parameters"]["query"]>;
export type UserSessionsPage = JsonBody<ListUserSessionsOp["responses"][200]>;
export type UserSession = UserSessionsPage["sessions"][number];
export type EraseUserResponse = JsonBody<EraseUserOp["responses"][200]>;

/** An RFC 9457 problem document, as every error response carries. */
export type Problem = ProblemBody<StartTurnOp["responses"][422]>;
export type FieldError = NonNullable<Problem["errors"]>[number];

/**
 * A history response narrowed by the options it was asked for: the server
 * returns exactly one of `rendered`, `messages`, `turns`, `anthropic`
 * (API.md), and `text` when no format is given (a `template` renders into
 * `rendered` too), but `messages` with `chat_template: true`, and then the
 * rendered `prompt` with `prompt: true`. A `turns` history read with
 * `summary: true` also has `summary` when the session has one and it fit the
 * budget. With `window: "stable"` it has `window`, and with that or
 * `cache_control: true` `breakpoint` (`null` for an empty history).
 */
export type HistoryFor<O> = FormatHistory<O> &
  (O extends { window: "stable" } ? { window: HistoryWindow } : unknown) &
  (O extends { window: "stable" } | { cache_control: true } ? { breakpoint: Breakpoint | null } : unknown);
type FormatHistory<O> = O extends { chat_template: true }
  ? MessagesHistory & (O extends { prompt: true } ? { prompt: string } : unknown)
  : O extends { format: "messages" }
    ? MessagesHistory
    : O extends { format: "turns" }
      ? HistoryResponse & { format: "turns"; turns: Turn[] }
      : O extends { format: "anthropic" }
        ? HistoryResponse & { format: "anthropic"; anthropic: AnthropicHistory }
        : // Options without `format` at all ({ limit: 1 }) are text too; a check
          // against { format?: undefined } alone would miss them (TypeScript's
          // weak-type rule: no common property, so no match).
          "format" extends keyof O
          ? O extends { format?: "text" | undefined }
            ? TextHistory
            : HistoryResponse
          : TextHistory;
type TextHistory = HistoryResponse & { format: "text"; rendered: string };
type MessagesHistory = HistoryResponse & { format: "messages"; messages: HistoryMessage[] };
