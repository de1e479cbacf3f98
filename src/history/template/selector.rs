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

use std::sync::Arc;

use minijinja::Value;

use super::joints::{Counter, Known, Run};
use super::rendered::{MAX_END_BYTES, Rendered, TurnKey};
use super::sandbox::{MAX_OUTPUT_BYTES, Part};
use super::{Caches, Globals, Summary, Template, TemplateError, context};
use crate::domain::TurnId;
use crate::history::select::truncate;
use crate::history::{Candidate, Options, SelectedTurn, StoppedBy};
use crate::turn::TurnView;

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
}

/// What a rendering holds whatever its turns: the header, the separator
/// and the footer, with their runs under one encoding.
#[derive(Debug)]
pub(super) struct Fixed {
    header: String,
    separator: String,
    footer: String,
    header_run: Run,
    separator_run: Run,
    footer_run: Run,
}

impl Fixed {
    pub fn render(
        template: &Template,
        globals: &Value,
        counter: &Counter,
    ) -> Result<Fixed, TemplateError> {
        let header = template.fixed(globals, Part::Header)?;
        let separator = template.fixed(globals, Part::Separator)?;
        let footer = template.fixed(globals, Part::Footer)?;
        Ok(Fixed {
            header_run: Run::segment(&header, counter),
            separator_run: Run::segment(&separator, counter),
            footer_run: Run::segment(&footer, counter),
            header,
            separator,
            footer,
        })
    }
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
            chosen,
            tokens,
            bytes,
            stopped,
            ..
        } = self;
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
        TemplateSelection {
            rendered,
            token_count: u32::try_from(tokens).unwrap_or(u32::MAX),
            turns,
            summary: included,
            bytes,
            stopped_by: stopped,
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

    /// The bytes of the rendering with one more turn, rendered in `piece`
    /// bytes: an error past `max_output`.
    fn output_with(&self, piece: usize) -> Result<u64, TemplateError> {
        let f = &self.fixed;
        let joint = if self.first.is_none() && self.chosen.is_empty() {
            f.header.len() + f.footer.len()
        } else {
            f.separator.len()
        };
        let output = self.output + (joint + piece) as u64;
        match self.max_output {
            Some(max) if output > max => {
                let message = format!(
                    "the rendering is larger than {max} bytes (twice \
                     TURNSTORE_MAX_HISTORY_BYTES and 1 MiB)"
                );
                Err(TemplateError::new(self.template.turn_line(), message))
            }
            _ => Ok(output),
        }
    }

    /// Whether taking `c` is cheap enough for an async worker: its
    /// rendering is cached, and joining it to its neighbours counts short
    /// spans only (a few KiB at most, whatever is cached). The rendering
    /// found is kept for the offer. When nothing more can be taken, taking
    /// costs nothing.
    pub fn ready(&mut self, c: &Candidate) -> bool {
        if self.stopped.is_some() || self.room == 0 {
            return true;
        }
        let key = self.key(c);
        let Some(rendered) = self.caches.turns.get(&key) else {
            self.found = Some((c.turn_id, key, None));
            return false;
        };
        let (head, tail) = rendered.run.ends();
        let (_, before) = self.before.ends();
        let (separator_head, separator_tail) = self.fixed.separator_run.ends();
        let (footer, _) = self.fixed.footer_run.ends();
        let after = self.after.as_ref().map_or(0, |a| a.ends().0);
        let next = separator_head + separator_tail + footer + after;
        self.found = Some((c.turn_id, key, Some(rendered)));
        before + head <= 4 * MAX_END_BYTES && tail + next <= 4 * MAX_END_BYTES
    }

    /// The key of `c`'s rendering under this read: everything the template
    /// sees of the turn and the globals, and what the read makes of its
    /// contents (which it holds cut for truncation, or English copies).
    fn key(&self, c: &Candidate) -> TurnKey {
        let content = |t: &crate::history::Content| (t.text.len(), t.whole);
        let variant = (
            self.read_variant,
            (c.seq, c.started_at, c.finalized_at),
            (content(&c.user_query), content(&c.final_answer)),
        );
        self.caches
            .turns
            .key(self.template.id(), c.turn_id, variant)
    }

    /// Truncates the contents as `Selector` does, and renders and counts
    /// the turn, or finds it rendered and counted. Also returns the
    /// contents' bytes, and the bytes of the rendering with the turn,
    /// checked before the turn is counted.
    fn measure(
        &mut self,
        c: Candidate,
    ) -> Result<(SelectedTurn, Rendered, u64, u64), TemplateError> {
        // A read offers each turn once, so what `ready` found under this
        // turn's id is this candidate's.
        let (key, found) = match self.found.take() {
            Some((turn, key, rendered)) if turn == c.turn_id => (key, rendered),
            _ => {
                let key = self.key(&c);
                (key, self.caches.turns.get(&key))
            }
        };
        let (query_whole, answer_whole) = (c.user_query.whole, c.final_answer.whole);
        let (user_query, query_cut) = truncate(c.user_query, self.opts.max_query_chars);
        let (final_answer, answer_cut) = truncate(c.final_answer, self.opts.max_answer_chars);
        // The stored counts alone hold for a content rendered whole.
        let stored = |whole: bool, cut: bool, encoding, count: u32| {
            (whole && !cut && !c.recount && encoding == self.opts.encoding).then_some(count)
        };
        let q = &c.costs.query;
        let a = &c.costs.answer;
        let known_query = stored(query_whole, query_cut, q.encoding, q.query);
        let known_answer = stored(answer_whole, answer_cut, a.encoding, a.answer);
        let bytes = (user_query.len() + final_answer.len()) as u64;
        let turn = SelectedTurn {
            turn: TurnView {
                turn_id: c.turn_id,
                seq: c.seq,
                started_at: c.started_at,
                finalized_at: c.finalized_at,
                user_query,
                final_answer,
                user_query_en: None,
                final_answer_en: None,
            },
            truncated: query_cut || answer_cut,
        };
        let (rendered, output) = match found {
            Some(rendered) => {
                let output = self.output_with(rendered.piece.len())?;
                (rendered, output)
            }
            None => {
                let piece = self.template.turn(&self.globals, &turn)?;
                let output = self.output_with(piece.len())?;
                let v = &turn.turn;
                let known = [
                    (&v.user_query, known_query),
                    (&v.final_answer, known_answer),
                ]
                .into_iter()
                .filter_map(|(text, count)| {
                    Some(Known {
                        text,
                        count: count?,
                    })
                });
                let piece: Arc<str> = piece.into();
                let run = Run::segment_knowing(&piece, &self.counter, known);
                (self.caches.turns.put(key, Rendered { piece, run }), output)
            }
        };
        Ok((turn, rendered, bytes, output))
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
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::domain::TurnId;
    use crate::history::template::Templates;
    use crate::history::{Content, TRUNCATION_MARK};
    use crate::tokens::{AnswerTokens, Encoding, QueryTokens, TurnCosts};

    const GLOBALS: Globals<'static> = Globals {
        session_id: "s-42",
        user_id: Some("alice"),
    };

    fn candidate(seq: u64, q: &str, a: &str) -> Candidate {
        let enc = Encoding::O200kBase;
        Candidate {
            turn_id: TurnId::generate(),
            seq,
            started_at: 1_795_000_000_000 + seq as i64,
            finalized_at: 1_795_000_001_000 + seq as i64,
            user_query: Content::whole(q),
            final_answer: Content::whole(a),
            costs: TurnCosts::new(
                q,
                QueryTokens::count(enc, q),
                a,
                AnswerTokens::count(enc, a),
            ),
            recount: false,
            copies: Default::default(),
        }
    }

    /// `c` as a template sees it under `o`, truncated as `Selector`
    /// truncates it.
    fn selected_turn(c: &Candidate, o: &Options) -> SelectedTurn {
        let (user_query, query_cut) = truncate(c.user_query.clone(), o.max_query_chars);
        let (final_answer, answer_cut) = truncate(c.final_answer.clone(), o.max_answer_chars);
        SelectedTurn {
            truncated: query_cut || answer_cut,
            turn: TurnView {
                turn_id: c.turn_id,
                seq: c.seq,
                started_at: c.started_at,
                finalized_at: c.finalized_at,
                user_query,
                final_answer,
                user_query_en: None,
                final_answer_en: None,
            },
        }
    }

    fn candidates(pairs: &[(&str, &str)]) -> Vec<Candidate> {
        pairs
            .iter()
            .enumerate()
            .map(|(i, (q, a))| candidate(i as u64 + 1, q, a))
            .collect()
    }

    fn opts(encoding: Encoding, max_tokens: u32) -> Options {
        Options {
            limit: 20,
            max_tokens,
            ..Options::everything(encoding)
        }
    }

    fn builtin(name: &str) -> Template {
        Templates::load(None).unwrap().get(name).unwrap().clone()
    }

    #[test]
    fn a_template_selects_through_the_caches_it_was_given() {
        // Arrange: the built-ins with caches of their own (16 shards of two
        // 2 KiB generations), and 300 turns rendered in about 100 KB.
        let budget = 64 * 1024;
        let caches = Caches::new(1024, budget);
        let templates = Templates::load(None).unwrap().with_caches(&caches);
        let xml = templates.get("xml").unwrap();
        let pairs: Vec<(String, String)> = (0..300)
            .map(|i| {
                (
                    format!("question {i}"),
                    format!("the answer to question {i}"),
                )
            })
            .collect();
        let pairs: Vec<(&str, &str)> = pairs.iter().map(|(q, a)| (&q[..], &a[..])).collect();
        let cs = candidates(&pairs);
        let o = Options {
            limit: 300,
            ..opts(Encoding::O200kBase, 1_000_000)
        };
        let read = |cs: &[Candidate]| {
            select_template(cs.iter().cloned(), &o, xml, &GLOBALS, None).unwrap()
        };

        // Act
        let first = read(&cs[290..]);
        let hits = caches.turns.hits();
        let again = read(&cs[290..]);
        let hits_again = caches.turns.hits() - hits;
        let everything = read(&cs);

        // Assert: the selections rendered into these caches (a repeat
        // found its 10 turns there), which kept within their budget.
        assert_eq!(again, first);
        assert_eq!(hits_again, 10);
        assert_eq!(everything.turns.len(), 300);
        assert!(caches.turns.bytes() > 0);
        assert!(caches.turns.bytes() <= budget, "{}", caches.turns.bytes());
        assert!(caches.counts.len() <= 1024);
    }

    /// User templates that stress joints: no separators at all (pieces of
    /// the tokenizer span turns), and text in every fixed part.
    fn user_template(name: &str) -> Template {
        let source = match name {
            "bare" => {
                "{% macro turn(turn) %}{{ turn.user_query }}{{ turn.final_answer }}{% endmacro %}"
            }
            "chat" => concat!(
                "{% macro summary(summary) %}Summary to {{ summary.through_seq }}: {{ summary.text }}\n{% endmacro %}",
                "{% macro header() %}Conversation with {{ user_id }} in {{ session_id }}:\n{% endmacro %}",
                "{% macro turn(turn) %}#{{ turn.seq }} U: {{ turn.user_query }}\nA: {{ turn.final_answer }}",
                "{% if turn.truncated %} (cut){% endif %}{% endmacro %}",
                "{% macro separator() %}\n---\n{% endmacro %}",
                "{% macro footer() %}\n(end of history){% endmacro %}",
            ),
            _ => unreachable!(),
        };
        Template::compile(name, source).unwrap()
    }

    /// `select_template` with a cache of the test's own.
    fn pick(
        cs: &[Candidate],
        o: &Options,
        t: &Template,
        summary: Option<&Summary>,
        caches: &Caches,
    ) -> Result<TemplateSelection, TemplateError> {
        let read = cs.iter().map(|c| Candidate {
            user_query: Content::for_read(&c.user_query.text, o.max_query_chars),
            final_answer: Content::for_read(&c.final_answer.text, o.max_answer_chars),
            ..c.clone()
        });
        let mut read = read.collect::<Vec<_>>().into_iter();
        let mut s = TemplateSelector::with_caches(t, o, &GLOBALS, summary, caches.clone())?;
        if o.keep_first
            && let Some(first) = read.next()
            && !s.reserve_first(first)?
        {
            return Ok(s.finish());
        }
        for c in read.rev() {
            if !s.offer(c)? {
                break;
            }
        }
        Ok(s.finish())
    }

    /// The rule applied naively: each candidate rendering rendered whole
    /// and counted fresh. Returns the selected seqs, the stop, and the
    /// fresh count of the rendering that was refused, if one was.
    fn reference(
        cs: &[Candidate],
        o: &Options,
        t: &Template,
        summary: Option<&Summary>,
    ) -> (Vec<u64>, Option<StoppedBy>, Option<u32>) {
        let fresh = |turns: &[SelectedTurn], s: Option<&Summary>| {
            o.encoding.count(&t.render(&GLOBALS, s, turns).unwrap())
        };
        let selected = |c: &Candidate| selected_turn(c, o);
        let mut bytes = 0u64;
        if let Some(s) = summary {
            let tokens = fresh(&[], Some(s));
            if tokens > o.max_tokens {
                return (vec![], Some(StoppedBy::MaxTokens), Some(tokens));
            }
            if s.text.len() as u64 > o.max_bytes {
                return (vec![], Some(StoppedBy::MaxBytes), None);
            }
            bytes = s.text.len() as u64;
        }
        let mut order: Vec<&Candidate> = Vec::new();
        if o.keep_first && !cs.is_empty() {
            order.push(&cs[0]);
            order.extend(cs[1..].iter().rev());
        } else {
            order.extend(cs.iter().rev());
        }
        let mut taken: Vec<SelectedTurn> = Vec::new(); // oldest first
        for (i, c) in order.into_iter().enumerate() {
            if taken.len() == o.limit {
                return (seqs(&taken), Some(StoppedBy::Limit), None);
            }
            let turn = selected(c);
            let turn_bytes = (turn.turn.user_query.len() + turn.turn.final_answer.len()) as u64;
            let mut with = taken.clone();
            let at = if o.keep_first && i > 0 { 1 } else { 0 };
            with.insert(at, turn);
            let tokens = fresh(&with, summary);
            if tokens > o.max_tokens {
                return (seqs(&taken), Some(StoppedBy::MaxTokens), Some(tokens));
            }
            if bytes + turn_bytes > o.max_bytes {
                return (seqs(&taken), Some(StoppedBy::MaxBytes), None);
            }
            bytes += turn_bytes;
            taken = with;
        }
        (seqs(&taken), None, None)
    }

    fn seqs(turns: &[SelectedTurn]) -> Vec<u64> {
        turns.iter().map(|t| t.turn.seq).collect()
    }

    /// Everything a selection must satisfy against the naive rule.
    fn check(
        cs: &[Candidate],
        o: &Options,
        t: &Template,
        summary: Option<&Summary>,
    ) -> Result<TemplateSelection, TestCaseError> {
        let caches = Caches::new(1 << 12, 1 << 20);
        let s = pick(cs, o, t, summary, &caches).unwrap();
        let rendered = t
            .render(&GLOBALS, summary.filter(|_| s.summary), &s.turns)
            .unwrap();
        prop_assert_eq!(&s.rendered, &rendered);
        prop_assert_eq!(
            s.token_count,
            o.encoding.count(&s.rendered),
            "{:?}",
            s.rendered
        );
        prop_assert!(s.token_count <= o.max_tokens);
        prop_assert!(s.bytes <= o.max_bytes);
        let contents: usize = s
            .turns
            .iter()
            .map(|t| t.turn.user_query.len() + t.turn.final_answer.len())
            .sum();
        let summary_bytes = summary.filter(|_| s.summary).map_or(0, |x| x.text.len());
        prop_assert_eq!(s.bytes, (contents + summary_bytes) as u64);
        let (expected, stopped_by, refused) = reference(cs, o, t, summary);
        prop_assert_eq!(seqs(&s.turns), expected);
        prop_assert_eq!(s.stopped_by, stopped_by);
        if s.stopped_by == Some(StoppedBy::MaxTokens) {
            // Taking one more (or the summary alone) would exceed the budget.
            prop_assert!(refused.is_some_and(|n| n > o.max_tokens));
        }
        // A second read counts the same through the warm caches, taking
        // the turns it renders as rendered before, and tokenizes nothing.
        let tokenized = caches.counts.tokenized();
        prop_assert_eq!(pick(cs, o, t, summary, &caches).unwrap(), s.clone());
        prop_assert_eq!(caches.counts.tokenized(), tokenized);
        Ok(s)
    }

    #[test]
    fn xml_selection_is_exact_and_renders_the_turns() {
        let cs = candidates(&[
            ("What is 2+2?", "4."),
            ("And <b>?", "It's \"bold\" & more."),
        ]);
        for enc in Encoding::ALL {
            let s = check(&cs, &opts(enc, 4096), &builtin("xml"), None).unwrap();
            assert_eq!(s.turns.len(), 2);
            assert_eq!(s.stopped_by, None);
        }
    }

    #[test]
    fn the_first_turn_that_does_not_fit_stops_the_selection() {
        let big = "word ".repeat(200);
        let cs = candidates(&[("tiny", "tiny"), ("q", &big), ("q3", "a3")]);
        let s = check(
            &cs,
            &opts(Encoding::O200kBase, 60),
            &builtin("markdown"),
            None,
        )
        .unwrap();
        assert_eq!(seqs(&s.turns), [3]);
        assert_eq!(s.stopped_by, Some(StoppedBy::MaxTokens));
    }

    #[test]
    fn keep_first_inserts_between_the_first_and_the_newest_run() {
        let big = "word ".repeat(200);
        let cs = candidates(&[
            ("goal", "ok"),
            ("q", &big),
            ("q3", "a3"),
            ("q4", "a4"),
            ("q5", "a5"),
        ]);
        for name in ["xml", "markdown"] {
            let mut o = opts(Encoding::Cl100kBase, 120);
            o.keep_first = true;
            let s = check(&cs, &o, &builtin(name), None).unwrap();
            assert_eq!(seqs(&s.turns), [1, 3, 4, 5], "{name}");
            assert_eq!(s.stopped_by, Some(StoppedBy::MaxTokens));
        }
        let mut o = opts(Encoding::O200kBase, 4096);
        o.keep_first = true;
        o.limit = 2;
        let s = check(&cs, &o, &builtin("xml"), None).unwrap();
        assert_eq!(
            (seqs(&s.turns), s.stopped_by),
            (vec![1, 5], Some(StoppedBy::Limit))
        );
    }

    #[test]
    fn keep_first_with_no_room_for_the_first_turn_keeps_nothing() {
        let cs = candidates(&[("goal", &"word ".repeat(200)), ("q2", "a2")]);
        let mut o = opts(Encoding::O200kBase, 60);
        o.keep_first = true;
        let s = check(&cs, &o, &builtin("xml"), None).unwrap();
        assert_eq!((s.rendered.as_str(), s.token_count), ("", 0));
        assert_eq!(s.stopped_by, Some(StoppedBy::MaxTokens));
    }

    #[test]
    fn the_summary_counts_first_and_may_stand_alone() {
        let cs = candidates(&[("q1", "a1"), ("q2", "a2")]);
        let summary = Summary {
            text: "The user asked about keys & locks.".into(),
            through_seq: 0,
        };
        for name in ["xml", "markdown"] {
            let t = builtin(name);
            let s = check(&cs, &opts(Encoding::O200kBase, 4096), &t, Some(&summary)).unwrap();
            assert!(s.summary && s.turns.len() == 2, "{name}");

            let mut o = opts(Encoding::P50kBase, 4096);
            o.limit = 0;
            let s = check(&cs, &o, &t, Some(&summary)).unwrap();
            assert!(s.summary && s.turns.is_empty());
            assert_eq!(s.rendered, t.render(&GLOBALS, Some(&summary), &[]).unwrap());
            assert_eq!(s.stopped_by, Some(StoppedBy::Limit));
            assert_eq!(s.bytes, summary.text.len() as u64);

            let alone = s.token_count;
            let s = check(
                &cs,
                &opts(Encoding::P50kBase, alone - 1),
                &t,
                Some(&summary),
            )
            .unwrap();
            assert!(!s.summary && s.rendered.is_empty() && s.turns.is_empty());
            assert_eq!(s.stopped_by, Some(StoppedBy::MaxTokens));

            let mut o = opts(Encoding::P50kBase, 4096);
            o.max_bytes = summary.text.len() as u64 - 1;
            let s = check(&cs, &o, &t, Some(&summary)).unwrap();
            assert!(!s.summary && s.rendered.is_empty());
            assert_eq!(s.stopped_by, Some(StoppedBy::MaxBytes));

            o.max_bytes = summary.text.len() as u64 + 4;
            let s = check(&cs, &o, &t, Some(&summary)).unwrap();
            assert_eq!(
                (seqs(&s.turns), s.stopped_by),
                (vec![2], Some(StoppedBy::MaxBytes))
            );
        }
    }

    #[test]
    fn a_summary_without_a_summary_macro_is_a_template_error() {
        let t = user_template("bare");
        let summary = Summary {
            text: "s".into(),
            through_seq: 1,
        };
        let err = TemplateSelector::new(
            &t,
            &opts(Encoding::O200kBase, 100),
            &GLOBALS,
            Some(&summary),
        )
        .unwrap_err();
        assert_eq!(err.to_string(), "template bare has no summary macro");
    }

    #[test]
    fn the_byte_cap_counts_contents_not_markup() {
        let cs = candidates(&[("q1", "a1"), ("q2", "aa2"), ("q3", "a3")]);
        let mut o = opts(Encoding::O200kBase, 4096);
        o.max_bytes = 8;
        let s = check(&cs, &o, &builtin("xml"), None).unwrap();
        assert_eq!((seqs(&s.turns), s.bytes), (vec![3], 4));
        assert_eq!(s.stopped_by, Some(StoppedBy::MaxBytes));
    }

    #[test]
    fn an_operators_rendering_is_capped_before_it_is_counted() {
        // Arrange: a template repeating a string far beyond its contents,
        // 300 KB a turn, and a history cap of 100 bytes (a rendering of
        // 1 MiB and 200 bytes at most: three turns, not four).
        let t = Template::compile(
            "bloat",
            "{% macro header() %}<hh>{% endmacro %}\n\
             {% macro turn(turn) %}{{ turn.user_query }}{{ 'word ' * 60000 }}{% endmacro %}",
        )
        .unwrap();
        let cs = candidates(&[("q1", "a1"), ("q2", "a2"), ("q3", "a3"), ("q4", "a4")]);
        let mut o = opts(Encoding::O200kBase, 10_000_000);
        o.max_bytes = 100;
        let max = max_rendering_bytes(o.max_bytes);
        assert_eq!(max, 200 + 1024 * 1024);
        let caches = Caches::new(1 << 12, 1 << 22);

        // Act
        let err = pick(&cs, &o, &t, None, &caches).unwrap_err();
        let tokenized = caches.counts.tokenized_bytes();
        let again = pick(&cs, &o, &t, None, &caches).unwrap_err();
        let two = pick(&cs[2..], &o, &t, None, &caches).unwrap();

        // Assert: the fourth piece passes the cap (the first three found
        // in the cache the second time): an error naming the turn macro,
        // and the piece that passed it was not counted.
        assert_eq!(err.line, Some(2), "{err}");
        assert_eq!(
            err.message,
            format!(
                "the rendering is larger than {max} bytes \
                 (twice TURNSTORE_MAX_HISTORY_BYTES and 1 MiB)"
            )
        );
        assert_eq!(again, err);
        assert!(tokenized < 3 * 300_002 + 1024, "{tokenized}");
        assert_eq!(two.turns.len(), 2);
        assert_eq!(two.rendered.len(), 4 + 2 * 300_002);
        // A rendering of exactly the cap is whole; one byte less fails.
        let four = 4 + 4 * 300_002;
        o.max_bytes = (four - 1024 * 1024) / 2;
        assert_eq!(max_rendering_bytes(o.max_bytes), four);
        let whole = pick(&cs, &o, &t, None, &caches).unwrap();
        assert_eq!(whole.rendered.len() as u64, four);
        o.max_bytes -= 1;
        assert!(pick(&cs, &o, &t, None, &caches).is_err());
    }

    #[test]
    fn the_built_ins_are_not_held_to_the_rendering_cap() {
        // Quotes escape to six bytes each in `xml`: four times the cap.
        let quotes = "'".repeat(200_000);
        let cs = candidates(&[(&quotes, &quotes)]);
        let mut o = opts(Encoding::O200kBase, 10_000_000);
        o.max_bytes = 400_000;
        let s = select_template(cs.into_iter(), &o, &builtin("xml"), &GLOBALS, None).unwrap();
        assert!(s.rendered.len() as u64 > max_rendering_bytes(o.max_bytes));
    }

    #[test]
    fn truncation_happens_before_rendering() {
        let cs = candidates(&[("héllo wörld", "ünïcode ✓ answer")]);
        let mut o = opts(Encoding::O200kBase, 4096);
        o.max_answer_chars = Some(9);
        let s = check(&cs, &o, &user_template("chat"), None).unwrap();
        assert!(s.turns[0].truncated);
        assert!(
            s.rendered
                .contains(&format!("A: ünïcode ✓{TRUNCATION_MARK} (cut)")),
            "{}",
            s.rendered
        );
    }

    #[test]
    fn turns_without_letter_space_cuts_are_counted_exactly() {
        let cjk = candidates(&[("漢字漢字", "字漢。"), ("🙂🙂", "漢字\n\n"), ("字", "漢")]);
        for enc in Encoding::ALL {
            for t in [builtin("markdown"), user_template("bare")] {
                check(&cjk, &opts(enc, 4096), &t, None).unwrap();
            }
        }
    }

    /// A cold read of `pairs` (every turn the same size) with `template`:
    /// the bytes it tokenized, and the bytes it rendered.
    fn cold_read(pairs: &[(String, String)], template: &Template, enc: Encoding) -> (u64, u64) {
        let pairs: Vec<(&str, &str)> = pairs
            .iter()
            .map(|(q, a)| (q.as_str(), a.as_str()))
            .collect();
        let cs = candidates(&pairs);
        let caches = Caches::new(1 << 14, 1 << 20);
        let o = Options {
            limit: cs.len(),
            ..opts(enc, 10_000_000)
        };
        let s = pick(&cs, &o, template, None, &caches).unwrap();
        assert_eq!(s.turns.len(), cs.len());
        assert_eq!(s.token_count, enc.count(&s.rendered));
        (caches.counts.tokenized_bytes(), s.rendered.len() as u64)
    }

    #[test]
    fn a_cold_read_tokenizes_about_what_it_renders_once() {
        // Each turn's piece once, plus its short ends and joints: nothing
        // like the sum over turns of the rendering so far (×25 here) that a
        // count of each candidate rendering would be. Every text differs,
        // so that no count comes from an earlier turn of the same read.
        let answer = "Rotate the keys in three steps, then roll the deployment again. ".repeat(10);
        let english: Vec<_> = (0..50)
            .map(|i| {
                (
                    format!("How do I rotate key {i}?"),
                    format!("{answer}Done {i}."),
                )
            })
            .collect();
        // No ASCII letter before a space anywhere: only newline cuts.
        let cjk: Vec<_> = (0..50)
            .map(|i| {
                (
                    format!("密钥{i}怎么轮换？"),
                    format!("{}{i}。", "先添加新密钥，再滚动部署。".repeat(20)),
                )
            })
            .collect();
        for (pairs, name) in [
            (&english, "xml"),
            (&english, "markdown"),
            (&cjk, "markdown"),
        ] {
            for enc in [Encoding::Cl100kBase, Encoding::P50kBase] {
                let (tokenized, rendered) = cold_read(pairs, &builtin(name), enc);
                assert!(
                    tokenized < rendered + rendered / 4,
                    "{name} {enc:?}: {tokenized} vs {rendered}"
                );
            }
        }
    }

    #[test]
    fn a_failing_turn_is_an_error_with_its_line() {
        let t = Template::compile(
            "picky",
            "{% macro turn(turn) %}\n{% if turn.seq == 2 %}{{ turn.nope }}{% endif %}x{% endmacro %}",
        )
        .unwrap();
        let cs = candidates(&[("q1", "a1"), ("q2", "a2"), ("q3", "a3")]);
        let err = select_template(
            cs.into_iter(),
            &opts(Encoding::O200kBase, 4096),
            &t,
            &GLOBALS,
            None,
        )
        .unwrap_err();
        assert_eq!(err.line, Some(2), "{err}");
    }

    #[test]
    fn a_turn_rendered_before_is_taken_only_by_a_read_that_renders_it_alike() {
        // Arrange: a template whose turns show the user, one set of caches,
        // and turns long enough for a truncation to cut.
        let t = Template::compile(
            "owner",
            "{% macro turn(turn) %}{{ user_id }} asked: {{ turn.user_query }}\nanswer: {{ turn.final_answer }}{% endmacro %}",
        )
        .unwrap();
        let caches = Caches::new(1 << 12, 1 << 20);
        let cs = candidates(&[
            ("first question", "first answer"),
            ("second one", "and more"),
        ]);
        let o = opts(Encoding::O200kBase, 4096);
        let read = |globals: &Globals<'_>, o: &Options| {
            let mut s =
                TemplateSelector::with_caches(&t, o, globals, None, caches.clone()).unwrap();
            for c in cs.iter().rev() {
                let c = Candidate {
                    user_query: Content::for_read(&c.user_query.text, o.max_query_chars),
                    final_answer: Content::for_read(&c.final_answer.text, o.max_answer_chars),
                    ..c.clone()
                };
                assert!(s.offer(c).unwrap());
            }
            s.finish().rendered
        };
        let bob = Globals {
            user_id: Some("bob"),
            ..GLOBALS
        };
        let cut = Options {
            max_query_chars: Some(5),
            ..o.clone()
        };

        // Act
        let first = read(&GLOBALS, &o);
        let hits = caches.turns.hits();
        let again = read(&GLOBALS, &o);
        let hits_again = caches.turns.hits() - hits;
        let claimed = read(&bob, &o);
        let truncated = read(&GLOBALS, &cut);

        // Assert: the repeated read took both turns from the cache; a read
        // with other globals or another truncation rendered its own.
        assert_eq!(hits_again, 2);
        assert_eq!(again, first);
        assert_eq!(
            first,
            "alice asked: first question\nanswer: first answer\
             alice asked: second one\nanswer: and more"
        );
        assert_eq!(claimed, first.replace("alice", "bob"));
        assert_eq!(
            truncated,
            "alice asked: first [truncated]\nanswer: first answer\
             alice asked: secon [truncated]\nanswer: and more"
        );
        // What a read may take on a worker: turns it finds rendered alike.
        let ready = |globals: &Globals<'_>| {
            let mut s =
                TemplateSelector::with_caches(&t, &o, globals, None, caches.clone()).unwrap();
            cs.iter().rev().map(|c| s.ready(c)).collect::<Vec<_>>()
        };
        assert_eq!(ready(&bob), [true, true]);
        let carol = Globals {
            user_id: Some("carol"),
            ..GLOBALS
        };
        assert_eq!(ready(&carol), [false, false]);
    }

    fn content() -> impl Strategy<Value = String> {
        // Whitespace runs at either end, words, CJK without spaces, emoji,
        // XML specials, special-token text and the truncation mark: what
        // moves the pre-tokenizer's cuts around joints.
        let part = prop_oneof![
            "[a-zA-Z]{1,8}",
            " [a-zA-Z]{1,6}",
            Just("\n\n".to_string()),
            Just("  ".to_string()),
            Just("\t".to_string()),
            "[ \n]{1,5}",
            "[.,!?;:'\"()/-]{1,3}",
            "[<>&\"']{1,3}",
            "[0-9]{1,5}",
            "[漢字語]{1,6}",
            "[🙂👍]{1,2}",
            Just("é".to_string()),
            Just("'s".to_string()),
            Just("<|endoftext|>".to_string()),
            Just(TRUNCATION_MARK.to_string()),
        ];
        let edge = || prop_oneof![Just(""), Just("\n\n"), Just("  "), Just("\t"), Just(" ")];
        (edge(), proptest::collection::vec(part, 1..10), edge())
            .prop_map(|(start, body, end)| format!("{start}{}{end}", body.concat()))
    }

    fn template_strategy() -> impl Strategy<Value = &'static str> {
        prop_oneof![Just("xml"), Just("markdown"), Just("bare"), Just("chat")]
    }

    fn named(name: &str) -> Template {
        match name {
            "xml" | "markdown" => builtin(name),
            _ => user_template(name),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]

        #[test]
        fn selections_are_exact_and_follow_the_rule(
            pairs in proptest::collection::vec((content(), content()), 0..7),
            template in template_strategy(),
            encoding in 0..Encoding::ALL.len(),
            max_tokens in 0u32..250,
            max_bytes in prop_oneof![Just(u64::MAX), 0u64..300],
            limit in 0usize..9,
            keep_first in any::<bool>(),
            max_query_chars in proptest::option::of(1usize..15),
            max_answer_chars in proptest::option::of(1usize..15),
            summary in proptest::option::of(content()),
        ) {
            let t = named(template);
            let summary = summary
                .filter(|_| matches!(template, "xml" | "markdown" | "chat"))
                .map(|text| Summary { text, through_seq: 9 });
            let pairs: Vec<(&str, &str)> = pairs.iter().map(|(q, a)| (q.as_str(), a.as_str())).collect();
            let o = Options {
                limit, max_tokens, max_bytes, max_query_chars, max_answer_chars, keep_first,
                ..opts(Encoding::ALL[encoding], 0)
            };
            check(&candidates(&pairs), &o, &t, summary.as_ref())?;
        }
    }

    #[test]
    fn fixed_parts_that_name_a_global_are_rendered_for_each_session() {
        let sources = [
            "{% macro turn(t) %}{{ t.user_query }}{% endmacro %}\
             {% macro header() %}[{{ session_id }}]{% endmacro %}",
            "{% set who = user_id %}{% macro turn(t) %}{{ t.user_query }}{% endmacro %}\
             {% macro footer() %}({{ who or 'nobody' }}){% endmacro %}",
            "{% macro turn(t) %}{{ t.user_query }}{% endmacro %}{% macro separator() %}\
             {% if user_id is defined %}|{{ user_id|upper }}|{% endif %}{% endmacro %}",
        ];
        let cs = candidates(&[("q1", "a1"), ("q2", "a2")]);
        let o = opts(Encoding::O200kBase, 4096);
        let turns: Vec<_> = cs.iter().map(|c| selected_turn(c, &o)).collect();
        for source in sources {
            let t = Template::compile("g", source).unwrap();
            assert!(t.compiled.uses_globals(), "{source}");
            let mut seen = std::collections::HashSet::new();
            for (session_id, user_id) in [("s1", Some("u1")), ("s2", Some("u2")), ("s3", None)] {
                let g = Globals {
                    session_id,
                    user_id,
                };
                let whole = t.render(&g, None, &turns).unwrap();
                let picked = select_template(cs.clone().into_iter(), &o, &t, &g, None).unwrap();
                assert_eq!(picked.rendered, whole, "{source}");
                assert_eq!(picked.token_count, o.encoding.count(&whole), "{source}");
                seen.insert(whole);
            }
            assert_eq!(seen.len(), 3, "{source}: each session its own rendering");
        }
        for name in ["xml", "markdown"] {
            assert!(!builtin(name).compiled.uses_globals(), "{name}");
        }
    }
}
