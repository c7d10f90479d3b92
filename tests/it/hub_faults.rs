//! Hub mode given bad input, on a real hub (a kube-apiserver) and real
//! members, each agent with its restricted identities (tests/it/hub.rs):
//! a member name claimed by two clusters is refused naming both; a record
//! outside its member's namespace is ignored (the namespace, not the
//! content, says who published it); a record that does not parse is skipped
//! with a message naming it and its member, and counted.

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DynamicObject, PostParams};
use serde_json::{Value, json};

use crate::fleet::User;
use crate::harness::clusters::TestClusters;
use crate::harness::http::http_get;
use crate::harness::syncing::Syncing;
use crate::hub::{agent, agent_as, enrol, waits};
use crate::sync::{Reader, readers, users};
use crate::watch::runtime;
use clusterset_dns::hub::heartbeat::{ANNOTATION_CLUSTER, LEASE};
use clusterset_dns::hub::record;

/// A hub (cluster 0) and `members` members, each enrolled; `dir` holds
/// their hub kubeconfigs.
fn hub_of(members: usize) -> (TestClusters, tempfile::TempDir, Vec<PathBuf>) {
    let clusters = TestClusters::start(members + 1);
    let dir = tempfile::tempdir().expect("tempdir");
    let kc = (1..=members).map(|i| enrol(&clusters, clusters.name(i), dir.path())).collect();
    (clusters, dir, kc)
}

fn logs(agents: &[&Syncing]) -> String {
    agents.iter().map(|a| a.log()).collect::<Vec<_>>().join("\n---\n")
}

/// Cluster `i`'s identity: its kube-system namespace's uid.
fn cluster_uid(rt: &tokio::runtime::Runtime, clusters: &TestClusters, i: usize) -> String {
    rt.block_on(async {
        let ns =
            Api::<Namespace>::all(clusters.client(i).await).get("kube-system").await.expect("kube-system");
        ns.metadata.uid.expect("uid")
    })
}

/// The records API of hub namespace `ns`, as the hub's admin (a hand edit).
async fn records_in(clusters: &TestClusters, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(clusters.client(0).await, ns, &record::resource())
}

#[test]
fn a_member_name_claimed_by_two_clusters_is_refused_naming_both() {
    let (clusters, _dir, kc) = hub_of(2);
    let rt = runtime();
    let ns = "hub-claim";
    let (member, hub_ns) = (clusters.name(1).to_owned(), record::namespace_of(clusters.name(1)));
    let first = agent(&clusters, 1, &kc[0], ns, &[]);
    let (first_uid, second_uid) = (cluster_uid(&rt, &clusters, 1), cluster_uid(&rt, &clusters, 2));
    let heartbeat_of = || {
        rt.block_on(async {
            let api: Api<Lease> = Api::namespaced(clusters.client(0).await, &hub_ns);
            let l = api.get_opt(LEASE).await.expect("get heartbeat")?;
            l.metadata.annotations?.get(ANNOTATION_CLUSTER).cloned()
        })
    };
    waits(
        30,
        "the first cluster's heartbeat on the hub",
        || heartbeat_of() == Some(first_uid.clone()),
        || first.log(),
    );
    let u = users(&rt, &clusters, ns);
    rt.block_on(u[2].exported_service("second", "10.2.0.5"));
    // Cluster 2's agent says it is member `member` too (an operator's slip:
    // the same name and hub identity on two clusters).
    let mut second = agent_as(&clusters, 2, &member, &kc[0], ns, "agent-second", &[]);
    let both = format!(
        "member name {member} is claimed on the hub by cluster {first_uid} (agent \"agent-{member}\") and by this cluster {second_uid} (agent \"agent-second\")"
    );
    waits(
        30,
        "the second agent refuses the name, naming both",
        || second.log().contains(&both),
        || logs(&[&first, &second]),
    );
    let (status, body) = http_get(second.http(), "/ready");
    assert_ne!(status, 200, "/ready of the refused agent: {body}");
    assert!(body.contains(&first_uid) && body.contains(&second_uid), "/ready names neither: {body}");
    assert_eq!(http_get(first.http(), "/ready").0, 200, "the first agent is not ready\n{}", first.log());
    // It publishes nothing and leaves the heartbeat alone.
    std::thread::sleep(Duration::from_secs(6));
    let published = rt.block_on(async {
        records_in(&clusters, &hub_ns).await.get_opt(&format!("{ns}.second")).await.expect("get record")
    });
    assert!(published.is_none(), "the refused agent published: {published:?}\n{}", second.log());
    assert_eq!(heartbeat_of(), Some(first_uid.clone()), "the heartbeat changed hands\n{}", second.log());

    // The first agent gone, its heartbeat stands still: the name is free.
    drop(first);
    waits(
        30,
        "the second cluster takes the name once the first's heartbeat stood still",
        || heartbeat_of() == Some(second_uid.clone()),
        || second.log(),
    );
    assert_eq!(http_get(second.http(), "/ready").0, 200, "{}", second.log());
    second.stop();
}

/// `record` as the one of service `to` (its name and its objects' names).
fn renamed(record: &DynamicObject, ns: &str, to: &str, hub_ns: &str) -> DynamicObject {
    let mut v = serde_json::to_value(record).expect("json");
    let meta = json!({"name": format!("{ns}.{to}"), "namespace": hub_ns});
    v["metadata"] = meta;
    v["spec"]["serviceExport"]["metadata"]["name"] = json!(to);
    v["spec"]["service"]["metadata"]["name"] = json!(to);
    for (k, s) in v["spec"]["endpointSlices"].as_array_mut().expect("slices").iter_mut().enumerate() {
        s["metadata"]["name"] = json!(format!("{to}-{k}"));
        s["metadata"]["labels"]["kubernetes.io/service-name"] = json!(to);
    }
    serde_json::from_value(v).expect("record")
}

