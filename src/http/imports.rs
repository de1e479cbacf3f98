//! Import: a chat transcript made elsewhere becomes finalized turns, all or
//! nothing: strict user/assistant pairs, or (`mode: "distill"`) an agent
//! loop's messages distilled to their questions and final answers.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::AppState;
use super::error::{ApiError, FieldError};
use super::extract::{JsonBody, NoQuery, from_value_at};
use super::idempotency::{created, request_hash};
use super::sessions::SessionPath;
use super::valid::{AllValid, given_user_id, optional};
use crate::config::Settings;
use crate::domain::distill::{Dropped, distill};
use crate::domain::{FinalAnswer, TextError, TurnId, UserQuery};
use crate::domain::{IdempotencyKey, SessionId, UserId};
use crate::store::counting::in_slices;
use crate::store::{Import, ImportedTurn};
use crate::tokens::{AnswerTokens, QueryTokens};
use crate::turn::{Millis, now_millis};

/// The most field errors an import reports; the rest are counted.
const MAX_REPORTED: usize = 100;

/// A transcript to append to the session.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({
    "user_id": "alice",
    "messages": [
        {"role": "user", "content": "What is a vector index?"},
        {"role": "assistant", "content": "An index that finds the stored vectors nearest to a query vector."},
        {"role": "user", "content": "Which one should I use?"},
        {"role": "assistant", "content": "HNSW, for high recall at low latency."}
    ]
}))]
pub struct ImportRequest {
    /// The session's owner, as in a start: the first claims it, another is
    /// a 403. `""` counts as absent.
    pub user_id: Option<String>,
    /// How the messages are read: `strict` (the default) or `distill`.
    #[serde(default)]
    pub mode: ImportMode,
    /// Oldest first. `strict`: each user message followed by its
    /// assistant message becomes one turn (`{role, content}` with a string
    /// content and nothing else). `distill`: OpenAI or Anthropic messages as
    /// an agent loop writes them, each exchange distilled to one turn. At
    /// most `TURNSTORE_MAX_TURNS` turns.
    #[schema(value_type = Vec<TranscriptMessage>, min_items = 2)]
    pub messages: Vec<Value>,
}

/// How an import reads its messages.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ImportMode {
    /// User and assistant messages in pairs, with string contents; any
    /// other message is refused.
    #[default]
    Strict,
    /// Any transcript an OpenAI or Anthropic agent loop writes: system,
    /// developer, tool and thinking content, tool calls, refusals and parts
    /// that are not text are dropped (and counted); consecutive user
    /// messages make one question; the last assistant text before the
    /// next question is the answer; a last question without an answer is
    /// not imported.
    Distill,
}

/// A message of a transcript. (`strict` reads `role` and a string
/// `content` only; `distill` reads these fields and ignores others.)
#[derive(Debug, ToSchema)]
#[allow(dead_code)]
pub struct TranscriptMessage {
    /// `strict`: `user` or `assistant`. `distill`: also `system`,
    /// `developer`, `tool`, `function` (dropped) and `orchestrator` (an
    /// assistant).
    pub role: String,
    /// A string, or (`distill`) an array of parts, or null (an assistant
    /// message that only calls tools). `strict`: not empty; at most
    /// `TURNSTORE_MAX_QUERY_BYTES` (a question) or
    /// `TURNSTORE_MAX_ANSWER_BYTES` (an answer) bytes of UTF-8 (413).
    pub content: Option<TranscriptContent>,
    /// `distill`: when the message was written (RFC 3339 with its zone).
    /// A turn's `started_at` is its first question's, its `finalized_at`
    /// its answer's. Given for one question or answer, needed for all; in
    /// order, and not later than now.
    #[schema(format = DateTime)]
    pub timestamp: Option<String>,
}

/// A message's content: its text, or its parts.
#[derive(Debug, ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub enum TranscriptContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// A part of a message (`distill`): `text` parts (also `input_text`,
/// `output_text`) are kept; `image_url`, `image`, `tool_use`,
/// `tool_result`, `thinking`, `refusal` and any other are dropped.
#[derive(Debug, ToSchema)]
#[allow(dead_code)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    /// A text part's text.
    pub text: Option<String>,
}

