//! Following a member's ExportRecords as the member's own objects: what
//! every reader of the hub shares (an agent's link to another member,
//! centralized `serve --hub-kubeconfig`). Records are read
//! (`record::read`), joined per export (`record::exports`) and turned into
//! the events the push mode's watches send (`fleet::member::event`,
//! `fleet::member::listed_in`), so both modes fold into the same
//! `fleet::state::FleetState` by construction. A record that does not read
//! is skipped, named in the log with its member, and counted; what was read
//! of it before is kept, as the last good state (a hand edit on the hub, or
//! a newer agent's format, must not take the member's service away from
//! every cluster: a member's own API server would have refused the edit).
//! Only its deletion, or a record that reads, replaces it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::DynamicObject;
use tracing::warn;

use super::record::{self, Exported, Records};
use crate::fleet::member::{self, Object};
use crate::fleet::state::MemberEvent;
use crate::k8s::watch::Translate;
use crate::model::ClusterId;

/// What a watch of records reports.
pub enum RecordChange {
    /// A complete list.
    Listed(Vec<DynamicObject>),
    /// A record added or changed.
    Applied(DynamicObject),
    /// A record deleted.
    Deleted(DynamicObject),
}

/// Keeps the records as they are, for [`MemberRecords`] to read.
pub struct Keep;

impl Translate<DynamicObject> for Keep {
    type Item = DynamicObject;
    type Message = RecordChange;

    fn item(&self, o: &DynamicObject) -> Option<DynamicObject> {
        Some(o.clone())
    }

    fn listed(&self, items: Vec<DynamicObject>, _: std::time::Instant) -> RecordChange {
        RecordChange::Listed(items)
    }

    fn applied(&self, o: &DynamicObject) -> Option<RecordChange> {
        Some(RecordChange::Applied(o.clone()))
    }

    fn deleted(&self, o: &DynamicObject) -> Option<RecordChange> {
        Some(RecordChange::Deleted(o.clone()))
    }
}

/// One member's records, turned into its objects' events as they change.
pub struct MemberRecords {
    index: usize,
    member: String,
    cluster: ClusterId,
    scopes: Vec<Option<String>>,
    records: Records,
    skipped: Arc<AtomicU64>,
}

impl MemberRecords {
    /// Member `member` (cluster id `cluster`), sending as member `index`
    /// of a fleet watched in `scopes` (see `k8s::watch::scopes`); records
    /// that do not read are counted in `skipped`.
    pub fn new(
        index: usize,
        member: &str,
        cluster: ClusterId,
        scopes: Vec<Option<String>>,
        skipped: Arc<AtomicU64>,
    ) -> Self {
        Self { index, member: member.to_owned(), cluster, scopes, records: Records::new(), skipped }
    }

    /// The member's name.
    pub fn member(&self) -> &str {
        &self.member
    }

