//! The budget rule of `history::select`, over a template's rendering.
//!
//! Candidates are offered newest first (after the reserved first turn with
//! `keep_first`); each is kept whole or stops the selection. A turn is taken
//! iff the rendering with it fits `max_tokens` (counted exactly under the
//! read's encoding), `max_bytes` (the contents' bytes) and `limit`.
//!
//! Each new turn goes at one place: after everything fixed so far (the
//! summary, the header and, with `keep_first`, the reserved turn and a
//! separator: `before`) and before everything chosen so far (the newest run
//! and the footer: `after`). Both sides are kept as `joints::Run`s, so a
//! candidate costs the count of its own rendering (cached) and of two short
//! joint spans, not a count of the whole rendering: a read is linear in
//! what it renders. See `joints` for the case where spans grow.
//!
//! A turn rendered before is taken from `rendered` with its run: a repeated
//! read neither runs the template nor tokenizes the turn again. Such a turn
//! whose joints are short is cheap enough to take on an async worker
//! ([`TemplateSelector::ready`]); the others are rendered and counted on
//! the blocking pool.
//!
//! An operator's template may add to the contents it renders, but not
//! without bound: a rendering grows by one piece at a time, and one that
//! would pass [`max_rendering_bytes`] is an error before its piece is
//! counted, so a read never holds (nor tokenizes) much more than that.
//!
//! Here, the walk: where each turn goes, and whether it fits. `piece`: a
//! turn's own rendering and count, found in `rendered` or made.

mod piece;

use std::sync::Arc;

use minijinja::Value;

use super::joints::{Counter, Run};
use super::rendered::{Rendered, TurnKey};
use super::sandbox::MAX_OUTPUT_BYTES;
use super::{Caches, Fixed, Globals, Summary, Template, TemplateError, context};
use crate::domain::TurnId;
use crate::history::candidate::{Candidate, SelectedTurn};
use crate::history::select::{Options, StoppedBy};

/// The most an operator's template may render in one history: the
/// contents (at most `max_history_bytes`, `TURNSTORE_MAX_HISTORY_BYTES`)
/// twice over, for markup and escaping, and one macro's largest output
/// ([`MAX_OUTPUT_BYTES`]) besides. The built-ins render their contents
/// once (escaped by `xml`) and are not held to it.
pub fn max_rendering_bytes(max_history_bytes: u64) -> u64 {
    max_history_bytes
        .saturating_mul(2)
        .saturating_add(MAX_OUTPUT_BYTES as u64)
}

/// What a templated read returns.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TemplateSelection {
    /// The rendering: summary, header, turns, footer ("" when empty).
    pub rendered: String,
    /// Exact count of `rendered` under the read's encoding.
    pub token_count: u32,
    /// Oldest first.
    pub turns: Vec<SelectedTurn>,
    /// The summary is in `rendered` (it was asked for and fits).
    pub summary: bool,
    /// UTF-8 bytes of the contents as rendered: questions, answers, summary.
    pub bytes: u64,
    pub stopped_by: Option<StoppedBy>,
    /// Turns that fit but a stable window leaves out.
    pub left_out: usize,
}

/// Selects among candidates offered one at a time, rendering each once.
#[derive(Debug)]
pub struct TemplateSelector {
    template: Template,
    opts: Options,
    globals: Value,
    /// What a turn's rendering depends on besides the turn and the
    /// template (the globals, how the read makes its contents), hashed.
    read_variant: u64,
    counter: Counter,
    caches: Caches,
    /// What `ready` found for the candidate offered next: its turn, its
    /// key, and its rendering if kept.
    found: Option<(TurnId, TurnKey, Option<Rendered>)>,
    /// The summary's rendering, when it is in the selection.
    summary: Option<String>,
    fixed: Arc<Fixed>,
    /// Everything before the place of the next turn.
    before: Run,
    /// Everything after it; `None` until a turn after the reserved one is
    /// chosen (the footer alone then follows the next turn).
    after: Option<Run>,
    first: Option<(SelectedTurn, Arc<str>)>,
    /// Newest first, with their renderings.
    chosen: Vec<(SelectedTurn, Arc<str>)>,
    /// Turns that may still be chosen.
    room: usize,
    /// Exact count of the current rendering.
    tokens: u64,
    bytes: u64,
    /// UTF-8 bytes of the current rendering, and the most it may grow to
    /// (`None` for a built-in).
    output: u64,
    max_output: Option<u64>,
    stopped: Option<StoppedBy>,
}

