import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { type HistoryMessage, type HistoryResponse, chatMessages } from "turnstore-client";

const history = (fields: Partial<HistoryResponse>): HistoryResponse => ({
  session_id: "s",
  user_id: null,
  format: "messages",
  encoding: "o200k_base",
  token_count: 0,
  total_turns: 1,
  included_turns: 1,
  omitted_turns: 0,
  pending_turns: 0,
  stopped_by: null,
  unsummarized: null,
  generation: "019abf1c-5e2a-7c3d-9a41-6b2f0e8d4c17",
  ...fields,
});

describe("chatMessages", () => {
  it("puts the system prompt first, then the history, then the question", () => {
    const messages = chatMessages({
      system: "Be brief.",
      history: history({
        messages: [
          { role: "user", content: "q1" },
          { role: "assistant", content: "a1" },
        ],
      }),
      userQuery: "q2",
    });
    assert.deepEqual(messages, [
      { role: "system", content: "Be brief." },
      { role: "user", content: "q1" },
      { role: "assistant", content: "a1" },
      { role: "user", content: "q2" },
    ]);
  });

  it("takes a bare messages array, and works without system prompt or history", () => {
    assert.deepEqual(chatMessages({ history: [{ role: "user", content: "q1" }], userQuery: "q2" }), [
      { role: "user", content: "q1" },
      { role: "user", content: "q2" },
    ]);
    assert.deepEqual(chatMessages({ system: "", userQuery: "q" }), [{ role: "user", content: "q" }]);
  });

  it("refuses a history that is not in messages format", () => {
    assert.throws(
      () => chatMessages({ history: history({ format: "text", rendered: "### Conversation history:" }), userQuery: "q" }),
      /messages format, got format "text"/,
    );
  });

  it("passes a system message through and refuses a role a chat API would not take", () => {
    // As a newer server might send them: roles outside this spec's enum.
    const fromWire = (json: string): HistoryMessage[] => JSON.parse(json) as HistoryMessage[];
    assert.deepEqual(
      chatMessages({ history: fromWire('[{"role":"system","content":"Summary: q0"}]'), userQuery: "q" }),
      [
        { role: "system", content: "Summary: q0" },
        { role: "user", content: "q" },
      ],
    );
    assert.throws(
      () => chatMessages({ history: fromWire('[{"role":"tool","content":"x"}]'), userQuery: "q" }),
      /unexpected history message role: "tool"/,
    );
  });
});
