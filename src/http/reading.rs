//! What a history read counts with, and the cut of a store's selection to
//! a loaded tokenizer's counts (see `history::exact`).

use super::error::ApiError;
use crate::history::exact::{self, Sums, Uncut};
use crate::history::{Options, Selection, StoppedBy};
use crate::store::{StoredHistory, Unsummarized};
use crate::tokens::{Counting, apart};

/// A read's options, and what counts it. A loaded tokenizer's counts of
/// parts need not add up as the store sums them (see `history::exact`):
/// the store then selects without the token bound, in the default
/// encoding, bounded by `limit` and by the bytes `max_tokens` of its
/// tokens can hold, and the selection is cut back here.
#[derive(Debug, Clone)]
pub struct Reading {
    /// What the store is asked.
    pub options: Options,
    pub counting: Counting,
    /// The read's own `max_tokens` and `max_bytes`, for a loaded tokenizer.
    bounds: Option<(u32, u64)>,
}

impl Reading {
    pub fn new(mut options: Options, counting: Counting) -> Self {
        let bounds = match &counting {
            Counting::Builtin(encoding) => {
                options.encoding = *encoding;
                None
            }
            Counting::Loaded(tokenizer) => {
                let bounds = (options.max_tokens, options.max_bytes);
                options.max_bytes = options
                    .max_bytes
                    .min(tokenizer.bytes_within(options.max_tokens));
                options.max_tokens = u32::MAX;
                Some(bounds)
            }
        };
        Reading {
            options,
            counting,
            bounds,
        }
    }

    /// Whether the store's counts are the read's (its encoding is built in).
    pub fn counts_in_store(&self) -> bool {
        self.bounds.is_none()
    }

    /// [`Reading::cut`]: here when the tokenizer's counts of every part
    /// are kept from earlier reads, else apart (`tokens::apart`: counts of
    /// long texts take time).
    pub async fn cut_apart(&self, mut stored: StoredHistory) -> Result<StoredHistory, ApiError> {
        if self.counts_in_store() || self.cut(&mut stored, false) {
            return Ok(stored);
        }
        let reading = self.clone();
        Ok(apart(move || {
            reading.cut(&mut stored, true);
            stored
        })
        .await)
    }

    /// Cuts the store's selection back to the read's `max_tokens` when a
    /// loaded tokenizer counts it; what it leaves out is unsummarized
    /// (and the tokens of the unsummarized turns unknown). Counts parts
    /// not kept from earlier reads only when `count`: `false` when it
    /// needs such a count and may not, the selection untouched.
    fn cut(&self, stored: &mut StoredHistory, count: bool) -> bool {
        let (Counting::Loaded(tokenizer), Some((max_tokens, max_bytes))) =
            (&self.counting, self.bounds)
        else {
            return true;
        };
        let format = self.options.format;
        let uncut = Uncut {
            summary: stored
                .summary
                .as_ref()
                .filter(|_| stored.selection.summary)
                .map(|s| s.text.as_str()),
            turns: &stored.selection.turns,
            reserved_first: self.options.keep_first,
        };
        let part = |pieces: &[&str], after| tokenizer.count_part(pieces, after, count);
        let cut = if tokenizer.adds_up_in(format) {
            let Some(sums) = Sums::of(&uncut, format, part) else {
                return false;
            };
            exact::cut(&uncut, max_tokens, None, |taken| sums.count(taken))
        } else if count {
            // Sums of parts (kept) are near for such a tokenizer: where
            // they cut, the whole counts begin.
            let guess = Sums::of(&uncut, format, part).map(|sums| {
                exact::cut(&uncut, max_tokens, None, |t| sums.count(t))
                    .taken
                    .offers()
            });
            exact::cut(&uncut, max_tokens, guess, |taken| {
                exact::whole(&uncut, format, taken, |text| tokenizer.count(text))
            })
        } else {
            return false;
        };
        let had_summary = uncut.summary.is_some();
        let selection = std::mem::take(&mut stored.selection);
        let (turns, dropped) = cut.taken.split(selection.turns);
        let trimmed = !dropped.is_empty() || (had_summary && !cut.taken.summary);
        // The store stopped at the bytes `max_tokens` tokens can hold: the
        // turn it stopped at does not fit in tokens either.
        let ours = self.options.max_bytes < max_bytes;
        let stopped_by = match selection.stopped_by {
            _ if trimmed => Some(StoppedBy::MaxTokens),
            Some(StoppedBy::MaxBytes) if ours => Some(StoppedBy::MaxTokens),
            other => other,
        };
        let dropped_bytes: u64 = dropped
            .iter()
            .map(|t| (t.turn.user_query.len() + t.turn.final_answer.len()) as u64)
            .sum();
        if let (Some(oldest), Some(newest)) = (dropped.first(), dropped.last()) {
            let (from, to) = (oldest.turn.seq, newest.turn.seq);
            let u = stored.unsummarized.get_or_insert(Unsummarized {
                after_seq: from.saturating_sub(1),
                through_seq: to,
                turns: 0,
                tokens: None,
            });
            u.turns += dropped.len() as u64;
            u.through_seq = u.through_seq.max(to);
        }
        if let Some(u) = stored.unsummarized.as_mut() {
            u.tokens = None;
        }
        if !cut.taken.summary {
            stored.summary = None;
        }
        stored.selection = Selection {
            summary: cut.taken.summary,
            turns,
            token_count: cut.token_count,
            bytes: selection.bytes.saturating_sub(dropped_bytes),
            stopped_by,
        };
        true
    }
}
