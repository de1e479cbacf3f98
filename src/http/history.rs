//! get_history, and the history options and response a start shares.

use std::borrow::Cow;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::AppState;
use super::accept::Body;
use super::error::{ApiError, ProblemCode};
use super::extract::QueryParams;
pub use super::reading::{Chat, Reading};
use super::sessions::SessionPath;
use super::valid::{AllValid, Valid, rule};
use crate::config::Settings;
use crate::domain::{SessionId, TurnId, UserId};
use crate::history::{
    AnthropicHistory, Format, Message, Options, Rendering, SelectedTurn, StoppedBy, Window,
    WindowKind, chat_messages,
};
use crate::store::counting::unsummarized_tokens;
use crate::store::{StoredHistory, StoredSummary, Unsummarized};
use crate::tokens::{Counting, Encoding, Resolved};
use crate::turn::{TurnView, now_millis, rfc3339};

pub const MAX_LIMIT: u32 = 10_000;
pub const MAX_TOKENS: u32 = 10_000_000;
/// Model names are short; a longer one is refused rather than looked up.
pub const MAX_MODEL_CHARS: usize = 128;
/// Truncation lengths are signed 32-bit integers in the document (`int32`).
pub const MAX_CHARS: u32 = i32::MAX as u32;
/// Range bounds are signed 64-bit integers in the document (`int64`), as
/// most clients hold them.
pub const MAX_SEQ: u64 = i64::MAX as u64;

