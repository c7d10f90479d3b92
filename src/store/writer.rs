//! The single writer: applies source updates to the model and publishes
//! snapshots, re-encoding only the services an update touched.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use hickory_proto::rr::Name;
use rustc_hash::FxHashMap;
use tracing::{debug, warn};

use super::input::{Object, ObjectId, SourceId, Update};
use super::intern::Interner;
use super::names::{self, BuildCtx};
use super::records::Records;
use super::resolve;
use super::snapshot::{ServiceNames, Snapshot, Zone};
use crate::model::{
    BackingKind, BackingService, ClusterId, DnsLabel, EndpointSet, ServiceImport, ServiceKey, SliceKey,
};

#[derive(Default)]
struct SourceState {
    objects: HashMap<ObjectId, ServiceKey>,
    synced: bool,
}

#[derive(Default)]
struct ServiceState {
    /// Imports by source; the first (lowest source id) is served.
    imports: BTreeMap<SourceId, ServiceImport>,
    /// Slices of every source and cluster.
    slices: BTreeMap<(SourceId, SliceKey), EndpointSet>,
    /// Services backing an import without `spec.ips` (`--interop`).
    backing: BTreeMap<(SourceId, SliceKey), BackingService>,
    /// Whether this service counts for its namespace's existence.
    counted: bool,
}

impl ServiceState {
    /// A service exists in DNS while it has an import, or a Service that
    /// stands for one (Karmada's `CrossCluster` MultiClusterService).
    fn has_import(&self) -> bool {
        !self.imports.is_empty() || self.backing.values().any(|b| b.kind == BackingKind::KarmadaCrossCluster)
    }

    fn is_empty(&self) -> bool {
        self.imports.is_empty() && self.slices.is_empty() && self.backing.is_empty()
    }
}

/// Owns the model and publishes snapshots. Exactly one exists per store.
pub struct Writer {
    zone: Arc<Zone>,
    current: Arc<ArcSwap<Snapshot>>,
    sources: BTreeMap<SourceId, SourceState>,
    services: HashMap<ServiceKey, ServiceState>,
    /// Number of served imports per namespace: a namespace exists in DNS
    /// while it holds at least one.
    namespaces: BTreeMap<DnsLabel, usize>,
    dirty: BTreeSet<ServiceKey>,
    zone_dirty: bool,
    serial: u32,
    interner: Interner,
    /// Addresses marked down per service (health overlay).
    down: HashMap<ServiceKey, BTreeSet<IpAddr>>,
    /// Clusters marked not alive.
    dead_clusters: BTreeSet<ClusterId>,
    /// Services whose health overlay changed since the last publish.
    health_dirty: BTreeSet<ServiceKey>,
    /// The names each address is the reverse of, over every service (a Pod
    /// behind two headless services has two).
    reverse: HashMap<IpAddr, BTreeSet<Name>>,
    /// ClusterSetIP services answered NODATA for want of an address, and why
    /// (see `resolve`).
    unresolved: BTreeMap<ServiceKey, String>,
    /// Those of `unresolved` already logged: each is logged once, when the
    /// store is ready (before, its backing Service may just not be listed
    /// yet).
    reported: BTreeSet<ServiceKey>,
}

impl Writer {
    pub(crate) fn new(zone: Arc<Zone>, current: Arc<ArcSwap<Snapshot>>) -> Self {
        Self {
            interner: zone.localities.interner(),
            down: HashMap::new(),
            dead_clusters: BTreeSet::new(),
            health_dirty: BTreeSet::new(),
            reverse: HashMap::new(),
            unresolved: BTreeMap::new(),
            reported: BTreeSet::new(),
            zone,
            current,
            sources: BTreeMap::new(),
            services: HashMap::new(),
            namespaces: BTreeMap::new(),
            dirty: BTreeSet::new(),
            zone_dirty: true,
            serial: 0,
        }
    }

