//! The in-memory store's `Store` operations, each under the lock (a
//! read's selection after it, see `read`).

use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::read::Gathered;
use super::{KeyUse, MemoryStore, Session};
use crate::domain::{SessionId, TurnId, UserId};
use crate::history::Options;
use crate::store::rules::{self, Access};
use crate::store::{
    CountsIn, ERASE_BATCH, EXAMINED_PER_LISTED, Erased, Finalized, Fork, Forked, Import, Imported,
    Pace, SessionInfo, SessionSummary, SessionsPage, StartTurn, Started, Store, StoreError,
    StoredHistory, StoredSummary, SummaryWrite, next_index_time,
};
use crate::turn::{Finalization, FinalizedTurn, Millis, PendingTurn, TurnView};

impl MemoryStore {
    /// A start's writes and checks, under the lock; the history it
    /// returns is selected after.
    fn start_locked(&self, req: &StartTurn<'_>) -> Result<(Started, Option<Gathered>), StoreError> {
        let now = Instant::now();
        let mut state = self.lock();
        let state = &mut *state;
        let existing = state.live(req.session_id, now);

        let owner = existing
            .as_ref()
            .and_then(|s| s.user_id.as_ref().map(UserId::as_str));
        let access = rules::access(owner, req.user_id.map(UserId::as_str));
        if access == Access::Mismatch {
            return Err(StoreError::OwnerMismatch);
        }
        if let (Some(s), Some((key, hash))) = (&existing, req.idempotency)
            && let Some((made, stored_hash)) = s.idempotency.get(key.as_str())
        {
            let KeyUse::Start(turn) = made else {
                return Err(StoreError::IdempotencyKeyReused);
            };
            if stored_hash != hash {
                return Err(StoreError::IdempotencyKeyReused);
            }
            if let Some(turn) = s.find(*turn, now) {
                let history = req.history.map(|read| s.gather(read, turn.seq, now));
                let started = Started {
                    user_id: s.user_id.as_ref().map(|u| u.to_string()),
                    turn_id: turn.turn_id,
                    seq: turn.seq,
                    started_at: turn.started_at,
                    replayed: true,
                    history: None,
                };
                return Ok((started, history));
            }
        }
        if let Some(s) = &existing
            && rules::pending_full(
                s.live_pending(now).count() as u64,
                u64::from(self.limits.max_pending),
            )
        {
            let oldest = s.live_pending(now).map(|(_, d)| d).min().unwrap_or(now);
            return Err(StoreError::TooManyPendingTurns {
                retry_after: oldest - now,
            });
        }

        let session = state
            .sessions
            .entry(req.session_id.clone())
            .or_insert_with(|| Session::new(req.now, now, *req.turn.turn_id));
        self.expired_pending.inc_by(session.purge_pending(now));
        let claim = access == Access::Claim;
        if claim {
            session.user_id = req.user_id.cloned();
        }
        self.index_active(&mut state.users, session, req.session_id, claim, req.now);
        session.next_seq += 1;
        let turn = req.turn.with_seq(session.next_seq);
        let history = req.history.map(|read| session.gather(read, turn.seq, now));
        let (turn_id, seq, started_at) = (turn.turn_id, turn.seq, turn.started_at);
        session
            .pending
            .insert(turn_id, (turn, now + self.limits.pending_ttl));
        if let Some((key, hash)) = req.idempotency {
            session
                .idempotency
                .insert(key.to_string(), (KeyUse::Start(turn_id), hash.to_owned()));
        }
        session.last_active_at = req.now;
        session.expires = now + self.limits.session_ttl;
        let started = Started {
            user_id: session.user_id.as_ref().map(|u| u.to_string()),
            turn_id,
            seq,
            started_at,
            replayed: false,
            history: None,
        };
        Ok((started, history))
    }
}

