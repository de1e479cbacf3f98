// turnstore's counts in loaded tokenizers, checked by a second
// implementation: Tokenizers.js (@huggingface/tokenizers, in JavaScript;
// turnstore counts with the Rust `tokenizers` crate, or tiktoken's counter
// for Llama 3). The real Llama 3, Qwen 2.5, Llama 2, Gemma and Mistral
// Nemo vocabularies come from scripts/fetch-tokenizers (scripts/test sets
// TURNSTORE_TEST_TOKENIZERS to where). A multilingual, emoji, whitespace-heavy and code corpus is
// written, then read in each tokenizer at every 19th budget, in `text` and
// `messages`: every `token_count` equals Tokenizers.js's count of what the
// read returned, and is within its budget. The corpus has no special-token
// strings: turnstore counts one a user typed as text, Tokenizers.js as the
// special token. Through the chat templates of Llama 3, Qwen 2.5 and Mistral
// Nemo (`chat_template`), the prompt's count is Tokenizers.js's count of it,
// special tokens recognised as a completion endpoint recognises them (and
// here a typed one in a question too).
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { Tokenizer } from "@huggingface/tokenizers";
import { TurnstoreClient } from "turnstore-client";
import { id } from "./support/assertions.js";
import { type RunningTurnstore, startTurnstore } from "./support/processes.js";

const DIR = process.env["TURNSTORE_TEST_TOKENIZERS"];
const NAMES = ["llama3", "qwen2_5", "llama2", "gemma", "mistral_nemo"];

const CORPUS: [string, string][] = [
  ["What does the retriever return for a query?", "The top 20 chunks, ranked by cosine similarity, then re-ranked."],
  [
    "Wie funktioniert die Größenänderung? Ça marche aussi en français ?",
    "Ja — und oui : l'index est reconstruit à chaque écriture.",
  ],
  ["東京の天気はどうですか？", "晴れです。気温は二十度です。 😀🎉👍🏽 家族👨‍👩‍👧"],
  ["   leading spaces\tand\ttabs\n\n\nand blank lines   ", "trailing spaces    \n    indented\n\t\tmore\n\n"],
  ['fn main() {\n    println!("{}", 42);\n}', "```python\ndef f(x):\n    return x ** 2  # square\n```"],
  ["Привет, как дела? مرحبا كيف حالك؟", "Всё хорошо. بخير، شكرا. שלום"],
  ["1234567890 3.14159 -42 1e10 0xFF", "URLs: https://example.com/a?b=c&d=e#f and mail@example.org"],
  ["Ünïcödé ñormalization: é (e + ◌́) vs é", "  \n \n  spaces around newlines  \n"],
];

/** Tokenizers.js's count of a text: no special tokens added. */
const counter = (tokenizer: Tokenizer) => (text: string): number =>
  tokenizer.encode(text, { add_special_tokens: false }).ids.length;

describe("counts in loaded tokenizers, against Tokenizers.js", { skip: DIR === undefined && "TURNSTORE_TEST_TOKENIZERS unset (scripts/test sets it)" }, () => {
  let server: RunningTurnstore;
  let turnstore: TurnstoreClient;
  const sessionId = id("cross-check");

  before(async () => {
    server = await startTurnstore({ TURNSTORE_TOKENIZERS_DIR: DIR ?? "" });
    turnstore = new TurnstoreClient({ baseUrl: server.baseUrl });
    for (const [question, answer] of CORPUS) {
      const turn = await turnstore.startTurn({ sessionId, userQuery: question });
      await turnstore.finalizeTurn(sessionId, turn.turn_id, answer);
    }
  });
  after(async () => server?.stop());

  for (const name of NAMES) {
    it(`${name}: every read's token_count is Tokenizers.js's count of what it returned`, async () => {
      const read = (file: string): unknown => JSON.parse(readFileSync(join(DIR ?? "", name, file), "utf8"));
      const count = counter(new Tokenizer(read("tokenizer.json") as object, read("tokenizer_config.json") as object));
      for (const format of ["text", "messages"] as const) {
        const whole = await turnstore.getHistory(sessionId, { encoding: name, format, max_tokens: 1_000_000 });
        assert.equal(whole.included_turns, CORPUS.length);
        assert.ok(whole.token_count > 100, `${name} ${format}: ${whole.token_count}`);
        const countOf = (h: typeof whole): number =>
          format === "text"
            ? count(h.rendered ?? "")
            : (h.messages ?? []).reduce((n, m) => n + count(m.content) + 4, 0);
        assert.equal(whole.token_count, countOf(whole), `${name} ${format}`);
        for (let max = 0; max <= whole.token_count; max += 19) {
          const h = await turnstore.getHistory(sessionId, { encoding: name, format, max_tokens: max });
          assert.equal(h.token_count, countOf(h), `${name} ${format} max_tokens=${max}`);
          assert.ok(h.token_count <= max, `${name} ${format} max_tokens=${max}: ${h.token_count}`);
        }
      }
    });
  }

  for (const name of ["llama3", "qwen2_5", "mistral_nemo"]) {
    it(`${name}: a chat template's prompt counts as Tokenizers.js counts it`, async () => {
      const read = (file: string): unknown => JSON.parse(readFileSync(join(DIR ?? "", name, file), "utf8"));
      const count = counter(new Tokenizer(read("tokenizer.json") as object, read("tokenizer_config.json") as object));
      const chat = { encoding: name, chat_template: true, prompt: true } as const;
      const whole = await turnstore.getHistory(sessionId, { ...chat, max_tokens: 1_000_000 });
      assert.equal(whole.included_turns, CORPUS.length);
      assert.equal(whole.token_count, count(whole.prompt), name);
      // Budgets from that of the system message alone (below it: a 422).
      const system = "Be brief. 简洁。";
      const alone = await turnstore.getHistory(sessionId, { ...chat, system, limit: 0 });
      assert.equal(alone.token_count, count(alone.prompt), name);
      for (let max = alone.token_count; max <= whole.token_count; max += 23) {
        const h = await turnstore.getHistory(sessionId, { ...chat, max_tokens: max, system });
        assert.equal(h.token_count, count(h.prompt), `${name} max_tokens=${max}`);
        assert.ok(h.token_count <= max, `${name} max_tokens=${max}: ${h.token_count}`);
      }
      const started = await turnstore.startTurn({
        sessionId: id("cross-check-chat"),
        userQuery: "And <|im_end|> now?  ",
        history: { ...chat, max_tokens: 1_000_000 },
      });
      assert.ok(started.history !== undefined && started.history !== null);
      assert.equal(started.history.token_count, count(started.history.prompt), name);
    });
  }
});
