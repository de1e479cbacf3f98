// Compile-time checks (never run): `npm run build:test` fails if one breaks.
// They pin the typing promises of the public API.
import type OpenAI from "openai";
import createClient from "openapi-fetch";
import {
  type AnthropicHistory,
  type AnthropicRequest,
  type Breakpoint,
  type DistilledImportResult,
  type DroppedReason,
  type DroppedReport,
  type ExportedMessage,
  type ExportedSession,
  type ExportedTranscript,
  type FinalizeTurnResponse,
  type ForkBody,
  type ForkResponse,
  type ForkResult,
  type HistoryFormat,
  type HistoryResponse,
  type HistoryWindow,
  type ImportMode,
  type ImportResult,
  type JsonMediaType,
  type Summary,
  type TranscriptMessage,
  TurnstoreClient,
  TurnstoreError,
  type Unsummarized,
  anthropicRequest,
  chatMessages,
  type paths,
} from "turnstore-client";

import type { BaseListChatMessageHistory } from "@langchain/core/chat_history";
import type { OutputInterface, StreamTextResult, ToolSet } from "ai";
import { MockLanguageModelV4 } from "ai/test";
import { type TurnOutcome, streamTurn } from "turnstore-client/ai";
import { TurnstoreChatMessageHistory } from "turnstore-client/langchain";

type Equals<A, B> = (<T>() => T extends A ? 1 : 2) extends <T>() => T extends B ? 1 : 2 ? true : false;