/// A strict import's message.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ImportMessage {
    role: String,
    content: String,
}

#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({
    "session_id": "chat-42",
    "user_id": "alice",
    "imported_turns": 2,
    "first_seq": 1,
    "last_seq": 2
}))]
pub struct ImportResponse {
    #[schema(value_type = SessionId)]
    pub session_id: String,
    /// The session's owner; `null` when it has none.
    #[schema(value_type = Option<UserId>, required = true)]
    pub user_id: Option<String>,
    pub imported_turns: u64,
    /// The seqs the turns got, `first_seq` to `last_seq`.
    #[schema(minimum = 1)]
    pub first_seq: u64,
    #[schema(minimum = 1)]
    pub last_seq: u64,
    /// `distill` only: what the transcript held that was not imported, a
    /// reason at a time (none: `[]`).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub dropped: Option<Vec<DroppedReport>>,
}

/// Messages (or parts of them) a distilled import dropped for one reason.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(example = json!({"reason": "tool_call", "count": 2, "first_indexes": [3, 7]}))]
pub struct DroppedReport {
    #[schema(inline)]
    pub reason: Dropped,
    /// How many (a message with two image parts counts twice).
    pub count: u64,
    /// The indexes in `messages` of the first five.
    pub first_indexes: Vec<u64>,
}

/// An import, validated.
struct Valid {
    session: SessionId,
    user: Option<UserId>,
    pairs: Pairs,
    dropped: Option<Vec<DroppedReport>>,
    idempotency: Option<(IdempotencyKey, String)>,
}

impl Valid {
    fn parse(
        path: &SessionPath,
        headers: &HeaderMap,
        body: ImportRequest,
        settings: &Settings,
        now: Millis,
    ) -> Result<Self, ApiError> {
        let body = ImportRequest {
            user_id: given_user_id(body.user_id),
            ..body
        };
        let (hash, pairs, dropped) = match body.mode {
            ImportMode::Strict => {
                let messages: Vec<ImportMessage> =
                    from_value_at("messages", Value::Array(body.messages))?;
                let hash = request_hash(&StrictRequest {
                    user_id: &body.user_id,
                    messages: &messages,
                });
                (hash, pairs(&messages, settings)?, None)
            }
            ImportMode::Distill => {
                let hash = request_hash(&body);
                match distilled(&body.messages, settings, now)? {
                    Ok((pairs, dropped)) => (hash, Ok(pairs), Some(dropped)),
                    Err(e) => (hash, Err(e), None),
                }
            }
        };
        let key = super::idempotency::key(headers);
        let (session, user, key, pairs) = (
            path.session_id(),
            optional("user_id", body.user_id.as_deref().map(UserId::parse)),
            optional("Idempotency-Key", key),
            pairs,
        )
            .all()?;
        Ok(Valid {
            session,
            user,
            pairs,
            dropped,
            idempotency: key.map(|k| (k, hash)),
        })
    }
}

/// A turn of a transcript: its question, its answer and, when the
/// transcript gave them, when each was written.
struct Pair {
    query: UserQuery,
    answer: FinalAnswer,
    times: Option<(Millis, Millis)>,
}

type Pairs = Vec<Pair>;

/// Field errors as a 422 reports them: the first `MAX_REPORTED`, then how
/// many more.
fn reported(mut errors: Vec<FieldError>) -> Vec<FieldError> {
    if errors.len() > MAX_REPORTED {
        let more = errors.len() - MAX_REPORTED;
        errors.truncate(MAX_REPORTED);
        errors.push(FieldError {
            field: "messages".into(),
            message: format!("and {more} more invalid fields"),
        });
    }
    errors
}

/// A text too large is a 413 at once, naming the message it came from.
fn too_large(i: usize, e: TextError) -> Result<(), ApiError> {
    match e {
        TextError::TooLarge { .. } => Err(ApiError::PayloadTooLarge(format!(
            "messages[{i}].content {e}"
        ))),
        TextError::Empty => Ok(()),
    }
}

