//! tiktoken's count, with the pre-tokenizer's regex compiled per thread.
//!
//! tiktoken-rs keeps 128 clones of one `fancy_regex::Regex` so that threads
//! do not share one, but fancy-regex's clones share their program and its
//! scratch and cache pools (`Arc<Prog>`), whose fast path serves only the
//! first thread that used them: every other thread took the pools'
//! mutex-guarded slow path on each count (~5% of the service's CPU in the
//! core loop, `bench/profile`). So the ranks are taken once from
//! tiktoken-rs' encoder, which is then dropped, and each thread compiles
//! the pattern on its first count. The count is tiktoken's
//! `encode_ordinary(text).len()`: the same pattern splits the text into
//! pieces, each one token when it is one, else as many as its byte-pair
//! merge leaves (tiktoken-rs' two merges, here counting); tests compare
//! the two counts in every encoding.

use std::cell::OnceCell;
use std::collections::{BinaryHeap, HashSet};
use std::sync::OnceLock;

use fancy_regex::Regex;
use rustc_hash::FxHashMap;
use tiktoken_rs::{CoreBPE, Rank};

use super::Encoding;

/// The pre-tokenizer patterns, as tiktoken-rs builds its encoders with them.
const O200K: &str = tiktoken_rs::O200K_BASE_PAT_STR;
const CL100K: &str = "'(?i:[sdmt]|ll|ve|re)|[^\\r\\n\\p{L}\\p{N}]?+\\p{L}++|\\p{N}{1,3}+| ?[^\\s\\p{L}\\p{N}]++[\\r\\n]*+|\\s++$|\\s*[\\r\\n]|\\s+(?!\\S)|\\s";
const P50K: &str =
    "'(?:[sdmt]|ll|ve|re)| ?\\p{L}++| ?\\p{N}++| ?[^\\s\\p{L}\\p{N}]++|\\s++$|\\s+(?!\\S)|\\s";

/// An encoding's ranks: every ordinary token's bytes, kept in one block
/// (a third of what tiktoken-rs' encoder takes, which keeps each token's
/// bytes, twice, in allocations of their own).
pub(super) struct Ranks(FxHashMap<&'static [u8], Rank>);

impl Ranks {
    fn of(encoding: Encoding) -> &'static Ranks {
        static RANKS: [OnceLock<Ranks>; 6] = [const { OnceLock::new() }; 6];
        RANKS[encoding.slot()].get_or_init(|| {
            let ranks = Ranks::from_bpe(&tiktoken(encoding));
            // mimalloc (main.rs) keeps freed memory for reuse: give back
            // the encoder's ~30 MB now.
            // SAFETY: mi_collect takes no pointer; it frees nothing in use.
            unsafe { libmimalloc_sys::mi_collect(true) };
            ranks
        })
    }

    /// The ordinary tokens of `bpe`: ranks from 0 up, but its special
    /// tokens, to the first that is neither (tiktoken's files number their
    /// tokens densely; p50k's special token sits between ordinary ones).
    fn from_bpe(bpe: &CoreBPE) -> Ranks {
        let special: HashSet<Rank> = bpe
            .special_tokens()
            .into_iter()
            .flat_map(|s| bpe.encode_with_special_tokens(s))
            .collect();
        let mut tokens = Vec::new();
        for rank in 0.. {
            if special.contains(&rank) {
                continue;
            }
            match bpe.decode_bytes(&[rank]) {
                Ok(bytes) => tokens.push((bytes, rank)),
                Err(_) => break,
            }
        }
        let block: &'static [u8] = tokens
            .iter()
            .flat_map(|(b, _)| b.iter().copied())
            .collect::<Vec<u8>>()
            .leak();
        let mut ranks = FxHashMap::default();
        ranks.reserve(tokens.len());
        let mut at = 0;
        for (bytes, rank) in &tokens {
            ranks.insert(&block[at..at + bytes.len()], *rank);
            at += bytes.len();
        }
        Ranks(ranks)
    }

    #[cfg(test)]
    pub(super) fn len(encoding: Encoding) -> usize {
        Ranks::of(encoding).0.len()
    }
}

/// A fresh encoder of tiktoken-rs (its singletons would keep a second copy).
pub(super) fn tiktoken(encoding: Encoding) -> CoreBPE {
    use tiktoken_rs as t;
    match encoding {
        Encoding::O200kBase => t::o200k_base(),
        Encoding::O200kHarmony => t::o200k_harmony(),
        Encoding::Cl100kBase => t::cl100k_base(),
        Encoding::P50kBase => t::p50k_base(),
        Encoding::P50kEdit => t::p50k_edit(),
        Encoding::R50kBase => t::r50k_base(),
    }
    .expect("tiktoken-rs builds its bundled encodings")
}

fn pattern(encoding: Encoding) -> &'static str {
    match encoding {
        Encoding::O200kBase | Encoding::O200kHarmony => O200K,
        Encoding::Cl100kBase => CL100K,
        Encoding::P50kBase | Encoding::P50kEdit | Encoding::R50kBase => P50K,
    }
}

thread_local! {
    /// This thread's pre-tokenizers, by encoding slot.
    static SPLITTERS: [OnceCell<Regex>; 6] = const { [const { OnceCell::new() }; 6] };
}

/// Builds the encoding's ranks now, so the first request does not pay.
pub(super) fn warm_up(encoding: Encoding) {
    Ranks::of(encoding);
}

