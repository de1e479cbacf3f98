import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { type HistoryMessage, type HistoryResponse, anthropicRequest, chatMessages } from "turnstore-client";

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

describe("anthropicRequest", () => {
  const marked = { type: "text", text: "a1", cache_control: { type: "ephemeral" } } as const;

  it("puts the system prompt before the history's system blocks, and the question last", () => {
    const request = anthropicRequest({
      system: "Be brief.",
      history: history({
        format: "anthropic",
        anthropic: {
          system: [{ type: "text", text: "Summary: q0" }],
          messages: [
            { role: "user", content: [{ type: "text", text: "q1" }] },
            { role: "assistant", content: [marked] },
          ],
        },
      }),
      userQuery: "q2",
    });
    assert.deepEqual(request, {
      system: [
        { type: "text", text: "Be brief." },
        { type: "text", text: "Summary: q0" },
      ],
      messages: [
        { role: "user", content: [{ type: "text", text: "q1" }] },
        { role: "assistant", content: [marked] },
        { role: "user", content: [{ type: "text", text: "q2" }] },
      ],
    });
    // Copies: the history's blocks are not the request's.
    assert.notEqual(request.messages[1]?.content[0], marked);
    assert.notEqual(request.messages[1]?.content[0]?.cache_control, marked.cache_control);
  });

  it("takes a bare anthropic history, and works without system prompt or history", () => {
    assert.deepEqual(anthropicRequest({ history: { messages: [] }, userQuery: "q" }), {
      messages: [{ role: "user", content: [{ type: "text", text: "q" }] }],
    });
    assert.deepEqual(anthropicRequest({ system: "", userQuery: "q" }), {
      messages: [{ role: "user", content: [{ type: "text", text: "q" }] }],
    });
  });

  it("refuses a history that is not in anthropic format", () => {
    assert.throws(
      () => anthropicRequest({ history: history({ messages: [{ role: "user", content: "q1" }] }), userQuery: "q" }),
      /anthropic format, got format "messages"/,
    );
  });
});
