//! start_turn, finalize_turn, abort_turn.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use utoipa::ToSchema;

use super::AppState;
use super::error::{ApiError, Problem};
use super::extract::{Check, JsonBody};
use super::history::{HistoryParams, HistoryResponse, TurnOut};
use super::sessions::SessionTurnPath;
use crate::domain::{FinalAnswer, IdempotencyKey, SessionId, TextError, TurnId, UserId, UserQuery};
use crate::store::{Finalized, StartTurn};
use crate::tokens::{AnswerTokens, QueryTokens};
use crate::turn::{Finalization, NewPendingTurn, now_millis, rfc3339};

pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

/// Starts a turn with the user's question.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StartTurnRequest {
    /// Omit to create a session (its id is returned). Needed with `Idempotency-Key`.
    pub session_id: Option<String>,
    /// The session's owner; `""` counts as absent.
    pub user_id: Option<String>,
    /// The user's question (not empty; at most `TURNSTORE_MAX_QUERY_BYTES`).
    pub user_query: String,
    /// Also return the history as it stood before this turn.
    pub history: Option<HistoryParams>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct StartTurnResponse {
    pub session_id: String,
    /// The session's owner, if it has one.
    pub user_id: Option<String>,
    #[schema(format = Uuid)]
    pub turn_id: String,
    /// 1, 2, 3 … per session, in start order.
    pub seq: u64,
    /// RFC 3339 UTC.
    pub started_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub history: Option<HistoryResponse>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FinalizeTurnRequest {
    /// The final answer (not empty; at most `TURNSTORE_MAX_ANSWER_BYTES`).
    pub final_answer: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct FinalizeTurnResponse {
    pub session_id: String,
    pub turn: TurnOut,
}

fn text_error(field: &str, e: TextError) -> ApiError {
    match e {
        TextError::Empty => ApiError::field(field, e),
        TextError::TooLarge { .. } => ApiError::PayloadTooLarge(format!("{field} {e}")),
    }
}

/// A text too large answers 413 at once; other problems are collected.
fn parse_text<T>(
    check: &mut Check,
    field: &str,
    r: Result<T, TextError>,
) -> Result<Option<T>, ApiError> {
    match r {
        Err(e @ TextError::TooLarge { .. }) => Err(text_error(field, e)),
        other => Ok(check.take(field, other)),
    }
}

/// Start a turn
///
/// Allocates the turn's `seq`, writes it as pending and, when `history` is
/// given, returns the history as it stood before it: one call to begin a request.
#[utoipa::path(
    post,
    path = "/v1/turns",
    tag = "turns",
    request_body = StartTurnRequest,
    params(
        ("Idempotency-Key" = Option<String>, Header,
         description = "Makes a retried start return the same turn (200, `Idempotent-Replayed: true`). Needs `session_id` in the body."),
    ),
    responses(
        (status = 201, description = "Turn started", body = StartTurnResponse),
        (status = 200, description = "Replay of an earlier start with the same Idempotency-Key and body", body = StartTurnResponse,
         headers(("Idempotent-Replayed" = String, description = "`true`"))),
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "`session_owner_mismatch`", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "`payload_too_large`", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "`validation_failed`, `idempotency_key_reused`", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "`too_many_pending_turns`: the session holds `TURNSTORE_MAX_PENDING_TURNS` turns started and not finalized; nothing was written",
         body = Problem, content_type = "application/problem+json",
         headers(("Retry-After" = u64, description = "Seconds until the oldest pending turn expires (a finalize or abort frees one sooner)"))),
        (status = 503, description = "`store_unavailable`", body = Problem, content_type = "application/problem+json"),
    ),
    security((), ("bearer" = []))
)]
pub async fn start_turn(
    State(app): State<AppState>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<StartTurnRequest>,
) -> Result<Response, ApiError> {
    let mut check = Check::default();
    let query = parse_text(
        &mut check,
        "user_query",
        UserQuery::parse(body.user_query.clone(), app.settings.max_query_bytes),
    )?;
    let session_id = body
        .session_id
        .as_deref()
        .and_then(|s| check.take("session_id", SessionId::parse(s)));
    let user_id = body
        .user_id
        .as_deref()
        .filter(|u| !u.is_empty())
        .and_then(|u| check.take("user_id", UserId::parse(u)));
    let key = match headers.get(IDEMPOTENCY_KEY) {
        None => None,
        Some(v) => check.take(
            "Idempotency-Key",
            v.to_str()
                .map_err(|_| "must be visible ASCII")
                .and_then(IdempotencyKey::parse),
        ),
    };
    if key.is_some() && body.session_id.is_none() {
        check.fail(
            "session_id",
            "is required with Idempotency-Key (make your own session id for retry-safe first requests)",
        );
    }
    let options = body
        .history
        .as_ref()
        .map(|h| h.resolve(&app.settings, &mut check, "history."));
    check.finish()?;
    let query = query.ok_or(ApiError::Internal)?;
    let session_id = session_id.unwrap_or_else(SessionId::generate);

    let hash = key.as_ref().map(|_| request_hash(&body));
    let turn_id = TurnId::generate();
    let long = query.as_str().len() > COUNT_INLINE_BYTES;
    let encoding = app.settings.encoding;
    let (query, tokens) = counted(query, long, move |q: &UserQuery| {
        QueryTokens::count(encoding, q.as_str())
    })
    .await;
    let started = app
        .store
        .start_turn(StartTurn {
            session_id: &session_id,
            user_id: user_id.as_ref(),
            turn: NewPendingTurn {
                turn_id: &turn_id,
                user_query: query.as_str(),
                started_at: now_millis(),
                idempotency_key: key.as_ref().map(IdempotencyKey::as_str),
                tokens: &tokens,
            },
            idempotency: key.as_ref().zip(hash.as_deref()),
            history: options.as_ref(),
            new_session: body.session_id.is_none(),
            now: now_millis(),
        })
        .await?;
    app.metrics.turn_started(started.replayed);

    let history = match (started.history, &options) {
        (Some(h), Some(opts)) => Some(HistoryResponse::build(session_id.as_str(), h, opts)),
        _ => None,
    };
    let body = StartTurnResponse {
        session_id: session_id.into_string(),
        user_id: started.user_id,
        turn_id: started.turn_id.to_string(),
        seq: started.seq,
        started_at: rfc3339(started.started_at),
        history,
    };
    Ok(if started.replayed {
        let mut res = (StatusCode::OK, Json(body)).into_response();
        res.headers_mut()
            .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
        res
    } else {
        (StatusCode::CREATED, Json(body)).into_response()
    })
}

