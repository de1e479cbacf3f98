// README.md's rolling-summary loop, regenerate, edit (fork), import/export, LangChain.js,
// Vercel AI SDK and other examples, run as they are written: each ```ts block is transpiled into dist-test/ (where
// "turnstore-client" resolves to this package) and imported. check-install
// type-checks the same blocks as a consumer project would.
import assert from "node:assert/strict";
import { readFileSync, writeFileSync } from "node:fs";
import { after, before, describe, it } from "node:test";
import type { BaseChatModel } from "@langchain/core/language_models/chat_models";
import { FakeListChatModel, FakeStreamingChatModel } from "@langchain/core/utils/testing";
import { type LanguageModel, simulateReadableStream } from "ai";
import { MockLanguageModelV4 } from "ai/test";
import {
  type ExportedSession,
  type HistoryOptions,
  type ImportMessage,
  type TranscriptMessage,
  TurnstoreClient,
} from "turnstore-client";
import ts from "typescript";
import { id } from "./support/assertions.js";
import { type RunningTurnstore, startTurnstore } from "./support/processes.js";

/** The first ```ts block under `## <section>` of README.md. */
function readmeBlock(readme: string, section: string): string {
  const body = readme.split(`\n## ${section}\n`)[1]?.split("\n## ")[0] ?? "";
  const block = /```ts\n([\s\S]*?)```/.exec(body)?.[1];
  assert.ok(block, `README.md has no \`\`\`ts block under ## ${section}`);
  return block;
}

/** That block as a module. */
async function readmeModule(section: string): Promise<Record<string, unknown>> {
  const readme = readFileSync(new URL("../README.md", import.meta.url), "utf8");
  const { outputText } = ts.transpileModule(readmeBlock(readme, section), {
    compilerOptions: { module: ts.ModuleKind.ES2022, target: ts.ScriptTarget.ES2022 },
  });
  const file = new URL(`./readme-${section.toLowerCase().replace(/\W+/g, "-")}.js`, import.meta.url);
  writeFileSync(file, outputText);
  return (await import(file.href)) as Record<string, unknown>;
}

/** That block as a module, imported with TURNSTORE_URL set: its client is made from the environment. */
async function readmeModuleAt(section: string, baseUrl: string): Promise<Record<string, unknown>> {
  const saved = process.env["TURNSTORE_URL"];
  process.env["TURNSTORE_URL"] = baseUrl;
  try {
    return await readmeModule(section);
  } finally {
    if (saved === undefined) delete process.env["TURNSTORE_URL"];
    else process.env["TURNSTORE_URL"] = saved;
  }
}

interface RollingSummaries {
  PROMPT_HISTORY: HistoryOptions;
  THRESHOLD: number;
  FOLD_TOKENS: number;
  foldSummary(turnstore: TurnstoreClient, sessionId: string): Promise<void>;
}

interface ImportExport {
  importChat(
    turnstore: TurnstoreClient,
    sessionId: string,
    userId: string,
    messages: ImportMessage[],
  ): ReturnType<TurnstoreClient["importMessages"]>;
  importAgentRun(
    turnstore: TurnstoreClient,
    sessionId: string,
    messages: TranscriptMessage[],
  ): Promise<{ turns: number; dropped: Record<string, number> }>;
  copyUser(turnstore: TurnstoreClient, userId: string, toUserId: string): Promise<string[]>;
  exportUser(turnstore: TurnstoreClient, userId: string, write: (line: string) => Promise<void>): Promise<number>;
}

/** About `words` tokens of text. */
const prose = (words: number, seed: number): string =>
  Array.from({ length: words }, (_, i) => ["vector", "index", "graph", "recall", "latency"][(i + seed) % 5]).join(" ");

/** A transcript of `count` turns: question i, an answer of about `words` tokens. */
function transcript(count: number, words: number): ImportMessage[] {
  const messages: ImportMessage[] = [];
  for (let i = 1; i <= count; i += 1) {
    messages.push({ role: "user", content: `question ${i}` }, { role: "assistant", content: prose(words, i) });
  }
  return messages;
}

