//! The in-memory store: one process, same rules as Redis, TTLs included.
//! Expired data is invisible at once and swept in the background.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use async_trait::async_trait;
use prometheus_client::metrics::counter::Counter;
use tokio::time::Instant;

use super::{
    Finalized, Limits, SessionInfo, SessionSummary, StartTurn, Started, Store, StoreError,
    StoredHistory, Window, most_recent_first,
};
use crate::domain::{SessionId, TurnId, UserId};
use crate::turn::{Finalization, FinalizedTurn, Millis, PendingTurn};

#[derive(Clone)]
pub struct MemoryStore {
    state: Arc<Mutex<State>>,
    limits: Limits,
    expired_pending: Counter,
}

#[derive(Default)]
struct State {
    sessions: HashMap<SessionId, Session>,
    /// Sessions per owner; entries of dead sessions are dropped when seen.
    users: HashMap<UserId, HashSet<SessionId>>,
}

struct Session {
    user_id: Option<UserId>,
    created_at: Millis,
    last_active_at: Millis,
    expires: Instant,
    next_seq: u64,
    finalized: BTreeMap<u64, FinalizedTurn>,
    finalized_seq: HashMap<TurnId, u64>,
    pending: HashMap<TurnId, (PendingTurn, Instant)>,
    /// key -> (turn, request hash)
    idempotency: HashMap<String, (TurnId, String)>,
}

impl Session {
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

    fn forget_key(&mut self, key: Option<&str>, turn: TurnId) {
        if let Some(key) = key
            && self.idempotency.get(key).is_some_and(|(t, _)| *t == turn)
        {
            self.idempotency.remove(key);
        }
    }

