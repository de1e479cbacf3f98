//! The in-memory store: one process, same rules as Redis, TTLs included.
//! Expired data is invisible at once and swept in the background.
//!
//! Here: the store's state (its sessions and their rules, the owners'
//! indexes, the sweep). `read`: what a read copies out of a session under
//! the lock, and selects once it is released. `store`: the `Store`
//! operations.

mod read;
mod store;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use tokio::time::Instant;

use super::rules;
use super::{CountsIn, Limits, StoredSummary, moves_to_top, next_index_time};
use crate::domain::{SessionId, TurnId, UserId};
use crate::turn::{FinalizedTurn, Millis, PendingTurn};

#[derive(Clone)]
pub struct MemoryStore {
    state: Arc<Mutex<State>>,
    limits: Limits,
    expired_pending: Counter,
}

#[derive(Default)]
struct State {
    sessions: HashMap<SessionId, Session>,
    /// Summarizer locks: holder's token and until when.
    locks: HashMap<SessionId, (String, Instant)>,
    /// Each user's index: what Redis keeps in its user keys.
    users: HashMap<UserId, UserIndex>,
}

/// A user's sessions by the time their entry reaches until (unique per
/// user, see `next_index_time`); entries of dead sessions are dropped when
/// seen.
#[derive(Default)]
struct UserIndex {
    by_time: BTreeMap<Millis, SessionId>,
    time_of: HashMap<SessionId, Millis>,
}

impl UserIndex {
    fn put(&mut self, session: &SessionId, time: Millis) {
        self.remove(session);
        self.by_time.insert(time, session.clone());
        self.time_of.insert(session.clone(), time);
    }

    fn remove(&mut self, session: &SessionId) {
        if let Some(t) = self.time_of.remove(session) {
            self.by_time.remove(&t);
        }
    }
}

/// What an idempotency key made: a start's turn (the key goes with it), an
/// import's turns or a fork (the key lives as long as the session).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyUse {
    Start(TurnId),
    Import {
        first: u64,
        last: u64,
    },
    Fork {
        through: u64,
        turns: u64,
        summary: bool,
    },
}

struct Session {
    user_id: Option<UserId>,
    /// The id of the turn that created it, as Redis keeps it (`g`).
    generation: String,
    created_at: Millis,
    last_active_at: Millis,
    expires: Instant,
    next_seq: u64,
    finalized: BTreeMap<u64, FinalizedTurn>,
    finalized_seq: HashMap<TurnId, u64>,
    pending: HashMap<TurnId, (PendingTurn, Instant)>,
    /// key -> (what it made, request hash)
    idempotency: HashMap<String, (KeyUse, String)>,
    /// How long the owner's index entry reaches (`Limits::index_needed`).
    indexed_until: Millis,
    /// When a start or import last moved the entry to the top (`ia` in Redis).
    moved_at: Millis,
    summary: Option<StoredSummary>,
    /// The encoding the finalized turns' counts are in (as Redis tracks it).
    counts_in: CountsIn,
}

impl Session {
    /// `first`: the turn that creates it (its id names the generation).
    fn new(created_at: Millis, now: Instant, first: TurnId) -> Self {
        Session {
            user_id: None,
            generation: first.to_string(),
            created_at,
            last_active_at: created_at,
            expires: now,
            next_seq: 0,
            finalized: BTreeMap::new(),
            finalized_seq: HashMap::new(),
            pending: HashMap::new(),
            idempotency: HashMap::new(),
            indexed_until: 0,
            moved_at: 0,
            summary: None,
            counts_in: CountsIn::Nothing,
        }
    }

