//! The sync controller (`clusterset-dns sync`, the real binary, as the
//! identity of `deploy/sync/rbac.yaml`) on three real clusters: exports
//! become ServiceImports, MCS EndpointSlices and a clusterset VIP in every
//! member, `serve` in each cluster resolves them from that cluster's own
//! API, conflicts show the KEP's conditions, and leader failover and a
//! crash mid-reconcile converge with no orphans.

use std::time::{Duration, Instant};

use clusterset_dns::k8s::mcs::ANNOTATION_TRIGGER_TIME;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DynamicObject, ListParams};
use serde_json::json;

use crate::fleet::{User, export_resource};
use crate::harness::clusters::{Component, TestClusters, shared};
use crate::harness::served::Served;
use crate::harness::syncing::Syncing;
use crate::harness::{eventually, past_second_of, within};
use crate::watch::{import_resource, runtime, serve, short, status as rcode, wait_ready};

const OURS: &str = "app.kubernetes.io/managed-by=clusterset-dns-sync";

/// `clusterset-dns sync` of namespace `ns` only, with a Lease of its own,
/// so the tests of this binary (which share the clusters) never see each other.
pub(crate) fn syncing(clusters: &TestClusters, ns: &str, extra: &[&str]) -> Syncing {
    syncing_env(clusters, ns, extra, &[])
}

/// [`syncing`] with extra environment variables.
fn syncing_env(clusters: &TestClusters, ns: &str, extra: &[&str], env: &[(&str, &str)]) -> Syncing {
    let lease = format!("sync-{ns}");
    let mut args = vec!["--namespace", ns, "--lease-name", &lease];
    args.extend_from_slice(extra);
    Syncing::start(clusters, &args, env)
}

/// Reads one member's objects in one namespace.
pub(crate) struct Reader {
    client: kube::Client,
    ns: String,
}

impl Reader {
    pub(crate) async fn new(clusters: &TestClusters, i: usize, ns: &str) -> Self {
        Self { client: clusters.client(i).await, ns: ns.into() }
    }

    pub(crate) async fn import(&self, name: &str) -> Option<serde_json::Value> {
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &self.ns, &import_resource("v1beta1"));
        api.get_opt(name).await.expect("get ServiceImport").map(|o| serde_json::to_value(o).expect("json"))
    }

    /// (ServiceImports, Services, EndpointSlices) of ours in the namespace.
    pub(crate) async fn ours(&self) -> (usize, usize, usize) {
        let lp = ListParams::default().labels(OURS);
        let i: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &self.ns, &import_resource("v1beta1"));
        let s: Api<Service> = Api::namespaced(self.client.clone(), &self.ns);
        let e: Api<EndpointSlice> = Api::namespaced(self.client.clone(), &self.ns);
        (
            i.list(&lp).await.expect("list").items.len(),
            s.list(&lp).await.expect("list").items.len(),
            e.list(&lp).await.expect("list").items.len(),
        )
    }

    /// The trigger times (`endpoints.kubernetes.io/last-change-trigger-time`)
    /// the MCS slices of `service` from member `source` carry, sorted.
    pub(crate) async fn trigger_times(&self, service: &str, source: &str) -> Vec<String> {
        let api: Api<EndpointSlice> = Api::namespaced(self.client.clone(), &self.ns);
        let of = format!(
            "multicluster.kubernetes.io/service-name={service},multicluster.kubernetes.io/source-cluster={source}"
        );
        let list = api.list(&ListParams::default().labels(&of)).await.expect("list MCS slices");
        let mut times: Vec<String> = list
            .items
            .iter()
            .filter_map(|s| s.metadata.annotations.as_ref()?.get(ANNOTATION_TRIGGER_TIME).cloned())
            .collect();
        times.sort();
        times
    }

    /// The status of condition `type_` on import `name`, if it has one.
    pub(crate) async fn condition(&self, name: &str, type_: &str) -> Option<String> {
        let o = self.import(name).await.unwrap_or_default();
        let conds = o.pointer("/status/conditions").cloned().unwrap_or_default();
        conds
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == type_)
            .map(|c| c["status"].as_str().unwrap_or("").to_owned())
    }

    /// The export's `creationTimestamp`, if there is one.
    pub(crate) async fn export_created(&self, name: &str) -> Option<String> {
        let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), &self.ns, &export_resource());
        let o = api.get_opt(name).await.expect("get ServiceExport")?;
        Some(serde_json::to_value(o.metadata.creation_timestamp?).expect("json").as_str()?.to_owned())
    }

    /// The export's conditions as `type=status reason: message`.
    pub(crate) async fn conditions(&self, name: &str) -> Vec<String> {
        let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), &self.ns, &export_resource());
        let Some(o) = api.get_opt(name).await.expect("get ServiceExport") else { return vec![] };
        let conds =
            o.data.pointer("/status/conditions").and_then(|c| c.as_array()).cloned().unwrap_or_default();
        conds
            .iter()
            .map(|c| {
                let f = |k: &str| c[k].as_str().unwrap_or("").to_owned();
                format!("{}={} {}: {}", f("type"), f("status"), f("reason"), f("message"))
            })
            .collect()
    }
}

