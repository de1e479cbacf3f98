// @ts-check
// Generates the TypeScript types of the turnstore HTTP API from its OpenAPI
// document by running the openapi-typescript command line with its default
// settings, as a user would:
//
//   npx openapi-typescript ../../openapi/openapi.json -o src/schema.ts
//
// and fails on any warning it prints (a document that needs a generator
// option, or that a generator reads wrongly, is the document's bug: see
// docs/API.md, "Generating a client"). One place holds the command, so
// `npm run generate` and `npm run check-generated` can never disagree.
//
// Usage: node scripts/generate.mjs [output]   (default: src/schema.ts)
//
// The output is a .ts file, not a .d.ts: tsc copies no .d.ts from src/ to
// dist/, and dist/index.d.ts must be able to import the generated types.
import { spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";

const packageRoot = new URL("../", import.meta.url);
export const specPath = fileURLToPath(new URL("../../openapi/openapi.json", packageRoot));
export const defaultOutput = fileURLToPath(new URL("src/schema.ts", packageRoot));
const cli = fileURLToPath(new URL("node_modules/openapi-typescript/bin/cli.js", packageRoot));

// What the command prints when all is well: its name and version, then
// "input → output [time]". Anything else (a warning, an error) fails.
const expected = [/^✨ openapi-typescript \d/u, /^🚀 /u];

/**
 * Runs openapi-typescript (no options) on the spec, writing `output`; throws
 * when it fails or prints anything but its usual two lines.
 * @param {string} output
 * @returns {void}
 */
export function generate(output) {
  const run = spawnSync(process.execPath, [cli, specPath, "--output", output], {
    cwd: fileURLToPath(packageRoot),
    encoding: "utf8",
    env: { ...process.env, NO_COLOR: "1", FORCE_COLOR: "0" },
  });
  const plain = (/** @type {string} */ text) =>
    text.replace(/\u001b\[[0-9;]*m/gu, "").split("\n").map((l) => l.trim()).filter((l) => l !== "");
  const out = plain(run.stdout ?? "");
  const err = plain(run.stderr ?? "");
  const unexpected = [...out.filter((l) => !expected.some((re) => re.test(l))), ...err];
  if (run.status !== 0 || unexpected.length > 0) {
    throw new Error(
      `openapi-typescript ${run.status === 0 ? "warned" : `failed (exit ${run.status})`} on ${specPath}:\n` +
        [...out, ...err].join("\n"),
    );
  }
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const output = process.argv[2] ?? defaultOutput;
  generate(output);
  console.error(`wrote ${output} (openapi-typescript, default settings, no warning)`);
}