export async function typeChecks(client: TurnstoreClient): Promise<void> {
  // openapi-fetch on the generated types: with JsonMediaType a history is
  // the JSON response alone, without the text/plain alternative.
  const api = createClient<paths, JsonMediaType>({ baseUrl: "http://127.0.0.1:8080" });
  const viaFetch = await api.GET("/v1/sessions/{session_id}/history", { params: { path: { session_id: "s" } } });
  const jsonOnly: Equals<typeof viaFetch.data, HistoryResponse | undefined> = true;
  const plain = await createClient<paths>({}).GET("/v1/sessions/{session_id}/history", {
    params: { path: { session_id: "s" } },
  });
  const withText: Equals<typeof plain.data, HistoryResponse | string | undefined> = true;
  void [jsonOnly, withText];

  // chatMessages is accepted as-is by the openai package.
  const messages: OpenAI.Chat.Completions.ChatCompletionMessageParam[] = chatMessages({ userQuery: "q" });
  void messages;

  // A loaded tokenizer's name is an encoding too; built-in ones complete.
  await client.getHistory("s", { encoding: "llama3" });
  await client.getHistory("s", { encoding: "o200k_base" });

  // The history's type follows the format asked for.
  const text = await client.getHistory("s");
  const rendered: string = text.rendered;
  const asMessages = await client.getHistory("s", { format: "messages" });
  const contents: string[] = asMessages.messages.map((m) => m.content);
  const asTurns = await client.getHistory("s", { format: "turns" });
  const seqs: number[] = asTurns.turns.map((t) => t.seq);
  void [rendered, contents, seqs];
  // @ts-expect-error a messages history has no guaranteed `rendered`
  const notRendered: string = asMessages.rendered;
  void notRendered;
  // Options without `format` are a text history too.
  const limited: string = (await client.getHistory("s", { limit: 5, keep_first: true })).rendered;
  void limited;
  const someFormat = "turns" as HistoryFormat;
  // @ts-expect-error a history of a format not known statically has no guaranteed `rendered`
  const unknownFormat: string = (await client.getHistory("s", { format: someFormat })).rendered;
  void unknownFormat;

  // A start without `history` has none; with it, it has the format's field.
  const bare = await client.startTurn({ userQuery: "q" });
  // @ts-expect-error no history was asked for
  void bare.history.rendered;
  const withHistory = await client.startTurn({ userQuery: "q", history: { format: "messages" } });
  const fromStart: HistoryResponse["messages"] = withHistory.history.messages;
  void fromStart;

  // @ts-expect-error text/plain has no other format
  await client.getHistoryText("s", { format: "messages" });
  // @ts-expect-error an unknown history option
  await client.getHistory("s", { max_token: 10 });

  // v1.1 history options: a template renders text, into `rendered`.
  const templated = await client.getHistory("s", { template: "xml", summary: true, lang: "en" });
  const xml: string = templated.rendered;
  const templatedText = await client.getHistoryText("s", { template: "markdown" });
  void [xml, templatedText];
  // @ts-expect-error a template renders text only
  await client.getHistory("s", { template: "xml", format: "turns" });
  // @ts-expect-error only "en" is a language
  await client.getHistory("s", { lang: "de" });
  // Chat templates: a messages history (whatever `format` says: none), its prompt a string when asked for.
  const chat = await client.getHistory("s", { encoding: "chat", chat_template: true, prompt: true, system: "Be brief." });
  const chatContents: string[] = chat.messages.map((m) => m.content);
  const chatPrompt: string = chat.prompt;
  const counted = await client.getHistory("s", { encoding: "chat", chat_template: true, format: "messages" });
  const maybePrompt: string | undefined = counted.prompt;
  void [chatContents, chatPrompt, maybePrompt];
  // @ts-expect-error a prompt only when asked for
  const noPrompt: string = counted.prompt;
  void noPrompt;
  const startedChat = await client.startTurn({
    userQuery: "q",
    history: { encoding: "chat", chat_template: true, prompt: true },
  });
  const startPrompt: string = startedChat.history.prompt;
  void startPrompt;
  // @ts-expect-error prompt needs chat_template: true
  await client.getHistory("s", { encoding: "chat", prompt: true });
  // @ts-expect-error system needs chat_template: true
  await client.getHistory("s", { encoding: "chat", system: "Be brief." });
  // @ts-expect-error a chat template renders messages only
  await client.getHistory("s", { chat_template: true, format: "turns" });
  // @ts-expect-error a chat template and a template do not mix
  await client.getHistory("s", { chat_template: true, template: "xml" });
  // @ts-expect-error text/plain has no chat template
  await client.getHistoryText("s", { encoding: "chat", chat_template: true });

  // Windows and the anthropic format: `window`, `breakpoint` and `anthropic` typed when asked for.
  const stable = await client.getHistory("s", { window: "stable", stride: 5, format: "messages" });
  const stableWindow: Equals<typeof stable.window, HistoryWindow> = true;
  const stableBreakpoint: Breakpoint | null = stable.breakpoint;
  const stableContents: string[] = stable.messages.map((m) => m.content);
  const anthropic = await client.getHistory("s", { format: "anthropic", cache_control: true, summary: true });
  const blocks: AnthropicHistory = anthropic.anthropic;
  const marked: Breakpoint | null = anthropic.breakpoint;
  const request: AnthropicRequest = anthropicRequest({ history: anthropic, userQuery: "q", system: "Be brief." });
  const fromBlocks: AnthropicRequest = anthropicRequest({ history: blocks, userQuery: "q" });
  void [stableWindow, stableBreakpoint, stableContents, marked, request, fromBlocks];
  // @ts-expect-error a window only when asked for
  const noWindow: HistoryWindow = anthropic.window;
  // @ts-expect-error a breakpoint only with window: "stable" or cache_control: true
  const noBreakpoint: Breakpoint | null = (await client.getHistory("s", { format: "anthropic" })).breakpoint;
  void [noWindow, noBreakpoint];
  const startedStable = await client.startTurn({ userQuery: "q", history: { format: "anthropic", window: "stable" } });
  const startWindow: HistoryWindow = startedStable.history.window;
  const startBlocks: AnthropicHistory = startedStable.history.anthropic;
  void [startWindow, startBlocks];
  await client.getHistoryText("s", { window: "stable", stride: 3, template: "xml" });
  await client.getHistory("s", { window: "sliding", format: "anthropic", cache_control: false });
  // @ts-expect-error stride needs window: "stable"
  await client.getHistory("s", { stride: 3 });
  // @ts-expect-error windows are sliding or stable
  await client.getHistory("s", { window: "fixed" });
  // @ts-expect-error cache_control needs format: "anthropic"
  await client.getHistory("s", { format: "messages", cache_control: true });
  // @ts-expect-error cache_control needs format: "anthropic"
  await client.getHistory("s", { cache_control: true });
  // @ts-expect-error the anthropic format and a template do not mix
  await client.getHistory("s", { format: "anthropic", template: "xml" });
  // @ts-expect-error the anthropic format and a chat template do not mix
  await client.getHistory("s", { format: "anthropic", chat_template: true });
  // @ts-expect-error text/plain has no anthropic format
  await client.getHistoryText("s", { cache_control: true });

  // Every history has `unsummarized`; a turns history may carry the summary; turns their English copies.
  const left: Unsummarized | null = asTurns.unsummarized;
  const tokens: number | null | undefined = left?.tokens;
  const summaryOfTurns: Summary | undefined = asTurns.summary;
  const english: string | undefined = asTurns.turns[0]?.user_query_en;
  void [tokens, summaryOfTurns, english];

  // English copies on a start, a finalize, and the answer `turn()` takes.
  await client.startTurn({ userQuery: "Frage", userQueryEn: "Question" });
  await client.finalizeTurn("s", "t", { finalAnswer: "Antwort", finalAnswerEn: "Answer" });
  await client.turn({ userQuery: "q" }, () => ({ finalAnswer: "a", finalAnswerEn: "a" }));
  // @ts-expect-error the answer is required
  await client.finalizeTurn("s", "t", { finalAnswerEn: "Answer" });

  // Summaries.
  const written: Summary = await client.putSummary("s", { summary: "x", throughSeq: 2, expectedThroughSeq: 0 });
  const read: Summary = await client.getSummary("s");
  const deleted: void = await client.deleteSummary("s");
  void [written, read, deleted];
  // @ts-expect-error throughSeq is required
  await client.putSummary("s", { summary: "x" });
  // @ts-expect-error the wire name is not the client's
  await client.putSummary("s", { summary: "x", through_seq: 2 });

  // Generations: every history names one (null: an unknown session), session info too;
  // a history's is what a summary write expects.
  const historyGeneration: Equals<typeof asTurns.generation, string | null> = true;
  const sessionGeneration: Equals<Awaited<ReturnType<TurnstoreClient["getSession"]>>["generation"], string> = true;
  const startGeneration: string | null = withHistory.history.generation;
  void [historyGeneration, sessionGeneration, startGeneration];
  await client.putSummary("s", {
    summary: "x",
    throughSeq: 2,
    expectedThroughSeq: asTurns.summary?.through_seq ?? 0,
    expectedGeneration: asTurns.generation,
  });
  await client.putSummary("s", { summary: "x", throughSeq: 2, expectedGeneration: "g" });
  // @ts-expect-error a generation is an opaque string
  await client.putSummary("s", { summary: "x", throughSeq: 2, expectedGeneration: 7 });
  // @ts-expect-error the wire name is not the client's
  await client.putSummary("s", { summary: "x", throughSeq: 2, expected_generation: "g" });

  // Fork: the client's names in, the wire's out, with `replayed`.
  const forked: ForkResult = await client.forkSession(
    "s",
    { newSessionId: "s2", throughSeq: 3, userId: "u" },
    { idempotencyKey: "k" },
  );
  const forkFields: Equals<Omit<ForkResult, "replayed">, ForkResponse> = true;
  const forkOwner: Equals<typeof forked.user_id, string | null> = true;
  const forkSummary: boolean = forked.summary;
  const forkBody: ForkBody = { new_session_id: "s2", through_seq: 3 };
  void [forkFields, forkOwner, forkSummary, forked.replayed, forkBody];
  await client.forkSession("s", { newSessionId: "s2" });
  // @ts-expect-error the new session's id is required
  await client.forkSession("s", { throughSeq: 3 });
  // @ts-expect-error the wire name is not the client's
  await client.forkSession("s", { newSessionId: "s2", through_seq: 3 });
  // @ts-expect-error a seq is a number
  await client.forkSession("s", { newSessionId: "s2", throughSeq: "3" });

  // Import: user and assistant messages only.
  const imported: ImportResult = await client.importMessages(
    "s",
    { messages: [{ role: "user", content: "q" }, { role: "assistant", content: "a" }], userId: "u" },
    { idempotencyKey: "k" },
  );
  const replayed: boolean = imported.replayed;
  const lastSeq: number = imported.last_seq;
  const strictDropped: Equals<typeof imported.dropped, DroppedReport[] | undefined> = true;
  void [replayed, lastSeq, strictDropped];
  // @ts-expect-error a transcript has no system messages
  await client.importMessages("s", { messages: [{ role: "system", content: "x" }] });
  // @ts-expect-error nor does a strict one, its mode named
  await client.importMessages("s", { mode: "strict", messages: [{ role: "tool", content: "x" }] });
  // @ts-expect-error a strict message's content is a string
  await client.importMessages("s", { messages: [{ role: "user", content: [{ type: "text", text: "q" }] }] });

  // A distilled import takes an agent loop's messages as the SDKs type them,
  // and its result always has `dropped`.
  const loop: OpenAI.Chat.Completions.ChatCompletionMessageParam[] = [];
  const distilled: DistilledImportResult = await client.importMessages("s", { mode: "distill", messages: loop });
  const dropped: DroppedReport[] = distilled.dropped;
  const reasons: DroppedReason[] = dropped.map((d) => d.reason);
  void reasons;
  // Fields the server ignores (tool calls, names, refusals) are welcome in literals too.
  await client.importMessages("s", {
    mode: "distill",
    messages: [
      { role: "system", content: "Be brief." },
      { role: "user", name: "alice", content: [{ type: "text", text: "q" }, { type: "image_url", image_url: { url: "u" } }] },
      { role: "assistant", content: null, tool_calls: [{ id: "c", type: "function", function: { name: "f", arguments: "{}" } }] },
      { role: "tool", tool_call_id: "c", content: "r", timestamp: "2026-11-20T09:00:00Z" },
      { role: "assistant", content: [{ type: "thinking", thinking: "t", signature: "s" }, { type: "text", text: "a" }] },
    ],
  });
  const fromOpenAI: TranscriptMessage[] = loop;
  void fromOpenAI;
  const transcript: TranscriptMessage[] = [{ role: "orchestrator", content: "a" }];
  await client.importMessages("s", { mode: "distill", messages: transcript, userId: "u" });
  const someMode = "distill" as ImportMode;
  const either = await client.importMessages("s", { mode: someMode, messages: [{ role: "user", content: "q" }] });
  const eitherDropped: Equals<typeof either.dropped, DroppedReport[] | undefined> = true;
  void eitherDropped;
  // @ts-expect-error a content is a string, parts or null
  await client.importMessages("s", { mode: "distill", messages: [{ role: "user", content: 42 }] });
  // @ts-expect-error every message has a role
  await client.importMessages("s", { mode: "distill", messages: [{ content: "q" }] });
  // @ts-expect-error the modes are strict and distill
  await client.importMessages("s", { mode: "fuzzy", messages: [{ role: "user", content: "q" }] });
  // @ts-expect-error the wire name is not the client's
  await client.importMessages("s", { mode: "distill", messages: transcript, user_id: "u" });

  // Export: an async iterable of sessions, cancellable.
  const exported: AsyncIterable<ExportedSession> = client.exportUser("u", { signal: AbortSignal.timeout(1_000) });
  for await (const session of exported) {
    const turns: number = session.turns.length;
    const summary: string | undefined = session.summary?.summary;
    void [turns, summary];
    // @ts-expect-error an exported session has turns, not messages
    void session.messages;
  }
  // The spec's export line is either; each method yields its own.
  type ExportLine = paths["/v1/users/{user_id}/export"]["get"]["responses"][200]["content"]["application/x-ndjson"];
  const eitherLine: Equals<ExportedSession | ExportedTranscript, ExportLine> = true;
  void eitherLine;
  // Transcripts: an async iterable of their own lines, whose messages import back as they are.
  const transcripts: AsyncIterable<ExportedTranscript> = client.exportTranscripts("u", { requestId: "r" });
  for await (const transcript of transcripts) {
    const message: ExportedMessage | undefined = transcript.messages[0];
    const role: "user" | "assistant" | undefined = message?.role;
    const at: string | undefined = message?.timestamp;
    void [role, at, transcript.summary?.through_seq];
    // @ts-expect-error a transcript has messages, not turns
    void transcript.turns;
    const copied: DistilledImportResult = await client.importMessages("copy", {
      mode: "distill",
      messages: transcript.messages,
    });
    void copied;
  }
  // @ts-expect-error the format is the method's, not an option
  client.exportUser("u", { format: "messages" });

  // Regenerate: a finalize's answer, a finalize's reply.
  const regenerated = await client.regenerateTurn("s", "t", { finalAnswer: "a", finalAnswerEn: "a (en)" });
  const sameShape: Equals<typeof regenerated, FinalizeTurnResponse> = true;
  const newAnswer: string = (await client.regenerateTurn("s", "t", "a", { requestId: "r" })).turn.final_answer;
  void [sameShape, newAnswer];

  // The new problem codes and the client's own complete as literals.
  const error = new TurnstoreError({ status: 409, code: "summary_conflict", title: "t", detail: "d" });
  const codes: boolean[] = [
    error.code === "summary_conflict",
    error.code === "summary_not_found",
    error.code === "template_not_found",
    error.code === "template_error",
    error.code === "export_incomplete",
    error.code === "turn_pending",
    error.code === "turn_summarized",
  ];
  void codes;

  // The adapters: a LangChain list history; streamText's result and options.
  const history: BaseListChatMessageHistory = new TurnstoreChatMessageHistory({
    client,
    sessionId: "s",
    history: { max_tokens: 2000, model: "gpt-4o", summary: true },
  });
  void history;
  new TurnstoreChatMessageHistory({
    client,
    sessionId: "s",
    // @ts-expect-error the history is in messages format
    history: { format: "text" },
  });
  // @ts-expect-error a template renders text, not messages
  new TurnstoreChatMessageHistory({ client, sessionId: "s", history: { template: "xml" } });
  const model = new MockLanguageModelV4();
  const streamed = await streamTurn(client, { userQuery: "q", history: { limit: 5 } }, { model, maxOutputTokens: 100 });
  const result: StreamTextResult<ToolSet, Record<string, unknown>, OutputInterface<string, string, never>> =
    streamed.result;
  const answer: PromiseLike<string> = streamed.result.text;
  const outcome: TurnOutcome = await streamed.done;
  const historyMessages: { role: string; content: string }[] = streamed.turn.history.messages;
  void [result, answer, outcome, historyMessages];
  // @ts-expect-error the turn makes the messages
  await streamTurn(client, { userQuery: "q" }, { model, messages: [] });
  // @ts-expect-error the turn makes the prompt
  await streamTurn(client, { userQuery: "q" }, { model, prompt: "p" });
}
