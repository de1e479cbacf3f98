//! The rules both stores keep, as pure functions. The memory store calls
//! these; each has a Lua twin of the same name in `redis/lua/rules.lua`,
//! which the Redis store's scripts call, and `redis/twins/rules.rs` runs
//! every pair over random inputs and compares their answers. (The budget
//! rule's twin is the walk, `history::select`.)

use std::time::Duration;

use super::{StoreError, ms};
use crate::turn::Millis;

/// What a write by a caller naming `user` (or no one) does to a session
/// owned by `owner` (or no one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Another user's session: refused, nothing changes.
    Mismatch,
    /// An unowned session (or a new one) becomes the caller's.
    Claim,
    /// The owner stays as it is.
    Keep,
}

/// Twin: `access` in `rules.lua`.
pub fn access(owner: Option<&str>, user: Option<&str>) -> Access {
    match (owner, user) {
        (Some(o), Some(u)) if o != u => Access::Mismatch,
        (None, Some(_)) => Access::Claim,
        _ => Access::Keep,
    }
}

/// Whether a write must (re)write the owner's user-index entry first: a
/// claim, or an entry that does not reach `needed` past now (see
/// `Limits::index_needed`). Twin: `index_due`.
pub fn index_due(claim: bool, indexed_until: Millis, now: Millis, needed: Duration) -> bool {
    claim || indexed_until < now.saturating_add(ms(needed))
}

/// The time a user-index entry is written at: where it must reach, but
/// past every other entry of the user (`top`: the latest; times are unique
/// per user, listings page by them) and past `min` (a fence). Twin:
/// `index_time` (index_add.lua).
pub fn index_time(reach: Millis, top: Option<Millis>, min: Millis) -> Millis {
    reach
        .max(top.map_or(Millis::MIN, |t| t.saturating_add(1)))
        .max(min.saturating_add(1))
}

/// A user's sessions are listed and erased in the order of their index
/// entries, each `(time, session)`: the time the entry reaches until, so
/// the most recently written come first (a start or an import writes or
/// moves its entry, see `moves_to_top`).
pub fn next_index_time(now: Millis, horizon: Duration, top: Option<Millis>, min: Millis) -> Millis {
    index_time(now.saturating_add(ms(horizon)), top, min)
}

/// Listings show a user's most recently active sessions first: each start
/// or import moves its session's entry to the top of the owner's index,
/// at most once this often (ms).
pub const MOVE_EVERY: Millis = 1000;

/// Whether a start or import moves the owner's entry to the top, given
/// when it last moved and whether an entry was written for this very call
/// (it is on top already). Twin: `moves_to_top` (used by `activity` in
/// common.lua).
pub fn moves_to_top(written: bool, moved_at: Millis, now: Millis) -> bool {
    !written && now.saturating_sub(moved_at) >= MOVE_EVERY
}

/// Whether a session with `live` pending turns takes no other start
/// (`TURNSTORE_MAX_PENDING_TURNS`). Twin: `pending_full`.
pub fn pending_full(live: u64, cap: u64) -> bool {
    live >= cap
}

/// How many of the oldest finalized turns a write drops to keep at most
/// `max_turns` (the Redis store drops at most `TRIM` a call, and the next
/// calls work a backlog off). Twin: `excess_turns`.
pub fn excess_turns(count: u64, max_turns: u64) -> u64 {
    count.saturating_sub(max_turns)
}

/// The compare-and-set of a summary write through `through`: the summary
/// stored covers up to `stored` (0: none), the writer expected `expected`
/// (if it said), `newest` is the newest finalized seq, `pending` the
/// oldest live pending turn's. A summary moves forward only, covers
/// finalized turns only, and no pending turn (it may yet be finalized).
/// Twin: `summary_check`.
pub fn summary_check(
    stored: u64,
    expected: Option<u64>,
    through: u64,
    newest: u64,
    pending: Option<u64>,
) -> Result<(), StoreError> {
    if expected.is_some_and(|e| e != stored) || through < stored {
        return Err(StoreError::SummaryConflict { stored });
    }
    if through > newest {
        return Err(StoreError::SummaryBeyond { newest });
    }
    match pending {
        Some(pending) if through >= pending => Err(StoreError::SummaryOverPending { pending }),
        _ => Ok(()),
    }
}
