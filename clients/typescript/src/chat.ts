import type { AnthropicHistory, AnthropicMessage, HistoryMessage, HistoryResponse, TextBlock } from "./types.js";

/**
 * An OpenAI-style chat message. The union (rather than `role: string`) is
 * what makes an array of them assignable to the `messages` parameter of the
 * openai package, whose message types are discriminated by `role`.
 */
export type ChatMessage =
  | { role: "system"; content: string }
  | { role: "user"; content: string }
  | { role: "assistant"; content: string };

export interface ChatMessagesInput {
  /** The system prompt; omitted from the result when absent or empty. */
  system?: string | undefined;
  /**
   * The history in `messages` format: a history response asked for with
   * `format: "messages"`, or its `messages` array. Absent: no history.
   */
  history?: HistoryResponse | readonly HistoryMessage[] | undefined;
  /** The new question, last in the result. */
  userQuery: string;
}

/**
 * Builds the prompt of a chat completion: system prompt, then the history's
 * messages oldest first, then the new question.
 */
export function chatMessages(input: ChatMessagesInput): ChatMessage[] {
  const messages: ChatMessage[] = [];
  if (input.system) messages.push({ role: "system", content: input.system });
  messages.push(...historyChatMessages(input.history));
  messages.push({ role: "user", content: input.userQuery });
  return messages;
}

/**
 * The history's messages as chat messages, oldest first (a `summary: true`
 * history's summary first, as a `system` message). Not exported from the
 * package's index: what the framework adapters build their messages from.
 */
export function historyChatMessages(history: HistoryResponse | readonly HistoryMessage[] | undefined): ChatMessage[] {
  return historyMessages(history).map(toChatMessage);
}

function historyMessages(
  history: HistoryResponse | readonly HistoryMessage[] | undefined,
): readonly HistoryMessage[] {
  if (history === undefined) return [];
  if (isMessageArray(history)) return history;
  if (history.messages == null) {
    // A text or turns history would silently vanish from the prompt.
    throw new TypeError(
      `chatMessages needs a history in messages format, got format "${history.format}": ` +
        'ask for it with history: { format: "messages" }',
    );
  }
  return history.messages;
}

function isMessageArray(
  history: HistoryResponse | readonly HistoryMessage[],
): history is readonly HistoryMessage[] {
  return Array.isArray(history);
}

function toChatMessage(message: HistoryMessage): ChatMessage {
  const { content } = message;
  // Widened on purpose: a newer server may send roles this spec version does
  // not list. Known ones pass (a `system` message is the summary of a
  // `summary: true` history), others fail here rather than inside the model
  // provider's API.
  const role: string = message.role;
  switch (role) {
    case "system":
    case "user":
    case "assistant":
      return { role, content };
    default:
      throw new TypeError(`unexpected history message role: ${JSON.stringify(role)}`);
  }
}

export interface AnthropicRequestInput {
  /** Your system prompt: a text block before the history's own (its summary's); omitted when
   * absent or empty. */
  system?: string | undefined;
  /**
   * The history in `anthropic` format: a history response asked for with
   * `format: "anthropic"`, or its `anthropic` field. Absent: no history.
   */
  history?: HistoryResponse | AnthropicHistory | undefined;
  /** The new question, the last user message. */
  userQuery: string;
}

/**
 * The `system` and `messages` of a request to Anthropic's Messages API:
 * `client.messages.create({ model, max_tokens, ...request })`. `system` is
 * absent when there is none.
 */
export interface AnthropicRequest {
  system?: TextBlock[];
  messages: AnthropicMessage[];
}

/**
 * Builds the `system` and `messages` of a Messages API request: your system
 * prompt's block, then the history's (its summary's), then its messages
 * oldest first and the new question as the last user message, as fresh
 * objects. The history's `cache_control` marks (read with `cache_control:
 * true`) stay where they are: on the summary's block and on the last block
 * of the history, so the prompt up to the new question is what is cached.
 */
export function anthropicRequest(input: AnthropicRequestInput): AnthropicRequest {
  const history = anthropicHistory(input.history);
  const system: TextBlock[] = input.system ? [{ type: "text", text: input.system }] : [];
  system.push(...(history?.system ?? []).map(copyBlock));
  const messages = (history?.messages ?? []).map((m) => ({ role: m.role, content: m.content.map(copyBlock) }));
  messages.push({ role: "user", content: [{ type: "text", text: input.userQuery }] });
  return system.length > 0 ? { system, messages } : { messages };
}

function anthropicHistory(history: HistoryResponse | AnthropicHistory | undefined): AnthropicHistory | undefined {
  if (history === undefined || !("format" in history)) return history;
  if (history.anthropic == null) {
    // Another format's turns would silently vanish from the request.
    throw new TypeError(
      `anthropicRequest needs a history in anthropic format, got format "${history.format}": ` +
        'ask for it with history: { format: "anthropic" }',
    );
  }
  return history.anthropic;
}

function copyBlock(block: TextBlock): TextBlock {
  return block.cache_control ? { ...block, cache_control: { ...block.cache_control } } : { ...block };
}
