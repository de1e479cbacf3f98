//! Export: every session of a user as NDJSON, streamed with bounded
//! memory whatever the user holds.
//!
//! A task reads the sessions page by page (the user's list, then each
//! session's turns oldest first, at most `PAGE_BYTES` of texts a call) and
//! sends the lines in chunks of about `CHUNK_BYTES` through a channel of
//! `CHANNEL` chunks: it waits while the client reads slowly, so an export
//! holds one page and a few chunks (about 1.5 MiB) whatever its client
//! does. At most `TURNSTORE_MAX_EXPORTS` stream at once (429 past it); a
//! client that takes no byte for `TURNSTORE_WRITE_TIMEOUT` is cut off
//! (`server`), which frees its export. A store failure or the export's
//! deadline ends the body with an error: the connection is closed before
//! the chunked body's end, so a client sees a cut export as a transport
//! error, never as a short one.

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use futures_util::stream;
use serde::{Deserialize, Serialize};
use tokio::sync::{OwnedSemaphorePermit, mpsc};
use utoipa::{IntoParams, ToSchema};

use super::AppState;
use super::error::ApiError;
use super::extract::QueryParams;
use super::history::{Summary, Turn};
use super::users::UserPath;
use super::valid::AllValid;
use crate::domain::{SessionId, UserId};
use crate::store::{Store, StoreError};
use crate::tokens::Counting;
use crate::turn::{TurnView, now_millis, rfc3339};

/// Sessions listed a call.
const SESSIONS_PAGE: usize = 100;
/// Turns, and bytes of their texts, read a call.
const PAGE_TURNS: usize = 256;
const PAGE_BYTES: u64 = 1024 * 1024;
/// Chunks waiting for the client, and the size a chunk is sent at.
const CHANNEL: usize = 2;
const CHUNK_BYTES: usize = 128 * 1024;
/// When to try again after a 429: an export takes seconds to minutes.
const RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(5);

/// One line of an export: a session and its turns, oldest first.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({
    "session_id": "chat-42",
    "created_at": "2026-11-25T10:15:30.123Z",
    "last_active_at": "2026-11-25T10:17:02.481Z",
    "turns": [{
        "turn_id": "0193a6f4-5c2e-7b1a-9a41-2f6d8e0c4b7a",
        "seq": 1,
        "user_query": "What is a vector index?",
        "final_answer": "An index that finds the stored vectors nearest to a query vector.",
        "started_at": "2026-11-25T10:15:30.123Z",
        "finalized_at": "2026-11-25T10:15:32.456Z",
        "truncated": false
    }]
}))]
pub struct ExportedSession {
    #[schema(value_type = SessionId)]
    pub session_id: String,
    #[schema(format = DateTime)]
    pub created_at: String,
    #[schema(format = DateTime)]
    pub last_active_at: String,
    /// The session's summary, when it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub summary: Option<Summary>,
    /// Every finalized turn, oldest first (pending turns are not exported).
    pub turns: Vec<Turn>,
}

/// How each session's turns are written.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ExportFormat {
    /// `"turns"`: each turn whole (seq, ids, texts, English copies, times).
    #[default]
    Turns,
    /// `"messages"`: a chat transcript, a user and an assistant message a
    /// turn with their times (what a distilled import reads back).
    Messages,
}

#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ExportParams {
    /// `turns` (the default) or `messages`: each session's turns as
    /// `turns`, or as a transcript in `messages` (`{"role": "user" |
    /// "assistant", "content", "timestamp"}`: the question at its
    /// `started_at`, the answer at its `finalized_at`).
    #[param(inline)]
    format: Option<ExportFormat>,
}

/// One line of a `format=messages` export: a session and its turns as a
/// chat transcript, oldest first.
#[derive(Debug, Serialize, ToSchema)]
pub struct ExportedTranscript {
    #[schema(value_type = SessionId)]
    pub session_id: String,
    #[schema(format = DateTime)]
    pub created_at: String,
    #[schema(format = DateTime)]
    pub last_active_at: String,
    /// The session's summary, when it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub summary: Option<Summary>,
    /// Two a finalized turn: its question, then its answer.
    pub messages: Vec<ExportedMessage>,
}

/// A message of an exported transcript.
#[derive(Debug, Serialize, ToSchema)]
pub struct ExportedMessage {
    pub role: ExportedRole,
    pub content: String,
    /// The turn's `started_at` (a question) or `finalized_at` (an answer).
    #[schema(format = DateTime)]
    pub timestamp: String,
}

#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ExportedRole {
    User,
    Assistant,
}

