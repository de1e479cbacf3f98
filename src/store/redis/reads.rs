//! Reads: history pages (the walk of `lua/walk.lua`, continued while the
//! selection is open) and session info.

use redis::Value;

use super::RedisStore;
use super::record::{self, Translations};
use super::reply::{Reply, corrupt};
use super::scripts::{args, pack};
use super::summaries::{self, Described};
use crate::domain::SessionId;
use crate::history::{
    BudgetState, Candidate, Options, Picker, Selection, Selector, StoppedBy, Window,
};
use crate::store::counting::{self, offer_all};
use crate::store::{SessionInfo, StoreError, StoredHistory, StoredSummary, Unsummarized};
use crate::turn::{Millis, TurnView};

/// The walk's arguments, packed as `WALK_ARGS` in `lua/walk.lua` wants
/// them: the read's bounds and its budget so far (`budget`: the header's
/// tokens and the state; `None` when the walk cannot budget, a template's
/// read: it then hands every turn over). `after`: lower seq bound;
/// `before`: upper one (both excluded), `None` for the read's own.
/// `first`: the read's first call, which may begin with the summary and
/// describe what the read leaves unsummarized.
pub(super) fn walk_args(
    o: &Options,
    budget: Option<(u32, BudgetState)>,
    after: u64,
    before: Option<u64>,
    keep_first: bool,
    first: bool,
) -> Vec<u8> {
    let before = before.or_else(|| o.through_seq.checked_add(1));
    let (header, s) = budget.unwrap_or((
        0,
        BudgetState {
            room: o.limit,
            inner_sum: 0,
            newest: None,
            newest_may_change: true,
            bytes: 0,
        },
    ));
    let (newest_inner, newest_last) = s
        .newest
        .map_or((-1.0, 0.0), |(i, l)| (f64::from(i), f64::from(l)));
    let mut out = Vec::with_capacity(13 * 8 + 9);
    pack(
        &mut out,
        &[
            after as f64,
            before.map_or(-1.0, |b| b as f64),
            s.room as f64,
            f64::from(o.max_tokens),
            o.max_bytes as f64,
            o.max_query_chars.unwrap_or(0) as f64,
            o.max_answer_chars.unwrap_or(0) as f64,
            f64::from(header),
            s.inner_sum as f64,
            newest_inner,
            newest_last,
            s.bytes as f64,
        ],
    );
    out.push(o.encoding.code());
    out.push(u8::from(o.format.shape().blocks()));
    out.push(u8::from(keep_first));
    out.push(u8::from(s.newest_may_change));
    out.push(u8::from(o.english));
    out.push(u8::from(!o.english && o.format.shows_copies()));
    out.push(u8::from(first && o.summary));
    out.push(u8::from(first));
    out.push(u8::from(budget.is_some()));
    let stride = match o.window {
        Window::Stable { stride } => stride as f64,
        Window::Sliding => 0.0,
    };
    pack(&mut out, &[stride]);
    out
}

/// The budget a read's first call starts from (none for a template's).
pub(super) fn first_budget(read: &Options) -> Option<(u32, BudgetState)> {
    if read.template.is_some() {
        return None;
    }
    let sel = Selector::new(read);
    Some((sel.header(), sel.state()))
}

/// The budget a selection has come to (none for a template's).
fn budget_of(p: &Picker) -> Option<(u32, BudgetState)> {
    match p {
        Picker::Plain(s) => Some((s.header(), s.state())),
        Picker::Template(_) => None,
    }
}

/// One call's part of a walk: `{status, reason, next before, total, first
/// or false, flat entries, summary or false, unsummarized}` (see
/// `lua/walk.lua`).
pub(super) struct Page {
    pub status: PageEnd,
    /// Finalized turns among the candidates.
    pub total: u64,
    pub first: Option<Candidate>,
    pub entries: Vec<Candidate>,
    /// The summary the read begins with (a first call's).
    pub summary: Option<StoredSummary>,
    pub described: Described,
    /// How many of the turns taken a stable window leaves out, as the
    /// walk described what the read leaves unsummarized.
    pub left_out: usize,
}

pub(super) enum PageEnd {
    /// No candidate left.
    Done,
    /// Call again below this seq.
    More(u64),
    /// The next candidate does not fit.
    Stop(StoppedBy),
}

