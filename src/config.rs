//! Settings: every one is a `turnstore serve` flag and a `TURNSTORE_*` variable.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use axum::http::HeaderValue;
use clap::{Args, ValueEnum};

use crate::history::template::TURN_CACHE_BYTES;
use crate::tokens::{Encoding, UnknownModel};

/// `TURNSTORE_LISTEN`'s default, which `healthcheck` shares.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";

/// Everything `serve` needs. Field docs are the `--help` text.
#[derive(Debug, Clone, PartialEq, Args)]
pub struct Settings {
    /// Address to serve on.
    #[arg(long, env = "TURNSTORE_LISTEN", default_value = DEFAULT_LISTEN)]
    pub listen: SocketAddr,

    /// `redis://`, `rediss://` or `redis+unix://` URL; unset means the in-memory store.
    #[arg(long, env = "TURNSTORE_REDIS_URL")]
    pub redis_url: Option<String>,

    /// Comma-separated seed nodes of a Redis Cluster (`redis://h1:6379,redis://h2:6379`);
    /// selects the cluster client. Not together with `TURNSTORE_REDIS_URL`.
    #[arg(
        long,
        env = "TURNSTORE_REDIS_CLUSTER_NODES",
        value_delimiter = ',',
        conflicts_with = "redis_url"
    )]
    pub redis_cluster_nodes: Vec<String>,

    /// First part of every Redis key, so several deployments can share a Redis.
    #[arg(long, env = "TURNSTORE_KEY_PREFIX", default_value = "turnstore", value_parser = parse_key_prefix)]
    pub key_prefix: String,

    /// Sliding session lifetime: every start and finalize resets it.
    #[arg(long, env = "TURNSTORE_SESSION_TTL", default_value = "7d", value_parser = parse_duration)]
    pub session_ttl: Duration,

    /// Lifetime of a turn that is started and never finalized.
    #[arg(long, env = "TURNSTORE_PENDING_TTL", default_value = "15m", value_parser = parse_duration)]
    pub pending_ttl: Duration,

    /// Finalized turns kept per session; the oldest go first.
    #[arg(long, env = "TURNSTORE_MAX_TURNS", default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_turns: u32,

    /// Live pending turns per session: one more start is a 429
    /// `too_many_pending_turns` (idempotent replays still answer).
    #[arg(long, env = "TURNSTORE_MAX_PENDING_TURNS", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub max_pending_turns: u32,

    /// Content bytes one history returns at most (questions, answers, as
    /// rendered): the selection stops there, as at the token budget.
    #[arg(long, env = "TURNSTORE_MAX_HISTORY_BYTES", default_value_t = 4 * 1024 * 1024, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_history_bytes: u64,

    /// Largest `user_query`, in UTF-8 bytes.
    #[arg(long, env = "TURNSTORE_MAX_QUERY_BYTES", default_value_t = 32 * 1024)]
    pub max_query_bytes: usize,

    /// Largest `final_answer`, in UTF-8 bytes.
    #[arg(long, env = "TURNSTORE_MAX_ANSWER_BYTES", default_value_t = 128 * 1024)]
    pub max_answer_bytes: usize,

    /// Largest summary a session keeps, in UTF-8 bytes.
    #[arg(long, env = "TURNSTORE_MAX_SUMMARY_BYTES", default_value_t = 32 * 1024, value_parser = clap::value_parser!(u64).range(1..=1024 * 1024))]
    pub max_summary_bytes: u64,

    /// Largest request body, in bytes (JSON escaping can make a body larger than its text).
    #[arg(long, env = "TURNSTORE_MAX_BODY_BYTES", default_value_t = 1024 * 1024)]
    pub max_body_bytes: usize,

    /// Default `limit` of get_history.
    #[arg(long, env = "TURNSTORE_HISTORY_LIMIT", default_value_t = 20)]
    pub history_limit: u32,

    /// Default `max_tokens` of get_history.
    #[arg(long, env = "TURNSTORE_HISTORY_MAX_TOKENS", default_value_t = 4096)]
    pub history_max_tokens: u32,

    /// Default tokenizer; stored turns are counted with it once, when written.
    #[arg(long, env = "TURNSTORE_ENCODING", default_value = "o200k_base", value_parser = parse_encoding)]
    pub encoding: Encoding,

    /// A directory of Hugging Face tokenizers, loaded at start (a broken
    /// one stops the start naming its file): `NAME.json`, or
    /// `NAME/tokenizer.json` with its `tokenizer_config.json`. Reads name
    /// them with `encoding=NAME`, or through `TURNSTORE_MODELS`.
    #[arg(long, env = "TURNSTORE_TOKENIZERS_DIR")]
    pub tokenizers_dir: Option<PathBuf>,

    /// A model table for `model=`: lines `pattern = encoding` (`*` stands
    /// for any run of characters, case does not matter, the first match
    /// wins; `#` comments) or a JSON object of pattern to encoding, read
    /// at start (a broken one stops the start naming its line). Models in
    /// it win over tiktoken's table of OpenAI models.
    #[arg(long, env = "TURNSTORE_MODELS")]
    pub models: Option<PathBuf>,

    /// A `model=` in no table: `default` counts with `TURNSTORE_ENCODING`
    /// (the response's `encoding` says so), `reject` answers 422
    /// `unknown_model`.
    #[arg(long, env = "TURNSTORE_UNKNOWN_MODEL", value_enum, default_value_t = UnknownModel::Default)]
    pub unknown_model: UnknownModel,

    /// Comma-separated bearer keys; unset means no authentication (a warning at start).
    #[arg(
        long,
        env = "TURNSTORE_API_KEYS",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub api_keys: Vec<String>,

    /// A file of bearer keys, one per line (`#` starts a comment), e.g. a
    /// mounted secret; its keys add to `TURNSTORE_API_KEYS`.
    #[arg(long, env = "TURNSTORE_API_KEYS_FILE")]
    pub api_keys_file: Option<PathBuf>,

    /// PEM file of the CA that signed the Redis server's certificate, for
    /// `rediss://` with a private CA.
    #[arg(long, env = "TURNSTORE_REDIS_CA_FILE")]
    pub redis_ca_file: Option<PathBuf>,

    /// Bound on one request; past it, 503 `request_timeout`.
    #[arg(long, env = "TURNSTORE_REQUEST_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub request_timeout: Duration,

    /// API requests served at once; more are shed with 503 `overloaded`
    /// instead of queueing without bound.
    #[arg(long, env = "TURNSTORE_MAX_CONCURRENCY", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_concurrency: u32,

    /// Threads serving requests; 0 means one per core, and more than one per
    /// core is lowered to that. Each runs a runtime of its own and serves the
    /// connections handed to it in turn, whole (no work stealing, so no
    /// thread wakes another).
    #[arg(long, env = "TURNSTORE_WORKER_THREADS", default_value_t = 0)]
    pub worker_threads: usize,

    /// On SIGTERM or ctrl-c, how long requests in flight may take to finish.
    #[arg(long, env = "TURNSTORE_SHUTDOWN_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub shutdown_timeout: Duration,

    /// `text` or `json` (one object per line).
    #[arg(long, env = "TURNSTORE_LOG_FORMAT", default_value = "text")]
    pub log_format: LogFormat,

    /// Where to send traces (OTLP over HTTP, protobuf): the collector's base
    /// URL, `http://collector:4318`, to which `/v1/traces` is added. Unset,
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT`
    /// turn traces on instead; none of them: no traces, at no cost.
    #[arg(long, env = "TURNSTORE_OTLP_ENDPOINT", value_parser = parse_otlp_endpoint)]
    pub otlp_endpoint: Option<String>,

    /// Bound on one store round trip (and on waiting for a pooled connection):
    /// past it the request fails fast with 503 `store_unavailable`.
    #[arg(long, env = "TURNSTORE_STORE_TIMEOUT", default_value = "1s", value_parser = parse_duration)]
    pub store_timeout: Duration,

    /// How long a user's export may stream at most; past it, the stream
    /// ends early (the client sees a cut export).
    #[arg(long, env = "TURNSTORE_EXPORT_TIMEOUT", default_value = "10m", value_parser = parse_duration)]
    pub export_timeout: Duration,

    /// Exports streaming at once in this instance; one more is a 429
    /// `too_many_exports` (with `Retry-After`). Each buffers about 1.5 MiB
    /// at most, however slowly its client reads.
    #[arg(long, env = "TURNSTORE_MAX_EXPORTS", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub max_exports: u32,

    /// A response being written (an export streaming, say) is cut when its
    /// client accepts no byte for this long: a reader that stalls frees
    /// its connection and its export.
    #[arg(long, env = "TURNSTORE_WRITE_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub write_timeout: Duration,

    /// A request's head (its line and headers) must arrive within this,
    /// counted from its first byte (from the connection's start for the
    /// first request); past it the connection is closed.
    #[arg(long, env = "TURNSTORE_HEADER_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub header_timeout: Duration,

    /// A keep-alive connection with no request in flight is closed after
    /// this long.
    #[arg(long, env = "TURNSTORE_IDLE_TIMEOUT", default_value = "60s", value_parser = parse_duration)]
    pub idle_timeout: Duration,

    /// Client connections kept open at most (and never more than the open
    /// file limit allows, less 64). One more closes the connection idle the
    /// longest, or is closed itself when none is idle.
    #[arg(long, env = "TURNSTORE_MAX_CONNECTIONS", default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,

    /// A directory of `NAME.jinja` history templates, loaded at start (a
    /// broken one stops the start with its file and line); besides the
    /// built-ins `xml` and `markdown`.
    #[arg(long, env = "TURNSTORE_TEMPLATES_DIR")]
    pub templates_dir: Option<PathBuf>,

    /// MiB of rendered turns a process keeps for templated reads: a turn
    /// found there is neither rendered nor tokenized again. Size it to the
    /// renderings of the sessions read often (about a KiB a turn).
    #[arg(long, env = "TURNSTORE_TEMPLATE_CACHE_MB", default_value_t = (TURN_CACHE_BYTES >> 20) as u32, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pub template_cache_mb: u32,

    /// An OpenAI-compatible `/v1/chat/completions` endpoint: with it, the
    /// server folds old turns into each session's summary itself, in the
    /// background after a finalize (or an import); unset means no
    /// server-side summarizer.
    #[arg(long, env = "TURNSTORE_SUMMARIZER_URL")]
    pub summarizer_url: Option<String>,

    /// The model the summarizer asks (needed with `TURNSTORE_SUMMARIZER_URL`).
    #[arg(long, env = "TURNSTORE_SUMMARIZER_MODEL")]
    pub summarizer_model: Option<String>,

    /// Bearer key of the summarizer's endpoint; never logged.
    #[arg(long, env = "TURNSTORE_SUMMARIZER_API_KEY", hide_env_values = true)]
    pub summarizer_api_key: Option<String>,

    /// A file holding the summarizer's system prompt (a built-in one when unset).
    #[arg(long, env = "TURNSTORE_SUMMARIZER_PROMPT_FILE")]
    pub summarizer_prompt_file: Option<PathBuf>,

    /// Summarize when the turns a default history leaves unsummarized hold
    /// at least this many tokens.
    #[arg(long, env = "TURNSTORE_SUMMARIZE_AFTER_TOKENS", default_value_t = 2000, value_parser = clap::value_parser!(u32).range(1..))]
    pub summarize_after_tokens: u32,

    /// Bound on one call of the summarizer's endpoint (it is retried on
    /// timeouts, 429 and 5xx).
    #[arg(long, env = "TURNSTORE_SUMMARIZER_TIMEOUT", default_value = "60s", value_parser = parse_duration)]
    pub summarizer_timeout: Duration,

    /// Retries of a failed call of the summarizer's endpoint.
    #[arg(long, env = "TURNSTORE_SUMMARIZER_MAX_RETRIES", default_value_t = 2, value_parser = clap::value_parser!(u32).range(0..=10))]
    pub summarizer_max_retries: u32,

    /// The share of `TURNSTORE_HISTORY_MAX_TOKENS` (percent) a summary the
    /// summarizer writes may take: its prompt asks for that much, and a
    /// longer answer is a failure (nothing written), so that a default
    /// `summary=true` history keeps room for turns.
    #[arg(long, env = "TURNSTORE_SUMMARY_SHARE", default_value_t = 25, value_parser = clap::value_parser!(u32).range(1..=90))]
    pub summary_share: u32,

    /// Summarizations at once in this instance; more wait for a later
    /// finalize.
    #[arg(long, env = "TURNSTORE_SUMMARIZER_CONCURRENCY", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub summarizer_concurrency: u32,

    /// Comma-separated origins browsers may call the API from
    /// (`https://app.example.com`), compared exactly; unset means no CORS
    /// headers at all.
    #[arg(long, env = "TURNSTORE_CORS_ORIGINS", value_delimiter = ',', value_parser = parse_origin)]
    pub cors_origins: Vec<HeaderValue>,

    /// Multiplexed Redis connections per instance, used in turn; 0 means one
    /// per serving thread (each thread then uses its own).
    #[arg(long, env = "TURNSTORE_REDIS_POOL_SIZE", default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=1024))]
    pub redis_pool_size: u32,

    /// The lens, an inspector page at `/lens`: `off`, `redacted` (secrets
    /// masked before anything is shown) or `full` (texts as stored). It
    /// reads through the public API, with the API's keys.
    #[arg(long, env = "TURNSTORE_LENS", value_enum, default_value_t = LensMode::Off)]
    pub lens: LensMode,

    /// More redaction rules, a file of `name = pattern` lines (`#`
    /// comments), applied after the built-in ones (see `redact.rs`).
    #[arg(long, env = "TURNSTORE_REDACT_PATTERNS")]
    pub redact_patterns: Option<PathBuf>,
}

