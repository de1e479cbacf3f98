//! A turn's piece of a templated rendering: its key in the turn cache,
//! and its rendering with its run, found there or rendered and counted
//! (`measure`), checked against the rendering's byte cap first.

use std::sync::Arc;

use super::TemplateSelector;
use crate::history::candidate::{Candidate, SelectedTurn, truncate};
use crate::history::template::TemplateError;
use crate::history::template::joints::{Known, Run};
use crate::history::template::rendered::{MAX_END_BYTES, Rendered, TurnKey};
use crate::turn::TurnView;

impl TemplateSelector {
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
    pub(super) fn measure(
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
