//! Centralized mode from a hub (`serve --hub-kubeconfig`): one watch of
//! every member's ExportRecords on the hub instead of three per member,
//! read back as the members' own objects (`hub::follow`) and answered as
//! `centralized` answers the same fleet watched member by member: the same
//! state (`fleet::state::FleetState`), the same KEP-1645 merge (oldest
//! export wins) and the same objects per service, so per asking cluster
//! too (consumer-clusters).
//!
//! **Who published.** A record's namespace says it
//! (`clusterset-member-<member>`, `hub::record::member_of`), never its
//! content; the member's name is its cluster id, as for the agents. A
//! member joins when its first record is seen. A record outside a member
//! namespace, of a member whose name is not a cluster id, or that does not
//! read, is skipped, named in the log with its member, and counted.
//!
//! **Liveness.** A member's heartbeat Lease (`hub::heartbeat`) standing
//! still for `--cluster-dead-after` of the time the hub answered is what a
//! member's API not answering is in push mode: its endpoints are demoted
//! in every answer, kept, until its heartbeat moves again. A frozen hub
//! changes nothing: the watch hears nothing, so what was read is answered
//! as it is, and the time the heartbeats could not be read is not counted
//! as standing still (`heartbeat::Stillness`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, DynamicObject, ListParams};
use kube::runtime::watcher;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::MembersAlive;
use super::centralized::{To, service_objects};
use crate::fleet::state::{FleetState, MemberEvent};
use crate::hub::follow::{Keep, MemberRecords, RecordChange};
use crate::hub::heartbeat::{self, Stillness};
use crate::hub::record;
use crate::k8s::watch::{Lists, Reporter, WatchHealth, relist};
use crate::model::{ClusterId, ServiceKey};
use crate::store::{Object, ObjectId, SourceId, Update};

/// Follows the hub's records and sends the merged fleet to the store as
/// `to.source`: a complete state first (`Update::Replace`), then each
/// service a change touched. When the store asks (`to.relists`), the hub
/// is listed again and replaces what was sent. Ends only when the store's
/// queue is gone.
pub async fn run(hub: kube::Client, lists: Lists, to: To, health: Arc<WatchHealth>, skipped: Arc<AtomicU64>) {
    while listing(&hub, &lists, &to, &health, &skipped).await {
        info!("listing the hub's records again, as the store asked");
    }
}

/// One watch of every record until the store asks for the fleet again
/// (`true`) or its queue is gone (`false`).
async fn listing(
    hub: &kube::Client,
    lists: &Lists,
    to: &To,
    health: &Arc<WatchHealth>,
    skipped: &Arc<AtomicU64>,
) -> bool {
    let source = to.source;
    // This listing answers every ask made before it.
    to.relists.take(|s| s == source);
    let mut asked = std::pin::pin!(to.relists.asked(|s| s == source));
    let (tx, mut rx) = mpsc::channel(256);
    // Cluster-wide: one list and one watch for the whole fleet. Every
    // record carries the service label; the selector leaves out anything
    // else of that kind.
    let api: Api<DynamicObject> = Api::all_with(hub.clone(), &record::resource());
    let config = watcher::Config::default().labels(record::LABEL_SERVICE);
    let mut watching = std::pin::pin!(relist(api, config, lists, Reporter::new(health.clone()), Keep, tx));
    let mut fleet = HubFleet::new(source, skipped.clone());
    loop {
        let seen = tokio::select! {
            () = &mut watching => return false,
            seen = rx.recv() => match seen {
                Some(seen) => seen,
                None => return false,
            },
            _ = &mut asked => return true,
        };
        for update in fleet.seen(seen) {
            if to.updates.send(update).await.is_err() {
                return false;
            }
        }
    }
}

/// The fleet as the hub's records say it.
struct HubFleet {
    source: SourceId,
    /// Per member (by index in `state`), its records.
    members: Vec<MemberRecords>,
    /// Member name → index.
    index: HashMap<String, usize>,
    state: FleetState,
    /// The objects sent per service, to remove what a change takes away.
    sent: HashMap<ServiceKey, BTreeSet<ObjectId>>,
    /// True once the first complete list was sent.
    listed: bool,
    skipped: Arc<AtomicU64>,
}

impl HubFleet {
    fn new(source: SourceId, skipped: Arc<AtomicU64>) -> Self {
        Self {
            source,
            members: Vec::new(),
            index: HashMap::new(),
            state: FleetState::new(Vec::new(), 1),
            sent: HashMap::new(),
            listed: false,
            skipped,
        }
    }

