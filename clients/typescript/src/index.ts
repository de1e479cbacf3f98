export {
  CLIENT_DEFAULTS,
  TurnstoreClient,
  type CallOptions,
  type DistillImportInput,
  type DistilledImportResult,
  type EraseUserOptions,
  type ErasedUser,
  type FinalAnswer,
  type ForkInput,
  type ForkOptions,
  type ForkResult,
  type HistoryText,
  type ImportInput,
  type ImportOptions,
  type ImportResult,
  type PutSummaryInput,
  type StartTurnInput,
  type StrictImportInput,
  type StartedTurn,
  type TurnContext,
  type TurnstoreClientOptions,
} from "./client.js";
export {
  anthropicRequest,
  chatMessages,
  type AnthropicRequest,
  type AnthropicRequestInput,
  type ChatMessage,
  type ChatMessagesInput,
} from "./chat.js";
export {
  TRANSPORT_FAILURE_STATUS,
  TurnstoreError,
  type ClientErrorCode,
  type ErrorCode,
  type TurnstoreErrorInit,
} from "./errors.js";
export { backoffDelay, type RetryPolicy } from "./retry.js";
export type { OpenTelemetryApi, SpanContextLike } from "./tracing.js";
export type * from "./types.js";
// The generated OpenAPI types, for callers who use openapi-fetch directly.
export type { components, operations, paths } from "./schema.js";