/// Whether and how the lens page is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LensMode {
    Off,
    Redacted,
    Full,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

impl Default for Settings {
    /// The defaults `turnstore serve` documents, written once: in the
    /// attributes above. The environment is not read (tests rely on that).
    fn default() -> Self {
        use clap::{Args, FromArgMatches};
        let cmd = Settings::augment_args(clap::Command::new("turnstore"))
            .mut_args(|a| a.env(None))
            .no_binary_name(true);
        let matches = cmd
            .try_get_matches_from(std::iter::empty::<&str>())
            .expect("the defaults parse");
        Settings::from_arg_matches(&matches).expect("the defaults parse")
    }
}

/// Parses `500ms`, `90s`, `15m`, `2h`, `7d` (a whole number and a unit; zero is refused).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("`{s}` has no unit: write it like 500ms, 90s, 15m, 2h or 7d"))?;
    let (number, unit) = s.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("`{s}` does not start with a whole number"))?;
    let millis_per_unit: u64 = match unit {
        "ms" => 1,
        "s" => 1000,
        "m" => 60 * 1000,
        "h" => 3600 * 1000,
        "d" => 24 * 3600 * 1000,
        _ => return Err(format!("`{unit}` is not a unit: use ms, s, m, h or d")),
    };
    let millis = n
        .checked_mul(millis_per_unit)
        .ok_or_else(|| format!("`{s}` is too long"))?;
    if millis == 0 {
        return Err("a duration must be longer than zero".into());
    }
    Ok(Duration::from_millis(millis))
}

