//! A map kept as a sorted vector: the writer's per-service objects.
//!
//! A service nearly always has one import and a few slices. A `BTreeMap`
//! allocates a node for eleven entries on the first insert (about 2 KB for
//! a slice), which at 100,000 services is most of the writer's memory; a
//! sorted vector allocates exactly what it holds and iterates in the same
//! key order.

/// A map with keys in order, for a handful of entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct VecMap<K, V> {
    entries: Vec<(K, V)>,
}

impl<K, V> VecMap<K, V> {
    /// An empty map (allocates nothing).
    pub(crate) const fn new() -> Self {
        Self { entries: Vec::new() }
    }
}

impl<K, V> Default for VecMap<K, V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Ord, V> VecMap<K, V> {
    fn find(&self, key: &K) -> Result<usize, usize> {
        self.entries.binary_search_by(|(k, _)| k.cmp(key))
    }

    /// Sets `key` to `value`; returns the value it replaced.
    pub(crate) fn insert(&mut self, key: K, value: V) -> Option<V> {
        match self.find(&key) {
            Ok(i) => Some(std::mem::replace(&mut self.entries[i].1, value)),
            Err(i) => {
                // Exactly one more: `Vec` would reserve room for four.
                self.entries.reserve_exact(1);
                self.entries.insert(i, (key, value));
                None
            }
        }
    }

    /// The value of `key`.
    pub(crate) fn get(&self, key: &K) -> Option<&V> {
        self.find(key).ok().map(|i| &self.entries[i].1)
    }

    /// Removes `key`; returns its value.
    pub(crate) fn remove(&mut self, key: &K) -> Option<V> {
        let i = self.find(key).ok()?;
        let (_, v) = self.entries.remove(i);
        if self.entries.is_empty() {
            self.entries = Vec::new(); // give the allocation back
        }
        Some(v)
    }

    /// The values, in key order.
    pub(crate) fn values(&self) -> impl Iterator<Item = &V> {
        self.entries.iter().map(|(_, v)| v)
    }

    /// True when there is no entry.
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

impl<K: Ord, V> FromIterator<(K, V)> for VecMap<K, V> {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let mut map = Self::default();
        for (k, v) in iter {
            map.insert(k, v);
        }
        map
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_keys_in_order_and_replaces_equal_keys() {
        let mut m: VecMap<u32, &str> = [(3, "c"), (1, "a")].into_iter().collect();
        assert_eq!(m.insert(2, "b"), None);
        assert_eq!(m.insert(3, "C"), Some("c"));
        assert_eq!(m.values().copied().collect::<Vec<_>>(), ["a", "b", "C"]);
        assert_eq!((m.get(&2), m.get(&4)), (Some(&"b"), None));
        assert_eq!(m.remove(&1), Some("a"));
        assert_eq!(m.remove(&1), None);
        m.remove(&2);
        m.remove(&3);
        assert!(m.is_empty() && m.entries.capacity() == 0);
        m.insert(1, "a");
        assert_eq!(m.entries.capacity(), 1, "a map of one holds one");
    }
}
