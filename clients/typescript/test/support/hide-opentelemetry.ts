// Module hooks (node:module `register`) for a process in which
// `@opentelemetry/api` is not installed: resolving it fails as for a missing
// package, and each attempt is appended to a file.
import { appendFileSync } from "node:fs";
import type { InitializeHook, ResolveHook } from "node:module";

let log = "";

export const initialize: InitializeHook<{ log: string }> = (data) => {
  log = data.log;
};

export const resolve: ResolveHook = (specifier, context, nextResolve) => {
  if (specifier === "@opentelemetry/api") {
    appendFileSync(log, `${specifier}\n`);
    throw Object.assign(new Error(`Cannot find package '${specifier}' (hidden by the test)`), {
      code: "ERR_MODULE_NOT_FOUND",
    });
  }
  return nextResolve(specifier, context);
};
