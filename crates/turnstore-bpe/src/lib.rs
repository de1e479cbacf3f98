//! tiktoken's count of a text, `encode_ordinary(text).len()`, for
//! turnstore (its `tokens` module builds the ranks from [`tables`] and
//! compares every count with tiktoken-rs' in tests). A crate of its own so
//! that it is optimised in test builds too, as tiktoken-rs is: the merges
//! of a long piece take seconds unoptimised.
//!
//! The pre-tokenizer is tiktoken's pattern without its lookahead, on the
//! `regex` crate's automata (regex-automata's `meta::Regex`, see
//! `Splitter`); each piece counts one token
//! when it is one, else as many as tiktoken's byte-pair merge leaves
//! (tiktoken's two merges, counting here instead of collecting: adapted
//! from its Rust core as tiktoken-rs vendors it, MIT License, see
//! LICENSE-tiktoken).

use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::OnceLock;

use regex_automata::Input;
use regex_automata::meta::{Cache, Regex};
use rustc_hash::FxHashMap;

/// A token's rank.
pub type Rank = u32;

/// The ordinary tokens of tiktoken's vocabularies as rank tables, the form
/// [`Ranks::from_table`] reads: for each rank from 0 up, a byte `n`, then
/// the token's `n` bytes (no token is longer than 128 bytes); `n = 0` marks
/// a rank that is a special token (p50k's `<|endoftext|>`, 50,256).
///
/// Written from tiktoken-rs' files (the `.tiktoken` files of tiktoken, MIT
/// License, see LICENSE-tiktoken) by turnstore's test
/// `tokens::counter::tests::the_rank_tables_are_tiktoken_rs_vocabularies`,
/// which checks them against tiktoken-rs. Building o200k_base from its
/// table takes about 10 ms, where building tiktoken-rs' encoder (and
/// dropping it) took 0.3 s of CPU, paid by turnstore's start and by each of
/// its test processes.
pub mod tables {
    /// o200k_base's 199,998 tokens (o200k_harmony's too).
    pub static O200K_BASE: &[u8] = include_bytes!("../tables/o200k_base.ranks");
    /// cl100k_base's 100,256 tokens.
    pub static CL100K_BASE: &[u8] = include_bytes!("../tables/cl100k_base.ranks");
    /// p50k_base's 50,280 tokens (p50k_edit's too), ranks 0 to 50,280.
    pub static P50K_BASE: &[u8] = include_bytes!("../tables/p50k_base.ranks");
    /// r50k_base is p50k_base's first 50,256 ranks.
    pub const R50K_BASE_RANKS: usize = 50_256;
}

