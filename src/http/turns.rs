//! start_turn, finalize_turn, abort_turn.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::AppState;
use super::error::{ApiError, ProblemCode};
use super::extract::{JsonBody, NoQuery};
use super::history::{HistoryParams, HistoryResponse, Reading, Turn};
use super::idempotency::{IDEMPOTENCY_KEY, created, request_hash};
use super::sessions::SessionTurnPath;
use super::valid::{AllValid, Valid, field, given_user_id, optional, rule};
use crate::config::Settings;
use crate::domain::{FinalAnswer, IdempotencyKey, SessionId, TextError, TurnId, UserId, UserQuery};
use crate::history::Options;
use crate::store::counting::unsummarized_tokens;
use crate::store::{Finalized, StartTurn, Store, StoreError, StoredHistory};
use crate::tokens::{AnswerTokens, QueryTokens};
use crate::turn::{English, Finalization, NewPendingTurn, TurnView, now_millis, rfc3339};

/// Starts a turn with the user's question.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({
    "session_id": "chat-42",
    "user_id": "alice",
    "user_query": "What is a vector index?",
    "history": {"limit": 20, "max_tokens": 2000, "format": "text", "model": "gpt-4o"}
}))]
pub struct StartTurnRequest {
    /// Omit to create a session (its id, a UUID v4, is returned). Needed
    /// with `Idempotency-Key`: a client that wants retry-safe first
    /// requests makes its own session id.
    #[schema(value_type = Option<SessionId>)]
    pub session_id: Option<String>,
    /// The session's owner: the first start with a `user_id` claims the
    /// session; another one later is a 403. `""` counts as absent.
    pub user_id: Option<String>,
    /// The user's question: not empty or only whitespace (422), at most
    /// `TURNSTORE_MAX_QUERY_BYTES` bytes of UTF-8 (413).
    #[schema(min_length = 1)]
    pub user_query: String,
    /// An English copy of the question (a pipeline that translates keeps
    /// it here); `lang=en` histories render it. Same limits as
    /// `user_query` (`null` is the same as absent).
    #[schema(min_length = 1)]
    pub user_query_en: Option<String>,
    /// Also return the history as it stood before this turn (`null` is
    /// the same as absent).
    pub history: Option<HistoryParams>,
}

#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({
    "session_id": "chat-42",
    "user_id": "alice",
    "turn_id": "0193a6f4-7d10-7c3e-8b5a-1e2f3a4b5c6d",
    "seq": 2,
    "started_at": "2026-11-25T10:17:01.002Z",
    "history": {
        "session_id": "chat-42",
        "user_id": "alice",
        "format": "text",
        "encoding": "o200k_base",
        "token_count": 27,
        "total_turns": 1,
        "included_turns": 1,
        "omitted_turns": 0,
        "pending_turns": 0,
        "stopped_by": null,
        "rendered": "### Conversation history:\nUser: What is a vector index?\nAssistant: An index that finds the stored vectors nearest to a query vector.",
        "unsummarized": null,
        "generation": "019abf1c-5e2a-7c3d-9a41-6b2f0e8d4c17"
    }
}))]
pub struct StartTurnResponse {
    #[schema(value_type = SessionId)]
    pub session_id: String,
    /// The session's owner; `null` when it has none.
    #[schema(value_type = Option<UserId>, required = true)]
    pub user_id: Option<String>,
    #[schema(value_type = TurnId)]
    pub turn_id: String,
    /// 1, 2, 3 … per session, in start order, without gaps.
    #[schema(minimum = 1)]
    pub seq: u64,
    #[schema(format = DateTime)]
    pub started_at: String,
    /// When the request asked for it: the history before this turn.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub history: Option<HistoryResponse>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"final_answer": "An index that finds the stored vectors nearest to a query vector."}))]
pub struct FinalizeTurnRequest {
    /// The final answer: not empty or only whitespace (422; abort the turn
    /// instead), at most `TURNSTORE_MAX_ANSWER_BYTES` bytes of UTF-8 (413).
    #[schema(min_length = 1)]
    pub final_answer: String,
    /// An English copy of the answer; `lang=en` histories render it. Same
    /// limits as `final_answer`. A retry must repeat it to be the same
    /// finalize (`null` is the same as absent).
    #[schema(min_length = 1)]
    pub final_answer_en: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({
    "session_id": "chat-42",
    "turn": {
        "turn_id": "0193a6f4-5c2e-7b1a-9a41-2f6d8e0c4b7a",
        "seq": 1,
        "user_query": "What is a vector index?",
        "final_answer": "An index that finds the stored vectors nearest to a query vector.",
        "started_at": "2026-11-25T10:15:30.123Z",
        "finalized_at": "2026-11-25T10:15:32.456Z",
        "truncated": false
    }
}))]
pub struct FinalizeTurnResponse {
    #[schema(value_type = SessionId)]
    pub session_id: String,
    pub turn: Turn,
}

