//! Import: a chat transcript made elsewhere becomes finalized turns, all or
//! nothing.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use utoipa::ToSchema;

use super::AppState;
use super::error::{ApiError, FieldError};
use super::extract::{JsonBody, NoQuery};
use super::sessions::SessionPath;
use super::turns::{IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};
use super::valid::{AllValid, given_user_id, optional};
use crate::config::Settings;
use crate::domain::{FinalAnswer, TextError, TurnId, UserQuery};
use crate::domain::{IdempotencyKey, SessionId, UserId};
use crate::store::counting::in_slices;
use crate::store::{Import, ImportedTurn};
use crate::tokens::{AnswerTokens, QueryTokens};
use crate::turn::now_millis;

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
    /// Oldest first: each user message followed by its assistant message
    /// becomes one turn. At most `TURNSTORE_MAX_TURNS` pairs.
    #[schema(min_items = 2)]
    pub messages: Vec<ImportMessage>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ImportMessage {
    /// `user` or `assistant`; other roles (`system`, `tool`) are refused.
    #[schema(value_type = TranscriptRole)]
    pub role: String,
    /// Not empty; at most `TURNSTORE_MAX_QUERY_BYTES` (a question) or
    /// `TURNSTORE_MAX_ANSWER_BYTES` (an answer) bytes of UTF-8 (413).
    #[schema(min_length = 1)]
    pub content: String,
}

/// The roles a transcript's messages may have. (Read as any string, so
/// that every wrong one is named by its index.)
#[derive(Debug, ToSchema)]
#[serde(rename_all = "lowercase")]
#[allow(dead_code)]
pub enum TranscriptRole {
    User,
    Assistant,
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
}

/// An import, validated.
struct Valid {
    session: SessionId,
    user: Option<UserId>,
    pairs: Pairs,
    idempotency: Option<(IdempotencyKey, String)>,
}

impl Valid {
    fn parse(
        path: &SessionPath,
        headers: &HeaderMap,
        body: ImportRequest,
        settings: &Settings,
    ) -> Result<Self, ApiError> {
        let body = ImportRequest {
            user_id: given_user_id(body.user_id),
            ..body
        };
        let hash = request_hash(&body);
        let pairs = pairs(&body.messages, settings)?;
        let key = headers.get(IDEMPOTENCY_KEY).map(|v| {
            v.to_str()
                .map_err(|_| "must be visible ASCII")
                .and_then(IdempotencyKey::parse)
        });
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
            idempotency: key.map(|k| (k, hash)),
        })
    }
}

/// A transcript's turns: a question and its answer each.
type Pairs = Vec<(UserQuery, FinalAnswer)>;

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
                "must be user or assistant (other roles are not imported)",
            );
        }
        let content = |e: TextError| match e {
            TextError::TooLarge { .. } => Err(ApiError::PayloadTooLarge(format!(
                "messages[{i}].content {e}"
            ))),
            TextError::Empty => Ok(()),
        };
        if i % 2 == 0 {
            match UserQuery::parse(m.content.clone(), settings.max_query_bytes) {
                Ok(q) => query = Some(q),
                Err(e) => {
                    content(e)?;
                    fail(
                        format!("messages[{i}].content"),
                        "must not be empty or whitespace only",
                    );
                    query = None;
                }
            }
        } else {
            match FinalAnswer::parse(m.content.clone(), settings.max_answer_bytes) {
                Ok(a) => {
                    if let Some(q) = query.take() {
                        pairs.push((q, a));
                    }
                }
                Err(e) => {
                    content(e)?;
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
    if errors.len() > MAX_REPORTED {
        let more = errors.len() - MAX_REPORTED;
        errors.truncate(MAX_REPORTED);
        errors.push(FieldError {
            field: "messages".into(),
            message: format!("and {more} more invalid fields"),
        });
    }
    Ok(Err(errors))
}

/// What "the same body" means for a replay: the parsed request (`""`
/// made absent first, as `null` and no `user_id` are).
fn request_hash(body: &ImportRequest) -> String {
    let canonical = serde_json::to_vec(body).unwrap_or_default();
    Sha256::digest(&canonical)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Import a transcript
///
/// Appends a chat transcript made elsewhere as finalized turns: each user
/// message and the assistant message after it become one turn, with the
/// next seqs. All or nothing: any invalid message (named by its index) and
/// nothing is written. Retry-safe with an `Idempotency-Key`.
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
    let v = Valid::parse(&path, &headers, body, &app.settings)?;
    let encoding = app.settings.encoding;
    // Counted a slice at a time: a request that times out stops counting.
    let turns = in_slices(
        v.pairs,
        |(q, a)| q.as_str().len() + a.as_str().len(),
        move |(q, a)| ImportedTurn {
            turn_id: TurnId::generate(),
            query_tokens: QueryTokens::count(encoding, q.as_str()),
            answer_tokens: AnswerTokens::count(encoding, a.as_str()),
            user_query: q.into_string(),
            final_answer: a.into_string(),
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
            now: now_millis(),
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
    };
    Ok(if imported.replayed {
        let mut res = (StatusCode::OK, Json(body)).into_response();
        res.headers_mut()
            .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
        res
    } else {
        (StatusCode::CREATED, Json(body)).into_response()
    })
}