/// Export a user's sessions
///
/// Every live session of the user, one JSON object per line
/// (`application/x-ndjson`), in the order of the sessions list; each holds
/// its finalized turns, oldest first, and its summary. Streamed: memory
/// stays bounded whatever the user holds. The status is sent first: a
/// failure later closes the connection before the body's end (an HTTP
/// client reports an error).
/// An unknown user has an empty export.
#[utoipa::path(
    get,
    path = "/v1/users/{user_id}/export",
    tag = "import-export",
    params(UserPath, ExportParams),
    responses(
        (status = 200, description = "The user's sessions, one per line: an `ExportedSession` each, or with `format=messages` an `ExportedTranscript`",
         body = ExportedSession, content_type = "application/x-ndjson"),
    ),
)]
pub async fn export(
    State(app): State<AppState>,
    path: UserPath,
    QueryParams(params): QueryParams<ExportParams>,
) -> Result<Response, ApiError> {
    let (user,) = (path.user_id(),).all()?;
    let format = params.format.unwrap_or_default();
    // The stream outlives the handler: it holds a place among the exports.
    let permit = app
        .exports
        .clone()
        .try_acquire_owned()
        .map_err(|_| ApiError::TooManyExports {
            retry_after: RETRY_AFTER,
        })?;
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(CHANNEL);
    let deadline = app.settings.export_timeout;
    let store = app.store.clone();
    let encoding = app.settings.encoding;
    tokio::spawn(async move {
        let work = write_sessions(&*store, &user, encoding, format, &tx, permit);
        let failed = match tokio::time::timeout(deadline, work).await {
            Ok(Ok(())) => return,
            Ok(Err(Stop::Gone)) => return,
            Ok(Err(Stop::Store(e))) => {
                tracing::warn!(error = %e, "an export stopped: store failure");
                "the store failed"
            }
            Err(_) => {
                tracing::warn!("an export stopped at TURNSTORE_EXPORT_TIMEOUT");
                "the export took longer than allowed"
            }
        };
        let _ = tx.send(Err(std::io::Error::other(failed))).await;
    });
    let body = Body::from_stream(stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|chunk| (chunk, rx))
    }));
    let mut res = body.into_response();
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    Ok(res)
}

/// Why the export task ended before the last session.
enum Stop {
    /// The client went away.
    Gone,
    Store(StoreError),
}

impl From<StoreError> for Stop {
    fn from(e: StoreError) -> Self {
        Stop::Store(e)
    }
}

async fn send(
    tx: &mpsc::Sender<Result<Bytes, std::io::Error>>,
    chunk: Vec<u8>,
) -> Result<(), Stop> {
    tx.send(Ok(Bytes::from(chunk)))
        .await
        .map_err(|_| Stop::Gone)
}

async fn write_sessions(
    store: &dyn Store,
    user: &UserId,
    encoding: crate::tokens::Encoding,
    format: ExportFormat,
    tx: &mpsc::Sender<Result<Bytes, std::io::Error>>,
    _permit: OwnedSemaphorePermit,
) -> Result<(), Stop> {
    let mut cursor = None;
    loop {
        let page = store
            .user_sessions(user, SESSIONS_PAGE, cursor, now_millis())
            .await?;
        for s in &page.sessions {
            if let Ok(session) = SessionId::parse(s.session_id.as_str()) {
                write_session(store, &session, encoding, format, tx).await?;
            }
        }
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok(()),
        }
    }
}

/// One line: the session's head, then its turns a page at a time.
async fn write_session(
    store: &dyn Store,
    session: &SessionId,
    encoding: crate::tokens::Encoding,
    format: ExportFormat,
    tx: &mpsc::Sender<Result<Bytes, std::io::Error>>,
) -> Result<(), Stop> {
    // A session gone since it was listed is left out.
    let Some(info) = store.session_info(session, now_millis()).await? else {
        return Ok(());
    };
    let summary = store
        .summary(session)
        .await?
        .map(|s| Summary::of(&s, &Counting::Builtin(encoding)));
    let (session_id, created_at, last_active_at) = (
        session.to_string(),
        rfc3339(info.created_at),
        rfc3339(info.last_active_at),
    );
    // `{…,"turns":[]}` without its last two characters.
    let mut chunk = match format {
        ExportFormat::Turns => serde_json::to_vec(&ExportedSession {
            session_id,
            created_at,
            last_active_at,
            summary,
            turns: Vec::new(),
        }),
        ExportFormat::Messages => serde_json::to_vec(&ExportedTranscript {
            session_id,
            created_at,
            last_active_at,
            summary,
            messages: Vec::new(),
        }),
    }
    .unwrap_or_default();
    chunk.truncate(chunk.len().saturating_sub(2));
    let mut after = 0;
    let mut first = true;
    loop {
        let turns = store
            .turns_page(session, after, PAGE_TURNS, PAGE_BYTES)
            .await?;
        let Some(last) = turns.last() else { break };
        after = last.seq;
        for t in turns {
            if !first {
                chunk.push(b',');
            }
            first = false;
            write_turn(&mut chunk, t, format)
                .map_err(|e| Stop::Store(StoreError::Corrupt(e.to_string())))?;
            if chunk.len() >= CHUNK_BYTES {
                send(tx, std::mem::take(&mut chunk)).await?;
            }
        }
    }
    chunk.extend_from_slice(b"]}\n");
    send(tx, chunk).await
}

/// A turn as `format` writes it: a `Turn`, or its two messages.
fn write_turn(chunk: &mut Vec<u8>, t: TurnView, format: ExportFormat) -> serde_json::Result<()> {
    match format {
        ExportFormat::Turns => serde_json::to_writer(chunk, &Turn::from(t)),
        ExportFormat::Messages => {
            let question = ExportedMessage {
                role: ExportedRole::User,
                content: t.user_query,
                timestamp: rfc3339(t.started_at),
            };
            serde_json::to_writer(&mut *chunk, &question)?;
            chunk.push(b',');
            let answer = ExportedMessage {
                role: ExportedRole::Assistant,
                content: t.final_answer,
                timestamp: rfc3339(t.finalized_at),
            };
            serde_json::to_writer(chunk, &answer)
        }
    }
}