impl Page {
    pub fn parse(v: Value, read: Translations) -> Result<Self, StoreError> {
        let mut r = Reply::array(v)?;
        let status = r.string()?;
        let reason = r.string()?;
        let next = r.uint()?;
        let total = r.uint()?;
        let first = match r.next()? {
            Value::Nil => None,
            v => candidates(Reply::array(v)?, read)?.pop(),
        };
        let entries = candidates(Reply::array(r.next()?)?, read)?;
        let summary = summaries::parse(r.next()?)?;
        let described = Described::parse(r.next()?)?;
        // Walks that end early say nothing of a window.
        let left_out = match r.next() {
            Ok(v) => Reply::uint_of(v)? as usize,
            Err(_) => 0,
        };
        let status = match status.as_str() {
            "done" => PageEnd::Done,
            "more" if !entries.is_empty() => PageEnd::More(next),
            "stop" => PageEnd::Stop(
                StoppedBy::from_name(&reason).ok_or_else(|| corrupt("unknown stop reason"))?,
            ),
            _ => return Err(corrupt("unknown page status")),
        };
        Ok(Page {
            status,
            total,
            first,
            entries,
            summary,
            described,
            left_out,
        })
    }
}

/// `lua/history.lua` on an existing session: `{owner or '', live pending
/// turns, page, generation}`.
struct HistoryReply {
    owner: Option<String>,
    pending_turns: u64,
    page: Page,
    generation: String,
}

impl HistoryReply {
    fn parse(v: Value, read: Translations) -> Result<Self, StoreError> {
        let mut r = Reply::array(v)?;
        Ok(HistoryReply {
            owner: r.owner()?,
            pending_turns: r.uint()?,
            page: Page::parse(r.next()?, read)?,
            generation: record::generation(&r.bytes()?),
        })
    }
}

/// Flat `member, record, tail or false, English copies or false` entries.
fn candidates(mut r: Reply, read: Translations) -> Result<Vec<Candidate>, StoreError> {
    let mut out = Vec::new();
    while let Ok(member) = r.next() {
        let member = Reply::bytes_of(member)?;
        let rec = r.bytes()?;
        let tail = Reply::opt_bytes_of(r.next()?)?;
        let en = Reply::opt_bytes_of(r.next()?)?;
        out.push(record::candidate(
            &member,
            &rec,
            tail.as_deref(),
            en.as_deref(),
            read,
        )?);
    }
    Ok(out)
}

/// Who a read found the session to be: its owner and generation.
#[derive(Clone, Copy)]
pub(super) struct Found<'a> {
    pub owner: Option<&'a str>,
    pub generation: &'a str,
}

/// A read's selection, and what the store tells around it.
pub(super) struct Selected {
    pub selection: Selection,
    pub rendered: Option<String>,
    pub total: u64,
    pub summary: Option<StoredSummary>,
    pub unsummarized: Option<Unsummarized>,
}

impl RedisStore {
    /// Offers a first page and the pages after it to `sel` until it stops
    /// or the candidates run out (after the summary, if the first page
    /// brings one); then describes what the read leaves unsummarized.
    /// `before_seq`: a start's own seq (`u64::MAX` for a history read).
    /// `found`: the session as the first page found it; a page of another
    /// generation (the session replaced meanwhile) ends the read.
    pub(super) async fn select_pages(
        &self,
        session: &SessionId,
        found: Found<'_>,
        read: &Options,
        mut page: Page,
        now: Millis,
        before_seq: u64,
    ) -> Result<Selected, StoreError> {
        let total = page.total;
        let described = std::mem::replace(&mut page.described, Described::Later);
        // The walk describes what lies below every turn it hands over (but
        // those a stable window leaves out, which it counts among them).
        let handed = page.entries.len() + usize::from(page.first.is_some());
        let summary = page.summary.take();
        let page_left_out = page.left_out;
        let after = read
            .after_seq
            .max(summary.as_ref().map_or(0, |s| s.through_seq));
        let mut sel =
            counting::begin(read, session.as_str(), found.owner, summary.as_ref()).await?;
        if !sel.is_stopped() {
            sel = self
                .offer_pages(session, found.generation, sel, page, after, now)
                .await?;
        }
        let picked = sel.finish()?;
        let selection = picked.selection;
        let left_out = page_left_out;
        let unsummarized = match described {
            Described::Done(u)
                if selection.turns.len() + left_out == handed && selection.left_out == left_out =>
            {
                u
            }
            Described::Done(_) | Described::Later => {
                self.describe(session, &selection, read, before_seq, now)
                    .await?
            }
        };
        Ok(Selected {
            summary: summary.filter(|_| selection.summary),
            rendered: picked.rendered,
            selection,
            total,
            unsummarized,
        })
    }

