//! `sync --shards`: replicas split the services between them on Leases, on
//! real clusters. Every write is attributed from the API servers' own audit
//! logs (each replica's User-Agent names it), not from what the replicas
//! say of themselves.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::harness::clusters::{TestClusters, shared};
use crate::harness::syncing::Syncing;
use crate::harness::{eventually, within};
use crate::sync::{readers, syncing, users};
use crate::watch::runtime;

/// Our writes, at the metadata level: who sent each, to which object.
const AUDIT_POLICY: &str = r#"apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    verbs: [create, update, patch, delete]
    resources:
      - group: ""
        resources: [services]
      - group: discovery.k8s.io
        resources: [endpointslices]
      - group: multicluster.x-k8s.io
        resources: [serviceimports, serviceimports/status, serviceexports/status]
  - level: None
"#;

/// Per object written by a `sync` replica (cluster, resource, namespace,
/// name, subresource), the replicas that wrote it, from every cluster's
/// audit log.
fn writers(clusters: &TestClusters, ns: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut by_object: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for i in 0..clusters.len() {
        let log = std::fs::read_to_string(clusters.apiserver_log(i)).expect("apiserver log");
        for line in log.lines().filter(|l| l.starts_with('{') && l.contains("audit.k8s.io")) {
            let Ok(e) = serde_json::from_str::<serde_json::Value>(line) else { continue };
            let s = |p: &str| e.pointer(p).and_then(|v| v.as_str()).unwrap_or("").to_owned();
            if s("/stage") != "ResponseComplete" || s("/objectRef/namespace") != ns {
                continue;
            }
            let Some(who) = s("/userAgent").split(" sync/").nth(1).map(str::to_owned) else { continue };
            let object = format!(
                "{} {}/{} {} {}",
                clusters.name(i),
                s("/objectRef/resource"),
                s("/objectRef/subresource"),
                s("/objectRef/name"),
                s("/verb")
            );
            by_object.entry(object).or_default().insert(who);
        }
    }
    by_object
}

/// The shards a replica leads, by its metrics.
fn led(s: &Syncing, shards: usize) -> Vec<usize> {
    let scrape = s.get("/metrics");
    (0..shards)
        .filter(|i| {
            crate::harness::http::metric_value(
                &scrape,
                &format!("clusterset_dns_sync_shard_leader{{shard=\"{i}\"}}"),
            ) == Some(1.0)
        })
        .collect()
}