/// What "the same body" means for an idempotent replay: the parsed request,
/// so key order and white space do not matter.
fn request_hash(body: &StartTurnRequest) -> String {
    let canonical = serde_json::to_vec(body).unwrap_or_default();
    Sha256::digest(&canonical)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Finalize a turn
///
/// The turn enters the history at its `seq` position. Retrying with the same
/// answer returns the same turn.
#[utoipa::path(
    post,
    path = "/v1/sessions/{session_id}/turns/{turn_id}/finalize",
    tag = "turns",
    params(SessionTurnPath),
    request_body = FinalizeTurnRequest,
    responses(
        (status = 200, description = "Turn finalized (or already finalized with this answer)", body = FinalizeTurnResponse),
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "`turn_not_found`", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`turn_already_finalized` with another answer", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "`payload_too_large`", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "`validation_failed`", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "`store_unavailable`", body = Problem, content_type = "application/problem+json"),
    ),
    security((), ("bearer" = []))
)]
pub async fn finalize_turn(
    State(app): State<AppState>,
    path: SessionTurnPath,
    JsonBody(body): JsonBody<FinalizeTurnRequest>,
) -> Result<Json<FinalizeTurnResponse>, ApiError> {
    let mut check = Check::default();
    let answer = parse_text(
        &mut check,
        "final_answer",
        FinalAnswer::parse(body.final_answer, app.settings.max_answer_bytes),
    )?;
    let (session, turn) = path.parse(&mut check);
    check.finish()?;
    let (Some(answer), Some(session), Some(turn)) = (answer, session, turn) else {
        return Err(ApiError::Internal);
    };
    let long = answer.as_str().len() > COUNT_INLINE_BYTES;
    let encoding = app.settings.encoding;
    let (answer, tokens) = counted(answer, long, move |a: &FinalAnswer| {
        AnswerTokens::count(encoding, a.as_str())
    })
    .await;
    let end = Finalization {
        tokens,
        final_answer: answer.into_string(),
        finalized_at: now_millis(),
    };
    let done = match app.store.finalize_turn(&session, turn, &end).await? {
        Finalized::Now(t) => {
            app.metrics.turn_finalized();
            t
        }
        Finalized::Already(t) if t.final_answer == end.final_answer => t,
        Finalized::Already(_) => return Err(ApiError::TurnAlreadyFinalized),
    };
    Ok(Json(FinalizeTurnResponse {
        session_id: session.into_string(),
        turn: TurnOut::from(done),
    }))
}

/// Abort or delete a turn
///
/// Removes a pending turn (the pipeline failed) or a finalized one (the user deleted it).
#[utoipa::path(
    delete,
    path = "/v1/sessions/{session_id}/turns/{turn_id}",
    tag = "turns",
    params(SessionTurnPath),
    responses(
        (status = 204, description = "Removed"),
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "`turn_not_found`", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "`validation_failed`", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "`store_unavailable`", body = Problem, content_type = "application/problem+json"),
    ),
    security((), ("bearer" = []))
)]
pub async fn abort_turn(
    State(app): State<AppState>,
    path: SessionTurnPath,
) -> Result<StatusCode, ApiError> {
    let mut check = Check::default();
    let (session, turn) = path.parse(&mut check);
    check.finish()?;
    let (Some(session), Some(turn)) = (session, turn) else {
        return Err(ApiError::Internal);
    };
    app.store.delete_turn(&session, turn).await?;
    app.metrics.turn_aborted();
    Ok(StatusCode::NO_CONTENT)
}

/// Texts longer than this are counted on the blocking pool: a 128 KiB
/// answer takes 5 to 130 ms (prose to one long whitespace run), which a
/// worker must not spend while probes and other requests wait.
const COUNT_INLINE_BYTES: usize = 16 * 1024;

/// `count(text)`, off the async workers when `long`; gives the text back.
async fn counted<T, C>(text: T, long: bool, count: impl FnOnce(&T) -> C + Send + 'static) -> (T, C)
where
    T: Send + 'static,
    C: Send + 'static,
{
    if !long {
        let c = count(&text);
        return (text, c);
    }
    match tokio::task::spawn_blocking(move || {
        let c = count(&text);
        (text, c)
    })
    .await
    {
        Ok(done) => done,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}
