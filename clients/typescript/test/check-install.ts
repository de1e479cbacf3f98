// `npm run check-install`: what a newcomer does, for real. Copies this
// package as a fresh checkout has it (no node_modules, no dist), runs
// `npm install <that folder>` in an empty folder, then imports the package
// there (ESM, CommonJS and TypeScript) and uses it against a real server.
// Then the project installs the frameworks of the adapters (ai,
// @langchain/core: its own copies, as an application has them) and uses
// `turnstore-client/ai` and `turnstore-client/langchain` with them.
// Then the package as a registry would serve it: `npm pack` of that copy
// (its file list checked), `npm install <tarball>` into another empty
// folder, and the README's quick start compiled and run there as written.
// Exits non-zero on any failure; keeps the temporary folder for inspection
// when it fails.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import {
  cpSync,
  existsSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  realpathSync,
  rmSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { basename, join } from "node:path";
import { fileURLToPath } from "node:url";
import { npmEnvironment } from "../scripts/npm-env.mjs";
import { startTurnstore } from "./support/processes.js";

/** Build output and installed modules: what a fresh checkout does not have. */
const NOT_IN_A_CHECKOUT = new Set(["node_modules", "dist", "dist-test"]);

const packageDir = fileURLToPath(new URL("../", import.meta.url));
const work = mkdtempSync(join(tmpdir(), "turnstore-client-install-"));
const checkout = join(work, "checkout", "typescript");
const consumer = join(work, "consumer");
const tarballConsumer = join(work, "tarball-consumer");

/** Runs a command and returns its stdout; on failure, the error carries that output. */
function run(command: string, args: string[], cwd: string, env: NodeJS.ProcessEnv = npmEnvironment()): string {
  try {
    return execFileSync(command, args, { cwd, env, encoding: "utf8", stdio: ["ignore", "pipe", "inherit"] });
  } catch (error) {
    const stdout = typeof error === "object" && error !== null && "stdout" in error ? String(error.stdout) : "";
    throw new Error(`${basename(command)} ${args.join(" ")} failed in ${cwd}\n${stdout}`, { cause: error });
  }
}

const ESM_SMOKE = `
import { TurnstoreClient, TurnstoreError, chatMessages } from "turnstore-client";
const client = new TurnstoreClient({ baseUrl: process.env.TURNSTORE_URL });
const done = await client.turn(
  { userQuery: "What is a vector index?", history: { format: "messages" } },
  (turn) => "An index for vectors (" + chatMessages({ history: turn.history, userQuery: turn.userQuery }).length + ")",
);
const text = await client.getHistoryText(done.session_id);
let code;
try { await client.getSession("no-such-session"); } catch (error) { code = error instanceof TurnstoreError && error.code; }
console.log(JSON.stringify({ answer: done.turn.final_answer, text: text.text, code }));
`;

const CJS_SMOKE = `
const { TurnstoreClient } = require("turnstore-client");
console.log(typeof TurnstoreClient);
`;

// The adapters with the project's own framework packages (not the folder's):
// a fake model each, the turns they keep read back.
const ADAPTERS_SMOKE = `
import { TurnstoreClient } from "turnstore-client";
import { streamTurn } from "turnstore-client/ai";
import { TurnstoreChatMessageHistory } from "turnstore-client/langchain";
import { simulateReadableStream } from "ai";
import { MockLanguageModelV4 } from "ai/test";
import { RunnableWithMessageHistory } from "@langchain/core/runnables";
import { FakeListChatModel } from "@langchain/core/utils/testing";
const client = new TurnstoreClient({ baseUrl: process.env.TURNSTORE_URL });
const usage = {
  inputTokens: { total: 1, noCache: 1, cacheRead: undefined, cacheWrite: undefined },
  outputTokens: { total: 1, text: 1, reasoning: undefined },
};
const model = new MockLanguageModelV4({
  doStream: async () => ({
    stream: simulateReadableStream({
      chunks: [
        { type: "text-start", id: "t" },
        { type: "text-delta", id: "t", delta: "a1" },
        { type: "text-end", id: "t" },
        { type: "finish", finishReason: { unified: "stop", raw: undefined }, usage },
      ],
    }),
  }),
});
const { result, done } = await streamTurn(client, { sessionId: "ai-smoke", userQuery: "q1" }, { model });
let text = "";
for await (const delta of result.textStream) text += delta;
const { status } = await done;
const chain = new RunnableWithMessageHistory({
  runnable: new FakeListChatModel({ responses: ["a2"] }),
  getMessageHistory: (sessionId) => new TurnstoreChatMessageHistory({ client, sessionId }),
});
const reply = await chain.invoke("q2", { configurable: { sessionId: "lc-smoke" } });
const turns = async (sessionId) =>
  (await client.getHistory(sessionId, { format: "turns" })).turns.map((t) => [t.user_query, t.final_answer]);
console.log(JSON.stringify({ text, status, reply: reply.text, ai: await turns("ai-smoke"), langchain: await turns("lc-smoke") }));
`;

