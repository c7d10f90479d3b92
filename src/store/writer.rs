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

use super::hosts::PtrTarget;
use super::input::{Object, ObjectId, SourceId, Update};
use super::intern::Interner;
use super::names::{self, BuildCtx};
use super::owners::Owners;
use super::programming::{Pending, Programmed};
use super::resolve;
use super::reverse::{self, Edit as ReverseEdit, Reverse};
use super::shards::{Edit as ShardsEdit, Shards};
use super::slice::{PortLists, Slice};
use super::snapshot::{ServiceNames, Snapshot, Zone};
use super::vec_map::{SliceMap, VecMap};
use super::wire_key::WireKey;
use crate::model::{
    BackingKind, BackingService, ClusterId, DnsLabel, ImportType, ServiceImport, ServiceKey, SliceKey,
};

mod kinds;
pub use kinds::{Growth, Kinds};

/// A service built: its names (`None`: it has none), why it is answered
/// NODATA, if it is, and the kind it is answered as (`None`: not answered).
type Built = (ServiceKey, Option<ServiceNames>, Option<String>, Option<ImportType>);

#[derive(Default)]
struct SourceState {
    /// The service of each of its slices and backing Services (`owners`).
    /// An import's id is its service, so imports are not indexed here (at
    /// 100,000 services that index cost ~15 MB of keys held twice).
    owners: Owners,
    synced: bool,
    /// A list arriving in parts ([`Update::Part`]), until its last part.
    listing: Option<Listing>,
}

/// A list of one source arriving in parts.
struct Listing {
    /// The ids listed so far; `None` when the source held nothing as the
    /// list began: then nothing can be gone, and no set is kept.
    seen: Option<foldhash::HashSet<ObjectId>>,
    /// Objects the source held as the list began.
    held: Kinds,
    /// Objects the list has brought so far.
    listed: Kinds,
    /// A part was refused (memory budget): the rest of the list is refused
    /// too, and nothing is removed at its end.
    abandoned: bool,
}

impl Listing {
    /// Objects a part of `n` adds to the source: what the list brings
    /// beyond what the source held, kind by kind (a relist mostly replaces
    /// objects one for one).
    fn growth(&self, n: Kinds) -> Kinds {
        let grows = |listed: usize, n: usize, held: usize| (listed + n).saturating_sub(held.max(listed));
        Kinds {
            imports: grows(self.listed.imports, n.imports, self.held.imports),
            slices: grows(self.listed.slices, n.slices, self.held.slices),
            services: grows(self.listed.services, n.services, self.held.services),
            endpoints: 0,
        }
    }
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
    /// Slice changes waiting for the publish that answers them, with their
    /// trigger times (`store::programming`).
    pending: Vec<(ServiceKey, Pending)>,
    /// What the publishes since [`Writer::take_programmed`] measured.
    programmed: Programmed,
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
            pending: Vec::new(),
            programmed: Programmed::default(),
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

    /// What `update` adds to its source, kind by kind: what a memory
    /// budget weighs before it is applied. An object the source already
    /// holds (found by its kind's identity: an import by its service, a
    /// slice or a backing Service by namespace and name) adds nothing when
    /// it changes, so an edit is never weighed as growth; nor is a removal.
    pub fn growth(&self, update: &Update) -> Growth {
        let listing = |source: &SourceId| self.sources.get(source).and_then(|s| s.listing.as_ref());
        let mut kinds = match update {
            Update::Replace { source, objects } => Kinds::of(objects).beyond(self.held_by(*source)),
            Update::Part { source, objects, first } => match listing(source).filter(|_| !*first) {
                Some(l) if l.abandoned => return Growth::CutShort,
                Some(l) => l.growth(Kinds::of(objects)),
                None => Kinds::of(objects).beyond(self.held_by(*source)),
            },
            Update::LastPart { source, objects } => match listing(source) {
                Some(l) if l.abandoned => return Growth::CutShort,
                Some(l) => l.growth(Kinds::of(objects)),
                None => Kinds::of(objects),
            },
            // Not held: its endpoints are all new (Kinds::of counts them).
            Update::Upsert { source, object } if !self.holds_object(*source, object) => {
                return Growth::Adds(Kinds::of([object]));
            }
            _ => return Growth::Adds(Kinds::default()),
        };
        // A list: its objects counted by number, its endpoints by identity.
        if let Update::Replace { source, objects }
        | Update::Part { source, objects, .. }
        | Update::LastPart { source, objects } = update
        {
            kinds.endpoints = self.new_endpoints(*source, objects);
        }
        Growth::Adds(kinds)
    }