    /// Records read now (base records and continuations).
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// True while no record of the member is held.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    fn read(&self, o: &DynamicObject) -> Option<record::Read> {
        match record::read(&self.member, o) {
            Ok(r) => Some(r),
            Err(e) => {
                warn!("skipping a record: {e}");
                self.skipped.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// A complete list: one list per scope and kind, as a member's watches.
    pub fn listed(&mut self, all: Vec<DynamicObject>) -> Vec<MemberEvent> {
        let before = std::mem::take(&mut self.records);
        self.records = all
            .iter()
            .filter_map(|o| {
                let name = o.metadata.name.clone()?;
                let read = self.read(o).or_else(|| before.get(&name).cloned())?;
                Some((name, read))
            })
            .collect();
        let exported = record::exports(&self.records);
        self.scopes
            .iter()
            .flat_map(|scope| {
                let of = |ns: &str| scope.as_deref().is_none_or(|s| s == ns);
                let mut exports = Vec::new();
                let mut services = Vec::new();
                let mut slices = Vec::new();
                for (_, e) in exported.iter().filter(|((ns, _), _)| of(ns)) {
                    exports.extend(e.export.clone());
                    services.extend(e.service.clone());
                    slices.extend(e.slices.iter().cloned());
                }
                member::listed_in(self.index, &self.cluster, scope.clone(), (&exports, &services, &slices))
            })
            .collect()
    }

    /// One record changed (`deleted`: gone): the events that bring its
    /// service's objects to what its records say now.
    pub fn changed(&mut self, o: &DynamicObject, deleted: bool) -> Vec<MemberEvent> {
        let Some(name) = o.metadata.name.clone() else { return Vec::new() };
        let Some((ns, svc, _)) = record::parse_name(&name).map(|(a, b, c)| (a.to_owned(), b.to_owned(), c))
        else {
            return Vec::new();
        };
        let key = (ns, svc);
        let before = record::exports(&self.records).remove(&key).unwrap_or_default();
        if deleted {
            self.records.remove(&name);
        } else {
            // One that does not read keeps what was read before.
            if let Some(r) = self.read(o) {
                self.records.insert(name, r);
            }
        }
        let after = record::exports(&self.records).remove(&key).unwrap_or_default();
        self.diff(&before, &after)
    }

    fn diff(&self, before: &Exported, after: &Exported) -> Vec<MemberEvent> {
        let (i, c) = (self.index, &self.cluster);
        let mut out = Vec::new();
        match (&before.export, &after.export) {
            (_, Some(e)) if before.export.as_ref() != Some(e) => {
                out.extend(member::event(i, c, Object::Export(e), false))
            }
            (Some(e), None) => out.extend(member::event(i, c, Object::Export(e), true)),
            _ => {}
        }
        match (&before.service, &after.service) {
            (_, Some(s)) if before.service.as_ref() != Some(s) => {
                out.extend(member::event(i, c, Object::Service(s), false))
            }
            (Some(s), None) => out.extend(member::event(i, c, Object::Service(s), true)),
            _ => {}
        }
        let named = |e: &Exported| -> BTreeMap<String, EndpointSlice> {
            e.slices.iter().filter_map(|s| Some((s.metadata.name.clone()?, s.clone()))).collect()
        };
        let (old, new) = (named(before), named(after));
        for (n, s) in &new {
            if old.get(n) != Some(s) {
                out.extend(member::event(i, c, Object::Slice(s), false));
            }
        }
        for (n, s) in &old {
            if !new.contains_key(n) {
                out.extend(member::event(i, c, Object::Slice(s), true));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;
    use crate::fleet::state::{Change, Delta, FleetState};

    fn web(address: &str) -> Exported {
        let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/sync/web.yaml"))
            .unwrap();
        let mut e = Exported::default();
        for doc in serde_yaml_ng::Deserializer::from_str(&text) {
            let mut v: serde_json::Value = serde::Deserialize::deserialize(doc).unwrap();
            match v["kind"].as_str().unwrap() {
                "Service" => e.service = Some(serde_json::from_value(v).unwrap()),
                "ServiceExport" => e.export = Some(serde_json::from_value(v).unwrap()),
                _ => {
                    v["endpoints"][0]["addresses"][0] = serde_json::json!(address);
                    e.slices.push(serde_json::from_value(v).unwrap());
                }
            }
        }
        e
    }

    fn record(e: &Exported) -> DynamicObject {
        serde_json::from_value(record::records("clusterset-member-c2", "shop", "web", e).remove(0)).unwrap()
    }

    fn translator() -> MemberRecords {
        MemberRecords::new(1, "c2", ClusterId::parse("c2").unwrap(), vec![None], Arc::new(AtomicU64::new(0)))
    }

    /// The events a member's records give fold into the fleet's state just
    /// as its own watches' would.
    #[test]
    fn records_become_the_members_objects_and_follow_each_change() {
        let mut t = translator();
        let mut state =
            FleetState::new(vec![ClusterId::parse("c1").unwrap(), ClusterId::parse("c2").unwrap()], 1);
        let key = crate::model::ServiceKey {
            namespace: crate::model::DnsLabel::parse("shop").unwrap(),
            name: crate::model::DnsLabel::parse("web").unwrap(),
        };
        let mut dirty = std::collections::BTreeSet::new();
        for e in t.listed(vec![record(&web("10.0.1.5"))]) {
            state.apply(e, &mut dirty);
        }
        assert!(state.members()[1].synced(), "listed as a member's watches list");
        let addresses = |state: &FleetState| {
            state
                .source_slices(&ClusterId::parse("c2").unwrap(), &key)
                .values()
                .flat_map(|s| s.endpoints.iter().flat_map(|e| e.addresses.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(state.exports(&key).len(), 1);
        assert_eq!(addresses(&state), ["10.0.1.5"]);
        // An endpoint changes: one slice event, nothing else.
        let events = t.changed(&record(&web("10.0.1.6")), false);
        assert_eq!(events.len(), 1);
        assert!(matches!(events[0].change, Change::Slices(Delta::Applied(..))));
        for e in events {
            state.apply(e, &mut dirty);
        }
        assert_eq!(addresses(&state), ["10.0.1.6"]);
        // A record that does not read is skipped and counted; what was read
        // before it is kept, in a change and in a list.
        let mut bad = record(&web("10.0.1.7"));
        bad.data["spec"]["service"]["spec"]["ports"] = serde_json::json!("eighty");
        assert!(t.changed(&bad, false).is_empty(), "the last good record changed");
        assert_eq!(t.skipped.load(Ordering::Relaxed), 1);
        for e in t.listed(vec![bad.clone()]) {
            state.apply(e, &mut dirty);
        }
        assert_eq!(t.skipped.load(Ordering::Relaxed), 2);
        assert_eq!(state.exports(&key).len(), 1);
        assert_eq!(addresses(&state), ["10.0.1.6"]);
        // Deleted: the export goes.
        for e in t
            .changed(&record(&web("10.0.1.6")), false)
            .into_iter()
            .chain(t.changed(&record(&web("10.0.1.6")), true))
        {
            state.apply(e, &mut dirty);
        }
        assert!(state.exports(&key).is_empty() && addresses(&state).is_empty());
    }
}
