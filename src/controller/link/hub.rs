//! Another member, as the hub shows it: its ExportRecords turned back into
//! its objects (`hub::record`, converted as the push mode's watches convert
//! them: `fleet::member::event`), its liveness from its heartbeat. The
//! controller reads it and never writes it: that member's own agent does.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;
use std::time::SystemTime;

use futures::future::BoxFuture;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::watcher;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tracing::{debug, warn};

use super::{MemberApis, MemberLink, PROBE_EVERY, undiscovered};
use crate::controller::api::{ApiError, Kind, MemberApi, SharedApi, Stored};
use crate::controller::own::OwnEvent;
use crate::fleet::member::{self, Object};
use crate::fleet::state::MemberEvent;
use crate::hub::heartbeat::LEASE;
use crate::hub::record::{self, Exported, Records};
use crate::k8s::fence::WriteFence;
use crate::k8s::watch::{Lists, Reporter, Translate, WatchHealth, WatchTask, relist, scopes};
use crate::model::ClusterId;

/// How long a member's heartbeat may stand still before it counts as not
/// answering (three of its renewals missed at the default lease duration).
pub const HEARTBEAT_STALE: Duration = Duration::from_secs(15);

/// A member of the hub other than this agent's own.
pub struct HubLink {
    name: String,
    cluster: ClusterId,
    hub: kube::Client,
    /// Its records' watch.
    records: Arc<WatchHealth>,
    /// Its heartbeat, as seen changing.
    heartbeat: Arc<WatchHealth>,
    /// Records skipped because they did not read, for `/metrics`.
    skipped: Arc<std::sync::atomic::AtomicU64>,
    /// Its heartbeat's last renewal (Unix seconds; 0: never read; -1: read,
    /// without a renewal stamp).
    renewed: Arc<AtomicI64>,
}

impl HubLink {
    /// Member `name` of the hub reached through `hub`. Its cluster id is its
    /// name: the namespace its records are in says who published them.
    pub fn new(
        name: &str,
        hub: kube::Client,
        skipped: Arc<std::sync::atomic::AtomicU64>,
    ) -> Result<Self, String> {
        let cluster = ClusterId::parse(name).map_err(|e| format!("member {name:?} on the hub: {e}"))?;
        Ok(Self {
            name: name.to_owned(),
            cluster,
            hub,
            records: Arc::new(WatchHealth::new(format!("ExportRecords of member {name} on the hub"))),
            heartbeat: Arc::new(WatchHealth::new(format!("heartbeat of member {name} on the hub"))),
            renewed: Arc::new(AtomicI64::new(0)),
            skipped,
        })
    }
}

/// What the records' watch reports.
enum RecordChange {
    Listed(Vec<DynamicObject>),
    Applied(DynamicObject),
    Deleted(DynamicObject),
}

struct Keep;

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

/// A member's records turned into its objects' events, as they change.
struct Translator {
    index: usize,
    member: String,
    cluster: ClusterId,
    scopes: Vec<Option<String>>,
    records: Records,
    skipped: Arc<std::sync::atomic::AtomicU64>,
}

impl Translator {
    fn read(&self, o: &DynamicObject) -> Option<record::Read> {
        match record::read(&self.member, o) {
            Ok(r) => Some(r),
            Err(e) => {
                warn!("skipping a record: {e}");
                self.skipped.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                None
            }
        }
    }

    /// A complete list: one list per scope and kind, as a member's watches.
    fn listed(&mut self, all: Vec<DynamicObject>) -> Vec<MemberEvent> {
        self.records = all.iter().filter_map(|o| Some((o.metadata.name.clone()?, self.read(o)?))).collect();
        let exported = record::exports(&self.records);
        self.scopes
            .iter()
            .flat_map(|scope| {
                let of = |ns: &str| scope.as_deref().is_none_or(|s| s == ns);
                let mut exports = Vec::new();
                let mut services = Vec::new();
                let mut slices = Vec::new();
                for ((ns, _), e) in exported.iter().filter(|((ns, _), _)| of(ns)) {
                    let _ = ns;
                    exports.extend(e.export.clone());
                    services.extend(e.service.clone());
                    slices.extend(e.slices.iter().cloned());
                }
                member::listed_in(self.index, &self.cluster, scope.clone(), (&exports, &services, &slices))
            })
            .collect()
    }