/// The turns of a transcript: user then assistant, again and again. Every
/// wrong message is named by its index (`messages[3].role`); a text too
/// large is a 413 at once.
fn pairs(
    messages: &[ImportMessage],
    settings: &Settings,
) -> Result<super::valid::Valid<Pairs>, ApiError> {
    let mut errors = Vec::new();
    let mut fail = |field: String, message: &str| {
        errors.push(FieldError {
            field,
            message: message.to_owned(),
        })
    };
    let max_turns = settings.max_turns as usize;
    if messages.is_empty() {
        fail(
            "messages".into(),
            "must hold a user message and its answer at least",
        );
    }
    if messages.len() > 2 * max_turns {
        fail(
            "messages".into(),
            &format!("at most {max_turns} turns ({} messages)", 2 * max_turns),
        );
    }
    let mut pairs = Vec::with_capacity(messages.len() / 2);
    let mut query = None;
    for (i, m) in messages.iter().enumerate() {
        let (expected, other) = if i % 2 == 0 {
            ("user", "assistant")
        } else {
            ("assistant", "user")
        };
        let role = m.role.as_str();
        if role == other {
            let why = if i % 2 == 0 {
                "must be user: an assistant message answers the user message before it"
            } else {
                "must be assistant: a user message is followed by its answer"
            };
            fail(format!("messages[{i}].role"), why);
        } else if role != expected {
            fail(
                format!("messages[{i}].role"),
                "must be user or assistant (other roles are not imported; `mode: distill` drops them)",
            );
        }
        if i % 2 == 0 {
            match UserQuery::parse(m.content.clone(), settings.max_query_bytes) {
                Ok(q) => query = Some(q),
                Err(e) => {
                    too_large(i, e)?;
                    fail(
                        format!("messages[{i}].content"),
                        "must not be empty or whitespace only",
                    );
                    query = None;
                }
            }
        } else {
            match FinalAnswer::parse(m.content.clone(), settings.max_answer_bytes) {
                Ok(answer) => {
                    if let Some(query) = query.take() {
                        pairs.push(Pair {
                            query,
                            answer,
                            times: None,
                        });
                    }
                }
                Err(e) => {
                    too_large(i, e)?;
                    fail(
                        format!("messages[{i}].content"),
                        "must not be empty or whitespace only",
                    );
                }
            }
        }
    }
    // An odd count ends on a user message's place: unpaired if it is one
    // (a wrong role there is told above).
    if messages.len() % 2 == 1 && messages.last().is_some_and(|m| m.role == "user") {
        let last = messages.len() - 1;
        fail(
            format!("messages[{last}]"),
            "a user message needs the assistant message after it",
        );
    }
    if errors.is_empty() {
        return Ok(Ok(pairs));
    }
    Ok(Err(reported(errors)))
}

/// The turns an agent loop's transcript distils to, and what it dropped.
/// A malformed message is named by its index; a question or answer too
/// large is a 413 naming its (first) message.
fn distilled(
    messages: &[Value],
    settings: &Settings,
    now: Millis,
) -> Result<super::valid::Valid<(Pairs, Vec<DroppedReport>)>, ApiError> {
    let d = match distill(messages, now) {
        Ok(d) => d,
        Err(malformed) => {
            let errors = malformed
                .into_iter()
                .map(|m| FieldError {
                    field: m.field,
                    message: m.message.to_owned(),
                })
                .collect();
            return Ok(Err(reported(errors)));
        }
    };
    let max_turns = settings.max_turns as usize;
    let problem = if d.exchanges.is_empty() {
        Some("holds no user question with an assistant answer after it".to_owned())
    } else if d.exchanges.len() > max_turns {
        Some(format!(
            "at most {max_turns} turns (it distils to {})",
            d.exchanges.len()
        ))
    } else {
        None
    };
    if let Some(message) = problem {
        return Ok(Err(vec![FieldError {
            field: "messages".into(),
            message,
        }]));
    }
    let mut pairs = Vec::with_capacity(d.exchanges.len());
    let mut errors = Vec::new();
    for e in d.exchanges {
        // Distilled texts are trimmed and never empty; one could still be
        // refused as empty by a stricter rule: said, not panicked on.
        let query = UserQuery::parse(e.question, settings.max_query_bytes);
        let answer = FinalAnswer::parse(e.answer, settings.max_answer_bytes);
        match (query, answer) {
            (Ok(query), Ok(answer)) => pairs.push(Pair {
                query,
                answer,
                times: e.times,
            }),
            (query, answer) => {
                for (at, r) in [(e.asked_at, query.err()), (e.answered_at, answer.err())] {
                    if let Some(err) = r {
                        too_large(at, err)?;
                        errors.push(FieldError {
                            field: format!("messages[{at}].content"),
                            message: "must hold text".into(),
                        });
                    }
                }
            }
        }
    }
    if !errors.is_empty() {
        return Ok(Err(reported(errors)));
    }
    let dropped = d
        .dropped
        .into_iter()
        .map(|(reason, (count, first))| DroppedReport {
            reason,
            count,
            first_indexes: first.into_iter().map(|i| i as u64).collect(),
        })
        .collect();
    Ok(Ok((pairs, dropped)))
}

