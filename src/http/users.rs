//! A user's sessions, and their erasure.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::AppState;
use super::error::{ApiError, Problem};
use super::extract::{Check, QueryParams, path_extractor};
use crate::domain::UserId;
use crate::turn::{Millis, now_millis, rfc3339};

pub const DEFAULT_PAGE: u32 = 100;
pub const MAX_PAGE: u32 = 1000;

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

/// A page of a user's sessions.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PageParams {
    /// Sessions per page (1..=1000, default 100). A page may hold fewer,
    /// even none, and still have a `next_cursor`: follow it until `null`.
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
    /// The `next_cursor` of the previous page (opaque); omit for the first.
    cursor: Option<String>,
}

impl PageParams {
    fn parse(&self, check: &mut Check) -> (usize, Option<Millis>) {
        let limit = self.limit.unwrap_or(DEFAULT_PAGE);
        if !(1..=MAX_PAGE).contains(&limit) {
            check.fail("limit", format!("must be between 1 and {MAX_PAGE}"));
        }
        let cursor = self.cursor.as_deref().and_then(|c| {
            check.take(
                "cursor",
                c.parse::<Millis>()
                    .ok()
                    .filter(|t| *t > 0 && c.bytes().all(|b| b.is_ascii_digit()))
                    .ok_or("must be the next_cursor of a previous page"),
            )
        });
        (limit as usize, cursor)
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
    /// Live sessions, most recently active first (by their last index
    /// refresh: a start refreshes it at least every `TURNSTORE_SESSION_TTL / 4`,
    /// at most a day).
    pub sessions: Vec<UserSession>,
    /// Pass as `cursor` for the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct EraseUserResponse {
    pub user_id: String,
    /// Sessions this call deleted.
    pub deleted_sessions: u64,
    /// `true`: no session of the user that existed when the erasure began
    /// remains. `false`: the request timeout came first; call again to
    /// continue where this call stopped.
    pub complete: bool,
}

/// List a user's sessions
#[utoipa::path(
    get,
    path = "/v1/users/{user_id}/sessions",
    tag = "users",
    params(UserPath, PageParams),
    responses(
        (status = 200, description = "A page of the user's live sessions (empty for an unknown user)", body = UserSessionsResponse),
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "`validation_failed`", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "`store_unavailable`", body = Problem, content_type = "application/problem+json"),
    ),
    security((), ("bearer" = []))
)]
pub async fn list_user_sessions(
    State(app): State<AppState>,
    path: UserPath,
    QueryParams(page): QueryParams<PageParams>,
) -> Result<Json<UserSessionsResponse>, ApiError> {
    let mut check = Check::default();
    let user = check.take("user_id", UserId::parse(path.user_id.as_str()));
    let (limit, cursor) = page.parse(&mut check);
    check.finish()?;
    let user = user.ok_or(ApiError::Internal)?;
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
