//! History options (query string of get_history, or `history` in a start)
//! and the response both return.

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::extract::Check;
use crate::config::Settings;
use crate::history::{self, Encoding, Format, IncludedTurn, Options, RenderedBody};
use crate::store::{StoredHistory, Window};
use crate::turn::{FinalizedTurn, rfc3339};

pub const MAX_LIMIT: u32 = 10_000;
pub const MAX_TOKENS: u32 = 10_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum HistoryFormat {
    Text,
    Messages,
    Turns,
}

impl From<HistoryFormat> for Format {
    fn from(f: HistoryFormat) -> Self {
        match f {
            HistoryFormat::Text => Format::Text,
            HistoryFormat::Messages => Format::Messages,
            HistoryFormat::Turns => Format::Turns,
        }
    }
}

/// How to select and render the history. Every field has a server default.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct HistoryParams {
    /// At most this many most recent finalized turns (0..=10000; default `TURNSTORE_HISTORY_LIMIT`).
    #[param(minimum = 0, maximum = 10000)]
    #[schema(minimum = 0, maximum = 10000)]
    pub limit: Option<u32>,
    /// The result fits in this many tokens (0..=10000000; default `TURNSTORE_HISTORY_MAX_TOKENS`).
    #[param(minimum = 0, maximum = 10000000)]
    #[schema(minimum = 0, maximum = 10000000)]
    pub max_tokens: Option<u32>,
    /// `text` (default), `messages` or `turns`.
    pub format: Option<HistoryFormat>,
    /// A model name (`gpt-4o`): counts with its encoding; an unknown model
    /// falls back to the default encoding. `encoding` wins when both are given.
    pub model: Option<String>,
    /// The tokenizer to count with.
    #[param(value_type = Option<String>, example = "o200k_base")]
    #[schema(value_type = Option<String>, example = "o200k_base")]
    pub encoding: Option<Encoding>,
    /// Truncate each question to this many characters (Unicode scalar values), before budgeting.
    #[param(minimum = 1)]
    #[schema(minimum = 1)]
    pub max_query_chars: Option<u32>,
    /// Truncate each answer to this many characters, before budgeting.
    #[param(minimum = 1)]
    #[schema(minimum = 1)]
    pub max_answer_chars: Option<u32>,
    /// Always keep the session's first turn when anything is kept.
    pub keep_first: Option<bool>,
}

impl HistoryParams {
    /// Validates against the contract and fills in the server defaults.
    pub fn resolve(&self, settings: &Settings, check: &mut Check, at: &str) -> Options {
        let field = |name: &str| format!("{at}{name}");
        let limit = self.limit.unwrap_or(settings.history_limit);
        if limit > MAX_LIMIT {
            check.fail(&field("limit"), format!("must be at most {MAX_LIMIT}"));
        }
        let max_tokens = self.max_tokens.unwrap_or(settings.history_max_tokens);
        if max_tokens > MAX_TOKENS {
            check.fail(
                &field("max_tokens"),
                format!("must be at most {MAX_TOKENS}"),
            );
        }
        for (name, v) in [
            ("max_query_chars", self.max_query_chars),
            ("max_answer_chars", self.max_answer_chars),
        ] {
            if v == Some(0) {
                check.fail(&field(name), "must be at least 1");
            }
        }
        let encoding = self
            .encoding
            .or_else(|| self.model.as_deref().and_then(Encoding::for_model))
            .unwrap_or(settings.encoding);
        Options {
            limit: limit.min(MAX_LIMIT) as usize,
            max_tokens,
            format: self.format.unwrap_or(HistoryFormat::Text).into(),
            encoding,
            max_query_chars: self.max_query_chars.map(|n| n as usize),
            max_answer_chars: self.max_answer_chars.map(|n| n as usize),
            keep_first: self.keep_first.unwrap_or(false),
        }
    }
}