/// How to select and render the history. Every field has a server default,
/// stated in its description (as this server is configured).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
#[schema(example = json!({"limit": 20, "max_tokens": 2000, "format": "text", "model": "gpt-4o"}))]
pub struct HistoryParams {
    /// At most this many most recent finalized turns.
    pub limit: Option<u32>,
    /// The result fits in this many tokens (exact count, in the encoding
    /// reported).
    pub max_tokens: Option<u32>,
    /// One representation per response: `text` (`rendered`), `messages`
    /// (chat messages) or `turns` (Turn objects, budgeted as `text`).
    pub format: Option<Format>,
    /// A model name (`gpt-4o`): counts with its encoding, from the
    /// server's model table (`TURNSTORE_MODELS`) or tiktoken's table of
    /// OpenAI models. A model in neither counts with the default encoding
    /// (reported in `encoding`), or is refused with 422 `unknown_model`
    /// where the server says so (`TURNSTORE_UNKNOWN_MODEL=reject`).
    /// `encoding` wins when both are given.
    #[schema(max_length = 128, example = "gpt-4o")]
    #[param(max_length = 128, example = "gpt-4o")]
    pub model: Option<String>,
    /// The tokenizer to count with: a built-in encoding, or a tokenizer
    /// the server loaded (`TURNSTORE_TOKENIZERS_DIR`; this server's
    /// document lists them). Unknown: 422 `validation_failed`.
    #[schema(value_type = Option<Encoding>)]
    #[param(value_type = Option<Encoding>)]
    pub encoding: Option<String>,
    /// Truncate each question to this many characters (Unicode scalar
    /// values) before budgeting; a cut content ends with ` [truncated]`.
    #[schema(minimum = 1)]
    #[param(minimum = 1)]
    pub max_query_chars: Option<u32>,
    /// Truncate each answer to this many characters before budgeting.
    #[schema(minimum = 1)]
    #[param(minimum = 1)]
    pub max_answer_chars: Option<u32>,
    /// Always keep the first candidate turn (the session's first, unless
    /// `after_seq` excludes it) when anything is kept: the original goal.
    #[serde(default, deserialize_with = "super::extract::flag")]
    pub keep_first: Option<bool>,
    /// Only turns with `seq` above this are candidates (range reads).
    pub after_seq: Option<u64>,
    /// Only turns with `seq` up to this are candidates (range reads).
    pub through_seq: Option<u64>,
    /// `en`: render the English copies of the turns that have them
    /// (`user_query_en`, `final_answer_en`), the originals elsewhere.
    pub lang: Option<Language>,
    /// Begin with the session's summary (if it has one): it counts first
    /// towards `max_tokens` (if it does not fit, nothing is returned), then
    /// come the newest turns it does not cover.
    #[serde(default, deserialize_with = "super::extract::flag")]
    pub summary: Option<bool>,
    /// Render with this template instead of the `text` format (built-ins
    /// `xml` and `markdown`, and the server's `TURNSTORE_TEMPLATES_DIR`):
    /// same budget rule, exact `token_count`; `format` must be `text`.
    /// Unknown: 404 `template_not_found`. A template that fails, or an
    /// operator's that renders more than twice `TURNSTORE_MAX_HISTORY_BYTES`
    /// plus 1 MiB: 422 `template_error`.
    #[schema(pattern = "^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$", example = "xml")]
    #[param(pattern = "^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$", example = "xml")]
    pub template: Option<String>,
    /// With `format=messages` (implied when no format is given): budget
    /// and count the prompt the messages make through the chat template
    /// of the tokenizer counting (`encoding`, or `model` in the model
    /// table; one whose `tokenizer_config.json` has a `chat_template`),
    /// special tokens and all: `token_count` is the prompt's. In a start,
    /// the prompt ends with the new question and the template's
    /// generation prompt, ready for a completion endpoint. Whole turns
    /// only, as always. No such tokenizer: 422 `validation_failed`; a
    /// template that raises on the conversation: 422 `template_error`
    /// (nothing is written).
    #[serde(
        default,
        deserialize_with = "super::extract::flag",
        skip_serializing_if = "Option::is_none"
    )]
    pub chat_template: Option<bool>,
    /// With `chat_template=true`: also return the rendered prompt
    /// (`prompt`).
    #[serde(
        default,
        deserialize_with = "super::extract::flag",
        skip_serializing_if = "Option::is_none"
    )]
    pub prompt: Option<bool>,
    /// With `chat_template=true`: a system message the prompt begins with
    /// (at most 64 KiB in a start's body; 4,096 characters in a query
    /// string, which an HTTP server holds to 64 KiB), counted in
    /// `max_tokens`. A summary joins it, after a blank line, in the one
    /// system message.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[param(max_length = 4096)]
    pub system: Option<String>,
    /// `sliding` (default): the newest turns that fit. `stable`: of those,
    /// the ones from a stride boundary on (seqs 1, 1 + `stride`, 1 + 2 ×
    /// `stride`, …), so that consecutive reads of a growing conversation
    /// begin with the same turns (and a provider's prompt cache serves
    /// them) until the budget passes the boundary: about one read in
    /// `stride` begins elsewhere, and a window holds at most `stride` − 1
    /// turns fewer than a sliding one. Only when the budget leaves turns
    /// out; the summary and the `keep_first` turn stay in front.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window: Option<WindowKind>,
    /// With `window=stable`: turns per block (default 10). Choose it well
    /// below the turns the budget holds: a window of fewer turns than a
    /// stride slides.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 10000)]
    #[param(minimum = 1, maximum = 10000)]
    pub stride: Option<u32>,
    /// With `format=anthropic`: mark the prompt-cache breakpoints
    /// (`cache_control: {"type": "ephemeral"}`) on the summary's block in
    /// `system` and on the last block of the last message: two of the
    /// four a request may hold.
    #[serde(
        default,
        deserialize_with = "super::extract::flag",
        skip_serializing_if = "Option::is_none"
    )]
    pub cache_control: Option<bool>,
}

/// A stable window's stride when none is given.
pub const DEFAULT_STRIDE: u32 = 10;

/// The most a `system` message may hold, in bytes.
pub const MAX_SYSTEM_BYTES: usize = 64 * 1024;
/// The most a `system` message may hold in a query string, in characters
/// (percent-encoded, 4-byte characters take 12 bytes of a URI, which the
/// HTTP server refuses beyond 64 KiB with a 414).
pub const MAX_QUERY_SYSTEM_CHARS: usize = 4096;

/// The language of a rendering: `en` for the English copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Language {
    En,
}