    async fn offer_pages(
        &self,
        session: &SessionId,
        generation: &str,
        mut sel: Picker,
        mut page: Page,
        mut after: u64,
        now: Millis,
    ) -> Result<Picker, StoreError> {
        loop {
            if let Some(first) = &page.first {
                after = first.seq;
            }
            sel = offer_all(sel, page.first.take(), page.entries).await;
            if sel.is_stopped() {
                return Ok(sel);
            }
            match page.status {
                PageEnd::Done => return Ok(sel),
                PageEnd::Stop(why) => {
                    sel.stop(why);
                    return Ok(sel);
                }
                PageEnd::More(before) => {
                    let o = sel.options();
                    let args = walk_args(o, budget_of(&sel), after, Some(before), false, false);
                    let translations = Translations::of(o);
                    let v: Value = self
                        .run_session(&self.scripts.history, session.as_str(), args![now, args])
                        .await?;
                    if v == Value::Nil {
                        // The session went away between the pages.
                        return Ok(sel);
                    }
                    let next = HistoryReply::parse(v, translations)?;
                    if next.generation != generation {
                        // It went away and was started again.
                        return Ok(sel);
                    }
                    page = next.page;
                }
            }
        }
    }

    pub(super) async fn read_history(
        &self,
        session: &SessionId,
        read: &Options,
        now: Millis,
    ) -> Result<StoredHistory, StoreError> {
        let a = args![
            now,
            walk_args(
                read,
                first_budget(read),
                read.after_seq,
                None,
                read.keep_first,
                true
            )
        ];
        let v: Value = self
            .run_session(&self.scripts.history, session.as_str(), a)
            .await?;
        if v == Value::Nil {
            return Ok(StoredHistory {
                selection: Selection::default(),
                rendered: read.template.as_ref().map(|_| String::new()),
                ..StoredHistory::default()
            });
        }
        let reply = HistoryReply::parse(v, Translations::of(read))?;
        let s = self
            .select_pages(
                session,
                Found {
                    owner: reply.owner.as_deref(),
                    generation: &reply.generation,
                },
                read,
                reply.page,
                now,
                u64::MAX,
            )
            .await?;
        Ok(StoredHistory {
            user_id: reply.owner,
            total_turns: s.total,
            pending_turns: reply.pending_turns,
            selection: s.selection,
            summary: s.summary,
            rendered: s.rendered,
            unsummarized: s.unsummarized,
            generation: Some(reply.generation),
        })
    }

    pub(super) async fn read_turns_page(
        &self,
        session: &SessionId,
        after_seq: u64,
        max_turns: usize,
        max_bytes: u64,
    ) -> Result<Vec<TurnView>, StoreError> {
        let mut numbers = Vec::with_capacity(3 * 8);
        pack(
            &mut numbers,
            &[after_seq as f64, max_turns as f64, max_bytes as f64],
        );
        let v: Value = self
            .run_session(&self.scripts.turns_page, session.as_str(), args![numbers])
            .await?;
        let mut r = Reply::array(v)?;
        let mut out = Vec::new();
        while let Ok(id) = r.next() {
            let id = record::turn_id(&Reply::bytes_of(id)?)?;
            let rec = r.bytes()?;
            let en = Reply::opt_bytes_of(r.next()?)?;
            out.push(record::view(id, &rec, en.as_deref())?);
        }
        Ok(out)
    }

    pub(super) async fn read_session_info(
        &self,
        session: &SessionId,
        now: Millis,
    ) -> Result<Option<SessionInfo>, StoreError> {
        let v: Value = self
            .run_session(&self.scripts.session_info, session.as_str(), args![now])
            .await?;
        if v == Value::Nil {
            return Ok(None);
        }
        session_info(v, now).map(Some)
    }
}

/// `lua/session_info.lua` on an existing session: `{owner or '',
/// created_at, last_active_at, turn_count, pending_count, pttl,
/// generation}`.
fn session_info(v: Value, now: Millis) -> Result<SessionInfo, StoreError> {
    let mut r = Reply::array(v)?;
    Ok(SessionInfo {
        user_id: r.owner()?,
        created_at: r.int()?,
        last_active_at: r.int()?,
        turn_count: r.uint()?,
        pending_count: r.uint()?,
        expires_at: now + r.int()?.max(0),
        generation: record::generation(&r.bytes()?),
    })
}
