//! tiktoken's count, with a pre-tokenizer search cache per thread.
//!
//! tiktoken-rs keeps 128 clones of one `fancy_regex::Regex` so that threads
//! do not share one, but fancy-regex's clones share their program and its
//! scratch and cache pools (`Arc<Prog>`), whose fast path serves only the
//! first thread that used them: every other thread took the pools'
//! mutex-guarded slow path on each count (~5% of the service's CPU in the
//! core loop, `bench/profile`). Its pattern also needs fancy-regex's
//! backtracking VM for one lookahead. So counts are `turnstore_bpe`'s: the
//! pattern without its lookahead on regex-automata's meta regex, compiled
//! once, with a search cache per thread, and tiktoken's byte-pair merges,
//! counting, over the ranks of `turnstore_bpe::tables` (tiktoken-rs'
//! vocabularies; building them from its encoder took 0.3 s of CPU, most of
//! a test process's). Tests compare the tables and every count with
//! tiktoken-rs'.

use std::cell::OnceCell;
use std::sync::OnceLock;

use turnstore_bpe::{Pattern, Ranks, Splitter, tables};

use super::Encoding;

static RANKS: [OnceLock<Ranks>; 6] = [const { OnceLock::new() }; 6];

/// Whether the encoding's ranks are built (see [`Encoding::ready`]).
pub(super) fn is_built(encoding: Encoding) -> bool {
    RANKS[encoding.slot()].get().is_some()
}

fn ranks(encoding: Encoding) -> &'static Ranks {
    RANKS[encoding.slot()].get_or_init(|| {
        let (table, limit) = table(encoding);
        Ranks::from_table(table, limit)
    })
}

/// The encoding's rank table, and how many of its ranks it takes.
fn table(encoding: Encoding) -> (&'static [u8], usize) {
    match encoding {
        Encoding::O200kBase | Encoding::O200kHarmony => (tables::O200K_BASE, usize::MAX),
        Encoding::Cl100kBase => (tables::CL100K_BASE, usize::MAX),
        Encoding::P50kBase | Encoding::P50kEdit => (tables::P50K_BASE, usize::MAX),
        Encoding::R50kBase => (tables::P50K_BASE, tables::R50K_BASE_RANKS),
    }
}

#[cfg(test)]
pub(super) fn ranked(encoding: Encoding) -> usize {
    ranks(encoding).len()
}

/// A fresh encoder of tiktoken-rs (its singletons would keep a second copy).
#[cfg(test)]
pub(super) fn tiktoken(encoding: Encoding) -> tiktoken_rs::CoreBPE {
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
    use std::collections::HashSet;

    use super::*;

    /// tiktoken-rs' ordinary tokens of `encoding` as a rank table (see
    /// `turnstore_bpe::tables`): ranks from 0 up to the last ordinary one,
    /// its special tokens marked as no token.
    fn table_of_tiktoken_rs(encoding: Encoding) -> Vec<u8> {
        let bpe = tiktoken(encoding);
        let special: HashSet<u32> = bpe
            .special_tokens()
            .into_iter()
            .flat_map(|s| bpe.encode_with_special_tokens(s))
            .collect();
        let mut table = Vec::new();
        for rank in 0.. {
            if special.contains(&rank) {
                table.push(0);
                continue;
            }
            match bpe.decode_bytes(&[rank]) {
                Ok(bytes) => {
                    table.push(u8::try_from(bytes.len()).expect("a token of at most 255 bytes"));
                    table.extend_from_slice(&bytes);
                }
                Err(_) => break,
            }
        }
        // Special tokens after the last ordinary one are no rank of it.
        while table.last() == Some(&0) {
            table.pop();
        }
        table
    }

    /// The tables turnstore counts with hold tiktoken-rs' vocabularies,
    /// byte for byte. `TURNSTORE_WRITE_RANK_TABLES=1` writes them anew
    /// (after an update of tiktoken-rs), then this checks them.
    #[test]
    fn the_rank_tables_are_tiktoken_rs_vocabularies() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/crates/turnstore-bpe/tables");
        if std::env::var_os("TURNSTORE_WRITE_RANK_TABLES").is_some() {
            for (name, enc) in [
                ("o200k_base", Encoding::O200kBase),
                ("cl100k_base", Encoding::Cl100kBase),
                ("p50k_base", Encoding::P50kBase),
            ] {
                std::fs::write(format!("{dir}/{name}.ranks"), table_of_tiktoken_rs(enc)).unwrap();
            }
            panic!(
                "wrote {dir}: build again, then run this test without TURNSTORE_WRITE_RANK_TABLES"
            );
        }
        for enc in Encoding::ALL {
            let (bundled, limit) = table(enc);
            let ours = table_of_tiktoken_rs(enc);
            // The first `limit` ranks of the bundled table.
            let (mut at, mut rank) = (0, 0);
            while at < bundled.len() && rank < limit {
                at += 1 + bundled[at] as usize;
                rank += 1;
            }
            assert!(
                bundled[..at] == ours[..],
                "{enc:?}: crates/turnstore-bpe/tables differ from tiktoken-rs' vocabulary \
                 ({} against {} bytes); write them anew with TURNSTORE_WRITE_RANK_TABLES=1",
                at,
                ours.len()
            );
        }
    }

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