const TS_SMOKE = `
import { TurnstoreClient, type Turn } from "turnstore-client";
const client = new TurnstoreClient({ baseUrl: "http://127.0.0.1:1" });
export async function seqs(sessionId: string): Promise<number[]> {
  const history = await client.getHistory(sessionId, { format: "turns" });
  return history.turns.map((turn: Turn) => turn.seq);
}
`;

/** README.md's sections whose first ```ts block is a whole module a consumer could copy. */
const README_EXAMPLES = [
  "A RAG request",
  "Translations",
  "Regenerating an answer",
  "Editing a question",
  "Rolling summaries",
  "Templates",
  "Chat templates",
  "Prompt caching",
  "Import and export",
];

/** The sections of the adapters' examples, which import their framework too. */
const ADAPTER_EXAMPLES = ["LangChain.js", "Vercel AI SDK"];

/** The framework packages of the adapters, at the versions the folder's lockfile has. */
function frameworkPackages(): string[] {
  const lock = JSON.parse(readFileSync(join(packageDir, "package-lock.json"), "utf8")) as {
    packages: Record<string, { version?: string }>;
  };
  return ["ai", "@langchain/core"].map((name) => {
    const version = lock.packages[`node_modules/${name}`]?.version;
    assert.ok(version, `package-lock.json has no ${name}`);
    return `${name}@${version}`;
  });
}

/** The first ```ts block of a section of README.md, as written. */
function readmeBlock(section: string): string {
  const readme = readFileSync(join(packageDir, "README.md"), "utf8");
  const body = readme.split(`\n## ${section}\n`)[1]?.split("\n## ")[0] ?? "";
  const block = /```ts\n([\s\S]*?)```/.exec(body)?.[1];
  assert.ok(block, `README.md has no \`\`\`ts block under ## ${section}`);
  return block;
}

/** The first ```ts blocks of those sections, by file name. */
function readmeExamples(sections: string[]): Map<string, string> {
  const files = new Map<string, string>();
  for (const section of sections) {
    // The examples read their key from the environment, as an app would.
    const name = `readme-${section.toLowerCase().replace(/\W+/g, "-")}.ts`;
    const declare = "declare const process: { env: Record<string, string | undefined> };";
    files.set(name, `${declare}\n${readmeBlock(section)}`);
  }
  return files;
}

/** The README's quick start: its first example, a module that exports `ask`. */
const QUICK_START = "A RAG request";

// Runs the quick start's `ask` (compiled from the README as written) for two
// questions, as an application would call it, and reads the history back.
// Prints where Node found the client, to tell the tarball's copy from the checkout.
const QUICK_START_RUN = `
import { realpathSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { TurnstoreClient } from "turnstore-client";
import { ask } from "./quick-start.mjs";
const answers = [];
for (const question of ["What is a vector index?", "How do I build one?"]) {
  answers.push(await ask("chat-42", "alice", question));
}
const { text } = await new TurnstoreClient().getHistoryText("chat-42");
const client = realpathSync(fileURLToPath(import.meta.resolve("turnstore-client")));
console.log(JSON.stringify({ answers, text, client }));
`;

