//! The in-memory store: one process, same rules as Redis, TTLs included.
//! Expired data is invisible at once and swept in the background.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use async_trait::async_trait;
use prometheus_client::metrics::counter::Counter;
use tokio::time::Instant;

use super::{
    CountsIn, ERASE_BATCH, EXAMINED_PER_LISTED, Erased, Finalized, Import, Imported, Limits,
    MAX_WAITING, Pace, SessionInfo, SessionSummary, SessionsPage, StartTurn, Started, Store,
    StoreError, StoredHistory, StoredSummary, SummaryWrite, Unreturned, Unsummarized, moves_to_top,
    next_index_time,
};
use crate::domain::{SessionId, TurnId, UserId};
use crate::history::{Candidate, Content, Copies, Format, Options};
use crate::store::counting::{self, offer_all};
use crate::turn::{Finalization, FinalizedTurn, Millis, PendingTurn, TurnView};

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

/// What an idempotency key made: a start's turn (the key goes with it), or
/// an import's turns (the key lives as long as the session).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyUse {
    Start(TurnId),
    Import { first: u64, last: u64 },
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

    /// What a read of the history as it stood before `before_seq` needs:
    /// the candidates a selection can look at, newest first, copied out.
    /// It can take at most `limit` turns and `max_bytes` bytes as rendered,
    /// and looks at one candidate past what it takes; so the copy stops
    /// there, bounded by what the read returns, not by what is stored.
    fn gather(&self, read: &Options, before_seq: u64, now: Instant) -> Gathered {
        let summary = self.summary.as_ref().filter(|_| read.summary);
        let lo = read
            .after_seq
            .max(summary.map_or(0, |s| s.through_seq))
            .saturating_add(1);
        let hi = read.through_seq.min(before_seq.saturating_sub(1));
        let whole = lo <= 1
            && self
                .finalized
                .last_key_value()
                .is_none_or(|(s, _)| *s <= hi);
        let mut g = Gathered {
            user_id: self.user_id.as_ref().map(|u| u.to_string()),
            generation: Some(self.generation.clone()),
            pending_turns: self
                .live_pending(now)
                .filter(|(p, _)| p.seq < before_seq)
                .count() as u64,
            summary: summary.cloned(),
            covered: self.summary.as_ref().map_or(0, |s| s.through_seq),
            before_seq,
            pending: self.oldest_pending(now),
            ..Gathered::default()
        };
        if lo > hi {
            return g;
        }
        let mut range = self.finalized.range(lo..=hi);
        g.total_turns = if whole {
            self.finalized.len()
        } else {
            range.clone().count()
        } as u64;
        if read.keep_first {
            g.first = range.next().map(|(_, t)| candidate(t, read));
        }
        let mut bytes = summary.map_or(0, |s| s.text.len() as u64);
        for (_, t) in range.rev() {
            if g.newest_first.len() > read.limit || bytes > read.max_bytes {
                break;
            }
            let c = candidate(t, read);
            bytes += (rendered_at_least(&c.user_query, read.max_query_chars)
                + rendered_at_least(&c.final_answer, read.max_answer_chars))
                as u64;
            g.newest_first.push(c);
        }
        g
    }
}

/// A read's share of a session, taken under the lock; selected (and
/// counted, off the async workers) once the lock is released.
#[derive(Default)]
struct Gathered {
    user_id: Option<String>,
    generation: Option<String>,
    total_turns: u64,
    pending_turns: u64,
    /// The summary the read begins with, if it asks and there is one.
    summary: Option<StoredSummary>,
    /// What the stored summary covers (0: none).
    covered: u64,
    before_seq: u64,
    /// The oldest live pending turn's seq.
    pending: Option<u64>,
    first: Option<Candidate>,
    newest_first: Vec<Candidate>,
}