/** "Asked 1: question 1; 2: question 2; …" as the README's stand-in folds turns `from` to `through`. */
const asked = (from: number, through: number): string =>
  Array.from({ length: through - from + 1 }, (_, i) => `${from + i}: question ${from + i}`).join("; ");

describe("README examples against the real server", () => {
  let server: RunningTurnstore;
  let turnstore: TurnstoreClient;
  let rolling: RollingSummaries;
  before(async () => {
    server = await startTurnstore();
    turnstore = new TurnstoreClient({ baseUrl: server.baseUrl });
    rolling = (await readmeModule("Rolling summaries")) as unknown as RollingSummaries;
  });
  after(async () => {
    await server?.stop();
  });

  describe("Rolling summaries: foldSummary", () => {
    it("folds what fell out of the prompt into the summary, and stops below the threshold", async () => {
      const sessionId = id("s");
      await turnstore.importMessages(sessionId, { messages: transcript(30, 200) });
      const first = await turnstore.getHistory(sessionId, rolling.PROMPT_HISTORY);
      const left = first.unsummarized;
      assert.ok(left?.tokens != null && left.tokens >= rolling.THRESHOLD, "the session must start over the threshold");
      await rolling.foldSummary(turnstore, sessionId);
      const summary = await turnstore.getSummary(sessionId);
      assert.equal(summary.through_seq, left.through_seq);
      assert.equal(summary.summary, `Asked ${asked(1, left.through_seq)}`);
      const prompt = await turnstore.getHistory(sessionId, rolling.PROMPT_HISTORY);
      assert.equal(prompt.format, "messages");
      assert.equal(prompt.messages?.[0]?.content, `Summary of the conversation so far:\n${summary.summary}`);
      assert.ok(prompt.unsummarized === null || (prompt.unsummarized.tokens ?? 0) < rolling.THRESHOLD);
      // Below the threshold, it writes nothing.
      await rolling.foldSummary(turnstore, sessionId);
      assert.deepEqual(await turnstore.getSummary(sessionId), summary);
    });

    it("folds a backlog larger than one model call in several writes, oldest first", async () => {
      const sessionId = id("s");
      await turnstore.importMessages(sessionId, { messages: transcript(40, 1_000) });
      const writes: number[] = [];
      const counting = new TurnstoreClient({
        baseUrl: server.baseUrl,
        fetch: async (request) => {
          if (request.method === "PUT") writes.push((JSON.parse(await request.clone().text()) as { through_seq: number }).through_seq);
          return fetch(request);
        },
      });
      const left = (await turnstore.getHistory(sessionId, rolling.PROMPT_HISTORY)).unsummarized;
      assert.ok(left && left.tokens !== null && left.tokens > 2 * rolling.FOLD_TOKENS, "the backlog must need several calls");
      await rolling.foldSummary(counting, sessionId);
      assert.ok(writes.length >= 3, `writes through ${writes.join(", ")}`);
      assert.deepEqual(
        writes,
        [...writes].sort((a, b) => a - b),
      );
      const summary = await turnstore.getSummary(sessionId);
      assert.equal(summary.through_seq, writes.at(-1));
      assert.ok(summary.through_seq >= left.through_seq);
      assert.equal(summary.summary, `Asked ${asked(1, summary.through_seq)}`);
    });

    it("gives way to a competing writer and folds what it left", async () => {
      const sessionId = id("s");
      await turnstore.importMessages(sessionId, { messages: transcript(30, 200) });
      const statuses: number[] = [];
      // Another summarizer writes between foldSummary's reads and its write.
      const racing = new TurnstoreClient({
        baseUrl: server.baseUrl,
        maxRetries: 0,
        fetch: async (request) => {
          if (request.method === "PUT" && statuses.length === 0) {
            await turnstore.putSummary(sessionId, { summary: "Competitor.", throughSeq: 3, expectedThroughSeq: 0 });
          }
          const response = await fetch(request);
          if (request.method === "PUT") statuses.push(response.status);
          return response;
        },
      });
      const left = (await turnstore.getHistory(sessionId, rolling.PROMPT_HISTORY)).unsummarized;
      assert.ok(left);
      await rolling.foldSummary(racing, sessionId);
      assert.deepEqual(statuses, [409, 200]);
      const summary = await turnstore.getSummary(sessionId);
      assert.equal(summary.summary, `Competitor.; ${asked(4, summary.through_seq)}`);
      assert.equal(summary.through_seq, left.through_seq);
    });

    it("never writes a fold of a conversation cleared and started again meanwhile", async () => {
      const sessionId = id("s");
      await turnstore.importMessages(sessionId, { messages: transcript(30, 200) });
      // The same id, as many turns, other questions: only the generation tells them apart.
      const other = transcript(30, 200).map((m) => (m.role === "user" ? { ...m, content: `other ${m.content}` } : m));
      const statuses: number[] = [];
      const racing = new TurnstoreClient({
        baseUrl: server.baseUrl,
        maxRetries: 0,
        fetch: async (request) => {
          if (request.method === "PUT" && statuses.length === 0) {
            await turnstore.clearSession(sessionId);
            await turnstore.importMessages(sessionId, { messages: other });
          }
          const response = await fetch(request);
          if (request.method === "PUT") statuses.push(response.status);
          return response;
        },
      });
      await rolling.foldSummary(racing, sessionId);
      assert.deepEqual(statuses, [409, 200]);
      const summary = await turnstore.getSummary(sessionId);
      const folded = Array.from({ length: summary.through_seq }, (_, i) => `${i + 1}: other question ${i + 1}`);
      assert.equal(summary.summary, `Asked ${folded.join("; ")}`);
    });
  });

  describe("Import and export: importChat, exportUser", () => {
    it("imports once however often it runs, and exports every session as a JSON line", async () => {
      const example = (await readmeModule("Import and export")) as unknown as ImportExport;
      const userId = id("u");
      const sessions = [id("s"), id("s")];
      for (const sessionId of sessions) {
        const first = await example.importChat(turnstore, sessionId, userId, transcript(2, 5));
        const again = await example.importChat(turnstore, sessionId, userId, transcript(2, 5));
        assert.deepEqual(again, { ...first, replayed: true });
      }
      const lines: string[] = [];
      const count = await example.exportUser(turnstore, userId, async (line) => {
        lines.push(line);
      });
      assert.equal(count, 2);
      const exported = lines.map((line) => {
        assert.ok(line.endsWith("\n"));
        return JSON.parse(line) as ExportedSession;
      });
      assert.deepEqual(new Set(exported.map((s) => s.session_id)), new Set(sessions));
      for (const session of exported) {
        assert.deepEqual(
          session.turns.map((t) => t.user_query),
          ["question 1", "question 2"],
        );
      }
    });

    it("imports an agent run's questions and final answers, counting what it dropped", async () => {
      const example = (await readmeModule("Import and export")) as unknown as ImportExport;
      const fixture = new URL("../../../tests/fixtures/transcripts/openai_agent_loop.json", import.meta.url);
      const messages = JSON.parse(readFileSync(fixture, "utf8")) as TranscriptMessage[];
      const sessionId = id("s");
      assert.deepEqual(await example.importAgentRun(turnstore, sessionId, messages), {
        turns: 3,
        dropped: { instructions: 2, tool_result: 4, tool_call: 2, refusal: 1, non_text: 3, unanswered: 1 },
      });
      const history = await turnstore.getHistory(sessionId, { format: "turns" });
      assert.deepEqual(
        history.turns.map((t) => t.user_query),
        ["How do I rotate an API key?", "And if it leaked?\n\nIt was in a public repository.", "Can you show me the key?"],
      );
    });
  });

  describe("Import and export: copyUser", () => {
    it("copies every conversation with its turns and their times, once however often it runs", async () => {
      const example = (await readmeModule("Import and export")) as unknown as ImportExport;
      const from = id("u");
      const to = id("u");
      const timed = id("s");
      await turnstore.importMessages(timed, {
        mode: "distill",
        userId: from,
        messages: [
          { role: "user", content: "Hello?", timestamp: "2026-11-20T09:00:00Z" },
          { role: "assistant", content: "Hi.", timestamp: "2026-11-20T09:00:04.250Z" },
        ],
      });
      const live = id("s");
      await turnstore.importMessages(live, { messages: transcript(2, 5), userId: from });
      await turnstore.startTurn({ sessionId: id("s"), userId: from, userQuery: "only pending" });
      const copies = await example.copyUser(turnstore, from, to);
      assert.deepEqual(new Set(copies), new Set([`${timed}-copy`, `${live}-copy`]));
      assert.deepEqual(await example.copyUser(turnstore, from, to), copies);
      const turns = async (sessionId: string) =>
        (await turnstore.getHistory(sessionId, { format: "turns" })).turns.map((t) => [
          t.user_query,
          t.final_answer,
          t.started_at,
          t.finalized_at,
        ]);
      for (const original of [timed, live]) {
        assert.deepEqual(await turns(`${original}-copy`), await turns(original));
      }
      assert.deepEqual(await turns(`${timed}-copy`), [["Hello?", "Hi.", "2026-11-20T09:00:00.000Z", "2026-11-20T09:00:04.250Z"]]);
      assert.equal((await turnstore.getSession(`${live}-copy`)).user_id, to);
    });
  });

  describe("Regenerating an answer: regenerate", () => {
    interface Regenerating {
      regenerate(sessionId: string, turnId: string, question: string): Promise<string | undefined>;
    }
    it("replaces an answer in place, and leaves a summarized or pending turn as it is", async () => {
      const saved = process.env["TURNSTORE_URL"];
      process.env["TURNSTORE_URL"] = server.baseUrl;
      let example: Regenerating;
      try {
        example = (await readmeModule("Regenerating an answer")) as unknown as Regenerating;
      } finally {
        if (saved === undefined) delete process.env["TURNSTORE_URL"];
        else process.env["TURNSTORE_URL"] = saved;
      }
      const sessionId = id("readme-regenerate");
      await turnstore.importMessages(sessionId, { messages: transcript(2, 5) });
      const [first, second] = (await turnstore.getHistory(sessionId, { format: "turns" })).turns;
      assert.ok(first && second);
      assert.equal(await example.regenerate(sessionId, second.turn_id, "question 2"), "Another answer to: question 2");
      const history = await turnstore.getHistory(sessionId, { format: "turns" });
      assert.deepEqual(
        history.turns.map((t) => [t.seq, t.final_answer]),
        [
          [1, first.final_answer],
          [2, "Another answer to: question 2"],
        ],
      );
      await turnstore.putSummary(sessionId, { summary: "Two questions.", throughSeq: 2 });
      assert.equal(await example.regenerate(sessionId, first.turn_id, "question 1"), undefined);
      const pending = await turnstore.startTurn({ sessionId, userQuery: "question 3" });
      assert.equal(await example.regenerate(sessionId, pending.turn_id, "question 3"), undefined);
      await assert.rejects(example.regenerate(sessionId, "0193a6f4-5c2e-7b1a-9a41-2f6d8e0c4b7a", "q"), /turn_not_found/);
    });
  });

  describe("Editing a question: editQuestion", () => {
    interface Editing {
      editQuestion(sessionId: string, seq: number, question: string, branchId: string): Promise<number>;
    }
    it("branches with the turns before the question, then asks the edited one there; the original stays", async () => {
      const saved = process.env["TURNSTORE_URL"];
      process.env["TURNSTORE_URL"] = server.baseUrl;
      let example: Editing;
      try {
        example = (await readmeModule("Editing a question")) as unknown as Editing;
      } finally {
        if (saved === undefined) delete process.env["TURNSTORE_URL"];
        else process.env["TURNSTORE_URL"] = saved;
      }
      const sessionId = id("readme-edit");
      await turnstore.importMessages(sessionId, { messages: transcript(3, 5) });
      const original = (await turnstore.getHistory(sessionId, { format: "turns" })).turns;
      const branch = id("readme-edit");
      assert.equal(await example.editQuestion(sessionId, 2, "question 2, edited", branch), 2);
      const edited = (await turnstore.getHistory(branch, { format: "turns" })).turns;
      assert.deepEqual(edited[0], original[0]);
      assert.deepEqual(
        edited.map((t) => [t.seq, t.user_query, t.final_answer]),
        [
          [1, "question 1", original[0]?.final_answer],
          [2, "question 2, edited", "An answer to: question 2, edited"],
        ],
      );
      assert.deepEqual((await turnstore.getHistory(sessionId, { format: "turns" })).turns, original);
      // The first question: a branch of its own, nothing copied.
      const fresh = id("readme-edit");
      assert.equal(await example.editQuestion(sessionId, 1, "question 1, edited", fresh), 1);
      assert.deepEqual(
        (await turnstore.getHistory(fresh, { format: "turns" })).turns.map((t) => t.user_query),
        ["question 1, edited"],
      );
      // A branch id that is taken: nothing is written to it.
      await assert.rejects(example.editQuestion(sessionId, 3, "question 3, edited", branch), /session_exists/);
      assert.equal((await turnstore.getSession(branch)).turn_count, 2);
    });
  });

  describe("Prompt caching: a stable window of anthropic blocks", () => {
    interface PromptCaching {
      HISTORY: HistoryOptions;
      ask(sessionId: string, question: string): Promise<string>;
    }
    it("answers with the history, which begins at a stride boundary", async () => {
      const saved = process.env["TURNSTORE_URL"];
      process.env["TURNSTORE_URL"] = server.baseUrl;
      let example: PromptCaching;
      try {
        example = (await readmeModule("Prompt caching")) as unknown as PromptCaching;
      } finally {
        if (saved === undefined) delete process.env["TURNSTORE_URL"];
        else process.env["TURNSTORE_URL"] = saved;
      }
      const sessionId = id("readme-cache");
      for (let n = 1; n <= 25; n += 1) {
        assert.equal(await example.ask(sessionId, `question ${n}`), `An answer to: question ${n}`);
      }
      // The newest 20 are 6 to 25: the window begins at 11, the boundary after 6.
      const history = await turnstore.getHistory(sessionId, example.HISTORY);
      assert.deepEqual(history.window, { stride: 10, from_seq: 11, left_out: 5 });
      assert.deepEqual(history.breakpoint, { seq: 25, messages: 30 });
      assert.equal(history.anthropic?.messages[0]?.content[0]?.text, "question 11");
    });
  });

  describe("A RAG request and Templates: clients made from the environment", () => {
    interface RagRequest {
      ask(sessionId: string, userId: string, question: string): Promise<string>;
    }
    interface Templates {
      xmlHistory(sessionId: string): Promise<string>;
    }
    it("run against the server named by TURNSTORE_URL", async () => {
      // The examples make their client when imported: with no options, from the environment.
      const saved = process.env["TURNSTORE_URL"];
      process.env["TURNSTORE_URL"] = server.baseUrl;
      let rag: RagRequest;
      let templates: Templates;
      try {
        rag = (await readmeModule("A RAG request")) as unknown as RagRequest;
        templates = (await readmeModule("Templates")) as unknown as Templates;
      } finally {
        if (saved === undefined) delete process.env["TURNSTORE_URL"];
        else process.env["TURNSTORE_URL"] = saved;
      }
      const sessionId = id("readme-rag");
      assert.equal(await rag.ask(sessionId, "alice", "What is a vector index?"), "An answer to: What is a vector index?");
      const history = await turnstore.getHistory(sessionId, { format: "turns" });
      assert.deepEqual(
        history.turns.map((t) => [t.user_query, t.final_answer]),
        [["What is a vector index?", "An answer to: What is a vector index?"]],
      );
      const xml = await templates.xmlHistory(sessionId);
      assert.match(xml, /<turn role="user">What is a vector index\?<\/turn>/);
    });

    it("is the project README's TypeScript example, as it is written there", () => {
      // The project README shows this block as its TypeScript example: the
      // test above runs it and check-install compiles it as a consumer would.
      const ours = readmeBlock(readFileSync(new URL("../README.md", import.meta.url), "utf8"), "A RAG request");
      const project = readFileSync(new URL("../../../README.md", import.meta.url), "utf8");
      const shown = /\n## One RAG request\n[\s\S]*?```ts\n([\s\S]*?)```/.exec(project)?.[1];
      assert.equal(shown, ours, "README.md's ```ts block under ## One RAG request");
    });
  });

  describe("LangChain.js: chat (RunnableWithMessageHistory) and ask (by hand)", () => {
    interface LangChainExample {
      chat(model: BaseChatModel): {
        invoke(input: { question: string }, config: { configurable: { sessionId: string } }): Promise<{ text: string }>;
      };
      ask(model: BaseChatModel, sessionId: string, question: string): Promise<string>;
    }
    it("keeps each exchange as a turn, and nothing of a question whose model failed", async () => {
      const example = (await readmeModuleAt("LangChain.js", server.baseUrl)) as unknown as LangChainExample;
      const sessionId = id("readme-langchain");
      const chain = example.chat(new FakeListChatModel({ responses: ["answer 1", "answer 2"] }));
      assert.equal((await chain.invoke({ question: "question 1" }, { configurable: { sessionId } })).text, "answer 1");
      assert.equal((await chain.invoke({ question: "question 2" }, { configurable: { sessionId } })).text, "answer 2");
      assert.equal(await example.ask(new FakeListChatModel({ responses: ["answer 3"] }), sessionId, "question 3"), "answer 3");
      const failing = new FakeStreamingChatModel({ thrownErrorString: "model down" });
      await assert.rejects(example.ask(failing, sessionId, "question 4"), /model down/);
      const history = await turnstore.getHistory(sessionId, { format: "turns" });
      assert.deepEqual(
        history.turns.map((t) => [t.user_query, t.final_answer]),
        [
          ["question 1", "answer 1"],
          ["question 2", "answer 2"],
          ["question 3", "answer 3"],
        ],
      );
      assert.equal(history.pending_turns, 0);
    });
  });

  describe("Vercel AI SDK: chatRoute", () => {
    interface AiExample {
      chatRoute(model: LanguageModel): (request: Request) => Promise<Response>;
    }
    const post = (sessionId: string, question: string): Request =>
      new Request("http://localhost/api/chat", { method: "POST", body: JSON.stringify({ sessionId, question }) });
    const usage = {
      inputTokens: { total: 1, noCache: 1, cacheRead: undefined, cacheWrite: undefined },
      outputTokens: { total: 1, text: 1, reasoning: undefined },
    };
    it("streams the answer of the model, which got the history; a failing model leaves nothing", async () => {
      const example = (await readmeModuleAt("Vercel AI SDK", server.baseUrl)) as unknown as AiExample;
      let calls = 0;
      const model = new MockLanguageModelV4({
        doStream: async () => ({
          stream: simulateReadableStream({
            chunks: [
              { type: "text-start", id: "t" },
              { type: "text-delta", id: "t", delta: `answer ` },
              { type: "text-delta", id: "t", delta: `${++calls}` },
              { type: "text-end", id: "t" },
              { type: "finish", finishReason: { unified: "stop", raw: undefined }, usage },
            ],
          }),
        }),
      });
      const route = example.chatRoute(model);
      const sessionId = id("readme-ai");
      assert.equal(await (await route(post(sessionId, "question 1"))).text(), "answer 1");
      assert.equal(await (await route(post(sessionId, "question 2"))).text(), "answer 2");
      const prompt = model.doStreamCalls[1]?.prompt.map((m) => m.role);
      assert.deepEqual(prompt, ["system", "user", "assistant", "user"]);
      const failing = example.chatRoute(
        new MockLanguageModelV4({
          doStream: async () => {
            throw new Error("model down");
          },
        }),
      );
      // streamText logs a model error when no onError is given (the example gives none).
      const logged: unknown[] = [];
      const log = console.error;
      console.error = (error: unknown) => void logged.push(error);
      try {
        const response = await failing(post(sessionId, "question 3"));
        await response.text().catch(() => "");
      } finally {
        console.error = log;
      }
      assert.match(String(logged[0]), /model down/);
      const history = await turnstore.getHistory(sessionId, { format: "turns" });
      assert.deepEqual(
        history.turns.map((t) => [t.user_query, t.final_answer]),
        [
          ["question 1", "answer 1"],
          ["question 2", "answer 2"],
        ],
      );
      assert.equal(history.pending_turns, 0);
    });
  });
});
