//! One storage trait, two backends: `memory` (the default) and `redis`.
//! Handlers only ever talk to `dyn Store`; the same HTTP suite runs on each.

mod memory;
mod metered;
pub mod redis;

use std::time::Duration;

use async_trait::async_trait;

pub use self::memory::MemoryStore;
pub use self::metered::Metered;
pub use self::redis::RedisStore;
use crate::domain::{IdempotencyKey, SessionId, TurnId, UserId};
use crate::turn::{Finalization, FinalizedTurn, Millis, NewPendingTurn, PendingTurn};

/// Lifetimes and bounds every backend enforces.
#[derive(Debug, Clone)]
pub struct Limits {
    pub session_ttl: Duration,
    pub pending_ttl: Duration,
    pub max_turns: u32,
}

/// Which finalized turns a read needs: the budget picks among them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// How many of the most recent finalized turns.
    pub limit: usize,
    /// Also the session's first (oldest kept) turn.
    pub keep_first: bool,
}

#[derive(Debug)]
pub struct StartTurn<'a> {
    pub session_id: &'a SessionId,
    pub user_id: Option<&'a UserId>,
    pub turn: NewPendingTurn<'a>,
    /// The key and a hash of the request it came with.
    pub idempotency: Option<(&'a IdempotencyKey, &'a str)>,
    /// Read the history (as it stood before this turn) in the same operation.
    pub window: Option<Window>,
    pub now: Millis,
}

#[derive(Debug)]
pub struct Started {
    /// The session's owner, if it has one.
    pub user_id: Option<String>,
    pub turn: PendingTurn,
    /// An earlier start with the same idempotency key and request made this turn.
    pub replayed: bool,
    pub history: Option<StoredHistory>,
}

/// The finalized turns a rendering chooses from.
#[derive(Debug, Default)]
pub struct StoredHistory {
    pub user_id: Option<String>,
    pub total_turns: u64,
    pub pending_turns: u64,
    /// At most `Window::limit` turns, newest first.
    pub newest_first: Vec<FinalizedTurn>,
    /// With `Window::keep_first`: the oldest kept turn.
    pub first: Option<FinalizedTurn>,
}

#[derive(Debug)]
pub enum Finalized {
    /// This call finalized it.
    Now(FinalizedTurn),
    /// It was already final; the caller compares the answers.
    Already(FinalizedTurn),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionInfo {
    pub user_id: Option<String>,
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

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("the session belongs to another user")]
    OwnerMismatch,
    #[error("the idempotency key was used with another request")]
    IdempotencyKeyReused,
    #[error("no such pending or finalized turn")]
    TurnNotFound,
    /// The store did not answer in time or refused the connection.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The store answered with something this version cannot read.
    #[error("unreadable store data: {0}")]
    Corrupt(String),
}

#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Allocates the next `seq`, checks the owner and the idempotency key,
    /// writes the pending turn, slides the TTL and reads the history before
    /// the turn: all or nothing.
    async fn start_turn(&self, req: StartTurn<'_>) -> Result<Started, StoreError>;

    /// Moves a live pending turn into the history at its `seq`, slides the
    /// TTL and trims to `max_turns`.
    async fn finalize_turn(
        &self,
        session: &SessionId,
        turn: TurnId,
        end: &Finalization,
    ) -> Result<Finalized, StoreError>;

    /// Removes a pending or finalized turn; `TurnNotFound` if neither.
    async fn delete_turn(&self, session: &SessionId, turn: TurnId) -> Result<(), StoreError>;

    /// Reads without extending the TTL. An unknown session reads as empty.
    async fn history(
        &self,
        session: &SessionId,
        window: Window,
        now: Millis,
    ) -> Result<StoredHistory, StoreError>;

    async fn session_info(
        &self,
        session: &SessionId,
        now: Millis,
    ) -> Result<Option<SessionInfo>, StoreError>;

    /// Deletes the session; fine if it does not exist.
    async fn clear_session(&self, session: &SessionId) -> Result<(), StoreError>;

    /// Live sessions of a user, most recently active first.
    async fn user_sessions(
        &self,
        user: &UserId,
        now: Millis,
    ) -> Result<Vec<SessionSummary>, StoreError>;

    /// Deletes every session of a user; returns how many there were.
    async fn erase_user(&self, user: &UserId) -> Result<u64, StoreError>;

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

/// How long a user index entry may go without a refresh: the index key
/// outlives each of its sessions by this much, so it never expires first.
pub(crate) fn index_refresh_interval(limits: &Limits) -> Duration {
    (limits.session_ttl / 4).min(Duration::from_secs(24 * 3600))
}

/// Orders a user's sessions for listing: most recently active first.
pub(crate) fn most_recent_first(sessions: &mut [SessionSummary]) {
    sessions
        .sort_by(|a, b| (b.last_active_at, &b.session_id).cmp(&(a.last_active_at, &a.session_id)));
}
