//! A user's sessions, and their erasure.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::AppState;
use super::error::ApiError;
use super::extract::{NoQuery, QueryParams, path_extractor};
use super::valid::{AllValid, Valid, field, optional, rule};
use crate::domain::{SessionId, UserId};
use crate::turn::{Millis, now_millis, rfc3339};

pub const DEFAULT_PAGE: u32 = 100;
pub const MAX_PAGE: u32 = 1000;

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct UserPath {
    #[param(value_type = UserId)]
    user_id: String,
}

path_extractor!(UserPath);

impl UserPath {
    pub(super) fn user_id(&self) -> Valid<UserId> {
        field("user_id", UserId::parse(self.user_id.as_str()))
    }
}

/// A page of a user's sessions.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PageParams {
    /// Sessions per page. A page may hold fewer, even none, and still have
    /// a `next_cursor`: follow it until `null`.
    #[param(minimum = 1)]
    limit: Option<u32>,
    /// The `next_cursor` of the previous page (opaque); omit for the first.
    /// A malformed cursor is a 422.
    #[param(pattern = "^[0-9]{1,19}$")]
    cursor: Option<String>,
}

impl PageParams {
    fn limit(&self) -> Valid<usize> {
        let limit = self.limit.unwrap_or(DEFAULT_PAGE);
        rule(
            "limit",
            (1..=MAX_PAGE).contains(&limit),
            format!("must be between 1 and {MAX_PAGE}"),
        )
        .map(|()| limit as usize)
    }

    fn cursor(&self) -> Valid<Option<Millis>> {
        optional(
            "cursor",
            self.cursor.as_deref().map(|c| {
                c.parse::<Millis>()
                    .ok()
                    .filter(|t| *t > 0 && c.bytes().all(|b| b.is_ascii_digit()))
                    .ok_or("must be the next_cursor of a previous page")
            }),
        )
    }
}

/// One of a user's sessions.
#[derive(Debug, Serialize, ToSchema)]
pub struct UserSession {
    #[schema(value_type = SessionId)]
    pub session_id: String,
    #[schema(format = DateTime)]
    pub last_active_at: String,
    /// Finalized turns.
    pub turn_count: u64,
}

#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({
    "user_id": "alice",
    "sessions": [
        {"session_id": "chat-42", "last_active_at": "2026-11-25T10:17:02.481Z", "turn_count": 2},
        {"session_id": "chat-41", "last_active_at": "2026-11-24T16:03:11.907Z", "turn_count": 7}
    ],
    "next_cursor": null
}))]
pub struct UserSessionsResponse {
    #[schema(value_type = UserId)]
    pub user_id: String,
    /// Live sessions, most recently active first: by their latest start
    /// or import, to the second (a finalize does not move a session).
    pub sessions: Vec<UserSession>,
    /// Pass as `cursor` for the next page; `null` on the last page.
    #[schema(pattern = "^[0-9]{1,19}$", required = true)]
    pub next_cursor: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({"user_id": "alice", "deleted_sessions": 2, "complete": true}))]
pub struct EraseUserResponse {
    #[schema(value_type = UserId)]
    pub user_id: String,
    /// Sessions this call deleted.
    pub deleted_sessions: u64,
    /// `true`: no session of the user that existed when the erasure began
    /// remains. `false`: the request timeout came first; call again to
    /// continue where this call stopped.
    pub complete: bool,
}

/// List a user's sessions
///
/// A page of the user's live sessions, most recently active first; an
/// unknown user has none.
#[utoipa::path(
    get,
    path = "/v1/users/{user_id}/sessions",
    tag = "users",
    params(UserPath, PageParams),
    responses(
        (status = 200, description = "A page of the user's live sessions (empty for an unknown user)", body = UserSessionsResponse),
    ),
    security((), ("bearer" = []))
)]
pub async fn list_user_sessions(
    State(app): State<AppState>,
    path: UserPath,
    QueryParams(page): QueryParams<PageParams>,
) -> Result<Json<UserSessionsResponse>, ApiError> {
    let (user, limit, cursor) = (path.user_id(), page.limit(), page.cursor()).all()?;
    let page = app
        .store
        .user_sessions(&user, limit, cursor, now_millis())
        .await?;
    Ok(Json(UserSessionsResponse {
        user_id: user.into_string(),
        sessions: page
            .sessions
            .into_iter()
            .map(|s| UserSession {
                session_id: s.session_id,
                last_active_at: rfc3339(s.last_active_at),
                turn_count: s.turn_count,
            })
            .collect(),
        next_cursor: page.next_cursor.map(|c| c.to_string()),
    }))
}

/// Erase a user
///
/// Deletes every session of the user (right to erasure). A user with more
/// sessions than one request can delete gets `complete: false`: call again,
/// it continues where it stopped.
#[utoipa::path(
    delete,
    path = "/v1/users/{user_id}",
    tag = "users",
    params(UserPath),
    responses(
        (status = 200, description = "Erased (`complete: true`), or as far as the request timeout allowed (`complete: false`)", body = EraseUserResponse),
    ),
    security((), ("bearer" = []))
)]
pub async fn erase_user(
    State(app): State<AppState>,
    path: UserPath,
    _: NoQuery,
) -> Result<Json<EraseUserResponse>, ApiError> {
    let (user,) = (path.user_id(),).all()?;
    // Answer within the request timeout: rounds go on while another fits.
    let timeout = app.settings.request_timeout;
    let budget = timeout
        .saturating_sub(Duration::from_millis(250))
        .max(timeout / 2);
    let erased = app.store.erase_user(&user, budget).await?;
    Ok(Json(EraseUserResponse {
        user_id: user.into_string(),
        deleted_sessions: erased.deleted_sessions,
        complete: erased.complete,
    }))
}
