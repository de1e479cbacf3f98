//! tiktoken's count, with a pre-tokenizer search cache per thread.
//!
//! tiktoken-rs keeps 128 clones of one `fancy_regex::Regex` so that threads
//! do not share one, but fancy-regex's clones share their program and its
//! scratch and cache pools (`Arc<Prog>`), whose fast path serves only the
//! first thread that used them: every other thread took the pools'
//! mutex-guarded slow path on each count (~5% of the service's CPU in the
//! core loop, `bench/profile`). Its pattern also needs fancy-regex's
//! backtracking VM for one lookahead. So the ranks are taken once from
//! tiktoken-rs' encoder, which is then dropped, and counted by
//! `turnstore_bpe`: the pattern without its lookahead on regex-automata's
//! meta regex, compiled once, with a search cache per thread, and
//! tiktoken's byte-pair merges, counting. Tests compare its counts with
//! tiktoken-rs' in every encoding.

use std::cell::OnceCell;
use std::collections::HashSet;
use std::sync::OnceLock;

use tiktoken_rs::{CoreBPE, Rank};
use turnstore_bpe::{Pattern, Ranks, Splitter};

use super::Encoding;

static RANKS: [OnceLock<Ranks>; 6] = [const { OnceLock::new() }; 6];

/// Whether the encoding's ranks are built (see [`Encoding::ready`]).
pub(super) fn is_built(encoding: Encoding) -> bool {
    RANKS[encoding.slot()].get().is_some()
}

fn ranks(encoding: Encoding) -> &'static Ranks {
    RANKS[encoding.slot()].get_or_init(|| {
        // tiktoken-rs' encoder is dropped before the map is built: the
        // start's peak holds one of them, and the tokens' bytes.
        let (block, tokens) = ordinary_tokens(&tiktoken(encoding));
        let ranks = Ranks::new(block, tokens);
        // mimalloc (main.rs) keeps freed memory for reuse: give back the
        // encoder's ~30 MB now.
        // SAFETY: mi_collect takes no pointer; it frees nothing in use.
        unsafe { libmimalloc_sys::mi_collect(true) };
        ranks
    })
}

/// The ordinary tokens of `bpe`, their bytes one after another and each
/// one's length and rank: ranks from 0 up, but its special tokens, to the
/// first that is neither (tiktoken's files number their tokens densely;
/// p50k's special token sits between ordinary ones).
fn ordinary_tokens(bpe: &CoreBPE) -> (Vec<u8>, Vec<(u32, Rank)>) {
    let special: HashSet<Rank> = bpe
        .special_tokens()
        .into_iter()
        .flat_map(|s| bpe.encode_with_special_tokens(s))
        .collect();
    let (mut block, mut tokens) = (Vec::new(), Vec::new());
    for rank in 0.. {
        if special.contains(&rank) {
            continue;
        }
        match bpe.decode_bytes(&[rank]) {
            Ok(bytes) => {
                block.extend_from_slice(&bytes);
                tokens.push((bytes.len() as u32, rank));
            }
            Err(_) => break,
        }
    }
    (block, tokens)
}

#[cfg(test)]
pub(super) fn ranked(encoding: Encoding) -> usize {
    ranks(encoding).len()
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

fn pattern(encoding: Encoding) -> Pattern {
    match encoding {
        Encoding::O200kBase | Encoding::O200kHarmony => Pattern::O200k,
        Encoding::Cl100kBase => Pattern::Cl100k,
        Encoding::P50kBase | Encoding::P50kEdit | Encoding::R50kBase => Pattern::P50k,
    }
}

thread_local! {
    /// This thread's pre-tokenizers (its search caches), by encoding slot.
    static SPLITTERS: [OnceCell<Splitter>; 6] = const { [const { OnceCell::new() }; 6] };
}

/// Builds the encoding's ranks and compiles its pattern now (a count
/// does), so the first request does not pay.
pub(super) fn warm_up(encoding: Encoding) {
    count(encoding, "warm up");
}

/// tiktoken's count of `text` as ordinary text.
pub(super) fn count(encoding: Encoding, text: &str) -> usize {
    let ranks = ranks(encoding);
    SPLITTERS.with(|splitters| {
        let splitter = splitters[encoding.slot()].get_or_init(|| Splitter::new(pattern(encoding)));
        ranks.count(splitter, text)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_pieces_merge_as_short_ones_do() {
        let ranks = ranks(Encoding::O200kBase);
        for piece in [
            "abcdefghij".repeat(12),
            "Supercalifragilisticexpialidocious".repeat(4),
            "漢字かな".repeat(10),
            "\u{301}e".repeat(60),
        ] {
            let bytes = piece.as_bytes();
            assert!(bytes.len() >= 100);
            assert_eq!(
                ranks.merged_large(bytes),
                ranks.merged_small(bytes),
                "{piece:?}"
            );
        }
    }
}
