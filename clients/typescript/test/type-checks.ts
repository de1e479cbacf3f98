// Compile-time checks (never run): `npm run build:test` fails if one breaks.
// They pin the typing promises of the public API.
import type OpenAI from "openai";
import { type HistoryResponse, TurnstoreClient, chatMessages } from "turnstore-client";

export async function typeChecks(client: TurnstoreClient): Promise<void> {
  // chatMessages is accepted as-is by the openai package.
  const messages: OpenAI.Chat.Completions.ChatCompletionMessageParam[] = chatMessages({ userQuery: "q" });
  void messages;

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
}
