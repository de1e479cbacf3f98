//! The budget rule of API.md: which finalized turns a history returns.
//!
//! Candidates are offered newest first (after the reserved first turn, with
//! `keep_first`). Each is kept whole or stops the selection, so the result is
//! the newest run with no gap. A store feeds candidates one at a time and
//! stops at the first refusal: a read costs what it returns, plus one turn.
//!
//! Its Lua twin is the walk's budget (`store/redis/lua/walk.lua`), which
//! keeps a Redis read to the turns it returns; `store/redis/twins/walk.rs`
//! runs the two over the same random costs and bounds and compares their
//! choices directly. What a turn costs is its format's (`format.rs`).

use serde::Serialize;
use utoipa::ToSchema;

use super::candidate::{Candidate, Content, SelectedTurn, truncate};
use super::format::Format;
use super::template::Template;
use super::window::Window;
use crate::tokens::Encoding;
use crate::turn::TurnView;

/// The bound that stopped a selection before every candidate was in it.
/// When several stop it at the same turn, the first of these names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum StoppedBy {
    Limit,
    MaxTokens,
    MaxBytes,
}

impl StoppedBy {
    pub fn name(self) -> &'static str {
        match self {
            StoppedBy::Limit => "limit",
            StoppedBy::MaxTokens => "max_tokens",
            StoppedBy::MaxBytes => "max_bytes",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        [StoppedBy::Limit, StoppedBy::MaxTokens, StoppedBy::MaxBytes]
            .into_iter()
            .find(|s| s.name() == name)
    }
}

/// What one read asks for; every field already validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// At most this many turns (the reserved first one included).
    pub limit: usize,
    pub max_tokens: u32,
    /// At most this many UTF-8 bytes of contents, as rendered.
    pub max_bytes: u64,
    pub format: Format,
    pub encoding: Encoding,
    pub max_query_chars: Option<usize>,
    pub max_answer_chars: Option<usize>,
    pub keep_first: bool,
    /// Candidates are the finalized turns with `after_seq < seq <= through_seq`.
    pub after_seq: u64,
    pub through_seq: u64,
    /// Render the English copies of turns that have them (`lang=en`).
    pub english: bool,
    /// Begin with the session's summary, if it has one (`summary=true`);
    /// candidates are then the turns it does not cover.
    pub summary: bool,
    /// Render with this template instead of the format (which is `text`).
    pub template: Option<Template>,
    /// Which of the turns that fit are shown (see `window.rs`).
    pub window: Window,
}

impl Options {
    /// Every finalized turn, whole, as `text` in `encoding`: no bound, no
    /// summary, no template. Reads name what they change from it.
    pub fn everything(encoding: Encoding) -> Self {
        Options {
            limit: usize::MAX,
            max_tokens: u32::MAX,
            max_bytes: u64::MAX,
            format: Format::Text,
            encoding,
            max_query_chars: None,
            max_answer_chars: None,
            keep_first: false,
            after_seq: 0,
            through_seq: u64::MAX,
            english: false,
            summary: false,
            template: None,
            window: Window::Sliding,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection {
    /// The summary begins the rendering.
    pub summary: bool,
    /// Oldest first.
    pub turns: Vec<SelectedTurn>,
    /// Exact count of the rendering, under the read's encoding.
    pub token_count: u32,
    /// UTF-8 bytes of the contents, as rendered.
    pub bytes: u64,
    pub stopped_by: Option<StoppedBy>,
    /// Turns that fit but a stable window leaves out (older than those
    /// returned).
    pub left_out: usize,
}

/// What a turn costs: followed by another turn (`inner`) or as the newest
/// (`last`); the two differ in `text` by the blank line between blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cost {
    pub inner: u32,
    pub last: u32,
    pub bytes: u64,
}

/// The running cost of a selection. Total = header + `inner_sum` + the
/// newest turn's `last`; every other chosen turn counts at its `inner`.
/// The Redis store's Lua walk keeps the same state (see `walk.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetState {
    /// Turns that may still be chosen.
    pub room: usize,
    pub inner_sum: u64,
    /// `(inner, last)` of the newest chosen turn.
    pub newest: Option<(u32, u32)>,
    /// The next turn chosen becomes the newest: nothing is chosen yet, or
    /// only the reserved first turn, older than every other candidate.
    pub newest_may_change: bool,
    pub bytes: u64,
}

/// What a summary adds before the turns, under the read's encoding and
/// format: its tokens with no turn after it (`alone`) and with turns after
/// it (`joined`, the history's header not included), and its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prelude {
    pub alone: u32,
    pub joined: u32,
    pub bytes: u64,
}