/// A strict import as its replays are compared: parsed, so that the order
/// of a message's fields does not matter (`""` made absent first, as
/// `null` and no `user_id` are); a distilled import's messages are hashed
/// as they came.
#[derive(Serialize)]
struct StrictRequest<'a> {
    user_id: &'a Option<String>,
    messages: &'a [ImportMessage],
}

/// Import a transcript
///
/// Appends a chat transcript made elsewhere as finalized turns, with the
/// next seqs: each user message and the assistant message after it
/// (`strict`), or each exchange of an agent loop's messages, its
/// question and final answer (`mode: "distill"`; the response says what
/// was dropped). All or nothing: any invalid message (named by its index)
/// and nothing is written. Retry-safe with an `Idempotency-Key`.
#[utoipa::path(
    post,
    path = "/v1/sessions/{session_id}/import",
    tag = "import-export",
    params(
        SessionPath,
        ("Idempotency-Key" = Option<IdempotencyKey>, Header, nullable = false,
         description = "Makes a retried import return what the first made (200, `Idempotent-Replayed: true`); the same key with another body is a 422 `idempotency_key_reused`. The key lives as long as the session."),
    ),
    request_body = ImportRequest,
    responses(
        (status = 201, description = "Imported", body = ImportResponse),
        (status = 200, description = "Replay of an earlier import with the same Idempotency-Key and body", body = ImportResponse,
         headers(("Idempotent-Replayed" = String, description = "`true`"))),
    ),
)]
pub async fn import(
    State(app): State<AppState>,
    path: SessionPath,
    headers: HeaderMap,
    _: NoQuery,
    JsonBody(body): JsonBody<ImportRequest>,
) -> Result<Response, ApiError> {
    let now = now_millis();
    let v = Valid::parse(&path, &headers, body, &app.settings, now)?;
    let encoding = app.settings.encoding;
    // Counted a slice at a time: a request that times out stops counting.
    let turns = in_slices(
        v.pairs,
        |p| p.query.as_str().len() + p.answer.as_str().len(),
        move |p| ImportedTurn {
            turn_id: TurnId::generate(),
            query_tokens: QueryTokens::count(encoding, p.query.as_str()),
            answer_tokens: AnswerTokens::count(encoding, p.answer.as_str()),
            user_query: p.query.into_string(),
            final_answer: p.answer.into_string(),
            times: p.times,
        },
    )
    .await;
    let key = v.idempotency.as_ref();
    let imported = app
        .store
        .import(Import {
            session_id: &v.session,
            user_id: v.user.as_ref(),
            turns: &turns,
            idempotency: key.map(|(k, h)| (k, h.as_str())),
            now,
        })
        .await?;
    if let (Some(s), false) = (&app.summarizer, imported.replayed) {
        s.wrote(v.session.clone());
    }
    let body = ImportResponse {
        session_id: v.session.into_string(),
        user_id: imported.user_id,
        imported_turns: imported.last_seq + 1 - imported.first_seq,
        first_seq: imported.first_seq,
        last_seq: imported.last_seq,
        dropped: v.dropped,
    };
    Ok(created(body, imported.replayed))
}