    /// Drops expired pending turns; returns how many.
    fn purge_pending(&mut self, now: Instant) -> u64 {
        let expired: Vec<TurnId> = self
            .pending
            .iter()
            .filter(|(_, (_, deadline))| *deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in &expired {
            if let Some((p, _)) = self.pending.remove(id) {
                self.forget_key(p.idempotency_key.as_deref(), *id);
            }
        }
        expired.len() as u64
    }

    /// Drops the oldest finalized turns past `max_turns`.
    fn trim(&mut self, max_turns: u32) {
        let excess = rules::excess_turns(self.finalized.len() as u64, u64::from(max_turns));
        for _ in 0..excess {
            if let Some((_, old)) = self.finalized.pop_first() {
                self.finalized_seq.remove(&old.start.turn_id);
                self.forget_key(old.start.idempotency_key.as_deref(), old.start.turn_id);
            }
        }
    }

    fn forget_key(&mut self, key: Option<&str>, turn: TurnId) {
        if let Some(key) = key
            && self
                .idempotency
                .get(key)
                .is_some_and(|(t, _)| *t == KeyUse::Start(turn))
        {
            self.idempotency.remove(key);
        }
    }

    fn live_pending(&self, now: Instant) -> impl Iterator<Item = (&PendingTurn, Instant)> {
        self.pending
            .values()
            .filter(move |(_, d)| *d > now)
            .map(|(p, d)| (p, *d))
    }

    /// The oldest live pending turn's seq: a summary may not cover it.
    fn oldest_pending(&self, now: Instant) -> Option<u64> {
        self.live_pending(now).map(|(p, _)| p.seq).min()
    }

    fn find(&self, turn: TurnId, now: Instant) -> Option<PendingTurn> {
        match self.pending.get(&turn) {
            Some((p, deadline)) if *deadline > now => Some(p.clone()),
            _ => self
                .finalized_seq
                .get(&turn)
                .and_then(|seq| self.finalized.get(seq))
                .map(|f| f.start.clone()),
        }
    }
}

impl State {
    /// The session if it is alive; an expired one is dropped on sight.
    fn live(&mut self, id: &SessionId, now: Instant) -> Option<&mut Session> {
        if self.sessions.get(id).is_some_and(|s| s.expires <= now) {
            self.sessions.remove(id);
        }
        self.sessions.get_mut(id)
    }

    fn is_owned_by(&mut self, id: &SessionId, user: &UserId, now: Instant) -> bool {
        self.live(id, now)
            .is_some_and(|s| s.user_id.as_ref() == Some(user))
    }

    /// Drops expired sessions and pending turns, and the index entries of
    /// dead sessions; returns how many pending turns expired.
    fn sweep(&mut self, now: Instant) -> u64 {
        self.sessions.retain(|_, s| s.expires > now);
        let expired = self
            .sessions
            .values_mut()
            .map(|s| s.purge_pending(now))
            .sum();
        let sessions = &self.sessions;
        self.users.retain(|user, index| {
            let dead: Vec<SessionId> = index
                .time_of
                .keys()
                .filter(|id| {
                    sessions
                        .get(*id)
                        .is_none_or(|s| s.user_id.as_ref() != Some(user))
                })
                .cloned()
                .collect();
            for id in &dead {
                index.remove(id);
            }
            !index.by_time.is_empty()
        });
        expired
    }
}

impl MemoryStore {
    /// Must be called inside a Tokio runtime: it spawns the sweeper, which
    /// stops by itself once the store is dropped.
    pub fn new(limits: Limits, expired_pending: Counter) -> Self {
        let store = MemoryStore {
            state: Arc::default(),
            limits,
            expired_pending: expired_pending.clone(),
        };
        let every = (store.limits.pending_ttl / 2)
            .clamp(Duration::from_millis(100), Duration::from_secs(10));
        tokio::spawn(sweep(Arc::downgrade(&store.state), every, expired_pending));
        store
    }

    /// A start or import of an owned session: writes the owner's index
    /// entry when the session is claimed or outlives it (`claim`, or
    /// `indexed_until` too short), else moves it to the top (see
    /// `moves_to_top`), as the Redis store does in two slots.
    fn index_active(
        &self,
        users: &mut HashMap<UserId, UserIndex>,
        session: &mut Session,
        id: &SessionId,
        claim: bool,
        now: Millis,
    ) {
        let Some(owner) = &session.user_id else {
            return;
        };
        let written = rules::index_due(
            claim,
            session.indexed_until,
            now,
            self.limits.index_needed(),
        );
        let moved = moves_to_top(written, session.moved_at, now);
        if !written && !moved {
            return;
        }
        session.moved_at = now;
        let index = users.entry(owner.clone()).or_default();
        if moved && !index.time_of.contains_key(id) {
            return; // a move keeps an entry removed meanwhile removed
        }
        let top = index.by_time.last_key_value();
        if moved && top.is_some_and(|(_, s)| s == id) {
            return;
        }
        let top = top.map(|(t, _)| *t);
        let time = next_index_time(now, self.limits.index_horizon(), top, 0);
        index.put(id, time);
        if written {
            session.indexed_until = time;
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves no half-written session:
        // every operation below mutates only after all its checks.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

async fn sweep(state: Weak<Mutex<State>>, every: Duration, expired_pending: Counter) {
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        let Some(state) = state.upgrade() else { return };
        let expired = state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .sweep(Instant::now());
        expired_pending.inc_by(expired);
    }
}
