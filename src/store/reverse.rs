//! The snapshot's reverse map: the PTR answers of every address a service
//! names, by address.
//!
//! At fleet scale the map holds every clusterset VIP and every headless
//! endpoint (490,000 addresses at 100,000 services), nearly all of them
//! IPv4. In hash tables (256 `Shards`) that took ~20 MB, the tables at
//! about half load; here each family is split into [`SHARDS`] arrays
//! sorted by address and exactly as long as their entries (~120 a shard,
//! 24 B an IPv4 entry: ~12 MB), looked up by binary search. Each shard is
//! behind its own `Arc`, so a new snapshot shares every shard its edit did
//! not change, and a changed one is copied whole: a few KB.
//!
//! The shards' pointers are held in groups of [`GROUP`], each group
//! behind an `Arc` too, so an edit copies the pointers of the groups it
//! changes and not all [`SHARDS`]: cloning, then dropping, 4,096 reference
//! counts spread over the heap made a publish slower than the change.
//!
//! IPv4 and IPv6 are kept apart: an `IpAddr` key is 17 bytes, which with
//! the 16-byte [`Ptrs`] makes an entry 40 bytes; an `Ipv4Addr` key, 24.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use rustc_hash::FxHashMap;

use super::hosts::{PtrTarget, Ptrs};

/// Bits of a shard's index.
const SHARD_BITS: u32 = 12;

/// Shards per family: at 100,000 services the IPv4 ones hold ~120
/// addresses (~2.9 KB) each, so a publish that changes an address copies
/// that much, an insert moves few entries, and a lookup is seven
/// comparisons. Fewer (2,048) made a publish slower; more (8,192) did not
/// make it faster (`cargo bench --bench footprint`).
const SHARDS: usize = 1 << SHARD_BITS;

/// Shards per group: an edit copies [`SHARDS`] / `GROUP` group pointers,
/// and `GROUP` shard pointers per group it changes.
const GROUP: usize = 16;

/// Groups per family.
const GROUPS: usize = SHARDS / GROUP;

/// Low bits of an address that do not choose its shard: 16 consecutive
/// addresses share one. Addresses given out together (a node's Pods, a
/// range of VIPs) are often a service's, and a publish rebuilding a
/// service removes and adds all of its addresses: together, they copy a
/// few shards rather than one per address (0.20 ms rather than 0.13 to
/// publish one changed headless slice at 100,000 services).
const BLOCK_BITS: u32 = 4;

/// One shard: its addresses' answers, sorted by address, never changed
/// once built (an edit copies it).
type Shard<K> = Arc<[(K, Ptrs)]>;

/// [`GROUP`] shards.
type Group<K> = Arc<[Shard<K>]>;

/// An address of one family: ordered within a shard, spread over the
/// shards by its bits.
trait Addr: Ord + Copy {
    /// The shard this address goes to.
    fn shard(self) -> usize;
}

impl Addr for Ipv4Addr {
    fn shard(self) -> usize {
        spread(u64::from(self.to_bits()) >> BLOCK_BITS)
    }
}

impl Addr for Ipv6Addr {
    fn shard(self) -> usize {
        let bits = self.to_bits();
        // Both halves count: addresses differ in the interface identifier
        // (endpoints of one subnet) or only in the prefix (one identifier
        // in several subnets).
        spread((bits as u64 ^ (bits >> 64) as u64) >> BLOCK_BITS)
    }
}

/// A shard's index from `block`: the top bits of its product by 2^64 / φ
/// (Fibonacci hashing), which depend on every bit of `block` and spread
/// sequential or strided values evenly.
fn spread(block: u64) -> usize {
    (block.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - SHARD_BITS)) as usize
}

/// The capacity a full shard of `len` entries grows to while edited: the
/// allocator's next size class (jemalloc has four per doubling), less the
/// `Arc`'s two counts. The finished shard, the same entries behind those
/// counts, then needs the size class the vector had, and takes the slot
/// the previous shard's vector freed: doubling instead left the vectors'
/// slots in other classes, ~5 MB resident after the first publish at
/// 100,000 services.
fn grown<K>(len: usize) -> usize {
    let counts = 2 * size_of::<usize>();
    let entry = size_of::<(K, Ptrs)>();
    let need = counts + entry * (len + 1);
    let class = need.next_multiple_of((need.next_power_of_two() / 8).max(16));
    (class - counts) / entry
}

/// The answers of `key` in a sorted shard.
fn find<K: Ord>(shard: &[(K, Ptrs)], key: K) -> Option<&Ptrs> {
    let at = shard.binary_search_by(|(k, _)| k.cmp(&key)).ok()?;
    shard.get(at).map(|(_, ptrs)| ptrs)
}

