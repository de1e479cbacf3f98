import type { HistoryMessage, HistoryResponse } from "./types.js";

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
  for (const message of historyMessages(input.history)) {
    messages.push(toChatMessage(message));
  }
  messages.push({ role: "user", content: input.userQuery });
  return messages;
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