/// Clients belong to the runtime they were made in: use them in `rt` only.
pub(crate) fn users(rt: &tokio::runtime::Runtime, clusters: &TestClusters, ns: &str) -> Vec<User> {
    rt.block_on(async {
        let mut v = Vec::new();
        for i in 0..clusters.len() {
            v.push(User::new(clusters, i, ns).await);
        }
        v
    })
}

pub(crate) fn readers(rt: &tokio::runtime::Runtime, clusters: &TestClusters, ns: &str) -> Vec<Reader> {
    rt.block_on(async {
        let mut v = Vec::new();
        for i in 0..clusters.len() {
            v.push(Reader::new(clusters, i, ns).await);
        }
        v
    })
}

fn serve_in(clusters: &TestClusters, i: usize, ns: &str) -> Served {
    let s = serve(&clusters.serve_kubeconfig(i), ns);
    wait_ready(&s);
    s
}

#[test]
fn an_export_resolves_by_the_same_name_in_every_cluster() {
    let clusters = shared();
    let rt = runtime();
    let ns = "sync-basic";
    let u = users(&rt, clusters, ns);
    let r = readers(&rt, clusters, ns);
    let _sync = syncing(clusters, ns, &["--lease-duration", "5"]);
    rt.block_on(async {
        u[0].service("web", json!({})).await;
        u[0].endpoints("web-a", "web", json!([{"addresses": ["10.1.0.1"]}])).await;
        u[0].export("web").await;
    });
    // A ServiceImport with a VIP in every member, the VIP allocated by each.
    let mut vips = Vec::new();
    for (i, reader) in r.iter().enumerate() {
        eventually(&format!("import in {}", clusters.name(i)), || {
            rt.block_on(reader.import("web")).is_some_and(|o| {
                o.pointer("/spec/ips/0").is_some() && o.pointer("/status/clusters").is_some()
            })
        });
        let o = rt.block_on(reader.import("web")).expect("import");
        assert_eq!(o["spec"]["type"], "ClusterSetIP");
        assert_eq!(o["spec"]["ports"], json!([{"name": "http", "protocol": "TCP", "port": 80}]));
        assert_eq!(o["status"]["clusters"], json!([{"cluster": clusters.name(0)}]));
        vips.push(o["spec"]["ips"][0].as_str().expect("ip").to_owned());
        // One VIP Service and one MCS slice per member, nothing derived in DNS.
        assert_eq!(rt.block_on(reader.ours()), (1, 1, 1), "{}", clusters.name(i));
    }
    // serve in B and C, each fed by its own API server, answers the VIP of its cluster.
    let web = format!("web.{ns}.svc.clusterset.local");
    for i in [1, 2] {
        let s = serve_in(clusters, i, ns);
        eventually("web answered", || short(&s, &web, "A") == [vips[i].clone()]);
    }
    // Answer configuration set on the export reaches every member's import.
    rt.block_on(u[0].annotated_export("web", json!({"clusterset-dns.io/answer-policy": "local-first"})));
    eventually("the export's answer policy on the import in C", || {
        rt.block_on(r[2].import("web"))
            .is_some_and(|o| o["metadata"]["annotations"]["clusterset-dns.io/answer-policy"] == "local-first")
    });
    let conds = rt.block_on(r[0].conditions("web"));
    assert!(conds.iter().any(|c| c.starts_with("Valid=True Valid")), "{conds:?}");
    assert!(conds.iter().any(|c| c.starts_with("Ready=True Exported")), "{conds:?}");
    assert!(conds.iter().any(|c| c.starts_with("Conflict=False NoConflicts")), "{conds:?}");

    // Headless across two clusters, with hostnames: answered in C.
    rt.block_on(async {
        for (user, ip) in [(&u[0], "10.1.0.5"), (&u[1], "10.2.0.5")] {
            user.service("db", json!({"clusterIP": "None"})).await;
            user.endpoints("db-x", "db", json!([{"addresses": [ip], "hostname": "db-0"}])).await;
            user.export("db").await;
        }
    });
    let s = serve_in(clusters, 2, ns);
    let db = format!("db.{ns}.svc.clusterset.local");
    eventually("db from A and B", || short(&s, &db, "A") == ["10.1.0.5", "10.2.0.5"]);
    assert_eq!(short(&s, &format!("db-0.{}.{db}", clusters.name(1)), "A"), ["10.2.0.5"]);
    let o = rt.block_on(r[2].import("db")).expect("db import");
    assert!(o.pointer("/spec/ips").is_none(), "headless has no IP: {o}");

    // Endpoint changes follow; the Service deleted removes its cluster.
    rt.block_on(u[1].endpoints("db-x", "db", json!([{"addresses": ["10.2.0.6"], "hostname": "db-0"}])));
    eventually("db endpoint moved", || short(&s, &db, "A") == ["10.1.0.5", "10.2.0.6"]);
    rt.block_on(u[1].delete_service("db"));
    eventually("db only from A", || short(&s, &db, "A") == ["10.1.0.5"]);
    eventually("Valid=False NoService in B", || {
        rt.block_on(r[1].conditions("db")).iter().any(|c| c.starts_with("Valid=False NoService"))
    });

    // Unexport everything: every object of ours goes from every member.
    rt.block_on(async {
        u[0].unexport("web").await;
        u[0].unexport("db").await;
        u[1].unexport("db").await;
    });
    for (i, reader) in r.iter().enumerate() {
        eventually(&format!("nothing left in {}", clusters.name(i)), || {
            rt.block_on(reader.ours()) == (0, 0, 0)
        });
    }
    eventually("web gone", || rcode(&s, &web) == "NXDOMAIN");
}

