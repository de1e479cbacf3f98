//! The optional server-side summarizer: folds a session's older turns into
//! its rolling summary by asking an OpenAI-compatible chat endpoint.
//!
//! - `llm`: the client for that endpoint (its settings, retries, time bound
//!   and errors). It knows nothing of sessions or stores, so it can be tested
//!   against a fake endpoint alone.
//! - `config`: the client's settings and their defaults.
//! - `chat`: what goes over the wire, request and answer (pure).
//! - `retry`: when to try again and how long to wait first (pure).
//! - `error`: why a summarization failed, safe to log and to count.
//! - `worker`: when to summarize a session, one instance at a time, off the
//!   request's path.

mod chat;
mod config;
mod error;
pub mod llm;
mod retry;
pub mod worker;

pub use worker::{Plan, Summarizer};
