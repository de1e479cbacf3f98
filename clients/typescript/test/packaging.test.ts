// The adapters' frameworks stay out of the core: optional peer dependencies,
// imported by the adapters' own entry points alone.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { describe, it } from "node:test";
import ts from "typescript";

interface PackageJson {
  exports: Record<string, unknown>;
  dependencies: Record<string, string>;
  peerDependencies: Record<string, string>;
  peerDependenciesMeta: Record<string, { optional?: boolean }>;
  devDependencies: Record<string, string>;
}

const packageJson = JSON.parse(readFileSync(new URL("../package.json", import.meta.url), "utf8")) as PackageJson;

/** The packages a compiled module of dist/ imports, following its relative imports. */
function packagesImported(entry: string): Set<string> {
  const packages = new Set<string>();
  const seen = new Set<string>();
  const visit = (file: URL): void => {
    if (seen.has(file.href)) return;
    seen.add(file.href);
    const source = readFileSync(file, "utf8");
    // Static imports, re-exports and dynamic imports, as the compiler finds them.
    for (const { fileName: specifier } of ts.preProcessFile(source, true, true).importedFiles) {
      if (specifier.startsWith(".")) visit(new URL(specifier, file));
      else packages.add(specifier);
    }
  };
  visit(new URL(`../dist/${entry}`, import.meta.url));
  return packages;
}

describe("packaging of the adapters", () => {
  it("has an entry point each, the frameworks as optional peer dependencies, none of them a dependency", () => {
    assert.deepEqual(Object.keys(packageJson.exports), [".", "./langchain", "./ai", "./package.json"]);
    assert.deepEqual(Object.keys(packageJson.dependencies), ["openapi-fetch"]);
    for (const name of ["ai", "@langchain/core"]) {
      assert.ok(packageJson.peerDependencies[name], name);
      assert.equal(packageJson.peerDependenciesMeta[name]?.optional, true, name);
      assert.ok(packageJson.devDependencies[name], `${name}: the tests run with the real package`);
    }
  });

  it("loads no framework from the main entry point", () => {
    assert.deepEqual([...packagesImported("index.js")].sort(), ["openapi-fetch"]);
  });

  it("loads its framework from each adapter's entry point", () => {
    const ai = packagesImported("ai.js");
    assert.ok(ai.has("ai"), [...ai].join(", "));
    assert.ok(![...ai].some((name) => name.startsWith("@langchain/")), [...ai].join(", "));
    const langchain = [...packagesImported("langchain.js")];
    assert.ok(langchain.some((name) => name.startsWith("@langchain/core/")), langchain.join(", "));
    assert.ok(!langchain.includes("ai"), langchain.join(", "));
  });
});
