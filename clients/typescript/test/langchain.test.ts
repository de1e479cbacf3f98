// turnstore-client/langchain against the real server, with the real
// @langchain/core and its fake chat models (no network).
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import {
  AIMessage,
  type BaseMessage,
  ChatMessage,
  HumanMessage,
  SystemMessage,
  ToolMessage,
} from "@langchain/core/messages";
import type { ChatPromptValueInterface } from "@langchain/core/prompt_values";
import { ChatPromptTemplate, MessagesPlaceholder } from "@langchain/core/prompts";
import { RunnableLambda, RunnableWithMessageHistory } from "@langchain/core/runnables";
import { FakeListChatModel, FakeStreamingChatModel } from "@langchain/core/utils/testing";
import { type MessagesHistoryOptions, TurnstoreClient } from "turnstore-client";
import { TurnstoreChatMessageHistory } from "turnstore-client/langchain";
import { id, turnstoreError } from "./support/assertions.js";
import { type RunningTurnstore, startTurnstore } from "./support/processes.js";

/** A message as [type, text], to compare histories. */
const plain = (messages: BaseMessage[]): string[][] => messages.map((m) => [m.getType(), m.text]);

describe("turnstore-client/langchain: TurnstoreChatMessageHistory", { timeout: 60_000 }, () => {
  let server: RunningTurnstore;
  let turnstore: TurnstoreClient;
  /** The client's requests, as "METHOD /path" with the ids cut to their kind. */
  let calls: string[];
  let recording: TurnstoreClient;
  before(async () => {
    server = await startTurnstore();
    turnstore = new TurnstoreClient({ baseUrl: server.baseUrl });
    recording = new TurnstoreClient({
      baseUrl: server.baseUrl,
      fetch: (request) => {
        const path = new URL(request.url).pathname
          .replace(/\/sessions\/[^/]+/, "/sessions/{s}")
          .replace(/\/turns\/[^/]+/, "/turns/{t}");
        calls.push(`${request.method} ${path}`);
        return fetch(request);
      },
    });
  });
  after(async () => {
    await server?.stop();
  });

  const turnsOf = async (sessionId: string): Promise<string[][]> =>
    (await turnstore.getHistory(sessionId, { format: "turns" })).turns.map((t) => [t.user_query, t.final_answer]);
  const pendingOf = async (sessionId: string): Promise<number> =>
    (await turnstore.getHistory(sessionId, { format: "turns" })).pending_turns;

  describe("with RunnableWithMessageHistory", () => {
    const prompt = ChatPromptTemplate.fromMessages([
      ["system", "Answer from the context."],
      new MessagesPlaceholder("history"),
      ["human", "{question}"],
    ]);

    it("reads the bounded history before the run, then stores the exchange as one turn", async () => {
      const sessionId = id("lc");
      const prompts: string[][][] = [];
      const model = new FakeListChatModel({ responses: ["answer 1", "answer 2"] });
      const chain = prompt
        .pipe(
          RunnableLambda.from((value: ChatPromptValueInterface) => {
            prompts.push(plain(value.toChatMessages()));
            return value;
          }),
        )
        .pipe(model);
      const withHistory = new RunnableWithMessageHistory({
        runnable: chain,
        getMessageHistory: (session: string) =>
          new TurnstoreChatMessageHistory({
            client: recording,
            sessionId: session,
            userId: "alice",
            history: { max_tokens: 2000, model: "gpt-4o" },
          }),
        inputMessagesKey: "question",
        historyMessagesKey: "history",
      });
      calls = [];
      const first = await withHistory.invoke({ question: "What is a vector index?" }, { configurable: { sessionId } });
      assert.equal(first.text, "answer 1");
      // The order RunnableWithMessageHistory calls in: getMessages, the model, addMessages([human, ai]).
      assert.deepEqual(calls, [
        "GET /v1/sessions/{s}/history",
        "POST /v1/turns",
        "POST /v1/sessions/{s}/turns/{t}/finalize",
      ]);
      await withHistory.invoke({ question: "And how is it built?" }, { configurable: { sessionId } });
      assert.deepEqual(prompts, [
        [
          ["system", "Answer from the context."],
          ["human", "What is a vector index?"],
        ],
        [
          ["system", "Answer from the context."],
          ["human", "What is a vector index?"],
          ["ai", "answer 1"],
          ["human", "And how is it built?"],
        ],
      ]);
      assert.deepEqual(await turnsOf(sessionId), [
        ["What is a vector index?", "answer 1"],
        ["And how is it built?", "answer 2"],
      ]);
      assert.equal((await turnstore.getSession(sessionId)).user_id, "alice");
    });

    it("keeps only the new exchange when the runnable takes the messages (history read twice)", async () => {
      const sessionId = id("lc");
      const model = new FakeListChatModel({ responses: ["answer 1", "answer 2"] });
      const withHistory = new RunnableWithMessageHistory({
        runnable: model,
        getMessageHistory: (session: string) => new TurnstoreChatMessageHistory({ client: recording, sessionId: session }),
      });
      await withHistory.invoke("question 1", { configurable: { sessionId } });
      calls = [];
      await withHistory.invoke([new HumanMessage("question 2")], { configurable: { sessionId } });
      // Without a historyMessagesKey it reads again after the run, to cut the history off the input.
      assert.deepEqual(calls, [
        "GET /v1/sessions/{s}/history",
        "GET /v1/sessions/{s}/history",
        "POST /v1/turns",
        "POST /v1/sessions/{s}/turns/{t}/finalize",
      ]);
      assert.deepEqual(await turnsOf(sessionId), [
        ["question 1", "answer 1"],
        ["question 2", "answer 2"],
      ]);
    });

    it("starts and finalizes nothing when the model throws", async () => {
      const sessionId = id("lc");
      await turnstore.importMessages(sessionId, { messages: [{ role: "user", content: "q0" }, { role: "assistant", content: "a0" }] });
      const withHistory = new RunnableWithMessageHistory({
        runnable: prompt.pipe(new FakeStreamingChatModel({ thrownErrorString: "model down" })),
        getMessageHistory: (session: string) => new TurnstoreChatMessageHistory({ client: recording, sessionId: session }),
        inputMessagesKey: "question",
        historyMessagesKey: "history",
      });
      calls = [];
      await assert.rejects(withHistory.invoke({ question: "q1" }, { configurable: { sessionId } }), /model down/);
      assert.deepEqual(calls, ["GET /v1/sessions/{s}/history"]);
      assert.deepEqual(await turnsOf(sessionId), [["q0", "a0"]]);
      assert.equal(await pendingOf(sessionId), 0);
    });
  });

  describe("by hand", () => {
    it("starts the turn with the question, answers from the start's history, finalizes with the answer", async () => {
      const sessionId = id("lc");
      await turnstore.importMessages(sessionId, { messages: [{ role: "user", content: "q1" }, { role: "assistant", content: "a1" }] });
      const history = new TurnstoreChatMessageHistory({ client: recording, sessionId, history: { format: "messages" } });
      calls = [];
      await history.addUserMessage("q2");
      assert.equal(await pendingOf(sessionId), 1);
      // The start returned the history: no other read.
      assert.deepEqual(plain(await history.getMessages()), [
        ["human", "q1"],
        ["ai", "a1"],
        ["human", "q2"],
      ]);
      assert.deepEqual(calls, ["POST /v1/turns"]);
      const answer = await new FakeListChatModel({ responses: ["a2"] }).invoke(await history.getMessages());
      await history.addMessage(answer);
      assert.deepEqual(await turnsOf(sessionId), [
        ["q1", "a1"],
        ["q2", "a2"],
      ]);
      assert.equal(await pendingOf(sessionId), 0);
      assert.deepEqual(plain(await history.getMessages()), [
        ["human", "q1"],
        ["ai", "a1"],
        ["human", "q2"],
        ["ai", "a2"],
      ]);
    });

    it("aborts the pending turn when the model throws: nothing stays", async () => {
      const sessionId = id("lc");
      const history = new TurnstoreChatMessageHistory({ client: turnstore, sessionId });
      const model = new FakeStreamingChatModel({ thrownErrorString: "model down" });
      await history.addUserMessage("q1");
      assert.equal(await pendingOf(sessionId), 1);
      try {
        await history.addMessage(await model.invoke(await history.getMessages()));
        assert.fail("the model must throw");
      } catch (error) {
        assert.match(String(error), /model down/);
        await history.abortPendingTurn();
      }
      assert.equal(await pendingOf(sessionId), 0);
      assert.deepEqual(await turnsOf(sessionId), []);
      assert.deepEqual(await history.getMessages(), []);
      // Nothing is pending any more: a second abort does nothing.
      await history.abortPendingTurn();
    });

    it("keeps the budget: the newest turns that fit max_tokens, exactly as a history read returns them", async () => {
      const sessionId = id("lc");
      const long = (i: number): string => `answer ${i}: ${"vector index recall ".repeat(40)}`;
      const messages = Array.from({ length: 10 }, (_, i) => [
        { role: "user" as const, content: `question ${i + 1}` },
        { role: "assistant" as const, content: long(i + 1) },
      ]).flat();
      await turnstore.importMessages(sessionId, { messages });
      const options: MessagesHistoryOptions = { max_tokens: 500, model: "gpt-4o" };
      const history = new TurnstoreChatMessageHistory({ client: turnstore, sessionId, history: options });
      const read = await turnstore.getHistory(sessionId, { ...options, format: "messages" });
      assert.equal(read.stopped_by, "max_tokens");
      assert.ok(read.token_count <= 500 && read.included_turns >= 1 && read.included_turns < 10);
      const got = await history.getMessages();
      assert.deepEqual(
        got.map((m) => m.text),
        read.messages?.map((m) => m.content),
      );
      assert.equal(got.at(-1)?.text, long(10));
      // The start of the next question returns the same window.
      await history.addUserMessage("question 11");
      assert.deepEqual(
        (await history.getMessages()).map((m) => m.text),
        [...got.map((m) => m.text), "question 11"],
      );
      await history.abortPendingTurn();
    });

    it("puts a summary: true history's summary first, as a system message", async () => {
      const sessionId = id("lc");
      await turnstore.importMessages(sessionId, {
        messages: [
          { role: "user", content: "q1" },
          { role: "assistant", content: "a1" },
          { role: "user", content: "q2" },
          { role: "assistant", content: "a2" },
        ],
      });
      await turnstore.putSummary(sessionId, { summary: "Asked q1.", throughSeq: 1 });
      const history = new TurnstoreChatMessageHistory({ client: turnstore, sessionId, history: { summary: true } });
      const messages = await history.getMessages();
      assert.ok(messages[0] instanceof SystemMessage);
      assert.deepEqual(plain(messages).slice(1), [
        ["human", "q2"],
        ["ai", "a2"],
      ]);
      assert.match(messages[0].text, /Asked q1\./);
    });
  });

  describe("the question/answer principle", () => {
    it("keeps an agent run as its question and final answer: tool calls, tool results and system messages are not stored", async () => {
      const sessionId = id("lc");
      const history = new TurnstoreChatMessageHistory({ client: turnstore, sessionId });
      await history.addMessages([
        new SystemMessage("You are helpful."),
        new HumanMessage("What is the weather in Paris?"),
        new HumanMessage("In Celsius."),
        new AIMessage({ content: "", tool_calls: [{ id: "call-1", name: "weather", args: { city: "Paris" } }] }),
        new ToolMessage({ content: '{"celsius":21}', tool_call_id: "call-1" }),
        new AIMessage("It is 21 °C in Paris."),
        new ChatMessage("Thanks!", "user"),
        new ChatMessage("You're welcome.", "assistant"),
      ]);
      assert.deepEqual(await turnsOf(sessionId), [
        ["What is the weather in Paris?\n\nIn Celsius.", "It is 21 °C in Paris."],
        ["Thanks!", "You're welcome."],
      ]);
      assert.equal(await pendingOf(sessionId), 0);
    });

    it("asks questions added in a row, one call after the other, as one question", async () => {
      const sessionId = id("lc");
      const history = new TurnstoreChatMessageHistory({ client: turnstore, sessionId });
      await history.addUserMessage("first part");
      await history.addUserMessage("second part");
      assert.equal(await pendingOf(sessionId), 1);
      assert.deepEqual(plain(await history.getMessages()), [["human", "first part\n\nsecond part"]]);
      await history.addAIMessage("one answer");
      assert.deepEqual(await turnsOf(sessionId), [["first part\n\nsecond part", "one answer"]]);
    });

    it("refuses an answer without a question, and aborts the turn of a blank answer", async () => {
      const sessionId = id("lc");
      const history = new TurnstoreChatMessageHistory({ client: turnstore, sessionId });
      await assert.rejects(history.addAIMessage("Hello! How can I help?"), /answers no question/);
      await history.addUserMessage("q1");
      const error = await turnstoreError(history.addAIMessage("   "));
      assert.equal(error.status, 422);
      assert.equal(await pendingOf(sessionId), 0);
      assert.deepEqual(await turnsOf(sessionId), []);
    });

    it("clears the session", async () => {
      const sessionId = id("lc");
      const history = new TurnstoreChatMessageHistory({ client: turnstore, sessionId });
      await history.addMessages([new HumanMessage("q1"), new AIMessage("a1")]);
      await history.addUserMessage("q2");
      await history.clear();
      assert.deepEqual(await history.getMessages(), []);
      assert.equal((await turnstoreError(turnstore.getSession(sessionId))).status, 404);
    });
  });
});
