import { startRedis, startTurnstore } from "./support/processes.js";
import { SUITE_SERVER_ENV, clientSuite } from "./support/suite.js";

clientSuite("redis", async () => {
  const redis = await startRedis();
  try {
    const server = await startTurnstore({ ...SUITE_SERVER_ENV, TURNSTORE_REDIS_URL: redis.url });
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