pub fn window(opts: &Options) -> Window {
    Window {
        limit: opts.limit,
        keep_first: opts.keep_first,
    }
}

/// One message of the `messages` format.
#[derive(Debug, Serialize, ToSchema)]
pub struct MessageOut {
    /// `user` or `assistant`.
    pub role: &'static str,
    pub content: String,
}

/// A turn.
#[derive(Debug, Serialize, ToSchema)]
pub struct TurnOut {
    #[schema(format = Uuid)]
    pub turn_id: String,
    pub seq: u64,
    pub user_query: String,
    pub final_answer: String,
    /// RFC 3339 UTC.
    pub started_at: String,
    /// RFC 3339 UTC.
    pub finalized_at: String,
    /// A content was cut by `max_query_chars`/`max_answer_chars` (the stored turn is whole).
    pub truncated: bool,
}

impl TurnOut {
    pub fn new(turn: &FinalizedTurn) -> Self {
        Self::from_included(IncludedTurn {
            turn,
            user_query: turn.start.user_query.as_str().into(),
            final_answer: turn.end.final_answer.as_str().into(),
            truncated: false,
        })
    }

    fn from_included(t: IncludedTurn<'_>) -> Self {
        TurnOut {
            turn_id: t.turn.start.turn_id.to_string(),
            seq: t.turn.seq(),
            user_query: t.user_query.into_owned(),
            final_answer: t.final_answer.into_owned(),
            started_at: rfc3339(t.turn.start.started_at),
            finalized_at: rfc3339(t.turn.end.finalized_at),
            truncated: t.truncated,
        }
    }
}

/// The history, budgeted and rendered in one format.
#[derive(Debug, Serialize, ToSchema)]
pub struct HistoryResponse {
    pub session_id: String,
    pub user_id: Option<String>,
    pub format: HistoryFormat,
    /// The encoding `token_count` is counted in.
    #[schema(value_type = String, example = "o200k_base")]
    pub encoding: Encoding,
    /// Exact count of what is returned; never more than `max_tokens`.
    pub token_count: u32,
    /// Finalized turns the session holds.
    pub total_turns: u64,
    pub included_turns: u64,
    pub omitted_turns: u64,
    /// Started turns not finalized yet (not in the history).
    pub pending_turns: u64,
    /// `format=text`: the rendering ("" for an empty history).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rendered: Option<String>,
    /// `format=messages`: user and assistant messages, oldest first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub messages: Option<Vec<MessageOut>>,
    /// `format=turns`: the included turns, oldest first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub turns: Option<Vec<TurnOut>>,
}

impl HistoryResponse {
    pub fn build(session_id: &str, stored: &StoredHistory, opts: &Options) -> Self {
        let r = history::render(&stored.newest_first, stored.first.as_ref(), opts);
        let mut out = HistoryResponse {
            session_id: session_id.to_owned(),
            user_id: stored.user_id.clone(),
            format: match opts.format {
                Format::Text => HistoryFormat::Text,
                Format::Messages => HistoryFormat::Messages,
                Format::Turns => HistoryFormat::Turns,
            },
            encoding: opts.encoding,
            token_count: r.token_count,
            total_turns: stored.total_turns,
            included_turns: r.included_turns as u64,
            omitted_turns: stored.total_turns.saturating_sub(r.included_turns as u64),
            pending_turns: stored.pending_turns,
            rendered: None,
            messages: None,
            turns: None,
        };
        match r.body {
            RenderedBody::Text(s) => out.rendered = Some(s),
            RenderedBody::Messages(ms) => {
                out.messages = Some(
                    ms.into_iter()
                        .map(|m| MessageOut {
                            role: m.role,
                            content: m.content.into_owned(),
                        })
                        .collect(),
                )
            }
            RenderedBody::Turns(ts) => {
                out.turns = Some(ts.into_iter().map(TurnOut::from_included).collect())
            }
        }
        out
    }
}