/// An encoding's ranks: every ordinary token's bytes, kept in one block
/// (a third of what tiktoken-rs' encoder takes, which keeps each token's
/// bytes, twice, in allocations of their own).
pub struct Ranks(FxHashMap<&'static [u8], Rank>);

impl Ranks {
    /// From every ordinary token: their bytes one after another in
    /// `block`, and each one's length and rank in that order. The block is
    /// kept for the life of the process (encoders are built once).
    pub fn new(block: Vec<u8>, tokens: Vec<(u32, Rank)>) -> Self {
        let block: &'static [u8] = block.leak();
        let mut ranks = FxHashMap::default();
        ranks.reserve(tokens.len());
        let mut at = 0;
        for (len, rank) in tokens {
            let end = at + len as usize;
            ranks.insert(&block[at..end], rank);
            at = end;
        }
        Ranks(ranks)
    }

    /// From a rank table (see [`tables`]): for each rank from 0 up, a byte
    /// `n`, then the token's `n` bytes; `n = 0` marks a rank that is no
    /// ordinary token. Only the first `limit` ranks are taken. The map's
    /// keys are the table's own bytes: nothing is copied.
    pub fn from_table(table: &'static [u8], limit: usize) -> Self {
        let mut ranks = FxHashMap::default();
        ranks.reserve(table.len() / 8);
        let (mut at, mut rank) = (0, 0);
        while at < table.len() && (rank as usize) < limit {
            let n = table[at] as usize;
            if n > 0 {
                ranks.insert(&table[at + 1..at + 1 + n], rank);
            }
            at += 1 + n;
            rank += 1;
        }
        Ranks(ranks)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// tiktoken's count of `text` as ordinary text, split by `splitter`.
    pub fn count(&self, splitter: &Splitter, text: &str) -> usize {
        let mut n = 0;
        splitter.split(text, |piece| n += self.piece(piece));
        n
    }

    /// The tokens of one piece of the pre-tokenizer.
    pub fn piece(&self, piece: &[u8]) -> usize {
        if piece.is_empty() {
            0
        } else if self.0.contains_key(piece) {
            1
        } else if piece.len() < LARGE {
            self.merged_small(piece)
        } else {
            self.merged_large(piece)
        }
    }
}

/// The pre-tokenizer patterns tiktoken-rs builds its encoders with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// o200k_base, o200k_harmony.
    O200k,
    /// cl100k_base.
    Cl100k,
    /// p50k_base, p50k_edit, r50k_base.
    P50k,
}

/// The pre-tokenizer patterns of tiktoken-rs, but for their one
/// lookahead: each ends in `\s+(?!\S)` then `\s+` or `\s`, which split a
/// run of whitespace before a non-space into the run less its last
/// character, then that character (which may begin the next piece). Here
/// they end in `\s+` instead, which the `regex` crate's automata run
/// without backtracking (3x faster than fancy-regex's VM), and `split`
/// gives the last character back (see there). cl100k's and p50k's
/// possessive quantifiers are greedy ones here: none of them is followed,
/// within its alternative, by anything that backtracking could match.
/// Tests compare every count with tiktoken-rs'.
const O200K: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}",
    r"| ?[^\s\p{L}\p{N}]+[\r\n/]*",
    r"|\s*[\r\n]+",
    r"|\s+",
);
const CL100K: &str = r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s+$|\s*[\r\n]|\s+";
const P50K: &str = r"'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+$|\s+";

/// A thread's pre-tokenizer: the pattern's regex, compiled once for the
/// process, and this thread's own search cache. (The regex's own pool of
/// caches serves only the first thread that used it without a lock; and
/// compiling the pattern per thread took ~2.5 ms on each new thread.)
pub struct Splitter {
    regex: &'static Regex,
    cache: RefCell<Cache>,
    /// The pattern's alternative for whitespace ending in a newline comes
    /// before `\s+` (o200k, cl100k): a run `\s+` matches has none.
    newline_first: bool,
    /// o200k's pieces that depend on ASCII bytes only are cut by
    /// `o200k_ascii`, without the regex.
    ascii: bool,
}

impl Splitter {
    pub fn new(pattern: Pattern) -> Self {
        static COMPILED: [OnceLock<Regex>; 3] = [const { OnceLock::new() }; 3];
        let (slot, source, newline_first) = match pattern {
            Pattern::O200k => (0, O200K, true),
            Pattern::Cl100k => (1, CL100K, true),
            Pattern::P50k => (2, P50K, false),
        };
        let regex =
            COMPILED[slot].get_or_init(|| Regex::new(source).expect("tiktoken's patterns compile"));
        Splitter {
            regex,
            cache: RefCell::new(regex.create_cache()),
            newline_first,
            ascii: pattern == Pattern::O200k,
        }
    }

    /// Calls `f` with each piece of `text`, as tiktoken's pattern splits it.
    /// A match of the final `\s+` is a whole run of whitespace: followed by
    /// a non-space (not the end), tiktoken's `\s+(?!\S)` takes it less its
    /// last character, when that leaves one. No other alternative matches
    /// whitespace alone, but the newline ones (o200k, cl100k), whose
    /// matches end in a newline, and `\s+$`, which ends the text.
    /// Pieces whose bytes, and the bytes that decide where they end, are
    /// ASCII are cut without the regex (o200k, see `o200k_ascii`).
    pub fn split(&self, text: &str, f: impl FnMut(&[u8])) {
        self.split_as(text, self.ascii, f)
    }