#[async_trait]
impl Store for MemoryStore {
    async fn start_turn(&self, req: StartTurn<'_>) -> Result<Started, StoreError> {
        let (mut started, gathered) = self.start_locked(&req)?;
        if let (Some(g), Some(read)) = (gathered, req.history) {
            match self.select(req.session_id, g, read).await {
                Ok(h) => started.history = Some(h),
                Err(e) => {
                    // A template failed on the history: the start leaves nothing.
                    if !started.replayed {
                        let _ = self.delete_turn(req.session_id, started.turn_id).await;
                    }
                    return Err(e);
                }
            }
        }
        Ok(started)
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
            return Ok(Finalized::Already(done.view()));
        }
        self.expired_pending.inc_by(s.purge_pending(now));
        let (start, _) = s.pending.remove(&turn).ok_or(StoreError::TurnNotFound)?;
        let done = FinalizedTurn {
            start,
            end: end.clone(),
        };
        let view = done.view();
        s.counts_in = s.counts_in.add(&done.costs(), false);
        s.finalized_seq.insert(turn, done.seq());
        s.finalized.insert(done.seq(), done);
        s.trim(self.limits.max_turns);
        s.last_active_at = end.finalized_at;
        s.expires = now + self.limits.session_ttl;
        Ok(Finalized::Now(view))
    }

    async fn regenerate(
        &self,
        session: &SessionId,
        turn: TurnId,
        end: &Finalization,
    ) -> Result<TurnView, StoreError> {
        let now = Instant::now();
        let mut state = self.lock();
        let s = state.live(session, now).ok_or(StoreError::TurnNotFound)?;
        self.expired_pending.inc_by(s.purge_pending(now));
        if s.pending.contains_key(&turn) {
            return Err(StoreError::TurnPending);
        }
        let seq = *s.finalized_seq.get(&turn).ok_or(StoreError::TurnNotFound)?;
        if let Some(through) = s.summary.as_ref().map(|x| x.through_seq)
            && seq <= through
        {
            return Err(StoreError::TurnSummarized { through });
        }
        let t = s.finalized.get_mut(&seq).ok_or(StoreError::TurnNotFound)?;
        t.end = end.clone();
        let (view, costs) = (t.view(), t.costs());
        s.counts_in = s.counts_in.add(&costs, false);
        s.last_active_at = end.finalized_at;
        s.expires = now + self.limits.session_ttl;
        Ok(view)
    }

    async fn fork(&self, req: Fork<'_>) -> Result<Forked, StoreError> {
        let now = Instant::now();
        let mut state = self.lock();
        let state = &mut *state;
        if let Some(t) = state.live(req.target, now) {
            let made = req
                .idempotency
                .and_then(|(key, hash)| Some((t.idempotency.get(key.as_str())?, hash)));
            return match made {
                Some((
                    (
                        KeyUse::Fork {
                            through,
                            turns,
                            summary,
                        },
                        stored,
                    ),
                    hash,
                )) if stored == hash => Ok(Forked {
                    user_id: t.user_id.as_ref().map(|u| u.to_string()),
                    through_seq: *through,
                    turns: *turns,
                    summary: *summary,
                    replayed: true,
                }),
                Some(_) => Err(StoreError::IdempotencyKeyReused),
                None => Err(StoreError::SessionExists { busy: None }),
            };
        }
        let source = state
            .live(req.source, now)
            .ok_or(StoreError::SessionNotFound)?;
        let access = rules::access(
            source.user_id.as_ref().map(UserId::as_str),
            req.user_id.map(UserId::as_str),
        );
        if access == Access::Mismatch {
            return Err(StoreError::OwnerMismatch);
        }
        let newest = source.finalized.keys().next_back().copied().unwrap_or(0);
        let through = req.through_seq.unwrap_or(newest);
        if through > newest {
            return Err(StoreError::ForkBeyond { newest });
        }
        match source.finalized.keys().next() {
            Some(&oldest) if oldest <= through => {}
            oldest => {
                return Err(StoreError::ForkEmpty {
                    oldest: oldest.copied().unwrap_or(0),
                });
            }
        }
        let turns: Vec<FinalizedTurn> = source
            .finalized
            .range(..=through)
            .map(|(_, t)| t.clone())
            .collect();
        let summary = source.summary.clone().filter(|s| s.through_seq <= through);
        let owner = source.user_id.clone().or_else(|| req.user_id.cloned());
        let mut fork = Session::new(req.now, now, req.generation);
        fork.user_id = owner;
        fork.next_seq = through;
        let made = Forked {
            user_id: fork.user_id.as_ref().map(|u| u.to_string()),
            through_seq: through,
            turns: turns.len() as u64,
            summary: summary.is_some(),
            replayed: false,
        };
        fork.summary = summary;
        for t in turns {
            fork.counts_in = fork.counts_in.add(&t.costs(), false);
            fork.finalized_seq.insert(t.start.turn_id, t.seq());
            fork.finalized.insert(t.seq(), t);
        }
        if let Some((key, hash)) = req.idempotency {
            let used = KeyUse::Fork {
                through,
                turns: made.turns,
                summary: made.summary,
            };
            fork.idempotency
                .insert(key.to_string(), (used, hash.to_owned()));
        }
        fork.expires = now + self.limits.session_ttl;
        self.index_active(&mut state.users, &mut fork, req.target, true, req.now);
        state.sessions.insert(req.target.clone(), fork);
        Ok(made)
    }

    async fn delete_turn(&self, session: &SessionId, turn: TurnId) -> Result<(), StoreError> {
        let now = Instant::now();
        let mut state = self.lock();
        let s = state.live(session, now).ok_or(StoreError::TurnNotFound)?;
        self.expired_pending.inc_by(s.purge_pending(now));
        let key = if let Some((p, _)) = s.pending.remove(&turn) {
            p.idempotency_key
        } else if let Some(seq) = s.finalized_seq.remove(&turn) {
            let key = s
                .finalized
                .remove(&seq)
                .and_then(|t| t.start.idempotency_key);
            if s.finalized.is_empty() {
                s.counts_in = CountsIn::Nothing;
            }
            key
        } else {
            return Err(StoreError::TurnNotFound);
        };
        s.forget_key(key.as_deref(), turn);
        Ok(())
    }

    async fn history(
        &self,
        session: &SessionId,
        read: &Options,
        _now: Millis,
    ) -> Result<StoredHistory, StoreError> {
        let now = Instant::now();
        let gathered = match self.lock().live(session, now) {
            Some(s) => s.gather(read, u64::MAX, now),
            None => Gathered::default(),
        };
        self.select(session, gathered, read).await
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
            generation: s.generation.clone(),
            created_at: s.created_at,
            last_active_at: s.last_active_at,
            expires_at: now_ms + crate::store::ms(s.expires - now),
            turn_count: s.finalized.len() as u64,
            pending_count: s.live_pending(now).count() as u64,
        }))
    }

    async fn clear_session(&self, session: &SessionId) -> Result<(), StoreError> {
        let mut state = self.lock();
        if let Some(s) = state.sessions.remove(session)
            && let Some(user) = s.user_id
            && let Some(index) = state.users.get_mut(&user)
        {
            index.remove(session);
        }
        Ok(())
    }

    async fn user_sessions(
        &self,
        user: &UserId,
        limit: usize,
        cursor: Option<Millis>,
        _now: Millis,
    ) -> Result<SessionsPage, StoreError> {
        let now = Instant::now();
        let mut state = self.lock();
        let state = &mut *state;
        let Some(index) = state.users.get(user) else {
            return Ok(SessionsPage {
                sessions: Vec::new(),
                next_cursor: None,
            });
        };
        let below = cursor.unwrap_or(Millis::MAX);
        let entries: Vec<(Millis, SessionId)> = index
            .by_time
            .range(..below)
            .rev()
            .take(limit.max(1) * EXAMINED_PER_LISTED)
            .map(|(t, s)| (*t, s.clone()))
            .collect();
        let mut sessions = Vec::new();
        let mut last = None;
        let mut dead = Vec::new();
        for (time, id) in entries {
            if sessions.len() == limit {
                break;
            }
            last = Some(time);
            match state.live(&id, now) {
                Some(s) if s.user_id.as_ref() == Some(user) => sessions.push(SessionSummary {
                    session_id: id.to_string(),
                    last_active_at: s.last_active_at,
                    turn_count: s.finalized.len() as u64,
                }),
                _ => dead.push(id),
            }
        }
        let index = state.users.entry(user.clone()).or_default();
        for id in &dead {
            index.remove(id);
        }
        let next_cursor = last.filter(|t| index.by_time.range(..*t).next().is_some());
        Ok(SessionsPage {
            sessions,
            next_cursor,
        })
    }

    async fn erase_user(&self, user: &UserId, budget: Duration) -> Result<Erased, StoreError> {
        let mut pace = Pace::new(budget);
        let mut deleted_sessions = 0;
        let mut below = Millis::MAX;
        loop {
            let now = Instant::now();
            {
                let mut state = self.lock();
                let batch: Vec<(Millis, SessionId)> = match state.users.get(user) {
                    None => Vec::new(),
                    Some(index) => index
                        .by_time
                        .range(..below)
                        .rev()
                        .take(ERASE_BATCH)
                        .map(|(t, s)| (*t, s.clone()))
                        .collect(),
                };
                for (_, id) in &batch {
                    if state.is_owned_by(id, user, now) {
                        state.sessions.remove(id);
                        deleted_sessions += 1;
                    }
                    if let Some(index) = state.users.get_mut(user) {
                        index.remove(id);
                    }
                }
                match batch.last() {
                    Some((last, _)) if batch.len() == ERASE_BATCH => below = *last,
                    _ => break,
                }
            }
            if !pace.another() {
                return Ok(Erased {
                    deleted_sessions,
                    complete: false,
                });
            }
            tokio::task::yield_now().await;
        }
        let mut state = self.lock();
        if state.users.get(user).is_some_and(|i| i.by_time.is_empty()) {
            state.users.remove(user);
        }
        Ok(Erased {
            deleted_sessions,
            complete: true,
        })
    }

    async fn turns_page(
        &self,
        session: &SessionId,
        after_seq: u64,
        max_turns: usize,
        max_bytes: u64,
    ) -> Result<Vec<TurnView>, StoreError> {
        let now = Instant::now();
        let mut state = self.lock();
        let Some(s) = state.live(session, now) else {
            return Ok(Vec::new());
        };
        let mut bytes = 0u64;
        let mut out = Vec::new();
        for (_, t) in s.finalized.range(after_seq.saturating_add(1)..) {
            let size = turn_bytes(t);
            if out.len() == max_turns || (!out.is_empty() && bytes + size > max_bytes) {
                break;
            }
            bytes += size;
            out.push(t.view());
        }
        Ok(out)
    }

    async fn import(&self, req: Import<'_>) -> Result<Imported, StoreError> {
        let now = Instant::now();
        let mut state = self.lock();
        let state = &mut *state;
        // What the import does to a new session, or to the live one.
        let mut access = rules::access(None, req.user_id.map(UserId::as_str));
        if let Some(s) = state.live(req.session_id, now) {
            access = rules::access(
                s.user_id.as_ref().map(UserId::as_str),
                req.user_id.map(UserId::as_str),
            );
            if access == Access::Mismatch {
                return Err(StoreError::OwnerMismatch);
            }
            if let Some((key, hash)) = req.idempotency
                && let Some((made, stored_hash)) = s.idempotency.get(key.as_str())
            {
                return match made {
                    KeyUse::Import { first, last } if stored_hash == hash => Ok(Imported {
                        user_id: s.user_id.as_ref().map(|u| u.to_string()),
                        first_seq: *first,
                        last_seq: *last,
                        replayed: true,
                    }),
                    _ => Err(StoreError::IdempotencyKeyReused),
                };
            }
        }
        let Some(creator) = req.turns.first().map(|t| t.turn_id) else {
            return Err(StoreError::Corrupt("an import without turns".into()));
        };
        let session = state
            .sessions
            .entry(req.session_id.clone())
            .or_insert_with(|| Session::new(req.now, now, creator));
        let claim = access == Access::Claim;
        if claim {
            session.user_id = req.user_id.cloned();
        }
        self.index_active(&mut state.users, session, req.session_id, claim, req.now);
        let first = session.next_seq + 1;
        for t in req.turns {
            session.next_seq += 1;
            let (started_at, finalized_at) = t.times.unwrap_or((req.now, req.now));
            let done = FinalizedTurn {
                start: PendingTurn {
                    seq: session.next_seq,
                    turn_id: t.turn_id,
                    user_query: t.user_query.clone(),
                    started_at,
                    idempotency_key: None,
                    tokens: t.query_tokens,
                    english: None,
                },
                end: Finalization {
                    final_answer: t.final_answer.clone(),
                    finalized_at,
                    tokens: t.answer_tokens,
                    english: None,
                },
            };
            session.counts_in = session.counts_in.add(&done.costs(), false);
            session.finalized_seq.insert(t.turn_id, done.seq());
            session.finalized.insert(done.seq(), done);
        }
        let last = session.next_seq;
        session.trim(self.limits.max_turns);
        if let Some((key, hash)) = req.idempotency {
            session.idempotency.insert(
                key.to_string(),
                (KeyUse::Import { first, last }, hash.to_owned()),
            );
        }
        session.last_active_at = req.now;
        session.expires = now + self.limits.session_ttl;
        Ok(Imported {
            user_id: session.user_id.as_ref().map(|u| u.to_string()),
            first_seq: first,
            last_seq: last,
            replayed: false,
        })
    }

    async fn lock_summarizing(
        &self,
        session: &SessionId,
        token: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let now = Instant::now();
        let mut state = self.lock();
        state.locks.retain(|_, (_, until)| *until > now);
        if state.locks.contains_key(session) {
            return Ok(false);
        }
        state
            .locks
            .insert(session.clone(), (token.to_owned(), now + ttl));
        Ok(true)
    }

    async fn unlock_summarizing(&self, session: &SessionId, token: &str) -> Result<(), StoreError> {
        let mut state = self.lock();
        if state.locks.get(session).is_some_and(|(t, _)| t == token) {
            state.locks.remove(session);
        }
        Ok(())
    }

    async fn put_summary(&self, w: SummaryWrite<'_>) -> Result<StoredSummary, StoreError> {
        let now = Instant::now();
        let mut state = self.lock();
        let state = &mut *state;
        let s = state.live(w.session_id, now);
        if let Some(read) = w.expected_generation
            && s.as_ref().is_none_or(|s| s.generation != read)
        {
            return Err(StoreError::SessionReplaced);
        }
        let Some(s) = s else {
            return Err(StoreError::SummaryBeyond { newest: 0 });
        };
        if rules::access(
            s.user_id.as_ref().map(UserId::as_str),
            w.user_id.map(UserId::as_str),
        ) == Access::Mismatch
        {
            return Err(StoreError::OwnerMismatch);
        }
        rules::summary_check(
            s.summary.as_ref().map_or(0, |s| s.through_seq),
            w.expected_through_seq,
            w.through_seq,
            s.finalized.last_key_value().map_or(0, |(seq, _)| *seq),
            s.oldest_pending(now),
        )?;
        // The session lives on: its owner's index entry must reach as far.
        if let Some(owner) = s.user_id.clone()
            && rules::index_due(false, s.indexed_until, w.now, self.limits.index_needed())
        {
            let index = state.users.entry(owner.clone()).or_default();
            let top = index.by_time.last_key_value().map(|(t, _)| *t);
            let time = next_index_time(w.now, self.limits.index_horizon(), top, 0);
            index.put(w.session_id, time);
            if let Some(s) = state.sessions.get_mut(w.session_id) {
                s.indexed_until = time;
            }
        }
        let Some(s) = state.sessions.get_mut(w.session_id) else {
            return Err(StoreError::SummaryBeyond { newest: 0 });
        };
        let summary = StoredSummary {
            text: w.text.to_owned(),
            through_seq: w.through_seq,
            updated_at: w.now,
            tokens: *w.tokens,
        };
        s.summary = Some(summary.clone());
        s.expires = now + self.limits.session_ttl;
        Ok(summary)
    }

    async fn summary(&self, session: &SessionId) -> Result<Option<StoredSummary>, StoreError> {
        let now = Instant::now();
        Ok(self
            .lock()
            .live(session, now)
            .and_then(|s| s.summary.clone()))
    }

    async fn delete_summary(&self, session: &SessionId) -> Result<(), StoreError> {
        let now = Instant::now();
        if let Some(s) = self.lock().live(session, now) {
            s.summary = None;
        }
        Ok(())
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

/// A turn's texts, copies included: what an export page counts.
fn turn_bytes(t: &FinalizedTurn) -> u64 {
    let copy = |e: Option<&String>| e.map_or(0, String::len);
    (t.start.user_query.len()
        + t.end.final_answer.len()
        + copy(t.start.english.as_ref().map(|e| &e.text))
        + copy(t.end.english.as_ref().map(|e| &e.text))) as u64
}
