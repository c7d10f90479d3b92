//! The writer's index of which service each of a source's slices and
//! backing Services belongs to: their ids do not say it, and a slice can be
//! relabelled to another service.
//!
//! The ids are not kept here a second time. The index holds each id's hash
//! beside its service, and the service's own maps, which hold the object
//! and so its id, confirm a match. At 100,000 slices an index holding
//! every id (two strings) beside its service was ~16 MB of the writer's
//! model; this one is ~7 MB (docs/benchmarks-history.md, "Packed endpoints,
//! addresses read from records, a slimmer index and reverse map").

use std::hash::BuildHasher;

use hashbrown::HashTable;

use super::input::ObjectId;
use crate::model::ServiceKey;

/// Services by the hash of the ids they hold; see the module docs.
#[derive(Default)]
pub(crate) struct Owners {
    /// (hash of the id, its service): one entry per id indexed.
    table: HashTable<(u64, ServiceKey)>,
    /// Seeded per process, like the writer's other maps keyed by names.
    hasher: foldhash::fast::RandomState,
}

impl Owners {
    fn hash(&self, id: &ObjectId) -> u64 {
        self.hasher.hash_one(id)
    }

    /// The service that holds `id`: of those indexed under its hash, the
    /// one for which `holds` is true.
    pub(crate) fn get(&self, id: &ObjectId, holds: impl Fn(&ServiceKey) -> bool) -> Option<&ServiceKey> {
        let h = self.hash(id);
        self.table.find(h, |(at, key)| *at == h && holds(key)).map(|(_, key)| key)
    }

    /// The service that holds `id` (as [`Owners::get`] finds it), no
    /// longer indexed as holding it: one lookup where `get` then `remove`
    /// would be two.
    pub(crate) fn take(&mut self, id: &ObjectId, holds: impl Fn(&ServiceKey) -> bool) -> Option<ServiceKey> {
        let h = self.hash(id);
        let entry = self.table.find_entry(h, |(at, key)| *at == h && holds(key)).ok()?;
        Some(entry.remove().0.1)
    }

    /// Records that `key` holds `id`, which is not indexed yet.
    pub(crate) fn insert(&mut self, id: &ObjectId, key: ServiceKey) {
        let h = self.hash(id);
        self.table.insert_unique(h, (h, key), |(at, _)| *at);
    }

    /// Forgets that `key` holds `id`; false when it was not indexed. Two
    /// ids of one service with the same hash have equal entries, so either
    /// may go.
    pub(crate) fn remove(&mut self, id: &ObjectId, key: &ServiceKey) -> bool {
        let h = self.hash(id);
        match self.table.find_entry(h, |(at, k)| *at == h && k == key) {
            Ok(entry) => {
                entry.remove();
                true
            }
            Err(_) => false,
        }
    }

    /// True when nothing is indexed.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.table.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::model::{DnsLabel, SliceKey};

    fn key(name: &str) -> ServiceKey {
        ServiceKey { namespace: DnsLabel::parse("ns").unwrap(), name: DnsLabel::parse(name).unwrap() }
    }

    fn slice(name: &str) -> ObjectId {
        ObjectId::Slice(SliceKey { namespace: "ns".into(), name: name.into() })
    }

    #[test]
    fn each_id_finds_the_service_that_holds_it() {
        // What the services hold: the writer's `ServiceState`s stand-in.
        let mut held: BTreeMap<String, ServiceKey> = BTreeMap::new();
        let mut owners = Owners::default();
        for i in 0..1000 {
            let (id, svc) = (format!("s{i}"), key(&format!("svc{}", i % 10)));
            owners.insert(&slice(&id), svc.clone());
            held.insert(id, svc);
        }
        let holds = |id: &str, held: &BTreeMap<String, ServiceKey>, k: &ServiceKey| held.get(id) == Some(k);
        for (id, svc) in &held {
            assert_eq!(owners.get(&slice(id), |k| holds(id, &held, k)), Some(svc));
        }
        assert_eq!(owners.get(&slice("absent"), |k| holds("absent", &held, k)), None);
        // Relabelled: svc3 no longer holds s3, svc4 does.
        assert!(owners.remove(&slice("s3"), &key("svc3")));
        assert!(!owners.remove(&slice("s3"), &key("svc3")), "already forgotten");
        owners.insert(&slice("s3"), key("svc4"));
        held.insert("s3".into(), key("svc4"));
        assert_eq!(owners.get(&slice("s3"), |k| holds("s3", &held, k)), Some(&key("svc4")));
        for (id, svc) in std::mem::take(&mut held) {
            assert!(owners.remove(&slice(&id), &svc), "{id}");
        }
        assert!(owners.is_empty());
    }

    #[test]
    fn a_service_that_does_not_hold_the_id_is_not_its_owner() {
        // The hash alone never decides: an entry under the same hash whose
        // service does not hold the id (as after a collision) is passed by.
        let mut owners = Owners::default();
        owners.insert(&slice("a"), key("svc1"));
        assert_eq!(owners.get(&slice("a"), |_| false), None);
        assert_eq!(owners.get(&slice("a"), |k| *k == key("svc1")), Some(&key("svc1")));
        assert!(!owners.remove(&slice("a"), &key("svc2")));
        assert_eq!(owners.take(&slice("a"), |_| false), None, "nor taken by one that does not hold it");
        assert_eq!(owners.take(&slice("a"), |k| *k == key("svc1")), Some(key("svc1")));
        assert!(owners.is_empty() && owners.take(&slice("a"), |_| true).is_none(), "taken once");
    }
}
