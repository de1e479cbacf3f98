//! A session's rolling summary: written by a client (or the server-side
//! summarizer), read, deleted.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use utoipa::ToSchema;

use super::AppState;
use super::error::{ApiError, ProblemCode};
use super::extract::{JsonBody, NoQuery};
use super::history::Summary;
use super::sessions::SessionPath;
use super::valid::{AllValid, field, given_user_id, optional, rule};
use crate::config::Settings;
use crate::domain::{SessionId, SummaryText, TextError, UserId};
use crate::store::SummaryWrite;
use crate::tokens::{Counting, SummaryTokens};
use crate::turn::now_millis;

/// Writes the session's summary.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({
    "summary": "Alice is choosing a vector index for 2M documents; HNSW was recommended over IVF for recall.",
    "through_seq": 12,
    "expected_through_seq": 8
}))]
pub struct PutSummaryRequest {
    /// The summary of every turn with `seq <= through_seq`: not empty or
    /// only whitespace (422), at most `TURNSTORE_MAX_SUMMARY_BYTES` bytes of
    /// UTF-8 (413).
    #[schema(min_length = 1)]
    pub summary: String,
    /// At least the stored summary's (409 otherwise: a summary does not go
    /// backwards; the same replaces its text), at most the newest finalized
    /// turn's seq and below every pending turn's (422: a pending turn may
    /// yet be finalized, and a summary may not cover it).
    #[schema(minimum = 1)]
    pub through_seq: u64,
    /// Write only if the stored summary covers exactly this many turns' seqs
    /// (0: there is none yet); otherwise 409 `summary_conflict`. Two
    /// summarizers then never overwrite each other.
    #[schema(minimum = 0)]
    pub expected_through_seq: Option<u64>,
    /// Write only to this generation of the session: the `generation` of
    /// the history (or session) the summary was folded from. A session
    /// cleared, erased or expired since (even if started again under the
    /// same id) answers 409 `summary_conflict`, and nothing is written.
    #[schema(max_length = 64, example = "019abf1c-5e2a-7c3d-9a41-6b2f0e8d4c17")]
    pub expected_generation: Option<String>,
    /// Checked against the session's owner as a start's is (403); a summary
    /// does not claim an unowned session. `""` counts as absent.
    pub user_id: Option<String>,
}

/// A summary write, validated.
struct Write {
    session: SessionId,
    user: Option<UserId>,
    text: SummaryText,
    through_seq: u64,
    expected: Option<u64>,
    generation: Option<String>,
}

impl Write {
    fn parse(
        path: &SessionPath,
        body: PutSummaryRequest,
        settings: &Settings,
    ) -> Result<Self, ApiError> {
        let text = match SummaryText::parse(body.summary, settings.max_summary_bytes as usize) {
            Err(e @ TextError::TooLarge { .. }) => {
                return Err(ApiError::PayloadTooLarge(format!("summary {e}")));
            }
            other => field("summary", other),
        };
        let (session, text, user, (), ()) = (
            path.session_id(),
            text,
            optional(
                "user_id",
                given_user_id(body.user_id).as_deref().map(UserId::parse),
            ),
            rule("through_seq", body.through_seq >= 1, "must be at least 1"),
            rule(
                "expected_generation",
                body.expected_generation
                    .as_ref()
                    .is_none_or(|g| !g.is_empty() && g.len() <= 64),
                "must be a session's generation (1 to 64 characters)",
            ),
        )
            .all()?;
        Ok(Write {
            session,
            user,
            text,
            through_seq: body.through_seq,
            expected: body.expected_through_seq,
            generation: body.expected_generation,
        })
    }
}

/// Write the summary
///
/// Stores the session's rolling summary of every turn up to `through_seq`,
/// and slides the session's TTL. With `expected_through_seq`, only if the
/// stored summary covers exactly that far (compare-and-set). Reads with
/// `summary=true` begin with it.
#[utoipa::path(
    put,
    path = "/v1/sessions/{session_id}/summary",
    tag = "summaries",
    params(SessionPath),
    request_body = PutSummaryRequest,
    responses((status = 200, description = "Written", body = Summary)),
)]
pub async fn put_summary(
    State(app): State<AppState>,
    path: SessionPath,
    _: NoQuery,
    JsonBody(body): JsonBody<PutSummaryRequest>,
) -> Result<Json<Summary>, ApiError> {
    let w = Write::parse(&path, body, &app.settings)?;
    let encoding = app.settings.encoding;
    let text = w.text.as_str().to_owned();
    let tokens = crate::tokens::apart(move || SummaryTokens::count(encoding, &text)).await;
    let stored = app
        .store
        .put_summary(SummaryWrite {
            session_id: &w.session,
            user_id: w.user.as_ref(),
            text: w.text.as_str(),
            through_seq: w.through_seq,
            expected_through_seq: w.expected,
            expected_generation: w.generation.as_deref(),
            tokens: &tokens,
            now: now_millis(),
        })
        .await?;
    Ok(Json(Summary::of(&stored, &Counting::Builtin(encoding))))
}

/// Get the summary
///
/// The session's summary, its `token_count` in the server's encoding; 404
/// `summary_not_found` when it has none.
#[utoipa::path(
    get,
    path = "/v1/sessions/{session_id}/summary",
    tag = "summaries",
    params(SessionPath),
    responses((status = 200, description = "The summary", body = Summary)),
)]
pub async fn get_summary(
    State(app): State<AppState>,
    path: SessionPath,
    _: NoQuery,
) -> Result<Json<Summary>, ApiError> {
    let (session,) = (path.session_id(),).all()?;
    let stored = app
        .store
        .summary(&session)
        .await?
        .ok_or(ProblemCode::SummaryNotFound)?;
    Ok(Json(Summary::of(
        &stored,
        &Counting::Builtin(app.settings.encoding),
    )))
}

/// Delete the summary
///
/// Idempotent: 204 when there is none too.
#[utoipa::path(
    delete,
    path = "/v1/sessions/{session_id}/summary",
    tag = "summaries",
    params(SessionPath),
    responses((status = 204, description = "Deleted (or there was none)")),
)]
pub async fn delete_summary(
    State(app): State<AppState>,
    path: SessionPath,
    _: NoQuery,
) -> Result<StatusCode, ApiError> {
    let (session,) = (path.session_id(),).all()?;
    app.store.delete_summary(&session).await?;
    Ok(StatusCode::NO_CONTENT)
}
