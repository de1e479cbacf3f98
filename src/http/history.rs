//! History options (query string of get_history, or `history` in a start)
//! and the response both return.

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::extract::Check;
use crate::config::Settings;
use crate::history::{self, Format, Options, SelectedTurn, StoppedBy};
use crate::store::StoredHistory;
use crate::tokens::Encoding;
use crate::turn::{TurnView, rfc3339};

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

impl From<Format> for HistoryFormat {
    fn from(f: Format) -> Self {
        match f {
            Format::Text => HistoryFormat::Text,
            Format::Messages => HistoryFormat::Messages,
            Format::Turns => HistoryFormat::Turns,
        }
    }
}

/// Why the history holds fewer turns than the candidates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    Limit,
    MaxTokens,
    MaxBytes,
}

impl From<StoppedBy> for StopReason {
    fn from(s: StoppedBy) -> Self {
        match s {
            StoppedBy::Limit => StopReason::Limit,
            StoppedBy::MaxTokens => StopReason::MaxTokens,
            StoppedBy::MaxBytes => StopReason::MaxBytes,
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
    /// Always keep the first candidate turn (the session's first, unless
    /// `after_seq` excludes it) when anything is kept.
    pub keep_first: Option<bool>,
    /// Only turns with `seq` above this are candidates (range reads).
    pub after_seq: Option<u64>,
    /// Only turns with `seq` up to this are candidates (range reads).
    pub through_seq: Option<u64>,
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
            max_bytes: settings.max_history_bytes,
            format: self.format.unwrap_or(HistoryFormat::Text).into(),
            encoding,
            max_query_chars: self.max_query_chars.map(|n| n as usize),
            max_answer_chars: self.max_answer_chars.map(|n| n as usize),
            keep_first: self.keep_first.unwrap_or(false),
            after_seq: self.after_seq.unwrap_or(0),
            through_seq: self.through_seq.unwrap_or(u64::MAX),
        }
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

impl From<TurnView> for TurnOut {
    fn from(t: TurnView) -> Self {
        TurnOut {
            turn_id: t.turn_id.to_string(),
            seq: t.seq,
            user_query: t.user_query,
            final_answer: t.final_answer,
            started_at: rfc3339(t.started_at),
            finalized_at: rfc3339(t.finalized_at),
            truncated: false,
        }
    }
}

impl From<SelectedTurn> for TurnOut {
    fn from(t: SelectedTurn) -> Self {
        TurnOut {
            truncated: t.truncated,
            ..TurnOut::from(t.turn)
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
    /// The bound that left turns out (`limit`, `max_tokens` or `max_bytes`,
    /// the first of them when several stop at the same turn), or `null`
    /// when every candidate turn is included.
    pub stopped_by: Option<StopReason>,
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
    pub fn build(session_id: &str, stored: StoredHistory, opts: &Options) -> Self {
        let selection = stored.selection;
        let included_turns = selection.turns.len() as u64;
        let mut out = HistoryResponse {
            session_id: session_id.to_owned(),
            user_id: stored.user_id,
            format: opts.format.into(),
            encoding: opts.encoding,
            token_count: selection.token_count,
            total_turns: stored.total_turns,
            included_turns,
            omitted_turns: stored.total_turns.saturating_sub(included_turns),
            pending_turns: stored.pending_turns,
            stopped_by: selection.stopped_by.map(StopReason::from),
            rendered: None,
            messages: None,
            turns: None,
        };
        match opts.format {
            Format::Text => out.rendered = Some(history::render_text(&selection.turns)),
            Format::Messages => {
                out.messages = Some(
                    history::messages(selection.turns)
                        .into_iter()
                        .map(|m| MessageOut {
                            role: m.role,
                            content: m.content,
                        })
                        .collect(),
                )
            }
            Format::Turns => {
                out.turns = Some(selection.turns.into_iter().map(TurnOut::from).collect())
            }
        }
        out
    }
}
