/** See npm-env.mjs. */
export function npmEnvironment(source?: NodeJS.ProcessEnv): NodeJS.ProcessEnv;
