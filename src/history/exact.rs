//! The budget rule on counts of whole renderings, for tokenizers whose
//! counts of parts need not add up to the count of the parts joined (a
//! loaded Hugging Face tokenizer: a SentencePiece one's leading space,
//! say; see `tokens::LoadedTokenizer`). `select.rs` sums counts of parts
//! taken where they stand in a tiktoken rendering; here a selection made
//! without a token bound is cut back to what the rule keeps.
//!
//! The rule is the same: candidates are offered in order (the summary,
//! the reserved first turn with `keep_first`, then the newest turns), and
//! the first that does not fit stops the selection. The longest run of
//! offers whose rendering fits is found by bisection, as counts grow with
//! what is added to a rendering: a count of every prefix would be
//! quadratic in the selection. A rendering is counted whole, or from
//! counts of its parts where the tokenizer's add up ([`Sums`]): those of
//! each message, or of the `text` rendering cut at its joints.

use super::candidate::SelectedTurn;
use super::format::{Format, MESSAGE_OVERHEAD};
use super::window::Window;
use crate::tokens::{ASSISTANT, HEADER, SUMMARY_HEADER, SUMMARY_MESSAGE, USER};

/// A selection to cut back: the summary it begins with and its turns,
/// oldest first (the first the reserved one when `reserved_first`).
pub struct Uncut<'a> {
    pub summary: Option<&'a str>,
    pub turns: &'a [SelectedTurn],
    pub reserved_first: bool,
}

impl Uncut<'_> {
    /// How many offers it makes: the summary, and each turn.
    pub fn offers(&self) -> usize {
        usize::from(self.summary.is_some()) + self.turns.len()
    }

    /// Its first `j` offers, in the rule's order: the summary, the
    /// reserved first turn, then the newest turns.
    pub fn first(&self, j: usize) -> Taken {
        let reserved = self.reserved();
        let with_summary = usize::from(self.summary.is_some());
        let taken_turns = j - with_summary.min(j);
        Taken {
            summary: with_summary == 1 && j >= 1,
            reserved: reserved == 1 && taken_turns >= 1,
            newest: taken_turns.saturating_sub(reserved),
        }
    }

    /// 1 when its first turn is reserved, else 0.
    fn reserved(&self) -> usize {
        usize::from(self.reserved_first && !self.turns.is_empty())
    }

    /// The bytes of the texts of each offer, in the rule's order.
    pub fn offer_bytes(&self) -> impl Iterator<Item = usize> + '_ {
        let (len, reserved) = (self.turns.len(), self.reserved());
        let turn = |i: usize| {
            let t = &self.turns[i].turn;
            t.user_query.len() + t.final_answer.len()
        };
        self.summary
            .map(str::len)
            .into_iter()
            .chain((0..reserved).map(turn))
            .chain((reserved..len).rev().map(turn))
    }
}

/// The offers a rendering takes: the summary or not, the reserved first
/// turn or not, and the newest `newest` turns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Taken {
    pub summary: bool,
    pub reserved: bool,
    pub newest: usize,
}

impl Taken {
    /// How many offers it takes.
    pub fn offers(self) -> usize {
        usize::from(self.summary) + usize::from(self.reserved) + self.newest
    }

    /// The indices of its turns among `len`, oldest first.
    pub fn turns(self, len: usize) -> impl Iterator<Item = usize> {
        (0..usize::from(self.reserved)).chain(len - self.newest..len)
    }

    /// `turns` (all the offered ones) apart: those it takes, and those it
    /// leaves (a run just below the newest taken and above the reserved).
    pub fn split(self, mut turns: Vec<SelectedTurn>) -> (Vec<SelectedTurn>, Vec<SelectedTurn>) {
        let newest = turns.split_off(turns.len() - self.newest);
        let mut kept: Vec<SelectedTurn> = turns.drain(..usize::from(self.reserved)).collect();
        kept.extend(newest);
        (kept, turns)
    }
}

/// What the rule keeps of an [`Uncut`] selection, and its count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cut {
    pub taken: Taken,
    pub token_count: u32,
}

