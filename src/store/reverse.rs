//! The snapshot's reverse map: the PTR answers of every address a service
//! names, by address.
//!
//! IPv4 and IPv6 addresses are kept in two sharded maps rather than one
//! keyed by `IpAddr`: an `IpAddr` is 17 bytes, so with the 16-byte [`Ptrs`]
//! a table slot took 40; an `Ipv4Addr` key makes it 24. At fleet scale the
//! map holds every clusterset VIP and every headless endpoint (490,000
//! addresses at 100,000 services), nearly all of them IPv4.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::hosts::Ptrs;
use super::shards::{self, Shards};

/// PTR answers by address; cloning it clones two shard tables' pointers.
#[derive(Debug, Clone, Default)]
pub(crate) struct Reverse {
    v4: Shards<Ipv4Addr, Ptrs>,
    v6: Shards<Ipv6Addr, Ptrs>,
}

impl Reverse {
    /// The PTR answers of `ip`.
    pub(crate) fn get(&self, ip: IpAddr) -> Option<&Ptrs> {
        match ip {
            IpAddr::V4(a) => self.v4.get(&a),
            IpAddr::V6(a) => self.v6.get(&a),
        }
    }

    /// Number of addresses.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.v4.len() + self.v6.len()
    }

    /// True when no address is named.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True when every shard of both maps is shared between the two.
    #[cfg(test)]
    pub(crate) fn shares_all(&self, other: &Self) -> bool {
        self.v4.shares_all(&other.v4) && self.v6.shares_all(&other.v6)
    }

    /// An edit of this map; the map itself is unchanged.
    pub(crate) fn edit(&self) -> Edit {
        Edit { v4: self.v4.edit(), v6: self.v6.edit() }
    }
}

/// A [`Reverse`] being changed; shards are copied on their first change.
pub(crate) struct Edit {
    v4: shards::Edit<Ipv4Addr, Ptrs>,
    v6: shards::Edit<Ipv6Addr, Ptrs>,
}

impl Edit {
    /// The PTR answers of `ip`.
    pub(crate) fn get(&self, ip: IpAddr) -> Option<&Ptrs> {
        match ip {
            IpAddr::V4(a) => self.v4.get(&a),
            IpAddr::V6(a) => self.v6.get(&a),
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
            IpAddr::V4(a) => self.v4.remove(&a),
            IpAddr::V6(a) => self.v6.remove(&a),
        };
    }

    /// The finished map.
    pub(crate) fn finish(self) -> Reverse {
        Reverse { v4: self.v4.finish(), v6: self.v6.finish() }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::store::hosts::Hosts;

    #[test]
    fn each_family_is_found_and_edited_apart() {
        let hosts = Arc::new(Hosts::default());
        let ptrs = |i| Ptrs::One(hosts.clone(), i);
        let index = |p: Option<&Ptrs>| match p {
            Some(Ptrs::One(_, i)) => Some(*i),
            _ => None,
        };
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
}