    /// Applies one update to the model. Nothing is visible to readers until
    /// [`Writer::publish`]; apply a batch, then publish once.
    pub fn apply(&mut self, update: Update) {
        match update {
            Update::Register(source) => {
                self.sources.entry(source).or_default();
                self.zone_dirty = true;
            }
            Update::Replace { source, objects } => {
                let old: Vec<ObjectId> =
                    self.sources.entry(source).or_default().objects.keys().cloned().collect();
                let keep: BTreeSet<ObjectId> = objects.iter().map(Object::id).collect();
                for id in old.into_iter().filter(|id| !keep.contains(id)) {
                    self.remove(source, &id);
                }
                for object in objects {
                    self.upsert(source, object);
                }
                let state = self.sources.entry(source).or_default();
                if !state.synced {
                    state.synced = true;
                    self.zone_dirty = true;
                }
            }
            Update::Upsert { source, object } => self.upsert(source, object),
            Update::Remove { source, id } => self.remove(source, &id),
            Update::EndpointHealth { service, address, healthy } => {
                let down = self.down.entry(service.clone()).or_default();
                let changed = if healthy { down.remove(&address) } else { down.insert(address) };
                if down.is_empty() {
                    self.down.remove(&service);
                }
                if changed {
                    self.health_dirty.insert(service);
                }
            }
            Update::ClusterLiveness { cluster, alive } => {
                let changed = if alive {
                    self.dead_clusters.remove(&cluster)
                } else {
                    self.dead_clusters.insert(cluster.clone())
                };
                if changed {
                    for (key, state) in &self.services {
                        if state.slices.values().any(|s| s.cluster == cluster) {
                            self.health_dirty.insert(key.clone());
                        }
                    }
                }
            }
        }
    }

    /// The health overlay: false when the endpoint's cluster is not alive
    /// or one of its addresses was probed down.
    ///
    /// The served import's unreachable clusters (the sync controller's
    /// annotation) count as not alive for that service only, and its
    /// disconnected addresses (Kosmos's probe's annotation) as probed down.
    fn healthy(&self, key: &ServiceKey, cluster: &ClusterId, addresses: &[IpAddr]) -> bool {
        let import = self.services.get(key).and_then(|s| s.imports.values().next());
        !self.dead_clusters.contains(cluster)
            && !import.is_some_and(|i| i.answers.unreachable.contains(cluster))
            && !import.is_some_and(|i| addresses.iter().any(|a| i.answers.disconnected.contains(a)))
            && self.down.get(key).is_none_or(|down| !addresses.iter().any(|a| down.contains(a)))
    }

    /// The PTR answers of the next snapshot: `old`'s, with those of the
    /// `touched` addresses encoded again from their current names (or
    /// removed when none is left). Shared with `old` when nothing changed.
    fn reverse_answers(
        &mut self,
        old: &Arc<FxHashMap<IpAddr, Arc<Records>>>,
        touched: BTreeSet<IpAddr>,
    ) -> Arc<FxHashMap<IpAddr, Arc<Records>>> {
        if touched.is_empty() {
            return old.clone();
        }
        let mut map = FxHashMap::clone(old);
        for ip in touched {
            let records = self
                .reverse
                .get(&ip)
                .filter(|names| !names.is_empty())
                .and_then(|names| names::ptr_records(ip, names.iter(), self.zone.config.ttl));
            match records {
                Some(r) => {
                    map.insert(ip, Arc::new(r));
                }
                None => {
                    self.reverse.remove(&ip);
                    map.remove(&ip);
                }
            }
        }
        Arc::new(map)
    }

    /// A service's names with the current health overlay, sharing every
    /// record with `old`; `None` when its health did not change.
    fn rehealth(&self, key: &ServiceKey, old: &ServiceNames) -> Option<ServiceNames> {
        let b = old.balance.as_ref()?;
        let healthy: Box<[bool]> = b
            .endpoints
            .iter()
            .map(|e| self.healthy(key, &b.clusters[usize::from(e.cluster)].name, &e.addresses))
            .collect();
        if healthy == b.healthy {
            return None;
        }
        let weights = self
            .services
            .get(key)
            .and_then(|s| s.imports.values().next())
            .and_then(|i| i.answers.weights.as_deref());
        Some(ServiceNames {
            names: old.names.clone(),
            balance: Some(Arc::new(b.with_health(healthy, weights))),
            reverse: old.reverse.clone(),
        })
    }

