//! What every member holds, indexed by service: the fleet side's only
//! mutable state. Watches feed it [`MemberEvent`]s; each event says which
//! services it touched, and consumers (centralized `serve`, `sync`) recompute
//! only those.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::export::{ClusterExport, Exported, ExportedMetadata};

/// A ServiceExport as the fleet keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportInfo {
    /// Its creation time (Unix seconds).
    pub exported_at: i64,
    /// Created by the controller (auto-export), so the controller may remove it.
    pub ours: bool,
    /// Its `clusterset-dns.io/…` annotations.
    pub annotations: std::collections::BTreeMap<String, String>,
    /// Its `spec.exportedLabels` and `spec.exportedAnnotations`.
    pub metadata: ExportedMetadata,
    /// Its `metadata.uid`: a deleted and re-created export is a new one
    /// (fresh conditions), even within the same second.
    pub uid: Option<String>,
}

/// A Service as the fleet keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceInfo {
    /// What it offers for export.
    pub exported: Exported,
    /// It asks to be exported (annotation `clusterset-dns.io/export` or
    /// `kosmos.io/auto-create-mcs`).
    pub auto_export: bool,
    /// Its `clusterset-dns.io/consumer-clusters`, for the export
    /// auto-export creates.
    pub consumers: Option<String>,
}
use super::objects;
use crate::model::{ClusterId, EndpointSet, ServiceKey, SliceKey};

/// A change to one kind of object of one member.
#[derive(Debug)]
pub enum Delta<V> {
    /// The complete current list of one scope (a namespace, or all when
    /// `None`), from a watch's first list or relist: entries of that scope
    /// not in it are gone.
    Listed(Option<String>, Vec<(SliceKey, ServiceKey, V)>),
    /// One object added or changed.
    Applied(SliceKey, ServiceKey, V),
    /// One object removed (or no longer relevant).
    Deleted(SliceKey),
}

/// Which kind of object changed.
#[derive(Debug)]
pub enum Change {
    /// ServiceExports.
    Exports(Delta<ExportInfo>),
    /// Services.
    Services(Delta<ServiceInfo>),
    /// A Service's own EndpointSlices.
    Slices(Delta<Arc<EndpointSlice>>),
}

/// A change from member number `member`.
#[derive(Debug)]
pub struct MemberEvent {
    /// Index into the member list.
    pub member: usize,
    /// What changed.
    pub change: Change,
}

/// Objects of one kind, by object and by service.
#[derive(Debug)]
struct Index<V> {
    objects: HashMap<SliceKey, (ServiceKey, V)>,
    by_service: HashMap<ServiceKey, BTreeSet<SliceKey>>,
    /// Scopes listed at least once.
    listed: BTreeSet<Option<String>>,
}

impl<V> Default for Index<V> {
    fn default() -> Self {
        Self { objects: HashMap::new(), by_service: HashMap::new(), listed: BTreeSet::new() }
    }
}

impl<V: PartialEq> Index<V> {
    fn apply(&mut self, delta: Delta<V>, dirty: &mut BTreeSet<ServiceKey>) {
        match delta {
            Delta::Applied(id, key, v) => self.upsert(id, key, v, dirty),
            Delta::Deleted(id) => self.remove(&id, dirty),
            Delta::Listed(scope, items) => {
                let in_scope = |id: &SliceKey| scope.as_ref().is_none_or(|ns| *ns == id.namespace);
                let mut gone: BTreeSet<SliceKey> =
                    self.objects.keys().filter(|id| in_scope(id)).cloned().collect();
                for (id, key, v) in items {
                    gone.remove(&id);
                    self.upsert(id, key, v, dirty);
                }
                for id in gone {
                    self.remove(&id, dirty);
                }
                self.listed.insert(scope);
            }
        }
    }

    fn upsert(&mut self, id: SliceKey, key: ServiceKey, v: V, dirty: &mut BTreeSet<ServiceKey>) {
        if let Some((old_key, old)) = self.objects.get(&id) {
            if *old_key == key && *old == v {
                return;
            }
            if *old_key != key {
                self.remove(&id, dirty);
            }
        }
        self.by_service.entry(key.clone()).or_default().insert(id.clone());
        dirty.insert(key.clone());
        self.objects.insert(id, (key, v));
    }