/// PTR answers by address; cloning it clones two pointers.
#[derive(Debug, Clone, Default)]
pub(crate) struct Reverse {
    v4: Sorted<Ipv4Addr>,
    v6: Sorted<Ipv6Addr>,
}

impl Reverse {
    /// The PTR answers of `ip`.
    pub(crate) fn get(&self, ip: IpAddr) -> Option<&Ptrs> {
        match ip {
            IpAddr::V4(a) => self.v4.get(a),
            IpAddr::V6(a) => self.v6.get(a),
        }
    }

    /// Number of addresses.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.v4.len + self.v6.len
    }

    /// True when no address is named.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True when every shard of both families is shared between the two.
    #[cfg(test)]
    pub(crate) fn shares_all(&self, other: &Self) -> bool {
        self.v4.copied(&other.v4) == 0 && self.v6.copied(&other.v6) == 0
    }

    /// An edit of this map; the map itself is unchanged.
    pub(crate) fn edit(&self) -> Edit {
        Edit { v4: self.v4.edit(), v6: self.v6.edit() }
    }
}

/// A [`Reverse`] being changed; shards are copied on their first change.
pub(crate) struct Edit {
    v4: SortedEdit<Ipv4Addr>,
    v6: SortedEdit<Ipv6Addr>,
}

impl Edit {
    /// The PTR answers of `ip`, as edited so far.
    pub(crate) fn get(&self, ip: IpAddr) -> Option<&Ptrs> {
        match ip {
            IpAddr::V4(a) => self.v4.get(a),
            IpAddr::V6(a) => self.v6.get(a),
        }
    }

    /// Sets the PTR answers of `ip`.
    pub(crate) fn insert(&mut self, ip: IpAddr, ptrs: Ptrs) {
        match ip {
            IpAddr::V4(a) => self.v4.insert(a, ptrs),
            IpAddr::V6(a) => self.v6.insert(a, ptrs),
        }
    }

    /// Removes the PTR answers of `ip`.
    pub(crate) fn remove(&mut self, ip: IpAddr) {
        match ip {
            IpAddr::V4(a) => self.v4.remove(a),
            IpAddr::V6(a) => self.v6.remove(a),
        }
    }

    /// The finished map.
    pub(crate) fn finish(self) -> Reverse {
        Reverse { v4: self.v4.finish(), v6: self.v6.finish() }
    }
}

/// One family's map: [`GROUPS`] groups of [`GROUP`] sorted shards.
#[derive(Debug, Clone)]
struct Sorted<K> {
    groups: Arc<[Group<K>]>,
    len: usize,
}

impl<K> Default for Sorted<K> {
    /// Every place holds the same empty shard: an empty map allocates
    /// three times, whatever [`SHARDS`] is.
    fn default() -> Self {
        let empty: Shard<K> = Arc::from([]);
        let group: Group<K> = (0..GROUP).map(|_| empty.clone()).collect();
        Self { groups: (0..GROUPS).map(|_| group.clone()).collect(), len: 0 }
    }
}

impl<K: Addr> Sorted<K> {
    /// Shard `i`.
    fn shard(&self, i: usize) -> &[(K, Ptrs)] {
        &self.groups[i / GROUP][i % GROUP]
    }

    /// The answers of `key`.
    fn get(&self, key: K) -> Option<&Ptrs> {
        find(self.shard(key.shard()), key)
    }

    /// An edit of this map; it holds only the shards it changes.
    fn edit(&self) -> SortedEdit<K> {
        SortedEdit { base: self.clone(), changed: FxHashMap::default(), len: self.len }
    }

    /// How many shards of the two are not shared.
    #[cfg(test)]
    fn copied(&self, other: &Self) -> usize {
        let shards = |m: &Self| m.groups.iter().flat_map(|g| g.iter()).cloned().collect::<Vec<_>>();
        shards(self).iter().zip(shards(other).iter()).filter(|(a, b)| !Arc::ptr_eq(a, b)).count()
    }
}

/// A [`Sorted`] being changed: each changed shard is copied into a vector
/// on its first change and kept sorted there, with room to grow.
struct SortedEdit<K> {
    base: Sorted<K>,
    /// The changed shards, by index.
    changed: FxHashMap<usize, Vec<(K, Ptrs)>>,
    len: usize,
}

impl<K: Addr> SortedEdit<K> {
    /// The answers of `key`, as edited so far.
    fn get(&self, key: K) -> Option<&Ptrs> {
        let i = key.shard();
        match self.changed.get(&i) {
            Some(shard) => find(shard, key),
            None => find(self.base.shard(i), key),
        }
    }

