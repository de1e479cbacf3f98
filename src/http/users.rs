//! A user's sessions, and their erasure.

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::AppState;
use super::error::{ApiError, Problem};
use super::extract::path_extractor;
use crate::domain::UserId;
use crate::turn::{now_millis, rfc3339};

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct UserPath {
    /// `^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$`
    user_id: String,
}

path_extractor!(UserPath);

impl UserPath {
    fn parse(&self) -> Result<UserId, ApiError> {
        UserId::parse(self.user_id.as_str()).map_err(|e| ApiError::field("user_id", e))
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct UserSession {
    pub session_id: String,
    /// RFC 3339 UTC.
    pub last_active_at: String,
    pub turn_count: u64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct UserSessionsResponse {
    pub user_id: String,
    /// Live sessions, most recently active first.
    pub sessions: Vec<UserSession>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct EraseUserResponse {
    pub user_id: String,
    pub deleted_sessions: u64,
}

/// List a user's sessions
#[utoipa::path(
    get,
    path = "/v1/users/{user_id}/sessions",
    tag = "users",
    params(UserPath),
    responses(
        (status = 200, description = "The user's live sessions (empty for an unknown user)", body = UserSessionsResponse),
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "`validation_failed`", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "`store_unavailable`", body = Problem, content_type = "application/problem+json"),
    ),
    security((), ("bearer" = []))
)]
pub async fn list_user_sessions(
    State(app): State<AppState>,
    path: UserPath,
) -> Result<Json<UserSessionsResponse>, ApiError> {
    let user = path.parse()?;
    let sessions = app.store.user_sessions(&user, now_millis()).await?;
    Ok(Json(UserSessionsResponse {
        user_id: user.into_string(),
        sessions: sessions
            .into_iter()
            .map(|s| UserSession {
                session_id: s.session_id,
                last_active_at: rfc3339(s.last_active_at),
                turn_count: s.turn_count,
            })
            .collect(),
    }))
}

/// Erase a user
///
/// Deletes every session of the user (right to erasure).
#[utoipa::path(
    delete,
    path = "/v1/users/{user_id}",
    tag = "users",
    params(UserPath),
    responses(
        (status = 200, description = "Erased", body = EraseUserResponse),
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "`validation_failed`", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "`store_unavailable`", body = Problem, content_type = "application/problem+json"),
    ),
    security((), ("bearer" = []))
)]
pub async fn erase_user(
    State(app): State<AppState>,
    path: UserPath,
) -> Result<Json<EraseUserResponse>, ApiError> {
    let user = path.parse()?;
    let deleted_sessions = app.store.erase_user(&user).await?;
    Ok(Json(EraseUserResponse {
        user_id: user.into_string(),
        deleted_sessions,
    }))
}