    fn remove(&mut self, id: &SliceKey, dirty: &mut BTreeSet<ServiceKey>) {
        let Some((key, _)) = self.objects.remove(id) else { return };
        if let Some(ids) = self.by_service.get_mut(&key) {
            ids.remove(id);
            if ids.is_empty() {
                self.by_service.remove(&key);
            }
        }
        dirty.insert(key);
    }

    fn of<'a>(&'a self, key: &ServiceKey) -> impl Iterator<Item = &'a V> + 'a {
        let ids = self.by_service.get(key);
        ids.into_iter().flatten().filter_map(|id| self.objects.get(id).map(|(_, v)| v))
    }
}

/// One member's objects (the connected member is `fleet::member::Member`).
#[derive(Debug)]
pub struct MemberObjects {
    /// Its cluster id.
    pub cluster: ClusterId,
    /// Scopes (namespaces, or one for all) each kind is watched in.
    scopes: usize,
    exports: Index<ExportInfo>,
    services: Index<ServiceInfo>,
    slices: Index<Arc<EndpointSlice>>,
}

impl MemberObjects {
    /// True once every kind has been listed in every scope.
    pub fn synced(&self) -> bool {
        [self.exports.listed.len(), self.services.listed.len(), self.slices.listed.len()]
            .iter()
            .all(|n| *n >= self.scopes)
    }
}

/// Every member's objects.
#[derive(Debug)]
pub struct FleetState {
    members: Vec<MemberObjects>,
    /// The names of the services some member exports, by namespace.
    exported: HashMap<String, BTreeSet<String>>,
}

impl FleetState {
    /// An empty state for these members (index = member number), each
    /// watched in `scopes` scopes.
    pub fn new(clusters: Vec<ClusterId>, scopes: usize) -> Self {
        let members = clusters
            .into_iter()
            .map(|cluster| MemberObjects {
                cluster,
                scopes: scopes.max(1),
                exports: Index::default(),
                services: Index::default(),
                slices: Index::default(),
            })
            .collect();
        Self { members, exported: HashMap::new() }
    }

    /// Adds a member (the next index), watched in `scopes` scopes: for a
    /// fleet whose members are learnt as they appear (a hub's namespaces).
    pub fn add_member(&mut self, cluster: ClusterId, scopes: usize) -> usize {
        self.members.push(MemberObjects {
            cluster,
            scopes: scopes.max(1),
            exports: Index::default(),
            services: Index::default(),
            slices: Index::default(),
        });
        self.members.len() - 1
    }

    /// The members.
    pub fn members(&self) -> &[MemberObjects] {
        &self.members
    }

    /// True once every member has listed everything.
    pub fn synced(&self) -> bool {
        self.members.iter().all(MemberObjects::synced)
    }

    /// True once every member not `ignored` has listed everything.
    pub fn synced_except(&self, ignored: &[bool]) -> bool {
        self.members.iter().enumerate().all(|(i, m)| ignored.get(i).copied().unwrap_or(false) || m.synced())
    }

    /// Applies an event; returns the services it touched.
    pub fn apply(&mut self, event: MemberEvent, dirty: &mut BTreeSet<ServiceKey>) {
        let Some(m) = self.members.get_mut(event.member) else { return };
        match event.change {
            Change::Exports(d) => {
                let mut touched = BTreeSet::new();
                m.exports.apply(d, &mut touched);
                // The index by name follows, for the services this event
                // touched only: its cost does not grow with the fleet.
                for key in &touched {
                    let exported = self.members.iter().any(|m| m.exports.by_service.contains_key(key));
                    let names = self.exported.entry(key.namespace.to_string()).or_default();
                    if exported {
                        names.insert(key.name.to_string());
                    } else {
                        names.remove(key.name.as_str());
                    }
                }
                dirty.extend(touched);
            }
            Change::Services(d) => m.services.apply(d, dirty),
            Change::Slices(d) => m.slices.apply(d, dirty),
        }
    }