    /// Endpoints of the slices among `objects` that `source` does not hold:
    /// a slice is weighed by what it holds, from one endpoint to a
    /// thousand. Those of held slices are not counted, whatever their
    /// number now: a list that brings an edit is applied as an edit is.
    fn new_endpoints(&self, source: SourceId, objects: &[Object]) -> usize {
        objects
            .iter()
            .filter_map(|o| match o {
                Object::Slice(set) if !self.holds_object(source, o) => Some(set.endpoints.len()),
                _ => None,
            })
            .sum()
    }

    /// Whether `source` holds an object with `object`'s identity.
    fn holds_object(&self, source: SourceId, object: &Object) -> bool {
        match object.id() {
            ObjectId::Import(key) => {
                self.services.get(&key).is_some_and(|s| s.imports.get(&source).is_some())
            }
            // A slice relabelled to another service is held under its old
            // one: found through the source's owners, as `upsert` finds it.
            id => self
                .sources
                .get(&source)
                .is_some_and(|src| src.owners.get(&id, holder(&self.services, source, &id)).is_some()),
        }
    }

    /// How many objects of each kind `source` holds (not their endpoints:
    /// [`Self::new_endpoints`] weighs those by identity).
    fn held_by(&self, source: SourceId) -> Kinds {
        let mut held = Kinds::default();
        for service in self.services.values() {
            held.add(Kinds {
                imports: usize::from(service.imports.get(&source).is_some()),
                slices: service.slices.of(source).count(),
                services: service.backing.keys().filter(|(s, _)| *s == source).count(),
                endpoints: 0,
            });
        }
        held
    }

    /// The ids of every object `source` holds (found among the services:
    /// one pass, as the objects' own).
    fn source_ids(&self, source: SourceId) -> Vec<ObjectId> {
        self.services.iter().flat_map(|(key, s)| s.ids_of(key, source)).collect()
    }

    /// Removes those of `old` (the source's ids) that a complete list did
    /// not have.
    fn remove_unlisted(
        &mut self,
        source: SourceId,
        old: Vec<ObjectId>,
        listed: &foldhash::HashSet<ObjectId>,
    ) {
        for id in old.into_iter().filter(|id| !listed.contains(id)) {
            self.remove(source, &id);
        }
    }

    /// `update` was refused (the memory budget): when it is part of a list,
    /// the rest of that list is refused too and removes nothing at its end,
    /// so that a list cut short never takes away what it did not bring.
    pub fn refused(&mut self, update: &Update) {
        let (Update::Part { source, .. } | Update::LastPart { source, .. }) = update else {
            return;
        };
        let held = self.held_by(*source);
        let state = self.sources.entry(*source).or_default();
        let listing = state.listing.get_or_insert(Listing {
            seen: None,
            held,
            listed: Kinds::default(),
            abandoned: true,
        });
        listing.abandoned = true;
        if matches!(update, Update::LastPart { .. }) {
            state.listing = None;
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
            Update::Part { source, objects, first } => self.list_part(source, objects, first),
            Update::LastPart { source, objects } => self.end_list(source, objects),
            Update::Replace { source, objects } => self.replace(source, objects),
            Update::Upsert { source, object } => self.upsert(source, object),
            Update::Remove { source, id } => self.remove(source, &id),
            Update::EndpointHealth { service, address, healthy } => {
                self.endpoint_health(service, address, healthy)
            }
            Update::ClusterLiveness { cluster, alive } => self.cluster_liveness(cluster, alive),
        }
    }

