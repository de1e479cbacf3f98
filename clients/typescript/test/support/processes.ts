// Starts the real turnstore binary (and redis-server) for the tests.
import { type ChildProcess, spawn } from "node:child_process";
import { connect, createServer } from "node:net";
import { createInterface } from "node:readline";

export interface Running {
  /** Stops the process and waits for it to exit. */
  stop(): Promise<void>;
  /** Its last lines of output, for failure messages. */
  output(): string;
}

export interface RunningTurnstore extends Running {
  baseUrl: string;
}

export interface RunningRedis extends Running {
  url: string;
}

const STARTUP_TIMEOUT_MS = 20_000;
const children = new Set<ChildProcess>();

// A test file that crashes must not leave servers behind.
process.on("exit", () => {
  for (const child of children) child.kill("SIGKILL");
});

export function turnstoreBinary(): string {
  const bin = process.env["TURNSTORE_BIN"];
  if (!bin) {
    throw new Error(
      "TURNSTORE_BIN is not set: point it at a turnstore binary, " +
        "e.g. TURNSTORE_BIN=/path/to/target/debug/turnstore",
    );
  }
  return bin;
}

/**
 * Starts `turnstore serve` on a free port (in-memory store unless `env`
 * gives TURNSTORE_REDIS_URL) and reads the port from its JSON start line.
 */
export async function startTurnstore(env: Record<string, string> = {}): Promise<RunningTurnstore> {
  const inherited = Object.fromEntries(
    // Settings from the developer's shell (API keys, a Redis URL) must not
    // change what the tests run against.
    Object.entries(process.env).filter(([name]) => !name.startsWith("TURNSTORE_")),
  );
  const child = spawn(turnstoreBinary(), ["serve"], {
    env: { ...inherited, TURNSTORE_LISTEN: "127.0.0.1:0", TURNSTORE_LOG_FORMAT: "json", ...env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  const lines = watch(child);
  const port = await waitFor(child, lines, "turnstore", (line) => {
    const record = parseJson(line);
    return record?.["message"] === "turnstore serving" && typeof record["port"] === "number"
      ? record["port"]
      : undefined;
  });
  return { baseUrl: `http://127.0.0.1:${port}`, ...handle(child, lines) };
}

/** Starts a throwaway redis-server (no persistence) on a free port. */
export async function startRedis(): Promise<RunningRedis> {
  for (let tries = 1; ; tries += 1) {
    const port = await freePort();
    const child = spawn(
      "redis-server",
      ["--port", String(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
      { stdio: ["ignore", "pipe", "pipe"] },
    );
    const lines = watch(child);
    try {
      await waitFor(child, lines, "redis-server", (line) =>
        line.includes("Ready to accept connections") ? true : undefined,
      );
      return { url: `redis://127.0.0.1:${port}`, ...handle(child, lines) };
    } catch (error) {
      // Another process may have taken the port between probe and bind.
      if (tries >= 3) throw error;
    }
  }
}

/**
 * Sends one command to the Redis at `url` (`redis://host:port`) and resolves
 * with its reply's first line (enough for the writes and counts the tests
 * make); an error reply rejects.
 */
export function redisCommand(url: string, ...args: string[]): Promise<string> {
  const { hostname, port } = new URL(url);
  const request = `*${args.length}\r\n${args.map((a) => `$${Buffer.byteLength(a)}\r\n${a}\r\n`).join("")}`;
  return new Promise((resolve, reject) => {
    const socket = connect(Number(port), hostname);
    let reply = "";
    socket.setEncoding("utf8");
    socket.on("data", (chunk: string) => {
      reply += chunk;
      const end = reply.indexOf("\r\n");
      if (end < 0) return;
      socket.end();
      const line = reply.slice(0, end);
      if (line.startsWith("-")) reject(new Error(`redis ${args[0]}: ${line}`));
      else resolve(line);
    });
    socket.on("error", reject);
    socket.write(request);
  });
}

function watch(child: ChildProcess): string[] {
  children.add(child);
  child.on("exit", () => children.delete(child));
  const lines: string[] = [];
  // Keep draining both pipes for the whole run: a full pipe would block the
  // server on its next log line.
  for (const stream of [child.stdout, child.stderr]) {
    if (!stream) continue;
    createInterface({ input: stream }).on("line", (line) => {
      lines.push(line);
      if (lines.length > 200) lines.shift();
    });
  }
  return lines;
}

function waitFor<T>(
  child: ChildProcess,
  lines: string[],
  name: string,
  match: (line: string) => T | undefined,
): Promise<T> {
  return new Promise((resolve, reject) => {
    let seen = 0;
    const fail = (why: string): void => {
      clearInterval(poll);
      clearTimeout(timer);
      child.kill("SIGKILL");
      reject(new Error(`${name} ${why}; its output:\n${lines.join("\n")}`));
    };
    const poll = setInterval(() => {
      for (; seen < lines.length; seen += 1) {
        const found = match(lines[seen] ?? "");
        if (found !== undefined) {
          clearInterval(poll);
          clearTimeout(timer);
          resolve(found);
          return;
        }
      }
      if (child.exitCode !== null || child.signalCode !== null) {
        fail(`exited (${child.exitCode ?? child.signalCode}) before it was ready`);
      }
    }, 20);
    const timer = setTimeout(() => fail(`was not ready within ${STARTUP_TIMEOUT_MS} ms`), STARTUP_TIMEOUT_MS);
    child.once("error", (error) => fail(`could not be started: ${error.message}`));
  });
}

function handle(child: ChildProcess, lines: string[]): Running {
  return {
    output: () => lines.join("\n"),
    stop: () =>
      new Promise<void>((resolve) => {
        if (child.exitCode !== null || child.signalCode !== null) {
          resolve();
          return;
        }
        const killer = setTimeout(() => child.kill("SIGKILL"), 5_000);
        child.once("exit", () => {
          clearTimeout(killer);
          resolve();
        });
        child.kill("SIGTERM");
      }),
  };
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      server.close(() =>
        typeof address === "object" && address !== null
          ? resolve(address.port)
          : reject(new Error("no port")),
      );
    });
  });
}

function parseJson(line: string): Record<string, unknown> | undefined {
  try {
    const value: unknown = JSON.parse(line);
    return typeof value === "object" && value !== null ? (value as Record<string, unknown>) : undefined;
  } catch {
    return undefined;
  }
}