/// tiktoken's count of `text` as ordinary text.
pub(super) fn count(encoding: Encoding, text: &str) -> usize {
    let ranks = &Ranks::of(encoding).0;
    SPLITTERS.with(|splitters| {
        let splitter = splitters[encoding.slot()]
            .get_or_init(|| Regex::new(pattern(encoding)).expect("tiktoken's patterns compile"));
        let mut n = 0;
        for piece in splitter.find_iter(text) {
            // As tiktoken-rs does: its patterns do not backtrack past the
            // limit (see `huge_whitespace_runs_do_not_panic`).
            let piece = piece
                .expect("tiktoken's patterns match")
                .as_str()
                .as_bytes();
            n += if piece.is_empty() {
                0
            } else if ranks.contains_key(piece) {
                1
            } else if piece.len() < LARGE {
                merged_len_small(ranks, piece)
            } else {
                merged_len(ranks, piece)
            };
        }
        n
    })
}

/// Pieces this long are merged with a heap, as tiktoken-rs does: its
/// linear merge is quadratic in the piece.
const LARGE: usize = 100;

/// The tokens of a piece of two bytes or more: tiktoken-rs'
/// `_byte_pair_merge` (MIT), counting the parts it leaves. Each round
/// merges the lowest-ranked adjacent pair, the leftmost among equals.
fn merged_len_small(ranks: &FxHashMap<&'static [u8], Rank>, piece: &[u8]) -> usize {
    let rank = |a: usize, b: usize| ranks.get(&piece[a..b]).copied().unwrap_or(Rank::MAX);
    // (start, rank of the part starting there merged with the next).
    let mut parts: Vec<(usize, Rank)> = (0..piece.len() - 1).map(|i| (i, rank(i, i + 2))).collect();
    parts.push((piece.len() - 1, Rank::MAX));
    parts.push((piece.len(), Rank::MAX));
    // The rank of parts i and i + 1 merged, once i + 1 is gone.
    let after = |parts: &[(usize, Rank)], i: usize| {
        if i + 3 < parts.len() {
            rank(parts[i].0, parts[i + 3].0)
        } else {
            Rank::MAX
        }
    };
    loop {
        let (i, min) =
            parts[..parts.len() - 1]
                .iter()
                .enumerate()
                .fold(
                    (0, Rank::MAX),
                    |m, (i, &(_, r))| if r < m.1 { (i, r) } else { m },
                );
        if min == Rank::MAX {
            return parts.len() - 1;
        }
        if i > 0 {
            parts[i - 1].1 = after(&parts, i - 1);
        }
        parts[i].1 = after(&parts, i);
        parts.remove(i + 1);
    }
}

/// The tokens of a piece of at least two bytes: its bytes less the merges
/// the byte-pair merge makes. tiktoken-rs' `_byte_pair_merge_large` (MIT),
/// counting merges instead of keeping ranks: always the lowest-ranked pair,
/// the leftmost among equals, as its linear merge picks.
fn merged_len(ranks: &FxHashMap<&'static [u8], Rank>, piece: &[u8]) -> usize {
    /// The part beginning at a byte: where it begins (`prev`: the part
    /// before), ends, where the part after it ends, and the rank of the
    /// two merged (`Rank::MAX`: not a token).
    struct Part {
        prev: usize,
        end: usize,
        next_end: usize,
        next_rank: Rank,
    }
    let mut parts: Vec<Part> = (0..piece.len())
        .map(|i| Part {
            prev: i.wrapping_sub(1),
            end: i + 1,
            next_end: i + 2,
            next_rank: Rank::MAX,
        })
        .collect();
    // Min-heap by (rank, start).
    let mut heap = BinaryHeap::with_capacity(piece.len());
    for i in 0..piece.len() - 1 {
        if let Some(&rank) = ranks.get(&piece[i..i + 2]) {
            heap.push(std::cmp::Reverse((rank, i)));
            parts[i].next_rank = rank;
        }
    }
    let mut merges = 0;
    let pair = |parts: &mut Vec<Part>, heap: &mut BinaryHeap<_>, start: usize, end: usize| {
        parts[start].next_end = end;
        parts[start].next_rank = Rank::MAX;
        if end <= piece.len()
            && let Some(&rank) = ranks.get(&piece[start..end])
        {
            heap.push(std::cmp::Reverse((rank, start)));
            parts[start].next_rank = rank;
        }
    };
    while let Some(std::cmp::Reverse((rank, left))) = heap.pop() {
        if rank != parts[left].next_rank {
            continue; // invalidated by an earlier merge
        }
        let right = parts[left].end;
        let right_end = parts[left].next_end;
        let after = parts[right].next_end;
        parts[left].end = right_end;
        pair(&mut parts, &mut heap, left, after);
        if right_end < parts.len() {
            parts[right_end].prev = left;
        }
        if left > 0 {
            let prev = parts[left].prev;
            pair(&mut parts, &mut heap, prev, right_end);
        }
        parts[right].next_rank = Rank::MAX;
        merges += 1;
    }
    piece.len() - merges
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_pieces_merge_as_short_ones_do() {
        let ranks = &Ranks::of(Encoding::O200kBase).0;
        for piece in [
            "abcdefghij".repeat(12),
            "Supercalifragilisticexpialidocious".repeat(4),
            "漢字かな".repeat(10),
            "\u{301}e".repeat(60),
        ] {
            let bytes = piece.as_bytes();
            assert!(bytes.len() >= LARGE);
            assert_eq!(
                merged_len(ranks, bytes),
                merged_len_small(ranks, bytes),
                "{piece:?}"
            );
        }
    }
}