    /// A part of a list ([`Update::Part`]): its objects applied and their
    /// ids remembered, so that the list's end removes what it did not have.
    fn list_part(&mut self, source: SourceId, objects: Vec<Object>, first: bool) {
        let starts = first || self.sources.get(&source).is_none_or(|s| s.listing.is_none());
        if starts {
            let held = self.held_by(source);
            let listing = Listing {
                seen: (held.total() > 0).then(Default::default),
                held,
                listed: Kinds::default(),
                abandoned: false,
            };
            self.sources.entry(source).or_default().listing = Some(listing);
        }
        if let Some(listing) = self.sources.get_mut(&source).and_then(|s| s.listing.as_mut()) {
            if listing.abandoned {
                return;
            }
            listing.listed.add(Kinds::of(&objects));
            if let Some(seen) = listing.seen.as_mut() {
                seen.extend(objects.iter().map(Object::id));
            }
        }
        for object in objects {
            self.upsert(source, object);
        }
    }

    /// The last part of a list ([`Update::LastPart`]): what the source
    /// held and no part listed is removed, unless the list was cut short.
    fn end_list(&mut self, source: SourceId, objects: Vec<Object>) {
        let listing = self.sources.get_mut(&source).and_then(|s| s.listing.take());
        match listing {
            // The list's parts began on a source that held nothing: all it
            // holds came from them.
            Some(Listing { seen: None, abandoned: false, .. }) => {}
            Some(Listing { seen: Some(mut seen), abandoned: false, .. }) => {
                seen.extend(objects.iter().map(Object::id));
                let old = self.source_ids(source);
                self.remove_unlisted(source, old, &seen);
            }
            // Cut short, or no part of it came: nothing is known to be gone.
            Some(_) | None => {}
        }
        self.complete(source, objects);
    }

    /// A list in one piece ([`Update::Replace`]): the source's complete state.
    fn replace(&mut self, source: SourceId, objects: Vec<Object>) {
        // A list in one piece ends any list in parts never finished.
        if let Some(state) = self.sources.get_mut(&source) {
            state.listing = None;
        }
        let old = self.source_ids(source);
        // A first list has nothing to remove: no set of 200,000 ids.
        if !old.is_empty() {
            let keep: foldhash::HashSet<ObjectId> = objects.iter().map(Object::id).collect();
            self.remove_unlisted(source, old, &keep);
        }
        self.complete(source, objects);
    }

    /// A probe's verdict on one address of `service`'s endpoints: marks the
    /// service's health dirty when the verdict changed.
    fn endpoint_health(&mut self, service: ServiceKey, address: IpAddr, healthy: bool) {
        let down = self.down.entry(service.clone()).or_default();
        let changed = if healthy { down.remove(&address) } else { down.insert(address) };
        if down.is_empty() {
            self.down.remove(&service);
        }
        if changed {
            self.health_dirty.insert(service);
        }
    }