#[test]
fn two_replicas_split_the_shards_and_the_survivor_takes_them_all() {
    let dir = tempfile::tempdir().expect("tempdir");
    let policy = dir.path().join("audit-policy.yaml");
    std::fs::write(&policy, AUDIT_POLICY).expect("write policy");
    // Own clusters: their API servers write an audit log to their log.
    let audit = format!("--audit-policy-file={} --audit-log-path=-", policy.display());
    let clusters = TestClusters::start_env(2, &[("CLUSTERS_APISERVER_ARGS", &audit)]);
    let rt = runtime();
    let ns = "sync-shards";
    let u = users(&rt, &clusters, ns);
    let r = readers(&rt, &clusters, ns);
    let replica =
        |id: &str| syncing(&clusters, ns, &["--lease-duration", "5", "--shards", "4", "--identity", id]);
    let mut a = replica("replica-a");
    eventually("a leads every shard", || led(&a, 4).len() == 4);
    let b = replica("replica-b");
    // b waits; a gives up what is above its fair share; b takes it at once.
    eventually("the shards split two and two", || led(&a, 4).len() == 2 && led(&b, 4).len() == 2);
    let (of_a, of_b) = (led(&a, 4), led(&b, 4));
    assert!(of_a.iter().all(|s| !of_b.contains(s)), "a shard led twice: {of_a:?} {of_b:?}");

    // A replica with another --shards refuses to run beside them.
    let mut other =
        syncing(&clusters, ns, &["--lease-duration", "5", "--shards", "2", "--identity", "replica-other"]);
    assert!(within(Duration::from_secs(20), || other.try_wait().is_some()), "it ran:\n{}", other.log());
    assert!(!other.try_wait().is_some_and(|s| s.success()));
    assert!(
        other.log().contains("--shards 2, but replica") && other.log().contains("runs with --shards 4"),
        "the refusal names both values:\n{}",
        other.log()
    );

    const N: usize = 24;
    let export = |i: usize| {
        rt.block_on(async {
            u[0].exported_service(&format!("svc-{i}"), &format!("10.9.3.{}", i + 1)).await;
        })
    };
    for i in 0..N {
        export(i);
    }
    for (i, reader) in r.iter().enumerate() {
        eventually(&format!("{} has every import", clusters.name(i)), || {
            rt.block_on(reader.ours()) == (N, N, N)
        });
    }
    eventually("every export Ready", || {
        (0..N).all(|i| {
            rt.block_on(r[0].conditions(&format!("svc-{i}"))).iter().any(|c| c.starts_with("Ready=True"))
        })
    });
    // Every write of both made (and in the API servers' audit logs).
    a.settle(0.0, 1.0, "a's reconciles");
    b.settle(0.0, 1.0, "b's reconciles");
    // Both wrote, and no object was written by both.
    let split = writers(&clusters, ns);
    let who: BTreeSet<&String> = split.values().flatten().collect();
    assert_eq!(who.len(), 2, "writers: {who:?}");
    let twice: Vec<_> = split.iter().filter(|(_, w)| w.len() > 1).collect();
    assert!(twice.is_empty(), "written by two replicas: {twice:#?}");

    // a dies without giving anything up: b takes its shards once their
    // Leases have been unchanged for the lease duration, and writes nothing
    // for them (nothing changed).
    let writes = |s: &Syncing| s.metric("clusterset_dns_sync_writes_total").unwrap_or(-1.0);
    let before = writes(&b);
    // A shard taken is read from every member, then its services are
    // queued, which b logs per shard.
    let read = |s: &Syncing| s.log().matches("leading the shard: reconciling its services").count();
    let (held, read_before, since) = (led(&b, 4).len(), read(&b), b.reconciles());
    a.kill();
    let killed = Instant::now();
    eventually("b leads every shard", || led(&b, 4).len() == 4);
    let took = killed.elapsed();
    eventually("b read the shards it took", || read(&b) >= read_before + 4 - held);
    b.settle(since, 1.0, "b reconciled the services of the shards it took");
    assert_eq!(writes(&b), before, "writes after taking over shards with nothing changed:\n{}", b.log());
    // It keeps converging: one export more, one gone.
    export(N);
    rt.block_on(u[0].unexport("svc-0"));
    for (i, reader) in r.iter().enumerate() {
        eventually(&format!("{} converged", clusters.name(i)), || rt.block_on(reader.ours()) == (N, N, N));
    }
    eprintln!("takeover of a killed replica's shards: {took:?} (lease 5 s)");
    assert!(took < Duration::from_secs(15), "takeover took {took:?}");
}

#[test]
fn a_replica_that_cannot_read_the_leases_leads_nothing_and_says_so() {
    let clusters = shared();
    let dir = tempfile::tempdir().expect("tempdir");
    // A kubeconfig whose server refuses every connection.
    let text = std::fs::read_to_string(clusters.role_kubeconfig(0, "sync")).expect("kubeconfig");
    let server = clusters.server(0);
    let dead = dir.path().join("dead.kubeconfig");
    std::fs::write(&dead, text.replace(&server, "https://127.0.0.1:1")).expect("write");
    let s = syncing(
        clusters,
        "sync-no-lease",
        &["--lease-duration", "5", "--lease-kubeconfig", dead.to_str().expect("UTF-8")],
    );
    eventually("/ready says why", || {
        let (code, body) = crate::harness::http::http_get(s.http(), "/ready");
        code == 503 && body.contains("cannot read the Leases")
    });
    assert!(s.log().contains("cannot read the Leases"), "{}", s.log());
    assert_eq!(s.metric("clusterset_dns_sync_leader"), Some(0.0));
    let (code, _) = crate::harness::http::http_get(s.http(), "/health");
    assert_eq!(code, 200, "alive: only not ready");
}
