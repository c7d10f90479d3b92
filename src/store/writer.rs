//! The single writer: applies source updates to the model and publishes
//! snapshots, re-encoding only the services an update touched.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use foldhash::HashMap;
use rustc_hash::FxHashMap;
use tracing::{debug, warn};

use super::hosts::{PtrTarget, Ptrs};
use super::input::{Object, ObjectId, SourceId, Update};
use super::intern::Interner;
use super::names::{self, BuildCtx};
use super::owners::Owners;
use super::resolve;
use super::reverse;
use super::slice::{PortLists, Slice};
use super::snapshot::{ServiceNames, Snapshot, Zone};
use super::vec_map::{SliceMap, VecMap};
use super::wire_key::WireKey;
use crate::model::{BackingKind, BackingService, ClusterId, DnsLabel, ServiceImport, ServiceKey, SliceKey};

/// A service built: its names (`None`: it has none), and why it is
/// answered NODATA, if it is.
type Built = (ServiceKey, Option<ServiceNames>, Option<String>);

#[derive(Default)]
struct SourceState {
    /// The service of each of its slices and backing Services (`owners`).
    /// An import's id is its service, so imports are not indexed here (at
    /// 100,000 services that index cost ~15 MB of keys held twice).
    owners: Owners,
    synced: bool,
}

#[derive(Default)]
struct ServiceState {
    /// Imports by source; the first (lowest source id) is served.
    imports: VecMap<SourceId, ServiceImport>,
    /// Slices of every source and cluster.
    slices: SliceMap,
    /// Services backing an import without `spec.ips` (`--interop`).
    backing: VecMap<(SourceId, SliceKey), BackingService>,
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

    /// Whether `source`'s object `id` is among this service's (`key`).
    fn holds(&self, key: &ServiceKey, source: SourceId, id: &ObjectId) -> bool {
        match id {
            ObjectId::Import(_) => self.imports.get(&source).is_some(),
            // A slice's namespace is its service's (`Slice::name`).
            ObjectId::Slice(slice) => {
                *slice.namespace == *key.namespace.as_str() && self.slices.get(source, &slice.name).is_some()
            }
            ObjectId::Service(service) => self.backing.keys().any(|(s, k)| *s == source && k == service),
        }
    }