    /// A member cluster became reachable or not: every service with a slice
    /// of it has its health dirty.
    fn cluster_liveness(&mut self, cluster: ClusterId, alive: bool) {
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

    /// The last of a complete list: its objects applied, the source synced.
    fn complete(&mut self, source: SourceId, objects: Vec<Object>) {
        for object in objects {
            self.upsert(source, object);
        }
        let state = self.sources.entry(source).or_default();
        if !state.synced {
            state.synced = true;
            self.zone_dirty = true;
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
        // A change after the source's first list is a change to measure; the
        // first list is the server starting.
        let measured = self.sources.entry(source).or_default().synced;
        if !matches!(object, Object::Import(_)) {
            self.own(source, &object.id(), &key);
        }
        let state = self.services.entry(key.clone()).or_default();
        // Compared before it is stored, so the object is moved, never copied.
        let changed = match object {
            Object::Import(import) => {
                let change = Change::of(state.imports.get(&source), &import);
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
                let old = state.slices.get(source, &set.slice.name);
                let changed = old.is_none_or(|old| !old.same_as(&set));
                let fingerprint = set.trigger.fingerprint();
                let retimed = old.is_some_and(|old| old.trigger != fingerprint);
                if changed && measured {
                    let repeated = old.is_some_and(|old| old.trigger == fingerprint);
                    self.pending.push((key.clone(), Pending { trigger: set.trigger, repeated }));
                }
                // A new trigger time alone is kept (the next change is judged
                // against it), and answers nothing new.
                if changed || retimed {
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

    /// Files `source`'s object `id` (a slice, a backing Service) under the
    /// service `key` in the source's owners, taking it from the service it
    /// was under if it was relabelled to another.
    fn own(&mut self, source: SourceId, id: &ObjectId, key: &ServiceKey) {
        let src = self.sources.entry(source).or_default();
        match src.owners.get(id, holder(&self.services, source, id)).cloned() {
            Some(previous) if previous == *key => {}
            Some(previous) => {
                src.owners.remove(id, &previous);
                src.owners.insert(id, key.clone());
                self.remove_from_service(source, id, &previous);
            }
            None => src.owners.insert(id, key.clone()),
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

    /// Builds the names of one service (`None`: it has none), why it
    /// answers NODATA, if it does, and the kind it is answered as.
    fn build_one(&self, key: &ServiceKey) -> (Option<ServiceNames>, Option<String>, Option<ImportType>) {
        let Some(state) = self.services.get(key) else { return (None, None, None) };
        let Some(served) =
            resolve::served(key, state.imports.values().next(), &state.backing, state.slices.values())
        else {
            return (None, None, None);
        };
        let slices: Vec<&Slice> = served.slices;
        let healthy = |c: &ClusterId, a: &[IpAddr]| self.healthy(key, c, a);
        let cx = BuildCtx { interner: &self.interner, healthy: &healthy };
        let names = names::service_names(&self.zone, &served.import, &slices, &cx);
        let kind = names.as_ref().map(|_| served.import.kind);
        (names, served.unresolved, kind)
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
                    let (built, why, kind) = self.build_one(&key);
                    (key, built, why, kind)
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
                                    let (built, why, kind) = self.build_one(key);
                                    (key.clone(), built, why, kind)
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
        self.reheal(&dirty, &mut services);
        self.intern_localities(&dirty);
        // The kind each changed slice's service is answered as, for the
        // changes measured once this snapshot is stored.
        let mut kinds: HashMap<ServiceKey, ImportType> = HashMap::default();
        for (key, built, unresolved, kind) in self.build(dirty).into_iter().flatten() {
            if let Some(kind) = kind.filter(|_| !self.pending.is_empty()) {
                kinds.insert(key.clone(), kind);
            }
            match unresolved {
                Some(why) => {
                    self.unresolved.insert(key.clone(), why);
                }
                None => {
                    self.unresolved.remove(&key);
                }
            }
            self.replace_names(&mut services, &mut reverse, &key, built);
            if self.services.get(&key).is_some_and(ServiceState::is_empty) {
                self.services.remove(&key);
            }
        }
        self.zone_dirty = false;
        self.report_unresolved();
        let snap = self.next_snapshot(&old, services.finish(), reverse.finish());
        debug!(
            serial = snap.serial,
            services = snap.services.len(),
            rebuilt,
            ready = snap.ready,
            "published snapshot"
        );
        self.current.store(Arc::new(snap));
        // Answered from now on.
        let published = SystemTime::now();
        for (key, change) in std::mem::take(&mut self.pending) {
            self.programmed.judge(&change, kinds.get(&key).copied(), published);
        }
        rebuilt
    }

    /// Re-weighs the services whose health changed and that are not rebuilt
    /// anyway (`dirty`), sharing all else with their old names.
    fn reheal(
        &mut self,
        dirty: &BTreeSet<ServiceKey>,
        services: &mut ShardsEdit<WireKey, Arc<ServiceNames>>,
    ) {
        for key in std::mem::take(&mut self.health_dirty).difference(dirty) {
            let wire = names::prefix_key(&[key.name.as_str(), key.namespace.as_str()]);
            if let Some(names) = services.get(&wire[..]).and_then(|old| self.rehealth(key, old)) {
                services.insert(WireKey::new(&wire), Arc::new(names));
            }
        }
    }

    /// Gives every cluster and zone the `dirty` services name its id before
    /// they are built, so that they can be built side by side.
    fn intern_localities(&mut self, dirty: &BTreeSet<ServiceKey>) {
        for key in dirty {
            for slice in self.services.get(key).iter().flat_map(|s| s.slices.values()) {
                self.interner.cluster(&slice.cluster);
                for zone in slice.endpoints.iter().filter_map(|e| e.zone()) {
                    self.interner.zone(zone);
                }
            }
        }
    }

    /// Puts a service's rebuilt names (`None`: it has none now) in place of
    /// its old ones, and its addresses' PTR names in place of the old.
    fn replace_names(
        &mut self,
        services: &mut ShardsEdit<WireKey, Arc<ServiceNames>>,
        reverse: &mut ReverseEdit,
        key: &ServiceKey,
        built: Option<ServiceNames>,
    ) {
        let wire = WireKey::new(&names::prefix_key(&[key.name.as_str(), key.namespace.as_str()]));
        let old_hosts = services.get(&wire[..]).map(|old| old.hosts.clone());
        for (ip, target) in old_hosts.iter().flat_map(|h| h.ptrs()) {
            reverse::unname(reverse, &mut self.named_twice, ip, &target);
        }
        match built {
            Some(names) => {
                for (ip, target) in names.hosts.ptrs() {
                    reverse::name(reverse, &mut self.named_twice, ip, target);
                }
                services.insert(wire, Arc::new(names));
            }
            None => {
                services.remove(&wire[..]);
            }
        }
    }

    /// The snapshot after `old` that holds `services` and `reverse`, with
    /// the next serial and the zone's own names.
    fn next_snapshot(
        &mut self,
        old: &Snapshot,
        services: Shards<WireKey, Arc<ServiceNames>>,
        reverse: Reverse,
    ) -> Snapshot {
        // Serials follow the clock across restarts and still increase on
        // every change within a second.
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as u32).unwrap_or(0);
        self.serial = self.serial.wrapping_add(1).max(now);
        let zone_names = names::zone_names(&self.zone, self.serial, self.namespaces.keys());
        Snapshot {
            zone: self.zone.clone(),
            serial: self.serial,
            ready: self.is_ready(),
            services,
            zone_names: zone_names.names,
            negative_soa: zone_names.negative_soa,
            any_hinfo: zone_names.any_hinfo,
            reverse,
            zones: if old.zones.len() == self.interner.zones.len() {
                old.zones.clone()
            } else {
                self.interner.zones.iter().map(|z| z.as_str().into()).collect()
            },
        }
    }

    /// What the publishes since the last call measured of slice changes
    /// (`store::programming`).
    pub fn take_programmed(&mut self) -> Programmed {
        std::mem::take(&mut self.programmed)
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

impl Change {
    /// What storing `new` over `old` (the source's import of the same
    /// service, if any) changes.
    fn of(old: Option<&ServiceImport>, new: &ServiceImport) -> Self {
        match old {
            None => Self::Records,
            Some(old) if old == new => Self::None,
            // Only the unreachable clusters or disconnected addresses
            // changed: health, not records (the sync controller's and
            // Kosmos's annotations).
            Some(old)
                if old.key == new.key
                    && old.kind == new.kind
                    && old.ips == new.ips
                    && old.ports == new.ports
                    && old.answers.same_records(&new.answers) =>
            {
                Self::Health
            }
            Some(_) => Self::Records,
        }
    }
}

#[cfg(test)]
mod tests;
