//! Turns rendered recently, with their counted runs, so that a repeated
//! read of a session runs neither the template nor the tokenizer on the
//! turns it rendered before: it looks each one up, joins and sums.
//!
//! A finalized turn never changes, and a template sees nothing but its
//! argument and the globals (no clock, no randomness), so a turn's
//! rendering is a function of the template, the turn, what the read makes
//! of its contents (truncation, `lang=en`), the globals and the encoding.
//! A key holds the template's and the turn's ids as they are, and the rest
//! as a 64-bit hash keyed with a random seed per process: one turn's
//! renderings under two reads share an entry by chance with probability
//! 2⁻⁶⁴, two turns' never.
//!
//! The cache holds at most [`BUDGET_BYTES`] of renderings: each shard keeps
//! a young and an old generation, as `cache` does, by bytes. Renderings
//! over [`MAX_PIECE_BYTES`], or whose ends (before the first cut, after the
//! last: see `joints`) are over [`MAX_END_BYTES`], are not kept: such a
//! turn is rendered and counted on the blocking pool each time, and only
//! what is kept may be taken on an async worker.

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher, RandomState};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use super::cache::lock;
use super::joints::Run;
use crate::domain::TurnId;

/// Bytes of renderings kept at most, over every shard and both generations.
pub const BUDGET_BYTES: usize = 32 << 20;

/// The longest rendering kept.
pub const MAX_PIECE_BYTES: usize = 64 * 1024;

/// The longest end of a kept rendering: joining it to its neighbours
/// tokenizes at most a few of these, cheap enough for an async worker.
pub const MAX_END_BYTES: usize = 1024;

/// What an entry costs besides its piece's text (the map slot, the
/// piece's `Arc` header and allocation).
const OVERHEAD_BYTES: usize = 192;

const SHARDS: usize = 16;

/// Which rendering of which turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct TurnKey {
    template: u64,
    turn: TurnId,
    variant: u64,
}

/// The maps hash a key by its `variant` alone (equality still compares
/// the whole key).
impl Hash for TurnKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.variant);
    }
}

/// A turn as a template rendered it, and its run (counted between its
/// first and last cuts, its ends parts of `piece`). Kept in the maps as it
/// is, not behind another pointer: a look-up reads the entry and the
/// piece, and a clone costs reference counts on the piece.
#[derive(Debug, Clone)]
pub(super) struct Rendered {
    pub piece: Arc<str>,
    pub run: Run,
}

impl Rendered {
    /// The piece and the entry: a kept run's ends are parts of the piece.
    fn bytes(&self) -> usize {
        self.piece.len() + OVERHEAD_BYTES
    }
}

/// A key's `variant` is already a keyed hash: the maps use it as it is.
#[derive(Debug, Default)]
struct VariantHasher(u64);

impl Hasher for VariantHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is meant to be called (see `TurnKey`'s `Hash`);
        // anything else still hashes, slowly.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 ^= n;
    }
}

#[derive(Debug, Default)]
struct Generation {
    entries: HashMap<TurnKey, Rendered, BuildHasherDefault<VariantHasher>>,
    bytes: usize,
}

impl Generation {
    fn insert(&mut self, key: TurnKey, value: Rendered) {
        self.bytes += value.bytes();
        if let Some(old) = self.entries.insert(key, value) {
            self.bytes -= old.bytes();
        }
    }

    fn remove(&mut self, key: &TurnKey) -> Option<Rendered> {
        let value = self.entries.remove(key)?;
        self.bytes -= value.bytes();
        Some(value)
    }
}

#[derive(Debug, Default)]
struct Shard {
    young: Generation,
    old: Generation,
    /// Look-ups that found their turn, and that did not (counted under
    /// the lock: no shared counter for the workers to contend on).
    hits: u64,
    misses: u64,
}

/// A bounded map from a turn's rendering key to its rendering.
#[derive(Debug)]
pub struct TurnCache {
    seed: RandomState,
    shards: Box<[Mutex<Shard>]>,
    /// Bytes per generation of a shard.
    generation: usize,
}

impl TurnCache {
    /// A cache of at most about `budget` bytes of renderings.
    pub fn new(budget: usize) -> Self {
        TurnCache {
            seed: RandomState::new(),
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            generation: budget / SHARDS / 2,
        }
    }

    /// The process-wide cache every selector uses unless given another.
    pub fn global() -> Arc<TurnCache> {
        static GLOBAL: OnceLock<Arc<TurnCache>> = OnceLock::new();
        GLOBAL
            .get_or_init(|| Arc::new(TurnCache::new(BUDGET_BYTES)))
            .clone()
    }

    /// The key of `turn`'s rendering by `template` under what `variant`
    /// hashes (everything else the rendering depends on).
    pub(super) fn key(&self, template: u64, turn: TurnId, variant: impl Hash) -> TurnKey {
        TurnKey {
            template,
            turn,
            variant: self.hash(variant),
        }
    }