/// A text too large answers 413 at once, before any other check: the
/// caller must shorten it whatever else is wrong.
fn text<T>(name: &str, r: Result<T, TextError>) -> Result<Valid<T>, ApiError> {
    match r {
        Err(e @ TextError::TooLarge { .. }) => {
            Err(ApiError::PayloadTooLarge(format!("{name} {e}")))
        }
        other => Ok(field(name, other)),
    }
}

/// An optional text, like [`text`].
fn optional_text<T>(
    name: &str,
    r: Option<Result<T, TextError>>,
) -> Result<Valid<Option<T>>, ApiError> {
    match r {
        None => Ok(Ok(None)),
        Some(r) => Ok(text(name, r)?.map(Some)),
    }
}

/// A start_turn request, validated.
struct Start {
    session_id: SessionId,
    /// No `session_id` was given: the session is new.
    new_session: bool,
    user_id: Option<UserId>,
    query: UserQuery,
    query_en: Option<UserQuery>,
    /// The key and the hash of the request it stands for.
    idempotency: Option<(IdempotencyKey, String)>,
    history: Option<Reading>,
}

impl Start {
    fn parse(
        body: StartTurnRequest,
        headers: &HeaderMap,
        app: &AppState,
    ) -> Result<Self, ApiError> {
        let settings = &app.settings;
        let body = StartTurnRequest {
            user_id: given_user_id(body.user_id),
            ..body
        };
        let query = text(
            "user_query",
            UserQuery::parse(body.user_query.clone(), settings.max_query_bytes),
        )?;
        let query_en = optional_text(
            "user_query_en",
            body.user_query_en
                .clone()
                .map(|q| UserQuery::parse(q, settings.max_query_bytes)),
        )?;
        let key = super::idempotency::key(headers);
        let (query, query_en, session_id, user_id, key, (), history) = (
            query,
            query_en,
            optional("session_id", body.session_id.as_deref().map(SessionId::parse)),
            optional(
                "user_id",
                body.user_id.as_deref().map(UserId::parse),
            ),
            optional("Idempotency-Key", key),
            rule(
                "session_id",
                body.session_id.is_some() || headers.get(IDEMPOTENCY_KEY).is_none(),
                "is required with Idempotency-Key (make your own session id for retry-safe first requests)",
            ),
            body.history
                .as_ref()
                .map(|h| h.resolve(settings, "history."))
                .transpose(),
        )
            .all()?;
        let history = match (history, &body.history) {
            (Some(options), Some(params)) => Some(params.named(options, app, "history.")?),
            _ => None,
        };
        Ok(Start {
            new_session: session_id.is_none(),
            session_id: session_id.unwrap_or_else(SessionId::generate),
            user_id,
            idempotency: key.map(|k| (k, request_hash(&body))),
            query,
            query_en,
            history,
        })
    }
}

