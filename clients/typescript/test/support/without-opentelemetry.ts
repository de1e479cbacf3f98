// Run by tracing.test.ts in a process of its own: the client where
// `@opentelemetry/api` cannot be imported (hide-opentelemetry.js). Prints
// the import attempts made by each step, and the trace headers of each request.
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { register } from "node:module";
import { tmpdir } from "node:os";
import { join } from "node:path";

const folder = mkdtempSync(join(tmpdir(), "turnstore-no-otel-"));
const log = join(folder, "attempts");
register(new URL("./hide-opentelemetry.js", import.meta.url), { data: { log } });
const attempts = (): string[] => (existsSync(log) ? readFileSync(log, "utf8").split("\n").filter(Boolean) : []);

const traceHeaders: string[][] = [];
const fetch = async (request: Request): Promise<Response> => {
  traceHeaders.push([...request.headers.keys()].filter((name) => name === "traceparent" || name === "tracestate"));
  return new Response(null, { status: 204 });
};

// Imported after the hooks are registered, so they see its imports.
const { TurnstoreClient } = await import("turnstore-client");
const afterImport = attempts();
await new TurnstoreClient({ baseUrl: "http://turnstore.test", fetch, propagateTrace: false }).clearSession("s");
const afterUntracedRequest = attempts();
const client = new TurnstoreClient({ baseUrl: "http://turnstore.test", fetch });
for (let i = 0; i < 3; i += 1) await client.clearSession("s");
console.log(JSON.stringify({ afterImport, afterUntracedRequest, afterRequests: attempts(), traceHeaders }));
rmSync(folder, { recursive: true });