impl HistoryParams {
    /// Validates against the contract and fills in the server defaults;
    /// invalid fields are named with the prefix `at` (`history.` in a start).
    pub fn resolve(&self, settings: &Settings, at: &str) -> Valid<Options> {
        let field = |name: &str| format!("{at}{name}");
        let limit = self.limit.unwrap_or(settings.history_limit);
        let max_tokens = self.max_tokens.unwrap_or(settings.history_max_tokens);
        let model = self.model.as_deref().unwrap_or_default();
        let chat = self.chat_template == Some(true);
        (
            rule(
                &field("limit"),
                limit <= MAX_LIMIT,
                format!("must be at most {MAX_LIMIT}"),
            ),
            rule(
                &field("max_tokens"),
                max_tokens <= MAX_TOKENS,
                format!("must be at most {MAX_TOKENS}"),
            ),
            rule(
                &field("model"),
                model.chars().count() <= MAX_MODEL_CHARS,
                format!("must be at most {MAX_MODEL_CHARS} characters"),
            ),
            self.format_rules(at),
            chars(&field("max_query_chars"), self.max_query_chars),
            chars(&field("max_answer_chars"), self.max_answer_chars),
            rule(
                &field("after_seq"),
                self.after_seq.unwrap_or(0) <= MAX_SEQ,
                format!("must be at most {MAX_SEQ}"),
            ),
            rule(
                &field("through_seq"),
                self.through_seq.unwrap_or(0) <= MAX_SEQ,
                format!("must be at most {MAX_SEQ}"),
            ),
        )
            .collect()?;
        // What counts, when named, comes with the names (`named`).
        let encoding = settings.encoding;
        Ok(Options {
            limit: limit as usize,
            max_tokens,
            max_bytes: settings.max_history_bytes,
            format: match self.format {
                None if chat => Format::Messages,
                format => format.unwrap_or_default(),
            },
            encoding,
            max_query_chars: self.max_query_chars.map(|n| n as usize),
            max_answer_chars: self.max_answer_chars.map(|n| n as usize),
            keep_first: self.keep_first.unwrap_or(false),
            after_seq: self.after_seq.unwrap_or(0),
            through_seq: self.through_seq.unwrap_or(u64::MAX),
            english: self.lang == Some(Language::En),
            summary: self.summary.unwrap_or(false),
            template: None,
            window: match self.window {
                Some(WindowKind::Stable) => Window::Stable {
                    stride: u64::from(self.stride.unwrap_or(DEFAULT_STRIDE)),
                },
                _ => Window::Sliding,
            },
        })
    }

    /// The rules of `format`, `template` and the `chat_template` fields.
    fn format_rules(&self, at: &str) -> Valid<()> {
        let field = |name: &str| format!("{at}{name}");
        let chat = self.chat_template == Some(true);
        (
            rule(
                &field("format"),
                self.template.is_none() || self.format.is_none_or(|f| f == Format::Text),
                "must be text with a template",
            ),
            rule(
                &field("format"),
                !chat || self.format.is_none_or(|f| f == Format::Messages),
                "must be messages with chat_template",
            ),
            rule(
                &field("chat_template"),
                !chat || self.template.is_none(),
                "cannot be used with template",
            ),
            rule(
                &field("prompt"),
                chat || self.prompt != Some(true),
                "needs chat_template=true",
            ),
            rule(
                &field("system"),
                chat || self.system.is_none(),
                "needs chat_template=true",
            ),
            rule(
                &field("system"),
                self.system
                    .as_ref()
                    .is_none_or(|s| s.len() <= MAX_SYSTEM_BYTES),
                format!("must be at most {MAX_SYSTEM_BYTES} bytes"),
            ),
            self.window_rules(at),
        )
            .collect()
            .map(|_| ())
    }

    /// The rules of `stride` and `cache_control`.
    fn window_rules(&self, at: &str) -> Valid<()> {
        let field = |name: &str| format!("{at}{name}");
        (
            rule(
                &field("stride"),
                self.stride.is_none() || self.window == Some(WindowKind::Stable),
                "needs window=stable",
            ),
            rule(
                &field("stride"),
                self.stride.is_none_or(|n| (1..=MAX_LIMIT).contains(&n)),
                format!("must be between 1 and {MAX_LIMIT}"),
            ),
            rule(
                &field("cache_control"),
                self.cache_control != Some(true) || self.format == Some(Format::Anthropic),
                "needs format=anthropic (other formats say where to mark in breakpoint)",
            ),
        )
            .collect()
            .map(|_| ())
    }