async fn create_in(clusters: &TestClusters, hub_ns: &str, body: &DynamicObject) {
    let admin = clusters.client(0).await;
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": hub_ns}})).expect("ns");
    match Api::<Namespace>::all(admin).create(&PostParams::default(), &ns).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("create namespace {hub_ns}: {e}"),
    }
    records_in(clusters, hub_ns).await.create(&PostParams::default(), body).await.expect("create record");
}

/// Two members' agents on the hub, and `web` exported by cluster-2 and
/// imported in cluster-3 through it.
/// Fields drop in order: the agents stop before the clusters.
struct WebExported {
    agents: Vec<Syncing>,
    users: Vec<User>,
    readers: Vec<Reader>,
    rt: tokio::runtime::Runtime,
    clusters: TestClusters,
    _dir: tempfile::TempDir,
    /// Cluster-2's hub namespace.
    member_ns: String,
    /// The members' namespace of the test.
    ns: String,
}

impl WebExported {
    fn start(ns: &str) -> Self {
        let (clusters, dir, kc) = hub_of(2);
        let rt = runtime();
        let agents: Vec<Syncing> = (1..=2).map(|i| agent(&clusters, i, &kc[i - 1], ns, &[])).collect();
        let (users, readers) = (users(&rt, &clusters, ns), readers(&rt, &clusters, ns));
        let member_ns = record::namespace_of(clusters.name(1));
        let s = Self { agents, users, readers, rt, clusters, _dir: dir, member_ns, ns: ns.to_owned() };
        s.export_and_wait("web", "10.1.0.5");
        s
    }

    /// The record of service `name` in cluster-2's hub namespace, as the
    /// hub's admin reads it.
    fn record(&self, name: &str) -> DynamicObject {
        let id = format!("{}.{name}", self.ns);
        self.rt.block_on(async {
            records_in(&self.clusters, &self.member_ns).await.get(&id).await.expect("the record")
        })
    }

    fn log(&self) -> String {
        logs(&self.agents.iter().collect::<Vec<_>>())
    }

    /// Cluster-2 exports `name`; waits until cluster-3 imports it.
    fn export_and_wait(&self, name: &str, address: &str) {
        self.rt.block_on(self.users[1].exported_service(name, address));
        waits(60, &format!("{name} imported in cluster-3"), || self.imported(2, name), || self.log());
    }

    fn imported(&self, i: usize, name: &str) -> bool {
        self.rt.block_on(self.readers[i].import(name)).is_some()
    }
}

#[test]
fn records_outside_their_members_namespace_are_ignored() {
    let ns = "hub-foreign";
    let s = WebExported::start(ns);
    let web = s.record("web");
    // The same content, as service `ghost`, in hub namespaces that are no
    // member's: one of the members' form without a heartbeat, and default.
    for hub_ns in ["clusterset-member-nobody", "default"] {
        s.rt.block_on(create_in(&s.clusters, hub_ns, &renamed(&web, ns, "ghost", hub_ns)));
    }
    // Past two reads of the hub's members (every 5 s), and a later export
    // seen through: the agents have looked.
    std::thread::sleep(Duration::from_secs(11));
    s.export_and_wait("later", "10.1.0.6");
    for i in 1..s.readers.len() {
        assert!(!s.imported(i, "ghost"), "{} imported ghost\n{}", s.clusters.name(i), s.log());
    }
    // The same record in a member's namespace is that member's: the only
    // thing that kept it out was where it was written.
    s.rt.block_on(create_in(&s.clusters, &s.member_ns, &renamed(&web, ns, "ghost", &s.member_ns)));
    waits(60, "ghost imported once in cluster-2's namespace", || s.imported(2, "ghost"), || s.log());
}

#[test]
fn a_record_that_does_not_parse_is_skipped_named_and_counted() {
    let ns = "hub-broken";
    let s = WebExported::start(ns);
    let skipped = || s.agents[1].metric("clusterset_dns_hub_records_skipped_total");
    assert_eq!(skipped(), Some(0.0), "{}", s.log());
    // A hand edit on the hub: web's record as `broken`, whose Service's
    // ports are a string (the CRD keeps unknown fields: the API takes it).
    let mut broken = renamed(&s.record("web"), ns, "broken", &s.member_ns);
    broken.data["spec"]["service"]["spec"]["ports"] = Value::String("eighty".into());
    s.rt.block_on(create_in(&s.clusters, &s.member_ns, &broken));
    let named =
        format!("ExportRecord {}/{ns}.broken (member {}): spec.service", s.member_ns, s.clusters.name(1));
    waits(
        30,
        "cluster-3's agent names the record and its member",
        || s.agents[1].log().contains(&named),
        || s.log(),
    );
    waits(10, "counted", || skipped().is_some_and(|n| n >= 1.0), || s.log());
    // The rest of the member is read as before, and later changes too.
    s.export_and_wait("later", "10.1.0.6");
    assert!(s.imported(2, "web"), "web lost\n{}", s.log());
    assert!(!s.imported(2, "broken"), "broken imported\n{}", s.log());
}
