// `turnstore-client/langchain`: a LangChain.js chat message history over
// turnstore. turnstore keeps each exchange as its question and final answer,
// so a human message starts a turn and the AI message that answers it
// finalizes the turn; system, tool and intermediate (tool-calling) messages
// are not stored. Imports @langchain/core, an optional peer dependency: only
// this entry point does, never the package's main one.
import { BaseListChatMessageHistory } from "@langchain/core/chat_history";
import { AIMessage, type BaseMessage, ChatMessage, HumanMessage, SystemMessage } from "@langchain/core/messages";
import { type ChatMessage as TurnstoreMessage, historyChatMessages } from "./chat.js";
import type { CallOptions, TurnstoreClient } from "./client.js";
import { abortQuietly, cleanupCall, finalizeOrAbort, inMessagesFormat } from "./turn-steps.js";
import type { HistoryMessage, HistoryResponse, MessagesHistoryOptions } from "./types.js";

export interface TurnstoreChatMessageHistoryInput {
  /** The client to reach turnstore with (its URL, key and retries). */
  client: TurnstoreClient;
  /** The conversation. */
  sessionId: string;
  /** The session's owner: sent with every start (a session belongs to the first user it is started with). */
  userId?: string | undefined;
  /**
   * The history `getMessages()` returns, the one the prompt gets: its
   * selection and exact budget (`max_tokens` with the `model` or `encoding`
   * that counts it, `limit`, `summary`, `keep_first`, …), in `messages`
   * format. Absent: the server's defaults.
   */
  history?: MessagesHistoryOptions | undefined;
  /** Sent as `x-request-id` with each call, to follow them in turnstore's logs. */
  requestId?: string | undefined;
}

/** A question started and not answered yet. */
interface PendingTurn {
  turnId: string;
  question: string;
  /** The history as it stood before the question (the start's), when it was asked for. */
  before: BaseMessage[] | undefined;
}

/**
 * A LangChain chat message history over one turnstore session, for
 * `RunnableWithMessageHistory` or a hand-written chain.
 *
 * - `getMessages()` reads the session's history in `messages` format with
 *   the `history` options (the exact token budget): the newest finalized
 *   turns as human and AI messages, a `summary: true` history's summary
 *   first as a system message. While a question added here waits for its
 *   answer, the history is the one its start returned, followed by the
 *   question.
 * - A human message (`addUserMessage`, or in `addMessages`/`addMessage`)
 *   starts a turn with its text; human messages in a row make one question,
 *   their texts joined by a blank line (as turnstore's distill import reads
 *   them).
 * - The AI message that follows finalizes that turn with its text. An AI
 *   message that calls tools is an intermediate step, not the answer, and is
 *   skipped; an AI message with no question before it, added through this
 *   object, is an error.
 * - System, developer, tool and function messages are not stored.
 * - `clear()` deletes the session; `abortPendingTurn()` removes a question
 *   whose answer will not come (the model failed).
 *
 * One object holds at most one pending question: use one per conversation
 * and request (`getMessageHistory` may make a new one each call).
 */
export class TurnstoreChatMessageHistory extends BaseListChatMessageHistory {
  override lc_namespace = ["turnstore", "stores", "message"];

  readonly sessionId: string;
  readonly userId: string | undefined;
  readonly #client: TurnstoreClient;
  readonly #history: MessagesHistoryOptions;
  readonly #call: CallOptions;
  #pending: PendingTurn | undefined;

  constructor(input: TurnstoreChatMessageHistoryInput) {
    super();
    this.#client = input.client;
    this.sessionId = input.sessionId;
    this.userId = input.userId;
    this.#history = input.history ?? {};
    this.#call = { requestId: input.requestId };
  }