    fn upsert(&mut self, source: SourceId, object: Object) {
        let id = object.id();
        let key = object.service().clone();
        let previous = self.sources.entry(source).or_default().objects.insert(id.clone(), key.clone());
        if let Some(previous) = previous.filter(|p| *p != key) {
            // A slice can be relabelled to another service.
            self.remove_from_service(source, &id, &previous);
        }
        let state = self.services.entry(key.clone()).or_default();
        let changed = match object {
            Object::Import(import) => {
                let old = state.imports.insert(source, import.clone());
                match old {
                    None => true,
                    Some(old) if old == import => false,
                    // Only the unreachable clusters or disconnected
                    // addresses changed: health, not records (the sync
                    // controller's and Kosmos's annotations).
                    Some(old)
                        if ServiceImport { answers: import.answers.clone(), ..old.clone() } == import
                            && old.answers.same_records(&import.answers) =>
                    {
                        self.health_dirty.insert(key.clone());
                        false
                    }
                    Some(_) => true,
                }
            }
            Object::Slice(slice) => {
                state.slices.insert((source, slice.slice.clone()), slice.clone()).as_ref() != Some(&slice)
            }
            Object::Service(service) => {
                state.backing.insert((source, service.object.clone()), service.clone()).as_ref()
                    != Some(&service)
            }
        };
        self.recount(&key);
        if changed {
            self.dirty.insert(key);
        }
    }

    fn remove(&mut self, source: SourceId, id: &ObjectId) {
        let key = self.sources.get_mut(&source).and_then(|s| s.objects.remove(id));
        if let Some(key) = key {
            self.remove_from_service(source, id, &key);
        }
    }

    fn remove_from_service(&mut self, source: SourceId, id: &ObjectId, key: &ServiceKey) {
        let Some(state) = self.services.get_mut(key) else {
            return;
        };
        let removed = match id {
            ObjectId::Import(_) => state.imports.remove(&source).is_some(),
            ObjectId::Slice(slice) => state.slices.remove(&(source, slice.clone())).is_some(),
            ObjectId::Service(service) => state.backing.remove(&(source, service.clone())).is_some(),
        };
        self.recount(key);
        if removed {
            self.dirty.insert(key.clone());
        }
    }

    /// Counts the service for its namespace while it has an import (a
    /// namespace exists in DNS while it holds one).
    fn recount(&mut self, key: &ServiceKey) {
        let Some(state) = self.services.get_mut(key) else {
            return;
        };
        let has = state.has_import();
        if has == state.counted {
            return;
        }
        state.counted = has;
        self.zone_dirty = true;
        if has {
            *self.namespaces.entry(key.namespace.clone()).or_default() += 1;
        } else if let Some(n) = self.namespaces.get_mut(&key.namespace) {
            *n -= 1;
            if *n == 0 {
                self.namespaces.remove(&key.namespace);
            }
        }
    }

    /// True when every registered source has delivered its complete state.
    pub fn is_ready(&self) -> bool {
        self.sources.values().all(|s| s.synced)
    }

    /// Logs each newly unresolved service once the store is ready, naming
    /// the objects (the read path must not log; this runs per publish).
    fn report_unresolved(&mut self) {
        self.reported.retain(|k| self.unresolved.contains_key(k));
        if !self.is_ready() {
            return;
        }
        for (key, why) in &self.unresolved {
            if self.reported.insert(key.clone()) {
                warn!(service = %key, "{why}: answering NODATA");
            }
        }
    }