    /// One record changed: the events that bring its service's objects to
    /// what its records say now.
    fn changed(&mut self, o: &DynamicObject, deleted: bool) -> Vec<MemberEvent> {
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
            match self.read(o) {
                Some(r) => {
                    self.records.insert(name, r);
                }
                None => {
                    self.records.remove(&name);
                }
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
        let named = |e: &Exported| -> BTreeMap<String, k8s_openapi::api::discovery::v1::EndpointSlice> {
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

/// How long a heartbeat has stood still, counting only the time it could
/// be read.
#[derive(Debug, Default)]
struct Stillness {
    /// The version last read, and since when it stands (pushed forward by
    /// the time the hub did not answer).
    last: Option<(String, Instant)>,
    /// Since when the hub has not answered.
    blind_since: Option<Instant>,
}

impl Stillness {
    /// The hub did not answer at `now`.
    fn blind(&mut self, now: Instant) {
        self.blind_since.get_or_insert(now);
    }

    /// `version` read at `now`: how long it has stood still, as seen; on
    /// the first read, `first_estimate`.
    fn seen(&mut self, version: String, now: Instant, first_estimate: Duration) -> Duration {
        let blind = self.blind_since.take().map(|b| now.saturating_duration_since(b));
        match &mut self.last {
            Some((old, at)) if *old == version => {
                if let Some(b) = blind {
                    *at += b;
                }
                now.saturating_duration_since(*at)
            }
            None => {
                let since = now.checked_sub(first_estimate).unwrap_or(now);
                self.last = Some((version, since));
                now.saturating_duration_since(since)
            }
            Some(_) => {
                self.last = Some((version, now));
                Duration::ZERO
            }
        }
    }
}

impl MemberLink for HubLink {
    fn name(&self) -> &str {
        &self.name
    }

    fn cluster(&self) -> &ClusterId {
        &self.cluster
    }

    /// Its heartbeat's alone: the hub not answering (its records' watch
    /// failing) says nothing of the member, whose endpoints are then kept
    /// as last seen without calling it unreachable; that watch's health is
    /// exported on its own.
    fn stale_seconds(&self) -> f64 {
        self.heartbeat.stale_seconds()
    }

    fn gone_seconds(&self) -> f64 {
        self.heartbeat.stale_seconds()
    }

    fn known(&self) -> bool {
        self.renewed.load(Ordering::Relaxed) != 0
    }

    /// Its last renewal plus [`HEARTBEAT_STALE`]: every agent reading the
    /// same heartbeat says the same, so a restarted agent rewrites nothing.
    fn unreachable_since(&self) -> Option<String> {
        let renewed = self.renewed.load(Ordering::Relaxed);
        let stale =
            k8s_openapi::jiff::Timestamp::from_second(renewed + HEARTBEAT_STALE.as_secs() as i64).ok()?;
        (renewed > 0).then(|| crate::controller::desired::rfc3339(stale))
    }

    fn remote(&self) -> bool {
        true
    }

    fn watches(
        &self,
        index: usize,
        namespaces: &[String],
        events: mpsc::Sender<MemberEvent>,
    ) -> Vec<WatchTask> {
        let (hub, member, cluster, health) =
            (self.hub.clone(), self.name.clone(), self.cluster.clone(), self.records.clone());
        let (scopes, skipped) = (scopes(namespaces), self.skipped.clone());
        vec![WatchTask::new(health.clone(), move || {
            let mut t = Translator {
                index,
                member: member.clone(),
                cluster: cluster.clone(),
                scopes: scopes.clone(),
                records: Records::new(),
                skipped: skipped.clone(),
            };
            let (hub, health, events) = (hub.clone(), health.clone(), events.clone());
            async move {
                let (tx, mut rx) = mpsc::channel(256);
                let api: Api<DynamicObject> =
                    Api::namespaced_with(hub, &record::namespace_of(&t.member), &record::resource());
                let lists = Lists::default();
                let watching =
                    relist(api, watcher::Config::default(), &lists, Reporter::new(health), Keep, tx);
                let translating = async {
                    while let Some(seen) = rx.recv().await {
                        let out = match seen {
                            RecordChange::Listed(all) => t.listed(all),
                            RecordChange::Applied(o) => t.changed(&o, false),
                            RecordChange::Deleted(o) => t.changed(&o, true),
                        };
                        for e in out {
                            if events.send(e).await.is_err() {
                                return;
                            }
                        }
                    }
                };
                tokio::join!(watching, translating);
            }
        })]
    }

    fn own_watches(&self, _: usize, _: &[String], _: mpsc::Sender<OwnEvent>) -> Vec<WatchTask> {
        Vec::new()
    }

    fn import_watches(
        &self,
        _: usize,
        _: &ApiResource,
        _: &[String],
        _: mpsc::Sender<OwnEvent>,
    ) -> Vec<WatchTask> {
        Vec::new()
    }

    /// Its heartbeat, read every second: failing once it has stood still
    /// for [`HEARTBEAT_STALE`] of the time the hub answered. While the hub
    /// does not answer nothing is learnt of the member: its state stands,
    /// and that time is not counted as the heartbeat standing still (so a
    /// frozen hub marks no member unreachable, nor brings back one that was).
    fn probe(&self) -> WatchTask {
        let (hub, ns, health) = (self.hub.clone(), record::namespace_of(&self.name), self.heartbeat.clone());
        let (member, renewed) = (self.name.clone(), self.renewed.clone());
        WatchTask::new(health.clone(), move || {
            let api: Api<Lease> = Api::namespaced(hub.clone(), &ns);
            let mut reporter = Reporter::new(health.clone());
            let (member, renewed) = (member.clone(), renewed.clone());
            async move {
                let mut still = Stillness::default();
                loop {
                    let read = match tokio::time::timeout(Duration::from_secs(2), api.get_opt(LEASE)).await {
                        Ok(Ok(Some(l))) => {
                            let at = l.spec.and_then(|s| s.renew_time).map(|t| t.0.as_second()).unwrap_or(-1);
                            // -1: read, with no renewal stamp (a 0 would be "never read").
                            renewed.store(if at == 0 { -1 } else { at }, Ordering::Relaxed);
                            Some(Some(l.metadata.resource_version.unwrap_or_default()))
                        }
                        Ok(Ok(None)) => Some(None),
                        Ok(Err(e)) => {
                            debug!(%member, error = %e, "heartbeat not read: the hub did not answer");
                            None
                        }
                        Err(_) => {
                            debug!(%member, "heartbeat not read: the hub did not answer within 2 s");
                            None
                        }
                    };
                    match read {
                        None => still.blind(Instant::now()),
                        Some(None) => {
                            renewed.store(-1, Ordering::Relaxed);
                            reporter.failed("no heartbeat")
                        }
                        Some(Some(version)) => {
                            // First read: how long ago it was renewed, by its
                            // stamp (another cluster's clock: a first
                            // estimate only); then only what is seen change.
                            let renewal = match renewed.load(Ordering::Relaxed) {
                                s if s > 0 => SystemTime::UNIX_EPOCH + Duration::from_secs(s as u64),
                                _ => SystemTime::now(),
                            };
                            let ago = SystemTime::now().duration_since(renewal).unwrap_or_default();
                            let still_for = still.seen(version, Instant::now(), ago);
                            if still_for < HEARTBEAT_STALE {
                                reporter.ok();
                            } else {
                                reporter.failed_since(
                                    &format!("heartbeat unchanged for {:.0} s", still_for.as_secs_f64()),
                                    renewal + HEARTBEAT_STALE,
                                );
                            }
                        }
                    }
                    tokio::time::sleep(PROBE_EVERY).await;
                }
            }
        })
    }

    fn discover(&self) -> BoxFuture<'static, Result<MemberApis, String>> {
        // Never written: its versions do not matter.
        Box::pin(async { Ok(undiscovered()) })
    }

    fn api(&self, _: &MemberApis, _: watch::Receiver<bool>, _: Option<prometheus::Histogram>) -> SharedApi {
        Arc::new(NotOurs(self.name.clone()))
    }
}

/// The write API of a member this agent does not write.
struct NotOurs(String);

impl MemberApi for NotOurs {
    fn apply<'a>(
        &'a self,
        _: &'a WriteFence,
        kind: Kind,
        _: &'a str,
        _: &'a str,
        _: &'a serde_json::Value,
    ) -> BoxFuture<'a, Result<Stored, ApiError>> {
        Box::pin(async move { Err(not_ours(&self.0, kind)) })
    }

    fn delete<'a>(
        &'a self,
        _: &'a WriteFence,
        kind: Kind,
        _: &'a str,
        _: &'a str,
    ) -> BoxFuture<'a, Result<(), ApiError>> {
        Box::pin(async move { Err(not_ours(&self.0, kind)) })
    }

    fn list<'a>(
        &'a self,
        _: Kind,
        _: Option<&'a str>,
        _: &'a str,
    ) -> BoxFuture<'a, Result<Vec<serde_json::Value>, ApiError>> {
        Box::pin(async { Ok(Vec::new()) })
    }
}

