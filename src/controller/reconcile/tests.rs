//! Unit tests of one service reconciled across the members (`reconcile.rs`).

use std::time::Duration;

use k8s_openapi::api::discovery::v1::Endpoint;
use serde_json::json;

use super::*;
use crate::controller::adopt::adopt;
use crate::controller::api::fake::{FakeMember, Fault};
use crate::controller::api::{ErrorReason, MemberApi};
use crate::fleet::export::{ExportedService, ServicePortSpec};
use crate::k8s::fence::Fence;
use crate::k8s::mcs::ANNOTATION_TRIGGER_TIME;
use crate::model::{DnsLabel, Protocol};

const IMPORT_V: &str = "multicluster.x-k8s.io/v1alpha1";

/// Three members (cluster-1 exports `shop/web`) behind fakes.
struct Fleet {
    fakes: Vec<Arc<FakeMember>>,
    env: Arc<Env>,
}

fn key() -> ServiceKey {
    ServiceKey { namespace: DnsLabel::parse("shop").unwrap(), name: DnsLabel::parse("web").unwrap() }
}

fn cluster(i: usize) -> ClusterId {
    ClusterId::parse(&format!("cluster-{}", i + 1)).unwrap()
}

fn fleet() -> Fleet {
    let fakes: Vec<Arc<FakeMember>> = (0..3).map(|_| Arc::new(FakeMember::default())).collect();
    // The user's export in cluster-1: its status is written on it.
    fakes[0].put(
        Kind::ServiceExport,
        "shop",
        "web",
        json!({"metadata": {"namespace": "shop", "name": "web", "uid": "u1"}}),
    );
    let env = Arc::new(Env {
        members: fakes
            .iter()
            .enumerate()
            .map(|(i, f)| MemberEnv {
                name: format!("cluster-{}", i + 1),
                cluster: cluster(i),
                api: f.clone() as SharedApi,
                import_version: IMPORT_V.into(),
                export_version: IMPORT_V.into(),
            })
            .collect(),
        auto_export_prefixes: vec![],
        stats: Arc::new(SyncStats::new().unwrap()),
        fence: WriteFence::new(Arc::new(Fence::open()), 0),
    });
    Fleet { fakes, env }
}

fn input(address: &str) -> Input {
    let service = ExportedService {
        kind: ImportType::ClusterSetIp,
        ports: vec![ServicePortSpec { name: None, protocol: Protocol::Tcp, port: 80, app_protocol: None }],
        session_affinity: Default::default(),
        affinity_timeout: None,
        ip_families: vec![AddressFamily::V4],
        cluster_ips: vec!["10.1.0.10".parse().unwrap()],
        traffic_distribution: None,
        internal_traffic_policy: Some("Cluster".into()),
    };
    let export = ClusterExport {
        cluster: cluster(0),
        exported_at: 1_700_000_000,
        service: Exported::Service(service),
        annotations: BTreeMap::new(),
        metadata: Default::default(),
    };
    let slice = EndpointSlice {
        metadata: kube::api::ObjectMeta { name: Some("web-x1".into()), ..Default::default() },
        address_type: "IPv4".into(),
        endpoints: vec![Endpoint { addresses: vec![address.into()], ..Default::default() }],
        ports: None,
    };
    let info = ExportInfo {
        exported_at: 1_700_000_000,
        ours: false,
        annotations: BTreeMap::new(),
        metadata: Default::default(),
        uid: Some("u1".into()),
    };
    Input {
        key: key(),
        exports: vec![export],
        members: (0..3)
            .map(|i| MemberInput {
                writable: true,
                export: (i == 0).then(|| info.clone()),
                ..Default::default()
            })
            .collect(),
        sources: HashMap::from([(cluster(0), BTreeMap::from([("web-x1".to_owned(), Arc::new(slice))]))]),
        synced: true,
        has_elder: false,
    }
}

