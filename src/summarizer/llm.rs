//! The client of an OpenAI-compatible chat-completions endpoint (OpenAI,
//! vLLM, Ollama, LiteLLM…) that folds new turns into a previous summary.
//!
//! Incremental by design: each call sends the previous summary and only the
//! turns after it, never the summary alone. Transient failures (timeouts,
//! connection errors, 429, 5xx) are retried with jittered exponential
//! backoff; the whole call has a time bound ([`LlmClient::max_duration`]) so
//! a slow endpoint cannot hold a summarization, or its lock, forever.

use std::fmt;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::HeaderValue;
use http::header::{AUTHORIZATION, CONTENT_TYPE};
use reqwest::Url;
use tracing::Instrument;

use super::chat;
use super::retry;
use crate::telemetry;

pub use super::chat::{DEFAULT_PROMPT, Summary};
pub use super::config::{
    DEFAULT_BACKOFF, DEFAULT_MAX_RETRIES, DEFAULT_MAX_SUMMARY_BYTES, DEFAULT_TIMEOUT, LlmConfig,
    LlmConfigError, words_within,
};
pub use super::error::{Garbage, LlmError};

/// Error bodies are read only this far, for their `error.code`.
const ERROR_BODY_LIMIT: usize = 64 * 1024;

/// Asks the endpoint for summaries. Cheap to clone (the connection pool is
/// shared); dropping a `summarize` future cancels its request.
#[derive(Clone)]
pub struct LlmClient {
    http: reqwest::Client,
    url: Url,
    /// `Bearer <key>`, marked sensitive so the HTTP stack never logs it.
    auth: Option<HeaderValue>,
    config: LlmConfig,
    max_duration: Duration,
}

impl fmt::Debug for LlmClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LlmClient")
            .field("config", &self.config)
            .field("max_duration", &self.max_duration)
            .finish_non_exhaustive()
    }
}

/// A failed attempt, and how long the endpoint asked to wait before the next.
struct Failure {
    error: LlmError,
    retry_after: Option<Duration>,
}

impl From<LlmError> for Failure {
    fn from(error: LlmError) -> Self {
        Failure {
            error,
            retry_after: None,
        }
    }
}

impl LlmClient {
    pub fn new(config: LlmConfig) -> Result<Self, LlmConfigError> {
        let url = Url::parse(&config.url).map_err(|e| LlmConfigError::Url(e.to_string()))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(LlmConfigError::Url(format!("scheme {}", url.scheme())));
        }
        if config.timeout.is_zero() || config.max_summary_bytes == 0 {
            return Err(LlmConfigError::Zero);
        }
        let auth = match &config.api_key {
            Some(key) => {
                let mut value = HeaderValue::try_from(format!("Bearer {key}"))
                    .map_err(|_| LlmConfigError::ApiKey)?;
                value.set_sensitive(true);
                Some(value)
            }
            None => None,
        };
        // An API endpoint has no business redirecting a POST, and following
        // one would send the key elsewhere.
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("turnstore/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| LlmConfigError::Client(e.to_string()))?;
        let max_duration = retry::total_bound(config.timeout, config.max_retries);
        Ok(LlmClient {
            http,
            url,
            auth,
            config,
            max_duration,
        })
    }

    /// The longest a `summarize` call can take, retries and waits included:
    /// a lock held for one must outlive this.
    pub fn max_duration(&self) -> Duration {
        self.max_duration
    }

    /// The next summary: `previous` (the summary so far, if any) with `turns`
    /// (question, answer), the ones it does not cover yet, folded in.
    pub async fn summarize(
        &self,
        previous: Option<&str>,
        turns: &[(String, String)],
    ) -> Result<Summary, LlmError> {
        if turns.is_empty() {
            return Err(LlmError::NoTurns);
        }
        let request = chat::request_body(
            &self.config.model,
            &self.config.prompt,
            previous,
            turns,
            self.config.max_summary_words,
        );
        let body = Bytes::from(request.to_string());
        let deadline = Instant::now() + self.max_duration;
        tokio::time::timeout(self.max_duration, self.attempts(body, deadline))
            .await
            .unwrap_or(Err(LlmError::Timeout(self.max_duration)))
    }

    /// Attempts until one succeeds, one fails for good, the retries are
    /// spent, or the next wait would end past `deadline`.
    async fn attempts(&self, body: Bytes, deadline: Instant) -> Result<Summary, LlmError> {
        let timeout = self.config.timeout;
        let mut retry = 0;
        loop {
            let failure = match self.attempt_within(timeout, body.clone()).await {
                Ok(summary) => return Ok(summary),
                Err(failure) => failure,
            };
            if !failure.error.is_transient() || retry >= self.config.max_retries {
                return Err(failure.error);
            }
            let backoff = retry::backoff(self.config.backoff, retry, retry::jitter());
            let wait = match failure.retry_after {
                // Sooner than the endpoint allows would only earn another 429.
                Some(asked) if asked > retry::WAIT_CAP => return Err(failure.error),
                Some(asked) => asked.max(backoff),
                None => backoff,
            };
            if Instant::now() + wait >= deadline {
                return Err(failure.error);
            }
            tracing::warn!(
                kind = failure.error.kind(),
                status = failure.error.status(),
                retry = retry + 1,
                wait_ms = wait.as_millis() as u64,
                "summarizer attempt failed, retrying: {}",
                failure.error
            );
            tokio::time::sleep(wait).await;
            retry += 1;
        }
    }

