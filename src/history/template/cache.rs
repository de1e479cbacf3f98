//! Counts of texts seen recently, so that a repeated read renders and sums
//! instead of tokenizing again.
//!
//! A templated read counts each rendered segment, the ends of each segment
//! and the short spans around each joint (see `joints`). Reads of the same
//! session render the same segments again and again, so their counts are
//! kept here, keyed by the encoding and a 64-bit hash of the text. The hash
//! is keyed with a random seed per process (SipHash), so that nobody can
//! write two texts that share an entry; a collision by chance is
//! 2⁻⁴⁸-unlikely per look-up with the cache full. The cache holds at most
//! [`CAPACITY`] entries: each shard keeps a young and an old generation, a
//! hit in the old one moves the entry to the young one, and a full young
//! generation replaces the old one. That keeps what is used and drops what
//! is not, like an LRU, at the cost of a map look-up.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use crate::tokens::Encoding;

/// Entries kept at most, over every shard and both generations (about
/// 40 bytes each: the cache stays under 3 MiB).
pub const CAPACITY: usize = 65_536;

/// Requests count in parallel: shards keep them from waiting on one lock.
const SHARDS: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    encoding: u8,
    len: usize,
    hash: u64,
}

#[derive(Debug, Default)]
struct Shard {
    young: HashMap<Key, u32>,
    old: HashMap<Key, u32>,
}

/// A bounded map from (encoding, text) to the text's exact count.
#[derive(Debug)]
pub struct CountCache {
    seed: RandomState,
    shards: Box<[Mutex<Shard>]>,
    /// Entries per generation of a shard.
    generation: usize,
    /// How many texts were tokenized (misses), and their bytes: what tests
    /// of the cache and of linearity read, and what a metric would.
    tokenized: AtomicU64,
    tokenized_bytes: AtomicU64,
}

impl CountCache {
    /// A cache of at most `capacity` entries (at least one per generation
    /// of each shard).
    pub fn new(capacity: usize) -> Self {
        CountCache {
            seed: RandomState::new(),
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            generation: (capacity / SHARDS / 2).max(1),
            tokenized: AtomicU64::new(0),
            tokenized_bytes: AtomicU64::new(0),
        }
    }

    /// The process-wide cache every selector uses unless given another.
    pub fn global() -> Arc<CountCache> {
        static GLOBAL: OnceLock<Arc<CountCache>> = OnceLock::new();
        GLOBAL
            .get_or_init(|| Arc::new(CountCache::new(CAPACITY)))
            .clone()
    }

    /// The exact count of the concatenation of `parts`, tokenized only if
    /// it is not cached. Parts are hashed in turn, so a joint span is built
    /// as one string only on a miss.
    pub fn count(&self, encoding: Encoding, parts: &[&str]) -> u32 {
        let key = self.key(encoding, parts);
        if let Some(count) = self.lookup(key) {
            return count;
        }
        let count = match parts {
            [one] => encoding.count(one),
            _ => encoding.count(&parts.concat()),
        };
        self.tokenized.fetch_add(1, Ordering::Relaxed);
        self.tokenized_bytes
            .fetch_add(key.len as u64, Ordering::Relaxed);
        self.insert(key, count);
        count
    }

    /// How many texts this cache had to tokenize so far.
    pub fn tokenized(&self) -> u64 {
        self.tokenized.load(Ordering::Relaxed)
    }

    /// How many bytes of text this cache had to tokenize so far.
    pub fn tokenized_bytes(&self) -> u64 {
        self.tokenized_bytes.load(Ordering::Relaxed)
    }

    /// Entries held now.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                let s = lock(s);
                s.young.len() + s.old.len()
            })
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets every count (benches measure a cold read with it).
    pub fn clear(&self) {
        for shard in self.shards.iter() {
            let mut s = lock(shard);
            s.young.clear();
            s.old.clear();
        }
    }

    fn key(&self, encoding: Encoding, parts: &[&str]) -> Key {
        // Hasher::write streams: ["ab", "c"] and ["abc"] hash alike.
        let mut h = self.seed.build_hasher();
        for part in parts {
            h.write(part.as_bytes());
        }
        Key {
            encoding: encoding.code(),
            len: parts.iter().map(|p| p.len()).sum(),
            hash: h.finish(),
        }
    }

    fn shard(&self, key: Key) -> MutexGuard<'_, Shard> {
        lock(&self.shards[(key.hash % SHARDS as u64) as usize])
    }

    fn lookup(&self, key: Key) -> Option<u32> {
        let mut s = self.shard(key);
        if let Some(&count) = s.young.get(&key) {
            return Some(count);
        }
        let count = s.old.remove(&key)?;
        self.store(&mut s, key, count);
        Some(count)
    }

    fn insert(&self, key: Key, count: u32) {
        let mut s = self.shard(key);
        self.store(&mut s, key, count);
    }

    fn store(&self, s: &mut Shard, key: Key, count: u32) {
        if s.young.len() >= self.generation {
            s.old = std::mem::take(&mut s.young);
        }
        s.young.insert(key, count);
    }
}

/// A panic elsewhere while a shard (of this cache or of `rendered`'s) was
/// locked leaves nothing half-written (each change is one map call and its
/// byte count), so a poisoned lock is used as it is.
pub(super) fn lock<T>(shard: &Mutex<T>) -> MutexGuard<'_, T> {
    shard
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ENC: Encoding = Encoding::O200kBase;

    #[test]
    fn parts_count_as_their_concatenation() {
        let cache = CountCache::new(64);
        let whole = cache.count(ENC, &["hello world</turn>"]);
        assert_eq!(whole, ENC.count("hello world</turn>"));
        let before = cache.tokenized();
        assert_eq!(cache.count(ENC, &["hello wor", "ld</turn>"]), whole);
        assert_eq!(cache.count(ENC, &["", "hello world</turn>", ""]), whole);
        assert_eq!(cache.tokenized(), before, "split parts hit the same entry");
    }

    #[test]
    fn a_repeated_count_does_not_tokenize() {
        let cache = CountCache::new(64);
        cache.count(ENC, &["some text"]);
        cache.count(ENC, &["some text"]);
        assert_eq!(cache.tokenized(), 1);
        cache.count(Encoding::Cl100kBase, &["some text"]);
        assert_eq!(cache.tokenized(), 2, "each encoding has its own entry");
    }

    #[test]
    fn the_cache_stays_within_its_capacity_and_keeps_what_is_used() {
        let cache = CountCache::new(SHARDS * 2 * 4);
        cache.count(ENC, &["kept"]);
        for i in 0..2_000 {
            cache.count(ENC, &[&format!("text {i}")]);
            cache.count(ENC, &["kept"]);
        }
        assert!(cache.len() <= SHARDS * 2 * 4, "{}", cache.len());
        let before = cache.tokenized();
        cache.count(ENC, &["kept"]);
        assert_eq!(cache.tokenized(), before);
        cache.clear();
        assert!(cache.is_empty());
    }
}