/// Selects among candidates offered one at a time.
#[derive(Debug)]
pub struct Selector {
    opts: Options,
    header: u32,
    /// The summary, once it is known to fit: it is part of the result.
    prelude: Option<Prelude>,
    state: BudgetState,
    first: Option<SelectedTurn>,
    /// Newest first.
    chosen: Vec<SelectedTurn>,
    /// With a stable window, the `inner` tokens and bytes of each chosen
    /// turn, as `chosen` (a turn the window leaves out gives them back).
    costs: Vec<(u32, u64)>,
    left_out: usize,
    stopped: Option<StoppedBy>,
}

impl Selector {
    pub fn new(opts: &Options) -> Self {
        let header = opts.format.header(opts.encoding);
        Selector {
            opts: opts.clone(),
            header,
            state: BudgetState {
                room: opts.limit,
                inner_sum: 0,
                newest: None,
                newest_may_change: true,
                bytes: 0,
            },
            first: None,
            chosen: Vec::new(),
            costs: Vec::new(),
            left_out: 0,
            stopped: None,
            prelude: None,
        }
    }

    pub fn options(&self) -> &Options {
        &self.opts
    }

    /// Begins with a summary: it comes first and counts first; if it does
    /// not fit, nothing is returned (`false`).
    pub fn open_with(&mut self, summary: Prelude) -> bool {
        let why = if summary.alone > self.opts.max_tokens {
            Some(StoppedBy::MaxTokens)
        } else if summary.bytes > self.opts.max_bytes {
            Some(StoppedBy::MaxBytes)
        } else {
            None
        };
        match why {
            Some(why) => {
                self.stopped = Some(why);
                false
            }
            None => {
                self.state.bytes = summary.bytes;
                self.prelude = Some(summary);
                true
            }
        }
    }

    /// What every rendering with a turn in it counts besides its turns:
    /// the history's header (0 for `messages`), and the summary's block.
    pub fn header(&self) -> u32 {
        self.header + self.prelude.map_or(0, |p| p.joined)
    }

    pub fn state(&self) -> BudgetState {
        self.state
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped.is_some()
    }

    /// With `keep_first`: the oldest candidate, offered before the others.
    /// If it does not fit, nothing is returned (`false`).
    pub fn reserve_first(&mut self, c: Candidate) -> bool {
        let taken = self.offer(c);
        if taken {
            self.first = self.chosen.pop();
            self.costs.pop();
            self.state.newest_may_change = true;
        }
        taken
    }

    /// Takes `c` if it fits; otherwise the selection stops (`false`).
    pub fn offer(&mut self, c: Candidate) -> bool {
        if self.stopped.is_some() {
            return false;
        }
        if self.state.room == 0 {
            self.stopped = Some(StoppedBy::Limit);
            return false;
        }
        let (turn, cost) = self.measure(c);
        if let Err(why) = self.fits(cost) {
            self.stopped = Some(why);
            return false;
        }
        let s = &mut self.state;
        if s.newest_may_change {
            if let Some((inner, _)) = s.newest {
                s.inner_sum += u64::from(inner);
            }
            s.newest = Some((cost.inner, cost.last));
            s.newest_may_change = false;
        } else {
            s.inner_sum += u64::from(cost.inner);
        }
        s.bytes += cost.bytes;
        s.room -= 1;
        self.chosen.push(turn);
        if self.opts.window.is_stable() {
            self.costs.push((cost.inner, cost.bytes));
        }
        true
    }

    /// Whether taking `c` tokenizes (its stored counts do not apply: another
    /// encoding, or a content the read cuts), which a store does off the
    /// async workers.
    pub fn must_count(&self, c: &Candidate) -> bool {
        let o = &self.opts;
        let cut =
            |t: &Content, max: Option<usize>| max.is_some_and(|m| !t.whole || t.text.len() > m);
        c.recount
            || c.costs.query.encoding != o.encoding
            || c.costs.answer.encoding != o.encoding
            || cut(&c.user_query, o.max_query_chars)
            || cut(&c.final_answer, o.max_answer_chars)
    }

