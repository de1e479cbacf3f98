//! One storage trait, two backends: `memory` (the default) and `redis`.
//! Handlers only ever talk to `dyn Store`; the same HTTP suite runs on each,
//! and a property test runs random operations on both and compares them.

pub(crate) mod counting;
mod memory;
mod metered;
pub mod redis;
pub mod rules;

use std::time::Duration;

use async_trait::async_trait;

pub use self::memory::MemoryStore;
pub use self::metered::Metered;
pub use self::redis::RedisStore;
pub use self::rules::{MOVE_EVERY, moves_to_top, next_index_time};
use crate::domain::{IdempotencyKey, SessionId, TurnId, UserId};
use crate::history::{Options, Selection};
use crate::tokens::{Encoding, SummaryTokens, TurnCosts};
use crate::turn::{Finalization, Millis, NewPendingTurn, TurnView};

/// Lifetimes and bounds every backend enforces.
#[derive(Debug, Clone)]
pub struct Limits {
    pub session_ttl: Duration,
    pub pending_ttl: Duration,
    pub max_turns: u32,
    /// Live pending turns per session; one more start is refused.
    pub max_pending: u32,
}

/// Clock skew between instances that user-index times tolerate.
pub(crate) const INDEX_SKEW: Duration = Duration::from_secs(5 * 60);

impl Limits {
    /// How far past a start an owned session's user-index entry must
    /// reach: the session can live `session_ttl` past a finalize, which
    /// can come `pending_ttl` after the start.
    pub fn index_needed(&self) -> Duration {
        self.session_ttl + self.pending_ttl + INDEX_SKEW
    }

    /// How far past its write an index entry reaches: more than needed, so
    /// that an active session rewrites its entry only every so often.
    pub fn index_horizon(&self) -> Duration {
        self.index_needed() + (self.session_ttl / 4).min(Duration::from_secs(24 * 3600))
    }
}

/// A page of a listing examines at most this many index entries per
/// session it may return, so that entries of dead sessions (cleaned as they
/// are met) cannot make one request long.
pub const EXAMINED_PER_LISTED: usize = 10;

/// Index entries an erasure reads, and sessions it deletes, per round.
pub const ERASE_BATCH: usize = 1000;

/// Paces work done in rounds (an erasure) within a time budget: after each
/// round, another starts only if one twice as long as the longest so far
/// would still end in time.
pub(crate) struct Pace {
    deadline: tokio::time::Instant,
    round_began: tokio::time::Instant,
    longest: Duration,
}

impl Pace {
    pub(crate) fn new(budget: Duration) -> Self {
        let now = tokio::time::Instant::now();
        Pace {
            deadline: now + budget,
            round_began: now,
            longest: Duration::ZERO,
        }
    }

    /// A round is done: may another start?
    pub(crate) fn another(&mut self) -> bool {
        let now = tokio::time::Instant::now();
        self.longest = self.longest.max(now - self.round_began);
        self.round_began = now;
        now + 2 * self.longest < self.deadline
    }
}

pub(crate) fn ms(d: Duration) -> Millis {
    Millis::try_from(d.as_millis()).unwrap_or(Millis::MAX)
}

#[derive(Debug)]
pub struct StartTurn<'a> {
    pub session_id: &'a SessionId,
    pub user_id: Option<&'a UserId>,
    pub turn: NewPendingTurn<'a>,
    /// The key and a hash of the request it came with.
    pub idempotency: Option<(&'a IdempotencyKey, &'a str)>,
    /// Read the history (as it stood before this turn) in the same operation.
    pub history: Option<&'a Options>,
    /// The store may save a round trip for a session id it knows to be new.
    pub new_session: bool,
    pub now: Millis,
}

#[derive(Debug)]
pub struct Started {
    /// The session's owner, if it has one.
    pub user_id: Option<String>,
    pub turn_id: TurnId,
    pub seq: u64,
    pub started_at: Millis,
    /// An earlier start with the same idempotency key and request made this turn.
    pub replayed: bool,
    pub history: Option<StoredHistory>,
}

/// A history read: the selection and what the response says around it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct StoredHistory {
    pub user_id: Option<String>,
    /// Finalized turns among the candidates (in the read's seq range).
    pub total_turns: u64,
    pub pending_turns: u64,
    pub selection: Selection,
    /// The summary the rendering begins with (`selection.summary`).
    pub summary: Option<StoredSummary>,
    /// A template's rendering of the selection (`Options::template`).
    pub rendered: Option<String>,
    /// The finalized turns neither returned nor covered by the summary.
    pub unsummarized: Option<Unsummarized>,
    /// The session's generation (see `SessionInfo::generation`); `None`
    /// when there is no such session.
    pub generation: Option<String>,
}

