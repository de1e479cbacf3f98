// @ts-check
// `prepare`: builds dist/ so that the package works straight from a checkout.
//
// Why it installs dependencies itself: `npm install <this folder>` from a
// consumer project links the folder (node_modules/turnstore-client ->
// clients/typescript) and runs this script in it, but installs none of the
// folder's own dependencies, neither typescript (to build) nor openapi-fetch
// (needed at run time: Node resolves imports from the link's real path, so
// from clients/typescript/node_modules). Measured with npm 11.19; see
// README.md, "Installing from a checkout". So on a fresh checkout this runs
// `npm ci` here first. When npm runs it after installing the folder itself
// (`npm ci` / `npm install` in clients/typescript) the dependencies are
// already there and it only builds.
import { execFileSync } from "node:child_process";
import { existsSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { npmEnvironment } from "./npm-env.mjs";

const root = fileURLToPath(new URL("../", import.meta.url));
/** @param {string} name */
const installed = (name) => existsSync(`${root}node_modules/${name}/package.json`);

if (!installed("typescript") || !installed("openapi-fetch")) {
  console.error("turnstore-client: installing its own dependencies (npm ci) to build dist/");
  const npm = process.env["npm_execpath"];
  const [command, prefixArgs] =
    npm && npm.endsWith(".js") ? [process.execPath, [npm]] : ["npm", []];
  execFileSync(
    command,
    [
      ...prefixArgs,
      "ci",
      // Dev dependencies hold the compiler; a consumer's --omit=dev must not apply here.
      "--include=dev",
      // This script is the package's only lifecycle script: do not recurse.
      "--ignore-scripts",
      "--no-audit",
      "--no-fund",
      "--prefix",
      root,
    ],
    { cwd: root, stdio: "inherit", env: npmEnvironment() },
  );
}

execFileSync(process.execPath, [`${root}node_modules/typescript/bin/tsc`, "-p", `${root}tsconfig.json`], {
  cwd: root,
  stdio: "inherit",
});

