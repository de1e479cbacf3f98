//! get_history, get_session, clear_session, and the path parameters they share.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::AppState;
use super::error::{ApiError, Problem};
use super::extract::{Check, QueryParams, path_extractor};
use super::history::{HistoryFormat, HistoryParams, HistoryResponse};
use crate::domain::{SessionId, TurnId};
use crate::turn::{now_millis, rfc3339};

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct SessionPath {
    /// `^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$`
    session_id: String,
}
path_extractor!(SessionPath);

impl SessionPath {
    pub fn parse(&self) -> Result<SessionId, ApiError> {
        SessionId::parse(self.session_id.as_str()).map_err(|e| ApiError::field("session_id", e))
    }
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct SessionTurnPath {
    /// `^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$`
    session_id: String,
    /// The UUID start_turn returned.
    turn_id: String,
}
path_extractor!(SessionTurnPath);

impl SessionTurnPath {
    pub fn parse(&self, check: &mut Check) -> (Option<SessionId>, Option<TurnId>) {
        (
            check.take("session_id", SessionId::parse(self.session_id.as_str())),
            check.take("turn_id", TurnId::parse(&self.turn_id)),
        )
    }
}

/// The quality `Accept` gives a media type (RFC 9110, 12.5.1): that of the
/// most specific range matching it (`type/subtype` 3, over `type/*` 2, over
/// `*/*` 1), with that specificity; (0, 0) if none does, (1, 0) with no
/// `Accept` at all. A range with a malformed `q` is ignored.
fn quality(headers: &HeaderMap, media: &str) -> (f32, u8) {
    let (kind, _) = media.split_once('/').unwrap_or((media, ""));
    let mut ranges = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter(|r| !r.trim().is_empty())
        .peekable();
    if ranges.peek().is_none() {
        return (1.0, 0);
    }
    let mut best: Option<(u8, f32)> = None;
    for range in ranges {
        let mut parts = range.split(';');
        let name = parts.next().unwrap_or_default().trim().to_ascii_lowercase();
        let specificity = if name == media {
            3
        } else if name.strip_suffix("/*") == Some(kind) {
            2
        } else if name == "*/*" {
            1
        } else {
            continue;
        };
        let q = parts
            .filter_map(|p| p.split_once('='))
            .find(|(k, _)| k.trim().eq_ignore_ascii_case("q"))
            .map_or(Some(1.0), |(_, v)| {
                v.trim()
                    .parse::<f32>()
                    .ok()
                    .filter(|q| (0.0..=1.0).contains(q))
            });
        let Some(q) = q else { continue };
        if best.is_none_or(|(s, _)| specificity > s) {
            best = Some((specificity, q));
        }
    }
    best.map_or((0.0, 0), |(s, q)| (q, s))
}

/// Whether the caller prefers the bare text to JSON: by quality, then by
/// the range that named it (`text/plain, */*` is text); JSON on a tie. 406
/// when `Accept` rules out both.
fn wants_plain_text(headers: &HeaderMap) -> Result<bool, ApiError> {
    let (json, text) = (
        quality(headers, "application/json"),
        quality(headers, "text/plain"),
    );
    if json.0 <= 0.0 && text.0 <= 0.0 {
        return Err(ApiError::NotAcceptable);
    }
    Ok(text.0 > json.0 || (text.0 == json.0 && text.1 > json.1))
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
        (status = 200, description = "The history", body = HistoryResponse,
         content(
             (HistoryResponse = "application/json"),
             (String = "text/plain"),
         ),
         headers(
             ("x-token-count" = u32, description = "With text/plain: the exact token count"),
             ("x-encoding" = String, description = "With text/plain: the encoding counted in"),
         )),
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 406, description = "`not_acceptable`: `Accept` rules out both application/json and text/plain", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "`validation_failed`", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "`store_unavailable`", body = Problem, content_type = "application/problem+json"),
    ),
    security((), ("bearer" = []))
)]
pub async fn get_history(
    State(app): State<AppState>,
    path: SessionPath,
    headers: HeaderMap,
    QueryParams(params): QueryParams<HistoryParams>,
) -> Result<Response, ApiError> {
    let mut check = Check::default();
    let session = check.take("session_id", SessionId::parse(path.session_id.as_str()));
    let opts = params.resolve(&app.settings, &mut check, "");
    let plain = wants_plain_text(&headers)?;
    if plain && params.format.is_some_and(|f| f != HistoryFormat::Text) {
        check.fail("format", "must be text with Accept: text/plain");
    }
    check.finish()?;
    let session = session.ok_or(ApiError::Internal)?;
    let stored = app.store.history(&session, &opts, now_millis()).await?;
    let out = HistoryResponse::build(session.as_str(), stored, &opts);
    if plain {
        let mut res = out.rendered.unwrap_or_default().into_response();
        let h = res.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        h.insert("x-token-count", HeaderValue::from(out.token_count));
        h.insert("x-encoding", HeaderValue::from_static(out.encoding.name()));
        return Ok(res);
    }
    Ok(Json(out).into_response())
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SessionResponse {
    pub session_id: String,
    pub user_id: Option<String>,
    /// RFC 3339 UTC.
    pub created_at: String,
    /// RFC 3339 UTC: the last start or finalize.
    pub last_active_at: String,
    /// RFC 3339 UTC: when the session expires unless written to again.
    pub expires_at: String,
    /// Finalized turns.
    pub turn_count: u64,
    /// Started turns not finalized yet.
    pub pending_count: u64,
}

/// Get a session
#[utoipa::path(
    get,
    path = "/v1/sessions/{session_id}",
    tag = "sessions",
    params(SessionPath),
    responses(
        (status = 200, description = "The session", body = SessionResponse),
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "`session_not_found`", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "`validation_failed`", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "`store_unavailable`", body = Problem, content_type = "application/problem+json"),
    ),
    security((), ("bearer" = []))
)]
pub async fn get_session(
    State(app): State<AppState>,
    path: SessionPath,
) -> Result<Json<SessionResponse>, ApiError> {
    let session = path.parse()?;
    let info = app
        .store
        .session_info(&session, now_millis())
        .await?
        .ok_or(ApiError::SessionNotFound)?;
    Ok(Json(SessionResponse {
        session_id: session.into_string(),
        user_id: info.user_id,
        created_at: rfc3339(info.created_at),
        last_active_at: rfc3339(info.last_active_at),
        expires_at: rfc3339(info.expires_at),
        turn_count: info.turn_count,
        pending_count: info.pending_count,
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
    responses(
        (status = 204, description = "Deleted (or never existed)"),
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "`validation_failed`", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "`store_unavailable`", body = Problem, content_type = "application/problem+json"),
    ),
    security((), ("bearer" = []))
)]
pub async fn clear_session(
    State(app): State<AppState>,
    path: SessionPath,
) -> Result<StatusCode, ApiError> {
    let session = path.parse()?;
    app.store.clear_session(&session).await?;
    Ok(StatusCode::NO_CONTENT)
}
