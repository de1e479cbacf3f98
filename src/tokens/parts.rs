//! A loaded tokenizer's counts of the parts of renderings, kept so that a
//! read counts each turn once (see `history::exact::Sums`): a count of a
//! long text in a loaded tokenizer takes far longer than a read.
//!
//! A part is known by a 128-bit hash of its text, keyed by a secret drawn
//! at start (xxh3 with a random secret: texts that collide cannot be made
//! without it). At most [`SHARDS`] × [`PER_SHARD`] parts a tokenizer; a
//! full shard lets about half its parts go (those with one bit of their
//! key set, a different bit each time), counted again when read.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use xxhash_rust::xxh3::Xxh3;

const SHARDS: usize = 16;
/// 16 × 16,384 = 262,144 parts: about 10 MB a tokenizer at most.
pub const PER_SHARD: usize = 1 << 14;

/// The secret's size (xxh3's).
const SECRET: usize = 192;

pub struct PartCounts {
    secret: [u8; SECRET],
    shards: Vec<Mutex<Shard>>,
    /// How many parts were counted (and kept).
    counted: AtomicU64,
}

#[derive(Default)]
struct Shard {
    counts: HashMap<u128, u32>,
    /// How many times it was full.
    full: u32,
}

impl Default for PartCounts {
    fn default() -> Self {
        let mut secret = [0u8; SECRET];
        for chunk in secret.chunks_mut(16) {
            chunk.copy_from_slice(uuid::Uuid::new_v4().as_bytes());
        }
        PartCounts {
            secret,
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            counted: AtomicU64::new(0),
        }
    }
}

impl PartCounts {
    /// The key of the text `pieces` make, joined, as a part at the start
    /// of a text or after a newline: two keys for one text, told apart by
    /// a first byte no UTF-8 text holds (so a text that begins with "\n"
    /// is not another's part after a newline).
    pub fn key(&self, after_newline: bool, pieces: &[&str]) -> u128 {
        self.tagged(if after_newline { 0xFF } else { 0xFE }, pieces)
    }

    /// The key of a piece of a chat prompt between special tokens (its
    /// text, or its text normalized: see `LoadedTokenizer::count_prompt`),
    /// at the prompt's start (`first`) or after it (a pre-tokenizer may
    /// add a space to the first piece only): keys of their own.
    pub fn prompt_key(&self, first: bool, text: &str) -> u128 {
        self.tagged(if first { 0xFD } else { 0xFC }, &[text])
    }

    /// The key of the text `pieces` make after a first byte `tag`, which
    /// no UTF-8 text begins with: what kind of part it is.
    fn tagged(&self, tag: u8, pieces: &[&str]) -> u128 {
        let mut hasher = Xxh3::with_secret(self.secret);
        hasher.update(&[tag]);
        for piece in pieces {
            hasher.update(piece.as_bytes());
        }
        hasher.digest128()
    }

    fn shard(&self, key: u128) -> std::sync::MutexGuard<'_, Shard> {
        self.shards[(key as usize) % SHARDS]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    pub fn get(&self, key: u128) -> Option<u32> {
        self.shard(key).counts.get(&key).copied()
    }

    pub fn put(&self, key: u128, count: u32) {
        self.counted.fetch_add(1, Ordering::Relaxed);
        let mut shard = self.shard(key);
        if shard.counts.len() >= PER_SHARD {
            // A bit the shard's index does not read (its key's upper half).
            let bit = 64 + shard.full % 64;
            shard.full = shard.full.wrapping_add(1);
            shard.counts.retain(|k, _| k >> bit & 1 == 0);
        }
        shard.counts.insert(key, count);
    }

    /// How many parts were put.
    pub fn counted(&self) -> u64 {
        self.counted.load(Ordering::Relaxed)
    }

    /// How many parts it holds.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).counts.len())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_part_is_known_by_its_text_however_it_is_cut() {
        let parts = PartCounts::default();
        let key = |pieces: &[&str]| parts.key(false, pieces);
        assert_eq!(key(&["User: ", "hi", "\n"]), key(&["User: hi\n"]));
        assert_ne!(key(&["User: hi\n"]), key(&["User: hi"]));
        // A text that begins with a newline is not another after one.
        assert_ne!(key(&["\nhi"]), parts.key(true, &["hi"]));
        parts.put(key(&["a"]), 7);
        assert_eq!(parts.get(key(&["a"])), Some(7));
        assert_eq!(parts.get(key(&["b"])), None);
        // Another process's secret, other keys.
        assert_ne!(PartCounts::default().key(false, &["a"]), key(&["a"]));
    }

    #[test]
    fn it_holds_at_most_its_bound() {
        let parts = PartCounts::default();
        for i in 0..(SHARDS * PER_SHARD + 5_000) {
            parts.put(parts.key(false, &[i.to_string().as_str()]), 1);
        }
        assert!(parts.len() <= SHARDS * PER_SHARD, "{}", parts.len());
        assert!(parts.len() > SHARDS * PER_SHARD / 2, "{}", parts.len());
    }
}