impl Settings {
    /// Every configured API key: `api_keys` plus the lines of `api_keys_file`.
    pub fn all_api_keys(&self) -> std::io::Result<Vec<String>> {
        let mut keys: Vec<String> = self
            .api_keys
            .iter()
            .map(|k| k.trim().to_owned())
            .filter(|k| !k.is_empty())
            .collect();
        if let Some(path) = &self.api_keys_file {
            let text = std::fs::read_to_string(path).map_err(|e| {
                std::io::Error::new(e.kind(), format!("cannot read {}: {e}", path.display()))
            })?;
            keys.extend(
                text.lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty() && !l.starts_with('#'))
                    .map(str::to_owned),
            );
        }
        Ok(keys)
    }
}

fn parse_encoding(s: &str) -> Result<Encoding, String> {
    Encoding::from_name(s).ok_or_else(|| {
        format!(
            "unknown encoding `{s}`; known: {}",
            Encoding::ALL.map(|e| e.name()).join(", ")
        )
    })
}

/// An origin as browsers send it: `scheme://host[:port]`, lower case, no
/// path; `*` and `null` are refused (CORS here names exact origins).
fn parse_origin(s: &str) -> Result<HeaderValue, String> {
    let origin = s.trim().to_ascii_lowercase();
    let (scheme, rest) = origin
        .split_once("://")
        .ok_or_else(|| format!("`{s}` is not an origin like https://app.example.com"))?;
    let host_ok = !rest.is_empty()
        && rest
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b));
    if !matches!(scheme, "http" | "https") || !host_ok {
        return Err(format!(
            "`{s}` is not an origin like https://app.example.com (scheme, host and port only; no path, no wildcard)"
        ));
    }
    HeaderValue::from_str(&origin).map_err(|e| format!("`{s}`: {e}"))
}

