//! A hash map that a new snapshot shares with the old one shard by shard.
//!
//! A snapshot's service map holds a hundred thousand entries at fleet
//! scale (the reverse map, larger still, is sorted shards of its own:
//! `reverse`). Copying one whole map to publish a
//! change to one service would cost time and memory in proportion to the
//! fleet; instead the map is split into [`SHARDS`] shards behind their own
//! `Arc`s, and an edit copies only the shards it touches (copy on write).
//! A lookup hashes once more than a plain map does (to pick the shard).

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;

use rustc_hash::{FxBuildHasher, FxHashMap};

/// Number of shards: at 100,000 services a shard holds ~400, so a publish
/// that touches one service copies ~400 entries, not 100,000.
pub(crate) const SHARDS: usize = 256;

/// The shard of a key's hash: bits the shard's own table does not use to
/// place entries (hashbrown takes the low bits for the bucket and the top
/// seven for its tags), so entries of one shard spread over its table.
fn shard_of(hash: u64) -> usize {
    (hash >> 40) as usize % SHARDS
}

/// An immutable sharded map; cloning it clones [`SHARDS`] pointers.
#[derive(Debug, Clone)]
pub(crate) struct Shards<K, V> {
    shards: Arc<[Arc<FxHashMap<K, V>>]>,
    len: usize,
}

impl<K, V> Default for Shards<K, V> {
    fn default() -> Self {
        Self { shards: (0..SHARDS).map(|_| Arc::new(FxHashMap::default())).collect(), len: 0 }
    }
}

impl<K: Hash + Eq + Clone, V: Clone> Shards<K, V> {
    /// The value of `key`.
    pub(crate) fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.shards[shard_of(FxBuildHasher.hash_one(key))].get(key)
    }

    /// Number of entries.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Every entry, shard by shard.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.shards.iter().flat_map(|s| s.iter())
    }

    /// Every value.
    pub(crate) fn values(&self) -> impl Iterator<Item = &V> {
        self.iter().map(|(_, v)| v)
    }

    /// An edit of this map; the map itself is unchanged.
    pub(crate) fn edit(&self) -> Edit<K, V> {
        Edit { shards: self.shards.to_vec(), len: self.len }
    }

    /// True when every shard is shared between the two.
    #[cfg(test)]
    pub(crate) fn shares_all(&self, other: &Self) -> bool {
        self.shards.iter().zip(other.shards.iter()).all(|(a, b)| Arc::ptr_eq(a, b))
    }

    /// True when both hold the same shard at `key`'s place (the shard was
    /// not copied between them).
    #[cfg(test)]
    pub(crate) fn shares_shard_of<Q: Hash + ?Sized>(&self, other: &Self, key: &Q) -> bool {
        let i = shard_of(FxBuildHasher.hash_one(key));
        Arc::ptr_eq(&self.shards[i], &other.shards[i])
    }
}

/// A sharded map being changed: shards are copied on their first change.
pub(crate) struct Edit<K, V> {
    shards: Vec<Arc<FxHashMap<K, V>>>,
    len: usize,
}

impl<K: Hash + Eq + Clone, V: Clone> Edit<K, V> {
    fn shard_mut<Q: Hash + ?Sized>(&mut self, key: &Q) -> &mut FxHashMap<K, V> {
        Arc::make_mut(&mut self.shards[shard_of(FxBuildHasher.hash_one(key))])
    }

    /// The value of `key`.
    pub(crate) fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.shards[shard_of(FxBuildHasher.hash_one(key))].get(key)
    }

    /// Sets `key` to `value`.
    pub(crate) fn insert(&mut self, key: K, value: V) {
        if self.shard_mut(&key).insert(key, value).is_none() {
            self.len += 1;
        }
    }

    /// Removes `key`; returns its value.
    pub(crate) fn remove<Q>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        // Looked up first so that removing what is absent copies nothing.
        self.get(key)?;
        let removed = self.shard_mut(key).remove(key);
        self.len -= usize::from(removed.is_some());
        removed
    }

    /// The finished map.
    pub(crate) fn finish(self) -> Shards<K, V> {
        Shards { shards: self.shards.into(), len: self.len }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_edit_copies_only_the_shards_it_changes() {
        let mut e = Shards::default().edit();
        for i in 0..10_000u32 {
            e.insert(i, i * 2);
        }
        let before: Shards<u32, u32> = e.finish();
        assert_eq!((before.len(), before.get(&7), before.get(&10_000)), (10_000, Some(&14), None));
        let mut e = before.edit();
        e.insert(7, 0);
        assert_eq!(e.remove(&8), Some(16));
        assert_eq!(e.remove(&20_000), None);
        let after = e.finish();
        assert_eq!((after.len(), after.get(&7), after.get(&8)), (9_999, Some(&0), None));
        assert_eq!(before.get(&7), Some(&14), "the old map is unchanged");
        let copied = (0..10_000u32).filter(|k| !after.shares_shard_of(&before, k)).count();
        assert!(copied < 200, "{copied} keys live in copied shards: only the shards of 7 and 8 are copied");
        assert!(!after.shares_shard_of(&before, &7));
        assert_eq!(after.iter().count(), 9_999);
    }

    #[test]
    fn keys_spread_over_the_shards() {
        let mut e = Shards::default().edit();
        for i in 0..100_000u32 {
            e.insert(format!("svc{i}.ns{}", i % 100).into_bytes().into_boxed_slice(), ());
        }
        let map: Shards<Box<[u8]>, ()> = e.finish();
        let biggest = map.shards.iter().map(|s| s.len()).max().unwrap_or(0);
        assert!(biggest < 2 * 100_000 / SHARDS, "the fullest shard holds {biggest}");
    }
}