    /// `split`, with or without its ASCII cuts (`ascii`), for tests that
    /// compare the two.
    #[doc(hidden)]
    pub fn split_as(&self, text: &str, ascii: bool, mut f: impl FnMut(&[u8])) {
        let cache = &mut *self.cache.borrow_mut();
        let bytes = text.as_bytes();
        let mut at = 0;
        while at < text.len() {
            if ascii && let Some(end) = o200k_ascii(bytes, at) {
                f(&bytes[at..end]);
                at = end;
                continue;
            }
            let Some(m) = self
                .regex
                .search_with(cache, &Input::new(text).span(at..text.len()))
            else {
                break;
            };
            let piece = &text[m.range()];
            let mut end = m.end();
            if end < text.len()
                && let Some((last_at, last)) = piece.char_indices().next_back()
                && last_at > 0
                && last.is_whitespace()
                && !(self.newline_first && matches!(last, '\r' | '\n'))
                && piece.chars().all(char::is_whitespace)
            {
                end = m.start() + last_at;
            }
            f(&text.as_bytes()[m.start()..end]);
            at = end;
        }
    }
}

/// What o200k's pattern sees in an ASCII byte: an upper or lower case
/// letter, a digit, `\r` or `\n`, other white space (`\s`: tab, vertical
/// tab, form feed, space), anything else (`[^\s\p{L}\p{N}]`); `NA` for a
/// byte of a character beyond ASCII, `END` past the text.
const NA: u8 = 0;
const UP: u8 = 1;
const LO: u8 = 2;
const DIGIT: u8 = 3;
const NL: u8 = 4;
const WS: u8 = 5;
const OTHER: u8 = 6;
const END: u8 = 7;

static CLASS: [u8; 256] = {
    let mut t = [NA; 256];
    let mut b = 0;
    while b < 128 {
        t[b] = match b as u8 {
            b'A'..=b'Z' => UP,
            b'a'..=b'z' => LO,
            b'0'..=b'9' => DIGIT,
            b'\r' | b'\n' => NL,
            b'\t' | 0x0b | 0x0c | b' ' => WS,
            _ => OTHER,
        };
        b += 1;
    }
    t
};

/// Where o200k's piece starting at `at` ends, when every byte that decides
/// it is ASCII (else `None`: the regex cuts it). The pattern's
/// alternatives, in their order, on ASCII (each takes what its greedy
/// quantifiers can, as nothing after them asks for less):
/// 1, 2. `[^\r\n\p{L}\p{N}]?` then upper case letters then lower case ones,
///    at least one letter, then a contraction (`'s`, `'T`, `'re`...);
/// 3. one to three digits;
/// 4. an optional space, then other characters, then `[\r\n/]*`;
/// 5. white space through its last `\r` or `\n`;
/// 6. white space, less its last character when more follows (`split`'s
///    lookahead).
/// A test compares every cut with the regex's, on every short text of a
/// few ASCII and non-ASCII characters.
fn o200k_ascii(b: &[u8], at: usize) -> Option<usize> {
    let class = |i: usize| b.get(i).map_or(END, |&c| CLASS[c as usize]);
    let c = class(at);
    // 1, 2.
    let mut end = if c == WS || c == OTHER { at + 1 } else { at };
    let letters = end;
    loop {
        match class(end) {
            UP => end += 1,
            NA => return None,
            _ => break,
        }
    }
    loop {
        match class(end) {
            LO => end += 1,
            NA => return None,
            _ => break,
        }
    }
    if end > letters {
        if b.get(end) != Some(&b'\'') {
            return Some(end);
        }
        let folded = |i: usize| match class(i) {
            NA => None,
            _ => Some(b.get(i).map_or(0, u8::to_ascii_lowercase)),
        };
        return match folded(end + 1)? {
            b's' | b't' | b'm' | b'd' => Some(end + 2),
            b'r' | b'v' if folded(end + 2)? == b'e' => Some(end + 3),
            b'l' if folded(end + 2)? == b'l' => Some(end + 3),
            _ => Some(end),
        };
    }
    match c {
        // 3.
        DIGIT => {
            let mut end = at + 1;
            while end < at + 3 {
                match class(end) {
                    DIGIT => end += 1,
                    NA => return None,
                    _ => break,
                }
            }
            Some(end)
        }
        // 4.
        OTHER => others(b, at + 1, class),
        WS if b[at] == b' ' => match class(at + 1) {
            OTHER => others(b, at + 2, class),
            NA => None,
            _ => whitespace(b, at, class),
        },
        // 5, 6.
        NL | WS => whitespace(b, at, class),
        _ => None,
    }
}