    /// Publishes a new snapshot if anything changed since the last one, and
    /// returns how many services were re-encoded.
    pub fn publish(&mut self) -> usize {
        if self.dirty.is_empty() && !self.zone_dirty && self.health_dirty.is_empty() {
            return 0;
        }
        let old = self.current.load_full();
        let mut services = FxHashMap::clone(&old.services);
        let dirty = std::mem::take(&mut self.dirty);
        let rebuilt = dirty.len();
        // Addresses whose reverse names changed: their PTR answers are
        // encoded again below.
        let mut touched = BTreeSet::new();
        for key in std::mem::take(&mut self.health_dirty).difference(&dirty) {
            let wire = names::prefix_key(&[key.name.as_str(), key.namespace.as_str()]);
            if let Some(names) = services.get(&wire[..]).and_then(|old| self.rehealth(key, old)) {
                services.insert(wire.into(), Arc::new(names));
            }
        }
        for key in dirty {
            let wire: Arc<[u8]> = names::prefix_key(&[key.name.as_str(), key.namespace.as_str()]).into();
            let mut interner = std::mem::take(&mut self.interner);
            let mut unresolved = None;
            let built = self.services.get(&key).and_then(|state| {
                let served =
                    resolve::served(&key, state.imports.values().next(), &state.backing, &state.slices)?;
                unresolved = served.unresolved;
                let slices: Vec<&EndpointSet> = served.slices;
                let healthy = |c: &ClusterId, a: &[IpAddr]| self.healthy(&key, c, a);
                let mut cx = BuildCtx { interner: &mut interner, healthy: &healthy };
                names::service_names(&self.zone, &served.import, &slices, &mut cx)
            });
            self.interner = interner;
            match unresolved {
                Some(why) => {
                    self.unresolved.insert(key.clone(), why);
                }
                None => {
                    self.unresolved.remove(&key);
                }
            }
            let old_reverse = services.get(&*wire).map(|old| old.reverse.clone());
            for (ip, name) in old_reverse.iter().flat_map(|r| r.iter()) {
                if let Some(names) = self.reverse.get_mut(ip) {
                    names.remove(name);
                }
                touched.insert(*ip);
            }
            match built {
                Some(names) => {
                    for (ip, name) in names.reverse.iter() {
                        self.reverse.entry(*ip).or_default().insert(name.clone());
                        touched.insert(*ip);
                    }
                    services.insert(wire, Arc::new(names));
                }
                None => {
                    services.remove(&*wire);
                }
            }
            if self.services.get(&key).is_some_and(ServiceState::is_empty) {
                self.services.remove(&key);
            }
        }
        self.zone_dirty = false;
        self.report_unresolved();
        // Serials follow the clock across restarts and still increase on
        // every change within a second.
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as u32).unwrap_or(0);
        self.serial = self.serial.wrapping_add(1).max(now);
        let reverse = self.reverse_answers(&old.reverse, touched);
        let zone_names = names::zone_names(&self.zone, self.serial, self.namespaces.keys());
        let snap = Snapshot {
            zone: self.zone.clone(),
            serial: self.serial,
            ready: self.is_ready(),
            services: Arc::new(services),
            zone_names: zone_names.names,
            negative_soa: zone_names.negative_soa,
            any_hinfo: zone_names.any_hinfo,
            reverse,
        };
        debug!(
            serial = snap.serial,
            services = snap.services.len(),
            rebuilt,
            ready = snap.ready,
            "published snapshot"
        );
        self.current.store(Arc::new(snap));
        rebuilt
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;
    use std::str::FromStr;

    use hickory_proto::rr::Name;

    use super::*;
    use crate::model::{ImportType, Port, Protocol};
    use crate::store::{self, Reader, ZoneConfig};

    fn store() -> (Reader, Writer) {
        store::new(ZoneConfig {
            origin: Name::from_str("clusterset.local.").unwrap(),
            ttl: 5,
            negative_ttl: 5,
            advertise: vec![],
            answers: store::AnswerConfig::standard(),
            identity: Default::default(),
            also: None,
        })
    }

