//! Maps kept as sorted vectors: the writer's per-service objects.
//!
//! A service nearly always has one import and a few slices. A `BTreeMap`
//! allocates a node for eleven entries on the first insert (about 2 KB for
//! a slice), which at 100,000 services is most of the writer's memory; a
//! sorted vector allocates exactly what it holds and iterates in the same
//! key order.

use super::input::SourceId;
use super::slice::Slice;

/// A vector kept in the order of a comparison its callers give: what both
/// maps below are made of. It grows by exactly one entry (`Vec` would
/// reserve room for four) and gives its allocation back when emptied.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Sorted<T> {
    entries: Vec<T>,
}

impl<T> Sorted<T> {
    const fn new() -> Self {
        Self { entries: Vec::new() }
    }

    /// Where an entry comparing as `cmp` says is, or would go.
    fn find(&self, cmp: impl FnMut(&T) -> std::cmp::Ordering) -> Result<usize, usize> {
        self.entries.binary_search_by(cmp)
    }

    /// Puts `entry` where `find` said: over the one found, or inserted.
    /// Returns the entry it replaced.
    fn put(&mut self, at: Result<usize, usize>, entry: T) -> Option<T> {
        match at {
            Ok(i) => Some(std::mem::replace(&mut self.entries[i], entry)),
            Err(i) => {
                self.entries.reserve_exact(1);
                self.entries.insert(i, entry);
                None
            }
        }
    }

    /// Removes the entry at `i`.
    fn take(&mut self, i: usize) -> T {
        let entry = self.entries.remove(i);
        if self.entries.is_empty() {
            self.entries = Vec::new(); // give the allocation back
        }
        entry
    }
}

/// A map with keys in order, for a handful of entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct VecMap<K, V> {
    entries: Sorted<(K, V)>,
}

impl<K, V> VecMap<K, V> {
    /// An empty map (allocates nothing).
    pub(crate) const fn new() -> Self {
        Self { entries: Sorted::new() }
    }
}

impl<K, V> Default for VecMap<K, V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Ord, V> VecMap<K, V> {
    fn find(&self, key: &K) -> Result<usize, usize> {
        self.entries.find(|(k, _)| k.cmp(key))
    }

    /// Sets `key` to `value`; returns the value it replaced.
    pub(crate) fn insert(&mut self, key: K, value: V) -> Option<V> {
        let at = self.find(&key);
        self.entries.put(at, (key, value)).map(|(_, v)| v)
    }

    /// The value of `key`.
    pub(crate) fn get(&self, key: &K) -> Option<&V> {
        self.find(key).ok().map(|i| &self.entries.entries[i].1)
    }

    /// Removes `key`; returns its value.
    pub(crate) fn remove(&mut self, key: &K) -> Option<V> {
        let i = self.find(key).ok()?;
        Some(self.entries.take(i).1)
    }

    /// The keys, in order.
    pub(crate) fn keys(&self) -> impl Iterator<Item = &K> {
        self.entries.entries.iter().map(|(k, _)| k)
    }

    /// The values, in key order.
    pub(crate) fn values(&self) -> impl Iterator<Item = &V> + Clone {
        self.entries.entries.iter().map(|(_, v)| v)
    }

    /// True when there is no entry.
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.entries.is_empty()
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

/// A service's EndpointSlices of every source, in (source, slice name)
/// order: a [`VecMap`] whose key is read from the slice itself (a slice's
/// namespace is its service's). Keyed apart, the slice's namespace and
/// name were held twice (the key beside the slice: ~100 bytes per slice in
/// two more heap blocks).
#[derive(Debug)]
pub(crate) struct SliceMap {
    entries: Sorted<(SourceId, Slice)>,
}

impl Default for SliceMap {
    fn default() -> Self {
        Self { entries: Sorted::new() }
    }
}

impl SliceMap {
    fn find(&self, source: SourceId, name: &str) -> Result<usize, usize> {
        self.entries.find(|(s, slice)| (*s, &*slice.name).cmp(&(source, name)))
    }

    /// Sets the slice `slice.name` of `source` to `slice`; returns the one
    /// it replaced.
    pub(crate) fn insert(&mut self, source: SourceId, slice: Slice) -> Option<Slice> {
        let at = self.find(source, &slice.name);
        self.entries.put(at, (source, slice)).map(|(_, old)| old)
    }

    /// The slice `name` of `source`.
    pub(crate) fn get(&self, source: SourceId, name: &str) -> Option<&Slice> {
        self.find(source, name).ok().map(|i| &self.entries.entries[i].1)
    }

    /// Removes the slice `name` of `source`; returns it.
    pub(crate) fn remove(&mut self, source: SourceId, name: &str) -> Option<Slice> {
        let i = self.find(source, name).ok()?;
        Some(self.entries.take(i).1)
    }

    /// The slices of `source`, in name order.
    pub(crate) fn of(&self, source: SourceId) -> impl Iterator<Item = &Slice> {
        let entries = &self.entries.entries;
        let start = entries.partition_point(|(s, _)| *s < source);
        entries[start..].iter().take_while(move |(s, _)| *s == source).map(|(_, slice)| slice)
    }

    /// The slices, in (source, name) order.
    pub(crate) fn values(&self) -> impl Iterator<Item = &Slice> + Clone {
        self.entries.entries.iter().map(|(_, slice)| slice)
    }

    /// True when there is no slice.
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{AddressFamily, ClusterId, SliceOrigin};

    fn set(name: &str) -> Slice {
        Slice {
            name: name.into(),
            cluster: ClusterId::parse("c1").unwrap(),
            family: AddressFamily::V4,
            origin: SliceOrigin::Mcs,
            ports: Default::default(),
            endpoints: Default::default(),
            trigger: 0,
        }
    }

    #[test]
    fn slices_are_kept_once_in_source_then_name_order() {
        let mut m = SliceMap::default();
        assert!(m.insert(SourceId::Watch(2), set("a")).is_none());
        assert!(m.insert(SourceId::Watch(1), set("b")).is_none());
        assert!(m.insert(SourceId::Watch(1), set("a")).is_none());
        let mut changed = set("b");
        changed.cluster = ClusterId::parse("c2").unwrap();
        assert_eq!(
            m.insert(SourceId::Watch(1), changed).map(|s| s.cluster),
            Some(ClusterId::parse("c1").unwrap())
        );
        let order: Vec<(&str, &str)> = m.values().map(|s| (&*s.name, s.cluster.as_str())).collect();
        assert_eq!(order, [("a", "c1"), ("b", "c2"), ("a", "c1")]);
        assert!(m.get(SourceId::Watch(2), "a").is_some() && m.get(SourceId::Watch(2), "b").is_none());
        assert!(m.remove(SourceId::Watch(1), "c").is_none());
        for (source, name) in [(1, "a"), (1, "b"), (2, "a")] {
            assert!(m.remove(SourceId::Watch(source), name).is_some());
        }
        assert!(m.is_empty() && m.entries.entries.capacity() == 0);
    }

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
        assert!(m.is_empty() && m.entries.entries.capacity() == 0);
        m.insert(1, "a");
        assert_eq!(m.entries.entries.capacity(), 1, "a map of one holds one");
    }
}