/// The end of o200k's fourth alternative, its other characters seen up
/// to `end`.
fn others(b: &[u8], mut end: usize, class: impl Fn(usize) -> u8) -> Option<usize> {
    loop {
        match class(end) {
            OTHER => end += 1,
            NA => return None,
            _ => break,
        }
    }
    while matches!(b.get(end), Some(b'\r' | b'\n' | b'/')) {
        end += 1;
    }
    Some(end)
}

/// The end of o200k's white space piece at `at` (alternatives 5 and 6).
fn whitespace(b: &[u8], at: usize, class: impl Fn(usize) -> u8) -> Option<usize> {
    let (mut end, mut newline) = (at, None);
    loop {
        match class(end) {
            WS => end += 1,
            NL => {
                newline = Some(end);
                end += 1;
            }
            NA => return None,
            _ => break,
        }
    }
    Some(match newline {
        Some(nl) => nl + 1,
        None if end < b.len() && end - at >= 2 => end - 1,
        None => end,
    })
}

/// Pieces this long are merged with a heap, as tiktoken-rs does: its
/// linear merge is quadratic in the piece.
const LARGE: usize = 100;

impl Ranks {
    fn rank(&self, bytes: &[u8]) -> Rank {
        self.0.get(bytes).copied().unwrap_or(Rank::MAX)
    }