/// Cuts `uncut` back to the longest run of its offers whose rendering
/// counts at most `max_tokens` by `count`. A `guess` of that run's length
/// (the one sums of parts give, say, near for a tokenizer whose counts do
/// not add up) is tried first and then the run next to it, then runs
/// further away, doubling: a right guess costs two counts, where the
/// bisection alone takes about log2 of the offers.
pub fn cut(
    uncut: &Uncut<'_>,
    max_tokens: u32,
    guess: Option<usize>,
    count: impl Fn(Taken) -> u32,
) -> Cut {
    let offers = uncut.offers();
    let take = |j: usize| uncut.first(j);
    // The largest j whose rendering fits: `fits` does (0 always: nothing
    // at all), `over` does not (`offers + 1`: past them all).
    let (mut fits, mut over, mut fits_count) = (0, offers + 1, 0);
    if let Some(guess) = guess.map(|g| g.min(offers)).filter(|&g| g > 0) {
        let mut step = 1;
        let n = count(take(guess));
        if n <= max_tokens {
            (fits, fits_count) = (guess, n);
            while fits + step <= offers {
                let n = count(take(fits + step));
                if n > max_tokens {
                    over = fits + step;
                    break;
                }
                (fits, fits_count) = (fits + step, n);
                step *= 2;
            }
        } else {
            over = guess;
            while over > step {
                let n = count(take(over - step));
                if n <= max_tokens {
                    (fits, fits_count) = (over - step, n);
                    break;
                }
                over -= step;
                step *= 2;
            }
        }
    }
    while over - fits > 1 {
        let mid = fits + (over - fits) / 2;
        let n = count(take(mid));
        if n <= max_tokens {
            (fits, fits_count) = (mid, n);
        } else {
            over = mid;
        }
    }
    Cut {
        taken: take(fits),
        token_count: fits_count,
    }
}

/// A cut, after a stable window's part of it (see `window.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Narrowed {
    pub cut: Cut,
    /// The budget left offers out (before the window).
    pub trimmed: bool,
    /// Turns the window left out.
    pub left_out: usize,
}

/// `cut` with the oldest of its newest turns that `window` leaves out
/// taken off, the rest counted again by `count`. `stopped`: the selection
/// `uncut` is had left turns out before the cut.
pub fn narrow(
    uncut: &Uncut<'_>,
    cut: Cut,
    (window, stopped): (Window, bool),
    count: impl FnOnce(Taken) -> u32,
) -> Narrowed {
    let t = cut.taken;
    let len = uncut.turns.len();
    let trimmed = t.offers() < uncut.offers();
    let run = (len - t.newest..len).map(|i| uncut.turns[i].turn.seq);
    let left_out = window.drops(run, stopped || trimmed);
    if left_out == 0 {
        return Narrowed {
            cut,
            trimmed,
            left_out,
        };
    }
    let taken = Taken {
        newest: t.newest - left_out,
        ..t
    };
    let token_count = count(taken);
    Narrowed {
        cut: Cut { taken, token_count },
        trimmed,
        left_out,
    }
}

/// The count of what `uncut` renders in `format` when `taken`, counted
/// whole by `count`.
pub fn whole(uncut: &Uncut<'_>, format: Format, taken: Taken, count: impl Fn(&str) -> u32) -> u32 {
    let turns = taken
        .turns(uncut.turns.len())
        .map(|i| uncut.turns[i].clone())
        .collect();
    let summary = uncut.summary.filter(|_| taken.summary);
    format.render(summary, turns).count_with(count, summary)
}

/// The counts of the parts of `uncut`'s renderings in a format, for a
/// tokenizer whose counts of them add up to its count of a rendering:
/// `messages` counts each message alone; the `text` rendering (and
/// `turns`, budgeted as `text`) is cut at its joints, each just after a
/// "\n" and before a letter or "#":
///
/// ```text
/// ### Conversation summary:\n{summary}\n\n | ### Conversation history:\n |
/// User: {q}\n | Assistant: {a}\n\n | User: {q}\n | Assistant: {a}
/// ```
///
/// the first part counted as at the start of a text, the others as after
/// a newline (see `tokens::LoadedTokenizer::count_part`).
#[derive(Debug)]
pub struct Sums {
    messages: bool,
    /// The summary's part: alone, and followed by turns.
    summary: [u32; 2],
    /// The history's header: first, and after the summary.
    header: [u32; 2],
    /// A turn's user part (user message).
    user: Vec<u32>,
    /// A turn's assistant part followed by another turn (or its message).
    answer: Vec<u32>,
    /// The assistant part of the first and of the newest turn, as the
    /// last of a rendering (the only turns that can be).
    last: [u32; 2],
}

