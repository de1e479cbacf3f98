// The README's RAG flow, end to end: the real turnstore, the real openai
// package, and a fake completions endpoint in place of OpenAI.
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import OpenAI from "openai";
import { TurnstoreClient, chatMessages } from "turnstore-client";
import { type FakeOpenAI, startFakeOpenAI } from "./support/fake-openai.js";
import { type RunningTurnstore, startTurnstore } from "./support/processes.js";

describe("RAG flow with the openai package", () => {
  let server: RunningTurnstore;
  let fake: FakeOpenAI;
  before(async () => {
    server = await startTurnstore();
    fake = await startFakeOpenAI((call) => `answer ${call}`);
  });
  after(async () => {
    await server?.stop();
    await fake?.stop();
  });

  it("passes chatMessages as-is to chat.completions.create and stores the answers", async () => {
    const turnstore = new TurnstoreClient({ baseUrl: server.baseUrl });
    const openai = new OpenAI({ apiKey: "sk-test", baseURL: fake.baseURL, maxRetries: 0 });
    const sessionId = `chat-${crypto.randomUUID()}`;
    const ask = (userQuery: string) =>
      turnstore.turn(
        { sessionId, userId: "alice", userQuery, history: { format: "messages", max_tokens: 2000, model: "gpt-4o" } },
        async (turn) => {
          const completion = await openai.chat.completions.create({
            model: "gpt-4o",
            messages: chatMessages({ system: "Answer from the context.", history: turn.history, userQuery }),
          });
          return completion.choices[0]?.message.content ?? "";
        },
      );

    await ask("What is a vector index?");
    const second = await ask("And how is it built?");

    assert.equal(second.turn.seq, 2);
    assert.equal(second.turn.final_answer, "answer 2");
    assert.deepEqual(fake.received, [
      [
        { role: "system", content: "Answer from the context." },
        { role: "user", content: "What is a vector index?" },
      ],
      [
        { role: "system", content: "Answer from the context." },
        { role: "user", content: "What is a vector index?" },
        { role: "assistant", content: "answer 1" },
        { role: "user", content: "And how is it built?" },
      ],
    ]);
  });
});
