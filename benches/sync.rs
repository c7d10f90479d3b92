//! The sync controller on real clusters (`scripts/clusters.sh`), the real
//! release binary: `clusterset-dns sync` (leader election on) and a standby.
//! On three clusters, with `serve` on the third cluster's own API: a
//! ServiceExport created in the first → answer served by the third, 50
//! times, then 50 more with the second cluster's kube-apiserver frozen
//! (SIGSTOP) and the time until it holds every import once thawed; then
//! 1,000 exports across the three. On ten clusters: 100
//! exports. For both: time until every member holds every import with a
//! VIP, API writes per export, CPU and memory, writes when Services change
//! in ways that do not matter (none expected), and writes after the leader
//! hands over to the standby with nothing changed (none expected).
//!
//! `cargo bench --bench sync`; see `common` for how bench targets run.

#![allow(clippy::print_stdout)]

#[path = "../tests/harness/mod.rs"]
mod harness;

mod common;

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use clusterset_dns::k8s::mcs::mcs_resource;
use hickory_proto::rr::Name;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::{Value, json};

use common::dns::Dns;
use common::objects::{create_all, import_resource, slice_resource, timed_call};
use common::report::{row, secs};
use common::{SERVER_READY_TIMEOUT, main_of, serve, start_clusters};
use harness::clusters::TestClusters;
use harness::process::Frozen;
use harness::procfs::{cpu_seconds, loadavg};
use harness::syncing::Syncing;

fn main() {
    main_of("sync", sync_bench);
}

/// Exports timed one by one from cluster A to an answer in cluster C.
const SYNC_CHANGES: usize = 50;
/// Exports created at once across the three clusters.
const SYNC_SCALE: usize = 1000;
/// How long `SYNC_SCALE` exports may take to converge before the bench fails.
const SYNC_CONVERGE_TIMEOUT: Duration = Duration::from_secs(300);
/// Clusters of the second fleet, and the exports spread over them.
const FLEET_CLUSTERS: usize = 10;
const FLEET_SCALE: usize = 100;
/// How long a standby may take to lead once the leader gave up the Lease.
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(60);

