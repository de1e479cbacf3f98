// turnstore-client/ai against the real server, with the real `ai` package
// and its mock language model (no network).
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { createTextStreamResponse, isStepCount, jsonSchema, simulateReadableStream, tool, toTextStream } from "ai";
import { MockLanguageModelV4 } from "ai/test";
import { TurnstoreClient, TurnstoreError } from "turnstore-client";
import { type TurnOutcome, modelPrompt, streamTurn } from "turnstore-client/ai";
import { id } from "./support/assertions.js";
import { type RunningTurnstore, startTurnstore } from "./support/processes.js";

type StreamResult = Awaited<ReturnType<MockLanguageModelV4["doStream"]>>;
type StreamPart = StreamResult["stream"] extends ReadableStream<infer P> ? P : never;
type Prompt = MockLanguageModelV4["doStreamCalls"][number]["prompt"];

const USAGE = {
  inputTokens: { total: 3, noCache: 3, cacheRead: undefined, cacheWrite: undefined },
  outputTokens: { total: 2, text: 2, reasoning: undefined },
};
const FINISH: StreamPart = { type: "finish", finishReason: { unified: "stop", raw: undefined }, usage: USAGE };

/** A model stream of `text`, a word a chunk. */
function textParts(text: string): StreamPart[] {
  const words = text.split(/(?<= )/);
  return [
    { type: "text-start", id: "t" },
    ...words.map((delta): StreamPart => ({ type: "text-delta", id: "t", delta })),
    { type: "text-end", id: "t" },
    FINISH,
  ];
}

const streamOf = (chunks: StreamPart[], chunkDelayInMs: number | null = null): StreamResult => ({
  stream: simulateReadableStream({ chunks, chunkDelayInMs }),
});

/** A model that answers call n with `answer(n)`. */
const answering = (answer: (call: number) => string): MockLanguageModelV4 => {
  let calls = 0;
  return new MockLanguageModelV4({ doStream: async () => streamOf(textParts(answer(++calls))) });
};

/** Each message of a model call's prompt as [role, its text]. */
const promptText = (prompt: Prompt): string[][] =>
  prompt.map((m) => [
    m.role,
    typeof m.content === "string" ? m.content : m.content.map((p) => ("text" in p ? p.text : `[${p.type}]`)).join(""),
  ]);

async function readAll(stream: ReadableStream<string> | AsyncIterable<string>): Promise<string> {
  let text = "";
  for await (const chunk of stream as AsyncIterable<string>) text += chunk;
  return text;
}

