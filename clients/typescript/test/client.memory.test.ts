import { startTurnstore } from "./support/processes.js";
import { SUITE_SERVER_ENV, clientSuite } from "./support/suite.js";

clientSuite("memory", () => startTurnstore({ ...SUITE_SERVER_ENV }));