/// A session's rolling summary, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredSummary {
    pub text: String,
    /// It covers every turn with `seq <= through_seq`.
    pub through_seq: u64,
    pub updated_at: Millis,
    pub tokens: SummaryTokens,
}

/// An import: finalized turns appended from a transcript, all or nothing.
#[derive(Debug)]
pub struct Import<'a> {
    pub session_id: &'a SessionId,
    pub user_id: Option<&'a UserId>,
    /// Oldest first; their ids made by the caller.
    pub turns: &'a [ImportedTurn],
    /// The key and a hash of the request it came with.
    pub idempotency: Option<(&'a IdempotencyKey, &'a str)>,
    pub now: Millis,
}

/// A fork: a new session made of the finalized turns of another up to a
/// seq, with its summary when that covers no turn past it.
#[derive(Debug, Clone)]
pub struct Fork<'a> {
    pub source: &'a SessionId,
    pub target: &'a SessionId,
    /// The newest seq copied (1 or more); `None`: the newest finalized
    /// turn's.
    pub through_seq: Option<u64>,
    /// Checked against the source's owner as a write's is; the fork's
    /// owner is the source's, or this user's when the source has none.
    pub user_id: Option<&'a UserId>,
    /// The key and a hash of the request it came with.
    pub idempotency: Option<(&'a IdempotencyKey, &'a str)>,
    /// The new session's generation: a turn id made for it.
    pub generation: TurnId,
    pub now: Millis,
}

/// What a fork made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forked {
    pub user_id: Option<String>,
    pub through_seq: u64,
    /// The finalized turns copied.
    pub turns: u64,
    /// The summary came along.
    pub summary: bool,
    /// An earlier fork with the same idempotency key and request made it.
    pub replayed: bool,
}

impl Forked {
    /// As an idempotency key's record keeps it: `fork:<through> <turns> <0|1>`.
    pub fn record(&self) -> String {
        format!(
            "fork:{} {} {}",
            self.through_seq,
            self.turns,
            u8::from(self.summary)
        )
    }

    /// The record `record` wrote, and the request hash after it.
    pub fn parse(record: &str) -> Option<(Forked, &str)> {
        let rest = record.strip_prefix("fork:")?;
        let mut parts = rest.splitn(4, ' ');
        let through_seq = parts.next()?.parse().ok()?;
        let turns = parts.next()?.parse().ok()?;
        let summary = parts.next()? == "1";
        let hash = parts.next()?;
        Some((
            Forked {
                user_id: None,
                through_seq,
                turns,
                summary,
                replayed: true,
            },
            hash,
        ))
    }
}

/// A turn of an import, counted.
#[derive(Debug, Clone)]
pub struct ImportedTurn {
    pub turn_id: TurnId,
    pub user_query: String,
    pub final_answer: String,
    pub query_tokens: crate::tokens::QueryTokens,
    pub answer_tokens: crate::tokens::AnswerTokens,
    /// When it was started and finalized, as the transcript says; `None`:
    /// at the import's `now`.
    pub times: Option<(Millis, Millis)>,
}

impl ImportedTurn {
    pub fn costs(&self) -> TurnCosts {
        TurnCosts::new(
            &self.user_query,
            self.query_tokens,
            &self.final_answer,
            self.answer_tokens,
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Imported {
    /// The session's owner, if it has one.
    pub user_id: Option<String>,
    pub first_seq: u64,
    pub last_seq: u64,
    /// An earlier import with the same idempotency key and request made these.
    pub replayed: bool,
}

/// A summary write (`PUT .../summary`).
#[derive(Debug)]
pub struct SummaryWrite<'a> {
    pub session_id: &'a SessionId,
    /// Checked against the owner; a write does not claim a session.
    pub user_id: Option<&'a UserId>,
    pub text: &'a str,
    pub through_seq: u64,
    /// Write only if the stored summary covers exactly this (0: none yet).
    pub expected_through_seq: Option<u64>,
    /// Write only to this generation of the session (the one the writer
    /// read), not to a session cleared or erased since and started again.
    pub expected_generation: Option<&'a str>,
    pub tokens: &'a SummaryTokens,
    pub now: Millis,
}

/// What a history does not show and no summary covers: the finalized
/// turns with `after_seq < seq <= through_seq` (but the one `keep_first`
/// returns): how many, and the tokens of their `text` blocks in the read's
/// encoding (`None` when counting them would take more than a read may).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unsummarized {
    pub after_seq: u64,
    pub through_seq: u64,
    pub turns: u64,
    pub tokens: Option<u32>,
}

/// The encoding the counts of every finalized turn of a session are in, as
/// both stores track it (Redis: the letter of the sums, `ts`): a read in
/// that encoding can sum stored counts for what it does not return.
/// `Several` sticks until the session holds no finalized turn.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum CountsIn {
    #[default]
    Nothing,
    One(Encoding),
    Several,
}