async fn within(limit: Duration, f: impl Fn() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < deadline {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    f()
}

fn kinds(fake: &FakeMember) -> BTreeSet<Kind> {
    fake.objects.lock().unwrap().keys().map(|(k, _, _)| *k).collect()
}

/// The name of the one object of `kind` the member holds.
fn name_of(fake: &FakeMember, kind: Kind) -> String {
    fake.objects.lock().unwrap().keys().find(|(k, _, _)| *k == kind).map(|(_, _, n)| n.clone()).unwrap()
}

fn vip_name(fake: &FakeMember) -> String {
    name_of(fake, Kind::Service)
}

/// Someone else sets the first address of the member's one slice.
fn edit_address(fake: &FakeMember, address: &str) {
    let name = name_of(fake, Kind::EndpointSlice);
    let mut slice = fake.get(Kind::EndpointSlice, "shop", &name).unwrap();
    slice["endpoints"][0]["addresses"][0] = json!(address);
    fake.put(Kind::EndpointSlice, "shop", &name, slice);
}

fn writes(f: &Fleet) -> usize {
    f.fakes.iter().map(|m| m.writes().len()).sum()
}

/// The service's state as a new leader finds it: read whole from every member.
async fn as_found(f: &Fleet) -> KeyState {
    let mut ks = KeyState::default();
    for (i, fake) in f.fakes.iter().enumerate() {
        let (found, failed) = adopt(fake.as_ref(), i, &cluster(i), &[None]).await;
        assert!(failed.is_empty());
        for (_, part) in found {
            ks.adopt(part);
        }
    }
    ks
}

fn address(fake: &FakeMember) -> Value {
    let slices: Vec<Value> = fake
        .objects
        .lock()
        .unwrap()
        .iter()
        .filter(|((k, _, _), _)| *k == Kind::EndpointSlice)
        .map(|(_, v)| v.clone())
        .collect();
    assert_eq!(slices.len(), 1, "{slices:?}");
    slices[0]["endpoints"][0]["addresses"][0].clone()
}

#[tokio::test]
async fn a_new_export_is_written_to_every_member_once() {
    let f = fleet();
    let (ks, r) = reconcile(KeyState::default(), input("10.1.0.5"), f.env.clone()).await;
    r.unwrap();
    for fake in &f.fakes {
        assert!(
            [Kind::ServiceImport, Kind::Service, Kind::EndpointSlice].iter().all(|k| kinds(fake).contains(k)),
            "{:?}",
            kinds(fake)
        );
        assert_eq!(address(fake), "10.1.0.5");
        let import = fake.get(Kind::ServiceImport, "shop", "web").unwrap();
        assert_eq!(import["status"]["clusters"][0]["cluster"], "cluster-1");
        // The VIP the member's API server gave is the import's.
        let vip = fake.get(Kind::Service, "shop", &vip_name(fake)).unwrap();
        assert_eq!(import["spec"]["ips"], vip["spec"]["clusterIPs"], "{import} {vip}");
    }
    let export = f.fakes[0].get(Kind::ServiceExport, "shop", "web").unwrap();
    let ready =
        export["status"]["conditions"].as_array().unwrap().iter().find(|c| c["type"] == "Ready").unwrap();
    assert_eq!(ready["status"], "True", "{export}");
    // Nothing changed: nothing written.
    let before = writes(&f);
    let (_, r) = reconcile(ks, input("10.1.0.5"), f.env.clone()).await;
    r.unwrap();
    assert_eq!(writes(&f), before);
}

/// The import's `SourcesReachable` condition in `fake`.
fn sources_reachable(fake: &FakeMember) -> Value {
    let import = fake.get(Kind::ServiceImport, "shop", "web").expect("import");
    let conditions = import["status"]["conditions"].as_array().cloned().unwrap_or_default();
    conditions
        .into_iter()
        .find(|c| c["type"] == desired::CONDITION_SOURCES_REACHABLE)
        .expect("SourcesReachable")
}

#[tokio::test]
async fn sources_reachable_says_since_when_and_a_new_leader_keeps_that_time() {
    let f = fleet();
    let started = k8s_openapi::jiff::Timestamp::now().as_second();
    let (_, r) = reconcile(KeyState::default(), input("10.1.0.5"), f.env.clone()).await;
    r.unwrap();
    for fake in &f.fakes {
        let c = sources_reachable(fake);
        assert_eq!(c["status"], "True", "{c}");
        let t: k8s_openapi::jiff::Timestamp = c["lastTransitionTime"].as_str().unwrap().parse().unwrap();
        assert!(t.as_second() >= started, "{c}: before this reconcile began");
    }
    // The condition became true before this leader began: it keeps the
    // time it finds, and writes nothing.
    let earlier = "2026-01-02T03:04:05Z";
    for fake in &f.fakes {
        let mut import = fake.get(Kind::ServiceImport, "shop", "web").unwrap();
        for c in import["status"]["conditions"].as_array_mut().unwrap() {
            if c["type"] == desired::CONDITION_SOURCES_REACHABLE {
                c["lastTransitionTime"] = json!(earlier);
            }
        }
        fake.put(Kind::ServiceImport, "shop", "web", import);
    }
    let before = writes(&f);
    let (ks, r) = reconcile(as_found(&f).await, input("10.1.0.5"), f.env.clone()).await;
    r.unwrap();
    assert_eq!(writes(&f), before, "{:?}", f.fakes[1].writes());
    // And an endpoint's change leaves it as it is.
    let (_, r) = reconcile(ks, input("10.1.0.6"), f.env.clone()).await;
    r.unwrap();
    for fake in &f.fakes {
        assert_eq!(sources_reachable(fake)["lastTransitionTime"], earlier);
    }
}

#[tokio::test]
async fn a_member_that_hangs_delays_no_other_member() {
    let f = fleet();
    f.fakes[1].fail(None, Fault::Hang);
    let env = f.env.clone();
    let running = tokio::spawn(reconcile(KeyState::default(), input("10.1.0.5"), env));
    // The healthy members get everything while the hung one's lane waits.
    let done = within(Duration::from_secs(5), || {
        [0, 2].iter().all(|i| f.fakes[*i].get(Kind::ServiceImport, "shop", "web").is_some())
    })
    .await;
    assert!(done, "healthy members not written while one hangs");
    assert!(f.fakes[1].get(Kind::ServiceImport, "shop", "web").is_none());
    assert!(
        !running.is_finished(),
        "the hung lane ends only at its deadline (KubeMember) or when marked down"
    );
    running.abort();
}

#[tokio::test]
async fn one_member_refusing_costs_the_others_nothing_and_is_retried_alone() {
    let f = fleet();
    f.fakes[2].fail(None, Fault::Status(409));
    let (ks, r) = reconcile(KeyState::default(), input("10.1.0.5"), f.env.clone()).await;
    assert_eq!(r.unwrap_err().reason(), ErrorReason::Conflict);
    assert!(f.fakes[1].get(Kind::ServiceImport, "shop", "web").is_some());
    let export = f.fakes[0].get(Kind::ServiceExport, "shop", "web").unwrap();
    let ready =
        export["status"]["conditions"].as_array().unwrap().iter().find(|c| c["type"] == "Ready").unwrap();
    assert_eq!(ready["reason"], "Pending", "not Ready until every member has it: {export}");
    f.fakes[2].heal();
    let before: Vec<usize> = f.fakes.iter().map(|m| m.writes().len()).collect();
    let (_, r) = reconcile(ks, input("10.1.0.5"), f.env.clone()).await;
    r.unwrap();
    let after: Vec<usize> = f.fakes.iter().map(|m| m.writes().len()).collect();
    assert_eq!(after[1], before[1], "member 2 was done");
    assert_eq!(after[0], before[0] + 1, "member 1: only the export's Ready");
    assert!(f.fakes[2].get(Kind::ServiceImport, "shop", "web").is_some());
}

#[tokio::test]
async fn a_new_leader_repairs_drift_and_writes_nothing_else() {
    let f = fleet();
    let (_, r) = reconcile(KeyState::default(), input("10.1.0.5"), f.env.clone()).await;
    r.unwrap();
    // An idle failover: everything found as written, nothing written.
    let before = writes(&f);
    let ks = as_found(&f).await;
    let (_, r) = reconcile(ks, input("10.1.0.5"), f.env.clone()).await;
    r.unwrap();
    assert_eq!(writes(&f), before, "{:?}", f.fakes[0].writes());
    // While no controller ran: a slice's address edited in cluster-2, the
    // import in cluster-3 edited into an invalid shape, the VIP in
    // cluster-1 deleted, and the export's conditions removed.
    edit_address(&f.fakes[1], "10.66.6.6");
    let mut import = f.fakes[2].get(Kind::ServiceImport, "shop", "web").unwrap();
    import["spec"] = json!("garbage");
    f.fakes[2].put(Kind::ServiceImport, "shop", "web", import);
    let vip = vip_name(&f.fakes[0]);
    f.fakes[0].delete(&f.env.fence, Kind::Service, "shop", &vip).await.unwrap();
    let mut export = f.fakes[0].get(Kind::ServiceExport, "shop", "web").unwrap();
    export.as_object_mut().unwrap().remove("status");
    f.fakes[0].put(Kind::ServiceExport, "shop", "web", export);
    let before: Vec<usize> = f.fakes.iter().map(|m| m.writes().len()).collect();
    let ks = as_found(&f).await;
    let (_, r) = reconcile(ks, input("10.1.0.5"), f.env.clone()).await;
    r.unwrap();
    assert_eq!(address(&f.fakes[1]), "10.1.0.5");
    assert_eq!(f.fakes[2].get(Kind::ServiceImport, "shop", "web").unwrap()["spec"]["type"], "ClusterSetIP");
    assert!(f.fakes[0].get(Kind::Service, "shop", &vip).is_some());
    assert!(f.fakes[0].get(Kind::ServiceExport, "shop", "web").unwrap()["status"]["conditions"].is_array());
    assert_eq!(f.env.stats.drift_of(Kind::EndpointSlice), 1);
    assert_eq!(f.env.stats.drift_of(Kind::ServiceImport), 1);
    // Only what drifted was written: the slice in cluster-2; the import
    // in cluster-3; the VIP in cluster-1, whose new address changes the
    // import there, and the export's status.
    let after: Vec<usize> = f.fakes.iter().map(|m| m.writes().len()).collect();
    assert_eq!(after[1] - before[1], 1, "{:?}", f.fakes[1].writes());
    assert_eq!(after[2] - before[2], 1, "{:?}", f.fakes[2].writes());
    assert!(after[0] - before[0] <= 4, "{:?}", f.fakes[0].writes());
}

#[tokio::test]
async fn drift_whose_repair_fails_is_repaired_by_the_retry() {
    let f = fleet();
    let (_, r) = reconcile(KeyState::default(), input("10.1.0.5"), f.env.clone()).await;
    r.unwrap();
    edit_address(&f.fakes[1], "10.66.6.6");
    let ks = as_found(&f).await;
    f.fakes[1].fail(Some(Kind::EndpointSlice), Fault::Status(503));
    let (ks, r) = reconcile(ks, input("10.1.0.5"), f.env.clone()).await;
    assert_eq!(r.unwrap_err().reason(), ErrorReason::Server);
    assert_eq!(address(&f.fakes[1]), "10.66.6.6");
    f.fakes[1].heal();
    let (_, r) = reconcile(ks, input("10.1.0.5"), f.env.clone()).await;
    r.unwrap();
    assert_eq!(address(&f.fakes[1]), "10.1.0.5");
    assert_eq!(f.env.stats.drift_of(Kind::EndpointSlice), 1);
}

#[tokio::test]
async fn behind_a_closed_fence_nothing_is_sent() {
    let f = fleet();
    let env = Arc::new(Env {
        members: f
            .env
            .members
            .iter()
            .map(|m| MemberEnv {
                api: m.api.clone(),
                name: m.name.clone(),
                cluster: m.cluster.clone(),
                import_version: IMPORT_V.into(),
                export_version: IMPORT_V.into(),
            })
            .collect(),
        auto_export_prefixes: vec![],
        stats: f.env.stats.clone(),
        fence: WriteFence::new(Arc::new(Fence::closed()), 0),
    });
    let (ks, r) = reconcile(KeyState::default(), input("10.1.0.5"), env.clone()).await;
    assert_eq!(r.unwrap_err().reason(), ErrorReason::Fenced);
    assert_eq!(writes(&f), 0, "{:?}", f.fakes[0].writes());
    assert_eq!(env.stats.writes.load(Ordering::Relaxed), 0, "fenced writes are not counted as sent");
    // Nothing was recorded as applied: once the fence opens, all is written.
    env.fence.fence.held(tokio::time::Instant::now(), Duration::from_secs(15));
    let (_, r) = reconcile(ks, input("10.1.0.5"), env).await;
    r.unwrap();
    assert!(f.fakes.iter().all(|m| m.get(Kind::ServiceImport, "shop", "web").is_some()));
}

#[test]
fn a_service_state_splits_by_member_and_comes_back_whole() {
    let mut ks = KeyState::default();
    for m in 0..3 {
        let r = WrittenObject::new(m, Kind::ServiceImport, &key(), "web".into());
        ks.applied.insert(r.clone(), format!("d{m}"));
        ks.owned.insert(r.clone());
        ks.written.record(r.clone(), Some("1"));
        ks.live.insert(r, json!({}));
        ks.transitions.insert((m, condition::READY), (Status::True, "t".into()));
        ks.export_uids.insert(m, None);
    }
    let part = ks.take_member(1);
    assert!(part.owned.iter().all(|r| r.member == 1) && part.owned.len() == 1);
    assert_eq!(part.applied.len(), 1);
    assert_eq!(part.transitions.len(), 1);
    assert!(ks.owned.iter().all(|r| r.member != 1) && ks.owned.len() == 2);
    assert!(!ks.written.ours(&WrittenObject::new(1, Kind::ServiceImport, &key(), "web".into()), "1"));
    ks.absorb(part);
    assert_eq!(
        (ks.owned.len(), ks.applied.len(), ks.live.len(), ks.transitions.len(), ks.export_uids.len()),
        (3, 3, 3, 3, 3)
    );
    assert!(ks.written.ours(&WrittenObject::new(1, Kind::ServiceImport, &key(), "web".into()), "1"));
}

#[test]
fn only_an_object_written_before_a_list_began_can_be_gone() {
    let key =
        ServiceKey { namespace: DnsLabel::parse("shop").unwrap(), name: DnsLabel::parse("web").unwrap() };
    let import = WrittenObject::new(1, Kind::ServiceImport, &key, "web".into());
    let slice = WrittenObject::new(1, Kind::EndpointSlice, &key, "web-abc".into());
    // Wanted, but its write failed: owned, never written.
    let vip = WrittenObject::new(1, Kind::Service, &key, "web-clusterset".into());
    let mut ks = KeyState::default();
    ks.owned.extend([import.clone(), slice.clone(), vip]);
    ks.written.record(import.clone(), Some("5"));
    std::thread::sleep(Duration::from_millis(2));
    let listed_at = std::time::Instant::now();
    // The slice is written while the list is under way.
    std::thread::sleep(Duration::from_millis(2));
    ks.written.record(slice.clone(), Some("6"));
    let none = BTreeSet::new();
    // Neither listed: the import, written before the list, is gone; the
    // slice may be newer than the list.
    assert_eq!(ks.gone(1, (Kind::ServiceImport, None), &none, listed_at), vec![import.clone()]);
    assert_eq!(ks.gone(1, (Kind::EndpointSlice, Some("shop")), &none, listed_at), vec![]);
    // A later list without the slice: gone.
    std::thread::sleep(Duration::from_millis(2));
    let later = std::time::Instant::now();
    assert_eq!(ks.gone(1, (Kind::EndpointSlice, None), &none, later), vec![slice]);
    // Never written, listed, of another member, or of another
    // namespace: not gone.
    assert_eq!(ks.gone(1, (Kind::Service, None), &none, later), vec![]);
    let listed = BTreeSet::from([("shop".to_owned(), "web".to_owned())]);
    assert_eq!(ks.gone(1, (Kind::ServiceImport, None), &listed, listed_at), vec![]);
    assert_eq!(ks.gone(0, (Kind::ServiceImport, None), &none, listed_at), vec![]);
    assert_eq!(ks.gone(1, (Kind::ServiceImport, Some("other")), &none, listed_at), vec![]);
}

/// [`input`] whose source slice carries `trigger`, exported at `exported_at`.
fn timed(address: &str, trigger: Option<&str>, exported_at: i64) -> Input {
    let mut i = input(address);
    i.exports[0].exported_at = exported_at;
    let slices = i.sources.get_mut(&cluster(0)).unwrap();
    let mut slice = (*slices["web-x1"]).clone();
    slice.metadata.annotations =
        trigger.map(|t| BTreeMap::from([(ANNOTATION_TRIGGER_TIME.to_owned(), t.to_owned())]));
    slices.insert("web-x1".into(), Arc::new(slice));
    i
}

/// The trigger time member `fake`'s one slice carries.
fn carried(fake: &FakeMember) -> Option<String> {
    let name = name_of(fake, Kind::EndpointSlice);
    let slice = fake.get(Kind::EndpointSlice, "shop", &name).unwrap();
    slice["metadata"]["annotations"][ANNOTATION_TRIGGER_TIME].as_str().map(str::to_owned)
}

#[tokio::test]
async fn a_slice_carries_its_sources_trigger_time_which_alone_writes_nothing() {
    let f = fleet();
    let old = 1_700_000_000;
    let at = |t: &str| Some(t.to_owned());
    let (ks, r) = reconcile(
        KeyState::default(),
        timed("10.1.0.5", Some("2026-11-28T01:58:05.12Z"), old),
        f.env.clone(),
    )
    .await;
    r.unwrap();
    for fake in &f.fakes {
        assert_eq!(carried(fake), at("2026-11-28T01:58:05.12Z"), "every member's slice");
    }
    // The source's time alone changed (the EndpointSlice controller wrote
    // it again for nothing we mirror): nothing is written.
    let (before, unchanged) = (writes(&f), f.env.stats.unchanged.load(Ordering::Relaxed));
    let (ks, r) = reconcile(ks, timed("10.1.0.5", Some("2026-11-28T01:58:06Z"), old), f.env.clone()).await;
    r.unwrap();
    assert_eq!(writes(&f), before, "{:?}", f.fakes[1].writes());
    assert!(f.env.stats.unchanged.load(Ordering::Relaxed) > unchanged);
    assert_eq!(carried(&f.fakes[1]), at("2026-11-28T01:58:05.12Z"));
    // A change comes with its time.
    let (ks, r) = reconcile(ks, timed("10.1.0.6", Some("2026-11-28T01:58:07Z"), old), f.env.clone()).await;
    r.unwrap();
    assert_eq!((address(&f.fakes[2]), carried(&f.fakes[2])), (json!("10.1.0.6"), at("2026-11-28T01:58:07Z")));
    // An export newer than the slice's time: exporting was the change.
    let exported = 1_795_831_200; // 2026-11-28T02:00:00Z
    let (ks, r) =
        reconcile(ks, timed("10.1.0.7", Some("2026-11-28T01:58:07Z"), exported), f.env.clone()).await;
    r.unwrap();
    assert_eq!(carried(&f.fakes[2]), at("2026-11-28T02:00:00Z"));
    // One that does not parse travels as it is; none at all never holds a
    // write up, and a write without one takes the old one away.
    let (ks, r) = reconcile(ks, timed("10.1.0.8", Some("soon"), old), f.env.clone()).await;
    r.unwrap();
    assert_eq!(carried(&f.fakes[2]), at("soon"));
    let (_, r) = reconcile(ks, timed("10.1.0.9", None, old), f.env.clone()).await;
    r.unwrap();
    assert_eq!((address(&f.fakes[2]), carried(&f.fakes[2])), (json!("10.1.0.9"), None));
}