#[test]
fn conflicts_show_the_kep_conditions_and_the_oldest_export_wins() {
    let clusters = shared();
    let rt = runtime();
    let ns = "sync-conflict";
    let u = users(&rt, clusters, ns);
    let r = readers(&rt, clusters, ns);
    let _sync = syncing(clusters, ns, &["--no-leader-election"]);
    // The oldest export is A's: creation timestamps have one-second
    // resolution, so B's comes a second later.
    let cases = [
        (
            "porty",
            json!({}),
            json!({"ports": [{"name": "http", "protocol": "TCP", "port": 81}]}),
            "PortConflict",
        ),
        ("typey", json!({}), json!({"clusterIP": "None"}), "TypeConflict"),
        ("affy", json!({}), json!({"sessionAffinity": "ClientIP"}), "SessionAffinityConflict"),
        (
            "affcfg",
            json!({"sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}}}),
            json!({"sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 90}}}),
            "SessionAffinityConfigConflict",
        ),
    ];
    rt.block_on(async {
        for (name, a, _, _) in &cases {
            u[0].service(name, a.clone()).await;
            u[0].export(name).await;
        }
    });
    let last =
        cases.iter().map(|(name, ..)| rt.block_on(r[0].export_created(name)).expect("A's export")).max();
    past_second_of(&last.expect("exports"));
    rt.block_on(async {
        for (name, _, b, _) in &cases {
            u[1].service(name, b.clone()).await;
            u[1].export(name).await;
        }
        u[2].service("ext", json!({"type": "ExternalName", "externalName": "example.com", "ports": []}))
            .await;
        u[2].export("ext").await;
        u[2].export("nosvc").await;
    });
    for (name, _, _, reason) in &cases {
        for i in [0, 1] {
            let mut seen = Vec::new();
            let what = format!("{reason} on {name} in {}", clusters.name(i));
            let found = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                eventually(&what, || {
                    seen = rt.block_on(r[i].conditions(name));
                    seen.iter().any(|c| c.starts_with(&format!("Conflict=True {reason}:")))
                })
            }));
            assert!(found.is_ok(), "{what}: conditions are {seen:#?}");
        }
        let conds = rt.block_on(r[1].conditions(name));
        let conflict = conds.iter().find(|c| c.starts_with("Conflict=True")).expect("conflict");
        assert!(
            conflict.contains(&format!(
                "from oldest service export in \"{}\". 1/2 clusters disagree.",
                clusters.name(0)
            )),
            "{conflict}"
        );
    }
    // The oldest wins: the import keeps A's values in every member.
    let porty = rt.block_on(r[2].import("porty")).expect("porty import");
    assert_eq!(porty["spec"]["ports"], json!([{"name": "http", "protocol": "TCP", "port": 80}]));
    let typey = rt.block_on(r[2].import("typey")).expect("typey import");
    assert_eq!(typey["spec"]["type"], "ClusterSetIP");
    let affcfg = rt.block_on(r[2].import("affcfg")).expect("affcfg import");
    assert_eq!(affcfg["spec"]["sessionAffinityConfig"]["clientIP"]["timeoutSeconds"], 60);
    // Different ports under different names merge into their union...
    rt.block_on(async {
        u[0].service("union", json!({})).await;
        u[0].export("union").await;
        u[1].service(
            "union",
            json!({"ports": [{"name": "http", "protocol": "TCP", "port": 80},
                                                 {"name": "stcp", "protocol": "SCTP", "port": 142}]}),
        )
        .await;
        u[1].export("union").await;
    });
    eventually("ports union", || {
        rt.block_on(r[2].import("union")).is_some_and(|o| {
            o["spec"]["ports"]
                == json!([{"name": "http", "protocol": "TCP", "port": 80},
                          {"name": "stcp", "protocol": "SCTP", "port": 142}])
        })
    });
    // ...with a conflict all the same, as the conformance suite reads the KEP.
    eventually("a conflict for a union", || {
        rt.block_on(r[1].conditions("union"))
            .iter()
            .any(|c| c.starts_with("Conflict=True PortConflict: Exported ports differ"))
    });
    // Invalid exports: conditions, and no import.
    eventually("ExternalName is not valid", || {
        rt.block_on(r[2].conditions("ext")).iter().any(|c| c.starts_with("Valid=False InvalidServiceType"))
    });
    eventually("no Service is not valid", || {
        rt.block_on(r[2].conditions("nosvc")).iter().any(|c| c.starts_with("Valid=False NoService"))
    });
    assert!(rt.block_on(r[0].import("ext")).is_none());
    assert!(rt.block_on(r[0].import("nosvc")).is_none());

    // The conflict clears when B agrees; the import did not change meanwhile.
    let before = rt.block_on(r[2].import("porty")).expect("porty")["spec"].clone();
    rt.block_on(u[1].service("porty", json!({})));
    eventually("conflict cleared", || {
        rt.block_on(r[1].conditions("porty")).iter().any(|c| c.starts_with("Conflict=False NoConflicts"))
    });
    assert_eq!(rt.block_on(r[2].import("porty")).expect("porty")["spec"], before);
}

#[test]
fn a_standby_takes_over_and_a_crash_mid_reconcile_converges_without_orphans() {
    let clusters = shared();
    let rt = runtime();
    let ns = "sync-ha";
    let u = users(&rt, clusters, ns);
    let r = readers(&rt, clusters, ns);
    let mut first = syncing(clusters, ns, &["--lease-duration", "5", "--identity", "first"]);
    eventually("first leads", || first.leading());
    let second = syncing(clusters, ns, &["--lease-duration", "5", "--identity", "second"]);
    went_round(&rt, &r[0], "second");
    assert!(!second.leading(), "two leaders:\n{}", second.log());

    // Many exports; the leader is killed (no Lease release) mid-reconcile.
    const N: usize = 30;
    rt.block_on(async {
        for i in 0..N {
            u[0].exported_service(&format!("svc-{i}"), &format!("10.9.0.{}", i + 1)).await;
        }
    });
    eventually("some imports written", || rt.block_on(r[2].ours()).0 > 0);
    first.kill();
    let killed = Instant::now();
    eventually("second leads", || second.leading());
    let failover = killed.elapsed();
    assert!(failover < Duration::from_secs(15), "failover took {failover:?}");
    // Meanwhile one export goes; the new leader must remove its objects.
    rt.block_on(u[0].unexport("svc-0"));
    for (i, reader) in r.iter().enumerate() {
        eventually(&format!("{} converged", clusters.name(i)), || {
            rt.block_on(reader.ours()) == (N - 1, N - 1, N - 1)
        });
    }
    // A restarted replica stands by; nothing is duplicated.
    let mut third = syncing(clusters, ns, &["--lease-duration", "5", "--identity", "third"]);
    went_round(&rt, &r[0], "third");
    assert!(!third.leading(), "two leaders:\n{}", third.log());
    for reader in &r {
        assert_eq!(rt.block_on(reader.ours()), (N - 1, N - 1, N - 1));
    }
    // Once every export's conditions are written, a failover with nothing
    // changed writes nothing: the new leader reads what its predecessor
    // applied (the digest on each object, the conditions on each export).
    eventually("every export Ready", || {
        (1..N).all(|i| {
            rt.block_on(r[0].conditions(&format!("svc-{i}"))).iter().any(|c| c.starts_with("Ready=True"))
        })
    });
    // Its writes done, and what they brought back by the watches seen.
    second.settle(0.0, 1.0, "the second's reconciles");
    drop(second);
    eventually("third leads", || third.leading());
    let reconciled = || third.reconciles();
    eventually("third reconciled every service", || reconciled() >= (N - 1) as f64);
    third.settle(0.0, (N - 1) as f64, "the third's reconciles");
    let writes = third.metric("clusterset_dns_sync_writes_total");
    let unchanged = third.metric("clusterset_dns_sync_unchanged_total").unwrap_or(0.0);
    eprintln!("after failover: writes {writes:?}, unchanged {unchanged}");
    assert_eq!(writes, Some(0.0), "writes after a failover with nothing changed:\n{}", third.log());
    assert!(unchanged >= (3 * 3 * (N - 1)) as f64, "the new leader compared what it would write");
    third.stop();
    let third = syncing(clusters, ns, &["--lease-duration", "5", "--identity", "fourth"]);
    eventually("fourth leads", || third.leading());
    rt.block_on(async {
        for i in 1..N {
            u[0].unexport(&format!("svc-{i}")).await;
        }
    });
    for reader in &r {
        eventually("all gone", || rt.block_on(reader.ours()) == (0, 0, 0));
    }
    eprintln!("failover in {failover:?}");
}

/// The `renewTime` of the Lease a replica (`--identity`) writes of itself
/// beside the shards' (in the Leases' cluster, the first member: `r`'s).
fn replica_renewed(rt: &tokio::runtime::Runtime, r: &Reader, identity: &str) -> Option<String> {
    rt.block_on(async {
        let leases: Api<Lease> = Api::namespaced(r.client.clone(), "clusterset-dns");
        let lp = ListParams::default().labels("clusterset-dns.io/lease-role=replica");
        let l = leases
            .list(&lp)
            .await
            .expect("list Leases")
            .items
            .into_iter()
            .find(|l| l.spec.as_ref().and_then(|s| s.holder_identity.as_deref()) == Some(identity))?;
        serde_json::to_value(l.spec?.renew_time?).ok()?.as_str().map(str::to_owned)
    })
}

/// Waits until replica `identity` has had a whole round of its election:
/// its own Lease written, then renewed in a later round (a third of the
/// Lease duration on). The first round took every shard it could (its
/// steps run in order: its own Lease first, then the shards'), so a
/// standby that is not leading by then stands by.
fn went_round(rt: &tokio::runtime::Runtime, r: &Reader, identity: &str) {
    let mut first = None;
    eventually(&format!("{identity}'s election went round"), || {
        let now = replica_renewed(rt, r, identity);
        if first.is_none() {
            first = now;
            return false;
        }
        now.is_some() && now != first
    });
}

/// Watches the API server of cluster `i` is serving now, from its own
/// `/metrics` (read as admin).
fn watches(clusters: &TestClusters, i: usize) -> f64 {
    let (scrape, _) = crate::deploy::kubectl_ok(&clusters.kubeconfig(i), &["get", "--raw", "/metrics"], "");
    scrape
        .lines()
        .filter(|l| l.starts_with("apiserver_longrunning_requests{") && l.contains("verb=\"WATCH\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
fn a_leader_paused_past_its_lease_writes_nothing_once_it_knows() {
    // Its own cluster (one member): the API server's count of open watches
    // is then ours and its own, nobody else's.
    let clusters = TestClusters::start(1);
    let rt = runtime();
    let ns = "sync-lost-lease";
    let u = users(&rt, &clusters, ns);
    let r = readers(&rt, &clusters, ns);
    let quiet = watches(&clusters, 0);
    let first = syncing(&clusters, ns, &["--lease-duration", "5", "--identity", "first"]);
    eventually("first leads", || first.leading());
    std::thread::sleep(Duration::from_secs(2));
    let one = watches(&clusters, 0) - quiet;
    // The second takes over once the first's 5 s Lease runs out, and holds
    // it for 30 s at a time: on a starved machine a missed renewal of its
    // own would otherwise hand the Lease back to the first, whose writes
    // would then be right and fail the check below.
    let second = syncing(&clusters, ns, &["--lease-duration", "30", "--identity", "second"]);
    let export = |i: usize| {
        rt.block_on(async {
            u[0].exported_service(&format!("svc-{i}"), &format!("10.9.1.{}", i + 1)).await;
        })
    };
    for i in 0..5 {
        export(i);
    }
    eventually("first synced 5 services", || rt.block_on(r[0].ours()) == (5, 5, 5));
    let writes = |s: &Syncing| s.metric("clusterset_dns_sync_writes_total").unwrap_or(-1.0);
    // Its writes so far counted: every reconcile ended.
    first.settle(0.0, 5.0, "the first's reconciles");
    let before = writes(&first);
    // Every replica runs the watches once: a standby's view of the fleet is
    // current when it takes over, and two replicas keep twice one's open.
    let per_replica = within(Duration::from_secs(10), || watches(&clusters, 0) - quiet == 2.0 * one);
    let both = watches(&clusters, 0);
    assert!(per_replica && one > 0.0, "watches: {quiet} without sync, {one} more with one, {both} with two");
    // Paused past its lease: the standby takes over meanwhile.
    first.signal("STOP");
    let paused = Instant::now();
    // A change the frozen leader's watches deliver when it runs again: it
    // would write it before it learns it lost the Lease, were it not fenced.
    export(5);
    // It waits out the longer of the first's Lease and its own duration.
    let took = within(Duration::from_secs(45), || second.leading());
    assert!(took, "second leads: not within 45 s:\n{}", second.log());
    let took_over = paused.elapsed();
    first.signal("CONT");
    let resumed = Instant::now();
    eventually("first learns it lost the Lease", || first.log().contains("lost the Lease"));
    let noticed = resumed.elapsed();
    assert_eq!(first.metric("clusterset_dns_sync_leader"), Some(0.0));
    // Whatever it started since it was resumed has ended (and its writes,
    // had it sent any, are counted).
    first.settle(0.0, 0.0, "the old leader's reconciles");
    let at_loss = writes(&first);
    // Fenced: once resumed, before it learnt it lost the Lease, it sent
    // nothing (its fence had run out with the Lease).
    assert_eq!(at_loss, before, "the old leader wrote after it was resumed:\n{}", first.log());
    eprintln!(
        "second led {took_over:?} after the pause; first noticed {noticed:?} after resuming, \
         with {} writes in between; watches: {quiet} without sync, {both} with two replicas",
        at_loss - before
    );
    // Changes the old leader would act on if anything of it still ran: new
    // exports, an export gone, one of our slices deleted by hand.
    for i in 6..8 {
        export(i);
    }
    rt.block_on(u[0].unexport("svc-0"));
    rt.block_on(async {
        let slices: Api<EndpointSlice> = Api::namespaced(clusters.client(0).await, ns);
        let ours = slices.list_metadata(&ListParams::default().labels(OURS)).await.expect("list");
        // Not svc-0's: the new leader is deleting that one meanwhile.
        let name = ours
            .items
            .iter()
            .filter_map(|s| s.metadata.name.clone())
            .find(|n| n.starts_with("svc-1-"))
            .expect("svc-1's slice");
        slices.delete(&name, &Default::default()).await.expect("delete slice");
    });
    eventually("second synced 7 services", || rt.block_on(r[0].ours()) == (7, 7, 7));
    // The second has had every change (it acted on them), so the first's
    // watches have been sent them too: the API server hands each event to
    // all the watches of its kind at once. Once the first is idle, any
    // reconcile they started in it has ended, its writes counted.
    first.settle(0.0, 0.0, "the old leader after the changes");
    assert!(writes(&second) > 0.0, "the new leader wrote the changes");
    assert!(second.leading(), "the second still leads:\n{}", second.log());
    assert_eq!(writes(&first), at_loss, "the old leader wrote after it lost the Lease:\n{}", first.log());
}

#[test]
fn services_asking_for_it_are_exported_and_unexported() {
    let clusters = shared();
    let rt = runtime();
    let ns = "sync-auto";
    let team = "autoexp-team";
    let u = users(&rt, clusters, ns);
    let r = readers(&rt, clusters, ns);
    let t = rt.block_on(User::new(clusters, 0, team));
    let rt_team = rt.block_on(Reader::new(clusters, 0, team));
    let sync = syncing(
        clusters,
        ns,
        &["--no-leader-election", "--namespace", team, "--auto-export-namespace-prefix", "autoexp-"],
    );
    let yes = json!({"clusterset-dns.io/export": "true"});
    rt.block_on(async {
        u[0].annotated_service("annotated", json!({}), yes.clone()).await;
        u[0].annotated_service("kosmos", json!({}), json!({"kosmos.io/auto-create-mcs": "true"})).await;
        u[0].service("manual", json!({})).await;
        u[0].export("manual").await;
        u[0].service("plain", json!({})).await;
        t.service("teamsvc", json!({"ports": [{"name": "grpc", "protocol": "TCP", "port": 9090}]})).await;
    });
    for name in ["annotated", "kosmos", "manual"] {
        eventually(&format!("{name} imported"), || rt.block_on(r[2].import(name)).is_some());
    }
    eventually("prefix namespace exported", || rt.block_on(rt_team.import("teamsvc")).is_some());
    // Ports come from the Service.
    let team_import = rt.block_on(rt_team.import("teamsvc")).expect("teamsvc");
    assert_eq!(team_import["spec"]["ports"], json!([{"name": "grpc", "protocol": "TCP", "port": 9090}]));
    assert!(rt.block_on(r[2].import("plain")).is_none(), "a Service not asking is not exported");

    // Removing the annotation removes the export the controller made, and
    // the import with it; a user's own export is never touched. `manual`
    // first: once `annotated`'s import is gone, the controller has had
    // both changes (one watch, in order), and once it is idle it has
    // reconciled `manual` (and removed its export, were it to).
    rt.block_on(async {
        u[0].annotated_service("manual", json!({}), json!({})).await;
        u[0].annotated_service("annotated", json!({}), json!({})).await;
    });
    eventually("annotated unexported", || rt.block_on(r[2].import("annotated")).is_none());
    sync.settle(0.0, 1.0, "the annotations' removal reconciled");
    assert!(rt.block_on(r[0].export_created("manual")).is_some(), "the user's export was removed");
    assert!(rt.block_on(r[2].import("manual")).is_some(), "the user's export was removed");
}

#[test]
fn consumer_clusters_choose_which_members_import_and_follow_every_change() {
    let clusters = shared();
    let rt = runtime();
    let ns = "sync-consumers";
    let u = users(&rt, clusters, ns);
    let r = readers(&rt, clusters, ns);
    let _sync = syncing(clusters, ns, &["--no-leader-election"]);
    let (c1, c2, c3) = (clusters.name(0), clusters.name(1), clusters.name(2));
    const CONSUMERS: &str = "clusterset-dns.io/consumer-clusters";
    // Which members hold the import (and each member's objects of ours).
    let imported =
        |name: &str| -> Vec<bool> { r.iter().map(|m| rt.block_on(m.import(name)).is_some()).collect() };
    let settle = |what: &str, name: &str, want: [bool; 3]| {
        eventually(what, || imported(name) == want);
        // Members outside the list hold nothing of ours for the service.
        for (i, m) in r.iter().enumerate() {
            if !want[i] {
                eventually(&format!("{what}: nothing in {}", clusters.name(i)), || {
                    rt.block_on(m.ours()).0 == 0
                });
            }
        }
    };
    rt.block_on(async {
        u[0].service("ledger", json!({})).await;
        u[0].endpoints("ledger-a", "ledger", json!([{"addresses": ["10.1.0.9"]}])).await;
        u[0].annotated_export("ledger", json!({ CONSUMERS: format!("{c1}, {c3}") })).await;
    });
    settle("imported into the listed members only", "ledger", [true, false, true]);
    // The status is written after the imports: wait for it.
    let says = format!("Ready=True Exported: Imported into {c1}, {c3} only");
    eventually("Ready says where", || {
        rt.block_on(r[0].conditions("ledger")).iter().any(|c| c.starts_with(&says))
    });
    // serve in a listed member answers; the others have nothing to answer.
    let s = serve_in(clusters, 2, ns);
    let ledger = format!("ledger.{ns}.svc.clusterset.local");
    eventually("ledger answered in cluster-3", || short(&s, &ledger, "A").len() == 1);

    // A change of the list adds and removes imports.
    rt.block_on(u[0].annotated_export("ledger", json!({ CONSUMERS: c2 })));
    settle("moved to the new list", "ledger", [false, true, false]);
    eventually("gone from cluster-3's answers", || rcode(&s, &ledger) == "NXDOMAIN");
    // Not a list: imported nowhere, and the condition says why.
    rt.block_on(u[0].annotated_export("ledger", json!({ CONSUMERS: "cluster-2,Not_A_Cluster" })));
    settle("an invalid list imports nowhere", "ledger", [false, false, false]);
    eventually("Ready=False names the annotation", || {
        rt.block_on(r[0].conditions("ledger"))
            .iter()
            .any(|c| c.starts_with("Ready=False InvalidConsumerClusters") && c.contains("Not_A_Cluster"))
    });
    // No list: every member, as without the annotation.
    rt.block_on(u[0].annotated_export("ledger", json!({})));
    settle("every member again", "ledger", [true, true, true]);
    rt.block_on(u[0].unexport("ledger"));
    settle("unexported", "ledger", [false, false, false]);

    // Auto-export passes the Service's list on to the export it creates.
    rt.block_on(async {
        let ask = json!({"clusterset-dns.io/export": "true", CONSUMERS: c3});
        u[1].annotated_service("invoices", json!({}), ask).await;
    });
    settle("auto-exported to the Service's list", "invoices", [false, false, true]);
    rt.block_on(async {
        let ask = json!({"clusterset-dns.io/export": "true", CONSUMERS: format!("{c1},{c2}")});
        u[1].annotated_service("invoices", json!({}), ask).await;
    });
    settle("the Service's new list reaches the export", "invoices", [true, true, false]);
}

#[test]
fn an_unreachable_member_is_kept_and_marked_or_removed_after_the_window() {
    // Its own clusters: this test stops an API server.
    let clusters = TestClusters::start(2);
    let rt = runtime();
    let ns = "sync-lost";
    let u = users(&rt, &clusters, ns);
    let r = readers(&rt, &clusters, ns);
    rt.block_on(async {
        for (user, ip) in [(&u[0], "10.1.0.1"), (&u[1], "10.2.0.1")] {
            user.service("web", json!({"clusterIP": "None"})).await;
            user.endpoints("web-x", "web", json!([{"addresses": [ip]}])).await;
            user.export("web").await;
        }
    });
    let reachable = |r: &Reader| rt.block_on(r.condition("web", "clusterset-dns.io/SourcesReachable"));
    // Keep (the default): B's endpoints stay in A, marked, and the metric says how stale.
    {
        let sync = syncing(&clusters, ns, &["--no-leader-election"]);
        eventually("both clusters' slices in A", || rt.block_on(r[0].ours()) == (1, 0, 2));
        assert_eq!(reachable(&r[0]).as_deref(), Some("True"));
        // DNS in A, fed by A's own API, sees both clusters...
        let dns = serve_in(&clusters, 0, ns);
        let web = format!("web.{ns}.svc.clusterset.local");
        eventually("both clusters answered in A", || short(&dns, &web, "A") == ["10.1.0.1", "10.2.0.1"]);
        clusters.stop(1, Component::ApiServer);
        eventually("marked unreachable", || reachable(&r[0]).as_deref() == Some("False"));
        // Ready on A's export names the member its import could not reach.
        let except = format!("except {}: unreachable", clusters.name(1));
        eventually("Ready names the unreachable member", || {
            rt.block_on(r[0].conditions("web"))
                .iter()
                .any(|c| c.starts_with("Ready=True") && c.contains(&except))
        });
        assert_eq!(rt.block_on(r[0].ours()), (1, 0, 2), "endpoints of the unreachable member were removed");
        // ...and demotes the unreachable one the import names (kept, not deleted).
        eventually("B demoted in A's answers", || short(&dns, &web, "A") == ["10.1.0.1"]);
        let metrics = sync.get("/metrics");
        let stale: f64 = metrics
            .lines()
            .find(|l| {
                l.starts_with(&format!(
                    "clusterset_dns_sync_member_stale_seconds{{member=\"{}\"}}",
                    clusters.name(1)
                ))
            })
            .and_then(|l| l.split_whitespace().last())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no staleness for {}:\n{metrics}", clusters.name(1)));
        assert!(stale > 0.0, "{metrics}");
        clusters.start_component(1, Component::ApiServer);
        eventually("reachable again", || reachable(&r[0]).as_deref() == Some("True"));
        eventually("B answered again in A", || short(&dns, &web, "A") == ["10.1.0.1", "10.2.0.1"]);
    }
    // Remove after the window: B's endpoints leave A, and come back with B.
    eventually("B's API answers", || rt.block_on(r[1].import("web")).is_some());
    let sync = syncing(
        &clusters,
        ns,
        &["--no-leader-election", "--on-member-lost", "remove", "--member-lost-after", "3"],
    );
    eventually("both again", || rt.block_on(r[0].ours()) == (1, 0, 2));
    // The window counts from this controller's first failed read of B: wait
    // until each of its watches of B has listed and none is failing (right
    // after B's restart above, a first watch may fail and would start the
    // window before the stop).
    let fresh = format!("clusterset_dns_sync_member_stale_seconds{{member=\"{}\"}}", clusters.name(1));
    let listed = |kind: &str| format!("watch listed watch={kind} in {ns} of member {}", clusters.name(1));
    eventually("the new controller reads B", || {
        let log = sync.log();
        ["Services", "ServiceExports", "EndpointSlices"].iter().all(|k| log.contains(&listed(k)))
            && sync.metric(&fresh) == Some(0.0)
    });
    // From before the stop: B's API stops answering at some point during
    // it (a loaded machine's API server takes seconds to go), so the window
    // ends at least 3 s after this instant.
    let stopped = Instant::now();
    clusters.stop(1, Component::ApiServer);
    eventually("B's endpoints removed from A", || rt.block_on(r[0].ours()) == (1, 0, 1));
    assert!(
        stopped.elapsed() >= Duration::from_secs(3),
        "removed before the window: {:?}",
        stopped.elapsed()
    );
    let o = rt.block_on(r[0].import("web")).expect("import");
    assert_eq!(o["status"]["clusters"], json!([{"cluster": clusters.name(0)}]));
    clusters.start_component(1, Component::ApiServer);
    eventually("B's endpoints back", || rt.block_on(r[0].ours()) == (1, 0, 2));
}

#[test]
fn run_serves_dns_and_syncs_in_one_process() {
    let clusters = shared();
    let rt = runtime();
    let ns = "sync-run";
    let u = users(&rt, clusters, ns);
    let r = readers(&rt, clusters, ns);
    let mut args: Vec<String> = vec![
        "--kubeconfig".into(),
        clusters.serve_kubeconfig(2).display().to_string(),
        "--namespace".into(),
        ns.into(),
        "--lease-name".into(),
        format!("sync-{ns}"),
        "--sync-http-listen".into(),
        "127.0.0.1:0".into(),
    ];
    for i in 0..clusters.len() {
        args.push("--cluster".into());
        args.push(format!("{}={}", clusters.name(i), clusters.role_kubeconfig(i, "sync").display()));
    }
    let s = Served::start_as("run", &args.iter().map(String::as_str).collect::<Vec<_>>());
    eventually("ready", || s.get("/ready").0 == 200);
    rt.block_on(async {
        u[0].service("web", json!({})).await;
        u[0].export("web").await;
    });
    let web = format!("web.{ns}.svc.clusterset.local");
    let mut vip = String::new();
    eventually("import in C", || {
        let o = rt.block_on(r[2].import("web"));
        vip = o.and_then(|o| o["spec"]["ips"][0].as_str().map(str::to_owned)).unwrap_or_default();
        !vip.is_empty()
    });
    eventually("answered by the same process", || short(&s, &web, "A") == [vip.clone()]);
    rt.block_on(u[0].unexport("web"));
    eventually("gone", || rcode(&s, &web) == "NXDOMAIN");
}

#[test]
fn a_controller_that_dies_fails_health_and_ends_sync_non_zero() {
    let clusters = shared();
    let mut sync =
        syncing_env(clusters, "dies", &["--no-leader-election"], &[("CLUSTERSET_DNS_FAULT", "controller")]);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = sync.try_wait() {
            break status;
        }
        assert!(std::time::Instant::now() < deadline, "sync still running:\n{}", sync.log());
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!status.success(), "{status}");
    let log = sync.log();
    assert!(log.contains("task controller panicked and cannot be restarted"), "{log}");
}