describe("turnstore-client/ai: streamTurn", { timeout: 60_000 }, () => {
  let server: RunningTurnstore;
  let turnstore: TurnstoreClient;
  before(async () => {
    server = await startTurnstore();
    turnstore = new TurnstoreClient({ baseUrl: server.baseUrl });
  });
  after(async () => {
    await server?.stop();
  });

  const turnsOf = async (sessionId: string): Promise<string[][]> =>
    (await turnstore.getHistory(sessionId, { format: "turns" })).turns.map((t) => [t.user_query, t.final_answer]);
  const pendingOf = async (sessionId: string): Promise<number> =>
    (await turnstore.getHistory(sessionId, { format: "turns" })).pending_turns;
  const aborted = (outcome: TurnOutcome): unknown => {
    assert.equal(outcome.status, "aborted", JSON.stringify(outcome));
    return outcome.status === "aborted" ? outcome.reason : undefined;
  };

  it("streams the answer and finalizes the turn before the stream ends; the next call gets it as history", async () => {
    const sessionId = id("ai");
    const model = answering((n) => `answer number ${n}`);
    const ask = (question: string) =>
      streamTurn(
        turnstore,
        { sessionId, userId: "alice", userQuery: question, history: { max_tokens: 2000, model: "gpt-4o" } },
        { model, instructions: "Answer from the context." },
      );
    const first = await ask("What is a vector index?");
    assert.equal(first.turn.seq, 1);
    assert.deepEqual(first.turn.history.messages, []);
    assert.equal(await readAll(first.result.textStream), "answer number 1");
    // Finalized by the time the stream ended, without waiting for `done`.
    assert.deepEqual(await turnsOf(sessionId), [["What is a vector index?", "answer number 1"]]);
    const outcome = await first.done;
    assert.equal(outcome.status, "finalized");
    assert.equal(outcome.status === "finalized" && outcome.turn.turn_id, first.turn.turn_id);

    const second = await ask("And how is it built?");
    assert.equal(await readAll(second.result.textStream), "answer number 2");
    assert.deepEqual(promptText(model.doStreamCalls[1]?.prompt ?? []), [
      ["system", "Answer from the context."],
      ["user", "What is a vector index?"],
      ["assistant", "answer number 1"],
      ["user", "And how is it built?"],
    ]);
    assert.equal((await second.done).status, "finalized");
    assert.deepEqual(await turnsOf(sessionId), [
      ["What is a vector index?", "answer number 1"],
      ["And how is it built?", "answer number 2"],
    ]);
    assert.equal((await turnstore.getSession(sessionId)).user_id, "alice");
  });

  it("aborts the turn when the model throws: nothing is finalized", async () => {
    const sessionId = id("ai");
    const model = new MockLanguageModelV4({
      doStream: async () => {
        throw new Error("model down");
      },
    });
    const errors: unknown[] = [];
    const { result, done } = await streamTurn(
      turnstore,
      { sessionId, userQuery: "q1" },
      { model, onError: ({ error }) => void errors.push(error) },
    );
    assert.equal(await readAll(result.textStream), "");
    assert.match(String(aborted(await done)), /model down/);
    assert.match(String(errors[0]), /model down/, "the caller's onError is still called");
    assert.deepEqual(await turnsOf(sessionId), []);
    assert.equal(await pendingOf(sessionId), 0);
    await assert.rejects(Promise.resolve(result.text));
  });

  it("aborts the turn on an error part in the middle of the answer: a partial answer is not kept", async () => {
    const sessionId = id("ai");
    const model = new MockLanguageModelV4({
      doStream: async () =>
        streamOf([
          { type: "text-start", id: "t" },
          { type: "text-delta", id: "t", delta: "A partial " },
          { type: "error", error: new Error("connection reset") },
          FINISH,
        ]),
    });
    const { result, done } = await streamTurn(turnstore, { sessionId, userQuery: "q1" }, { model, onError: () => undefined });
    await readAll(result.textStream).catch(() => "");
    assert.match(String(aborted(await done)), /connection reset/);
    assert.deepEqual(await turnsOf(sessionId), []);
    assert.equal(await pendingOf(sessionId), 0);
  });

  it("finalizes after an error part that a stream retry recovered", async () => {
    const sessionId = id("ai");
    let calls = 0;
    const model = new MockLanguageModelV4({
      doStream: async () =>
        ++calls === 1
          ? streamOf([{ type: "text-start", id: "t" }, { type: "error", error: new Error("overloaded") }])
          : streamOf(textParts("recovered answer")),
    });
    const { result, done } = await streamTurn(
      turnstore,
      { sessionId, userQuery: "q1" },
      { model, streamRetries: 1, onError: () => undefined },
    );
    await readAll(result.textStream);
    assert.equal(calls, 2);
    assert.equal((await done).status, "finalized");
    assert.deepEqual(await turnsOf(sessionId), [["q1", "recovered answer"]]);
  });

  it("aborts the turn when abortSignal fires (a client that went away)", async () => {
    const sessionId = id("ai");
    const model = new MockLanguageModelV4({
      doStream: async () => streamOf(textParts("a slow answer in many words that never ends well"), 50),
    });
    const controller = new AbortController();
    const { result, done } = await streamTurn(
      turnstore,
      { sessionId, userQuery: "q1" },
      { model, abortSignal: controller.signal },
    );
    const reader = result.textStream.getReader();
    await reader.read();
    controller.abort(new Error("client went away"));
    assert.match(String(aborted(await done)), /client went away/);
    assert.deepEqual(await turnsOf(sessionId), []);
    assert.equal(await pendingOf(sessionId), 0);
    await reader.cancel().catch(() => undefined);
  });

  it("finalizes the whole answer when the reader stops early: the stream is consumed to its end", async () => {
    const sessionId = id("ai");
    const model = new MockLanguageModelV4({ doStream: async () => streamOf(textParts("the whole answer arrives"), 5) });
    const { result, done } = await streamTurn(turnstore, { sessionId, userQuery: "q1" }, { model });
    const reader = result.textStream.getReader();
    await reader.read();
    await reader.cancel();
    assert.equal((await done).status, "finalized");
    assert.deepEqual(await turnsOf(sessionId), [["q1", "the whole answer arrives"]]);
  });

  it("aborts the turn of an empty answer, which turnstore refuses", async () => {
    const sessionId = id("ai");
    const model = new MockLanguageModelV4({ doStream: async () => streamOf([FINISH]) });
    const { result, done } = await streamTurn(turnstore, { sessionId, userQuery: "q1" }, { model });
    await readAll(result.textStream);
    const reason = aborted(await done);
    assert.ok(reason instanceof TurnstoreError && reason.status === 422, String(reason));
    assert.equal(await pendingOf(sessionId), 0);
  });

  it("aborts the turn when streamText throws, and rethrows", async () => {
    const sessionId = id("ai");
    const unsupported = { specificationVersion: "v1", provider: "old", modelId: "m" } as never;
    await assert.rejects(streamTurn(turnstore, { sessionId, userQuery: "q1" }, { model: unsupported }), /v1|[Uu]nsupported/);
    assert.equal(await pendingOf(sessionId), 0);
  });

  it("finalizes with the final step's text after tool calls", async () => {
    const sessionId = id("ai");
    let calls = 0;
    const model = new MockLanguageModelV4({
      doStream: async () =>
        ++calls === 1
          ? streamOf([
              { type: "text-start", id: "t" },
              { type: "text-delta", id: "t", delta: "Let me look that up. " },
              { type: "text-end", id: "t" },
              { type: "tool-call", toolCallId: "call-1", toolName: "weather", input: '{"city":"Paris"}' },
              { type: "finish", finishReason: { unified: "tool-calls", raw: undefined }, usage: USAGE },
            ])
          : streamOf(textParts("It is 21 °C in Paris.")),
    });
    const weather = tool({
      description: "The weather in a city.",
      inputSchema: jsonSchema<{ city: string }>({ type: "object", properties: { city: { type: "string" } }, required: ["city"] }),
      execute: async () => ({ celsius: 21 }),
    });
    const { result, done } = await streamTurn(
      turnstore,
      { sessionId, userQuery: "Weather in Paris?" },
      { model, tools: { weather }, stopWhen: isStepCount(2) },
    );
    await readAll(result.textStream);
    assert.equal(calls, 2);
    assert.equal((await done).status, "finalized");
    assert.deepEqual(await turnsOf(sessionId), [["Weather in Paris?", "It is 21 °C in Paris."]]);
  });

  it("gives a summary: true history's summary to the model as instructions, after the caller's", async () => {
    const sessionId = id("ai");
    await turnstore.importMessages(sessionId, {
      messages: [
        { role: "user", content: "q1" },
        { role: "assistant", content: "a1" },
        { role: "user", content: "q2" },
        { role: "assistant", content: "a2" },
      ],
    });
    await turnstore.putSummary(sessionId, { summary: "Asked q1.", throughSeq: 1 });
    const model = answering(() => "a3");
    const { result, done } = await streamTurn(
      turnstore,
      { sessionId, userQuery: "q3", history: { summary: true } },
      { model, system: "Be brief." },
    );
    await readAll(result.textStream);
    assert.equal((await done).status, "finalized");
    const prompt = promptText(model.doStreamCalls[0]?.prompt ?? []);
    assert.deepEqual(prompt[0], ["system", "Be brief."]);
    assert.equal(prompt[1]?.[0], "system");
    assert.match(prompt[1]?.[1] ?? "", /Asked q1\./);
    assert.deepEqual(prompt.slice(2), [
      ["user", "q2"],
      ["assistant", "a2"],
      ["user", "q3"],
    ]);
  });

  it("serves a text response a client reads to its end", async () => {
    const sessionId = id("ai");
    const { result, done } = await streamTurn(turnstore, { sessionId, userQuery: "q1" }, { model: answering(() => "streamed") });
    const response = createTextStreamResponse({ stream: toTextStream({ stream: result.stream }) });
    assert.equal(await response.text(), "streamed");
    assert.deepEqual(await turnsOf(sessionId), [["q1", "streamed"]]);
    assert.equal((await done).status, "finalized");
  });

  it("modelPrompt: the caller's instructions and the history's system messages apart from the messages", () => {
    assert.deepEqual(
      modelPrompt({
        instructions: "Be brief.",
        history: [
          { role: "system", content: "Summary" },
          { role: "user", content: "q1" },
          { role: "assistant", content: "a1" },
        ],
        userQuery: "q2",
      }),
      {
        instructions: [
          { role: "system", content: "Be brief." },
          { role: "system", content: "Summary" },
        ],
        messages: [
          { role: "user", content: "q1" },
          { role: "assistant", content: "a1" },
          { role: "user", content: "q2" },
        ],
      },
    );
    assert.deepEqual(modelPrompt({ userQuery: "q" }), { instructions: [], messages: [{ role: "user", content: "q" }] });
  });
});