    /// The options `resolve` made, with what they name: the template (404
    /// `template_not_found` when the server has none of that name), the
    /// encoding (a built-in one or a loaded tokenizer) or the model's (see
    /// `tokens::Models`: 422 `unknown_model` when the server refuses a
    /// model it does not know). Invalid fields are named after `at`.
    pub fn named(
        &self,
        mut options: Options,
        app: &AppState,
        at: &str,
    ) -> Result<Reading, ApiError> {
        let mut counting = Counting::Builtin(options.encoding);
        if let Some(name) = &self.encoding {
            counting = app
                .tokenizers
                .counting(name)
                .map_err(|e| ApiError::field(format!("{at}encoding"), e))?;
        } else if let Some(model) = &self.model {
            match app.models.resolve(model) {
                Resolved::Known(known) => counting = known,
                Resolved::Unknown => app.metrics.unknown_model(false),
                Resolved::Refused => {
                    app.metrics.unknown_model(true);
                    return Err(ApiError::UnknownModel(model.clone()));
                }
            }
        }
        if let Some(name) = &self.template {
            if matches!(counting, Counting::Loaded(_)) {
                return Err(ApiError::field(
                    format!("{at}template"),
                    "a template does not count in a loaded tokenizer yet: read with format text, messages or turns",
                ));
            }
            options.template = Some(
                app.templates
                    .get(name)
                    .cloned()
                    .ok_or(ProblemCode::TemplateNotFound)?,
            );
        }
        let chat = match (self.chat_template, &counting) {
            (Some(true), Counting::Loaded(t)) if t.chat_template().is_some() => Some(Chat {
                system: self.system.clone(),
                prompt: self.prompt == Some(true),
                question: None,
                at: at.to_owned(),
            }),
            (Some(true), _) => {
                let with: Vec<&str> = app
                    .tokenizers
                    .all()
                    .filter(|t| t.chat_template().is_some())
                    .map(|t| t.name())
                    .collect();
                let has = match with.is_empty() {
                    true => "none of this server's tokenizers has one".to_owned(),
                    false => format!("this server's: {}", with.join(", ")),
                };
                return Err(ApiError::field(
                    format!("{at}chat_template"),
                    format!(
                        "needs a tokenizer with a chat template, named by encoding or model ({has})"
                    ),
                ));
            }
            _ => None,
        };
        let mut reading = Reading::new(options, counting).with_chat(chat);
        reading.cache_control = self.cache_control == Some(true);
        Ok(reading)
    }
}

/// A truncation length: 1 to `MAX_CHARS`, when given.
fn chars(name: &str, value: Option<u32>) -> Valid<()> {
    rule(
        name,
        value.is_none_or(|n| (1..=MAX_CHARS).contains(&n)),
        format!("must be between 1 and {MAX_CHARS}"),
    )
}

/// A finalized turn.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({
    "turn_id": "0193a6f4-5c2e-7b1a-9a41-2f6d8e0c4b7a",
    "seq": 1,
    "user_query": "What is a vector index?",
    "final_answer": "An index that finds the stored vectors nearest to a query vector.",
    "started_at": "2026-11-25T10:15:30.123Z",
    "finalized_at": "2026-11-25T10:15:32.456Z",
    "truncated": false
}))]
pub struct Turn {
    #[schema(value_type = TurnId)]
    pub turn_id: String,
    /// 1, 2, 3 … per session, in start order.
    #[schema(minimum = 1)]
    pub seq: u64,
    pub user_query: String,
    pub final_answer: String,
    #[schema(format = DateTime)]
    pub started_at: String,
    #[schema(format = DateTime)]
    pub finalized_at: String,
    /// A content was cut by `max_query_chars`/`max_answer_chars` (the
    /// stored turn is whole).
    pub truncated: bool,
    /// The English copy of the question, when the turn has one (in a
    /// `lang=en` history, `user_query` holds it too: the text rendered).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub user_query_en: Option<String>,
    /// The English copy of the answer, likewise.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub final_answer_en: Option<String>,
}

impl From<TurnView> for Turn {
    fn from(t: TurnView) -> Self {
        Turn {
            turn_id: t.turn_id.to_string(),
            seq: t.seq,
            user_query: t.user_query,
            final_answer: t.final_answer,
            started_at: rfc3339(t.started_at),
            finalized_at: rfc3339(t.finalized_at),
            truncated: false,
            user_query_en: t.user_query_en,
            final_answer_en: t.final_answer_en,
        }
    }
}

impl From<SelectedTurn> for Turn {
    fn from(t: SelectedTurn) -> Self {
        Turn {
            truncated: t.truncated,
            ..Turn::from(t.turn)
        }
    }
}

