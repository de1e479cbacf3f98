import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { TurnstoreClient } from "turnstore-client";
import { id, turnstoreError } from "./support/assertions.js";
import {
  type RunningRedis,
  type RunningTurnstore,
  redisCommand,
  startRedis,
  startTurnstore,
} from "./support/processes.js";
import { clientSuite } from "./support/suite.js";

clientSuite("redis", async (env) => {
  const redis = await startRedis();
  try {
    const server = await startTurnstore({ ...env, TURNSTORE_REDIS_URL: redis.url });
    return {
      baseUrl: server.baseUrl,
      stop: async () => {
        await server.stop();
        await redis.stop();
      },
    };
  } catch (error) {
    await redis.stop();
    throw error;
  }
});

describe("a fork stopped half way, on Redis", () => {
  // A server whose key prefix the test knows, to leave behind what a fork
  // attempt that stopped half way (its instance killed) leaves: staging keys
  // of the new session, held by that attempt's token.
  const prefix = `ts-fork-${Math.random().toString(16).slice(2, 10)}`;
  let redis: RunningRedis;
  let server: RunningTurnstore;
  before(async () => {
    redis = await startRedis();
    server = await startTurnstore({ TURNSTORE_REDIS_URL: redis.url, TURNSTORE_KEY_PREFIX: prefix });
  });
  after(async () => {
    await server?.stop();
    await redis?.stop();
  });

  /** Staging of a fork into `sessionId` by another attempt, which wrote its last page `ageMs` ago. */
  const stage = async (sessionId: string, ageMs: number): Promise<void> => {
    const base = `${prefix}:{${sessionId}}:`;
    const touched = String(Date.now() - ageMs);
    await redisCommand(redis.url, "HSET", `${base}fk`, "token", "dead", "touched", touched, "n", "7", "top", "99");
    await redisCommand(redis.url, "HSET", `${base}fr`, "junk", "x");
    await redisCommand(redis.url, "ZADD", `${base}fs`, "99", "junk");
  };

  it("is waited out (409 with Retry-After), then completed by the retry with its key", async () => {
    const client = new TurnstoreClient({ baseUrl: server.baseUrl });
    const sessionId = id("s");
    for (const n of [1, 2, 3]) {
      const started = await client.startTurn({ sessionId, userId: "ann", userQuery: `q${n}` });
      await client.finalizeTurn(sessionId, started.turn_id, `a${n}`);
    }
    const newSessionId = id("s");
    // Without retries: told to come back, and nothing was made.
    await stage(newSessionId, 0);
    const once = new TurnstoreClient({ baseUrl: server.baseUrl, maxRetries: 0 });
    const busy = await turnstoreError(once.forkSession(sessionId, { newSessionId }, { idempotencyKey: "k-stopped" }));
    assert.deepEqual([busy.status, busy.code], [409, "session_exists"]);
    assert.ok(busy.retryAfter !== undefined && busy.retryAfter >= 1 && busy.retryAfter <= 5, String(busy.retryAfter));
    assert.equal((await turnstoreError(client.getSession(newSessionId))).code, "session_not_found");

    // With them: the attempt that may still be writing has 1 s of its 5 left;
    // the client waits it out, and its retry takes over and completes the fork.
    await stage(newSessionId, 4_000);
    const started = Date.now();
    const fork = await client.forkSession(sessionId, { newSessionId }, { idempotencyKey: "k-stopped" });
    assert.ok(Date.now() - started >= 900, `waited ${Date.now() - started} ms`);
    assert.deepEqual([fork.replayed, fork.copied_turns, fork.user_id], [false, 3, "ann"]);
    const turns = async (s: string) => (await client.getHistory(s, { format: "turns" })).turns;
    assert.deepEqual(await turns(newSessionId), await turns(sessionId));
    assert.equal((await client.getSession(newSessionId)).turn_count, 3);
    const base = `${prefix}:{${newSessionId}}:`;
    assert.equal(await redisCommand(redis.url, "EXISTS", `${base}fk`, `${base}fr`, `${base}fs`), ":0");
  });
});