    /// `value` hashed with this cache's seed: a part of a variant that a
    /// read computes once.
    pub(super) fn hash(&self, value: impl Hash) -> u64 {
        self.seed.hash_one(value)
    }

    pub(super) fn get(&self, key: &TurnKey) -> Option<Rendered> {
        let mut s = self.shard(key);
        let found = match s.young.entries.get(key) {
            Some(r) => Some(r.clone()),
            None => s
                .old
                .remove(key)
                .inspect(|r| self.store(&mut s, *key, r.clone())),
        };
        match found {
            Some(_) => s.hits += 1,
            None => s.misses += 1,
        }
        found
    }

    /// Keeps `rendered` if it is small enough to be taken on a worker.
    pub(super) fn put(&self, key: TurnKey, rendered: Rendered) -> Rendered {
        if Self::keepable(&rendered) {
            let mut s = self.shard(&key);
            self.store(&mut s, key, rendered.clone());
        }
        rendered
    }

    /// A rendering without a cut joins its neighbours whole (a chain of
    /// them makes spans long): never kept.
    fn keepable(r: &Rendered) -> bool {
        let (head, tail) = r.run.ends();
        r.run.is_cut()
            && r.piece.len() <= MAX_PIECE_BYTES
            && head <= MAX_END_BYTES
            && tail <= MAX_END_BYTES
    }

    /// How many look-ups found their turn so far.
    pub fn hits(&self) -> u64 {
        self.shards.iter().map(|s| lock(s).hits).sum()
    }

    /// How many look-ups found nothing so far (the turn was then rendered).
    pub fn misses(&self) -> u64 {
        self.shards.iter().map(|s| lock(s).misses).sum()
    }

    /// Bytes held now (texts and overheads).
    pub fn bytes(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                let s = lock(s);
                s.young.bytes + s.old.bytes
            })
            .sum()
    }

    /// Forgets every rendering (benches time a cold read with it).
    pub fn clear(&self) {
        for shard in self.shards.iter() {
            let mut s = lock(shard);
            *s = Shard::default();
        }
    }

    fn shard(&self, key: &TurnKey) -> MutexGuard<'_, Shard> {
        // The top bits: the maps take theirs from the bottom.
        lock(&self.shards[(key.variant >> 60) as usize % SHARDS])
    }

    fn store(&self, s: &mut Shard, key: TurnKey, value: Rendered) {
        if s.young.bytes + value.bytes() > self.generation {
            s.old = std::mem::take(&mut s.young);
        }
        s.young.insert(key, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::template::cache::CountCache;
    use crate::history::template::joints::Counter;
    use crate::tokens::Encoding;

    fn rendered(text: &str) -> Rendered {
        let counter = Counter {
            encoding: Encoding::O200kBase,
            cache: Arc::new(CountCache::new(64)),
        };
        let piece: Arc<str> = text.into();
        Rendered {
            run: Run::segment_knowing(&piece, &counter, []),
            piece,
        }
    }

    #[test]
    fn a_kept_rendering_is_found_under_its_key_only() {
        let cache = TurnCache::new(1 << 20);
        let turn = TurnId::generate();
        let key = cache.key(1, turn, ("s-1", 20u64));
        cache.put(key, rendered("<turn>some question</turn>"));

        let found = cache.get(&key).expect("kept");

        assert_eq!(&*found.piece, "<turn>some question</turn>");
        assert!(cache.get(&cache.key(2, turn, ("s-1", 20u64))).is_none());
        assert!(cache.get(&cache.key(1, turn, ("s-1", 21u64))).is_none());
        let other = TurnId::generate();
        assert!(cache.get(&cache.key(1, other, ("s-1", 20u64))).is_none());
        assert_eq!(cache.hits(), 1);
    }

    #[test]
    fn long_renderings_and_long_ends_are_not_kept() {
        let cache = TurnCache::new(1 << 24);
        let long = format!("a b {}", "word ".repeat(MAX_PIECE_BYTES / 5));
        let long_tail = format!("a b{}", "漢".repeat(MAX_END_BYTES));
        for (i, text) in [long, long_tail].iter().enumerate() {
            let key = cache.key(1, TurnId::generate(), i);
            let r = cache.put(key, rendered(text));
            assert_eq!(&*r.piece, text.as_str(), "handed back whole");
            assert!(cache.get(&key).is_none());
        }
        assert_eq!(cache.bytes(), 0);
    }

    #[test]
    fn the_cache_stays_within_its_budget_and_keeps_what_is_used() {
        let budget = SHARDS * 2 * 4096;
        let cache = TurnCache::new(budget);
        let kept = cache.key(1, TurnId::generate(), 0);
        cache.put(kept, rendered("kept turn"));
        for i in 0..5_000 {
            let key = cache.key(1, TurnId::generate(), i);
            cache.put(key, rendered(&format!("turn number {i} here")));
            assert!(cache.get(&kept).is_some(), "used, so kept ({i})");
        }
        assert!(cache.bytes() <= budget, "{}", cache.bytes());
        cache.clear();
        assert_eq!(cache.bytes(), 0);
    }
}
