// @ts-check
// Fails when src/schema.ts is not what `npm run generate` makes from the
// current openapi/openapi.json (openapi-typescript with its default settings),
// or when the generator prints a warning: regenerates into a temporary file
// and compares it byte for byte with the checked-in one.
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { defaultOutput, generate } from "./generate.mjs";

const dir = mkdtempSync(join(tmpdir(), "turnstore-schema-"));
try {
  const fresh = join(dir, "schema.ts");
  generate(fresh);
  const expected = readFileSync(fresh, "utf8");
  let actual = "";
  try {
    actual = readFileSync(defaultOutput, "utf8");
  } catch {
    // A missing file is reported like a stale one below.
  }
  if (actual !== expected) {
    const a = actual.split("\n");
    const e = expected.split("\n");
    let line = 0;
    while (line < a.length && a[line] === e[line]) line += 1;
    console.error(
      `src/schema.ts is stale: it differs from the spec from line ${line + 1}\n` +
        `  checked in: ${JSON.stringify(a[line] ?? "<end of file>")}\n` +
        `  generated:  ${JSON.stringify(e[line] ?? "<end of file>")}\n` +
        "Run `npm run generate` and commit the result.",
    );
    process.exitCode = 1; // not exit(): the finally below must still clean up
  } else {
    console.error("src/schema.ts matches openapi/openapi.json (openapi-typescript, default settings, no warning)");
  }
} finally {
  rmSync(dir, { recursive: true, force: true });
}
