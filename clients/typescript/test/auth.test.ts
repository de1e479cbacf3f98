import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { TurnstoreClient, TurnstoreError } from "turnstore-client";
import { FaultyFetch } from "./support/faults.js";
import { type RunningTurnstore, startTurnstore } from "./support/processes.js";

describe("API keys (TURNSTORE_API_KEYS)", () => {
  let server: RunningTurnstore;
  before(async () => {
    server = await startTurnstore({ TURNSTORE_API_KEYS: "key-one,key-two" });
  });
  after(async () => {
    await server?.stop();
  });

  it("sends the key as a bearer token", async () => {
    const client = new TurnstoreClient({ baseUrl: server.baseUrl, apiKey: "key-two" });
    const started = await client.startTurn({ userQuery: "q" });
    assert.equal((await client.getSession(started.session_id)).pending_count, 1);
  });

  for (const apiKey of [undefined, "wrong-key"]) {
    it(`gets 401 unauthorized ${apiKey ? "with a wrong key" : "without a key"}, not retried`, async () => {
      const faults = new FaultyFetch(() => undefined);
      const client = new TurnstoreClient({ baseUrl: server.baseUrl, apiKey, fetch: faults.fetch });
      await assert.rejects(client.startTurn({ userQuery: "q" }), (error) => {
        assert.ok(error instanceof TurnstoreError);
        assert.equal(error.status, 401);
        assert.equal(error.code, "unauthorized");
        return true;
      });
      assert.equal(faults.seen.length, 1);
    });
  }
});