/// Start a turn
///
/// Allocates the turn's `seq`, writes it as pending and, when `history` is
/// given, returns the history as it stood before it: one call to begin a
/// request. The turn enters the history when finalized.
#[utoipa::path(
    post,
    path = "/v1/turns",
    tag = "turns",
    request_body = StartTurnRequest,
    params(
        ("Idempotency-Key" = Option<IdempotencyKey>, Header, nullable = false,
         description = "Makes a retried start return the same turn (200, `Idempotent-Replayed: true`); the same key with another body is a 422 `idempotency_key_reused`. Needs `session_id` in the body."),
    ),
    responses(
        (status = 201, description = "Turn started", body = StartTurnResponse),
        (status = 200, description = "Replay of an earlier start with the same Idempotency-Key and body: the same turn", body = StartTurnResponse,
         headers(("Idempotent-Replayed" = String, description = "`true`"))),
    ),
    security((), ("bearer" = []))
)]
pub async fn start_turn(
    State(app): State<AppState>,
    headers: HeaderMap,
    _: NoQuery,
    JsonBody(body): JsonBody<StartTurnRequest>,
) -> Result<Response, ApiError> {
    let mut start = Start::parse(body, &headers, &app)?;
    if let Some(read) = &mut start.history {
        read.options.encoding.ready().await;
        if let Some(chat) = &mut read.chat {
            // The prompt ends with the question.
            chat.question = Some(start.query.as_str().to_owned());
        }
    }
    let turn_id = TurnId::generate();
    let texts = (start.query, start.query_en);
    let long = texts.0.as_str().len() + texts.1.as_ref().map_or(0, |q| q.as_str().len())
        > COUNT_INLINE_BYTES;
    let encoding = app.settings.encoding;
    let ((query, _), (tokens, english)) = counted(
        texts,
        long,
        move |(q, en): &(UserQuery, Option<UserQuery>)| {
            (
                QueryTokens::count(encoding, q.as_str()),
                en.as_ref().map(|en| English {
                    text: en.as_str().to_owned(),
                    tokens: QueryTokens::count(encoding, en.as_str()),
                }),
            )
        },
    )
    .await;
    let read = start.history.as_ref().map(|r| &r.options);
    // A templated history (a history template's, or a chat template's,
    // cut to its budget) is made before the turn is written.
    let templated = match &start.history {
        Some(reading) if reading.options.template.is_some() || reading.chat.is_some() => {
            let (session, user) = (&start.session_id, start.user_id.as_ref());
            let before = read_templated(&*app.store, session, user, &reading.options).await?;
            match reading.cut_apart(before).await {
                Ok(cut) => Some(cut),
                Err(e) => return Err(owner_first(&*app.store, session, user, e).await),
            }
        }
        _ => None,
    };
    let key = start.idempotency.as_ref();
    let begin = |history| StartTurn {
        session_id: &start.session_id,
        user_id: start.user_id.as_ref(),
        turn: NewPendingTurn {
            turn_id: &turn_id,
            user_query: query.as_str(),
            started_at: now_millis(),
            idempotency_key: key.map(|(k, _)| k.as_str()),
            tokens: &tokens,
            english: english.as_ref(),
        },
        idempotency: key.map(|(k, hash)| (k, hash.as_str())),
        history,
        new_session: start.new_session,
        now: now_millis(),
    };
    // Whether the history is cut already (a chat template's, made before).
    let mut cut = false;
    let started = match templated {
        None => app.store.start_turn(begin(read)).await?,
        Some(read_before) => {
            let mut started = app.store.start_turn(begin(None)).await?;
            if started.replayed {
                // A replay writes nothing: read its history as it stood
                // before the turn, in one operation with the replay.
                started = app.store.start_turn(begin(read)).await?;
            } else {
                cut = start.history.as_ref().is_some_and(|r| r.chat.is_some());
                started.history = Some(StoredHistory {
                    user_id: started.user_id.clone(),
                    ..read_before
                });
            }
            started
        }
    };
    app.metrics.turn_started(started.replayed);

    let history = match (started.history, &start.history) {
        (Some(h), Some(reading)) if cut => Some(HistoryResponse::build(
            start.session_id.as_str(),
            h,
            reading,
        )),
        (Some(mut h), Some(reading)) => {
            if reading.counts_in_store() {
                // The turn is written: a failure to count leaves the tokens unknown.
                let _ =
                    unsummarized_tokens(&*app.store, &start.session_id, &mut h, &reading.options)
                        .await;
            } else {
                h = reading.cut_apart(h).await?;
            }
            Some(HistoryResponse::build(
                start.session_id.as_str(),
                h,
                reading,
            ))
        }
        _ => None,
    };
    let body = StartTurnResponse {
        session_id: start.session_id.into_string(),
        user_id: started.user_id,
        turn_id: started.turn_id.to_string(),
        seq: started.seq,
        started_at: rfc3339(started.started_at),
        history,
    };
    Ok(created(body, started.replayed))
}