    fn live_pending(&self, now: Instant) -> u64 {
        self.pending.values().filter(|(_, d)| *d > now).count() as u64
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

    /// The history as it stood before `before_seq`.
    fn history(&self, window: Window, before_seq: u64, now: Instant) -> StoredHistory {
        let older = self.finalized.range(..before_seq);
        StoredHistory {
            user_id: self.user_id.as_ref().map(|u| u.to_string()),
            total_turns: self.finalized.range(..before_seq).count() as u64,
            pending_turns: self
                .pending
                .values()
                .filter(|(p, d)| *d > now && p.seq < before_seq)
                .count() as u64,
            newest_first: older
                .rev()
                .take(window.limit)
                .map(|(_, t)| t.clone())
                .collect(),
            first: if window.keep_first && window.limit > 0 {
                self.finalized
                    .range(..before_seq)
                    .next()
                    .map(|(_, t)| t.clone())
            } else {
                None
            },
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

    /// Drops expired sessions and pending turns; returns how many pending turns expired.
    fn sweep(&mut self, now: Instant) -> u64 {
        self.sessions.retain(|_, s| s.expires > now);
        let expired = self
            .sessions
            .values_mut()
            .map(|s| s.purge_pending(now))
            .sum();
        let sessions = &self.sessions;
        self.users.retain(|user, ids| {
            ids.retain(|id| {
                sessions
                    .get(id)
                    .is_some_and(|s| s.user_id.as_ref() == Some(user))
            });
            !ids.is_empty()
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

#[async_trait]
impl Store for MemoryStore {
    async fn start_turn(&self, req: StartTurn<'_>) -> Result<Started, StoreError> {
        let now = Instant::now();
        let mut state = self.lock();
        let state = &mut *state;
        let existing = state.live(req.session_id, now);

        if let Some(s) = &existing
            && let (Some(owner), Some(user)) = (&s.user_id, req.user_id)
            && owner != user
        {
            return Err(StoreError::OwnerMismatch);
        }
        if let (Some(s), Some((key, hash))) = (&existing, req.idempotency)
            && let Some((turn, stored_hash)) = s.idempotency.get(key.as_str())
        {
            if stored_hash != hash {
                return Err(StoreError::IdempotencyKeyReused);
            }
            if let Some(turn) = s.find(*turn, now) {
                let history = req.window.map(|w| s.history(w, turn.seq, now));
                return Ok(Started {
                    user_id: s.user_id.as_ref().map(|u| u.to_string()),
                    turn,
                    replayed: true,
                    history,
                });
            }
        }

        let session = state
            .sessions
            .entry(req.session_id.clone())
            .or_insert_with(|| Session {
                user_id: None,
                created_at: req.now,
                last_active_at: req.now,
                expires: now,
                next_seq: 0,
                finalized: BTreeMap::new(),
                finalized_seq: HashMap::new(),
                pending: HashMap::new(),
                idempotency: HashMap::new(),
            });
        self.expired_pending.inc_by(session.purge_pending(now));
        if session.user_id.is_none()
            && let Some(user) = req.user_id
        {
            session.user_id = Some(user.clone());
            state
                .users
                .entry(user.clone())
                .or_default()
                .insert(req.session_id.clone());
        }
        session.next_seq += 1;
        let turn = req.turn.with_seq(session.next_seq);
        let history = req.window.map(|w| session.history(w, turn.seq, now));
        session
            .pending
            .insert(turn.turn_id, (turn.clone(), now + self.limits.pending_ttl));
        if let Some((key, hash)) = req.idempotency {
            session
                .idempotency
                .insert(key.to_string(), (turn.turn_id, hash.to_owned()));
        }
        session.last_active_at = req.now;
        session.expires = now + self.limits.session_ttl;
        Ok(Started {
            user_id: session.user_id.as_ref().map(|u| u.to_string()),
            turn,
            replayed: false,
            history,
        })
    }

    async fn finalize_turn(
        &self,
        session: &SessionId,
        turn: TurnId,
        end: &Finalization,
    ) -> Result<Finalized, StoreError> {
        let now = Instant::now();
        let mut state = self.lock();
        let s = state.live(session, now).ok_or(StoreError::TurnNotFound)?;
        if let Some(done) = s
            .finalized_seq
            .get(&turn)
            .and_then(|seq| s.finalized.get(seq))
        {
            return Ok(Finalized::Already(done.clone()));
        }
        self.expired_pending.inc_by(s.purge_pending(now));
        let (start, _) = s.pending.remove(&turn).ok_or(StoreError::TurnNotFound)?;
        let done = FinalizedTurn {
            start,
            end: end.clone(),
        };
        s.finalized_seq.insert(turn, done.seq());
        s.finalized.insert(done.seq(), done.clone());
        while s.finalized.len() > self.limits.max_turns as usize {
            if let Some((_, old)) = s.finalized.pop_first() {
                s.finalized_seq.remove(&old.start.turn_id);
                s.forget_key(old.start.idempotency_key.as_deref(), old.start.turn_id);
            }
        }
        s.last_active_at = end.finalized_at;
        s.expires = now + self.limits.session_ttl;
        Ok(Finalized::Now(done))
    }

    async fn delete_turn(&self, session: &SessionId, turn: TurnId) -> Result<(), StoreError> {
        let now = Instant::now();
        let mut state = self.lock();
        let s = state.live(session, now).ok_or(StoreError::TurnNotFound)?;
        self.expired_pending.inc_by(s.purge_pending(now));
        let key = if let Some((p, _)) = s.pending.remove(&turn) {
            p.idempotency_key
        } else if let Some(seq) = s.finalized_seq.remove(&turn) {
            s.finalized
                .remove(&seq)
                .and_then(|t| t.start.idempotency_key)
        } else {
            return Err(StoreError::TurnNotFound);
        };
        s.forget_key(key.as_deref(), turn);
        Ok(())
    }

    async fn history(
        &self,
        session: &SessionId,
        window: Window,
        _now: Millis,
    ) -> Result<StoredHistory, StoreError> {
        let now = Instant::now();
        let mut state = self.lock();
        Ok(state
            .live(session, now)
            .map(|s| s.history(window, u64::MAX, now))
            .unwrap_or_default())
    }

    async fn session_info(
        &self,
        session: &SessionId,
        now_ms: Millis,
    ) -> Result<Option<SessionInfo>, StoreError> {
        let now = Instant::now();
        let mut state = self.lock();
        Ok(state.live(session, now).map(|s| SessionInfo {
            user_id: s.user_id.as_ref().map(|u| u.to_string()),
            created_at: s.created_at,
            last_active_at: s.last_active_at,
            expires_at: now_ms + millis(s.expires - now),
            turn_count: s.finalized.len() as u64,
            pending_count: s.live_pending(now),
        }))
    }

    async fn clear_session(&self, session: &SessionId) -> Result<(), StoreError> {
        let mut state = self.lock();
        if let Some(s) = state.sessions.remove(session)
            && let Some(user) = s.user_id
            && let Some(ids) = state.users.get_mut(&user)
        {
            ids.remove(session);
        }
        Ok(())
    }

    async fn user_sessions(
        &self,
        user: &UserId,
        _now: Millis,
    ) -> Result<Vec<SessionSummary>, StoreError> {
        let now = Instant::now();
        let mut state = self.lock();
        let ids: Vec<SessionId> = state
            .users
            .get(user)
            .map(|ids| ids.iter().cloned().collect())
            .unwrap_or_default();
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            match state.live(&id, now) {
                Some(s) if s.user_id.as_ref() == Some(user) => out.push(SessionSummary {
                    session_id: id.to_string(),
                    last_active_at: s.last_active_at,
                    turn_count: s.finalized.len() as u64,
                }),
                _ => {
                    if let Some(ids) = state.users.get_mut(user) {
                        ids.remove(&id);
                    }
                }
            }
        }
        most_recent_first(&mut out);
        Ok(out)
    }

    async fn erase_user(&self, user: &UserId) -> Result<u64, StoreError> {
        let now = Instant::now();
        let mut state = self.lock();
        let ids = state.users.remove(user).unwrap_or_default();
        let mut deleted = 0;
        for id in ids {
            if state
                .live(&id, now)
                .is_some_and(|s| s.user_id.as_ref() == Some(user))
            {
                state.sessions.remove(&id);
                deleted += 1;
            }
        }
        Ok(deleted)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

fn millis(d: Duration) -> Millis {
    Millis::try_from(d.as_millis()).unwrap_or(Millis::MAX)
}