impl Sums {
    /// The counts `part` gives of each part (`count_part`'s arguments: the
    /// pieces of its text, and whether it stands after a newline), or
    /// `None` when it has not one of them.
    pub fn of(
        uncut: &Uncut<'_>,
        format: Format,
        part: impl Fn(&[&str], bool) -> Option<u32>,
    ) -> Option<Sums> {
        let messages = format.shape() == super::format::Shape::Messages;
        let mut sums = Sums {
            messages,
            summary: [0; 2],
            header: [0; 2],
            user: Vec::with_capacity(uncut.turns.len()),
            answer: Vec::with_capacity(uncut.turns.len()),
            last: [0; 2],
        };
        if messages {
            if let Some(s) = uncut.summary {
                sums.summary[0] = part(&[SUMMARY_MESSAGE, s], false)?;
            }
            for t in uncut.turns {
                sums.user.push(part(&[&t.turn.user_query], false)?);
                sums.answer.push(part(&[&t.turn.final_answer], false)?);
            }
            return Some(sums);
        }
        if let Some(s) = uncut.summary {
            sums.summary = [
                part(&[SUMMARY_HEADER, s], false)?,
                part(&[SUMMARY_HEADER, s, "\n\n"], false)?,
            ];
        }
        if let (Some(first), Some(newest)) = (uncut.turns.first(), uncut.turns.last()) {
            sums.header = [part(&[HEADER], false)?, part(&[HEADER], true)?];
            sums.last = [
                part(&[ASSISTANT, &first.turn.final_answer], true)?,
                part(&[ASSISTANT, &newest.turn.final_answer], true)?,
            ];
        }
        for t in uncut.turns {
            sums.user
                .push(part(&[USER, &t.turn.user_query, "\n"], true)?);
            sums.answer
                .push(part(&[ASSISTANT, &t.turn.final_answer, "\n\n"], true)?);
        }
        Some(sums)
    }

