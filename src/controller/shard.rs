//! Shards: the services split between `sync` replicas (`--shards N`). A
//! service's shard is a stable hash of its namespace and name, the same in
//! every replica and every release, so replicas agree on who writes what
//! without talking to each other; each shard has a Lease of its own
//! ([`super::election`]) and its own [`Fence`].

use std::hash::Hasher;
use std::sync::Arc;

use siphasher::sip::SipHasher13;
use tokio::sync::watch;

use crate::k8s::fence::Fence;
use crate::model::ServiceKey;

/// The most shards `--shards` takes: every shard renews a Lease, and a
/// fleet needs a handful, not thousands.
pub const MAX_SHARDS: u32 = 64;

/// The shard of `key` among `count`. SipHash-1-3 with a zero key: a
/// published function of the bytes, so it never changes under us (std's
/// `DefaultHasher` may change between Rust releases, and replicas built
/// by different releases must agree).
pub fn shard_of(key: &ServiceKey, count: u32) -> usize {
    if count <= 1 {
        return 0;
    }
    let mut h = SipHasher13::new_with_keys(0, 0);
    h.write(key.namespace.as_str().as_bytes());
    h.write_u8(b'/');
    h.write(key.name.as_str().as_bytes());
    // `count` is at most MAX_SHARDS: the remainder fits any usize.
    (h.finish() % u64::from(count)) as usize
}

/// The shards of one replica: how many there are, each one's fence, and
/// which this replica leads now (sent to the controller on every change).
#[derive(Debug)]
pub struct Shards {
    count: u32,
    fences: Box<[Arc<Fence>]>,
    led: watch::Sender<Vec<bool>>,
}

impl Shards {
    /// `count` shards, none led, every fence closed (leader election).
    pub fn elected(count: u32) -> Arc<Self> {
        let count = count.clamp(1, MAX_SHARDS);
        Arc::new(Self {
            count,
            fences: (0..count).map(|_| Arc::new(Fence::closed())).collect(),
            led: watch::channel(vec![false; count as usize]).0,
        })
    }

    /// One shard, led, its fence always open: no leader election.
    pub fn alone() -> Arc<Self> {
        Arc::new(Self {
            count: 1,
            fences: Box::new([Arc::new(Fence::open())]),
            led: watch::channel(vec![true]).0,
        })
    }

    /// How many shards there are.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// The shard of `key`.
    pub fn of(&self, key: &ServiceKey) -> usize {
        shard_of(key, self.count)
    }

    /// Shard `i`'s fence.
    pub fn fence(&self, i: usize) -> &Arc<Fence> {
        &self.fences[i.min(self.fences.len() - 1)]
    }

    /// Which shards this replica leads, as it changes.
    pub fn led(&self) -> watch::Receiver<Vec<bool>> {
        self.led.subscribe()
    }

    /// True while this replica leads shard `i`.
    pub fn leads(&self, i: usize) -> bool {
        self.led.borrow().get(i).copied().unwrap_or(false)
    }

    /// How many shards this replica leads.
    pub fn led_count(&self) -> usize {
        self.led.borrow().iter().filter(|l| **l).count()
    }

    /// Marks shard `i` led or not (the election's call). Losing a shard
    /// closes its fence first, so nothing more is sent for it.
    pub fn set_led(&self, i: usize, led: bool) {
        if !led {
            self.fence(i).close();
        }
        self.led.send_if_modified(|v| match v.get_mut(i) {
            Some(l) if *l != led => {
                *l = led;
                true
            }
            _ => false,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::DnsLabel;

    fn key(ns: &str, name: &str) -> ServiceKey {
        ServiceKey { namespace: DnsLabel::parse(ns).unwrap(), name: DnsLabel::parse(name).unwrap() }
    }

    #[test]
    fn a_service_keeps_its_shard_across_releases() {
        // Pinned: replicas of different builds must agree. A change here
        // moves services between shards in a running fleet.
        let shards: Vec<usize> = ["web", "db", "cache", "api", "queue", "search"]
            .iter()
            .map(|n| shard_of(&key("shop", n), 4))
            .collect();
        assert_eq!(shards, vec![2, 0, 3, 1, 0, 2]);
        assert_eq!(shard_of(&key("shop", "web"), 1), 0);
        // The namespace counts, and the separator keeps "a/bc" from "ab/c".
        assert_ne!(shard_of(&key("a", "bc"), 64), shard_of(&key("ab", "c"), 64));
    }

    #[test]
    fn services_spread_evenly_over_shards() {
        let mut per = [0usize; 4];
        for i in 0..4000 {
            per[shard_of(&key("ns", &format!("svc-{i}")), 4)] += 1;
        }
        for n in per {
            assert!((900..1100).contains(&n), "{per:?}");
        }
    }

    #[test]
    fn losing_a_shard_closes_its_fence() {
        let s = Shards::elected(2);
        let mut led = s.led();
        s.fence(1).held(tokio::time::Instant::now(), std::time::Duration::from_secs(15));
        s.set_led(1, true);
        assert!(led.has_changed().unwrap());
        assert_eq!(*led.borrow_and_update(), vec![false, true]);
        assert!(s.fence(1).may_write() && !s.fence(0).may_write());
        s.set_led(1, true);
        assert!(!led.has_changed().unwrap(), "no change, no wake-up");
        s.set_led(1, false);
        assert!(!s.fence(1).may_write());
        assert_eq!(s.led_count(), 0);
        assert!(Shards::alone().leads(0) && Shards::alone().fence(0).may_write());
    }
}
