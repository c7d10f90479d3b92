//! The sync controller on three real clusters (`scripts/clusters.sh`), the
//! real release binary: `clusterset-dns sync` (leader election on) and
//! `serve` on the third cluster's own API. A ServiceExport created in the
//! first → answer served by the third, 50 times; 1,000 exports across the
//! three clusters → every member holds 1,000 ServiceImports with a VIP; API
//! writes per export, and writes when Services change in ways that do not
//! matter (none expected).
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

fn sync_bench(rt: &tokio::runtime::Runtime) -> Result<()> {
    println!("\n## sync controller on 3 clusters");
    let clusters = start_clusters(3);
    let mut clients = Vec::new();
    for i in 0..3 {
        clients.push(rt.block_on(clusters.client(i)));
    }
    for c in &clients {
        for ns in ["sync-p", "sync-s"] {
            let api: Api<Namespace> = Api::all(c.clone());
            let body = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
            rt.block_on(timed_call(api.patch(ns, &PatchParams::apply("bench"), &Patch::Apply(&body))))?;
        }
    }
    let mut sync = Syncing::start_tied(&clusters, &[]);
    sync.http(); // started: its HTTP endpoint is up
    let mut server = serve(&clusters.serve_kubeconfig(2));
    server.wait_ready(SERVER_READY_TIMEOUT);
    let mut dns = Dns::new(server.addr)?;
    let services = ApiResource::erase::<k8s_openapi::api::core::v1::Service>(&());
    let slices = slice_resource();
    let exports = mcs_resource("v1alpha1", "ServiceExport", "serviceexports");
    let service = |ns: &str, name: &str| {
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": ns},
               "spec": {"ports": [{"name": "http", "protocol": "TCP", "port": 80}]}})
    };
    let own_slice = |ns: &str, name: &str, c: usize, i: usize| {
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
               "metadata": {"name": format!("{name}-own"), "namespace": ns,
                            "labels": {"kubernetes.io/service-name": name}},
               "addressType": "IPv4", "ports": [{"name": "http", "protocol": "TCP", "port": 8080}],
               "endpoints": [{"addresses": [Ipv4Addr::new(10, 100 + c as u8, (i >> 8) as u8, (i & 255) as u8).to_string()]}]})
    };
    let export = |ns: &str, name: &str| {
        json!({"apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ServiceExport",
               "metadata": {"name": name, "namespace": ns}})
    };

    // Propagation: the Service exists; the clock starts when the export's
    // create returns and stops when the third cluster's server answers.
    let mut times = Vec::new();
    for i in 0..SYNC_CHANGES {
        let name = format!("p-{i}");
        rt.block_on(create_all(
            &clients[0],
            &services,
            vec![("sync-p".into(), service("sync-p", &name))],
            "service",
        ))?;
        rt.block_on(create_all(
            &clients[0],
            &slices,
            vec![("sync-p".into(), own_slice("sync-p", &name, 0, i))],
            "slice",
        ))?;
        rt.block_on(create_all(
            &clients[0],
            &exports,
            vec![("sync-p".into(), export("sync-p", &name))],
            "export",
        ))?;
        let returned = Instant::now();
        let fqdn = Name::from_ascii(format!("{name}.sync-p.svc.clusterset.local."))?;
        match dns.poll_until(&fqdn, returned, Duration::from_secs(10), |a| !a.ips.is_empty()) {
            Some(at) => times.push(at - returned),
            None => bail!("{name} not answered in cluster C within 10 s; sync log:\n{}", sync.log()),
        }
    }
    let slowest = times.iter().enumerate().max_by_key(|(_, d)| **d).map_or(0, |(i, _)| i);
    println!("\n| what | n | p50 | p90 | p99 | max | goal |\n|---|---|---|---|---|---|---|");
    row("ServiceExport in A → answer in C", &mut times, "p99 ≤ 1 s");
    let retries = sync.log().matches("retrying in").count();
    println!("slowest: export #{slowest} (0 is the first after start); reconcile retries so far: {retries}");

    // Scale: 1,000 Services (a third per cluster), then all their exports.
    let writes0 = metric(&sync, "clusterset_dns_sync_writes_total")?;
    for (c, client) in clients.iter().enumerate() {
        let mine: Vec<usize> = (0..SYNC_SCALE).filter(|i| i % 3 == c).collect();
        let svc: Vec<(String, Value)> =
            mine.iter().map(|i| ("sync-s".into(), service("sync-s", &format!("s-{i}")))).collect();
        let sl: Vec<(String, Value)> =
            mine.iter().map(|i| ("sync-s".into(), own_slice("sync-s", &format!("s-{i}"), c, *i))).collect();
        rt.block_on(create_all(client, &services, svc, "services"))?;
        rt.block_on(create_all(client, &slices, sl, "slices"))?;
    }
    let control_plane = clusters.control_plane_pids();
    let cpu = |pids: &[u32]| pids.iter().map(|p| cpu_seconds(*p).unwrap_or(0.0)).sum::<f64>();
    let (plane0, sync0) = (cpu(&control_plane), sync.cpu_seconds());
    let started = Instant::now();
    let created = std::thread::scope(|scope| -> Result<Duration> {
        let handles: Vec<_> = (0..3)
            .map(|c| {
                let client = clients[c].clone();
                let exports = exports.clone();
                let objects: Vec<(String, Value)> = (0..SYNC_SCALE)
                    .filter(|i| i % 3 == c)
                    .map(|i| ("sync-s".into(), export("sync-s", &format!("s-{i}"))))
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
        for c in &clients {
            let api: Api<DynamicObject> = Api::namespaced_with(c.clone(), "sync-s", &imports);
            let list = rt.block_on(timed_call(api.list(&ListParams::default())))?;
            let with_vip = list.items.iter().filter(|o| o.data.pointer("/spec/ips/0").is_some()).count();
            done &= with_vip == SYNC_SCALE;
        }
        if done {
            break started.elapsed();
        }
        if started.elapsed() > SYNC_CONVERGE_TIMEOUT {
            bail!("{SYNC_SCALE} exports not converged within {} s", SYNC_CONVERGE_TIMEOUT.as_secs());
        }
        // Listing 3,000 imports is work for the API servers too: not too often.
        std::thread::sleep(Duration::from_secs(1));
    };
    let (plane, sync_cpu) = (cpu(&control_plane) - plane0, sync.cpu_seconds() - sync0);
    let writes = metric(&sync, "clusterset_dns_sync_writes_total")? - writes0;
    println!(
        "\n{SYNC_SCALE} exports across 3 clusters: created in {:.1} s; every member holds {SYNC_SCALE} imports with a VIP {:.1} s after the first create (goal ≤ 30 s)",
        secs(created),
        secs(converged)
    );
    println!(
        "API writes: {writes} for {SYNC_SCALE} exports = {:.1} per export (per member: VIP Service, MCS slice, ServiceImport, its status; plus the export's status)",
        writes / SYNC_SCALE as f64
    );
    println!(
        "CPU meanwhile: 3 API servers + 3 etcd {plane:.1} s, sync {sync_cpu:.1} s (load average {})",
        loadavg()
    );

    // Changes that do not matter: an annotation on 300 Services.
    std::thread::sleep(Duration::from_secs(2));
    let (writes1, unchanged1) = (
        metric(&sync, "clusterset_dns_sync_writes_total")?,
        metric(&sync, "clusterset_dns_sync_unchanged_total")?,
    );
    for i in 0..300 {
        let api: Api<DynamicObject> = Api::namespaced_with(clients[i % 3].clone(), "sync-s", &services);
        let patch = json!({"metadata": {"annotations": {"bench/touched": "yes"}}});
        rt.block_on(timed_call(api.patch(
            &format!("s-{i}"),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )))?;
    }
    std::thread::sleep(Duration::from_secs(5));
    let writes = metric(&sync, "clusterset_dns_sync_writes_total")? - writes1;
    let skipped = metric(&sync, "clusterset_dns_sync_unchanged_total")? - unchanged1;
    println!(
        "300 Services changed in ways that do not matter: {writes} API writes, {skipped} writes skipped as unchanged"
    );
    println!("sync CPU: {:.1} s in all", sync.cpu_seconds());
    server.stop();
    sync.stop();
    Ok(())
}

/// A counter or gauge without labels from sync's `/metrics`.
fn metric(sync: &Syncing, name: &str) -> Result<f64> {
    sync.metric(name).with_context(|| format!("no {name} in sync's /metrics"))
}
