// A stand-in for the OpenAI chat completions endpoint: records what the
// openai package sends and answers with a canned completion.
import { type Server, createServer } from "node:http";

export interface FakeOpenAI {
  baseURL: string;
  /** The `messages` of every request received, in order. */
  received: unknown[];
  stop(): Promise<void>;
}

export async function startFakeOpenAI(answer: (call: number) => string): Promise<FakeOpenAI> {
  const received: unknown[] = [];
  const server: Server = createServer((request, response) => {
    const chunks: Buffer[] = [];
    request.on("data", (chunk: Buffer) => chunks.push(chunk));
    request.on("end", () => {
      if (request.method !== "POST" || request.url !== "/v1/chat/completions") {
        response.writeHead(404).end();
        return;
      }
      const body = JSON.parse(Buffer.concat(chunks).toString("utf8")) as { messages: unknown; model: string };
      received.push(body.messages);
      response.writeHead(200, { "content-type": "application/json" }).end(
        JSON.stringify({
          id: `chatcmpl-${received.length}`,
          object: "chat.completion",
          created: 0,
          model: body.model,
          choices: [
            {
              index: 0,
              message: { role: "assistant", content: answer(received.length), refusal: null },
              finish_reason: "stop",
              logprobs: null,
            },
          ],
          usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 },
        }),
      );
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const address = server.address();
  if (typeof address !== "object" || address === null) throw new Error("fake OpenAI has no port");
  return {
    baseURL: `http://127.0.0.1:${address.port}/v1`,
    received,
    stop: () => new Promise<void>((resolve, reject) => server.close((e) => (e ? reject(e) : resolve()))),
  };
}
