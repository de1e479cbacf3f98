//! Summarizing in the background: after a finalize (or an import), if what
//! a default history of the session leaves unsummarized holds enough
//! tokens, fold it into the session's summary.
//!
//! Off the request's path: the request spawns a task and answers. A task
//! runs only if this instance has room (`TURNSTORE_SUMMARIZER_CONCURRENCY`;
//! without, the write is left to a later one), one a session in this
//! instance, and only one instance at a time works on a session: a lock in
//! the session's slot, with a token and an expiry longer than the model call
//! may take.
//!
//! No write is forgotten while the session is busy: a write that finds this
//! instance's task at the session marks it to look again, and one that finds
//! another instance's lock leaves it to the holder, which looks again once it
//! has released the lock (so after that write). A task stops when a look
//! finds too little to fold, another holder, or a failure (the next write
//! tries again). The fold is incremental:
//! the previous summary and the oldest unsummarized turns (up to
//! `FOLD_BYTES` of them), never the summary alone; it is written with
//! `expected_through_seq` = what the previous one covered, so a write that
//! raced another is refused, not lost. Failures are logged (never a text)
//! and counted; a request never sees them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;
use tracing::Instrument;

use super::llm::{Garbage, LlmClient, LlmError};
use crate::domain::SessionId;
use crate::history::{Format, Options};
use crate::metrics::Metrics;
use crate::store::{Store, StoreError, SummaryWrite};
use crate::telemetry;
use crate::tokens::{Encoding, SummaryTokens};
use crate::turn::now_millis;

/// The most text of turns one fold sends to the model: a long backlog is
/// folded over several runs, oldest first.
pub const FOLD_BYTES: u64 = 256 * 1024;
/// Turns read a call while gathering a fold.
const PAGE_TURNS: usize = 256;
/// The lock outlives the longest model call by this.
const LOCK_MARGIN: Duration = Duration::from_secs(30);

/// When and how to summarize, from the settings.
pub struct Plan {
    /// The history a prompt gets by default: what it leaves out is folded.
    pub history: Options,
    pub after_tokens: u32,
    pub concurrency: usize,
    pub encoding: Encoding,
    /// A summary may take this many tokens of a default history
    /// (`TURNSTORE_SUMMARY_SHARE`), as its `text` block or its message.
    pub max_summary_tokens: u32,
}

pub struct Summarizer {
    llm: LlmClient,
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
    plan: Plan,
    slots: Arc<Semaphore>,
    /// Sessions this instance is summarizing now, and whether a write came
    /// meanwhile (look again).
    busy: Mutex<HashMap<SessionId, bool>>,
}

/// What a default history leaves unsummarized: the turns after `covered`
/// through `through`, of this generation of the session.
struct Backlog {
    covered: u64,
    through: u64,
    generation: String,
}

/// How a run ended, for the metrics.
enum Outcome {
    /// Nothing to fold (below the threshold, or none).
    Nothing,
    /// Under the lock, nothing left to fold: another run folded it.
    Folded,
    Written {
        turns: u64,
        tokens: u64,
    },
    /// Another writer came first.
    Conflict,
    /// Another instance holds the session's lock.
    Locked,
}

enum Failure {
    Llm(LlmError),
    Store(StoreError),
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        Failure::Store(e)
    }
}

impl Summarizer {
    pub fn new(llm: LlmClient, store: Arc<dyn Store>, metrics: Arc<Metrics>, plan: Plan) -> Self {
        Summarizer {
            llm,
            store,
            metrics,
            slots: Arc::new(Semaphore::new(plan.concurrency)),
            plan,
            busy: Mutex::new(HashMap::new()),
        }
    }

    /// A finalize or an import wrote to `session`: maybe summarize it, in
    /// the background.
    pub fn wrote(self: &Arc<Self>, session: SessionId) {
        let mut busy = self.busy();
        if let Some(again) = busy.get_mut(&session) {
            *again = true;
            return;
        }
        let Ok(slot) = self.slots.clone().try_acquire_owned() else {
            return; // a later write will ask again
        };
        busy.insert(session.clone(), false);
        drop(busy);
        let me = self.clone();
        let work = async move {
            loop {
                let began = Instant::now();
                let result = me.run(&session).await;
                // Held the lock: look again now that it is free.
                let held = matches!(
                    result,
                    Ok(Outcome::Written { .. } | Outcome::Folded | Outcome::Conflict)
                );
                me.account(result, began);
                let mut busy = me.busy();
                let written_meanwhile = busy.get_mut(&session).is_some_and(std::mem::take);
                if !held && !written_meanwhile {
                    busy.remove(&session);
                    break;
                }
            }
            drop(slot);
        };
        if telemetry::on() {
            tokio::spawn(work.instrument(telemetry::summarize_span()));
        } else {
            tokio::spawn(work);
        }
    }