impl TemplateSelector {
    /// A selection with `template`, through its caches. With a summary,
    /// the summary goes first: if it alone does not fit, the selection is
    /// empty and stopped.
    pub fn new(
        template: &Template,
        opts: &Options,
        globals: &Globals<'_>,
        summary: Option<&Summary>,
    ) -> Result<Self, TemplateError> {
        Self::with_caches(template, opts, globals, summary, template.caches.clone())
    }

    /// As [`TemplateSelector::new`], through `caches`.
    pub fn with_caches(
        template: &Template,
        opts: &Options,
        globals: &Globals<'_>,
        summary: Option<&Summary>,
        caches: Caches,
    ) -> Result<Self, TemplateError> {
        let g = context::globals(globals);
        let counter = Counter {
            encoding: opts.encoding,
            cache: caches.counts.clone(),
        };
        let fixed = template.fixed_parts(&g, &counter)?;
        let summary_text = summary.map(|s| template.summary(&g, s)).transpose()?;
        let mut s = TemplateSelector {
            before: fixed.header_run.clone(),
            template: template.clone(),
            opts: opts.clone(),
            globals: g,
            read_variant: caches.turns.hash((
                (globals.session_id, globals.user_id),
                (
                    opts.encoding.code(),
                    opts.max_query_chars,
                    opts.max_answer_chars,
                ),
                opts.english,
            )),
            caches,
            found: None,
            summary: None,
            fixed,
            after: None,
            first: None,
            chosen: Vec::new(),
            room: opts.limit,
            tokens: 0,
            bytes: 0,
            output: 0,
            max_output: template
                .native
                .is_none()
                .then(|| max_rendering_bytes(opts.max_bytes)),
            stopped: None,
            counter,
        };
        if let (Some(text), Some(summary)) = (summary_text, summary) {
            s.open_with_summary(text, summary.text.len() as u64);
        }
        Ok(s)
    }

    /// The summary counts first; the turns follow it if it fits.
    fn open_with_summary(&mut self, text: String, bytes: u64) {
        let mut run = Run::segment(&text, &self.counter);
        let tokens = run.count(&self.counter);
        if let Err(why) = self.fits(tokens, bytes) {
            self.stopped = Some(why);
            return;
        }
        let header = std::mem::take(&mut self.before);
        self.before = run.then(header, &self.counter);
        // One macro's output: within `max_rendering_bytes` whatever it is.
        self.output = text.len() as u64;
        self.summary = Some(text);
        self.tokens = tokens;
        self.bytes = bytes;
    }

    pub fn options(&self) -> &Options {
        &self.opts
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped.is_some()
    }

    /// A store saw the next candidate and knows it does not fit.
    pub fn stop(&mut self, why: StoppedBy) {
        self.stopped.get_or_insert(why);
    }

    /// With `keep_first`, before any offer: the oldest candidate, rendered
    /// first. If it does not fit, nothing is returned (`false`).
    pub fn reserve_first(&mut self, c: Candidate) -> Result<bool, TemplateError> {
        if !self.has_room() {
            return Ok(false);
        }
        let (turn, rendered, bytes, output) = self.measure(c)?;
        let run = rendered.run.clone();
        let mut with_first = std::mem::take(&mut self.before).then(run, &self.counter);
        let total = with_first.count_joined(&mut self.fixed.footer_run.clone(), &self.counter);
        if let Err(why) = self.fits(total, self.bytes + bytes) {
            self.stopped = Some(why);
            return Ok(false);
        }
        self.before = with_first.then(self.fixed.separator_run.clone(), &self.counter);
        self.first = Some((turn, rendered.piece.clone()));
        self.accept(total, bytes, output);
        Ok(true)
    }