    /// Shard `i`, copied on its first change.
    fn shard_mut(&mut self, i: usize) -> &mut Vec<(K, Ptrs)> {
        let base = &self.base;
        self.changed.entry(i).or_insert_with(|| base.shard(i).to_vec())
    }

    /// Sets the answers of `key`.
    fn insert(&mut self, key: K, ptrs: Ptrs) {
        let shard = self.shard_mut(key.shard());
        match shard.binary_search_by(|(k, _)| k.cmp(&key)) {
            Ok(at) => shard[at].1 = ptrs,
            Err(at) => {
                if shard.len() == shard.capacity() {
                    let more = grown::<K>(shard.len()) - shard.len();
                    shard.reserve_exact(more);
                }
                shard.insert(at, (key, ptrs));
                self.len += 1;
            }
        }
    }

    /// Removes the answers of `key`.
    fn remove(&mut self, key: K) {
        // Looked up first so that removing what is absent copies nothing.
        if self.get(key).is_none() {
            return;
        }
        let shard = self.shard_mut(key.shard());
        if let Ok(at) = shard.binary_search_by(|(k, _)| k.cmp(&key)) {
            shard.remove(at);
            self.len -= 1;
        }
    }

    /// The finished map: each changed shard moved into an array of its
    /// exact size (one shard at a time, so the first publish never holds
    /// two copies of the map), each changed group's pointers copied, every
    /// other group and shard shared with the map edited.
    fn finish(self) -> Sorted<K> {
        let Self { base, changed, len } = self;
        if changed.is_empty() {
            return base;
        }
        // Taken from the end in ascending order of shard.
        let mut changed: Vec<_> = changed.into_iter().collect();
        changed.sort_unstable_by_key(|&(i, _)| std::cmp::Reverse(i));
        let groups = base
            .groups
            .iter()
            .enumerate()
            .map(|(g, group)| {
                if changed.last().is_none_or(|&(i, _)| i / GROUP != g) {
                    return group.clone();
                }
                (group.iter().enumerate())
                    .map(|(s, shard)| match changed.pop_if(|(i, _)| *i == g * GROUP + s) {
                        Some((_, copy)) => Shard::from(copy),
                        None => shard.clone(),
                    })
                    .collect()
            })
            .collect();
        Sorted { groups, len }
    }
}

// Which names an address answers, kept by the writer as it publishes:
// an address named once is only in the snapshot; one named more than once
// (a Pod behind two headless services) is also in `twice`, in the order
// named.

/// Adds `target` to the names `ip` answers.
pub(super) fn name(
    reverse: &mut Edit,
    twice: &mut FxHashMap<IpAddr, Vec<PtrTarget>>,
    ip: IpAddr,
    target: PtrTarget,
) {
    let Some(all) = twice.get_mut(&ip) else {
        match reverse.get(ip).map(Ptrs::to_vec) {
            Some(mut all) => {
                all.push(target);
                set_ptrs(reverse, ip, &all);
                twice.insert(ip, all);
            }
            None => set_ptrs(reverse, ip, &[target]),
        }
        return;
    };
    all.push(target);
    set_ptrs(reverse, ip, all);
}

/// Takes `target` out of the names `ip` answers.
pub(super) fn unname(
    reverse: &mut Edit,
    twice: &mut FxHashMap<IpAddr, Vec<PtrTarget>>,
    ip: IpAddr,
    target: &PtrTarget,
) {
    let Some(all) = twice.get_mut(&ip) else {
        if reverse.get(ip).is_some_and(|p| p.is_only(target)) {
            reverse.remove(ip);
        }
        return;
    };
    if let Some(i) = all.iter().position(|t| t == target) {
        all.remove(i);
    }
    if all.len() > 1 {
        set_ptrs(reverse, ip, all);
        return;
    }
    match twice.remove(&ip) {
        Some(last) if !last.is_empty() => set_ptrs(reverse, ip, &last),
        _ => {
            reverse.remove(ip);
        }
    }
}