/** What `npm pack --json` says of a tarball. */
interface Packed {
  filename: string;
  files: { path: string }[];
}

/**
 * The tarball's file list: package.json, the README, dist/ (each module with
 * its declarations, every file that package.json's exports and types name)
 * and the sources dist/'s source maps point to; nothing else (no tests, no
 * dist-test, no scripts or tsconfig, no node_modules).
 */
function checkPackedFiles(files: string[], installed: string): void {
  const manifest = JSON.parse(readFileSync(join(installed, "package.json"), "utf8")) as {
    exports: Record<string, string | Record<string, string>>;
    types: string;
  };
  const exported = Object.values(manifest.exports).flatMap((e) => (typeof e === "string" ? [e] : Object.values(e)));
  const named = [manifest.types, ...exported].map((path) => path.replace(/^\.\//, ""));
  const listed = new Set(files);
  for (const path of ["package.json", "README.md", ...named]) {
    assert.ok(listed.has(path), `the tarball has no ${path}`);
  }
  const mapped = new Set<string>();
  for (const map of files.filter((f) => f.endsWith(".js.map"))) {
    const { sources } = JSON.parse(readFileSync(join(installed, map), "utf8")) as { sources: string[] };
    for (const source of sources) {
      const path = join(map, "..", source);
      assert.ok(listed.has(path), `${map} names ${source}, not in the tarball`);
      mapped.add(path);
    }
  }
  for (const file of files) {
    const module = /^dist\/(.+)\.js$/.exec(file)?.[1];
    if (module) assert.ok(listed.has(`dist/${module}.d.ts`), `${file} has no declarations`);
    const kept =
      ["package.json", "README.md"].includes(file) ||
      /^LICEN[SC]E/.test(file) ||
      /^dist\/[^/]+\.(js|d\.ts|js\.map)$/.test(file) ||
      mapped.has(file);
    assert.ok(kept, `the tarball has ${file}, which is no part of the package`);
  }
}

async function main(): Promise<void> {
  // 1. A fresh checkout of the package.
  cpSync(packageDir, checkout, {
    recursive: true,
    filter: (source) => !NOT_IN_A_CHECKOUT.has(basename(source)),
  });
  assert.ok(!existsSync(join(checkout, "dist")), "the copy must start without dist/");

  // 2. An empty project installs it, with nothing else.
  mkdirSync(consumer);
  run("npm", ["install", "--no-audit", "--no-fund", checkout], consumer);
  assert.ok(existsSync(join(checkout, "dist", "index.js")), "npm install did not build dist/ (prepare)");

  // 3. It imports and works against a real server.
  const server = await startTurnstore();
  const withServer = { ...process.env, TURNSTORE_URL: server.baseUrl };
  try {
    writeFileSync(join(consumer, "smoke.mjs"), ESM_SMOKE);
    const output = run(process.execPath, ["smoke.mjs"], consumer, withServer);
    assert.deepEqual(JSON.parse(output), {
      answer: "An index for vectors (1)",
      text: "### Conversation history:\nUser: What is a vector index?\nAssistant: An index for vectors (1)",
      code: "session_not_found",
    });
    writeFileSync(join(consumer, "smoke.cjs"), CJS_SMOKE);
    assert.equal(run(process.execPath, ["smoke.cjs"], consumer).trim(), "function");
    // The core installed nothing of the adapters' frameworks into the project.
    for (const name of ["ai", "@langchain/core"]) {
      assert.ok(!existsSync(join(consumer, "node_modules", name)), `installing the client installed ${name}`);
    }

    // 4. The project installs the frameworks (its own copies) and uses the adapters with them.
    run("npm", ["install", "--no-audit", "--no-fund", ...frameworkPackages()], consumer);
    writeFileSync(join(consumer, "adapters.mjs"), ADAPTERS_SMOKE);
    assert.deepEqual(JSON.parse(run(process.execPath, ["adapters.mjs"], consumer, withServer)), {
      text: "a1",
      status: "finalized",
      reply: "a2",
      ai: [["q1", "a1"]],
      langchain: [["q2", "a2"]],
    });
  } finally {
    await server.stop();
  }

  // 5. Its types resolve for a TypeScript consumer, and the README's examples compile.
  writeFileSync(join(consumer, "smoke.ts"), TS_SMOKE);
  const examples = readmeExamples(README_EXAMPLES);
  const adapterExamples = readmeExamples(ADAPTER_EXAMPLES);
  for (const [name, text] of [...examples, ...adapterExamples]) writeFileSync(join(consumer, name), text);
  const tsc = join(checkout, "node_modules", "typescript", "bin", "tsc");
  const strict = ["--noEmit", "--strict", "--module", "nodenext", "--moduleResolution", "nodenext", "--target", "es2022"];
  // The client's own declarations, checked too.
  run(process.execPath, [tsc, ...strict, "smoke.ts", ...examples.keys()], consumer);
  // The frameworks' declarations need more than this project has (@types/node,
  // @types/json-schema, lib esnext.disposable): an application compiles them
  // with skipLibCheck, as the Next.js and Vite templates do.
  run(process.execPath, [tsc, ...strict, "--skipLibCheck", ...adapterExamples.keys()], consumer);

  // 6. The package as a registry would serve it: `npm pack` (which runs
  // `prepare`, as a publish does) into another empty project, installed with
  // nothing else.
  const [packed] = JSON.parse(run("npm", ["pack", "--json", "--pack-destination", work], checkout)) as Packed[];
  assert.ok(packed, "npm pack listed no tarball");
  mkdirSync(tarballConsumer);
  run("npm", ["install", "--no-audit", "--no-fund", join(work, packed.filename)], tarballConsumer);
  const installed = join(tarballConsumer, "node_modules", "turnstore-client");
  assert.ok(!lstatSync(installed).isSymbolicLink(), "the tarball was linked, not unpacked");
  assert.ok(!existsSync(join(installed, "node_modules")), "the installed package has a node_modules of its own");
  checkPackedFiles(packed.files.map((f) => f.path), installed);

  // 7. The README's quick start, as written, compiled against the tarball's
  // declarations (an ES module: .mts), then run against a fresh server;
  // CommonJS loads it too.
  writeFileSync(join(tarballConsumer, "quick-start.mts"), readmeBlock(QUICK_START));
  writeFileSync(join(tarballConsumer, "smoke.mts"), TS_SMOKE);
  const emit = strict.filter((flag) => flag !== "--noEmit");
  run(process.execPath, [tsc, ...emit, "quick-start.mts", "smoke.mts"], tarballConsumer);
  writeFileSync(join(tarballConsumer, "run-quick-start.mjs"), QUICK_START_RUN);
  writeFileSync(join(tarballConsumer, "smoke.cjs"), CJS_SMOKE);
  const fresh = await startTurnstore();
  try {
    const output = run(process.execPath, ["run-quick-start.mjs"], tarballConsumer, {
      ...process.env,
      TURNSTORE_URL: fresh.baseUrl,
    });
    assert.deepEqual(JSON.parse(output), {
      answers: ["An answer to: What is a vector index?", "An answer to: How do I build one?"],
      text:
        "### Conversation history:\n" +
        "User: What is a vector index?\nAssistant: An answer to: What is a vector index?\n\n" +
        "User: How do I build one?\nAssistant: An answer to: How do I build one?",
      client: join(realpathSync(installed), "dist", "index.js"),
    });
    assert.equal(run(process.execPath, ["smoke.cjs"], tarballConsumer).trim(), "function");
  } finally {
    await fresh.stop();
  }
}

try {
  await main();
  rmSync(work, { recursive: true, force: true });
  console.log(
    "check-install: OK (npm install <folder> and <npm pack tarball> from empty projects: builds, imports, works)",
  );
} catch (error) {
  console.error(`check-install: FAILED; files kept in ${work}`);
  throw error;
}
