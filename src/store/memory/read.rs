//! Reads: what a read needs of a session, copied out under the lock
//! (`Session::gather`), then selected, and counted off the async workers,
//! once the lock is released (`MemoryStore::select`, which then describes
//! what the read leaves unsummarized).

use tokio::time::Instant;

use super::{MemoryStore, Session};
use crate::domain::SessionId;
use crate::history::{Candidate, Content, Copies, Options};
use crate::store::counting::{self, offer_all};
use crate::store::{
    CountsIn, MAX_WAITING, StoreError, StoredHistory, StoredSummary, Unreturned, Unsummarized,
};
use crate::turn::FinalizedTurn;

impl Session {
    /// What a read of the history as it stood before `before_seq` needs:
    /// the candidates a selection can look at, newest first, copied out.
    /// It can take at most `limit` turns and `max_bytes` bytes as rendered,
    /// and looks at one candidate past what it takes; so the copy stops
    /// there, bounded by what the read returns, not by what is stored.
    pub(super) fn gather(&self, read: &Options, before_seq: u64, now: Instant) -> Gathered {
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
pub(super) struct Gathered {
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
    let copies = if read.format.shows_copies() {
        Copies {
            user_query: copy(t.start.english.as_ref().map(|e| &e.text), q_max),
            final_answer: copy(t.end.english.as_ref().map(|e| &e.text), a_max),
        }
    } else {
        Copies::default()
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

impl MemoryStore {
    /// Selects what a read gathered, then describes what it leaves
    /// unsummarized (under the lock again: turns it did not copy).
    pub(super) async fn select(
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
}