    /// A store saw the next candidate and knows it does not fit.
    pub fn stop(&mut self, why: StoppedBy) {
        self.stopped.get_or_insert(why);
    }

    pub fn finish(mut self) -> Selection {
        self.narrow();
        let token_count = match self.state.newest {
            None => self.prelude.map_or(0, |p| p.alone),
            Some((_, last)) => {
                let total = u64::from(self.header()) + self.state.inner_sum + u64::from(last);
                u32::try_from(total).unwrap_or(u32::MAX)
            }
        };
        let mut turns: Vec<SelectedTurn> = self.first.into_iter().collect();
        turns.extend(self.chosen.into_iter().rev());
        Selection {
            summary: self.prelude.is_some(),
            turns,
            token_count,
            bytes: self.state.bytes,
            stopped_by: self.stopped,
            left_out: self.left_out,
        }
    }

    /// Leaves out the oldest chosen turns a stable window does not show:
    /// each counted at its `inner` (the newest is never among them).
    fn narrow(&mut self) {
        let run = self.chosen.iter().rev().map(|t| t.turn.seq);
        let drops = self.opts.window.drops(run, self.stopped.is_some());
        if drops == 0 {
            return;
        }
        let keep = self.chosen.len() - drops;
        self.chosen.truncate(keep);
        self.left_out = drops;
        for (inner, bytes) in self.costs.drain(keep..) {
            self.state.inner_sum -= u64::from(inner);
            self.state.bytes -= bytes;
            self.state.room += 1;
        }
    }

    fn fits(&self, cost: Cost) -> Result<(), StoppedBy> {
        let s = &self.state;
        let total = u64::from(self.header())
            + s.inner_sum
            + if s.newest_may_change {
                s.newest.map_or(0, |(inner, _)| u64::from(inner)) + u64::from(cost.last)
            } else {
                u64::from(cost.inner) + s.newest.map_or(0, |(_, last)| u64::from(last))
            };
        if total > u64::from(self.opts.max_tokens) {
            return Err(StoppedBy::MaxTokens);
        }
        if s.bytes + cost.bytes > self.opts.max_bytes {
            return Err(StoppedBy::MaxBytes);
        }
        Ok(())
    }

    /// Truncates the contents and counts what the stored counts do not cover.
    fn measure(&self, c: Candidate) -> (SelectedTurn, Cost) {
        let enc = self.opts.encoding;
        let (user_query, query_cut) = truncate(c.user_query, self.opts.max_query_chars);
        let (final_answer, answer_cut) = truncate(c.final_answer, self.opts.max_answer_chars);
        let q = Some(c.costs.query).filter(|t| t.encoding == enc && !query_cut && !c.recount);
        let a = Some(c.costs.answer).filter(|t| t.encoding == enc && !answer_cut && !c.recount);
        let cost = self
            .opts
            .format
            .cost(enc, (user_query.as_str(), q), (final_answer.as_str(), a));
        let copy = |c: Option<Content>, max| c.map(|c| truncate(c, max));
        let query_en = copy(c.copies.user_query, self.opts.max_query_chars);
        let answer_en = copy(c.copies.final_answer, self.opts.max_answer_chars);
        let copy_cut = [&query_en, &answer_en]
            .iter()
            .any(|c| c.as_ref().is_some_and(|(_, cut)| *cut));
        let turn = SelectedTurn {
            turn: TurnView {
                turn_id: c.turn_id,
                seq: c.seq,
                started_at: c.started_at,
                finalized_at: c.finalized_at,
                user_query,
                final_answer,
                user_query_en: query_en.map(|(t, _)| t),
                final_answer_en: answer_en.map(|(t, _)| t),
            },
            truncated: query_cut || answer_cut || copy_cut,
        };
        (turn, cost)
    }
}

/// The whole rule over candidates held in order, oldest first: the first
/// is reserved with `keep_first`, then the rest are offered newest first.
/// Candidates are built only as they are offered.
pub fn select<I>(mut candidates: I, opts: &Options) -> Selection
where
    I: DoubleEndedIterator<Item = Candidate>,
{
    let mut s = Selector::new(opts);
    if opts.keep_first
        && let Some(first) = candidates.next()
        && !s.reserve_first(first)
    {
        return s.finish();
    }
    for c in candidates.rev() {
        if !s.offer(c) {
            break;
        }
    }
    s.finish()
}
