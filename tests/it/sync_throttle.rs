//! The sync controller and request rates, on real clusters: an API server
//! that refuses most of its requests (429, `--max-requests-inflight=1`)
//! slows the controller down without stopping it or making it storm, and
//! the controller's own client-side limit (`--kube-qps`, `--kube-burst`)
//! holds its request rate per member.

use std::time::{Duration, Instant};

use kube::api::{Api, DynamicObject, ListParams};
use serde_json::{Value, json};

use crate::deploy::kubectl_ok;
use crate::harness::clusters::{TestClusters, shared};
use crate::harness::syncing::Syncing;
use crate::harness::within;
use crate::sync::users;
use crate::watch::{import_resource, runtime};

const OURS: &str = "app.kubernetes.io/managed-by=clusterset-dns-sync";

/// Requests the API server of cluster `i` refused with 429 because of its
/// in-flight limit, from its own `/metrics` (read as admin, which the limit
/// never refuses).
fn refused(clusters: &TestClusters, i: usize) -> f64 {
    let (scrape, _) = kubectl_ok(&clusters.kubeconfig(i), &["get", "--raw", "/metrics"], "");
    // One series per resource, verb and code; a refusal of the in-flight
    // limit is code 429 (v1.33 has no apiserver_dropped_requests_total).
    scrape
        .lines()
        .filter(|l| l.starts_with("apiserver_request_terminations_total{") && l.contains("code=\"429\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Every import of ours in namespace `ns` of cluster `c`, by name, as its
/// ports `port/protocol`.
async fn imports(c: &kube::Client, ns: &str) -> Vec<(String, Vec<String>)> {
    let api: Api<DynamicObject> = Api::namespaced_with(c.clone(), ns, &import_resource("v1beta1"));
    let mut found: Vec<(String, Vec<String>)> = api
        .list(&ListParams::default().labels(OURS))
        .await
        .expect("list ServiceImports")
        .items
        .into_iter()
        .map(|o| {
            let ports = o.data.pointer("/spec/ports").and_then(Value::as_array).cloned().unwrap_or_default();
            let ports =
                ports.iter().map(|p| format!("{}/{}", p["port"], p["protocol"].as_str().unwrap_or("")));
            (o.metadata.name.unwrap_or_default(), ports.collect())
        })
        .collect();
    found.sort();
    found
}

/// `n` services exported from cluster-1 (admin writes: never refused),
/// each with one port, 8000 + its number.
fn export_many(rt: &tokio::runtime::Runtime, u: &[crate::fleet::User], n: usize) {
    rt.block_on(async {
        for i in 0..n {
            let name = format!("svc-{i:02}");
            let port = json!([{"name": "http", "protocol": "TCP", "port": 8000 + i}]);
            u[0].service(&name, json!({"ports": port})).await;
            let addr = format!("10.9.0.{}", i + 1);
            u[0].endpoints(&format!("{name}-a"), &name, json!([{"addresses": [addr]}])).await;
            u[0].export(&name).await;
        }
    });
}

fn wanted(n: usize) -> Vec<(String, Vec<String>)> {
    (0..n).map(|i| (format!("svc-{i:02}"), vec![format!("{}/TCP", 8000 + i)])).collect()
}

#[test]
fn a_throttling_api_server_slows_sync_down_but_it_converges_without_a_storm() {
    // Its own clusters: API servers that run one request at a time (one
    // mutating), API Priority and Fairness off (scripts/clusters.sh), so
    // the controller's concurrent requests are refused with 429.
    let clusters = TestClusters::start_env(
        2,
        &[("CLUSTERS_APISERVER_ARGS", "--max-requests-inflight=1 --max-mutating-requests-inflight=1")],
    );
    let rt = runtime();
    let ns = "throttled";
    let u = users(&rt, &clusters, ns);
    const N: usize = 30;
    // Everything exists before sync starts: its start is one burst of
    // lists and ~5 writes per service and member.
    export_many(&rt, &u, N);
    let before: f64 = (0..2).map(|i| refused(&clusters, i)).sum();
    let c: Vec<kube::Client> =
        rt.block_on(async { vec![clusters.client(0).await, clusters.client(1).await] });
    // serve on cluster-2 starts with sync: its lists and watches meet the
    // same refusals.
    let serve = crate::watch::serve(&clusters.serve_kubeconfig(1), ns);
    let started = Instant::now();
    let sync = Syncing::start(&clusters, &["--no-leader-election", "--namespace", ns], &[]);
    let converged =
        within(Duration::from_secs(240), || (0..2).all(|i| rt.block_on(imports(&c[i], ns)) == wanted(N)));
    let took = started.elapsed();
    let refused_during: f64 = (0..2).map(|i| refused(&clusters, i)).sum::<f64>() - before;
    let gave_up = sync.metric("clusterset_dns_sync_errors_total{reason=\"throttled\"}").unwrap_or(0.0);
    let writes = sync.metric("clusterset_dns_sync_writes_total").unwrap_or(0.0);
    eprintln!(
        "throttled API servers: converged {converged} in {took:?}; {refused_during} requests refused (429), \
         {writes} writes, {gave_up} reconciles failed on 429 after the client's retries"
    );
    assert!(converged, "every import in both members with its port, within 240 s:\n{}", sync.log());
    // The premise: the API servers did refuse the controller.
    assert!(refused_during > 0.0, "no request was refused: the test throttles nothing");
    // No storm: each refused request waits for the server's Retry-After (1 s)
    // before it is sent again, and at most 64 services and a few lists are
    // in flight at once; without backoff the count would be thousands a second.
    let per_second = refused_during / took.as_secs_f64();
    assert!(per_second < 100.0, "{refused_during} refusals in {took:?}: a retry storm");
    // Converged means quiet: nothing is refused (nothing is sent) any more.
    std::thread::sleep(Duration::from_secs(5));
    let after: f64 = (0..2).map(|i| refused(&clusters, i)).sum();
    std::thread::sleep(Duration::from_secs(5));
    let later: f64 = (0..2).map(|i| refused(&clusters, i)).sum();
    assert_eq!(later, after, "requests still refused after convergence: the controller keeps retrying");
    let exports = sync.reconciles();
    assert!(exports >= N as f64, "{exports} reconciles for {N} services");
    // Nobody but sync touches its objects here: a list that arrived after
    // a slow batch of writes must not make them look deleted or edited.
    let log = sync.log();
    let mistaken =
        log.lines().filter(|l| l.contains("ours, and gone") || l.contains("by someone else")).count();
    assert_eq!(mistaken, 0, "{mistaken} of sync's own objects taken for someone else's doing");
    // serve answers every import (a VIP each), its client's retries bounded
    // as sync's are, never kube's default minutes per request.
    let answered = |i: usize| {
        !crate::watch::short(&serve, &format!("svc-{i:02}.{ns}.svc.clusterset.local."), "A").is_empty()
    };
    let all = within(Duration::from_secs(60), || (0..N).all(answered));
    assert!(all, "serve on cluster-2 answers all {N} services:\n{}", serve.log());
}

#[test]
fn sync_keeps_each_members_requests_under_kube_qps() {
    let clusters = shared();
    let rt = runtime();
    let ns = "sync-qps";
    let u = users(&rt, clusters, ns);
    const N: usize = 10;
    export_many(&rt, &u, N);
    let c: Vec<kube::Client> = rt
        .block_on(async { futures::future::join_all((0..clusters.len()).map(|i| clusters.client(i))).await });
    let started = Instant::now();
    let sync = Syncing::start(
        clusters,
        &[
            "--no-leader-election",
            "--namespace",
            ns,
            "--lease-name",
            "sync-qps",
            "--kube-qps",
            "5",
            "--kube-burst",
            "2",
        ],
        &[],
    );
    let converged = within(Duration::from_secs(120), || {
        (0..clusters.len()).all(|i| rt.block_on(imports(&c[i], ns)) == wanted(N))
    });
    let took = started.elapsed().as_secs_f64();
    assert!(converged, "every import in every member within 120 s:\n{}", sync.log());
    let writes = sync.metric("clusterset_dns_sync_writes_total").unwrap_or(0.0);
    let metric = |name: &str, i: usize| {
        sync.metric(&format!("{name}{{member=\"{}\"}}", clusters.name(i))).unwrap_or(0.0)
    };
    let throttled: Vec<f64> =
        (0..clusters.len()).map(|i| metric("clusterset_dns_sync_client_throttled_total", i)).collect();
    let waited: Vec<f64> = (0..clusters.len())
        .map(|i| metric("clusterset_dns_sync_client_throttled_seconds_total", i))
        .collect();
    eprintln!(
        "--kube-qps 5: {writes} writes in {took:.1} s; throttled per member {throttled:?}, waited {waited:?} s"
    );
    // Each member's client sends at most 5 a second after a burst of 2, and
    // writes are only part of its requests (lists are the rest).
    let most = clusters.len() as f64 * (5.0 * took + 2.0);
    assert!(writes <= most, "{writes} writes in {took:.1} s to {} members: over --kube-qps", clusters.len());
    for (i, (t, w)) in throttled.iter().zip(&waited).enumerate() {
        assert!(*t > 0.0 && *w > 0.0, "{}: no request waited (throttled {t}, {w} s)", clusters.name(i));
    }
}
