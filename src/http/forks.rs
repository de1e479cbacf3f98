//! Fork: a new session made of an existing one's turns up to a seq (a chat
//! UI's branch: editing question N is a fork through N − 1, then a start).

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::AppState;
use super::error::ApiError;
use super::extract::{JsonBody, NoQuery};
use super::idempotency::{created, request_hash};
use super::sessions::SessionPath;
use super::valid::{AllValid, field, given_user_id, optional, rule};
use crate::domain::{IdempotencyKey, SessionId, TurnId, UserId};
use crate::store::Fork;
use crate::turn::now_millis;

/// A fork of the session.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"new_session_id": "chat-42-b", "through_seq": 6, "user_id": "alice"}))]
pub struct ForkRequest {
    /// The new session's id; no live session may have it (409
    /// `session_exists`).
    #[schema(value_type = SessionId)]
    pub new_session_id: String,
    /// The newest seq the fork copies (its finalized turns up to it);
    /// absent: the newest finalized turn's. The next start in the fork
    /// takes the seq after it.
    #[schema(minimum = 1)]
    pub through_seq: Option<u64>,
    /// As in a start: another owner's session is a 403; the fork belongs
    /// to the session's owner, or, when it has none, to this user. `""`
    /// counts as absent.
    pub user_id: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({
    "session_id": "chat-42-b",
    "forked_from": "chat-42",
    "user_id": "alice",
    "through_seq": 6,
    "copied_turns": 6,
    "summary": true
}))]
pub struct ForkResponse {
    /// The new session.
    #[schema(value_type = SessionId)]
    pub session_id: String,
    #[schema(value_type = SessionId)]
    pub forked_from: String,
    /// The new session's owner; `null` when it has none.
    #[schema(value_type = Option<UserId>, required = true)]
    pub user_id: Option<String>,
    #[schema(minimum = 1)]
    pub through_seq: u64,
    /// The finalized turns copied (those the session kept up to
    /// `through_seq`; pending turns are not copied).
    pub copied_turns: u64,
    /// The session's summary came along (it covered no turn past
    /// `through_seq`).
    pub summary: bool,
}

/// Fork a session
///
/// Makes a new session of this one's finalized turns up to `through_seq`
/// (same seqs, texts, English copies and times), with its summary when
/// that covers no later turn, and its owner. A reader sees the new session
/// whole or not at all. Retry-safe with an `Idempotency-Key`, which also
/// lets a retry complete a fork that stopped half way.
#[utoipa::path(
    post,
    path = "/v1/sessions/{session_id}/fork",
    tag = "sessions",
    params(
        SessionPath,
        ("Idempotency-Key" = Option<IdempotencyKey>, Header, nullable = false,
         description = "Makes a retried fork return what the first made (200, `Idempotent-Replayed: true`), and complete one that stopped; the same key with another body is a 422 `idempotency_key_reused`. The key lives as long as the new session."),
    ),
    request_body = ForkRequest,
    responses(
        (status = 201, description = "Forked", body = ForkResponse),
        (status = 200, description = "Replay of an earlier fork with the same Idempotency-Key and body", body = ForkResponse,
         headers(("Idempotent-Replayed" = String, description = "`true`"))),
    ),
)]
pub async fn fork(
    State(app): State<AppState>,
    path: SessionPath,
    headers: HeaderMap,
    _: NoQuery,
    JsonBody(body): JsonBody<ForkRequest>,
) -> Result<Response, ApiError> {
    let body = ForkRequest {
        user_id: given_user_id(body.user_id),
        ..body
    };
    let hash = request_hash(&body);
    let key = super::idempotency::key(&headers);
    let source = path.session_id();
    let differs = match (&source, SessionId::parse(body.new_session_id.as_str())) {
        (Ok(s), Ok(t)) => s != &t,
        _ => true,
    };
    let (source, target, user, key, _, _) = (
        source,
        field(
            "new_session_id",
            SessionId::parse(body.new_session_id.as_str()),
        ),
        optional("user_id", body.user_id.as_deref().map(UserId::parse)),
        optional("Idempotency-Key", key),
        rule(
            "through_seq",
            body.through_seq.is_none_or(|t| t >= 1),
            "must be 1 or more",
        ),
        rule(
            "new_session_id",
            differs,
            "must differ from the session forked",
        ),
    )
        .all()?;
    let through = body.through_seq;
    let now = now_millis();
    let made = app
        .store
        .fork(Fork {
            source: &source,
            target: &target,
            through_seq: through,
            user_id: user.as_ref(),
            idempotency: key.as_ref().map(|k| (k, hash.as_str())),
            generation: TurnId::generate(),
            now,
        })
        .await?;
    if let (Some(s), false) = (&app.summarizer, made.replayed) {
        s.wrote(target.clone());
    }
    let body = ForkResponse {
        session_id: target.into_string(),
        forked_from: source.into_string(),
        user_id: made.user_id,
        through_seq: made.through_seq,
        copied_turns: made.turns,
        summary: made.summary,
    };
    Ok(created(body, made.replayed))
}