    fn busy(&self) -> std::sync::MutexGuard<'_, HashMap<SessionId, bool>> {
        self.busy.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn account(&self, result: Result<Outcome, Failure>, began: Instant) {
        let seconds = began.elapsed().as_secs_f64();
        let (outcome, failure) = match result {
            Ok(Outcome::Nothing | Outcome::Folded) => return,
            Ok(Outcome::Written { turns, tokens }) => {
                self.metrics.folded(turns, tokens);
                ("written", None)
            }
            Ok(Outcome::Conflict) => ("conflict", None),
            Ok(Outcome::Locked) => ("locked", None),
            Err(Failure::Llm(e)) => {
                tracing::warn!(kind = e.kind(), error = %e, "a summarization failed");
                ("failed", Some(e.kind()))
            }
            Err(Failure::Store(e)) => {
                tracing::warn!(error = %e, "a summarization failed: store");
                ("failed", Some("store"))
            }
        };
        self.metrics.summarized(outcome, failure, seconds);
    }

    /// The finalized turns after the summary that a default history leaves
    /// out, if they are worth folding.
    async fn backlog(&self, session: &SessionId) -> Result<Option<Backlog>, StoreError> {
        let h = self
            .store
            .history(session, &self.plan.history, now_millis())
            .await?;
        let Some(generation) = h.generation else {
            return Ok(None);
        };
        Ok(h.unsummarized
            .filter(|u| u.tokens.is_some_and(|t| t >= self.plan.after_tokens))
            .map(|u| Backlog {
                covered: u.after_seq,
                through: u.through_seq,
                generation,
            }))
    }

    async fn run(&self, session: &SessionId) -> Result<Outcome, Failure> {
        if self.backlog(session).await?.is_none() {
            return Ok(Outcome::Nothing);
        }
        let token = uuid::Uuid::new_v4().to_string();
        let ttl = self.llm.max_duration() + LOCK_MARGIN;
        if !self.store.lock_summarizing(session, &token, ttl).await? {
            return Ok(Outcome::Locked);
        }
        let folded = self.fold(session).await;
        // Released whatever happened; else it expires by itself.
        let _ = self.store.unlock_summarizing(session, &token).await;
        folded
    }

    /// Under the lock: read what is left to fold (another instance may have
    /// folded since), fold the oldest of it, write the result.
    async fn fold(&self, session: &SessionId) -> Result<Outcome, Failure> {
        let Some(Backlog {
            covered,
            through,
            generation,
        }) = self.backlog(session).await?
        else {
            return Ok(Outcome::Folded);
        };
        let previous = self.store.summary(session).await?;
        let mut turns = Vec::new();
        let (mut after, mut bytes) = (covered, 0u64);
        'pages: while after < through {
            let page = self
                .store
                .turns_page(session, after, PAGE_TURNS, FOLD_BYTES)
                .await?;
            if page.is_empty() {
                break;
            }
            for t in page {
                if t.seq > through || (!turns.is_empty() && bytes >= FOLD_BYTES) {
                    break 'pages;
                }
                bytes += (t.user_query.len() + t.final_answer.len()) as u64;
                after = t.seq;
                turns.push((t.user_query, t.final_answer));
            }
        }
        if turns.is_empty() {
            // Deleted meanwhile: stop rather than look again.
            return Ok(Outcome::Nothing);
        }
        let summary = self
            .llm
            .summarize(previous.as_ref().map(|p| p.text.as_str()), &turns)
            .await
            .map_err(Failure::Llm)?;
        let tokens = self.tokens_of(session, covered, after).await?;
        let encoding = self.plan.encoding;
        let text = summary.text;
        let counted = text.clone();
        let counts = crate::tokens::apart(move || SummaryTokens::count(encoding, &counted)).await;
        // A summary a default history cannot hold with turns beside it
        // would crowd them out, and then be folded into again and again.
        // (What it takes in the format it takes most in.)
        let takes = Format::ALL
            .iter()
            .map(|f| f.prelude(&text, &counts).alone)
            .max()
            .unwrap_or(counts.alone);
        if takes > self.plan.max_summary_tokens {
            return Err(Failure::Llm(LlmError::Garbage(Garbage::OverBudget {
                tokens: takes,
                max: self.plan.max_summary_tokens,
            })));
        }
        let written = self
            .store
            .put_summary(SummaryWrite {
                session_id: session,
                user_id: None,
                text: &text,
                through_seq: after,
                expected_through_seq: Some(covered),
                // What was read and folded is this generation's: a session
                // cleared (or erased) and started again since gets none of it.
                expected_generation: Some(&generation),
                tokens: &counts,
                now: now_millis(),
            })
            .await;
        match written {
            Ok(_) => Ok(Outcome::Written {
                turns: turns.len() as u64,
                tokens,
            }),
            Err(
                StoreError::SummaryConflict { .. }
                | StoreError::SessionReplaced
                | StoreError::SummaryBeyond { .. }
                | StoreError::SummaryOverPending { .. },
            ) => Ok(Outcome::Conflict),
            Err(e) => Err(e.into()),
        }
    }

    /// The tokens of the `text` blocks of the turns `(after, through]`, as
    /// prompts counted them (stored counts: nothing is tokenized).
    async fn tokens_of(
        &self,
        session: &SessionId,
        after: u64,
        through: u64,
    ) -> Result<u64, StoreError> {
        let range = Options {
            after_seq: after,
            through_seq: through,
            ..Options::everything(self.plan.encoding)
        };
        let h = self.store.history(session, &range, now_millis()).await?;
        let header = if h.selection.turns.is_empty() {
            0
        } else {
            self.plan.encoding.header_count()
        };
        Ok(u64::from(h.selection.token_count.saturating_sub(header)))
    }
}