    /// Takes `c`, older than every turn taken after the reserved one, if
    /// the rendering with it fits; otherwise the selection stops (`false`).
    pub fn offer(&mut self, c: Candidate) -> Result<bool, TemplateError> {
        if !self.has_room() {
            return Ok(false);
        }
        let (turn, rendered, bytes, output) = self.measure(c)?;
        let run = rendered.run.clone();
        let mut rest = match self.after.take() {
            None => run.then(self.fixed.footer_run.clone(), &self.counter),
            Some(after) => run
                .then(self.fixed.separator_run.clone(), &self.counter)
                .then(after, &self.counter),
        };
        let total = self.before.count_joined(&mut rest, &self.counter);
        if let Err(why) = self.fits(total, self.bytes + bytes) {
            self.stopped = Some(why);
            return Ok(false);
        }
        self.after = Some(rest);
        self.chosen.push((turn, rendered.piece.clone()));
        self.accept(total, bytes, output);
        Ok(true)
    }

    pub fn finish(self) -> TemplateSelection {
        let TemplateSelector {
            summary,
            fixed,
            first,
            mut chosen,
            mut tokens,
            mut bytes,
            stopped,
            opts,
            ..
        } = self;
        // A stable window leaves out the oldest turns of the run; what is
        // left is rendered as it would have been, and counted whole.
        let run = chosen.iter().rev().map(|(t, _)| t.turn.seq);
        let drops = opts.window.drops(run, stopped.is_some());
        let keep = chosen.len() - drops;
        for (t, _) in chosen.drain(keep..) {
            bytes -= (t.turn.user_query.len() + t.turn.final_answer.len()) as u64;
        }
        let Fixed {
            header,
            separator,
            footer,
            ..
        } = &*fixed;
        let included = summary.is_some();
        let mut rendered = summary.unwrap_or_default();
        let pieces: usize = first.iter().chain(&chosen).map(|(_, p)| p.len()).sum();
        let count = chosen.len() + usize::from(first.is_some());
        rendered.reserve(
            pieces + header.len() + footer.len() + separator.len() * count.saturating_sub(1),
        );
        let mut turns = Vec::with_capacity(count);
        for (turn, piece) in first.into_iter().chain(chosen.into_iter().rev()) {
            rendered.push_str(if turns.is_empty() { header } else { separator });
            rendered.push_str(&piece);
            turns.push(turn);
        }
        if !turns.is_empty() {
            rendered.push_str(footer);
        }
        if drops > 0 {
            tokens = u64::from(opts.encoding.count(&rendered));
        }
        TemplateSelection {
            rendered,
            token_count: u32::try_from(tokens).unwrap_or(u32::MAX),
            turns,
            summary: included,
            bytes,
            stopped_by: stopped,
            left_out: drops,
        }
    }

    /// Whether another turn may be taken; at `limit`, the selection stops.
    fn has_room(&mut self) -> bool {
        if self.stopped.is_some() {
            return false;
        }
        if self.room == 0 {
            self.stopped = Some(StoppedBy::Limit);
            return false;
        }
        true
    }

    /// The first bound a rendering of `tokens` with contents of `bytes`
    /// breaks (tokens before bytes, as `stopped_by` names them).
    fn fits(&self, tokens: u64, bytes: u64) -> Result<(), StoppedBy> {
        if tokens > u64::from(self.opts.max_tokens) {
            return Err(StoppedBy::MaxTokens);
        }
        if bytes > self.opts.max_bytes {
            return Err(StoppedBy::MaxBytes);
        }
        Ok(())
    }

    fn accept(&mut self, tokens: u64, bytes: u64, output: u64) {
        self.tokens = tokens;
        self.bytes += bytes;
        self.output = output;
        self.room -= 1;
    }
}

/// The whole rule over candidates held in order, oldest first, as
/// `history::select` applies it: the first is reserved with `keep_first`,
/// then the rest are offered newest first.
pub fn select_template<I>(
    mut candidates: I,
    opts: &Options,
    template: &Template,
    globals: &Globals<'_>,
    summary: Option<&Summary>,
) -> Result<TemplateSelection, TemplateError>
where
    I: DoubleEndedIterator<Item = Candidate>,
{
    let mut s = TemplateSelector::new(template, opts, globals, summary)?;
    if opts.keep_first
        && let Some(first) = candidates.next()
        && !s.reserve_first(first)?
    {
        return Ok(s.finish());
    }
    for c in candidates.rev() {
        if !s.offer(c)? {
            break;
        }
    }
    Ok(s.finish())
}

#[cfg(test)]
mod tests;
