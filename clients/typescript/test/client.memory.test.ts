import { startTurnstore } from "./support/processes.js";
import { clientSuite } from "./support/suite.js";

clientSuite("memory", (env) => startTurnstore(env));