impl CountsIn {
    /// After a turn with these costs is finalized.
    pub fn add(self, costs: &TurnCosts, retired: bool) -> Self {
        let one = (costs.query.encoding == costs.answer.encoding && !retired)
            .then_some(costs.query.encoding);
        match (self, one) {
            (CountsIn::Nothing, Some(e)) => CountsIn::One(e),
            (CountsIn::One(a), Some(b)) if a == b => self,
            _ => CountsIn::Several,
        }
    }
}

/// With more finalized turns than this after the oldest pending turn, a
/// read does not sum the tokens it leaves unsummarized (`MAX_WAITING` in
/// `lua/common.lua`): the sum would cost a walk over them.
pub const MAX_WAITING: u64 = 256;

/// Where the unsummarized turns of a read lie: above what the summary
/// covers, below the newest run the read returned (or its upper bound when
/// it returned none) and below the oldest pending turn (a summary may not
/// cover it), but the reserved first turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Unreturned {
    pub covered: u64,
    pub below: u64,
    pub skip: Option<u64>,
    /// Where the turns the read returned begin (`below`, unless a pending
    /// turn is older): those in `below..returned_from` wait for it.
    pub returned_from: u64,
}

impl Unreturned {
    /// `covered`: the stored summary's `through_seq` (0: none);
    /// `before_seq`: a start's own seq (`u64::MAX` for a history read);
    /// `pending`: the oldest live pending turn's seq.
    pub fn of(
        selection: &Selection,
        read: &Options,
        covered: u64,
        before_seq: u64,
        pending: Option<u64>,
    ) -> Self {
        let turns = &selection.turns;
        let (first, run) = match turns.split_first() {
            Some((f, rest)) if read.keep_first => (Some(f.turn.seq), rest),
            _ => (None, &turns[..]),
        };
        let upper = read.through_seq.min(before_seq.saturating_sub(1));
        let returned_from = run.first().map_or(upper.saturating_add(1), |t| t.turn.seq);
        let below = pending.map_or(returned_from, |p| p.min(returned_from));
        Unreturned {
            covered,
            below,
            skip: first.filter(|f| *f > covered && *f < below),
            returned_from,
        }
    }