    fn import(ns: &str, name: &str, ip: &str) -> Object {
        Object::Import(ServiceImport {
            key: ServiceKey { namespace: DnsLabel::parse(ns).unwrap(), name: DnsLabel::parse(name).unwrap() },
            kind: ImportType::ClusterSetIp,
            ips: vec![IpAddr::from_str(ip).unwrap()],
            ports: vec![Port { name: None, protocol: Protocol::Tcp, port: 80 }],
            answers: Default::default(),
        })
    }

    fn wire_key(ns: &str, name: &str) -> Vec<u8> {
        names::prefix_key(&[name, ns])
    }

    #[test]
    fn an_edit_to_one_service_re_encodes_only_that_service() {
        let (reader, mut w) = store();
        let objects = (0..1000).map(|i| import("ns", &format!("svc{i}"), "10.0.0.1")).collect();
        w.apply(Update::Replace { source: SourceId(1), objects });
        assert_eq!(w.publish(), 1000);
        let before = reader.load_full();
        w.apply(Update::Upsert { source: SourceId(1), object: import("ns", "svc7", "10.0.0.2") });
        assert_eq!(w.publish(), 1);
        let after = reader.load_full();
        assert!(after.serial() > before.serial());
        let untouched = wire_key("ns", "svc8");
        assert!(
            Arc::ptr_eq(&before.services[&*untouched], &after.services[&*untouched]),
            "untouched services are shared, not rebuilt"
        );
        assert!(!Arc::ptr_eq(
            &before.services[&*wire_key("ns", "svc7")],
            &after.services[&*wire_key("ns", "svc7")]
        ));
    }

    /// The PTR targets answered for `ip`.
    fn ptr(reader: &Reader, ip: &str) -> Vec<String> {
        use hickory_proto::serialize::binary::{BinDecodable, BinDecoder};
        let snap = reader.load();
        let Some(records) = snap.reverse(IpAddr::from_str(ip).unwrap()) else { return vec![] };
        (0..records.len())
            .map(|i| {
                // Each record follows a question for the reverse name; a
                // pointer to it is all the owner is, so any question works.
                let mut buf = vec![0u8; 12];
                buf.extend_from_slice(b"\x01x\x00\x00\x0c\x00\x01");
                let start = buf.len();
                buf.extend_from_slice(records.get(i));
                let mut d = BinDecoder::new(&buf);
                d.read_slice(start).unwrap();
                hickory_proto::rr::Record::read(&mut d).unwrap().data.to_string()
            })
            .collect()
    }

    #[test]
    fn reverse_names_follow_every_edit_and_are_shared_when_untouched() {
        let (reader, mut w) = store();
        w.apply(Update::Replace { source: SourceId(1), objects: vec![import("ns", "a", "10.0.0.1")] });
        w.publish();
        assert_eq!(ptr(&reader, "10.0.0.1"), ["a.ns.svc.clusterset.local."]);
        // The VIP moves: the old address is no longer named.
        w.apply(Update::Upsert { source: SourceId(1), object: import("ns", "a", "10.0.0.2") });
        w.publish();
        assert!(ptr(&reader, "10.0.0.1").is_empty());
        assert_eq!(ptr(&reader, "10.0.0.2"), ["a.ns.svc.clusterset.local."]);
        // Two services naming one address: both answered.
        w.apply(Update::Upsert { source: SourceId(1), object: import("ns", "b", "10.0.0.2") });
        w.publish();
        assert_eq!(ptr(&reader, "10.0.0.2"), ["a.ns.svc.clusterset.local.", "b.ns.svc.clusterset.local."]);
        // A publish that rebuilds no service shares them.
        let before = reader.load_full();
        w.apply(Update::Register(SourceId(2)));
        w.publish();
        let after = reader.load_full();
        assert!(after.serial() > before.serial());
        assert!(Arc::ptr_eq(&before.reverse, &after.reverse), "no service rebuilt: shared");
        // Gone with the services.
        w.apply(Update::Replace { source: SourceId(1), objects: vec![import("ns", "b", "10.0.0.2")] });
        w.publish();
        assert_eq!(ptr(&reader, "10.0.0.2"), ["b.ns.svc.clusterset.local."]);
        w.apply(Update::Replace { source: SourceId(1), objects: vec![] });
        w.publish();
        assert!(ptr(&reader, "10.0.0.2").is_empty());
        assert!(reader.load().reverse.is_empty() && w.reverse.is_empty(), "nothing left behind");
    }

