//! The budget rule on counts of whole renderings, for tokenizers whose
//! counts of parts need not add up to the count of the parts joined (a
//! loaded Hugging Face tokenizer: a SentencePiece one's leading space,
//! say; see `tokens::LoadedTokenizer`). `select.rs` sums counts of parts
//! taken where they stand in a tiktoken rendering; here a selection made
//! without a token bound is cut back to what the rule keeps, counting
//! renderings whole.
//!
//! The rule is the same: candidates are offered in order (the summary,
//! the reserved first turn with `keep_first`, then the newest turns), and
//! the first that does not fit stops the selection. The longest run of
//! offers whose rendering fits is found by bisection, as counts grow with
//! what is added to a rendering: a count of every prefix would be
//! quadratic in the selection.

use super::candidate::SelectedTurn;
use super::format::Format;

/// A selection to cut back: the summary it begins with and its turns,
/// oldest first (the first the reserved one when `reserved_first`).
pub struct Uncut<'a> {
    pub summary: Option<&'a str>,
    pub turns: Vec<SelectedTurn>,
    pub reserved_first: bool,
}

/// What the rule keeps of an [`Uncut`] selection.
#[derive(Debug)]
pub struct Cut {
    pub summary: bool,
    /// Oldest first.
    pub turns: Vec<SelectedTurn>,
    /// The rendering's count.
    pub token_count: u32,
    /// The turns left out, oldest first: a run just below the newest
    /// kept (and above the reserved first turn, unless nothing is kept).
    pub dropped: Vec<SelectedTurn>,
}

/// Cuts `uncut` back to the longest run of its offers whose rendering in
/// `format` counts at most `max_tokens` with `count`.
pub fn cut(uncut: Uncut<'_>, format: Format, max_tokens: u32, count: impl Fn(&str) -> u32) -> Cut {
    let Uncut {
        summary,
        turns,
        reserved_first,
    } = uncut;
    let reserved = usize::from(reserved_first && !turns.is_empty());
    let offers = usize::from(summary.is_some()) + turns.len();
    // The rendering of the first `j` offers, and its count.
    let take = |j: usize| -> (bool, Vec<SelectedTurn>) {
        let with_summary = summary.is_some() && j >= 1;
        let turns_taken = j - usize::from(summary.is_some()).min(j);
        let mut kept: Vec<SelectedTurn> = turns[..reserved.min(turns_taken)].to_vec();
        let newest = turns_taken.saturating_sub(reserved);
        kept.extend_from_slice(&turns[turns.len() - newest..]);
        (with_summary, kept)
    };
    let counted = |j: usize| -> u32 {
        let (with_summary, kept) = take(j);
        let s = summary.filter(|_| with_summary);
        format.render(s, kept).count_with(&count, s)
    };
    // The largest j whose rendering fits: 0 always does (nothing at all).
    let (mut fits, mut over) = (0, offers + 1);
    let mut fits_count = 0;
    while over - fits > 1 {
        let mid = fits + (over - fits) / 2;
        let n = counted(mid);
        if n <= max_tokens {
            (fits, fits_count) = (mid, n);
        } else {
            over = mid;
        }
    }
    let (with_summary, kept) = take(fits);
    // Those not kept: the run below the newest kept, and the reserved
    // turn too when nothing is kept.
    let newest = kept.len().saturating_sub(reserved);
    let from = if kept.is_empty() { 0 } else { reserved };
    let dropped = turns[from..turns.len() - newest].to_vec();
    Cut {
        summary: with_summary,
        turns: kept,
        token_count: fits_count,
        dropped,
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

    proptest! {
        #[test]
        fn the_cut_keeps_what_the_rule_keeps(
            texts in prop::collection::vec(("[a-z ]{0,12}", "[a-z ]{0,12}"), 0..12),
            summary in prop::option::of("[a-z ]{1,20}"),
            reserved_first in any::<bool>(),
            format in prop::sample::select(Format::ALL.to_vec()),
            max in 0u32..80,
        ) {
            let turns: Vec<SelectedTurn> = texts
                .iter()
                .enumerate()
                .map(|(i, (q, a))| turn(i as u64 + 1, q, a))
                .collect();
            let uncut = Uncut { summary: summary.as_deref(), turns: turns.clone(), reserved_first };
            let expected = by_definition(&uncut, format, max);

            let cut = cut(uncut, format, max, words);

            let seqs: Vec<u64> = cut.turns.iter().map(|t| t.turn.seq).collect();
            prop_assert_eq!((cut.summary, seqs.clone(), cut.token_count), expected);
            let mut all: Vec<u64> = cut.dropped.iter().map(|t| t.turn.seq).collect();
            all.extend(&seqs);
            all.sort();
            all.dedup();
            prop_assert_eq!(all.len(), turns.len(), "kept and dropped are every turn");
        }
    }
}