/// A session's rolling summary.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({
    "summary": "Alice is choosing a vector index for 2M documents; HNSW was recommended over IVF for recall.",
    "through_seq": 12,
    "token_count": 22,
    "updated_at": "2026-11-25T10:20:41.210Z"
}))]
pub struct Summary {
    pub summary: String,
    /// It covers every turn with `seq` up to this.
    #[schema(minimum = 1)]
    pub through_seq: u64,
    /// Its tokens alone, in the encoding of the response it is in (the
    /// server's for `GET .../summary`).
    pub token_count: u32,
    #[schema(format = DateTime)]
    pub updated_at: String,
}

impl Summary {
    /// As counted by `counting` (the stored count when it is in that one).
    pub fn of(s: &StoredSummary, counting: &Counting) -> Self {
        Summary {
            summary: s.text.clone(),
            through_seq: s.through_seq,
            token_count: match counting {
                Counting::Builtin(e) if *e == s.tokens.encoding => s.tokens.text,
                other => other.count(&s.text),
            },
            updated_at: rfc3339(s.updated_at),
        }
    }
}

/// The finalized turns a history neither returns nor covers with its
/// summary, below the oldest pending turn: what a client folds into the
/// next summary (read them with `after_seq`/`through_seq`).
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({"after_seq": 12, "through_seq": 15, "turns": 3, "tokens": 412}))]
pub struct UnsummarizedOut {
    /// What the summary covers (0: there is none); the turns are above.
    pub after_seq: u64,
    /// The newest of them.
    pub through_seq: u64,
    pub turns: u64,
    /// The tokens of their blocks as the `text` rendering would render them
    /// (without the header), in the response's encoding and language;
    /// `null` when they are not summed from stored counts (another
    /// encoding than the server's, or more than 256 finalized turns waiting
    /// behind a pending turn) and their texts hold more than 4 bytes a
    /// token of the read's `max_tokens` (or its byte cap).
    #[schema(required = true)]
    pub tokens: Option<u32>,
}

impl From<Unsummarized> for UnsummarizedOut {
    fn from(u: Unsummarized) -> Self {
        UnsummarizedOut {
            after_seq: u.after_seq,
            through_seq: u.through_seq,
            turns: u.turns,
            tokens: u.tokens,
        }
    }
}

/// The history, budgeted and rendered in one format.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({
    "session_id": "chat-42",
    "user_id": "alice",
    "format": "text",
    "encoding": "o200k_base",
    "token_count": 27,
    "total_turns": 1,
    "included_turns": 1,
    "omitted_turns": 0,
    "pending_turns": 0,
    "stopped_by": null,
    "rendered": "### Conversation history:\nUser: What is a vector index?\nAssistant: An index that finds the stored vectors nearest to a query vector.",
    "unsummarized": null,
    "generation": "019abf1c-5e2a-7c3d-9a41-6b2f0e8d4c17"
}))]
pub struct HistoryResponse {
    #[schema(value_type = SessionId)]
    pub session_id: String,
    /// The session's owner; `null` when it has none.
    #[schema(value_type = Option<UserId>, required = true)]
    pub user_id: Option<String>,
    pub format: Format,
    /// The encoding `token_count` is counted in (a built-in one, or a
    /// tokenizer the server loaded).
    #[schema(value_type = Encoding)]
    pub encoding: Cow<'static, str>,
    /// Exact count of what is returned; never more than `max_tokens`.
    pub token_count: u32,
    /// Finalized turns the session holds (in the `after_seq`/`through_seq`
    /// range, when given).
    pub total_turns: u64,
    pub included_turns: u64,
    pub omitted_turns: u64,
    /// Started turns not finalized yet (not in the history).
    pub pending_turns: u64,
    /// The bound that left turns out (the first of `limit`, `max_tokens`,
    /// `max_bytes` when several stop at the same turn), or `null` when
    /// every candidate turn is included.
    #[schema(required = true)]
    pub stopped_by: Option<StoppedBy>,
    /// `format=text`: the rendering (`""` for an empty history).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub rendered: Option<String>,
    /// `format=messages`: a user and an assistant message per turn, oldest
    /// first.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub messages: Option<Vec<Message>>,
    /// `chat_template=true` with `prompt=true`: the prompt the chat
    /// template rendered (what `token_count` counts), to send to a
    /// completion endpoint as it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub prompt: Option<String>,
    /// `format=anthropic`: the `system` and `messages` of a Messages API
    /// request (add your question as the last user message).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub anthropic: Option<AnthropicHistory>,
    /// `format=turns`: the included turns, oldest first.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub turns: Option<Vec<Turn>>,
    /// `format=turns` with `summary=true`: the summary the history begins
    /// with (absent when there is none, or it did not fit).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub summary: Option<Summary>,
    /// The finalized turns neither returned nor covered by the summary, or
    /// `null` when there are none.
    #[schema(required = true)]
    pub unsummarized: Option<UnsummarizedOut>,
    /// The session's generation (see the Session object), `null` for an
    /// unknown session: a summary folded from this history is written with
    /// it as `expected_generation`, so that it cannot land on a session
    /// cleared and started again meanwhile.
    #[schema(required = true)]
    pub generation: Option<String>,
    /// `window=stable`: where the window begins, and what it left out.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub window: Option<WindowOut>,
    /// With `window=stable` or `cache_control=true`: where the part of
    /// the history that the next read begins with ends (`null` for an
    /// empty history).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub breakpoint: Option<Option<Breakpoint>>,
}