    #[test]
    fn unchanged_objects_publish_nothing() {
        let (reader, mut w) = store();
        w.apply(Update::Replace { source: SourceId(1), objects: vec![import("ns", "a", "10.0.0.1")] });
        w.publish();
        let serial = reader.load().serial();
        w.apply(Update::Replace { source: SourceId(1), objects: vec![import("ns", "a", "10.0.0.1")] });
        assert_eq!(w.publish(), 0);
        assert_eq!(reader.load().serial(), serial);
    }

    #[test]
    fn a_registered_source_keeps_the_store_unready_until_its_first_replace() {
        let (reader, mut w) = store();
        w.apply(Update::Replace { source: SourceId(1), objects: vec![] });
        w.apply(Update::Register(SourceId(2)));
        w.publish();
        assert!(!reader.load().is_ready());
        w.apply(Update::Replace { source: SourceId(2), objects: vec![] });
        w.publish();
        assert!(reader.load().is_ready());
    }

    #[test]
    fn replace_removes_what_the_source_no_longer_holds() {
        let (reader, mut w) = store();
        w.apply(Update::Replace {
            source: SourceId(1),
            objects: vec![import("ns", "a", "10.0.0.1"), import("ns", "b", "10.0.0.1")],
        });
        w.publish();
        assert_eq!(reader.load().service_count(), 2);
        w.apply(Update::Replace { source: SourceId(1), objects: vec![import("ns", "b", "10.0.0.1")] });
        w.publish();
        let snap = reader.load();
        assert_eq!(snap.service_count(), 1);
        assert!(snap.service(&wire_key("ns", "a")).is_none());
    }

    #[test]
    fn the_same_import_from_two_sources_serves_the_first_and_survives_either_removal() {
        let (reader, mut w) = store();
        w.apply(Update::Replace { source: SourceId(2), objects: vec![import("ns", "a", "10.0.0.2")] });
        w.apply(Update::Replace { source: SourceId(1), objects: vec![import("ns", "a", "10.0.0.1")] });
        w.publish();
        let a = |r: &Reader| {
            r.load()
                .service(&wire_key("ns", "a"))
                .and_then(|s| s.get(b""))
                .and_then(|n| n.get(1))
                .map(|s| s.answer.bytes().to_vec())
        };
        let first = a(&reader).unwrap();
        assert!(first.ends_with(&[10, 0, 0, 1]));
        w.apply(Update::Remove {
            source: SourceId(1),
            id: ObjectId::Import(ServiceKey {
                namespace: DnsLabel::parse("ns").unwrap(),
                name: DnsLabel::parse("a").unwrap(),
            }),
        });
        w.publish();
        assert!(a(&reader).unwrap().ends_with(&[10, 0, 0, 2]));
    }

    #[test]
    fn namespaces_exist_while_they_hold_an_import() {
        let (reader, mut w) = store();
        w.apply(Update::Replace { source: SourceId(1), objects: vec![import("ns", "a", "10.0.0.1")] });
        w.publish();
        assert!(reader.load().zone_name(&names::prefix_key(&["ns", "svc"])).is_some());
        w.apply(Update::Replace { source: SourceId(1), objects: vec![] });
        w.publish();
        assert!(reader.load().zone_name(&names::prefix_key(&["ns", "svc"])).is_none());
        assert!(reader.load().zone_name(&names::prefix_key(&["svc"])).is_none());
    }
}