/// A start's templated history, read and rendered before the turn is
/// written, so that a template failing on it leaves nothing behind: no
/// turn, no claimed owner, no slid TTL, no seq spent. It is the history an
/// instant before the start (a turn finalized meanwhile is as if finalized
/// after it); the live pending turns it counts are those before the turn.
async fn read_templated(
    store: &dyn Store,
    session: &SessionId,
    user: Option<&UserId>,
    read: &Options,
) -> Result<StoredHistory, ApiError> {
    match store.history(session, read, now_millis()).await {
        Err(e @ StoreError::Template(_)) => Err(owner_first(store, session, user, e.into()).await),
        read_before => Ok(read_before?),
    }
}

/// `error`, the failure of a template on a start's history, unless the
/// session is another owner's: the start is refused for that, and its
/// history's effect on the template is not told.
async fn owner_first(
    store: &dyn Store,
    session: &SessionId,
    user: Option<&UserId>,
    error: ApiError,
) -> ApiError {
    if let Some(user) = user {
        match store.session_info(session, now_millis()).await {
            Ok(Some(info))
                if info
                    .user_id
                    .as_deref()
                    .is_some_and(|owner| owner != user.as_str()) =>
            {
                return StoreError::OwnerMismatch.into();
            }
            Err(e) => return e.into(),
            _ => {}
        }
    }
    error
}

/// A finalize_turn request, validated.
struct Finalize {
    session: SessionId,
    turn: TurnId,
    answer: FinalAnswer,
    answer_en: Option<FinalAnswer>,
}

impl Finalize {
    fn parse(
        path: &SessionTurnPath,
        body: FinalizeTurnRequest,
        settings: &Settings,
    ) -> Result<Self, ApiError> {
        let answer = text(
            "final_answer",
            FinalAnswer::parse(body.final_answer, settings.max_answer_bytes),
        )?;
        let answer_en = optional_text(
            "final_answer_en",
            body.final_answer_en
                .map(|a| FinalAnswer::parse(a, settings.max_answer_bytes)),
        )?;
        let (session, turn) = path.ids();
        let (answer, answer_en, session, turn) = (answer, answer_en, session, turn).all()?;
        Ok(Finalize {
            session,
            turn,
            answer,
            answer_en,
        })
    }
}

/// Finalize a turn
///
/// The turn enters the history at its `seq` position (not in finalize
/// order). Retrying with the same answer returns the same turn (200);
/// another answer is a 409.
#[utoipa::path(
    post,
    path = "/v1/sessions/{session_id}/turns/{turn_id}/finalize",
    tag = "turns",
    params(SessionTurnPath),
    request_body = FinalizeTurnRequest,
    responses(
        (status = 200, description = "Turn finalized (or already finalized with this answer)", body = FinalizeTurnResponse),
    ),
    security((), ("bearer" = []))
)]
pub async fn finalize_turn(
    State(app): State<AppState>,
    path: SessionTurnPath,
    _: NoQuery,
    JsonBody(body): JsonBody<FinalizeTurnRequest>,
) -> Result<Json<FinalizeTurnResponse>, ApiError> {
    let (session, turn, end) = Finalize::parse(&path, body, &app.settings)?
        .counted(&app)
        .await;
    let same = |t: &TurnView| {
        t.final_answer == end.final_answer
            && t.final_answer_en.as_deref() == end.english.as_ref().map(|e| e.text.as_str())
    };
    let done = match app.store.finalize_turn(&session, turn, &end).await? {
        Finalized::Now(t) => {
            app.metrics.turn_finalized();
            if let Some(s) = &app.summarizer {
                s.wrote(session.clone());
            }
            t
        }
        Finalized::Already(t) if same(&t) => t,
        Finalized::Already(_) => return Err(ProblemCode::TurnAlreadyFinalized.into()),
    };
    Ok(Json(FinalizeTurnResponse {
        session_id: session.into_string(),
        turn: Turn::from(done),
    }))
}