    /// The tokens of a piece of two bytes or more, merged as tiktoken-rs'
    /// `_byte_pair_merge` does: each round merges the lowest-ranked
    /// adjacent pair, the leftmost among equals. Linear rounds, for short
    /// pieces.
    pub fn merged_small(&self, piece: &[u8]) -> usize {
        // (start, rank of the part starting there merged with the next).
        let mut parts: Vec<(usize, Rank)> = (0..piece.len() - 1)
            .map(|i| (i, self.rank(&piece[i..i + 2])))
            .collect();
        parts.push((piece.len() - 1, Rank::MAX));
        parts.push((piece.len(), Rank::MAX));
        // The rank of parts i and i + 1 merged, once i + 1 is gone.
        let after = |parts: &[(usize, Rank)], i: usize| {
            if i + 3 < parts.len() {
                self.rank(&piece[parts[i].0..parts[i + 3].0])
            } else {
                Rank::MAX
            }
        };
        loop {
            let (i, min) = parts[..parts.len() - 1].iter().enumerate().fold(
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

    /// The same merge with a heap (tiktoken-rs' `_byte_pair_merge_large`),
    /// for long pieces: the piece's bytes less the merges made.
    pub fn merged_large(&self, piece: &[u8]) -> usize {
        /// The part beginning at a byte: the part before it, where it
        /// ends, where the part after it ends, and the rank of the two
        /// merged (`Rank::MAX`: not a token).
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
            let rank = self.rank(&piece[i..i + 2]);
            if rank != Rank::MAX {
                heap.push(Reverse((rank, i)));
                parts[i].next_rank = rank;
            }
        }
        let pair = |parts: &mut Vec<Part>, heap: &mut BinaryHeap<_>, start: usize, end: usize| {
            parts[start].next_end = end;
            parts[start].next_rank = Rank::MAX;
            if end <= piece.len() {
                let rank = self.rank(&piece[start..end]);
                if rank != Rank::MAX {
                    heap.push(Reverse((rank, start)));
                    parts[start].next_rank = rank;
                }
            }
        };
        let mut merges = 0;
        while let Some(Reverse((rank, left))) = heap.pop() {
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
}

#[cfg(test)]
mod tests {
    use super::{Pattern, Splitter};

    fn pieces(s: &Splitter, text: &str, ascii: bool) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        s.split_as(text, ascii, |p| out.push(p.to_vec()));
        out
    }

    /// Every text of up to five characters from an alphabet of each class
    /// the pattern tells apart (letters of both cases, the contractions'
    /// letters, digits, newlines, other white space, other characters),
    /// ASCII and not: o200k's ASCII cuts are the regex's.
    #[test]
    fn ascii_cuts_are_the_regexs_on_every_short_text() {
        let s = Splitter::new(Pattern::O200k);
        let alphabet = [
            'a', 'Z', 's', 'l', 'E', ' ', '\n', '\r', '\t', '1', '\'', '/', '!', 'é', '\u{a0}',
            'ſ', '²',
        ];
        let mut texts = vec![String::new()];
        let mut compared = 0;
        for _ in 0..5 {
            let mut longer = Vec::with_capacity(texts.len() * alphabet.len());
            for t in &texts {
                for &c in &alphabet {
                    let mut u = t.clone();
                    u.push(c);
                    assert_eq!(pieces(&s, &u, true), pieces(&s, &u, false), "{u:?}");
                    compared += 1;
                    longer.push(u);
                }
            }
            texts = longer;
        }
        assert!(compared > 1_000_000, "{compared}");
    }

    /// Every contraction, in every case, after letters of both cases and
    /// after none, before each of a few characters.
    #[test]
    fn ascii_cuts_are_the_regexs_on_contractions() {
        let s = Splitter::new(Pattern::O200k);
        for c in ["s", "t", "re", "ve", "m", "ll", "d", "x", "r", "v", "l"] {
            let cases = 1 << c.len();
            for case in 0..cases {
                let word: String = c
                    .chars()
                    .enumerate()
                    .map(|(i, ch)| {
                        if case >> i & 1 == 1 {
                            ch.to_ascii_uppercase()
                        } else {
                            ch
                        }
                    })
                    .collect();
                for before in ["a", "A", "aB", "Ab", " a", "!", "1", ""] {
                    for after in ["", "a", "E", " ", "'", "\n", "é", "ſ", "e", "l"] {
                        let text = format!("{before}'{word}{after}");
                        assert_eq!(
                            pieces(&s, &text, true),
                            pieces(&s, &text, false),
                            "{text:?}"
                        );
                    }
                }
            }
        }
    }

    /// Longer texts of every ASCII character and a few others, at random.
    #[test]
    fn ascii_cuts_are_the_regexs_on_random_texts() {
        let s = Splitter::new(Pattern::O200k);
        let others = ['é', '’', '\u{85}', '\u{3000}', 'Ω', '٣', 'ſ', '😀'];
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for _ in 0..50_000 {
            let len = next(48) as usize;
            let text: String = (0..len)
                .map(|_| match next(40) {
                    0 => others[next(others.len() as u64) as usize],
                    1..=8 => ' ',
                    9 => '\n',
                    _ => char::from(next(128) as u8),
                })
                .collect();
            assert_eq!(
                pieces(&s, &text, true),
                pieces(&s, &text, false),
                "{text:?}"
            );
        }
    }
}