    /// The services of `namespace` some member exports whose names start
    /// with `prefix`, in name order: found by range, not by a walk of the
    /// fleet.
    pub fn exported_starting_with<'a>(
        &'a self,
        namespace: &str,
        prefix: &'a str,
    ) -> impl Iterator<Item = ServiceKey> + 'a {
        let names = self.exported.get(namespace);
        let namespace = crate::model::DnsLabel::parse(namespace).ok();
        names
            .into_iter()
            .flat_map(move |n| {
                n.range::<str, _>((std::ops::Bound::Included(prefix), std::ops::Bound::Unbounded))
            })
            .take_while(move |n| n.starts_with(prefix))
            .filter_map(move |n| {
                Some(ServiceKey {
                    namespace: namespace.clone()?,
                    name: crate::model::DnsLabel::parse(n).ok()?,
                })
            })
    }

    /// Every member's export of `key`, with what stands behind it.
    pub fn exports(&self, key: &ServiceKey) -> Vec<ClusterExport> {
        self.members
            .iter()
            .filter_map(|m| {
                let export = m.exports.of(key).next()?;
                let service = m.services.of(key).next().map_or(Exported::NoService, |s| s.exported.clone());
                Some(ClusterExport {
                    cluster: m.cluster.clone(),
                    exported_at: export.exported_at,
                    service,
                    annotations: export.annotations.clone(),
                    metadata: export.metadata.clone(),
                })
            })
            .collect()
    }

    /// Member `member`'s ServiceExport of `key`, if any.
    pub fn export_of(&self, member: usize, key: &ServiceKey) -> Option<ExportInfo> {
        self.members.get(member)?.exports.of(key).next().cloned()
    }

    /// Member `member`'s Service `key`, if any.
    pub fn service_of(&self, member: usize, key: &ServiceKey) -> Option<&ServiceInfo> {
        self.members.get(member)?.services.of(key).next()
    }

    /// Every service some member has a Service, ServiceExport or slice of.
    pub fn keys(&self) -> BTreeSet<ServiceKey> {
        let mut keys = BTreeSet::new();
        for m in &self.members {
            keys.extend(m.exports.by_service.keys().cloned());
            keys.extend(m.services.by_service.keys().cloned());
        }
        keys
    }

    /// The creation time of the oldest export of `key` (Unix seconds), if
    /// some member exports it.
    pub fn oldest_export(&self, key: &ServiceKey) -> Option<i64> {
        self.members.iter().flat_map(|m| m.exports.of(key)).map(|e| e.exported_at).min()
    }

    /// The services member `member` exports.
    pub fn exported_by(&self, member: usize) -> Vec<ServiceKey> {
        self.members.get(member).map(|m| m.exports.by_service.keys().cloned().collect()).unwrap_or_default()
    }

    /// The Service's own EndpointSlices in `cluster`, by name.
    pub fn source_slices(
        &self,
        cluster: &ClusterId,
        key: &ServiceKey,
    ) -> BTreeMap<String, Arc<EndpointSlice>> {
        self.members
            .iter()
            .filter(|m| &m.cluster == cluster)
            .flat_map(|m| m.slices.of(key))
            .filter_map(|s| Some((s.metadata.name.clone()?, s.clone())))
            .collect()
    }

    /// The endpoints of `key` in `clusters`, as MCS endpoint sets. Slices
    /// that do not convert are skipped with a warning naming them.
    pub fn endpoint_sets(&self, key: &ServiceKey, clusters: &[ClusterId]) -> Vec<EndpointSet> {
        let mut sets = Vec::new();
        for cluster in clusters {
            for slice in self.source_slices(cluster, key).values() {
                match objects::endpoint_set(cluster, key, slice) {
                    Ok(Some(set)) => sets.push(set),
                    Ok(None) => {}
                    Err(e) => tracing::warn!("skipping object: {e}"),
                }
            }
        }
        sets
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::DnsLabel;

    fn key(name: &str) -> ServiceKey {
        ServiceKey { namespace: DnsLabel::parse("shop").unwrap(), name: DnsLabel::parse(name).unwrap() }
    }

    fn id(name: &str) -> SliceKey {
        SliceKey { namespace: "shop".into(), name: name.into() }
    }

    fn state() -> FleetState {
        FleetState::new(vec![ClusterId::parse("a").unwrap(), ClusterId::parse("b").unwrap()], 1)
    }

    fn export(member: usize, d: Delta<i64>) -> MemberEvent {
        let d = match d {
            Delta::Listed(s, v) => {
                Delta::Listed(s, v.into_iter().map(|(i, k, at)| (i, k, info(at))).collect())
            }
            Delta::Applied(i, k, at) => Delta::Applied(i, k, info(at)),
            Delta::Deleted(i) => Delta::Deleted(i),
        };
        MemberEvent { member, change: Change::Exports(d) }
    }

    fn info(exported_at: i64) -> ExportInfo {
        ExportInfo {
            exported_at,
            ours: false,
            annotations: Default::default(),
            metadata: Default::default(),
            uid: None,
        }
    }

    #[test]
    fn the_index_of_exported_names_follows_every_member_and_finds_by_prefix() {
        let mut s = state();
        let mut dirty = BTreeSet::new();
        s.apply(
            export(0, Delta::Listed(None, vec![(id("web-a"), key("web-a"), 1), (id("db"), key("db"), 2)])),
            &mut dirty,
        );
        s.apply(export(1, Delta::Applied(id("web-a"), key("web-a"), 3)), &mut dirty);
        s.apply(export(1, Delta::Applied(id("web-b"), key("web-b"), 4)), &mut dirty);
        let found = |s: &FleetState, p: &str| s.exported_starting_with("shop", p).collect::<Vec<_>>();
        assert_eq!(found(&s, "web"), [key("web-a"), key("web-b")]);
        assert_eq!(found(&s, "d"), [key("db")]);
        assert!(s.exported_starting_with("other", "web").next().is_none());
        // Still exported by member 1 after member 0's relist drops it.
        s.apply(export(0, Delta::Listed(None, vec![(id("db"), key("db"), 2)])), &mut dirty);
        assert_eq!(found(&s, "web"), [key("web-a"), key("web-b")]);
        s.apply(export(1, Delta::Deleted(id("web-a"))), &mut dirty);
        assert_eq!(found(&s, "web"), [key("web-b")]);
    }

    #[test]
    fn a_relist_removes_what_was_deleted_meanwhile_and_marks_only_changes() {
        let mut s = state();
        let mut dirty = BTreeSet::new();
        s.apply(
            export(0, Delta::Listed(None, vec![(id("web"), key("web"), 1), (id("db"), key("db"), 2)])),
            &mut dirty,
        );
        assert_eq!(dirty.len(), 2);
        dirty.clear();
        s.apply(export(0, Delta::Listed(None, vec![(id("web"), key("web"), 1)])), &mut dirty);
        assert_eq!(dirty.into_iter().collect::<Vec<_>>(), [key("db")]);
        assert!(s.exports(&key("db")).is_empty());
        let web = s.exports(&key("web"));
        assert_eq!(web.len(), 1);
        assert_eq!(web[0].service, Exported::NoService);
    }

    #[test]
    fn a_namespace_relist_leaves_other_namespaces_alone() {
        let mut s = FleetState::new(vec![ClusterId::parse("a").unwrap()], 2);
        let mut dirty = BTreeSet::new();
        let other = SliceKey { namespace: "other".into(), name: "x".into() };
        let other_key =
            ServiceKey { namespace: DnsLabel::parse("other").unwrap(), name: DnsLabel::parse("x").unwrap() };
        s.apply(
            export(0, Delta::Listed(Some("other".into()), vec![(other, other_key.clone(), 1)])),
            &mut dirty,
        );
        s.apply(export(0, Delta::Listed(Some("shop".into()), vec![])), &mut dirty);
        assert_eq!(s.exports(&other_key).len(), 1);
        assert!(!s.synced(), "services and slices not listed yet");
    }

    #[test]
    fn an_unchanged_object_marks_nothing() {
        let mut s = state();
        let mut dirty = BTreeSet::new();
        s.apply(export(1, Delta::Applied(id("web"), key("web"), 5)), &mut dirty);
        dirty.clear();
        s.apply(export(1, Delta::Applied(id("web"), key("web"), 5)), &mut dirty);
        assert!(dirty.is_empty());
        s.apply(export(1, Delta::Deleted(id("web"))), &mut dirty);
        assert_eq!(dirty.len(), 1);
    }

    #[test]
    fn a_slice_moving_to_another_service_dirties_both() {
        let mut s = state();
        let mut dirty = BTreeSet::new();
        let slice = Arc::new(EndpointSlice::default());
        s.apply(
            MemberEvent {
                member: 0,
                change: Change::Slices(Delta::Applied(id("x"), key("web"), slice.clone())),
            },
            &mut dirty,
        );
        dirty.clear();
        s.apply(
            MemberEvent { member: 0, change: Change::Slices(Delta::Applied(id("x"), key("db"), slice)) },
            &mut dirty,
        );
        assert_eq!(dirty.len(), 2);
        assert!(!s.synced());
    }
}