    /// What the watch saw, as the store's updates.
    fn seen(&mut self, seen: RecordChange) -> Vec<Update> {
        let mut events = Vec::new();
        match seen {
            RecordChange::Listed(all) => {
                let mut by_member: BTreeMap<usize, Vec<DynamicObject>> = BTreeMap::new();
                for o in all {
                    if let Some(i) = self.member_of(&o) {
                        by_member.entry(i).or_default().push(o);
                    }
                }
                // Every member known: one whose records are all gone lists empty.
                for (i, m) in self.members.iter_mut().enumerate() {
                    events.extend(m.listed(by_member.remove(&i).unwrap_or_default()));
                }
            }
            RecordChange::Applied(o) => events = self.changed(&o, false),
            RecordChange::Deleted(o) => events = self.changed(&o, true),
        }
        self.apply(events)
    }

    /// One record changed (`deleted`: gone): its member's events.
    fn changed(&mut self, o: &DynamicObject, deleted: bool) -> Vec<MemberEvent> {
        let Some(i) = self.member_of(o) else { return Vec::new() };
        self.members.get_mut(i).map(|m| m.changed(o, deleted)).unwrap_or_default()
    }

    /// The index of the member whose namespace holds `o`, added when new;
    /// `None` (skipped, named, counted) when no member's namespace does.
    fn member_of(&mut self, o: &DynamicObject) -> Option<usize> {
        let namespace = o.metadata.namespace.as_deref().unwrap_or_default();
        let skip = |why: String| {
            let name = o.metadata.name.as_deref().unwrap_or_default();
            warn!("skipping ExportRecord {namespace}/{name}: {why}");
            self.skipped.fetch_add(1, Ordering::Relaxed);
            None
        };
        let Some(member) = record::member_of(namespace) else {
            return skip(format!("not in a member's namespace ({}<member>)", record::NAMESPACE_PREFIX));
        };
        if let Some(i) = self.index.get(member) {
            return Some(*i);
        }
        let cluster = match ClusterId::parse(member) {
            Ok(c) => c,
            Err(e) => return skip(format!("member {member:?}: its name is not a cluster id: {e}")),
        };
        info!(%member, "a member on the hub");
        let i = self.state.add_member(cluster.clone(), 1);
        self.members.push(MemberRecords::new(i, member, cluster, vec![None], self.skipped.clone()));
        self.index.insert(member.to_owned(), i);
        Some(i)
    }

    /// Folds `events` into the state: the first time, the whole fleet as one
    /// replacement; then the services they touched.
    fn apply(&mut self, events: Vec<MemberEvent>) -> Vec<Update> {
        let mut dirty = BTreeSet::new();
        for e in events {
            self.state.apply(e, &mut dirty);
        }
        let source = self.source;
        if !self.listed {
            self.listed = true;
            let mut objects = Vec::new();
            for key in dirty {
                let objs = service_objects(&self.state, &key);
                if !objs.is_empty() {
                    self.sent.insert(key, objs.iter().map(Object::id).collect());
                }
                objects.extend(objs);
            }
            info!(services = self.sent.len(), members = self.members.len(), "the hub's records listed");
            return vec![Update::Replace { source, objects }];
        }
        let mut out = Vec::new();
        for key in dirty {
            let objs = service_objects(&self.state, &key);
            let ids: BTreeSet<ObjectId> = objs.iter().map(Object::id).collect();
            let old = self.sent.remove(&key).unwrap_or_default();
            out.extend(old.difference(&ids).map(|id| Update::Remove { source, id: id.clone() }));
            out.extend(objs.into_iter().map(|object| Update::Upsert { source, object }));
            if !ids.is_empty() {
                self.sent.insert(key, ids);
            }
        }
        out
    }
}

/// How often the heartbeats are read: one list of every member's Lease.
const LIVENESS_TICK: Duration = Duration::from_secs(1);
/// Longest wait for the hub to answer that list.
const LIVENESS_LIST_TIMEOUT: Duration = Duration::from_secs(2);

/// Every member's liveness by its heartbeat, shared with `/metrics`.
#[derive(Debug, Default)]
pub struct Liveness {
    alive: RwLock<BTreeMap<ClusterId, bool>>,
}