fn not_ours(member: &str, kind: Kind) -> ApiError {
    ApiError::Kube(kube::Error::Service(
        format!("{kind} of member {member}: written by its own agent, not this one").into(),
    ))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;
    use crate::fleet::state::{Change, Delta, FleetState};

    #[test]
    fn a_heartbeat_stands_still_only_for_the_time_it_could_be_read() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut still = Stillness::default();
        assert_eq!(still.seen("1".into(), at(0), Duration::ZERO), Duration::ZERO);
        assert_eq!(still.seen("1".into(), at(4), Duration::ZERO), Duration::from_secs(4));
        // The hub silent from 5 s to 65 s: a minute unseen is not a minute still.
        still.blind(at(5));
        still.blind(at(30));
        assert_eq!(still.seen("1".into(), at(65), Duration::ZERO), Duration::from_secs(5));
        // A member that had stopped before the hub went silent stays stopped.
        assert_eq!(still.seen("1".into(), at(80), Duration::ZERO), Duration::from_secs(20));
        still.blind(at(81));
        assert_eq!(still.seen("1".into(), at(200), Duration::ZERO), Duration::from_secs(21));
        // A renewal starts it again.
        assert_eq!(still.seen("2".into(), at(201), Duration::ZERO), Duration::ZERO);
        // Read first long after its last renewal: stale from the start.
        let mut late = Stillness::default();
        assert_eq!(late.seen("7".into(), at(100), Duration::from_secs(40)), Duration::from_secs(40));
        assert_eq!(late.seen("7".into(), at(101), Duration::ZERO), Duration::from_secs(41));
    }

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

    fn translator() -> Translator {
        Translator {
            index: 1,
            member: "c2".into(),
            cluster: ClusterId::parse("c2").unwrap(),
            scopes: vec![None],
            records: Records::new(),
            skipped: Arc::new(AtomicU64::new(0)),
        }
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
        // before it goes, as a deleted object's would.
        let mut bad = record(&web("10.0.1.7"));
        bad.data["spec"]["service"]["spec"]["ports"] = serde_json::json!("eighty");
        for e in t.changed(&bad, false) {
            state.apply(e, &mut dirty);
        }
        assert_eq!(t.skipped.load(Ordering::Relaxed), 1);
        assert!(state.exports(&key).is_empty());
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