impl Gathered {
    async fn select(
        self,
        session: &SessionId,
        read: &Options,
    ) -> Result<(StoredHistory, Unreturned), StoreError> {
        let mut sel = counting::begin(
            read,
            session.as_str(),
            self.user_id.as_deref(),
            self.summary.as_ref(),
        )
        .await?;
        if !sel.is_stopped() {
            sel = offer_all(sel, self.first, self.newest_first).await;
        }
        let picked = sel.finish()?;
        let selection = picked.selection;
        let unreturned = Unreturned::of(
            &selection,
            read,
            self.covered,
            self.before_seq,
            self.pending,
        );
        let history = StoredHistory {
            user_id: self.user_id,
            total_turns: self.total_turns,
            pending_turns: self.pending_turns,
            summary: self.summary.filter(|_| selection.summary),
            rendered: picked.rendered,
            unsummarized: None,
            selection,
            generation: self.generation,
        };
        Ok((history, unreturned))
    }
}

impl Session {
    /// The turns of `u` (see `Unreturned`): how many, and their tokens
    /// under the read's encoding and language when every turn of the
    /// session is counted in that encoding (as Redis decides from its
    /// sums); `None` when there are none.
    fn unsummarized(&self, u: Unreturned, read: &Options) -> Option<Unsummarized> {
        if u.is_empty() {
            return None;
        }
        let turns = self
            .finalized
            .range(u.covered + 1..u.below)
            .filter(|(seq, _)| Some(**seq) != u.skip)
            .map(|(_, t)| t);
        let newest = turns.clone().next_back()?;
        let costs = |t: &FinalizedTurn| {
            if read.english {
                t.english_costs()
            } else {
                t.costs()
            }
        };
        let waiting = self.finalized.range(u.below..u.returned_from).count() as u64;
        let summed = self.counts_in == CountsIn::One(read.encoding) && waiting <= MAX_WAITING;
        let tokens = summed.then(|| {
            let inner: u64 = turns
                .clone()
                .map(|t| {
                    let c = costs(t);
                    u64::from(c.query.user_line) + u64::from(c.answer.assistant_sep)
                })
                .sum();
            let last = costs(newest).answer;
            inner - u64::from(last.assistant_sep) + u64::from(last.assistant_last)
        });
        Some(Unsummarized {
            after_seq: u.covered,
            through_seq: newest.seq(),
            turns: turns.count() as u64,
            tokens: tokens.and_then(|t| u32::try_from(t).ok()),
        })
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

/// Bytes a content takes at least as rendered: a cut keeps `max_chars`
/// characters (and adds the mark), of a byte or more each.
fn rendered_at_least(c: &Content, max_chars: Option<usize>) -> usize {
    max_chars.map_or(c.text.len(), |m| c.text.len().min(m))
}

/// A stored turn as a read sees it: no more of its contents than it needs;
/// with `lang=en`, the English copies where it has them; in a `turns`
/// read, the copies beside the texts (with `lang=en`, beside themselves).
fn candidate(t: &FinalizedTurn, read: &Options) -> Candidate {
    let (q_max, a_max) = (read.max_query_chars, read.max_answer_chars);
    let (query, answer, costs) = if read.english {
        let (query, answer) = t.english_texts();
        (query, answer, t.english_costs())
    } else {
        (
            t.start.user_query.as_str(),
            t.end.final_answer.as_str(),
            t.costs(),
        )
    };
    let copy = |e: Option<&String>, max| e.map(|e| Content::for_read(e, max));
    let copies = match read.format {
        Format::Turns => Copies {
            user_query: copy(t.start.english.as_ref().map(|e| &e.text), q_max),
            final_answer: copy(t.end.english.as_ref().map(|e| &e.text), a_max),
        },
        Format::Text | Format::Messages => Copies::default(),
    };
    Candidate {
        turn_id: t.start.turn_id,
        seq: t.seq(),
        started_at: t.start.started_at,
        finalized_at: t.end.finalized_at,
        user_query: Content::for_read(query, q_max),
        final_answer: Content::for_read(answer, a_max),
        costs,
        recount: false,
        copies,
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

    /// A start's writes and checks, under the lock; the history it
    /// returns is selected after.
    fn start_locked(&self, req: &StartTurn<'_>) -> Result<(Started, Option<Gathered>), StoreError> {
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
            && s.live_pending(now).count() >= self.limits.max_pending as usize
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
        let claim = session.user_id.is_none() && req.user_id.is_some();
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

    /// Selects what a read gathered, then describes what it leaves
    /// unsummarized (under the lock again: turns it did not copy).
    async fn select(
        &self,
        session: &SessionId,
        g: Gathered,
        read: &Options,
    ) -> Result<StoredHistory, StoreError> {
        let (mut history, unreturned) = g.select(session, read).await?;
        history.unsummarized = self
            .lock()
            .live(session, Instant::now())
            .and_then(|s| s.unsummarized(unreturned, read));
        Ok(history)
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
        let needed = now.saturating_add(super::ms(self.limits.index_needed()));
        let written = claim || session.indexed_until < needed;
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
        while s.finalized.len() > self.limits.max_turns as usize {
            if let Some((_, old)) = s.finalized.pop_first() {
                s.finalized_seq.remove(&old.start.turn_id);
                s.forget_key(old.start.idempotency_key.as_deref(), old.start.turn_id);
            }
        }
        s.last_active_at = end.finalized_at;
        s.expires = now + self.limits.session_ttl;
        Ok(Finalized::Now(view))
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
            expires_at: now_ms + super::ms(s.expires - now),
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
        if let Some(s) = state.live(req.session_id, now) {
            if let (Some(owner), Some(user)) = (&s.user_id, req.user_id)
                && owner != user
            {
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
        let claim = session.user_id.is_none() && req.user_id.is_some();
        if claim {
            session.user_id = req.user_id.cloned();
        }
        self.index_active(&mut state.users, session, req.session_id, claim, req.now);
        let first = session.next_seq + 1;
        for t in req.turns {
            session.next_seq += 1;
            let done = FinalizedTurn {
                start: PendingTurn {
                    seq: session.next_seq,
                    turn_id: t.turn_id,
                    user_query: t.user_query.clone(),
                    started_at: req.now,
                    idempotency_key: None,
                    tokens: t.query_tokens,
                    english: None,
                },
                end: Finalization {
                    final_answer: t.final_answer.clone(),
                    finalized_at: req.now,
                    tokens: t.answer_tokens,
                    english: None,
                },
            };
            session.counts_in = session.counts_in.add(&done.costs(), false);
            session.finalized_seq.insert(t.turn_id, done.seq());
            session.finalized.insert(done.seq(), done);
        }
        let last = session.next_seq;
        while session.finalized.len() > self.limits.max_turns as usize {
            if let Some((_, old)) = session.finalized.pop_first() {
                session.finalized_seq.remove(&old.start.turn_id);
                session.forget_key(old.start.idempotency_key.as_deref(), old.start.turn_id);
            }
        }
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
        if let (Some(owner), Some(user)) = (&s.user_id, w.user_id)
            && owner != user
        {
            return Err(StoreError::OwnerMismatch);
        }
        let stored = s.summary.as_ref().map_or(0, |s| s.through_seq);
        if w.expected_through_seq.is_some_and(|e| e != stored) || w.through_seq < stored {
            return Err(StoreError::SummaryConflict { stored });
        }
        let newest = s.finalized.last_key_value().map_or(0, |(seq, _)| *seq);
        if w.through_seq > newest {
            return Err(StoreError::SummaryBeyond { newest });
        }
        if let Some(pending) = s.oldest_pending(now)
            && w.through_seq >= pending
        {
            return Err(StoreError::SummaryOverPending { pending });
        }
        // The session lives on: its owner's index entry must reach as far.
        let needed = w.now.saturating_add(super::ms(self.limits.index_needed()));
        if let Some(owner) = s.user_id.clone()
            && s.indexed_until < needed
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
