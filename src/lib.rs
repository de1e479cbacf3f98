//! turnstore: conversation history for LLM and RAG backends.
//!
//! A backend starts a turn with the user's question (getting the history for
//! its prompt in the same call) and finalizes it with the answer. Only those
//! question/answer pairs are kept, in Redis or in memory.
//!
//! - `config`: every setting, as a flag and a `TURNSTORE_*` variable.
//! - `domain`: validated identifiers and texts; requests become these at the edge.
//! - `tokens`: the encodings and the exact counts taken when a turn is written.
//! - `turn`: turns as the stores keep them (pending, finalized) and timestamps.
//! - `history`: the budget rule and the renderings (pure).
//! - `store`: the storage trait and its backends, `memory` and `redis`
//!   (all Redis keys and Lua scripts live there).
//! - `http`: routes, extractors, the problem+json error type, auth, metrics middleware.
//! - `metrics`: the Prometheus registry.
//! - `summarizer`: the optional server-side summarizer, starting with its
//!   client of an OpenAI-compatible chat endpoint.
//! - `telemetry`: traces over OTLP, when an endpoint is set.
//! - `app`: `Application::build` and `run_until_stopped`.
//! - `cli`: the `turnstore` command line.

pub mod app;
pub mod cli;
pub mod config;
pub mod domain;
pub mod history;
pub mod http;
pub mod metrics;
pub mod redact;
pub mod server;
pub mod store;
pub mod summarizer;
pub mod telemetry;
pub mod tokens;
pub mod turn;

pub use app::Application;
pub use config::Settings;

/// The OpenAPI document under the default settings (no API keys), as pretty
/// JSON (what `turnstore openapi` prints and `openapi/openapi.json` holds; a
/// server serves it with its own bounds and defaults, and requires the
/// bearer key in it when it has keys).
pub fn openapi_json() -> String {
    serde_json::to_string_pretty(&http::openapi(&Settings::default(), false))
        .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}
