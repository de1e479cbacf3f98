// @ts-check
/**
 * The environment for an npm started from inside an npm script. npm hands its
 * whole configuration to scripts as npm_config_* variables, including the
 * outer command's (--global, --prefix, --omit, --save, its local_prefix...),
 * which would steer the inner npm to another project. Keep only where and how
 * to reach the registry.
 *
 * @param {NodeJS.ProcessEnv} [source]
 * @returns {NodeJS.ProcessEnv}
 */
export function npmEnvironment(source = process.env) {
  const keep =
    /^npm_config_(.*registry|cache|userconfig|globalconfig|cafile|ca|cert|key|proxy|https?_proxy|noproxy|strict_ssl|offline|prefer_offline|prefer_online|fetch_.*|maxsockets|loglevel|\/\/.*)$/i;
  /** @type {NodeJS.ProcessEnv} */
  const env = {};
  for (const [name, value] of Object.entries(source)) {
    if (!/^npm_/i.test(name) || keep.test(name)) env[name] = value;
  }
  return env;
}