impl MembersAlive for Liveness {
    fn alive(&self) -> Vec<(ClusterId, bool)> {
        self.alive.read().map(|m| m.iter().map(|(c, a)| (c.clone(), *a)).collect()).unwrap_or_default()
    }
}

/// One member's heartbeat as followed.
struct Beat {
    still: Stillness,
    /// The version last read (kept when the Lease is gone: a deleted
    /// heartbeat stands still).
    version: String,
    /// How long ago it said it was renewed, when first read.
    first_ago: Duration,
    alive: bool,
}

/// Every member's heartbeat seen so far, and the verdicts they give.
#[derive(Default)]
struct Beats(BTreeMap<ClusterId, Beat>);

/// A member whose verdict changed: alive or not, and how long its
/// heartbeat had stood still.
type Verdict = (ClusterId, bool, Duration);

impl Beats {
    /// The hub did not answer at `now`: nothing is learnt, and the time is
    /// not counted as standing still.
    fn blind(&mut self, now: Instant) {
        self.0.values_mut().for_each(|b| b.still.blind(now));
    }

    /// The heartbeats read at `now` (per member: its version, and how long
    /// ago it says it was renewed): the members whose verdict changed. Not
    /// alive once still for `dead_after`; alive again once it moves.
    fn read(
        &mut self,
        read: BTreeMap<ClusterId, (String, Duration)>,
        now: Instant,
        dead_after: Duration,
    ) -> Vec<Verdict> {
        for (cluster, (version, ago)) in read {
            let beat = self.0.entry(cluster).or_insert_with(|| Beat {
                still: Stillness::default(),
                version: String::new(),
                first_ago: ago,
                alive: true,
            });
            beat.version = version;
        }
        let mut changed = Vec::new();
        for (cluster, beat) in &mut self.0 {
            let still = beat.still.seen(beat.version.clone(), now, beat.first_ago);
            let verdict = if beat.alive { still < dead_after } else { still.is_zero() };
            if verdict != beat.alive {
                beat.alive = verdict;
                changed.push((cluster.clone(), verdict, still));
            }
        }
        changed
    }
}

/// Reads every member's heartbeat every second (one list, all
/// namespaces) and tells the store: a member whose heartbeat has stood
/// still for `dead_after` is not alive (`Update::ClusterLiveness`): its
/// endpoints are demoted in every answer, never removed. It is alive again
/// once its heartbeat moves.
pub async fn liveness(
    hub: kube::Client,
    dead_after: Duration,
    state: Arc<Liveness>,
    updates: mpsc::Sender<Update>,
) {
    let api: Api<Lease> = Api::all(hub);
    let lp = ListParams::default().labels(&format!("{}=agent", heartbeat::LABEL));
    let mut beats = Beats::default();
    let mut tick = tokio::time::interval(LIVENESS_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let now = Instant::now();
        let leases = match tokio::time::timeout(LIVENESS_LIST_TIMEOUT, api.list(&lp)).await {
            Ok(Ok(list)) => list.items,
            Ok(Err(e)) => {
                debug!(error = %e, "heartbeats not read: the hub did not answer");
                beats.blind(now);
                continue;
            }
            Err(_) => {
                debug!("heartbeats not read: the hub did not answer within {LIVENESS_LIST_TIMEOUT:?}");
                beats.blind(now);
                continue;
            }
        };
        let read = leases
            .into_iter()
            .filter_map(|l| {
                let member = l.metadata.namespace.as_deref().and_then(record::member_of)?;
                let cluster = ClusterId::parse(member).ok()?;
                Some((cluster, (l.metadata.resource_version.unwrap_or_default(), renewed_ago(&l.spec))))
            })
            .collect();
        let changed = beats.read(read, now, dead_after);
        if let Ok(mut m) = state.alive.write() {
            *m = beats.0.iter().map(|(c, b)| (c.clone(), b.alive)).collect();
        }
        for (cluster, alive, still) in changed {
            if alive {
                info!(%cluster, "member's heartbeat moves again: its endpoints are answered");
            } else {
                warn!(%cluster, still_seconds = still.as_secs(),
                      "member's heartbeat stood still for {dead_after:?}: its endpoints are demoted in every answer");
            }
            if updates.send(Update::ClusterLiveness { cluster, alive }).await.is_err() {
                return;
            }
        }
    }
}

