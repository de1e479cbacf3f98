import { startRedis, startTurnstore } from "./support/processes.js";
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