  /**
   * The history for the prompt, oldest first, within the budget of the
   * `history` options; while a question waits for its answer, the history
   * before it, then the question.
   */
  override async getMessages(): Promise<BaseMessage[]> {
    const pending = this.#pending;
    if (pending === undefined) return this.#read();
    const before = pending.before ?? (await this.#read());
    return [...before, new HumanMessage(pending.question)];
  }

  /** Adds one message: see `addMessages`. */
  override async addMessage(message: BaseMessage): Promise<void> {
    await this.addMessages([message]);
  }

  /**
   * Adds messages in order: a human message (or several in a row) starts a
   * turn, the AI message that answers it finalizes the turn; AI messages
   * that call tools, and system, developer, tool and function messages, are
   * skipped. A question whose answer is in the same call (what
   * `RunnableWithMessageHistory` adds after a run) is started without
   * reading the history again. When turnstore refuses an answer (blank, or
   * too large) the turn is aborted and the error thrown.
   */
  override async addMessages(messages: BaseMessage[]): Promise<void> {
    let question: string[] = [];
    for (const message of messages) {
      const kind = messageKind(message);
      if (kind === "question") {
        question.push(message.text);
      } else if (kind === "answer") {
        if (question.length > 0) await this.#ask(question.join("\n\n"), false);
        question = [];
        await this.#answer(message.text);
      }
    }
    if (question.length > 0) await this.#ask(question.join("\n\n"), true);
  }

  /** Deletes the session, its turns and its summary; a pending question here is forgotten. */
  override async clear(): Promise<void> {
    this.#pending = undefined;
    await this.#client.clearSession(this.sessionId, this.#call);
  }

  /**
   * Removes the question added here that waits for its answer (the model
   * failed): nothing of it stays. Nothing to do when there is none. A failure
   * to reach turnstore is swallowed, so that the caller reports the error
   * that made it abort: the pending turn then expires after the server's
   * pending TTL.
   */
  async abortPendingTurn(): Promise<void> {
    const pending = this.#pending;
    this.#pending = undefined;
    if (pending !== undefined) await abortQuietly(this.#client, this.sessionId, pending.turnId, cleanupCall(this.#call));
  }

  async #read(): Promise<BaseMessage[]> {
    const history = await this.#client.getHistory(this.sessionId, inMessagesFormat(this.#history), this.#call);
    return langChainMessages(history);
  }

  /** Starts the turn of `question`; a question still waiting here is asked again with it. */
  async #ask(question: string, withHistory: boolean): Promise<void> {
    const waiting = this.#pending;
    if (waiting !== undefined) {
      // Questions in a row are one question: the waiting turn is asked again with this one.
      this.#pending = undefined;
      await abortQuietly(this.#client, this.sessionId, waiting.turnId, cleanupCall(this.#call));
      question = `${waiting.question}\n\n${question}`;
    }
    const input = { sessionId: this.sessionId, userId: this.userId, userQuery: question };
    if (withHistory) {
      const started = await this.#client.startTurn({ ...input, history: inMessagesFormat(this.#history) }, this.#call);
      this.#pending = { turnId: started.turn_id, question, before: langChainMessages(started.history) };
    } else {
      const started = await this.#client.startTurn(input, this.#call);
      this.#pending = { turnId: started.turn_id, question, before: undefined };
    }
  }

  async #answer(answer: string): Promise<void> {
    const pending = this.#pending;
    if (pending === undefined) {
      throw new Error(
        `turnstore keeps each exchange as a question and its answer: this AI message answers no question ` +
          `of session ${JSON.stringify(this.sessionId)} (add the human message before it to the same history object)`,
      );
    }
    // Whatever the outcome, the question no longer waits here: finalized, aborted
    // (an answer refused), or left alone (the finalize may have gone through).
    this.#pending = undefined;
    await finalizeOrAbort(this.#client, this.sessionId, pending.turnId, answer, cleanupCall(this.#call));
  }
}

/** How a message is kept: a question, an answer, or not at all. */
function messageKind(message: BaseMessage): "question" | "answer" | "skip" {
  const type = message.getType();
  const role = type === "generic" && ChatMessage.isInstance(message) ? message.role : type;
  switch (role) {
    case "human":
    case "user":
      return "question";
    case "ai":
    case "assistant":
      return callsTools(message) ? "skip" : "answer";
    default:
      // system, developer, tool, function, remove, other roles
      return "skip";
  }
}

/** An AI message that calls tools: a step towards the answer, not the answer. */
function callsTools(message: BaseMessage): boolean {
  if (!AIMessage.isInstance(message)) return false;
  return (message.tool_calls?.length ?? 0) > 0 || (message.invalid_tool_calls?.length ?? 0) > 0;
}

/** A turnstore history in messages format as LangChain messages. */
function langChainMessages(history: HistoryResponse | readonly HistoryMessage[]): BaseMessage[] {
  return historyChatMessages(history).map(langChainMessage);
}

function langChainMessage(message: TurnstoreMessage): BaseMessage {
  switch (message.role) {
    case "system":
      return new SystemMessage(message.content);
    case "user":
      return new HumanMessage(message.content);
    case "assistant":
      return new AIMessage(message.content);
  }
}