/// How long ago a heartbeat says it was renewed (the member's clock: a
/// first estimate only, for a heartbeat first read long after it stopped).
fn renewed_ago(spec: &Option<k8s_openapi::api::coordination::v1::LeaseSpec>) -> Duration {
    let Some(at) = spec.as_ref().and_then(|s| s.renew_time.as_ref()).map(|t| t.0.as_second()) else {
        return Duration::ZERO;
    };
    let renewed = SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(at).unwrap_or(0));
    SystemTime::now().duration_since(renewed).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Service;
    use serde_json::{Value, json};

    use super::*;
    use crate::fleet::member;
    use crate::hub::record::Exported;

    /// shop/web as `tests/data/sync/web.yaml` has it, its ClusterIP and
    /// endpoint `ip`, exported at `exported`.
    fn web(ip: &str, exported: &str) -> Exported {
        let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/sync/web.yaml"))
            .unwrap();
        let mut e = Exported::default();
        for doc in serde_yaml_ng::Deserializer::from_str(&text) {
            let mut v: Value = serde::Deserialize::deserialize(doc).unwrap();
            match v["kind"].as_str().unwrap() {
                "Service" => {
                    v["spec"]["clusterIP"] = json!(ip);
                    v["spec"]["clusterIPs"] = json!([ip]);
                    e.service = Some(serde_json::from_value::<Service>(v).unwrap());
                }
                "ServiceExport" => {
                    v["metadata"]["creationTimestamp"] = json!(exported);
                    e.export = Some(serde_json::from_value(v).unwrap());
                }
                _ => {
                    v["endpoints"][0]["addresses"] = json!([ip]);
                    e.slices.push(serde_json::from_value(v).unwrap());
                }
            }
        }
        e
    }

    fn record(member: &str, e: &Exported) -> DynamicObject {
        let body = record::records(&record::namespace_of(member), "shop", "web", e).remove(0);
        serde_json::from_value(body).unwrap()
    }

    fn fleet() -> HubFleet {
        HubFleet::new(SourceId::Members, Arc::new(AtomicU64::new(0)))
    }

    fn key() -> ServiceKey {
        ServiceKey {
            namespace: crate::model::DnsLabel::parse("shop").unwrap(),
            name: crate::model::DnsLabel::parse("web").unwrap(),
        }
    }

    fn sorted(mut objects: Vec<Object>) -> Vec<Object> {
        objects.sort_by_key(Object::id);
        objects
    }

    /// What centralized push mode sends for the same members' objects,
    /// watched member by member.
    fn pushed(members: &[(&str, &Exported)]) -> Vec<Object> {
        let ids: Vec<ClusterId> = members.iter().map(|(m, _)| ClusterId::parse(m).unwrap()).collect();
        let mut state = FleetState::new(ids.clone(), 1);
        let mut dirty = BTreeSet::new();
        for (i, (_, e)) in members.iter().enumerate() {
            let exports: Vec<DynamicObject> = e.export.iter().cloned().collect();
            let services: Vec<Service> = e.service.iter().cloned().collect();
            for event in member::listed(i, &ids[i], &exports, &services, &e.slices) {
                state.apply(event, &mut dirty);
            }
        }
        sorted(service_objects(&state, &key()))
    }

    fn replaced(updates: Vec<Update>) -> Vec<Object> {
        match <[Update; 1]>::try_from(updates) {
            Ok([Update::Replace { objects, .. }]) => sorted(objects),
            other => panic!("not one replacement: {other:?}"),
        }
    }

    #[test]
    fn the_hubs_records_answer_what_push_mode_answers_for_the_same_fleet() {
        let (older, newer) =
            (web("10.1.0.5", "2026-11-01T10:00:00Z"), web("10.2.0.5", "2026-11-02T10:00:00Z"));
        let mut f = fleet();
        // Listed in another order than the push mode's members: the merge
        // (oldest export first) decides, not who was seen first.
        let sent = replaced(f.seen(RecordChange::Listed(vec![record("c2", &newer), record("c1", &older)])));
        assert_eq!(sent, pushed(&[("c1", &older), ("c2", &newer)]));
        let Some(Object::Import(import)) = sent.iter().find(|o| matches!(o, Object::Import(_))) else {
            panic!("no import: {sent:?}")
        };
        let ips: Vec<String> = import.ips.iter().map(ToString::to_string).collect();
        assert_eq!(ips, ["10.1.0.5", "10.2.0.5"], "both ClusterIPs, the oldest export's first");
        assert_eq!(f.members.iter().map(MemberRecords::member).collect::<Vec<_>>(), ["c2", "c1"]);
    }

    #[test]
    fn a_change_on_the_hub_sends_the_service_again_and_a_member_gone_takes_its_part_away() {
        let (a, b) = (web("10.1.0.5", "2026-11-01T10:00:00Z"), web("10.2.0.5", "2026-11-02T10:00:00Z"));
        let mut f = fleet();
        replaced(f.seen(RecordChange::Listed(vec![record("c1", &a)])));
        // A member joins with its first record.
        let updates = f.seen(RecordChange::Applied(record("c2", &b)));
        assert!(updates.iter().all(|u| matches!(u, Update::Upsert { .. })), "{updates:?}");
        let upserted: Vec<Object> = updates
            .into_iter()
            .filter_map(|u| if let Update::Upsert { object, .. } = u { Some(object) } else { None })
            .collect();
        assert_eq!(sorted(upserted), pushed(&[("c1", &a), ("c2", &b)]));
        // Its record deleted: its slice goes, the import is sent again.
        let updates = f.seen(RecordChange::Deleted(record("c2", &b)));
        assert!(
            updates.iter().any(|u| matches!(u, Update::Remove { id: ObjectId::Slice(_), .. })),
            "{updates:?}"
        );
        assert!(updates.iter().any(|u| matches!(u, Update::Upsert { object: Object::Import(_), .. })));
        // A relist without c1's records: the service goes.
        let updates = f.seen(RecordChange::Listed(Vec::new()));
        assert!(
            !updates.is_empty() && updates.iter().all(|u| matches!(u, Update::Remove { .. })),
            "{updates:?}"
        );
        assert!(f.sent.is_empty());
    }

    #[test]
    fn a_record_outside_a_member_namespace_or_unreadable_is_skipped_and_counted() {
        let e = web("10.1.0.5", "2026-11-01T10:00:00Z");
        let mut stray = record("c1", &e);
        stray.metadata.namespace = Some("default".into());
        let mut bad_member = record("c1", &e);
        bad_member.metadata.namespace = Some(record::namespace_of("Not_A_Label"));
        let mut unreadable = record("c3", &e);
        unreadable.data["spec"]["service"]["spec"]["ports"] = json!("eighty");
        let mut f = fleet();
        let sent =
            replaced(f.seen(RecordChange::Listed(vec![stray, bad_member, unreadable, record("c1", &e)])));
        assert_eq!(f.skipped.load(Ordering::Relaxed), 3);
        assert_eq!(sent, pushed(&[("c1", &e)]), "the readable record answers as before");
    }

    #[test]
    fn a_still_heartbeat_demotes_its_member_and_a_silent_hub_demotes_no_one() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let id = |c: &str| ClusterId::parse(c).unwrap();
        let read = |versions: &[(&str, &str)]| -> BTreeMap<ClusterId, (String, Duration)> {
            versions.iter().map(|(c, v)| (id(c), ((*v).to_owned(), Duration::ZERO))).collect()
        };
        let dead = Duration::from_secs(5);
        let mut beats = Beats::default();
        assert!(beats.read(read(&[("c1", "1"), ("c2", "1")]), at(0), dead).is_empty());
        // The hub silent for a minute: no verdict, and the minute is not counted.
        for s in 1..60 {
            beats.blind(at(s));
        }
        assert!(beats.read(read(&[("c1", "2"), ("c2", "1")]), at(60), dead).is_empty());
        // c2's heartbeat stands still for 5 s of the time the hub answered
        // (the second before it went silent, and 4 after).
        assert!(beats.read(read(&[("c1", "3"), ("c2", "1")]), at(63), dead).is_empty());
        assert_eq!(beats.read(read(&[("c1", "4"), ("c2", "1")]), at(64), dead), [(id("c2"), false, dead)]);
        // It moves: alive again.
        assert_eq!(
            beats.read(read(&[("c1", "5"), ("c2", "2")]), at(66), dead),
            [(id("c2"), true, Duration::ZERO)]
        );
        // c1's Lease gone: a deleted heartbeat stands still too.
        assert_eq!(beats.read(read(&[("c2", "3")]), at(71), dead)[0].0, id("c1"));
        // Read first long after its last renewal: not alive from the start.
        let mut late = Beats::default();
        let old: BTreeMap<ClusterId, (String, Duration)> =
            [(id("c3"), ("9".to_owned(), Duration::from_secs(60)))].into();
        assert_eq!(late.read(old, at(0), dead)[0], (id("c3"), false, Duration::from_secs(60)));
    }
}