    /// Whether no finalized turn can lie in the range.
    pub fn is_empty(&self) -> bool {
        self.below <= self.covered.saturating_add(1)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finalized {
    /// This call finalized it.
    Now(TurnView),
    /// It was already final; the caller compares the answers.
    Already(TurnView),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionInfo {
    pub user_id: Option<String>,
    /// Names this incarnation of the session id: a session cleared,
    /// erased or expired and then started again has another. Opaque.
    pub generation: String,
    pub created_at: Millis,
    pub last_active_at: Millis,
    pub expires_at: Millis,
    pub turn_count: u64,
    pub pending_count: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionSummary {
    pub session_id: String,
    pub last_active_at: Millis,
    pub turn_count: u64,
}

/// One page of a user's sessions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionsPage {
    pub sessions: Vec<SessionSummary>,
    /// Where the next page starts; `None` after the last.
    pub next_cursor: Option<Millis>,
}

/// What one erasure call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Erased {
    pub deleted_sessions: u64,
    /// Every session of the user that existed when the call began is gone.
    pub complete: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("the session belongs to another user")]
    OwnerMismatch,
    #[error("the idempotency key was used with another request")]
    IdempotencyKeyReused,
    #[error("no such pending or finalized turn")]
    TurnNotFound,
    /// No live session has this id (a fork's source).
    #[error("no such session")]
    SessionNotFound,
    /// A session has this id already (a fork's target), or another fork
    /// into it is under way (`busy`: try again after this).
    #[error("the session exists")]
    SessionExists { busy: Option<Duration> },
    /// A fork through a seq past the newest finalized turn.
    #[error("the newest finalized turn is {newest}")]
    ForkBeyond { newest: u64 },
    /// A fork through a seq below the oldest turn kept: nothing to copy.
    #[error("the oldest finalized turn is {oldest}")]
    ForkEmpty { oldest: u64 },
    /// The turn is pending: there is no answer to replace.
    #[error("the turn is pending")]
    TurnPending,
    /// The summary covers the turn (through `through`).
    #[error("the summary covers the turn (through seq {through})")]
    TurnSummarized { through: u64 },
    /// The session holds `Limits::max_pending` live pending turns.
    #[error("too many pending turns")]
    TooManyPendingTurns {
        /// Until the oldest of them expires.
        retry_after: Duration,
    },
    /// The store could not serve the call: why, in words safe to show
    /// an operator (never the store's own text, which is logged).
    #[error("store unavailable: {}", .0.said)]
    Unavailable(Outage),
    /// The store answered with something this version cannot read.
    #[error("unreadable store data: {0}")]
    Corrupt(String),
    /// The stored summary covers `stored` turns, not what the write
    /// expected, or more than it would.
    #[error("the stored summary covers through seq {stored}")]
    SummaryConflict { stored: u64 },
    /// The session is not the generation the summary writer read: it was
    /// cleared, erased or expired since (and perhaps started again).
    #[error("the session was replaced since it was read")]
    SessionReplaced,
    /// The summary would cover turns past the newest finalized one.
    #[error("the newest finalized turn is {newest}")]
    SummaryBeyond { newest: u64 },
    /// The summary would cover a turn that is still pending (which may yet
    /// be finalized, and would then be in neither the summary nor a
    /// history).
    #[error("turn {pending} is pending")]
    SummaryOverPending { pending: u64 },
    /// The read's template failed while rendering.
    #[error("template: {0}")]
    Template(#[from] crate::history::template::TemplateError),
}

/// Why the store could not serve a call: its class (what a client is
/// told, and the metrics' label) and what was found, for an operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outage {
    pub class: OutageClass,
    /// Our words, never the store's own text (which may quote data), nor
    /// a URL (which may hold a password).
    pub said: String,
}

impl Outage {
    pub fn new(class: OutageClass, said: impl Into<String>) -> Self {
        Outage {
            class,
            said: said.into(),
        }
    }
}

/// The classes of store failures a client can act on alike (retry later)
/// and an operator apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutageClass {
    /// No answer within `TURNSTORE_STORE_TIMEOUT`.
    Timeout,
    /// No connection: refused, reset, an unknown host, a TLS failure.
    Unreachable,
    /// The store refused the credentials (or a permission).
    Auth,
    /// The store is out of memory and refuses writes.
    OutOfMemory,
    /// The store answers but serves no commands now: loading, read-only,
    /// failing over, busy.
    NotServing,
    /// Other writers kept changing what the call depends on (a user's
    /// index); a retry is likely to pass.
    Contended,
    /// The stored data's layout is not this version's.
    Layout,
    /// Another error from the store.
    Other,
}

impl OutageClass {
    /// The metrics' label.
    pub fn label(self) -> &'static str {
        match self {
            OutageClass::Timeout => "timeout",
            OutageClass::Unreachable => "unreachable",
            OutageClass::Auth => "auth",
            OutageClass::OutOfMemory => "out_of_memory",
            OutageClass::NotServing => "not_serving",
            OutageClass::Contended => "contended",
            OutageClass::Layout => "layout",
            OutageClass::Other => "other",
        }
    }

    /// What a client is told (a 503's detail).
    pub fn detail(self) -> &'static str {
        match self {
            OutageClass::Timeout => {
                "the store did not answer in time (a write may still be applied: retry a start or an import with its Idempotency-Key); retry later"
            }
            OutageClass::Unreachable => "the store cannot be reached; retry later",
            OutageClass::Auth => "the store refused this service's credentials; retry later",
            OutageClass::OutOfMemory => {
                "the store is out of memory and refuses writes; nothing was written; retry later"
            }
            OutageClass::NotServing => {
                "the store is not serving now (loading, read-only, failing over or busy); retry later"
            }
            OutageClass::Contended => "concurrent writes kept changing the user's index; retry",
            OutageClass::Layout => {
                "the store's data is in a layout this version does not serve; retry later"
            }
            OutageClass::Other => "the store answered with an error; retry later",
        }
    }
}

