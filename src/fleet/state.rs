//! What every member holds, indexed by service: the fleet side's only
//! mutable state. Watches feed it [`MemberEvent`]s; each event says which
//! services it touched, and consumers (centralized `serve`, `sync`) recompute
//! only those.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::export::{ClusterExport, Exported};
use super::objects;
use crate::model::{ClusterId, EndpointSet, ServiceKey, SliceKey};

/// A change to one kind of object of one member.
#[derive(Debug)]
pub enum Delta<V> {
    /// The complete current list (a watch's first list or relist): entries
    /// not in it are gone.
    Listed(Vec<(SliceKey, ServiceKey, V)>),
    /// One object added or changed.
    Applied(SliceKey, ServiceKey, V),
    /// One object removed (or no longer relevant).
    Deleted(SliceKey),
}

/// Which kind of object changed.
#[derive(Debug)]
pub enum Change {
    /// ServiceExports: their creation time.
    Exports(Delta<i64>),
    /// Services: what they offer for export.
    Services(Delta<Exported>),
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
    listed: bool,
}

impl<V> Default for Index<V> {
    fn default() -> Self {
        Self { objects: HashMap::new(), by_service: HashMap::new(), listed: false }
    }
}

impl<V: PartialEq> Index<V> {
    fn apply(&mut self, delta: Delta<V>, dirty: &mut BTreeSet<ServiceKey>) {
        match delta {
            Delta::Applied(id, key, v) => self.upsert(id, key, v, dirty),
            Delta::Deleted(id) => self.remove(&id, dirty),
            Delta::Listed(items) => {
                let mut gone: BTreeSet<SliceKey> = self.objects.keys().cloned().collect();
                for (id, key, v) in items {
                    gone.remove(&id);
                    self.upsert(id, key, v, dirty);
                }
                for id in gone {
                    self.remove(&id, dirty);
                }
                self.listed = true;
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

/// One member's objects.
#[derive(Debug)]
pub struct Member {
    /// Its cluster id.
    pub cluster: ClusterId,
    exports: Index<i64>,
    services: Index<Exported>,
    slices: Index<Arc<EndpointSlice>>,
}

impl Member {
    /// True once every kind has been listed.
    pub fn synced(&self) -> bool {
        self.exports.listed && self.services.listed && self.slices.listed
    }
}

/// Every member's objects.
#[derive(Debug)]
pub struct FleetState {
    members: Vec<Member>,
}

impl FleetState {
    /// An empty state for these members (index = member number).
    pub fn new(clusters: Vec<ClusterId>) -> Self {
        let members = clusters
            .into_iter()
            .map(|cluster| Member {
                cluster,
                exports: Index::default(),
                services: Index::default(),
                slices: Index::default(),
            })
            .collect();
        Self { members }
    }

    /// The members.
    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// True once every member has listed everything.
    pub fn synced(&self) -> bool {
        self.members.iter().all(Member::synced)
    }

    /// Applies an event; returns the services it touched.
    pub fn apply(&mut self, event: MemberEvent, dirty: &mut BTreeSet<ServiceKey>) {
        let Some(m) = self.members.get_mut(event.member) else { return };
        match event.change {
            Change::Exports(d) => m.exports.apply(d, dirty),
            Change::Services(d) => m.services.apply(d, dirty),
            Change::Slices(d) => m.slices.apply(d, dirty),
        }
    }

    /// Every member's export of `key`, with what stands behind it.
    pub fn exports(&self, key: &ServiceKey) -> Vec<ClusterExport> {
        self.members
            .iter()
            .filter_map(|m| {
                let exported_at = *m.exports.of(key).next()?;
                let service = m.services.of(key).next().cloned().unwrap_or(Exported::NoService);
                Some(ClusterExport { cluster: m.cluster.clone(), exported_at, service })
            })
            .collect()
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
        FleetState::new(vec![ClusterId::parse("a").unwrap(), ClusterId::parse("b").unwrap()])
    }

    fn export(member: usize, d: Delta<i64>) -> MemberEvent {
        MemberEvent { member, change: Change::Exports(d) }
    }

    #[test]
    fn a_relist_removes_what_was_deleted_meanwhile_and_marks_only_changes() {
        let mut s = state();
        let mut dirty = BTreeSet::new();
        s.apply(
            export(0, Delta::Listed(vec![(id("web"), key("web"), 1), (id("db"), key("db"), 2)])),
            &mut dirty,
        );
        assert_eq!(dirty.len(), 2);
        dirty.clear();
        s.apply(export(0, Delta::Listed(vec![(id("web"), key("web"), 1)])), &mut dirty);
        assert_eq!(dirty.into_iter().collect::<Vec<_>>(), [key("db")]);
        assert!(s.exports(&key("db")).is_empty());
        let web = s.exports(&key("web"));
        assert_eq!(web.len(), 1);
        assert_eq!(web[0].service, Exported::NoService);
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