    /// One call of the model, bounded by `timeout`; in a span of its own
    /// when traces are on.
    async fn attempt_within(&self, timeout: Duration, body: Bytes) -> Result<Summary, Failure> {
        let attempt = async {
            tokio::time::timeout(timeout, self.attempt(body))
                .await
                .unwrap_or_else(|_| Err(LlmError::Timeout(timeout).into()))
        };
        if !telemetry::on() {
            return attempt.await;
        }
        let span = telemetry::chat_span(&self.config.model);
        let result = attempt.instrument(span.clone()).await;
        if let Err(failure) = &result {
            if let Some(status) = failure.error.status() {
                span.record("http.response.status_code", i64::from(status));
            }
            span.record("otel.status_code", "error");
        }
        result
    }

    async fn attempt(&self, body: Bytes) -> Result<Summary, Failure> {
        let mut request = self
            .http
            .post(self.url.clone())
            .header(CONTENT_TYPE, "application/json")
            .body(body);
        if let Some(auth) = &self.auth {
            request = request.header(AUTHORIZATION, auth.clone());
        }
        let response = request.send().await.map_err(transport)?;
        let status = response.status();
        if !status.is_success() {
            let retry_after = retry::retry_after(response.headers(), SystemTime::now());
            let code = read_body(response, ERROR_BODY_LIMIT)
                .await
                .ok()
                .and_then(|body| chat::error_code(&body));
            return Err(Failure {
                error: LlmError::Status {
                    status: status.as_u16(),
                    code,
                },
                retry_after,
            });
        }
        let body = read_body(response, self.response_limit()).await?;
        chat::parse_answer(&body, self.config.max_summary_bytes)
            .map_err(|garbage| LlmError::from(garbage).into())
    }

    /// JSON may escape each byte of the summary as `\u00XX`; the rest is room
    /// for usage, ids and reasoning fields some servers add.
    fn response_limit(&self) -> usize {
        self.config
            .max_summary_bytes
            .saturating_mul(6)
            .saturating_add(1024 * 1024)
    }
}

/// The body, up to `limit` bytes: a 2xx answer over it is garbage, not
/// something to hold in memory.
async fn read_body(mut response: reqwest::Response, limit: usize) -> Result<Vec<u8>, LlmError> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(transport)? {
        if body.len() + chunk.len() > limit {
            return Err(Garbage::TooLarge { max: limit }.into());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The transport's message and its causes ("…: tcp connect error: Connection
/// refused"), without the URL, which may carry credentials.
fn transport(error: reqwest::Error) -> LlmError {
    let error = error.without_url();
    let mut message = error.to_string();
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    LlmError::Connection(message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_of_the_config_and_client_redacts_the_key() {
        let mut config = LlmConfig::new("http://127.0.0.1:9/v1/chat/completions", "m");
        config.api_key = Some("sk-very-secret".into());
        let client = LlmClient::new(config.clone()).unwrap();
        for shown in [format!("{config:?}"), format!("{client:?}")] {
            assert!(!shown.contains("sk-very-secret"), "{shown}");
            assert!(shown.contains("<redacted>"), "{shown}");
            assert!(
                !shown.contains("conversation"),
                "the prompt is shown by size: {shown}"
            );
        }
    }

    #[test]
    fn settings_that_cannot_work_are_refused_at_build() {
        let new = |url: &str, change: fn(&mut LlmConfig)| {
            let mut config = LlmConfig::new(url, "m");
            change(&mut config);
            LlmClient::new(config)
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        let url = "https://api.example.com/v1/chat/completions";
        assert!(new(url, |_| {}).is_ok());
        assert!(new("api.example.com/v1", |_| {}).is_err());
        assert!(new("ftp://api.example.com/v1", |_| {}).is_err());
        assert!(new(url, |c| c.timeout = Duration::ZERO).is_err());
        assert!(new(url, |c| c.max_summary_bytes = 0).is_err());
        let bad_key = new(url, |c| c.api_key = Some("sk-line\nbreak".into())).unwrap_err();
        assert!(!bad_key.contains("sk-line"), "{bad_key}");
    }

    #[tokio::test(start_paused = true)]
    async fn no_call_outlasts_the_total_cap() {
        // Connections land in the listener's backlog and are never answered.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!(
            "http://{}/v1/chat/completions",
            listener.local_addr().unwrap()
        );
        let mut config = LlmConfig::new(url, "m");
        config.timeout = Duration::from_secs(3600);
        let client = LlmClient::new(config).unwrap();
        let started = tokio::time::Instant::now();

        let error = client.summarize(None, &[("q".into(), "a".into())]).await;

        assert!(
            matches!(error, Err(LlmError::Timeout(d)) if d == retry::TOTAL_CAP),
            "{error:?}"
        );
        assert_eq!(started.elapsed(), retry::TOTAL_CAP);
    }

    #[test]
    fn the_time_bound_follows_the_settings() {
        let mut config = LlmConfig::new("http://localhost/v1/chat/completions", "m");
        config.timeout = Duration::from_secs(2);
        config.max_retries = 1;
        let client = LlmClient::new(config).unwrap();
        assert_eq!(
            client.max_duration(),
            Duration::from_secs(2) * 2 + retry::WAIT_CAP
        );
    }
}
