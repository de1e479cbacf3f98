//! Why a summarization failed. Each message is safe to log: it never holds
//! the API key, the prompt, the turns or the endpoint's answer (an error
//! body may echo the input, and OpenAI's 401 echoes part of the key), only
//! durations, status codes and short identifiers.

use std::time::Duration;

/// A failed `summarize` call; [`LlmError::kind`] names it for metrics labels.
#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    /// No answer within the per-attempt timeout, or the call's total time
    /// bound ran out.
    #[error("the summarizer endpoint did not answer within {0:?}")]
    Timeout(Duration),
    /// Could not connect, or the connection broke (DNS, refused, TLS, reset):
    /// the transport's own message, without the URL.
    #[error("could not reach the summarizer endpoint: {0}")]
    Connection(String),
    /// An answer other than 2xx. `code` is the OpenAI-style `error.code` (or
    /// `error.type`) of the body when it is a short identifier such as
    /// `model_not_found`; the rest of the body is never kept.
    #[error("the summarizer endpoint answered HTTP {status}{}", code_suffix(code))]
    Status { status: u16, code: Option<String> },
    /// A 2xx answer that holds no usable summary.
    #[error("the summarizer endpoint's answer is unusable: {0}")]
    Garbage(#[from] Garbage),
    /// Called without new turns: re-summarizing the summary alone only loses
    /// detail, so the endpoint is not called.
    #[error("nothing to summarize: no new turns")]
    NoTurns,
}

fn code_suffix(code: &Option<String>) -> String {
    code.as_ref().map(|c| format!(" ({c})")).unwrap_or_default()
}

impl LlmError {
    /// A fixed, low-cardinality name for metrics labels and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            LlmError::Timeout(_) => "timeout",
            LlmError::Connection(_) => "connection",
            LlmError::Status { .. } => "http_status",
            LlmError::Garbage(_) => "garbage",
            LlmError::NoTurns => "no_turns",
        }
    }

    /// The HTTP status of a [`LlmError::Status`].
    pub fn status(&self) -> Option<u16> {
        match self {
            LlmError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// Worth another attempt: the endpoint may answer next time. Other 4xx
    /// (bad key, unknown model, input too long) and garbage would only fail
    /// again.
    pub(crate) fn is_transient(&self) -> bool {
        match self {
            LlmError::Timeout(_) | LlmError::Connection(_) => true,
            LlmError::Status { status, .. } => *status == 429 || (500..600).contains(status),
            LlmError::Garbage(_) | LlmError::NoTurns => false,
        }
    }
}

/// What is wrong with a 2xx answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Garbage {
    #[error("not JSON")]
    NotJson,
    #[error("JSON, but not a chat completion")]
    UnexpectedShape,
    #[error("no choices")]
    NoChoices,
    #[error("empty content")]
    EmptyContent,
    /// `finish_reason: "length"`: the model stopped mid-summary.
    #[error("cut off by the model's length limit")]
    Truncated,
    #[error("summary of {bytes} bytes, over the limit of {max}")]
    TooLong { bytes: usize, max: usize },
    /// More tokens than its share of a default history
    /// (`TURNSTORE_SUMMARY_SHARE`).
    #[error("summary of {tokens} tokens, over its share of a history ({max})")]
    OverBudget { tokens: u32, max: u32 },
    /// The response body itself, read only up to a bound.
    #[error("response body over {max} bytes")]
    TooLarge { max: usize },
}

impl Garbage {
    /// A fixed name for logs (and a finer metrics label, if wanted).
    pub fn reason(&self) -> &'static str {
        match self {
            Garbage::NotJson => "not_json",
            Garbage::UnexpectedShape => "unexpected_shape",
            Garbage::NoChoices => "no_choices",
            Garbage::EmptyContent => "empty_content",
            Garbage::Truncated => "truncated",
            Garbage::TooLong { .. } => "too_long",
            Garbage::OverBudget { .. } => "over_budget",
            Garbage::TooLarge { .. } => "too_large",
        }
    }
}