    /// The count of the rendering of what `taken` takes.
    pub fn count(&self, taken: Taken) -> u32 {
        let len = self.user.len();
        let add = |a: u32, b: u32| a.saturating_add(b);
        if self.messages {
            let summary = if taken.summary {
                add(self.summary[0], MESSAGE_OVERHEAD)
            } else {
                0
            };
            return taken.turns(len).fold(summary, |n, i| {
                add(n, add(self.user[i], self.answer[i])).saturating_add(2 * MESSAGE_OVERHEAD)
            });
        }
        if !taken.reserved && taken.newest == 0 {
            return if taken.summary { self.summary[0] } else { 0 };
        }
        let head = if taken.summary {
            add(self.summary[1], self.header[1])
        } else {
            self.header[0]
        };
        let last = if taken.newest > 0 { len - 1 } else { 0 };
        taken.turns(len).fold(head, |n, i| {
            let answer = match i == last {
                false => self.answer[i],
                true if i == len - 1 => self.last[1],
                true => self.last[0],
            };
            add(n, add(self.user[i], answer))
        })
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::history::template::tests::turn;

    /// A count that is not additive: words, plus one for a text that
    /// begins with a space (as a SentencePiece tokenizer's prefix).
    fn words(text: &str) -> u32 {
        text.split_whitespace().count() as u32 + u32::from(text.starts_with(' '))
    }

    /// The rule by its definition: offers one at a time, each kept while
    /// the whole rendering fits.
    fn by_definition(uncut: &Uncut<'_>, format: Format, max: u32) -> (bool, Vec<u64>, u32) {
        let reserved = usize::from(uncut.reserved_first && !uncut.turns.is_empty());
        let mut offers: Vec<Option<usize>> = Vec::new();
        if uncut.summary.is_some() {
            offers.push(None);
        }
        offers.extend((0..reserved).map(Some));
        offers.extend((reserved..uncut.turns.len()).rev().map(Some));
        let (mut with_summary, mut kept, mut n) = (false, Vec::<usize>::new(), 0);
        for offer in offers {
            let (s, mut k) = (with_summary || offer.is_none(), kept.clone());
            if let Some(i) = offer {
                k.push(i);
            }
            k.sort();
            let summary = uncut.summary.filter(|_| s);
            let turns = k.iter().map(|&i| uncut.turns[i].clone()).collect();
            let c = format.render(summary, turns).count_with(words, summary);
            if c > max {
                break;
            }
            (with_summary, kept, n) = (s, k, c);
        }
        let seqs = kept.iter().map(|&i| uncut.turns[i].turn.seq).collect();
        (with_summary, seqs, n)
    }

    /// A turn of each pair of texts, seq 1 onwards.
    fn turns_of(texts: &[(String, String)]) -> Vec<SelectedTurn> {
        texts
            .iter()
            .enumerate()
            .map(|(i, (q, a))| turn(i as u64 + 1, q, a))
            .collect()
    }

    /// `words` of a text as it stands after a newline, or first.
    fn words_after(pieces: &[&str], after_newline: bool) -> Option<u32> {
        let text = pieces.concat();
        Some(match after_newline {
            true => words(&format!("\n{text}")) - words("\n"),
            false => words(&text),
        })
    }

    proptest! {
        /// `words` adds up where a text rendering is cut (its joints are
        /// before letters, which a space never is): sums of its parts are
        /// counts of whole renderings, for whatever is taken.
        #[test]
        fn sums_of_parts_are_counts_of_whole_renderings(
            texts in prop::collection::vec(("[a-z \n]{0,12}", "[a-z \n]{0,12}"), 0..8),
            summary in prop::option::of("[a-z \n]{1,20}"),
            reserved_first in any::<bool>(),
            format in prop::sample::select(Format::ALL.to_vec()),
            with_summary in any::<bool>(),
            newest in 0usize..8,
        ) {
            let turns = turns_of(&texts);
            let uncut = Uncut { summary: summary.as_deref(), turns: &turns, reserved_first };
            let reserved = reserved_first && !turns.is_empty();
            let taken = Taken {
                summary: with_summary && summary.is_some(),
                reserved,
                newest: newest.min(turns.len() - usize::from(reserved)),
            };
            let sums = Sums::of(&uncut, format, words_after).unwrap();
            prop_assert_eq!(sums.count(taken), whole(&uncut, format, taken, words));
        }

        #[test]
        fn the_cut_keeps_what_the_rule_keeps(
            texts in prop::collection::vec(("[a-z ]{0,12}", "[a-z ]{0,12}"), 0..12),
            summary in prop::option::of("[a-z ]{1,20}"),
            reserved_first in any::<bool>(),
            format in prop::sample::select(Format::ALL.to_vec()),
            max in 0u32..80,
            guess in prop::option::of(0usize..16),
        ) {
            let turns = turns_of(&texts);
            let uncut = Uncut { summary: summary.as_deref(), turns: &turns, reserved_first };
            let expected = by_definition(&uncut, format, max);

            let counts = std::cell::Cell::new(0);
            let cut = cut(&uncut, max, guess, |taken| {
                counts.set(counts.get() + 1);
                whole(&uncut, format, taken, words)
            });

            let (kept, dropped) = cut.taken.split(turns.clone());
            let seqs: Vec<u64> = kept.iter().map(|t| t.turn.seq).collect();
            prop_assert_eq!((cut.taken.summary, seqs.clone(), cut.token_count), expected);
            let mut all: Vec<u64> = dropped.iter().map(|t| t.turn.seq).collect();
            all.extend(&seqs);
            all.sort();
            all.dedup();
            prop_assert_eq!(all.len(), turns.len(), "kept and dropped are every turn");
            // A right guess costs two counts (one when it is every offer).
            if guess == Some(cut.taken.offers()) && guess != Some(0) {
                prop_assert!(counts.get() <= 2, "{} counts", counts.get());
            }
        }
    }
}
