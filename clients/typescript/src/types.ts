// The one place that names the API's types. Every alias is reached through
// `paths` (operation, status, media type), never through a component name:
// the spec may rename its schemas or move responses into
// components/responses (both happened once) without any change here.
import type { paths } from "./schema.js";

type JsonBody<R> = R extends { content: { "application/json": infer T } } ? T : never;
type ProblemBody<R> = R extends { content: { "application/problem+json": infer T } } ? T : never;

type StartTurnOp = paths["/v1/turns"]["post"];
type FinalizeTurnOp = paths["/v1/sessions/{session_id}/turns/{turn_id}/finalize"]["post"];
type GetHistoryOp = paths["/v1/sessions/{session_id}/history"]["get"];
type GetSessionOp = paths["/v1/sessions/{session_id}"]["get"];
type ListUserSessionsOp = paths["/v1/users/{user_id}/sessions"]["get"];
type EraseUserOp = paths["/v1/users/{user_id}"]["delete"];

/** The JSON body of `POST /v1/turns`, as sent on the wire. */
export type StartTurnBody = StartTurnOp["requestBody"]["content"]["application/json"];
/** The reply to a start (201, or 200 for a replay). */
export type StartTurnResponse = JsonBody<StartTurnOp["responses"][201]>;
export type FinalizeTurnResponse = JsonBody<FinalizeTurnOp["responses"][200]>;
export type Turn = FinalizeTurnResponse["turn"];

/**
 * How to select and render a history: the query parameters of get_history,
 * also accepted as a start's `history` (same names, same rules).
 */
export type HistoryOptions = NonNullable<GetHistoryOp["parameters"]["query"]>;
export type HistoryResponse = JsonBody<GetHistoryOp["responses"][200]>;
export type HistoryFormat = HistoryResponse["format"];
export type HistoryMessage = NonNullable<HistoryResponse["messages"]>[number];

export type Session = JsonBody<GetSessionOp["responses"][200]>;
export type ListUserSessionsOptions = NonNullable<ListUserSessionsOp["parameters"]["query"]>;
export type UserSessionsPage = JsonBody<ListUserSessionsOp["responses"][200]>;
export type UserSession = UserSessionsPage["sessions"][number];
export type EraseUserResponse = JsonBody<EraseUserOp["responses"][200]>;

/** An RFC 9457 problem document, as every error response carries. */
export type Problem = ProblemBody<StartTurnOp["responses"][422]>;
export type FieldError = NonNullable<Problem["errors"]>[number];

/**
 * A history response narrowed by the format it was asked for: the server
 * returns exactly one of `rendered`, `messages`, `turns` (API.md), and `text`
 * when no format is given.
 */
export type HistoryFor<O> = O extends { format: "messages" }
  ? HistoryResponse & { format: "messages"; messages: HistoryMessage[] }
  : O extends { format: "turns" }
    ? HistoryResponse & { format: "turns"; turns: Turn[] }
    : O extends { format: "text" } | { format?: undefined }
      ? HistoryResponse & { format: "text"; rendered: string }
      : HistoryResponse;