/// A stable window (`window=stable`).
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({"stride": 10, "from_seq": 21, "left_out": 3}))]
pub struct WindowOut {
    pub stride: u64,
    /// The oldest turn returned after the `keep_first` turn: a read of
    /// the same conversation begins with the same turns as long as this
    /// stays (`null` when none is returned).
    #[schema(required = true)]
    pub from_seq: Option<u64>,
    /// Turns that fit the budget but the window leaves out (a sliding
    /// window would return them): at most `stride` − 1.
    pub left_out: u64,
}

/// The end of the stable part of a history: everything returned, which
/// a read of the conversation grown by more turns begins with as long as
/// its window's `from_seq` (and the summary) stay. A prompt cache's
/// breakpoint goes there.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({"seq": 27, "messages": 14}))]
pub struct Breakpoint {
    /// The newest turn in it (`null` when only a summary is returned).
    #[schema(required = true)]
    pub seq: Option<u64>,
    /// `text` and templates: the bytes of `rendered` it takes.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub bytes: Option<u64>,
    /// `messages`, `anthropic` and `chat_template`: the messages it takes
    /// (a system message among them; for `anthropic`, of `messages`).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub messages: Option<u64>,
}

impl HistoryResponse {
    pub fn build(session_id: &str, stored: StoredHistory, reading: &Reading) -> Self {
        let opts = &reading.options;
        let selection = stored.selection;
        let included_turns = selection.turns.len() as u64;
        let mut out = HistoryResponse {
            session_id: session_id.to_owned(),
            user_id: stored.user_id,
            format: opts.format,
            encoding: reading.counting.name(),
            token_count: selection.token_count,
            total_turns: stored.total_turns,
            included_turns,
            omitted_turns: stored.total_turns.saturating_sub(included_turns),
            pending_turns: stored.pending_turns,
            stopped_by: selection.stopped_by,
            rendered: None,
            messages: None,
            prompt: None,
            turns: None,
            summary: None,
            unsummarized: stored.unsummarized.map(UnsummarizedOut::from),
            generation: stored.generation,
            anthropic: None,
            window: None,
            breakpoint: None,
        };
        if let Window::Stable { stride } = reading.window {
            let first = usize::from(opts.keep_first && !selection.turns.is_empty());
            out.window = Some(WindowOut {
                stride,
                from_seq: selection.turns.get(first).map(|t| t.turn.seq),
                left_out: selection.left_out as u64,
            });
        }
        let newest = selection.turns.last().map(|t| t.turn.seq);
        let summary = stored.summary.as_ref().map(|s| s.text.as_str());
        if let Some(chat) = &reading.chat {
            let system = chat.system.as_deref();
            out.messages = Some(chat_messages(system, summary, selection.turns));
            out.prompt = stored.rendered;
        } else if let Some(rendered) = stored.rendered {
            // A template's rendering (its format is `text`).
            out.rendered = Some(rendered);
        } else {
            match opts.format.render(summary, selection.turns) {
                Rendering::Text(text) => out.rendered = Some(text),
                Rendering::Messages(messages) => out.messages = Some(messages),
                Rendering::Turns(turns) => {
                    out.turns = Some(turns.into_iter().map(Turn::from).collect());
                    out.summary = stored
                        .summary
                        .as_ref()
                        .map(|s| Summary::of(s, &reading.counting));
                }
                Rendering::Anthropic(mut history) => {
                    if reading.cache_control {
                        history.mark_breakpoints();
                    }
                    out.anthropic = Some(history);
                }
            }
        }
        if reading.window.is_stable() || reading.cache_control {
            out.breakpoint = Some(out.breakpoint_at(newest, summary.is_some()));
        }
        out
    }