#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Allocates the next `seq`, checks the owner, the idempotency key and
    /// the pending cap, writes the pending turn, slides the TTL and reads the
    /// history before the turn: all or nothing.
    async fn start_turn(&self, req: StartTurn<'_>) -> Result<Started, StoreError>;

    /// Moves a live pending turn into the history at its `seq`, slides the
    /// TTL and trims to `max_turns`.
    async fn finalize_turn(
        &self,
        session: &SessionId,
        turn: TurnId,
        end: &Finalization,
    ) -> Result<Finalized, StoreError>;

    /// Replaces the answer of a finalized turn (`end`: the new answer, its
    /// counts, English copy and time), keeping its seq, question and the
    /// question's English copy; slides the TTL. `TurnNotFound` (no such
    /// turn, or an expired pending one), `TurnPending`, `TurnSummarized`
    /// (the summary covers it).
    async fn regenerate(
        &self,
        session: &SessionId,
        turn: TurnId,
        end: &Finalization,
    ) -> Result<TurnView, StoreError>;

    /// Makes `req.target` a copy of `req.source`'s finalized turns through
    /// a seq (and its summary, when it covers no turn past it), all at
    /// once for a reader: `SessionNotFound`, `OwnerMismatch`,
    /// `SessionExists`, `ForkBeyond`, `ForkEmpty`, `IdempotencyKeyReused`.
    /// Copied a bounded page a call; a source cleared while it is copied
    /// is `SessionNotFound`, and nothing is made.
    async fn fork(&self, req: Fork<'_>) -> Result<Forked, StoreError>;

    /// Removes a pending or finalized turn; `TurnNotFound` if neither.
    async fn delete_turn(&self, session: &SessionId, turn: TurnId) -> Result<(), StoreError>;

    /// Reads without extending the TTL, at a cost bounded by what it
    /// returns. An unknown session reads as empty.
    async fn history(
        &self,
        session: &SessionId,
        read: &Options,
        now: Millis,
    ) -> Result<StoredHistory, StoreError>;

    async fn session_info(
        &self,
        session: &SessionId,
        now: Millis,
    ) -> Result<Option<SessionInfo>, StoreError>;

    /// Deletes the session; fine if it does not exist.
    async fn clear_session(&self, session: &SessionId) -> Result<(), StoreError>;

    /// A page of the user's live sessions, most recently active first,
    /// starting below `cursor`.
    async fn user_sessions(
        &self,
        user: &UserId,
        limit: usize,
        cursor: Option<Millis>,
        now: Millis,
    ) -> Result<SessionsPage, StoreError>;

    /// Deletes the user's sessions, in rounds, as long as another round
    /// fits in `budget` (see `Pace`); a later call continues with what is
    /// left.
    async fn erase_user(&self, user: &UserId, budget: Duration) -> Result<Erased, StoreError>;

    /// The session's finalized turns with `seq > after_seq`, oldest first:
    /// at most `max_turns`, and no more than `max_bytes` of texts (but at
    /// least one turn, whatever its size). An export reads a session so.
    async fn turns_page(
        &self,
        session: &SessionId,
        after_seq: u64,
        max_turns: usize,
        max_bytes: u64,
    ) -> Result<Vec<TurnView>, StoreError>;

    /// Appends finalized turns (see `Import`), checks the owner (a first
    /// owner claims the session) and the idempotency key, trims to
    /// `max_turns`, slides the TTL: all or nothing.
    async fn import(&self, req: Import<'_>) -> Result<Imported, StoreError>;

    /// Takes the session's summarizer lock for `ttl`, if nobody holds it
    /// (`token` names the holder): one summarization a session at a time,
    /// across instances.
    async fn lock_summarizing(
        &self,
        session: &SessionId,
        token: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError>;

    /// Releases the lock, if `token` still holds it.
    async fn unlock_summarizing(&self, session: &SessionId, token: &str) -> Result<(), StoreError>;

    /// Writes the session's summary (see `SummaryWrite`), slides the TTL.
    async fn put_summary(&self, write: SummaryWrite<'_>) -> Result<StoredSummary, StoreError>;

    async fn summary(&self, session: &SessionId) -> Result<Option<StoredSummary>, StoreError>;

    /// Deletes the summary; fine if there is none.
    async fn delete_summary(&self, session: &SessionId) -> Result<(), StoreError>;

    /// Succeeds when the store answers.
    async fn ping(&self) -> Result<(), StoreError>;

    /// Connection pool figures, for stores that have a pool.
    fn pool_status(&self) -> Option<PoolStatus> {
        None
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolStatus {
    pub size: usize,
    pub available: usize,
    pub waiting: usize,
}