/// `ip` answers `targets` (none: nothing is set).
fn set_ptrs(reverse: &mut Edit, ip: IpAddr, targets: &[PtrTarget]) {
    if let Some(ptrs) = Ptrs::of(targets) {
        reverse.insert(ip, ptrs);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::store::hosts::Hosts;

    fn ptrs(hosts: &Arc<Hosts>, i: u32) -> Ptrs {
        Ptrs::One(hosts.clone(), i)
    }

    fn index(p: Option<&Ptrs>) -> Option<u32> {
        match p {
            Some(Ptrs::One(_, i)) => Some(*i),
            _ => None,
        }
    }

    /// `n` sequential IPv4 addresses from 10.64.0.0, each answering its
    /// number.
    fn sequential(hosts: &Arc<Hosts>, n: u32) -> Reverse {
        let mut e = Reverse::default().edit();
        for i in 0..n {
            e.insert(v4(i), ptrs(hosts, i));
        }
        e.finish()
    }

    fn v4(i: u32) -> IpAddr {
        IpAddr::V4(Ipv4Addr::from_bits(0x0A40_0000 + i))
    }

    #[test]
    fn each_family_is_found_and_edited_apart() {
        let hosts = Arc::new(Hosts::default());
        let ptrs = |i| Ptrs::One(hosts.clone(), i);
        let v4: IpAddr = "10.0.0.1".parse().unwrap();
        let v6: IpAddr = "fd00::1".parse().unwrap();
        // The v4 address mapped into v6 is another address.
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        let mut e = Reverse::default().edit();
        e.insert(v4, ptrs(1));
        e.insert(v6, ptrs(2));
        assert_eq!((index(e.get(v4)), index(e.get(v6)), index(e.get(mapped))), (Some(1), Some(2), None));
        let before = e.finish();
        assert_eq!(before.len(), 2);
        let mut e = before.edit();
        e.remove(v4);
        e.remove(mapped); // absent: nothing happens
        e.insert(v6, ptrs(3));
        let after = e.finish();
        assert_eq!((index(after.get(v4)), index(after.get(v6)), after.len()), (None, Some(3), 1));
        assert_eq!(
            (index(before.get(v4)), index(before.get(v6))),
            (Some(1), Some(2)),
            "the old map is unchanged"
        );
        assert!(!after.shares_all(&before) && before.clone().shares_all(&before));
        let mut e = after.edit();
        e.remove(v6);
        assert!(e.finish().is_empty());
    }

    #[test]
    fn sequential_addresses_are_all_found_and_nothing_else() {
        let hosts = Arc::new(Hosts::default());
        let v6 = |i: u32| IpAddr::V6(Ipv6Addr::from_bits(0xfd00 << 112 | u128::from(i)));
        let mut e = Reverse::default().edit();
        // Every other address of a range, IPv4 and IPv6, inserted backwards
        // so that every insert goes in front of its shard's entries.
        for i in (0..200_000u32).rev().step_by(2) {
            e.insert(v4(i), ptrs(&hosts, i));
            e.insert(v6(i), ptrs(&hosts, i));
        }
        let map = e.finish();
        assert_eq!(map.len(), 200_000);
        for i in 0..200_002u32 {
            let named = (i % 2 == 1 && i < 200_000).then_some(i);
            assert_eq!((index(map.get(v4(i))), index(map.get(v6(i)))), (named, named), "{}", v4(i));
        }
        assert_eq!(index(map.get(IpAddr::V4(Ipv4Addr::BROADCAST))), None);
        let used = (0..SHARDS).filter(|&i| !map.v4.shard(i).is_empty()).count();
        let used_v6 = (0..SHARDS).filter(|&i| !map.v6.shard(i).is_empty()).count();
        assert!(used.min(used_v6) > SHARDS * 9 / 10, "100,000 addresses fill {used} and {used_v6} shards");
        assert!((0..SHARDS).all(|i| map.v4.shard(i).is_sorted_by_key(|(k, _)| *k)));
        assert!((0..SHARDS).all(|i| map.v6.shard(i).is_sorted_by_key(|(k, _)| *k)));
    }

    #[test]
    fn addresses_spread_over_the_shards() {
        fn fullest<K: Addr>(keys: impl Iterator<Item = K>) -> usize {
            let mut counts = vec![0usize; SHARDS];
            keys.for_each(|k| counts[k.shard()] += 1);
            counts.into_iter().max().unwrap_or(0)
        }
        let n = 490_000u32;
        let mean = n as usize / SHARDS;
        let shapes: [(&str, usize); 6] = [
            ("sequential IPv4", fullest((0..n).map(|i| Ipv4Addr::from_bits(0x0A00_0000 + i)))),
            ("IPv4 by 4", fullest((0..n).map(|i| Ipv4Addr::from_bits(0x0A00_0000 + 4 * i)))),
            ("IPv4 by 256", fullest((0..n).map(|i| Ipv4Addr::from_bits(0x0A00_0000 + 256 * i)))),
            ("sequential IPv6", fullest((0..n).map(|i| Ipv6Addr::from_bits(0xfd00 << 112 | u128::from(i))))),
            (
                "IPv6 by /64",
                fullest((0..n).map(|i| Ipv6Addr::from_bits(0xfd00 << 112 | u128::from(i) << 64 | 1))),
            ),
            (
                "IPv6 by /112",
                fullest((0..n).map(|i| Ipv6Addr::from_bits(0xfd00 << 112 | u128::from(i) << 16 | 1))),
            ),
        ];
        for (shape, fullest) in shapes {
            assert!(fullest < 2 * mean, "{shape}: the fullest shard holds {fullest}, the mean {mean}");
        }
    }

    #[test]
    fn an_edit_copies_only_the_shards_it_changes() {
        let hosts = Arc::new(Hosts::default());
        let before = sequential(&hosts, 50_000);
        let (changed, removed) = (7, 30_007);
        let shards = [changed, removed].map(|i| Ipv4Addr::from_bits(0x0A40_0000 + i).shard());
        assert!(shards[0] / GROUP != shards[1] / GROUP, "two shards of two groups");
        let mut e = before.edit();
        e.insert(v4(changed), ptrs(&hosts, 0));
        e.remove(v4(removed));
        e.remove(v4(60_000)); // absent: nothing copied
        e.remove("fd00::8".parse().unwrap());
        let after = e.finish();
        assert_eq!(
            (index(after.get(v4(changed))), index(after.get(v4(removed))), after.len()),
            (Some(0), None, 49_999)
        );
        assert_eq!((index(before.get(v4(changed))), index(before.get(v4(removed)))), (Some(7), Some(30_007)));
        assert_eq!(after.v4.copied(&before.v4), 2, "the shards of the two addresses");
        let groups = after.v4.groups.iter().zip(before.v4.groups.iter());
        assert_eq!(groups.filter(|(a, b)| !Arc::ptr_eq(a, b)).count(), 2, "their groups");
        assert!(Arc::ptr_eq(&after.v6.groups, &before.v6.groups), "no IPv6 address changed");
        let mut e = after.edit();
        e.remove(v4(60_000));
        e.remove(v4(removed));
        assert!(e.finish().shares_all(&after), "removing what is absent copies nothing");
    }

    #[test]
    fn finished_shards_are_exactly_their_entries() {
        let hosts = Arc::new(Hosts::default());
        let mut e = Reverse::default().edit();
        for i in 0..50_000 {
            e.insert(v4(i), ptrs(&hosts, i));
        }
        let room: usize = e.v4.changed.values().map(|s| s.capacity() - s.len()).sum();
        assert!(room > 0, "the edit's shards have room to grow");
        let map = e.finish();
        let bytes: usize = (0..SHARDS).map(|i| size_of_val(map.v4.shard(i))).sum();
        assert_eq!(size_of::<(Ipv4Addr, Ptrs)>(), 24);
        assert_eq!(bytes, 50_000 * 24, "the finished ones keep none");
        let mut e = map.edit();
        for i in 0..1000 {
            e.remove(v4(i));
        }
        let map = e.finish();
        let bytes: usize = (0..SHARDS).map(|i| size_of_val(map.v4.shard(i))).sum();
        assert_eq!(bytes, 49_000 * 24);
    }

    #[test]
    fn shards_grow_by_a_fraction_of_their_size() {
        let mut growths = 0;
        let mut cap = 0;
        while cap < 100_000 {
            let next = grown::<Ipv4Addr>(cap);
            assert!(next > cap && next <= cap + cap / 4 + 8, "{cap} grows to {next}");
            (cap, growths) = (next, growths + 1);
        }
        assert!(growths < 64, "{growths} copies to reach 100,000 entries");
    }

    #[test]
    fn get_sees_the_edit_and_the_map_does_not() {
        let hosts = Arc::new(Hosts::default());
        let map = sequential(&hosts, 1000);
        let mut e = map.edit();
        e.insert(v4(5), ptrs(&hosts, 50));
        e.insert(v4(2000), ptrs(&hosts, 2000));
        e.remove(v4(6));
        assert_eq!(
            (index(e.get(v4(5))), index(e.get(v4(2000))), index(e.get(v4(6))), index(e.get(v4(4)))),
            (Some(50), Some(2000), None, Some(4))
        );
        assert_eq!(
            (index(map.get(v4(5))), index(map.get(v4(2000))), index(map.get(v4(6)))),
            (Some(5), None, Some(6))
        );
        e.insert(v4(6), ptrs(&hosts, 60));
        e.remove(v4(2000));
        assert_eq!((index(e.get(v4(6))), index(e.get(v4(2000)))), (Some(60), None));
        let done = e.finish();
        assert_eq!((done.len(), index(done.get(v4(6))), index(done.get(v4(5)))), (1000, Some(60), Some(50)));
    }
}