    /// The ids of `source`'s objects in this service (`key`).
    fn ids_of<'a>(&'a self, key: &'a ServiceKey, source: SourceId) -> impl Iterator<Item = ObjectId> + 'a {
        let import = self.imports.get(&source).map(|_| ObjectId::Import(key.clone()));
        let slices = self.slices.of(source).map(|slice| ObjectId::Slice(slice.key(key)));
        let backing = self.backing.keys().filter(move |(s, _)| *s == source);
        import.into_iter().chain(slices).chain(backing.map(|(_, k)| ObjectId::Service(k.clone())))
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
    /// Port lists shared by the imports and slices that name equal ones.
    ports: PortLists,
    /// Addresses marked down per service (health overlay).
    down: HashMap<ServiceKey, BTreeSet<IpAddr>>,
    /// Clusters marked not alive.
    dead_clusters: BTreeSet<ClusterId>,
    /// Services whose health overlay changed since the last publish.
    health_dirty: BTreeSet<ServiceKey>,
    /// The names of each address named more than once (a Pod behind two
    /// headless services), in the order named. An address named once is
    /// only in the snapshot.
    named_twice: FxHashMap<IpAddr, Vec<PtrTarget>>,
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
            ports: PortLists::default(),
            down: HashMap::default(),
            dead_clusters: BTreeSet::new(),
            health_dirty: BTreeSet::new(),
            named_twice: FxHashMap::default(),
            unresolved: BTreeMap::new(),
            reported: BTreeSet::new(),
            zone,
            current,
            sources: BTreeMap::new(),
            services: HashMap::default(),
            namespaces: BTreeMap::new(),
            dirty: BTreeSet::new(),
            zone_dirty: true,
            serial: 0,
        }
    }

    /// How many objects `update` adds, net of those of its source it
    /// replaces: what a memory budget weighs before it is applied.
    pub fn growth(&self, update: &Update) -> usize {
        match update {
            Update::Replace { source, objects } => {
                let held: usize = self.services.iter().map(|(key, s)| s.ids_of(key, *source).count()).sum();
                objects.len().saturating_sub(held)
            }
            Update::Upsert { .. } => 1,
            _ => 0,
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
                // Its objects are found among the services (a relist or a
                // reload: one pass, as the objects' own).
                let old: Vec<ObjectId> =
                    self.services.iter().flat_map(|(key, s)| s.ids_of(key, source)).collect();
                // A first list has nothing to remove: no set of 200,000 ids.
                if !old.is_empty() {
                    let keep: foldhash::HashSet<ObjectId> = objects.iter().map(Object::id).collect();
                    for id in old.into_iter().filter(|id| !keep.contains(id)) {
                        self.remove(source, &id);
                    }
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

    /// A service's names with the current health overlay, sharing every
    /// record with `old`; `None` when its health did not change.
    fn rehealth(&self, key: &ServiceKey, old: &ServiceNames) -> Option<ServiceNames> {
        let b = old.balance.as_ref()?;
        let mut addresses = Vec::new();
        let healthy: Box<[bool]> = b
            .endpoints
            .iter()
            .map(|e| {
                addresses.clear();
                addresses.extend(old.endpoint_addresses(e));
                self.healthy(key, &b.clusters[usize::from(e.cluster)].name, &addresses)
            })
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
            hosts: old.hosts.clone(),
        })
    }

    fn upsert(&mut self, source: SourceId, object: Object) {
        let key = object.service().clone();
        if let Object::Slice(set) = &object
            && *set.slice.namespace != *key.namespace.as_str()
        {
            // Every source reads a slice's service in the slice's own
            // namespace, so this is a bug in a source; the slice is filed
            // by name under its service and could not be found again.
            warn!(slice = %set.slice, service = %key, "slice names a service in another namespace; skipping it");
            return;
        }
        let src = self.sources.entry(source).or_default();
        if !matches!(object, Object::Import(_)) {
            let id = object.id();
            match src.owners.get(&id, holder(&self.services, source, &id)).cloned() {
                Some(previous) if previous == key => {}
                Some(previous) => {
                    // A slice can be relabelled to another service.
                    src.owners.remove(&id, &previous);
                    src.owners.insert(&id, key.clone());
                    self.remove_from_service(source, &id, &previous);
                }
                None => src.owners.insert(&id, key.clone()),
            }
        }
        let state = self.services.entry(key.clone()).or_default();
        // Compared before it is stored, so the object is moved, never copied.
        let changed = match object {
            Object::Import(import) => {
                let change = match state.imports.get(&source) {
                    None => Change::Records,
                    Some(old) if *old == import => Change::None,
                    // Only the unreachable clusters or disconnected
                    // addresses changed: health, not records (the sync
                    // controller's and Kosmos's annotations).
                    Some(old)
                        if old.key == import.key
                            && old.kind == import.kind
                            && old.ips == import.ips
                            && old.ports == import.ports
                            && old.answers.same_records(&import.answers) =>
                    {
                        Change::Health
                    }
                    Some(_) => Change::Records,
                };
                if change != Change::None {
                    let ports = self.ports.share(&import.ports);
                    state.imports.insert(source, ServiceImport { ports, ..import });
                }
                if change == Change::Health {
                    self.health_dirty.insert(key.clone());
                }
                change == Change::Records
            }
            Object::Slice(set) => {
                let changed = state.slices.get(source, &set.slice.name).is_none_or(|old| !old.same_as(&set));
                if changed {
                    state.slices.insert(source, Slice::new(set, &mut self.ports));
                }
                changed
            }
            Object::Service(service) => {
                let id = (source, service.object.clone());
                let changed = state.backing.get(&id) != Some(&service);
                if changed {
                    state.backing.insert(id, service);
                }
                changed
            }
        };
        self.recount(&key);
        if changed {
            self.dirty.insert(key);
        }
    }

    fn remove(&mut self, source: SourceId, id: &ObjectId) {
        let key = match id {
            ObjectId::Import(key) => Some(key.clone()),
            _ => self
                .sources
                .get_mut(&source)
                .and_then(|src| src.owners.take(id, holder(&self.services, source, id))),
        };
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
            ObjectId::Slice(slice) => state.slices.remove(source, &slice.name).is_some(),
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

    /// Builds the names of one service (`None`: it has none), and why it
    /// answers NODATA, if it does.
    fn build_one(&self, key: &ServiceKey) -> (Option<ServiceNames>, Option<String>) {
        let Some(state) = self.services.get(key) else { return (None, None) };
        let Some(served) =
            resolve::served(key, state.imports.values().next(), &state.backing, state.slices.values())
        else {
            return (None, None);
        };
        let slices: Vec<&Slice> = served.slices;
        let healthy = |c: &ClusterId, a: &[IpAddr]| self.healthy(key, c, a);
        let cx = BuildCtx { interner: &self.interner, healthy: &healthy };
        (names::service_names(&self.zone, &served.import, &slices, &cx), served.unresolved)
    }

    /// Builds the names of every service in `keys`, in blocks in key order;
    /// at start-up (the whole fleet at once) on every CPU, else on this
    /// thread (one block).
    fn build(&self, keys: BTreeSet<ServiceKey>) -> Vec<Vec<Built>> {
        let keys: Vec<ServiceKey> = keys.into_iter().collect();
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(8);
        if keys.len() < PARALLEL_BUILD || threads < 2 {
            let built = keys
                .into_iter()
                .map(|key| {
                    let (built, why) = self.build_one(&key);
                    (key, built, why)
                })
                .collect();
            return vec![built];
        }
        // Threads take blocks of services as they finish the last, rather
        // than a fixed share each: a headless service costs tens of times a
        // ClusterSetIP one, and equal shares left one thread idle for a
        // tenth of the build. Blocks are put back in key order.
        let next = std::sync::atomic::AtomicUsize::new(0);
        let blocks = keys.len().div_ceil(BUILD_BLOCK);
        let mut done: Vec<(usize, Vec<_>)> = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..threads)
                .map(|_| {
                    scope.spawn(|| {
                        let mut mine = Vec::new();
                        loop {
                            let block = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            if block >= blocks {
                                return mine;
                            }
                            let chunk =
                                &keys[block * BUILD_BLOCK..((block + 1) * BUILD_BLOCK).min(keys.len())];
                            let built: Vec<_> = chunk
                                .iter()
                                .map(|key| {
                                    let (built, why) = self.build_one(key);
                                    (key.clone(), built, why)
                                })
                                .collect();
                            mine.push((block, built));
                        }
                    })
                })
                .collect();
            // A builder thread that panicked is a bug as it would be on this
            // thread: it goes on to the writer task's supervisor.
            workers
                .into_iter()
                .flat_map(|w| w.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
                .collect()
        });
        done.sort_unstable_by_key(|(block, _)| *block);
        // Not flattened into one vector: the publish consumes the blocks
        // one by one, so at 100,000 services no second list of them all
        // (~10 MB) is held at the peak.
        done.into_iter().map(|(_, built)| built).collect()
    }

    /// Publishes a new snapshot if anything changed since the last one, and
    /// returns how many services were re-encoded.
    pub fn publish(&mut self) -> usize {
        if self.dirty.is_empty() && !self.zone_dirty && self.health_dirty.is_empty() {
            return 0;
        }
        let old = self.current.load_full();
        let mut services = old.services.edit();
        let mut reverse = old.reverse.edit();
        let dirty = std::mem::take(&mut self.dirty);
        let rebuilt = dirty.len();
        for key in std::mem::take(&mut self.health_dirty).difference(&dirty) {
            let wire = names::prefix_key(&[key.name.as_str(), key.namespace.as_str()]);
            if let Some(names) = services.get(&wire[..]).and_then(|old| self.rehealth(key, old)) {
                services.insert(WireKey::new(&wire), Arc::new(names));
            }
        }
        // Every cluster and zone the rebuilt services name gets its id
        // first, so the services can be built side by side.
        for key in &dirty {
            for slice in self.services.get(key).iter().flat_map(|s| s.slices.values()) {
                self.interner.cluster(&slice.cluster);
                for zone in slice.endpoints.iter().filter_map(|e| e.zone()) {
                    self.interner.zone(zone);
                }
            }
        }
        for (key, built, unresolved) in self.build(dirty).into_iter().flatten() {
            let wire = WireKey::new(&names::prefix_key(&[key.name.as_str(), key.namespace.as_str()]));
            match unresolved {
                Some(why) => {
                    self.unresolved.insert(key.clone(), why);
                }
                None => {
                    self.unresolved.remove(&key);
                }
            }
            let old_hosts = services.get(&wire[..]).map(|old| old.hosts.clone());
            for (ip, target) in old_hosts.iter().flat_map(|h| h.ptrs()) {
                unname(&mut reverse, &mut self.named_twice, ip, &target);
            }
            match built {
                Some(names) => {
                    for (ip, target) in names.hosts.ptrs() {
                        name(&mut reverse, &mut self.named_twice, ip, target);
                    }
                    services.insert(wire, Arc::new(names));
                }
                None => {
                    services.remove(&wire[..]);
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
        let zone_names = names::zone_names(&self.zone, self.serial, self.namespaces.keys());
        let snap = Snapshot {
            zone: self.zone.clone(),
            serial: self.serial,
            ready: self.is_ready(),
            services: services.finish(),
            zone_names: zone_names.names,
            negative_soa: zone_names.negative_soa,
            any_hinfo: zone_names.any_hinfo,
            reverse: reverse.finish(),
            zones: if old.zones.len() == self.interner.zones.len() {
                old.zones.clone()
            } else {
                self.interner.zones.iter().map(|z| z.as_str().into()).collect()
            },
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

/// Whether a service holds `source`'s object `id`: how `Owners` confirms a
/// match found by the id's hash.
fn holder<'a>(
    services: &'a HashMap<ServiceKey, ServiceState>,
    source: SourceId,
    id: &'a ObjectId,
) -> impl Fn(&ServiceKey) -> bool + 'a {
    move |key| services.get(key).is_some_and(|s| s.holds(key, source, id))
}

/// Services rebuilt in one publish from which the work is spread over
/// threads (a start-up, a relist); fewer are not worth a thread.
const PARALLEL_BUILD: usize = 2048;

/// Services a builder thread takes at a time.
const BUILD_BLOCK: usize = 256;

/// What an import's update changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Change {
    None,
    /// Only the health overlay (see `healthy`).
    Health,
    /// Its records.
    Records,
}

/// Adds `target` to the names `ip` answers.
fn name(
    reverse: &mut reverse::Edit,
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
fn unname(
    reverse: &mut reverse::Edit,
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
fn set_ptrs(reverse: &mut reverse::Edit, ip: IpAddr, targets: &[PtrTarget]) {
    if let Some(ptrs) = Ptrs::of(targets) {
        reverse.insert(ip, ptrs);
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;
    use std::str::FromStr;

    use hickory_proto::rr::Name;

    use super::*;
    use crate::model::{EndpointSet, ImportType, Port, Protocol};
    use crate::store::hosts;
    use crate::store::{self, Reader, ZoneConfig};

    fn store() -> (Reader, Writer) {
        store::new(ZoneConfig::with_defaults(
            Name::from_str("clusterset.local.").unwrap(),
            store::AnswerConfig::standard(),
        ))
    }

    fn import(ns: &str, name: &str, ip: &str) -> Object {
        Object::Import(ServiceImport {
            key: ServiceKey { namespace: DnsLabel::parse(ns).unwrap(), name: DnsLabel::parse(name).unwrap() },
            kind: ImportType::ClusterSetIp,
            ips: vec![IpAddr::from_str(ip).unwrap()].into(),
            ports: vec![Port { name: None, protocol: Protocol::Tcp, port: 80 }].into(),
            answers: Default::default(),
        })
    }

    fn service_key(ns: &str, name: &str) -> ServiceKey {
        ServiceKey { namespace: DnsLabel::parse(ns).unwrap(), name: DnsLabel::parse(name).unwrap() }
    }

    /// A headless import of `ns/name` without ports.
    fn headless(ns: &str, name: &str) -> Object {
        Object::Import(ServiceImport {
            key: service_key(ns, name),
            kind: ImportType::Headless,
            ips: Default::default(),
            ports: Default::default(),
            answers: Default::default(),
        })
    }

    /// An MCS IPv4 slice `slice_ns/slice_name` of `service`, cluster c1,
    /// one ready endpoint at `ip`.
    fn v4_slice(slice_ns: &str, slice_name: &str, service: ServiceKey, ip: &str) -> Object {
        use crate::model::{AddressFamily, ClusterId, Endpoint, SliceKey, SliceOrigin};
        Object::Slice(EndpointSet {
            slice: SliceKey { namespace: slice_ns.into(), name: slice_name.into() },
            service,
            cluster: ClusterId::parse("c1").unwrap(),
            family: AddressFamily::V4,
            ports: vec![],
            endpoints: vec![Endpoint::new(vec![IpAddr::from_str(ip).unwrap()].into(), true)],
            origin: SliceOrigin::Mcs,
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
            Arc::ptr_eq(before.services.get(&*untouched).unwrap(), after.services.get(&*untouched).unwrap()),
            "untouched services are shared, not rebuilt"
        );
        assert!(!Arc::ptr_eq(
            before.services.get(&*wire_key("ns", "svc7")).unwrap(),
            after.services.get(&*wire_key("ns", "svc7")).unwrap()
        ));
    }

    #[test]
    fn a_relabelled_slice_moves_to_its_new_service_and_is_removed_from_there() {
        use crate::model::SliceKey;
        let (reader, mut w) = store();
        let headless = |n: &str| headless("ns", n);
        let slice = |service: &str, ip: &str| v4_slice("ns", "the-slice", service_key("ns", service), ip);
        let answered = |reader: &Reader, n: &str| {
            let snap = reader.load_full();
            snap.service(&wire_key("ns", n)).and_then(|s| s.balance()).map_or(0, |b| b.endpoints.len())
        };
        let objects = vec![headless("a"), headless("b"), slice("a", "10.0.0.1")];
        w.apply(Update::Replace { source: SourceId(1), objects });
        w.publish();
        assert_eq!((answered(&reader, "a"), answered(&reader, "b")), (1, 0));
        w.apply(Update::Upsert { source: SourceId(1), object: slice("b", "10.0.0.2") });
        w.publish();
        assert_eq!((answered(&reader, "a"), answered(&reader, "b")), (0, 1), "moved, not copied");
        // The same again changes nothing; a delete finds it in its new service.
        w.apply(Update::Upsert { source: SourceId(1), object: slice("b", "10.0.0.2") });
        assert_eq!(w.publish(), 0);
        let id = ObjectId::Slice(SliceKey { namespace: "ns".into(), name: "the-slice".into() });
        w.apply(Update::Remove { source: SourceId(1), id: id.clone() });
        w.publish();
        assert_eq!((answered(&reader, "a"), answered(&reader, "b")), (0, 0));
        assert!(w.sources.values().all(|s| s.owners.is_empty()));
        // Back, then gone with a relist that no longer holds it.
        w.apply(Update::Upsert { source: SourceId(1), object: slice("a", "10.0.0.3") });
        w.publish();
        assert_eq!(answered(&reader, "a"), 1);
        w.apply(Update::Replace { source: SourceId(1), objects: vec![headless("a"), headless("b")] });
        w.publish();
        assert_eq!((answered(&reader, "a"), answered(&reader, "b")), (0, 0));
        assert!(w.sources.values().all(|s| s.owners.is_empty()), "nothing left in the index");
    }

    #[test]
    fn slices_of_one_name_in_two_namespaces_stay_apart_and_a_misfiled_one_is_skipped() {
        use crate::model::SliceKey;
        let (reader, mut w) = store();
        let headless = |ns: &str| headless(ns, "db");
        // A slice is filed by name under its service, its namespace the
        // service's: `slice_ns` differing from `service_ns` is a source's bug.
        let slice = |slice_ns: &str, service_ns: &str, ip: &str| {
            v4_slice(slice_ns, "db-c1", service_key(service_ns, "db"), ip)
        };
        let answered = |reader: &Reader, ns: &str| {
            let snap = reader.load_full();
            let service = snap.service(&wire_key(ns, "db"));
            service.and_then(|s| s.balance()).map(|b| s_addresses(service.unwrap(), b)).unwrap_or_default()
        };
        let objects = vec![
            headless("a"),
            headless("b"),
            slice("a", "a", "10.0.0.1"),
            slice("b", "b", "10.0.0.2"),
            slice("a", "b", "10.0.0.3"),
        ];
        w.apply(Update::Replace { source: SourceId(1), objects });
        w.publish();
        assert_eq!(answered(&reader, "a"), ["10.0.0.1"]);
        assert_eq!(answered(&reader, "b"), ["10.0.0.2"], "the misfiled slice is not b's");
        // Each is found again by its own id: removing a's leaves b's.
        let id = |ns: &str| ObjectId::Slice(SliceKey { namespace: ns.into(), name: "db-c1".into() });
        w.apply(Update::Remove { source: SourceId(1), id: id("a") });
        w.publish();
        assert!(answered(&reader, "a").is_empty());
        assert_eq!(answered(&reader, "b"), ["10.0.0.2"]);
        w.apply(Update::Remove { source: SourceId(1), id: id("b") });
        w.publish();
        assert!(answered(&reader, "b").is_empty());
        assert!(w.sources.values().all(|s| s.owners.is_empty()), "nothing left in the index");
    }

    #[test]
    fn imports_and_slices_with_equal_ports_hold_one_list() {
        use crate::model::{AddressFamily, ClusterId, EndpointSet, SliceKey, SliceOrigin};
        let (_reader, mut w) = store();
        let label = |s: &str| DnsLabel::parse(s).unwrap();
        let http = || vec![Port { name: Some(label("http")), protocol: Protocol::Tcp, port: 80 }];
        let key = |n: &str| ServiceKey { namespace: label("ns"), name: label(n) };
        let import = |n: &str| {
            Object::Import(ServiceImport {
                key: key(n),
                kind: ImportType::Headless,
                ips: Default::default(),
                ports: http().into(),
                answers: Default::default(),
            })
        };
        let slice = |n: &str| {
            Object::Slice(EndpointSet {
                slice: SliceKey { namespace: "ns".into(), name: format!("{n}-c1") },
                service: key(n),
                cluster: ClusterId::parse("c1").unwrap(),
                family: AddressFamily::V4,
                ports: http(),
                endpoints: vec![],
                origin: SliceOrigin::Mcs,
            })
        };
        let objects = vec![import("a"), import("b"), slice("a"), slice("b")];
        w.apply(Update::Replace { source: SourceId(1), objects });
        let lists: Vec<&Arc<[Port]>> = ["a", "b"]
            .iter()
            .flat_map(|n| {
                let state = &w.services[&key(n)];
                state.imports.values().map(|i| &i.ports).chain(state.slices.values().map(|s| &s.ports))
            })
            .collect();
        assert_eq!(lists.len(), 4);
        assert!(lists.iter().all(|l| Arc::ptr_eq(l, lists[0])), "one allocation for all four");
    }

    /// The addresses a balanced service answers, as text.
    fn s_addresses(names: &ServiceNames, b: &crate::store::Balance) -> Vec<String> {
        b.endpoints.iter().flat_map(|e| names.endpoint_addresses(e)).map(|a| a.to_string()).collect()
    }

    #[test]
    fn an_endpoints_addresses_are_read_back_from_its_records() {
        use crate::model::{AddressFamily, ClusterId, Endpoint, EndpointSet, SliceKey, SliceOrigin};
        let (reader, mut w) = store();
        let key =
            ServiceKey { namespace: DnsLabel::parse("ns").unwrap(), name: DnsLabel::parse("db").unwrap() };
        let ip = |s: &str| IpAddr::from_str(s).unwrap();
        let ep = |a: &str, target: Option<&str>| {
            Endpoint::new(vec![ip(a)].into(), true).with_names(None, None, target)
        };
        let slice = |name: &str, family, endpoints| {
            Object::Slice(EndpointSet {
                slice: SliceKey { namespace: "ns".into(), name: name.into() },
                service: key.clone(),
                cluster: ClusterId::parse("c1").unwrap(),
                family,
                ports: vec![],
                endpoints,
                origin: SliceOrigin::Mcs,
            })
        };
        let objects = vec![
            Object::Import(ServiceImport {
                key: key.clone(),
                kind: ImportType::Headless,
                ips: Default::default(),
                ports: Default::default(),
                answers: Default::default(),
            }),
            // Pod p0 in both families (paired by targetRef); p1 IPv4 only;
            // an endpoint without a target; and p2 repeating p1's address.
            slice(
                "v4",
                AddressFamily::V4,
                vec![
                    ep("10.0.0.1", Some("Pod/ns/p0")),
                    ep("10.0.0.2", Some("Pod/ns/p1")),
                    ep("10.0.0.3", None),
                    ep("10.0.0.2", Some("Pod/ns/p2")),
                ],
            ),
            slice("v6", AddressFamily::V6, vec![ep("fd00::1", Some("Pod/ns/p0"))]),
        ];
        w.apply(Update::Replace { source: SourceId(1), objects });
        w.publish();
        let snap = reader.load_full();
        let names = snap.service(&wire_key("ns", "db")).unwrap();
        let b = names.balance().unwrap();
        let got: Vec<(String, Vec<IpAddr>)> = b
            .endpoints
            .iter()
            .map(|e| (names.endpoint_label(e), names.endpoint_addresses(e).collect()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("Pod/ns/p0".to_owned(), vec![ip("10.0.0.1"), ip("fd00::1")]),
                ("Pod/ns/p1".to_owned(), vec![ip("10.0.0.2")]),
                ("10.0.0.3".to_owned(), vec![ip("10.0.0.3")]),
                // One record per address: the first endpoint naming it has it.
                ("Pod/ns/p2".to_owned(), vec![]),
            ]
        );
    }

    #[test]
    fn a_cluster_set_ip_services_srv_additional_records_are_its_a_answer() {
        let (reader, mut w) = store();
        let named = |name: &str, ip: &str| {
            let mut object = import("ns", name, ip);
            if let Object::Import(i) = &mut object {
                i.ports = vec![Port {
                    name: Some(DnsLabel::parse("http").unwrap()),
                    protocol: Protocol::Tcp,
                    port: 80,
                }]
                .into();
            }
            object
        };
        w.apply(Update::Replace {
            source: SourceId(1),
            objects: vec![named("one", "10.0.0.1"), named("two", "10.0.0.2")],
        });
        w.publish();
        let snap = reader.load();
        let set = |svc: &str, prefix: &[&str], rtype: u16| {
            let names = &snap.services.get(&*wire_key("ns", svc)).unwrap().names;
            names.get(&names::prefix_key(prefix)).unwrap().get(rtype).unwrap().clone()
        };
        let (a, srv, port) = (set("one", &[], 1), set("one", &[], 33), set("one", &["_http", "_tcp"], 33));
        assert_eq!(srv.additional, a.answer);
        assert!(srv.additional.same_allocation(&a.answer), "the same records, kept once");
        assert!(port.shifted && port.additional.same_allocation(&a.answer));
        // Nothing to share across services: hickory-proto writes an SRV
        // target in full (RFC 2782), and the target is the service name.
        let other = set("two", &[], 33);
        assert_eq!(srv.answer.bytes()[..18], other.answer.bytes()[..18], "owner, TTL, weight, port");
        assert_ne!(srv.answer.bytes(), other.answer.bytes());
    }

    #[test]
    fn a_single_named_ports_srv_answer_is_the_service_names_own() {
        let (reader, mut w) = store();
        let mut one = import("ns", "one", "10.0.0.1");
        let mut two = import("ns", "two", "10.0.0.2");
        if let Object::Import(i) = &mut one {
            i.ports = vec![Port {
                name: Some(DnsLabel::parse("http").unwrap()),
                protocol: Protocol::Tcp,
                port: 80,
            }]
            .into();
        }
        if let Object::Import(i) = &mut two {
            i.ports = vec![
                Port { name: Some(DnsLabel::parse("http").unwrap()), protocol: Protocol::Tcp, port: 80 },
                Port { name: Some(DnsLabel::parse("dns").unwrap()), protocol: Protocol::Udp, port: 53 },
            ]
            .into();
        }
        w.apply(Update::Replace { source: SourceId(1), objects: vec![one, two] });
        w.publish();
        let snap = reader.load();
        let srv = |svc: &str, prefix: &[&str]| {
            let names = &snap.services.get(&*wire_key("ns", svc)).unwrap().names;
            names.get(&names::prefix_key(prefix)).unwrap().get(33).unwrap().answer.clone()
        };
        let (bare, port) = (srv("one", &[]), srv("one", &["_http", "_tcp"]));
        assert_eq!(bare.len(), 1);
        assert!(bare.same_allocation(&port), "one named port: the same records, kept once");
        // Two ports: the bare name answers both (weight 50 each), each port
        // name its own (weight 100).
        let (bare, http) = (srv("two", &[]), srv("two", &["_http", "_tcp"]));
        assert_eq!((bare.len(), http.len()), (2, 1));
        assert!(!bare.same_allocation(&http) && bare.get(0) != http.get(0));
    }

    #[test]
    fn a_headless_services_srv_records_are_written_per_query_as_the_encoder_writes_them() {
        use hickory_proto::rr::rdata::SRV;
        use hickory_proto::rr::{RData, Record, RecordType};
        let (reader, mut w) = store();
        let label = |s: &str| DnsLabel::parse(s).unwrap();
        let http = Port { name: Some(label("http")), protocol: Protocol::Tcp, port: 80 };
        let dns = Port { name: Some(label("dns")), protocol: Protocol::Udp, port: 53 };
        let key = ServiceKey { namespace: label("ns"), name: label("hl") };
        let import = ServiceImport {
            key: key.clone(),
            kind: ImportType::Headless,
            ips: Default::default(),
            ports: vec![http.clone(), dns.clone()].into(),
            answers: Default::default(),
        };
        let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
        let endpoint = |addrs: &[IpAddr], hostname: Option<&str>| {
            crate::model::Endpoint::new(addrs.into(), true).with_names(
                hostname.map(label).as_ref(),
                None,
                None,
            )
        };
        let slice = |family, endpoints| {
            Object::Slice(EndpointSet {
                slice: SliceKey { namespace: "ns".into(), name: format!("hl-{family:?}") },
                service: key.clone(),
                cluster: ClusterId::parse("east").unwrap(),
                family,
                ports: vec![http.clone(), dns.clone()],
                endpoints,
                origin: crate::model::SliceOrigin::Mcs,
            })
        };
        let objects = vec![
            Object::Import(import),
            slice(
                crate::model::AddressFamily::V4,
                vec![
                    endpoint(&[ip("10.0.0.1"), ip("10.0.0.2")], Some("web-0")),
                    endpoint(&[ip("10.0.0.3")], None),
                ],
            ),
            slice(crate::model::AddressFamily::V6, vec![endpoint(&[ip("fd00::1")], Some("web-0"))]),
        ];
        w.apply(Update::Replace { source: SourceId(1), objects });
        w.publish();
        let snap = reader.load();
        let service = snap.services.get(&*wire_key("ns", "hl")).unwrap();
        let zone = &snap.zone().wire;
        let name = |s: &str| Name::from_str(s).unwrap();
        let (web, other) = (
            name("web-0.east.hl.ns.svc.clusterset.local."),
            name("10-0-0-3.east.hl.ns.svc.clusterset.local."),
        );
        // Every target once in the additional section, in the order of the
        // first record naming it, A before AAAA.
        let additional = [(&web, "10.0.0.1"), (&web, "10.0.0.2"), (&web, "fd00::1"), (&other, "10.0.0.3")];
        for (prefix, owner, svc_at, records) in [
            (
                vec![],
                "hl.ns.svc.clusterset.local.",
                0,
                vec![(80, &web), (53, &web), (80, &other), (53, &other)],
            ),
            (
                vec!["_http", "_tcp"],
                "_http._tcp.hl.ns.svc.clusterset.local.",
                11,
                vec![(80, &web), (80, &other)],
            ),
            (
                vec!["_dns", "_udp"],
                "_dns._udp.hl.ns.svc.clusterset.local.",
                10,
                vec![(53, &web), (53, &other)],
            ),
        ] {
            let prefix = names::prefix_key(&prefix);
            let set = service.names.get(&prefix).unwrap().get(33).unwrap();
            assert!(
                set.from_hosts && set.answer.is_empty() && set.additional.is_empty(),
                "{owner}: not encoded"
            );
            let owner = name(owner);
            let weight = 100 / records.len() as u16;
            let srv: Vec<Record> = records
                .iter()
                .map(|(port, target)| {
                    Record::from_rdata(
                        owner.clone(),
                        5,
                        RData::SRV(SRV::new(0, weight, *port, (*target).clone())),
                    )
                })
                .collect();
            let addresses: Vec<Record> = additional
                .iter()
                .map(|(target, a)| {
                    let rdata = match ip(a) {
                        IpAddr::V4(v4) => RData::A(v4.into()),
                        IpAddr::V6(v6) => RData::AAAA(v6.into()),
                    };
                    Record::from_rdata((*target).clone(), 5, rdata)
                })
                .collect();
            let expected = super::super::encode::records(&owner, RecordType::SRV, &srv).unwrap();
            let expected_additional =
                super::super::encode::records(&owner, RecordType::SRV, &addresses).unwrap();
            let hosts = &service.hosts;
            let written = hosts.srv(&prefix).unwrap();
            let mut out = Vec::new();
            assert_eq!(
                written.write_answer(hosts, zone, 5, &mut out, usize::MAX),
                (records.len() as u16, true)
            );
            assert_eq!(out, expected.bytes(), "{owner}: answer");
            out.clear();
            assert_eq!(written.write_additional(hosts, svc_at, 5, &mut out, usize::MAX), 4);
            assert_eq!(out, expected_additional.bytes(), "{owner}: additional");
            // Whole records only, within the budget.
            let first = expected.get(0).len();
            out.clear();
            assert_eq!(written.write_answer(hosts, zone, 5, &mut out, first + 1), (1, false));
            assert_eq!(out, expected.get(0));
            out.clear();
            assert_eq!(written.write_additional(hosts, svc_at, 5, &mut out, expected_additional.start(2)), 2);
        }
    }

    /// The PTR targets answered for `ip`.
    fn ptr(reader: &Reader, ip: &str) -> Vec<String> {
        use hickory_proto::serialize::binary::{BinDecodable, BinDecoder};
        let snap = reader.load();
        let ip = IpAddr::from_str(ip).unwrap();
        let Some(ptrs) = snap.reverse(ip) else { return vec![] };
        ptrs.targets()
            .map(|target| {
                // Each record follows a question for the reverse name; a
                // pointer to it is all the owner is, so any question works.
                let mut buf = vec![0u8; 12];
                buf.extend_from_slice(b"\x01x\x00\x00\x0c\x00\x01");
                let start = buf.len();
                assert!(hosts::write_ptr(&mut buf, ip, target, &snap.zone().wire, 5, usize::MAX));
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
        assert!(
            after.services.shares_all(&before.services) && after.reverse.shares_all(&before.reverse),
            "no service rebuilt: shared"
        );
        // Gone with the services.
        w.apply(Update::Replace { source: SourceId(1), objects: vec![import("ns", "b", "10.0.0.2")] });
        w.publish();
        assert_eq!(ptr(&reader, "10.0.0.2"), ["b.ns.svc.clusterset.local."]);
        w.apply(Update::Replace { source: SourceId(1), objects: vec![] });
        w.publish();
        assert!(ptr(&reader, "10.0.0.2").is_empty());
        assert!(reader.load().reverse.is_empty() && w.named_twice.is_empty(), "nothing left behind");
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
    fn a_replace_finds_the_sources_imports_without_an_index_and_leaves_other_sources_alone() {
        let (reader, mut w) = store();
        let both = || vec![import("ns", "a", "10.0.0.1"), import("ns", "b", "10.0.0.1")];
        w.apply(Update::Replace { source: SourceId(1), objects: both() });
        w.apply(Update::Replace { source: SourceId(2), objects: vec![import("ns", "b", "10.0.0.2")] });
        let key = |name: &str| ServiceKey {
            namespace: DnsLabel::parse("ns").unwrap(),
            name: DnsLabel::parse(name).unwrap(),
        };
        w.apply(Update::Remove { source: SourceId(1), id: ObjectId::Import(key("a")) });
        // Removing what the source does not hold changes nothing.
        w.apply(Update::Remove { source: SourceId(1), id: ObjectId::Import(key("a")) });
        w.apply(Update::Remove { source: SourceId(3), id: ObjectId::Import(key("b")) });
        w.publish();
        assert_eq!(reader.load().service_count(), 1);
        // Source 1 lets go of b; source 2 still holds it.
        w.apply(Update::Replace { source: SourceId(1), objects: vec![] });
        w.publish();
        assert_eq!(reader.load().service_count(), 1);
        assert!(reader.load().service(&wire_key("ns", "b")).is_some());
        w.apply(Update::Replace { source: SourceId(2), objects: vec![] });
        w.publish();
        assert_eq!(reader.load().service_count(), 0);
        // Nothing is left of either source: a new list is a first list again.
        assert!(w.sources.values().all(|s| s.owners.is_empty()));
        assert!(w.services.values().all(|s| s.imports.is_empty()));
        w.apply(Update::Replace { source: SourceId(1), objects: both() });
        w.publish();
        assert_eq!(reader.load().service_count(), 2);
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