/// An OTLP/HTTP collector's base URL, kept without a trailing slash;
/// `/v1/traces` is added when the path does not end with it already.
fn parse_otlp_endpoint(s: &str) -> Result<String, String> {
    let url = s.trim().trim_end_matches('/');
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"));
    match rest {
        Some(rest) if !rest.is_empty() && !rest.starts_with('/') => Ok(url.to_owned()),
        _ => Err(format!(
            "`{s}` is not an OTLP/HTTP endpoint like http://collector:4318"
        )),
    }
}

/// The prefix goes into every key, so it must not hold `{`/`}` (hash tags) or spaces.
fn parse_key_prefix(s: &str) -> Result<String, String> {
    if crate::domain::is_identifier(s) {
        Ok(s.to_owned())
    } else {
        Err("the key prefix must match ^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `turnstore serve` gets with no flags, through the real command
    /// line, when no `TURNSTORE_*` setting is in the environment.
    #[test]
    fn defaults_are_what_serve_gets_with_no_flags() {
        use clap::{Args, CommandFactory};
        let names: Vec<String> = Settings::augment_args(clap::Command::new("t"))
            .get_arguments()
            .filter_map(|a| a.get_env().map(|e| e.to_string_lossy().into_owned()))
            .collect();
        assert!(names.len() > 20, "{names:?}");
        let set: Vec<&String> = names
            .iter()
            .filter(|n| std::env::var_os(n).is_some())
            .collect();
        assert!(set.is_empty(), "unset {set:?} to run this test");
        let matches = crate::cli::Cli::command()
            .try_get_matches_from(["turnstore", "serve"])
            .unwrap();
        let (_, serve) = matches.subcommand().unwrap();
        let served = <Settings as clap::FromArgMatches>::from_arg_matches(serve).unwrap();
        assert_eq!(served, Settings::default());
        assert_eq!(served.redis_pool_size, 0);
        assert_eq!(served.session_ttl, Duration::from_secs(7 * 24 * 3600));
    }

    #[test]
    fn the_configuration_page_lists_every_setting() {
        use clap::Args;
        let page = include_str!("../docs/configuration.md");
        for arg in Settings::augment_args(clap::Command::new("t")).get_arguments() {
            if let Some(env) = arg.get_env() {
                let row = format!("| `{}` |", env.to_string_lossy());
                assert!(
                    page.contains(&row),
                    "docs/configuration.md's table lacks {row}"
                );
            }
        }
    }

    #[test]
    fn origins_are_exact_and_lower_case() {
        assert_eq!(
            parse_origin(" https://App.Example.com:8443 ").unwrap(),
            "https://app.example.com:8443"
        );
        assert_eq!(
            parse_origin("http://[::1]:3000").unwrap(),
            "http://[::1]:3000"
        );
        for bad in [
            "*",
            "null",
            "app.example.com",
            "https://",
            "https://app.example.com/",
            "https://app.example.com/path",
            "ftp://app.example.com",
            "https://*.example.com",
        ] {
            assert!(parse_origin(bad).is_err(), "{bad} was accepted");
        }
    }

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("15m"), Ok(Duration::from_secs(900)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(604_800)));
    }

    #[test]
    fn bad_durations_are_refused() {
        for bad in [
            "",
            "15",
            "m",
            "0s",
            "1w",
            "-1s",
            "1.5m",
            "99999999999999999999d",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad} was accepted");
        }
    }
}