    /// The end of what it returns, as its rendering measures it.
    fn breakpoint_at(&self, seq: Option<u64>, summary: bool) -> Option<Breakpoint> {
        if seq.is_none() && !summary {
            return None;
        }
        let messages = match (&self.messages, &self.anthropic) {
            (Some(m), _) => Some(m.len() as u64),
            (None, Some(a)) => Some(a.messages.len() as u64),
            (None, None) => None,
        };
        Some(Breakpoint {
            seq,
            bytes: self.rendered.as_ref().map(|r| r.len() as u64),
            messages,
        })
    }

    /// The `text` rendering alone, its count and encoding in headers.
    fn into_plain_text(self) -> Response {
        let mut res = self.rendered.unwrap_or_default().into_response();
        let h = res.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        h.insert("x-token-count", HeaderValue::from(self.token_count));
        if let Ok(encoding) = HeaderValue::from_str(&self.encoding) {
            h.insert("x-encoding", encoding);
        }
        res
    }
}

/// A get_history request, validated.
struct HistoryRead {
    session: SessionId,
    reading: Reading,
}

impl HistoryRead {
    fn parse(
        path: &SessionPath,
        params: &HistoryParams,
        body: Body,
        app: &AppState,
    ) -> Result<Self, ApiError> {
        let settings = &app.settings;
        let (session, options, (), _) = (
            path.session_id(),
            params.resolve(settings, ""),
            rule(
                "format",
                body == Body::Json || params.format.is_none_or(|f| f == Format::Text),
                "must be text with Accept: text/plain",
            ),
            (
                rule(
                    "chat_template",
                    body == Body::Json || params.chat_template != Some(true),
                    "returns JSON (messages, prompt): read with Accept: application/json",
                ),
                rule(
                    "system",
                    params
                        .system
                        .as_ref()
                        .is_none_or(|s| s.chars().count() <= MAX_QUERY_SYSTEM_CHARS),
                    format!(
                        "must be at most {MAX_QUERY_SYSTEM_CHARS} characters in a query string (send a longer one in a start's body)"
                    ),
                ),
            )
                .collect(),
        )
            .all()?;
        let reading = params.named(options, app, "")?;
        Ok(HistoryRead { session, reading })
    }
}

/// Get the history
///
/// The most recent finalized turns, budgeted to `max_tokens` (exact tiktoken
/// counts) and rendered in one format. With `Accept: text/plain`, the body is
/// the `text` rendering alone. An unknown session has an empty history.
#[utoipa::path(
    get,
    path = "/v1/sessions/{session_id}/history",
    tag = "sessions",
    params(SessionPath, HistoryParams),
    responses(
        (status = 200, description = "The history (JSON), or with `Accept: text/plain` its `text` rendering alone",
         content(
             (HistoryResponse = "application/json"),
             (String = "text/plain", example = json!("### Conversation history:\nUser: What is a vector index?\nAssistant: An index that finds the stored vectors nearest to a query vector.")),
         ),
         headers(
             ("x-token-count" = u32, description = "With text/plain: the exact token count"),
             ("x-encoding" = Encoding, description = "With text/plain: the encoding counted in"),
         )),
    ),
    security((), ("bearer" = []))
)]
pub async fn get_history(
    State(app): State<AppState>,
    path: SessionPath,
    QueryParams(params): QueryParams<HistoryParams>,
    body: Body,
) -> Result<Response, ApiError> {
    let read = HistoryRead::parse(&path, &params, body, &app)?;
    let reading = &read.reading;
    reading.options.encoding.ready().await;
    let mut stored = app
        .store
        .history(&read.session, &reading.options, now_millis())
        .await?;
    if reading.counts_in_store() {
        unsummarized_tokens(&*app.store, &read.session, &mut stored, &reading.options).await?;
    } else {
        stored = reading.cut_apart(stored).await?;
    }
    let out = HistoryResponse::build(read.session.as_str(), stored, reading);
    Ok(match body {
        Body::Json => Json(out).into_response(),
        Body::PlainText => out.into_plain_text(),
    })
}