fn sync_bench(rt: &tokio::runtime::Runtime) -> Result<()> {
    println!("\n## sync controller on 3 clusters");
    let clusters = start_clusters(3);
    let mut clients = Vec::new();
    for i in 0..3 {
        clients.push(rt.block_on(clusters.client(i)));
    }
    for c in &clients {
        let api: Api<Namespace> = Api::all(c.clone());
        let body = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "sync-p"}});
        rt.block_on(timed_call(api.patch("sync-p", &PatchParams::apply("bench"), &Patch::Apply(&body))))?;
    }
    let mut sync = Syncing::start_tied(&clusters, &["--identity", "leader"]);
    sync.http(); // started: its HTTP endpoint is up
    let mut server = serve(&clusters.serve_kubeconfig(2));
    server.wait_ready(SERVER_READY_TIMEOUT);
    let mut dns = Dns::new(server.addr)?;
    // Propagation: the Service exists; the clock starts when the export's
    // create returns and stops when the third cluster's server answers.
    // First with every member healthy, then with the second member's
    // kube-apiserver frozen (SIGSTOP: connections accepted, nothing
    // answered), from the instant it froze, in the same run.
    println!("\n| what | n | p50 | p90 | p99 | max | goal |\n|---|---|---|---|---|---|---|");
    let mut times = propagation(rt, &clients[0], &mut dns, &sync, "p", SYNC_CHANGES)?;
    let slowest = times.iter().enumerate().max_by_key(|(_, d)| **d).map_or(0, |(i, _)| i);
    row("ServiceExport in A → answer in C", &mut times, "p99 ≤ 1 s");
    let frozen = Frozen::new(clusters.pids(1).0);
    let mut during = propagation(rt, &clients[0], &mut dns, &sync, "f", SYNC_CHANGES)?;
    row("… with B's kube-apiserver frozen", &mut during, "p99 within 2 s of the above");
    let stale = metric(
        &sync,
        &format!("clusterset_dns_sync_member_stale_seconds{{member=\"{}\"}}", clusters.name(1)),
    )?;
    drop(frozen);
    let thawed = Instant::now();
    let imports = import_resource();
    loop {
        let api: Api<DynamicObject> = Api::namespaced_with(clients[1].clone(), "sync-p", &imports);
        let have = rt.block_on(api.list(&ListParams::default())).map_or(0, |l| l.items.len());
        if have >= 2 * SYNC_CHANGES {
            break;
        }
        if thawed.elapsed() > SYNC_CONVERGE_TIMEOUT {
            bail!(
                "B holds {have} imports {} s after it thawed; sync log:\n{}",
                thawed.elapsed().as_secs(),
                sync.log()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    println!(
        "B's staleness {stale:.1} s when the last frozen-phase export was answered; every import in B {:.1} s after it thawed",
        secs(thawed.elapsed())
    );
    let retries = sync.log().matches("retrying in").count();
    println!(
        "slowest healthy: export #{slowest} (0 is the first after start); reconcile retries so far: {retries}"
    );

    // Scale: 1,000 Services (a third per cluster), then all their exports;
    // then a failover to a standby that was waiting for the Lease.
    let standby = Syncing::start_tied(&clusters, &["--identity", "standby"]);
    standby.http();
    scale(rt, &clusters, &clients, &mut sync, standby, SYNC_SCALE, 300)?;
    server.stop();
    drop(clusters);

    // A fleet of ten clusters.
    println!("\n## sync controller on {FLEET_CLUSTERS} clusters");
    let clusters = start_clusters(FLEET_CLUSTERS);
    let mut clients = Vec::new();
    for i in 0..FLEET_CLUSTERS {
        clients.push(rt.block_on(clusters.client(i)));
    }
    let mut sync = Syncing::start_tied(&clusters, &["--identity", "leader"]);
    let since = Instant::now();
    while !sync.leading() {
        if since.elapsed() > FAILOVER_TIMEOUT {
            bail!("sync did not lead within {} s:\n{}", FAILOVER_TIMEOUT.as_secs(), sync.log());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let standby = Syncing::start_tied(&clusters, &["--identity", "standby"]);
    standby.http();
    scale(rt, &clusters, &clients, &mut sync, standby, FLEET_SCALE, 30)?;
    Ok(())
}

/// `n` exports created at once, spread over the clusters (each service
/// exported by one), in a namespace every member has: time until every
/// member holds every import with a VIP, API writes, CPU and memory; then
/// `touched` Services changed in ways that do not matter; then `sync`
/// stops (giving up its Lease) and `standby` takes over with nothing
/// changed. Stops both.
fn scale(
    rt: &tokio::runtime::Runtime,
    clusters: &TestClusters,
    clients: &[kube::Client],
    sync: &mut Syncing,
    mut standby: Syncing,
    n: usize,
    touched: usize,
) -> Result<()> {
    let c_n = clients.len();
    let ns = "sync-s";
    for c in clients {
        let api: Api<Namespace> = Api::all(c.clone());
        let body = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
        rt.block_on(timed_call(api.patch(ns, &PatchParams::apply("bench"), &Patch::Apply(&body))))?;
    }
    let services = ApiResource::erase::<k8s_openapi::api::core::v1::Service>(&());
    let slices = slice_resource();
    let exports = mcs_resource("v1alpha1", "ServiceExport", "serviceexports");
    let writes0 = metric(sync, "clusterset_dns_sync_writes_total")?;
    for (c, client) in clients.iter().enumerate() {
        let mine: Vec<usize> = (0..n).filter(|i| i % c_n == c).collect();
        let svc: Vec<(String, Value)> =
            mine.iter().map(|i| (ns.into(), service(ns, &format!("s-{i}")))).collect();
        let sl: Vec<(String, Value)> =
            mine.iter().map(|i| (ns.into(), own_slice(ns, &format!("s-{i}"), c, *i))).collect();
        rt.block_on(create_all(client, &services, svc, "services"))?;
        rt.block_on(create_all(client, &slices, sl, "slices"))?;
    }
    let control_plane = clusters.control_plane_pids();
    let cpu = |pids: &[u32]| pids.iter().map(|p| cpu_seconds(*p).unwrap_or(0.0)).sum::<f64>();
    let (plane0, sync0) = (cpu(&control_plane), sync.cpu_seconds());
    let started = Instant::now();
    let created = std::thread::scope(|scope| -> Result<Duration> {
        let handles: Vec<_> = (0..c_n)
            .map(|c| {
                let client = clients[c].clone();
                let exports = exports.clone();
                let objects: Vec<(String, Value)> = (0..n)
                    .filter(|i| i % c_n == c)
                    .map(|i| (ns.into(), export(ns, &format!("s-{i}"))))
                    .collect();
                scope.spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
                    rt.block_on(create_all(&client, &exports, objects, "exports"))
                })
            })
            .collect();
        for h in handles {
            h.join().map_err(|_| anyhow!("export creator panicked"))??;
        }
        Ok(started.elapsed())
    })?;
    let imports = import_resource();
    let converged = loop {
        let mut done = true;
        for c in clients {
            let api: Api<DynamicObject> = Api::namespaced_with(c.clone(), ns, &imports);
            let list = rt.block_on(timed_call(api.list(&ListParams::default())))?;
            let with_vip = list.items.iter().filter(|o| o.data.pointer("/spec/ips/0").is_some()).count();
            done &= with_vip == n;
        }
        if done {
            break started.elapsed();
        }
        if started.elapsed() > SYNC_CONVERGE_TIMEOUT {
            bail!("{n} exports not converged within {} s", SYNC_CONVERGE_TIMEOUT.as_secs());
        }
        // Listing every member's imports is work for the API servers too:
        // not too often.
        std::thread::sleep(Duration::from_secs(1));
    };
    let (plane, sync_cpu) = (cpu(&control_plane) - plane0, sync.cpu_seconds() - sync0);
    let writes = metric(sync, "clusterset_dns_sync_writes_total")? - writes0;
    println!(
        "\n{n} exports across {c_n} clusters: created in {:.1} s; every member holds {n} imports with a VIP {:.1} s after the first create",
        secs(created),
        secs(converged)
    );
    println!(
        "API writes: {writes} for {n} exports = {:.1} per export (per member: VIP Service, MCS slice, ServiceImport, its status; plus the export's status)",
        writes / n as f64
    );
    println!(
        "CPU meanwhile: {c_n} API servers + {c_n} etcd {plane:.1} s, sync {sync_cpu:.1} s (load average {})",
        loadavg()
    );

    // The exports' conditions come last: wait until nothing is written.
    let all = quiet(sync)?;
    println!(
        "quiet {:.1} s after the first create: {} writes in all; sync peak RSS {} MiB",
        secs(started.elapsed()),
        all - writes0,
        sync.peak_rss_kib() / 1024
    );

    // Changes that do not matter: an annotation on `touched` Services.
    let (writes1, unchanged1) = (
        metric(sync, "clusterset_dns_sync_writes_total")?,
        metric(sync, "clusterset_dns_sync_unchanged_total")?,
    );
    for i in 0..touched.min(n) {
        let api: Api<DynamicObject> = Api::namespaced_with(clients[i % c_n].clone(), ns, &services);
        let patch = json!({"metadata": {"annotations": {"bench/touched": "yes"}}});
        rt.block_on(timed_call(api.patch(
            &format!("s-{i}"),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )))?;
    }
    std::thread::sleep(Duration::from_secs(5));
    let writes = metric(sync, "clusterset_dns_sync_writes_total")? - writes1;
    let skipped = metric(sync, "clusterset_dns_sync_unchanged_total")? - unchanged1;
    println!(
        "{} Services changed in ways that do not matter: {writes} API writes, {skipped} writes skipped as unchanged",
        touched.min(n)
    );
    println!("sync CPU: {:.1} s in all", sync.cpu_seconds());

    // Failover with nothing changed: the leader gives up its Lease.
    if standby.leading() {
        bail!("two leaders:\n{}", standby.log());
    }
    sync.stop();
    let stopped = Instant::now();
    while !standby.leading() {
        if stopped.elapsed() > FAILOVER_TIMEOUT {
            bail!("the standby did not lead within {} s:\n{}", FAILOVER_TIMEOUT.as_secs(), standby.log());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let leads = stopped.elapsed();
    let cpu0 = standby.cpu_seconds();
    while metric(&standby, "clusterset_dns_sync_reconciles_total")? < n as f64 {
        if stopped.elapsed() > SYNC_CONVERGE_TIMEOUT {
            bail!("the new leader did not reconcile every service:\n{}", standby.log());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let reconciled = stopped.elapsed();
    let writes = quiet(&standby)?;
    let skipped = metric(&standby, "clusterset_dns_sync_unchanged_total")?;
    println!(
        "failover with nothing changed: the standby led {:.1} s after the leader stopped and had reconciled all {n} services {:.1} s after; API writes {writes}, {skipped} skipped as unchanged; its CPU {:.1} s, peak RSS {} MiB",
        secs(leads),
        secs(reconciled - leads),
        standby.cpu_seconds() - cpu0,
        standby.peak_rss_kib() / 1024
    );
    standby.stop();
    Ok(())
}

/// `n` exports from cluster A (`a`), one at a time, each timed from its
/// create's return to the first answer of the third cluster's server.
fn propagation(
    rt: &tokio::runtime::Runtime,
    a: &kube::Client,
    dns: &mut Dns,
    sync: &Syncing,
    prefix: &str,
    n: usize,
) -> Result<Vec<Duration>> {
    let services = ApiResource::erase::<k8s_openapi::api::core::v1::Service>(&());
    let slices = slice_resource();
    let exports = mcs_resource("v1alpha1", "ServiceExport", "serviceexports");
    let mut times = Vec::new();
    for i in 0..n {
        let name = format!("{prefix}-{i}");
        rt.block_on(create_all(a, &services, vec![("sync-p".into(), service("sync-p", &name))], "service"))?;
        rt.block_on(create_all(
            a,
            &slices,
            vec![("sync-p".into(), own_slice("sync-p", &name, 0, i))],
            "slice",
        ))?;
        rt.block_on(create_all(a, &exports, vec![("sync-p".into(), export("sync-p", &name))], "export"))?;
        let returned = Instant::now();
        let fqdn = Name::from_ascii(format!("{name}.sync-p.svc.clusterset.local."))?;
        match dns.poll_until(&fqdn, returned, Duration::from_secs(10), |a| !a.ips.is_empty()) {
            Some(at) => times.push(at - returned),
            None => bail!("{name} not answered in cluster C within 10 s; sync log:\n{}", sync.log()),
        }
    }
    Ok(times)
}

/// Waits until `sync` has written nothing for 3 s (at most
/// [`SYNC_CONVERGE_TIMEOUT`]); its writes so far.
fn quiet(sync: &Syncing) -> Result<f64> {
    let deadline = Instant::now() + SYNC_CONVERGE_TIMEOUT;
    let mut last = metric(sync, "clusterset_dns_sync_writes_total")?;
    loop {
        std::thread::sleep(Duration::from_secs(3));
        let now = metric(sync, "clusterset_dns_sync_writes_total")?;
        if now == last {
            return Ok(now);
        }
        if Instant::now() > deadline {
            bail!("sync still writing after {} s:\n{}", SYNC_CONVERGE_TIMEOUT.as_secs(), sync.log());
        }
        last = now;
    }
}

fn service(ns: &str, name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": ns},
           "spec": {"ports": [{"name": "http", "protocol": "TCP", "port": 80}]}})
}

/// The Service's own EndpointSlice in cluster `c`: one endpoint.
fn own_slice(ns: &str, name: &str, c: usize, i: usize) -> Value {
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
           "metadata": {"name": format!("{name}-own"), "namespace": ns,
                        "labels": {"kubernetes.io/service-name": name}},
           "addressType": "IPv4", "ports": [{"name": "http", "protocol": "TCP", "port": 8080}],
           "endpoints": [{"addresses": [Ipv4Addr::new(10, 100 + c as u8, (i >> 8) as u8, (i & 255) as u8).to_string()]}]})
}

fn export(ns: &str, name: &str) -> Value {
    json!({"apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ServiceExport",
           "metadata": {"name": name, "namespace": ns}})
}

/// A counter or gauge without labels from sync's `/metrics`.
fn metric(sync: &Syncing, name: &str) -> Result<f64> {
    sync.metric(name).with_context(|| format!("no {name} in sync's /metrics"))
}