impl Finalize {
    /// The answer, counted (off the request's thread when long), as the
    /// turn ends with it now.
    async fn counted(self, app: &AppState) -> (SessionId, TurnId, Finalization) {
        let texts = (self.answer, self.answer_en);
        let long = texts.0.as_str().len() + texts.1.as_ref().map_or(0, |a| a.as_str().len())
            > COUNT_INLINE_BYTES;
        let encoding = app.settings.encoding;
        let ((answer, _), (tokens, english)) = counted(
            texts,
            long,
            move |(a, en): &(FinalAnswer, Option<FinalAnswer>)| {
                (
                    AnswerTokens::count(encoding, a.as_str()),
                    en.as_ref().map(|en| English {
                        text: en.as_str().to_owned(),
                        tokens: AnswerTokens::count(encoding, en.as_str()),
                    }),
                )
            },
        )
        .await;
        let end = Finalization {
            tokens,
            final_answer: answer.into_string(),
            finalized_at: now_millis(),
            english,
        };
        (self.session, self.turn, end)
    }
}

/// Regenerate a turn's answer
///
/// Replaces the answer of a finalized turn (a chat UI's "regenerate"),
/// keeping its seq, its question and the question's English copy; the old
/// answer (and its English copy) is not kept. Any finalized turn the
/// summary does not cover: a covered one is a 409 `turn_summarized`, a
/// pending one a 409 `turn_pending`. The answer follows a finalize's rules
/// (limits, counts, `final_answer_en`); `finalized_at` becomes now, and the
/// session's TTL slides.
#[utoipa::path(
    post,
    path = "/v1/sessions/{session_id}/turns/{turn_id}/regenerate",
    tag = "turns",
    params(SessionTurnPath),
    request_body = FinalizeTurnRequest,
    responses(
        (status = 200, description = "The turn with its new answer", body = FinalizeTurnResponse),
    ),
    security((), ("bearer" = []))
)]
pub async fn regenerate_turn(
    State(app): State<AppState>,
    path: SessionTurnPath,
    _: NoQuery,
    JsonBody(body): JsonBody<FinalizeTurnRequest>,
) -> Result<Json<FinalizeTurnResponse>, ApiError> {
    let (session, turn, end) = Finalize::parse(&path, body, &app.settings)?
        .counted(&app)
        .await;
    let done = app.store.regenerate(&session, turn, &end).await?;
    if let Some(s) = &app.summarizer {
        s.wrote(session.clone());
    }
    Ok(Json(FinalizeTurnResponse {
        session_id: session.into_string(),
        turn: Turn::from(done),
    }))
}

/// Abort or delete a turn
///
/// Removes a pending turn (the pipeline failed) or a finalized one (the
/// user deleted it).
#[utoipa::path(
    delete,
    path = "/v1/sessions/{session_id}/turns/{turn_id}",
    tag = "turns",
    params(SessionTurnPath),
    responses((status = 204, description = "Removed")),
    security((), ("bearer" = []))
)]
pub async fn abort_turn(
    State(app): State<AppState>,
    path: SessionTurnPath,
    _: NoQuery,
) -> Result<StatusCode, ApiError> {
    let (session, turn) = path.ids().all()?;
    app.store.delete_turn(&session, turn).await?;
    app.metrics.turn_aborted();
    Ok(StatusCode::NO_CONTENT)
}

/// Texts longer than this are counted on the blocking pool: a 128 KiB
/// answer takes 5 to 130 ms (prose to one long whitespace run), which a
/// worker must not spend while probes and other requests wait. Not
/// through `tokens::apart` (a few at a time): in these handlers it cost
/// the core loop 4% (`bench/compare`, 2026-11-26), boxed or not.
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
