//! Where and how to ask for summaries: one field per setting, each default
//! written once, here.

use std::fmt;
use std::time::Duration;

use super::chat::DEFAULT_PROMPT;

/// Per attempt: long enough for a model to write a summary of a few hundred
/// words, short enough that a hung endpoint is noticed.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// Three attempts in all.
pub const DEFAULT_MAX_RETRIES: u32 = 2;
/// About 2,000 tokens of English: the summary goes into every prompt that
/// asks for it, so it has to stay small.
pub const DEFAULT_MAX_SUMMARY_BYTES: usize = 8 * 1024;
/// The first backoff; each retry doubles it (with jitter, up to a cap).
pub const DEFAULT_BACKOFF: Duration = Duration::from_millis(500);

/// Where and how to ask for summaries. `LlmConfig::new(url, model)` fills in
/// the defaults; every field is public so settings can override each.
#[derive(Clone)]
pub struct LlmConfig {
    /// The full endpoint, `…/v1/chat/completions`, http or https.
    pub url: String,
    /// Sent as `model`.
    pub model: String,
    /// Sent as `Authorization: Bearer …` when set; redacted in `Debug`.
    pub api_key: Option<String>,
    /// The limit of one attempt, from connecting to the last byte.
    pub timeout: Duration,
    /// Attempts after the first, for transient failures only.
    pub max_retries: u32,
    /// The system prompt ([`DEFAULT_PROMPT`] unless configured).
    pub prompt: String,
    /// A longer summary is refused, not cut: a cut summary loses its end.
    pub max_summary_bytes: usize,
    /// The length the prompt asks for, in words (a budget in tokens is
    /// enforced where the summary is counted).
    pub max_summary_words: usize,
    /// The first backoff between attempts.
    pub backoff: Duration,
}

impl LlmConfig {
    /// The defaults for everything but where to go and which model to ask.
    pub fn new(url: impl Into<String>, model: impl Into<String>) -> Self {
        LlmConfig {
            url: url.into(),
            model: model.into(),
            api_key: None,
            timeout: DEFAULT_TIMEOUT,
            max_retries: DEFAULT_MAX_RETRIES,
            prompt: DEFAULT_PROMPT.to_string(),
            max_summary_bytes: DEFAULT_MAX_SUMMARY_BYTES,
            max_summary_words: words_within(DEFAULT_MAX_SUMMARY_BYTES, None),
            backoff: DEFAULT_BACKOFF,
        }
    }
}

/// By hand, so the key never reaches a log; the prompt is shown by size.
impl fmt::Debug for LlmConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LlmConfig")
            .field("url", &self.url)
            .field("model", &self.model)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("timeout", &self.timeout)
            .field("max_retries", &self.max_retries)
            .field("prompt", &format_args!("<{} bytes>", self.prompt.len()))
            .field("max_summary_bytes", &self.max_summary_bytes)
            .field("max_summary_words", &self.max_summary_words)
            .field("backoff", &self.backoff)
            .finish()
    }
}

/// Bytes per word assumed when telling the model its length limit: generous,
/// since the limit is enforced in bytes and non-Latin scripts take more.
const BYTES_PER_WORD: usize = 8;

/// Words to ask for so that a summary stays within `bytes` and, when
/// given, `tokens`: half a word a token, as languages other than English
/// take up to two tokens a word.
pub fn words_within(bytes: usize, tokens: Option<u32>) -> usize {
    let by_bytes = bytes / BYTES_PER_WORD;
    tokens
        .map_or(by_bytes, |t| by_bytes.min(t as usize / 2))
        .max(1)
}

/// Settings that cannot work, found when the client is built rather than at
/// the first summarization.
#[derive(Debug, thiserror::Error)]
pub enum LlmConfigError {
    #[error("the summarizer URL is not an http(s) URL: {0}")]
    Url(String),
    #[error("the summarizer API key cannot be sent in an HTTP header")]
    ApiKey,
    #[error("the summarizer timeout and summary size limit must be above zero")]
    Zero,
    #[error("the summarizer's HTTP client could not start: {0}")]
    Client(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_words_asked_for_fit_the_bytes_and_the_tokens() {
        assert_eq!(words_within(32 * 1024, None), 4096);
        // The default read budget's quarter: 1,024 tokens.
        assert_eq!(words_within(32 * 1024, Some(1024)), 512);
        assert_eq!(words_within(800, Some(100_000)), 100);
        assert_eq!(words_within(8, Some(1)), 1);
    }
}
