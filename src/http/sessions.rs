//! get_session, clear_session, and the path parameters of session routes.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::AppState;
use super::error::{ApiError, ProblemCode};
use super::extract::{NoQuery, path_extractor};
use super::valid::{AllValid, Valid, field};
use crate::domain::{SessionId, TurnId, UserId};
use crate::turn::{now_millis, rfc3339};

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct SessionPath {
    #[param(value_type = SessionId)]
    session_id: String,
}
path_extractor!(SessionPath);

impl SessionPath {
    pub fn session_id(&self) -> Valid<SessionId> {
        field("session_id", SessionId::parse(self.session_id.as_str()))
    }
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct SessionTurnPath {
    #[param(value_type = SessionId)]
    session_id: String,
    /// The `turn_id` start_turn returned.
    #[param(value_type = TurnId)]
    turn_id: String,
}
path_extractor!(SessionTurnPath);

impl SessionTurnPath {
    pub fn ids(&self) -> (Valid<SessionId>, Valid<TurnId>) {
        (
            field("session_id", SessionId::parse(self.session_id.as_str())),
            field("turn_id", TurnId::parse(&self.turn_id)),
        )
    }
}

/// A session.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({
    "session_id": "chat-42",
    "user_id": "alice",
    "created_at": "2026-11-25T10:15:30.123Z",
    "last_active_at": "2026-11-25T10:17:02.481Z",
    "expires_at": "2026-12-02T10:17:02.481Z",
    "turn_count": 2,
    "pending_count": 0,
    "generation": "019abf1c-5e2a-7c3d-9a41-6b2f0e8d4c17"
}))]
pub struct Session {
    #[schema(value_type = SessionId)]
    pub session_id: String,
    /// The session's owner; `null` when it has none.
    #[schema(value_type = Option<UserId>, required = true)]
    pub user_id: Option<String>,
    #[schema(format = DateTime)]
    pub created_at: String,
    /// The last start or finalize.
    #[schema(format = DateTime)]
    pub last_active_at: String,
    /// When the session expires unless written to again.
    #[schema(format = DateTime)]
    pub expires_at: String,
    /// Finalized turns.
    pub turn_count: u64,
    /// Started turns not finalized yet.
    pub pending_count: u64,
    /// Names this incarnation of the session id (opaque): a session
    /// cleared, erased or expired and started again under the same id has
    /// another. A summary write can require it (`expected_generation`).
    pub generation: String,
}

/// Get a session
///
/// Its owner, times and counts; 404 `session_not_found` when no live
/// session has this id.
#[utoipa::path(
    get,
    path = "/v1/sessions/{session_id}",
    tag = "sessions",
    params(SessionPath),
    responses((status = 200, description = "The session", body = Session)),
    security((), ("bearer" = []))
)]
pub async fn get_session(
    State(app): State<AppState>,
    path: SessionPath,
    _: NoQuery,
) -> Result<Json<Session>, ApiError> {
    let (session,) = (path.session_id(),).all()?;
    let info = app
        .store
        .session_info(&session, now_millis())
        .await?
        .ok_or(ProblemCode::SessionNotFound)?;
    Ok(Json(Session {
        session_id: session.into_string(),
        user_id: info.user_id,
        created_at: rfc3339(info.created_at),
        last_active_at: rfc3339(info.last_active_at),
        expires_at: rfc3339(info.expires_at),
        turn_count: info.turn_count,
        pending_count: info.pending_count,
        generation: info.generation,
    }))
}

/// Clear a session
///
/// Deletes every turn of the session. 204 for an unknown session too.
#[utoipa::path(
    delete,
    path = "/v1/sessions/{session_id}",
    tag = "sessions",
    params(SessionPath),
    responses((status = 204, description = "Deleted (or never existed)")),
    security((), ("bearer" = []))
)]
pub async fn clear_session(
    State(app): State<AppState>,
    path: SessionPath,
    _: NoQuery,
) -> Result<StatusCode, ApiError> {
    let (session,) = (path.session_id(),).all()?;
    app.store.clear_session(&session).await?;
    Ok(StatusCode::NO_CONTENT)
}
