//! The Kubernetes watch source against a real kube-apiserver and etcd
//! (`scripts/clusters.sh`), with the real release binary:
//!
//! - `propagation`: 1,000 ClusterSetIP ServiceImports in 10 namespaces; 200
//!   changes of one import's `spec.ips`, each timed from the moment the API
//!   write returns to the moment the server answers the new VIP (raw UDP
//!   queries every 1 ms).
//! - `update`: on the same cluster (plus 3 EndpointSlices per service), the
//!   server's CPU per query under `dnsperf`, without changes and while 100
//!   EndpointSlices per second are patched.
//! - `scale`: a fresh cluster with 10,000 ServiceImports (10 % headless) and
//!   30,000 EndpointSlices: creation time, server start to `/ready` and to
//!   the first correct answer, resident memory.
//!
//! - `sync`: three clusters, `clusterset-dns sync` (leader election on) and
//!   `serve` on the third cluster's own API: ServiceExport created in the
//!   first → answer served by the third, 50 times; 1,000 exports across the
//!   three clusters → every member holds 1,000 ServiceImports with a VIP;
//!   API writes per export, and writes when Services change in ways that do
//!   not matter (none expected).
//!
//! `cargo bench --bench watch [-- FILTER...]` runs the parts whose name
//! contains a filter (all without one). Without `--bench` (how `cargo test
//! --all-targets` runs bench targets) it prints one line and exits.
//!
//! The server binary is the one cargo builds for this bench target
//! (`CARGO_BIN_EXE_clusterset-dns`): `cargo bench` builds it with the bench
//! profile, which inherits `release`, at `target/release/clusterset-dns`.

#![allow(clippy::print_stdout)]

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream, UdpSocket};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use clusterset_dns::k8s::mcs::mcs_resource;
use futures::{StreamExt, stream};
use hickory_proto::op::{Message, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_clusterset-dns");
const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Parts, in the order they run.
const PARTS: [&str; 4] = ["propagation", "update", "scale", "sync"];

/// API writes in flight while creating objects.
const CREATE_CONCURRENCY: usize = 32;
/// Changes timed by `propagation`.
const CHANGES: usize = 200;
/// How long one change may take to be served before it counts as lost.
const PROPAGATION_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the server is asked while waiting for a change.
const POLL_EVERY: Duration = Duration::from_millis(1);
/// EndpointSlice patches per second during `update`, and for how long.
const PATCH_RATE: u32 = 100;
const LOAD_SECONDS: u32 = 10;
/// Patches in flight at most during `update` (the rate is kept by a schedule).
const PATCH_CONCURRENCY: usize = 16;
/// Pairs of dnsperf runs (without, with changes) in `update`.
const UPDATE_ROUNDS: usize = 3;
/// Any single API call.
const API_TIMEOUT: Duration = Duration::from_secs(30);
/// From built binaries to `READY` (the harness allows the same).
const CLUSTER_READY_TIMEOUT: Duration = Duration::from_secs(180);
/// A cold build of etcd and kube-apiserver.
const CLUSTER_BUILD_TIMEOUT: Duration = Duration::from_secs(40 * 60);
/// Server start to ready, at most, before the bench gives up.
const SERVER_READY_TIMEOUT: Duration = Duration::from_secs(120);

/// The clusters of a fleet, as the `source-cluster` label names them.
const CLUSTER_IDS: [&str; 3] = ["cluster-a", "cluster-b", "cluster-c"];
/// Endpoints per EndpointSlice.
const ENDPOINTS: usize = 4;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if !args.iter().any(|a| a == "--bench") {
        println!("watch bench: skipped (needs real clusters; run `cargo bench --bench watch`)");
        return;
    }
    let filters: Vec<String> = args.iter().filter(|a| !a.starts_with('-')).cloned().collect();
    let selected: Vec<&str> = PARTS
        .iter()
        .copied()
        .filter(|p| filters.is_empty() || filters.iter().any(|f| p.contains(f.as_str())))
        .collect();
    let mut command = "cargo bench --bench watch".to_owned();
    if !filters.is_empty() {
        command.push_str(" -- ");
        command.push_str(&filters.join(" "));
    }
    println!("command: {command}");
    println!("server binary: {BIN}");
    println!("clock ticks per second: {}; cpus: {}", clk_tck(), cpus());
    if selected.is_empty() {
        println!("no part matches {filters:?}; parts: {}", PARTS.join(", "));
        return;
    }
    if let Err(e) = run(&selected) {
        println!("watch bench failed: {e:#}");
        std::process::exit(1);
    }
}

fn run(parts: &[&str]) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let small = parts.contains(&"propagation") || parts.contains(&"update");
    if small {
        // 1,000 ClusterSetIP services in 10 namespaces, 3 slices each.
        let fleet = Fleet { prefix: "p", namespaces: 10, per_namespace: 100, headless_every: 0 };
        println!("\n## cluster of 1,000 services");
        let mut clusters = Clusters::start()?;
        let client = rt.block_on(client_from(&clusters.kubeconfig()))?;
        rt.block_on(create_fleet(&client, &fleet))?;
        let mut server = Server::start(&clusters.serve_kubeconfig())?;
        let ready = server.wait_ready(SERVER_READY_TIMEOUT)?;
        println!("server ready {:.0} ms after start", ms(ready));
        if parts.contains(&"propagation") {
            propagation(&rt, &client, &server, &fleet)?;
        }
        if parts.contains(&"update") {
            update_load(&rt, &client, &server, &fleet)?;
        }
        server.stop();
        clusters.stop();
    }
    if parts.contains(&"scale") {
        scale(&rt)?;
    }
    if parts.contains(&"sync") {
        sync_bench(&rt)?;
    }
    Ok(())
}

// --- The fleet ----------------------------------------------------------------------

/// `namespaces × per_namespace` services, `<prefix>-<n>/svc-<i>`, 3 slices
/// of 4 endpoints each (one per cluster); every `headless_every`-th headless.
struct Fleet {
    prefix: &'static str,
    namespaces: usize,
    per_namespace: usize,
    headless_every: usize,
}

impl Fleet {
    fn services(&self) -> usize {
        self.namespaces * self.per_namespace
    }

    fn namespace(&self, n: usize) -> String {
        format!("{}-{n}", self.prefix)
    }

    /// Service `j` (0..services()) as (namespace index, service index).
    fn service(&self, j: usize) -> (usize, usize) {
        (j % self.namespaces, j / self.namespaces)
    }

    fn fqdn(&self, n: usize, i: usize) -> String {
        format!("svc-{i}.{}.svc.clusterset.local.", self.namespace(n))
    }

    fn headless(&self, i: usize) -> bool {
        self.headless_every > 0 && i.is_multiple_of(self.headless_every)
    }

    fn vip(n: usize, i: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, n as u8, (i >> 8) as u8, (i & 255) as u8)
    }

    fn endpoint_ip(&self, c: usize, n: usize, i: usize, e: usize) -> Ipv4Addr {
        let idx = (n * self.per_namespace + i) * ENDPOINTS + e;
        Ipv4Addr::new(10, 200 + c as u8, (idx >> 8) as u8, (idx & 255) as u8)
    }

    /// What `svc-<i>.<ns>` answers for A once everything is served.
    fn expected(&self, n: usize, i: usize) -> BTreeSet<Ipv4Addr> {
        if self.headless(i) {
            (0..CLUSTER_IDS.len())
                .flat_map(|c| (0..ENDPOINTS).map(move |e| (c, e)))
                .map(|(c, e)| self.endpoint_ip(c, n, i, e))
                .collect()
        } else {
            [Self::vip(n, i)].into()
        }
    }

    fn import(&self, n: usize, i: usize) -> Value {
        let spec = if self.headless(i) {
            json!({"type": "Headless", "ports": [{"name": "http", "protocol": "TCP", "port": 8080}]})
        } else {
            json!({"type": "ClusterSetIP", "ips": [Self::vip(n, i).to_string()],
                   "ports": [{"name": "http", "protocol": "TCP", "port": 80}]})
        };
        json!({"apiVersion": "multicluster.x-k8s.io/v1beta1", "kind": "ServiceImport",
               "metadata": {"name": format!("svc-{i}"), "namespace": self.namespace(n)}, "spec": spec})
    }

    fn slice_name(i: usize, c: usize) -> String {
        format!("svc-{i}-{}", &CLUSTER_IDS[c][8..])
    }

    /// Endpoint `e` of a slice gets `override_first` instead of its address when given.
    fn endpoints(&self, c: usize, n: usize, i: usize, override_first: Option<Ipv4Addr>) -> Value {
        let endpoints: Vec<Value> = (0..ENDPOINTS)
            .map(|e| {
                let ip = match override_first {
                    Some(ip) if e == 0 => ip,
                    _ => self.endpoint_ip(c, n, i, e),
                };
                json!({"addresses": [ip.to_string()], "hostname": format!("pod-{e}"),
                       "conditions": {"ready": true}})
            })
            .collect();
        Value::Array(endpoints)
    }

    fn slice(&self, c: usize, n: usize, i: usize) -> Value {
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
               "metadata": {"name": Self::slice_name(i, c), "namespace": self.namespace(n),
                            "labels": {"multicluster.kubernetes.io/service-name": format!("svc-{i}"),
                                       "multicluster.kubernetes.io/source-cluster": CLUSTER_IDS[c]}},
               "addressType": "IPv4", "ports": [{"name": "http", "protocol": "TCP", "port": 8080}],
               "endpoints": self.endpoints(c, n, i, None)})
    }
}

fn import_resource() -> ApiResource {
    mcs_resource("v1beta1", "ServiceImport", "serviceimports")
}

fn slice_resource() -> ApiResource {
    ApiResource::erase::<EndpointSlice>(&())
}

/// Creates the namespaces, then the imports, then the slices, each with
/// `CREATE_CONCURRENCY` writes in flight; prints the times.
async fn create_fleet(client: &kube::Client, fleet: &Fleet) -> Result<()> {
    let started = Instant::now();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for n in 0..fleet.namespaces {
        let body = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": fleet.namespace(n)}});
        let ns: Namespace = serde_json::from_value(body)?;
        timed_call(namespaces.create(&PostParams::default(), &ns)).await.context("create namespace")?;
    }
    let ns_time = started.elapsed();
    let services = fleet.services();
    let imports: Vec<(String, Value)> = (0..services)
        .map(|j| fleet.service(j))
        .map(|(n, i)| (fleet.namespace(n), fleet.import(n, i)))
        .collect();
    let slices: Vec<(String, Value)> = (0..services)
        .map(|j| fleet.service(j))
        .flat_map(|(n, i)| (0..CLUSTER_IDS.len()).map(move |c| (n, i, c)))
        .map(|(n, i, c)| (fleet.namespace(n), fleet.slice(c, n, i)))
        .collect();
    let import_time = create_all(client, &import_resource(), imports, "ServiceImports").await?;
    let slice_time = create_all(client, &slice_resource(), slices, "EndpointSlices").await?;
    let total = started.elapsed();
    println!("\ncreation ({CREATE_CONCURRENCY} writes in flight, POST, admin client):\n");
    println!("| objects | count | time | objects/s |");
    println!("|---|---|---|---|");
    println!(
        "| Namespaces (sequential) | {} | {:.1} s | {:.0} |",
        fleet.namespaces,
        secs(ns_time),
        rate(fleet.namespaces, ns_time)
    );
    println!(
        "| ServiceImports | {services} | {:.1} s | {:.0} |",
        secs(import_time),
        rate(services, import_time)
    );
    let n_slices = services * CLUSTER_IDS.len();
    println!(
        "| EndpointSlices | {n_slices} | {:.1} s | {:.0} |",
        secs(slice_time),
        rate(n_slices, slice_time)
    );
    println!(
        "| all | {} | {:.1} s | {:.0} |",
        fleet.namespaces + services + n_slices,
        secs(total),
        rate(fleet.namespaces + services + n_slices, total)
    );
    Ok(())
}

/// POSTs every object with bounded concurrency; an object that fails is
/// retried (3 attempts) and then fails the bench.
async fn create_all(
    client: &kube::Client,
    resource: &ApiResource,
    objects: Vec<(String, Value)>,
    what: &str,
) -> Result<Duration> {
    let started = Instant::now();
    let total = objects.len();
    let mut done = 0usize;
    let mut retries = 0usize;
    let mut results = stream::iter(objects)
        .map(|(ns, body)| {
            let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, resource);
            async move {
                let object: DynamicObject = serde_json::from_value(body)?;
                let mut attempt = 0;
                loop {
                    attempt += 1;
                    match timed_call(api.create(&PostParams::default(), &object)).await {
                        Ok(_) => return Ok::<usize, anyhow::Error>(attempt - 1),
                        Err(e) if attempt < 3 => {
                            eprintln!("create {ns}/{:?}: {e:#}; retrying", object.metadata.name);
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                        Err(e) => return Err(e.context(format!("create {ns}/{:?}", object.metadata.name))),
                    }
                }
            }
        })
        .buffer_unordered(CREATE_CONCURRENCY);
    while let Some(result) = results.next().await {
        retries += result?;
        done += 1;
        if done.is_multiple_of(5000) {
            eprintln!("[bench] {what}: {done}/{total} created in {:.1} s", secs(started.elapsed()));
        }
    }
    if retries > 0 {
        println!("{what}: {retries} create retries");
    }
    Ok(started.elapsed())
}

async fn timed_call<T>(call: impl Future<Output = Result<T, kube::Error>>) -> Result<T> {
    match tokio::time::timeout(API_TIMEOUT, call).await {
        Ok(result) => Ok(result?),
        Err(_) => bail!("no answer from the API server within {} s", API_TIMEOUT.as_secs()),
    }
}

async fn client_from(path: &Path) -> Result<kube::Client> {
    let kubeconfig = Kubeconfig::read_from(path).with_context(|| format!("reading {}", path.display()))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    Ok(kube::Client::try_from(config)?)
}

// --- Part 1: propagation ------------------------------------------------------------

fn propagation(
    rt: &tokio::runtime::Runtime,
    client: &kube::Client,
    server: &Server,
    fleet: &Fleet,
) -> Result<()> {
    println!("\n## propagation: ServiceImport spec.ips change → new VIP answered");
    let mut dns = Dns::new(server.dns)?;
    let mut from_return = Vec::new();
    let mut from_start = Vec::new();
    let mut api = Vec::new();
    let mut lost = 0usize;
    let resource = import_resource();
    for k in 0..CHANGES {
        // Spread over services and namespaces; never the same service twice in a row.
        let (n, i) = fleet.service((k * 337) % fleet.services());
        let ip = Ipv4Addr::new(10, 250, (k >> 8) as u8, (k & 255) as u8);
        let want: BTreeSet<Ipv4Addr> = [ip].into();
        let name = Name::from_ascii(fleet.fqdn(n, i))?;
        let imports: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), &fleet.namespace(n), &resource);
        let patch = json!({"spec": {"ips": [ip.to_string()]}});
        let start = Instant::now();
        rt.block_on(timed_call(imports.patch(
            &format!("svc-{i}"),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )))
        .with_context(|| format!("patch {}/svc-{i}", fleet.namespace(n)))?;
        let returned = Instant::now();
        match dns.poll_until(&name, returned, PROPAGATION_TIMEOUT, |a| {
            a.rcode == ResponseCode::NoError && a.ips == want
        }) {
            Some(seen) => {
                from_return.push(seen.duration_since(returned));
                from_start.push(seen.duration_since(start));
                api.push(returned.duration_since(start));
            }
            None => {
                lost += 1;
                eprintln!("[bench] change {k} ({}/svc-{i} → {ip}) not served within 5 s", fleet.namespace(n));
                if lost >= 10 {
                    bail!("10 changes not served within 5 s; server log:\n{}", server.log_text());
                }
            }
        }
    }
    println!(
        "\n{CHANGES} changes, one at a time, each a JSON merge patch of one import's spec.ips \
         (service k·337 mod 1000); DNS polled over UDP every {} ms:\n",
        POLL_EVERY.as_millis()
    );
    println!("| measured | n | p50 | p90 | p99 | max | goal |");
    println!("|---|---|---|---|---|---|---|");
    row("write returned → new VIP answered", &mut from_return, "p99 ≤ 100 ms");
    row("write issued → new VIP answered", &mut from_start, "");
    row("API write (patch) round trip", &mut api, "");
    println!("\nnot served within {} s: {lost}", PROPAGATION_TIMEOUT.as_secs());
    Ok(())
}

/// One table row of latency percentiles in ms.
fn row(what: &str, v: &mut [Duration], goal: &str) {
    v.sort();
    let p =
        |q: f64| v.get(((q * v.len() as f64).ceil() as usize).saturating_sub(1)).map_or(f64::NAN, |d| ms(*d));
    println!(
        "| {what} | {} | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} ms | {goal} |",
        v.len(),
        p(0.50),
        p(0.90),
        p(0.99),
        v.last().map_or(f64::NAN, |d| ms(*d))
    );
}

// --- Part 3: update load ------------------------------------------------------------

fn update_load(
    rt: &tokio::runtime::Runtime,
    client: &kube::Client,
    server: &Server,
    fleet: &Fleet,
) -> Result<()> {
    println!("\n## update load: server CPU per query with and without EndpointSlice churn");
    let dir = tempfile::Builder::new().prefix("clusterset-dns-bench.").tempdir()?;
    let queries = dir.path().join("queries.txt");
    let mut text = String::new();
    for j in 0..fleet.services() {
        let (n, i) = fleet.service(j);
        writeln!(text, "{} A", fleet.fqdn(n, i).trim_end_matches('.'))?;
    }
    std::fs::write(&queries, text)?;
    let dnsperf = format!(
        "dnsperf -s 127.0.0.1 -p {} -d {} -l {LOAD_SECONDS} -c 4 -Q 50000",
        server.dns.port(),
        queries.display()
    );
    println!("dnsperf command: {dnsperf}");
    println!("query file: {} A queries, one per service", fleet.services());

    // Idle: the server's own background cost; nothing asked, nothing changed.
    let cpu0 = server.cpu_seconds()?;
    std::thread::sleep(Duration::from_secs(u64::from(LOAD_SECONDS)));
    let idle_cpu = server.cpu_seconds()? - cpu0;
    println!(
        "idle {LOAD_SECONDS} s (no queries, no changes): server CPU {idle_cpu:.2} s; load average {}",
        loadavg()
    );

    // Rounds of: queries only, then queries while 100 slices/s are patched.
    let mut rows = Vec::new();
    for round in 0..UPDATE_ROUNDS {
        let quiet = measure(server, &dnsperf, dir.path(), || Ok(None))?;
        let churn = measure(server, &dnsperf, dir.path(), || {
            Ok(Some(rt.block_on(patch_slices(client, fleet, round))?))
        })?;
        rows.push((quiet, churn));
    }
    // Churn alone: the server's CPU per update, no queries.
    let (cpu0, t0) = (server.cpu_seconds()?, Instant::now());
    let alone = rt.block_on(patch_slices(client, fleet, UPDATE_ROUNDS))?;
    std::thread::sleep(Duration::from_millis(500)); // let the last events arrive
    let idle_share = idle_cpu / f64::from(LOAD_SECONDS) * t0.elapsed().as_secs_f64();
    let alone_cpu = (server.cpu_seconds()? - cpu0 - idle_share).max(0.0);

    println!(
        "\n| round | phase | queries completed | lost | QPS | server CPU | server µs CPU/query | \
         queries per server CPU-s | CPU/query vs no changes | load avg after |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let per_query = |m: &Measured| m.cpu / m.completed.max(1) as f64;
    for (round, (quiet, churn)) in rows.iter().enumerate() {
        for (name, m) in [("no changes", quiet), (&*format!("{PATCH_RATE} EndpointSlice patches/s"), churn)] {
            println!(
                "| {} | {name} | {} | {} | {:.0} | {:.2} s | {:.2} | {:.0} | {:.2} | {} |",
                round + 1,
                m.completed,
                m.lost,
                m.qps,
                m.cpu,
                per_query(m) * 1e6,
                m.completed as f64 / m.cpu,
                per_query(m) / per_query(quiet),
                m.load
            );
        }
    }
    println!();
    for (round, (_, churn)) in rows.iter().enumerate() {
        if let Some(p) = &churn.patches {
            println!("round {}: {p}", round + 1);
        }
    }
    let per_update = alone_cpu / alone.done.max(1) as f64;
    println!(
        "patches alone (no queries): {alone}; server CPU {alone_cpu:.2} s (idle share subtracted) = {:.0} µs per update",
        per_update * 1e6
    );
    // The update cost is small next to the run-to-run spread of CPU per
    // query on a shared machine; say both.
    let quiet: Vec<f64> = rows.iter().map(|(q, _)| per_query(q) * 1e6).collect();
    let ratios: Vec<String> =
        rows.iter().map(|(q, c)| format!("{:.2}", per_query(c) / per_query(q))).collect();
    let mean_quiet_cpu = rows.iter().map(|(q, _)| q.cpu).sum::<f64>() / rows.len().max(1) as f64;
    let updates = f64::from(PATCH_RATE * LOAD_SECONDS);
    println!(
        "CPU per query with/without changes, per round: {}; no-change runs alone spread {:.2}-{:.2} µs/query. \
         Expected from the patches-alone cost: {updates:.0} updates × {:.0} µs = {:.2} s on top of ~{mean_quiet_cpu:.2} s \
         = ratio {:.2}",
        ratios.join(", "),
        quiet.iter().copied().fold(f64::INFINITY, f64::min),
        quiet.iter().copied().fold(0.0, f64::max),
        per_update * 1e6,
        per_update * updates,
        1.0 + per_update * updates / mean_quiet_cpu
    );
    Ok(())
}

struct Measured {
    completed: u64,
    lost: u64,
    qps: f64,
    cpu: f64,
    patches: Option<Patched>,
    load: String,
}

/// Runs dnsperf while `during` runs (it must end within the dnsperf run);
/// the server's CPU is read before dnsperf starts and after it exits.
fn measure(
    server: &Server,
    dnsperf: &str,
    dir: &Path,
    during: impl FnOnce() -> Result<Option<Patched>>,
) -> Result<Measured> {
    let out_path = dir.join("dnsperf.out");
    let out = std::fs::File::create(&out_path)?;
    let cpu0 = server.cpu_seconds()?;
    let mut child = Command::new("sh")
        .args(["-c", &format!("exec {dnsperf}")])
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(Stdio::null())
        .spawn()
        .context("dnsperf (apt-get install dnsperf)")?;
    let patches = match during() {
        Ok(p) => p,
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e);
        }
    };
    let deadline = Instant::now() + Duration::from_secs(u64::from(LOAD_SECONDS) + 30);
    loop {
        if child.try_wait()?.is_some() {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("dnsperf did not end within {} s", u64::from(LOAD_SECONDS) + 30);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let cpu = server.cpu_seconds()? - cpu0;
    let text = std::fs::read_to_string(&out_path)?;
    let field = |key: &str| -> Result<f64> {
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with(key))
            .ok_or_else(|| anyhow!("no {key} in:\n{text}"))?;
        let value = line.split(':').nth(1).and_then(|v| v.split_whitespace().next()).unwrap_or("");
        value.parse::<f64>().with_context(|| format!("{key} in {line}"))
    };
    let completed = field("Queries completed")? as u64;
    let lost = field("Queries lost")? as u64;
    let qps = field("Queries per second")?;
    Ok(Measured { completed, lost, qps, cpu, patches, load: loadavg() })
}

/// What a patch run achieved.
struct Patched {
    done: usize,
    failed: usize,
    late: usize,
    seconds: f64,
    latency: Vec<Duration>,
}

impl std::fmt::Display for Patched {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut v = self.latency.clone();
        v.sort();
        let p = |q: f64| {
            v.get(((q * v.len() as f64).ceil() as usize).saturating_sub(1)).map_or(f64::NAN, |d| ms(*d))
        };
        write!(
            f,
            "EndpointSlice patches: {} done ({:.0}/s over {:.1} s), {} failed, {} skipped as late; \
             API round trip p50 {:.1} ms, p99 {:.1} ms",
            self.done,
            self.done as f64 / self.seconds,
            self.seconds,
            self.failed,
            self.late,
            p(0.5),
            p(0.99)
        )
    }
}

/// Patches `PATCH_RATE` EndpointSlices per second for exactly
/// `LOAD_SECONDS`: patch k at k/PATCH_RATE s, at most `PATCH_CONCURRENCY`
/// in flight; a patch whose slot comes after the end is skipped. Each
/// changes the first endpoint's address (a real change for the store).
async fn patch_slices(client: &kube::Client, fleet: &Fleet, round: usize) -> Result<Patched> {
    let total = (PATCH_RATE * LOAD_SECONDS) as usize;
    let started = tokio::time::Instant::now();
    let end = started + Duration::from_secs(u64::from(LOAD_SECONDS));
    let resource = slice_resource();
    let results: Vec<Option<Result<Duration>>> = stream::iter(0..total)
        .map(|k| {
            let (n, i) = fleet.service((k * 337 + round * 7) % fleet.services());
            let c = k % CLUSTER_IDS.len();
            let api: Api<DynamicObject> =
                Api::namespaced_with(client.clone(), &fleet.namespace(n), &resource);
            let serial = round * total + k;
            let ip = Ipv4Addr::new(10, 251, (serial >> 8) as u8, (serial & 255) as u8);
            let patch = json!({"endpoints": fleet.endpoints(c, n, i, Some(ip))});
            let at = started + Duration::from_secs(k as u64) / PATCH_RATE;
            async move {
                tokio::time::sleep_until(at).await;
                if tokio::time::Instant::now() >= end {
                    return None;
                }
                let t = Instant::now();
                let name = Fleet::slice_name(i, c);
                let left =
                    end.saturating_duration_since(tokio::time::Instant::now()) + Duration::from_secs(2);
                let (params, patch) = (PatchParams::default(), Patch::Merge(&patch));
                Some(match tokio::time::timeout(left, api.patch(&name, &params, &patch)).await {
                    Ok(Ok(_)) => Ok(t.elapsed()),
                    Ok(Err(e)) => Err(anyhow!("patch {name}: {e}")),
                    Err(_) => Err(anyhow!("patch {name}: timeout")),
                })
            }
        })
        .buffer_unordered(PATCH_CONCURRENCY)
        .collect()
        .await;
    let seconds = started.elapsed().as_secs_f64();
    let mut p = Patched { done: 0, failed: 0, late: 0, seconds, latency: Vec::new() };
    for r in results {
        match r {
            None => p.late += 1,
            Some(Ok(d)) => {
                p.done += 1;
                p.latency.push(d);
            }
            Some(Err(e)) => {
                p.failed += 1;
                eprintln!("[bench] {e}");
            }
        }
    }
    Ok(p)
}

// --- Part 2: scale ------------------------------------------------------------------

fn scale(rt: &tokio::runtime::Runtime) -> Result<()> {
    println!("\n## scale: 10,000 ServiceImports (10 % headless), 30,000 EndpointSlices");
    let fleet = Fleet { prefix: "s", namespaces: 100, per_namespace: 100, headless_every: 10 };
    let mut clusters = Clusters::start()?;
    let client = rt.block_on(client_from(&clusters.kubeconfig()))?;
    rt.block_on(create_fleet(&client, &fleet))?;
    println!("load average after creation: {}", loadavg());

    let mut runs = Vec::new();
    for run in 1..=SCALE_STARTS {
        runs.push(start_server(&clusters.serve_kubeconfig(), clusters.pids()?, &fleet, run == 1)?);
    }
    println!("\nserver: {}\n", runs.first().map_or("", |r| r.command.as_str()));
    println!(
        "{SCALE_STARTS} starts of the server on the same cluster, one after the other; \
         ms from process start (spawn) to:\n"
    );
    println!(
        "| start | ServiceImports listed (log) | EndpointSlices listed (log) | first correct ClusterSetIP A | \
         first correct headless A (12) | /ready 200 | CPU to ready: server, kube-apiserver, etcd | VmRSS ready | VmRSS +5 s | VmHWM | wrong answers | load avg |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (k, r) in runs.iter().enumerate() {
        println!(
            "| {} | {:.0} | {:.0} | {:.0} | {:.0} | **{:.0}** | {:.2} s, {:.2} s, {:.2} s | {:.1} MB | {:.1} MB | {:.1} MB | {} of {} | {} |",
            k + 1,
            r.imports_listed.map_or(f64::NAN, ms),
            r.slices_listed.map_or(f64::NAN, ms),
            ms(r.vip_at),
            ms(r.headless_at),
            ms(r.ready_at),
            r.cpu_ready,
            r.apiserver_cpu,
            r.etcd_cpu,
            r.rss_ready as f64 / 1024.0,
            r.rss_later as f64 / 1024.0,
            r.hwm as f64 / 1024.0,
            r.wrong,
            fleet.services(),
            r.load
        );
    }
    println!("\ngoals: /ready ≤ 5,000 ms; VmRSS ≤ 300 MB");

    // The API server alone: the same lists the server's two watches make,
    // concurrently, decoded by kube-rs as the server decodes them.
    println!("\nthe same two lists without the server (admin client, concurrently, objects decoded):\n");
    println!("| round | list | ServiceImports | EndpointSlices (labelled) |");
    println!("|---|---|---|---|");
    let hows = [
        ("paged, limit 500, consistent read (what the watcher does)", ListHow::Paged),
        ("one page, consistent read (no limit)", ListHow::Whole),
        ("resourceVersion=0, from the watch cache (no limit)", ListHow::Any),
    ];
    for (round, (what, how)) in (1..=2).flat_map(|r| hows.iter().map(move |h| (r, *h))) {
        let (imports, slices) = rt.block_on(async {
            tokio::join!(
                list_all(&client, import_resource(), None, how),
                list_all(&client, slice_resource(), Some("multicluster.kubernetes.io/service-name"), how)
            )
        });
        let (imports, slices) = (imports?, slices?);
        println!(
            "| {round} | {what} | {:.0} ms ({} objects, {} pages) | {:.0} ms ({} objects, {} pages) |",
            ms(imports.0),
            imports.1,
            imports.2,
            ms(slices.0),
            slices.1,
            slices.2
        );
    }
    clusters.stop();
    Ok(())
}

/// Server starts measured by `scale`.
const SCALE_STARTS: usize = 3;

struct StartRun {
    command: String,
    imports_listed: Option<Duration>,
    slices_listed: Option<Duration>,
    ready_at: Duration,
    vip_at: Duration,
    headless_at: Duration,
    cpu_ready: f64,
    apiserver_cpu: f64,
    etcd_cpu: f64,
    rss_ready: u64,
    rss_later: u64,
    hwm: u64,
    wrong: usize,
    load: String,
}

/// Starts the server, polls `/ready` (every 10 ms) and two names (every
/// 1 ms) whose answers need everything listed: a ClusterSetIP VIP and a
/// headless service's 12 endpoints. Then checks every service once and
/// reads the memory again 5 s later.
fn start_server(
    kubeconfig: &Path,
    (apiserver, etcd): (u32, u32),
    fleet: &Fleet,
    print_log: bool,
) -> Result<StartRun> {
    let (vn, vi) = (fleet.namespaces - 1, fleet.per_namespace - 1);
    let (hn, hi) = (fleet.namespaces - 1, fleet.per_namespace - fleet.headless_every);
    let vip_name = Name::from_ascii(fleet.fqdn(vn, vi))?;
    let headless_name = Name::from_ascii(fleet.fqdn(hn, hi))?;
    let (vip_want, headless_want) = (fleet.expected(vn, vi), fleet.expected(hn, hi));

    let (apiserver0, etcd0) = (cpu_seconds(apiserver)?, cpu_seconds(etcd)?);
    let mut server = Server::start(kubeconfig)?;
    let start = server.started;
    let mut dns = Dns::new(server.dns)?;
    let (mut ready_at, mut vip_at, mut headless_at) = (None, None, None);
    let mut last_ready_check = Instant::now() - Duration::from_secs(1);
    let deadline = start + SERVER_READY_TIMEOUT;
    let (ready_at, vip_at, headless_at) = loop {
        if let (Some(r), Some(v), Some(h)) = (ready_at, vip_at, headless_at) {
            break (r, v, h);
        }
        if Instant::now() > deadline {
            bail!(
                "not ready and answering within {} s; server log:\n{}",
                SERVER_READY_TIMEOUT.as_secs(),
                server.log_text()
            );
        }
        if ready_at.is_none() && last_ready_check.elapsed() >= Duration::from_millis(10) {
            last_ready_check = Instant::now();
            if http_status(server.http, "/ready") == Some(200) {
                ready_at = Some(start.elapsed());
            }
        }
        if vip_at.is_none() && dns.query_a(&vip_name, POLL_EVERY).is_some_and(|a| a.ips == vip_want) {
            vip_at = Some(start.elapsed());
        }
        if headless_at.is_none()
            && dns.query_a(&headless_name, POLL_EVERY).is_some_and(|a| a.ips == headless_want)
        {
            headless_at = Some(start.elapsed());
        }
        std::thread::sleep(POLL_EVERY);
    };
    let cpu_ready = server.cpu_seconds()?;
    let apiserver_cpu = cpu_seconds(apiserver)? - apiserver0;
    let etcd_cpu = cpu_seconds(etcd)? - etcd0;
    let rss_ready = server.status_kib("VmRSS")?;
    let load = loadavg();
    // Every service, asked once.
    let mut wrong = 0usize;
    for j in 0..fleet.services() {
        let (n, i) = fleet.service(j);
        let ok = dns
            .query_a(&Name::from_ascii(fleet.fqdn(n, i))?, Duration::from_millis(500))
            .is_some_and(|a| a.ips == fleet.expected(n, i));
        wrong += usize::from(!ok);
    }
    std::thread::sleep(Duration::from_secs(5));
    let rss_later = server.status_kib("VmRSS")?;
    let hwm = server.status_kib("VmHWM")?;
    let log = server.log_lines();
    let listed = |what: &str| {
        log.iter().find(|(_, l)| l.contains("watch listed") && l.contains(what)).map(|(t, _)| *t)
    };
    if print_log {
        println!("\nserver log of start 1, ms after process start (when the bench read the line):\n");
        println!("```");
        for (t, line) in &log {
            if ["watching", "listed", "ready", "HTTP", "listening", "WARN", "ERROR"]
                .iter()
                .any(|w| line.contains(w))
            {
                println!("{:>7.0} ms  {}", ms(*t), strip_ansi(line));
            }
        }
        println!("```");
    }
    let run = StartRun {
        command: server.command.clone(),
        imports_listed: listed("ServiceImports"),
        slices_listed: listed("EndpointSlices"),
        ready_at,
        vip_at,
        headless_at,
        cpu_ready,
        apiserver_cpu,
        etcd_cpu,
        rss_ready,
        rss_later,
        hwm,
        wrong,
        load,
    };
    server.stop();
    Ok(run)
}

/// How `list_all` lists.
#[derive(Clone, Copy)]
enum ListHow {
    /// `limit=500` pages, no resourceVersion: consistent, as kube-rs's watcher lists by default.
    Paged,
    /// No limit, no resourceVersion: consistent, in one response.
    Whole,
    /// `resourceVersion=0`, no limit: whatever the API server's watch cache holds.
    Any,
}

/// Lists every object of `resource` in all namespaces: (time, objects, pages).
async fn list_all(
    client: &kube::Client,
    resource: ApiResource,
    labels: Option<&str>,
    how: ListHow,
) -> Result<(Duration, usize, usize)> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let started = Instant::now();
    let (mut objects, mut pages) = (0, 0);
    let mut params = ListParams::default();
    if let Some(labels) = labels {
        params = params.labels(labels);
    }
    match how {
        ListHow::Paged => params = params.limit(500),
        ListHow::Whole => {}
        ListHow::Any => params = params.match_any(),
    }
    loop {
        let list = timed_call(api.list(&params)).await?;
        pages += 1;
        objects += list.items.len();
        match list.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            _ => break,
        }
        if pages > 10_000 {
            bail!("more than 10,000 pages");
        }
    }
    Ok((started.elapsed(), objects, pages))
}

// --- DNS over UDP -------------------------------------------------------------------

struct Answer {
    rcode: ResponseCode,
    ips: BTreeSet<Ipv4Addr>,
}

struct Dns {
    sock: UdpSocket,
    id: u16,
    buf: Vec<u8>,
}

impl Dns {
    fn new(server: SocketAddr) -> Result<Self> {
        let sock = UdpSocket::bind("127.0.0.1:0")?;
        sock.connect(server)?;
        Ok(Self { sock, id: 0, buf: vec![0; 65535] })
    }

    /// One A query; waits at most `wait` for its answer (stale answers are dropped).
    fn query_a(&mut self, name: &Name, wait: Duration) -> Option<Answer> {
        self.id = self.id.wrapping_add(1);
        let mut m = Message::query();
        m.metadata.id = self.id;
        m.add_query(Query::query(name.clone(), RecordType::A));
        let packet = m.to_vec().ok()?;
        self.sock.send(&packet).ok()?;
        let deadline = Instant::now() + wait;
        loop {
            let left = deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero())?;
            self.sock.set_read_timeout(Some(left)).ok()?;
            let len = self.sock.recv(&mut self.buf).ok()?;
            let Ok(r) = Message::from_vec(&self.buf[..len]) else { continue };
            if r.metadata.id != self.id {
                continue;
            }
            let ips = r
                .answers
                .iter()
                .filter_map(|rec| match &rec.data {
                    RData::A(a) => Some(a.0),
                    _ => None,
                })
                .collect();
            return Some(Answer { rcode: r.metadata.response_code, ips });
        }
    }

    /// Asks every `POLL_EVERY` from now until `done` holds; returns when it
    /// first did, or `None` after `timeout` from `from`.
    fn poll_until(
        &mut self,
        name: &Name,
        from: Instant,
        timeout: Duration,
        done: impl Fn(&Answer) -> bool,
    ) -> Option<Instant> {
        let mut next = Instant::now();
        loop {
            if self.query_a(name, POLL_EVERY).is_some_and(|a| done(&a)) {
                return Some(Instant::now());
            }
            next += POLL_EVERY;
            let now = Instant::now();
            if now.duration_since(from) > timeout {
                return None;
            }
            if let Some(wait) = next.checked_duration_since(now) {
                std::thread::sleep(wait);
            } else {
                next = now;
            }
        }
    }
}

// --- Part 4: the sync controller ------------------------------------------------------

/// Exports timed one by one from cluster A to an answer in cluster C.
const SYNC_CHANGES: usize = 50;
/// Exports created at once across the three clusters.
const SYNC_SCALE: usize = 1000;
/// How long `SYNC_SCALE` exports may take to converge before the bench fails.
const SYNC_CONVERGE_TIMEOUT: Duration = Duration::from_secs(300);

fn sync_bench(rt: &tokio::runtime::Runtime) -> Result<()> {
    println!("\n## sync controller on 3 clusters");
    let clusters = Clusters::start_n(3)?;
    let mut clients = Vec::new();
    for i in 0..3 {
        clients.push(rt.block_on(client_from(&clusters.kubeconfig_of(i, "kubeconfig")))?);
    }
    for c in &clients {
        for ns in ["sync-p", "sync-s"] {
            let api: Api<Namespace> = Api::all(c.clone());
            let body = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
            rt.block_on(timed_call(api.patch(ns, &PatchParams::apply("bench"), &Patch::Apply(&body))))?;
        }
    }
    let mut sync = SyncProcess::start(&clusters)?;
    let mut server = Server::start(&clusters.kubeconfig_of(2, "serve"))?;
    server.wait_ready(SERVER_READY_TIMEOUT)?;
    let mut dns = Dns::new(server.dns)?;
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
            None => bail!("{name} not answered in cluster C within 10 s; sync log:\n{}", sync.log_text()),
        }
    }
    let slowest = times.iter().enumerate().max_by_key(|(_, d)| **d).map_or(0, |(i, _)| i);
    println!("\n| what | n | p50 | p90 | p99 | max | goal |\n|---|---|---|---|---|---|---|");
    row("ServiceExport in A → answer in C", &mut times, "p99 ≤ 1 s");
    let retries = sync.log_text().matches("retrying in").count();
    println!("slowest: export #{slowest} (0 is the first after start); reconcile retries so far: {retries}");

    // Scale: 1,000 Services (a third per cluster), then all their exports.
    let writes0 = sync.metric("clusterset_dns_sync_writes_total")?;
    for (c, client) in clients.iter().enumerate() {
        let mine: Vec<usize> = (0..SYNC_SCALE).filter(|i| i % 3 == c).collect();
        let svc: Vec<(String, Value)> =
            mine.iter().map(|i| ("sync-s".into(), service("sync-s", &format!("s-{i}")))).collect();
        let sl: Vec<(String, Value)> =
            mine.iter().map(|i| ("sync-s".into(), own_slice("sync-s", &format!("s-{i}"), c, *i))).collect();
        rt.block_on(create_all(client, &services, svc, "services"))?;
        rt.block_on(create_all(client, &slices, sl, "slices"))?;
    }
    let control_plane = clusters.control_plane_pids()?;
    let cpu = |pids: &[u32]| pids.iter().map(|p| cpu_seconds(*p).unwrap_or(0.0)).sum::<f64>();
    let (plane0, sync0) = (cpu(&control_plane), sync.cpu_seconds()?);
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
    let (plane, sync_cpu) = (cpu(&control_plane) - plane0, sync.cpu_seconds()? - sync0);
    let writes = sync.metric("clusterset_dns_sync_writes_total")? - writes0;
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
        sync.metric("clusterset_dns_sync_writes_total")?,
        sync.metric("clusterset_dns_sync_unchanged_total")?,
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
    let writes = sync.metric("clusterset_dns_sync_writes_total")? - writes1;
    let skipped = sync.metric("clusterset_dns_sync_unchanged_total")? - unchanged1;
    println!(
        "300 Services changed in ways that do not matter: {writes} API writes, {skipped} writes skipped as unchanged"
    );
    println!("sync CPU: {:.1} s in all", sync.cpu_seconds()?);
    server.stop();
    sync.stop();
    Ok(())
}

/// `clusterset-dns sync` over the bench clusters (sync identities).
struct SyncProcess {
    child: Child,
    http: SocketAddr,
    log: Arc<Mutex<String>>,
}

impl SyncProcess {
    fn start(clusters: &Clusters) -> Result<Self> {
        let mut args = vec!["sync".to_owned(), "--http-listen".into(), "127.0.0.1:0".into()];
        for i in 0..3 {
            args.push("--cluster".into());
            args.push(format!("cluster-{}={}", i + 1, clusters.kubeconfig_of(i, "sync").display()));
        }
        let mut child = Command::new("setpriv")
            .args(["--pdeathsig", "TERM", "--", BIN])
            .args(&args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting sync")?;
        let stderr = child.stderr.take().ok_or_else(|| anyhow!("no stderr"))?;
        let log = Arc::new(Mutex::new(String::new()));
        let sink = log.clone();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let line = strip_ansi(&line);
                if line.contains("HTTP /health") {
                    let addr =
                        line.split("addr=").nth(1).and_then(|a| a.split_whitespace().next()?.parse().ok());
                    let _ = tx.send(addr);
                }
                if let Ok(mut l) = sink.lock() {
                    l.push_str(&line);
                    l.push('\n');
                }
            }
        });
        let http = rx
            .recv_timeout(Duration::from_secs(60))
            .ok()
            .flatten()
            .ok_or_else(|| anyhow!("sync did not start"))?;
        Ok(Self { child, http, log })
    }

    fn log_text(&self) -> String {
        self.log.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// A counter or gauge without labels from /metrics.
    fn metric(&self, name: &str) -> Result<f64> {
        let text = http_get(self.http, "/metrics").ok_or_else(|| anyhow!("no /metrics"))?;
        let line = text
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .ok_or_else(|| anyhow!("no {name}"))?;
        Ok(line.split_whitespace().nth(1).ok_or_else(|| anyhow!("bad {name}"))?.parse()?)
    }

    fn cpu_seconds(&self) -> Result<f64> {
        cpu_seconds(self.child.id())
    }

    fn stop(&mut self) {
        let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline && matches!(self.child.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for SyncProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

// --- Processes ----------------------------------------------------------------------

/// One cluster of `scripts/clusters.sh up 1 DIR`; stopped (SIGTERM to the
/// supervisor, which stops etcd and kube-apiserver and removes DIR) on
/// `stop` or drop.
struct Clusters {
    child: Child,
    dir: PathBuf,
    stopped: bool,
}

impl Clusters {
    fn start() -> Result<Self> {
        Self::start_n(1)
    }

    fn start_n(n: usize) -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("clusterset-dns-bench-clusters.").tempdir()?.keep();
        let started = Instant::now();
        let script = Path::new(ROOT).join("scripts/clusters.sh");
        let mut child = Command::new(&script)
            .arg("up")
            .arg(n.to_string())
            .arg(&dir)
            .env("CLUSTERS_PARENT_PID", std::process::id().to_string())
            .env("CLUSTERS_REMOVE_DIR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .with_context(|| format!("running {}", script.display()))?;
        let stdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
        let stderr = child.stderr.take().ok_or_else(|| anyhow!("no stderr"))?;
        let mut me = Self { child, dir, stopped: false };
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("[clusters] {line}");
            }
        });
        for (word, timeout) in [("BINARIES", CLUSTER_BUILD_TIMEOUT), ("READY", CLUSTER_READY_TIMEOUT)] {
            let deadline = Instant::now() + timeout;
            loop {
                match lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                    Ok(line) if line.starts_with(word) => break,
                    Ok(_) => {}
                    Err(RecvTimeoutError::Timeout) => {
                        bail!("clusters.sh: no {word} within {} s", timeout.as_secs())
                    }
                    Err(RecvTimeoutError::Disconnected) => {
                        let status = me.child.wait()?;
                        me.stopped = true;
                        bail!("clusters.sh up exited ({status}) before {word}");
                    }
                }
            }
        }
        println!("cluster ready in {:.1} s ({})", secs(started.elapsed()), me.dir.display());
        Ok(me)
    }

    fn kubeconfig(&self) -> PathBuf {
        self.dir.join("cluster-1/kubeconfig")
    }

    fn serve_kubeconfig(&self) -> PathBuf {
        self.dir.join("cluster-1/serve.kubeconfig")
    }

    /// Cluster `i`'s (0-based) kubeconfig for `role`: `kubeconfig` (admin),
    /// `serve`, `sync`, `centralized`.
    fn kubeconfig_of(&self, i: usize, role: &str) -> PathBuf {
        let file = if role == "kubeconfig" { "kubeconfig".to_owned() } else { format!("{role}.kubeconfig") };
        self.dir.join(format!("cluster-{}", i + 1)).join(file)
    }

    /// The pids of kube-apiserver and etcd, from DIR/state.
    fn pids(&self) -> Result<(u32, u32)> {
        let state = std::fs::read_to_string(self.dir.join("state"))?;
        let field = |key: &str| -> Result<u32> {
            let word = state
                .split_whitespace()
                .find_map(|w| w.strip_prefix(key))
                .ok_or_else(|| anyhow!("no {key} in {state}"))?;
            Ok(word.parse()?)
        };
        Ok((field("apiserver_pid=")?, field("etcd_pid=")?))
    }

    /// Every kube-apiserver and etcd pid of every cluster, from DIR/state.
    fn control_plane_pids(&self) -> Result<Vec<u32>> {
        let state = std::fs::read_to_string(self.dir.join("state"))?;
        Ok(state
            .split_whitespace()
            .filter_map(|w| w.strip_prefix("apiserver_pid=").or_else(|| w.strip_prefix("etcd_pid=")))
            .filter_map(|p| p.parse().ok())
            .collect())
    }

    /// SIGTERM to the supervisor; after 60 s, SIGKILL to its process group.
    fn stop(&mut self) {
        if std::mem::replace(&mut self.stopped, true) {
            return;
        }
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        eprintln!("[bench] supervisor {pid} still running after 60 s: killing its process group");
        let _ = Command::new("kill").args(["-KILL", "--", &format!("-{pid}")]).status();
        let _ = self.child.wait();
    }
}

impl Drop for Clusters {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `clusterset-dns serve` on loopback, watching through a kubeconfig;
/// stderr kept with the time each line arrived; stopped on `stop` or drop
/// (and by the kernel if this process dies: `setpriv --pdeathsig`).
struct Server {
    child: Child,
    started: Instant,
    dns: SocketAddr,
    http: SocketAddr,
    command: String,
    log: Arc<Mutex<Vec<(Duration, String)>>>,
    stopped: bool,
}

impl Server {
    fn start(kubeconfig: &Path) -> Result<Self> {
        let args = [
            "serve",
            "--kubeconfig",
            kubeconfig.to_str().ok_or_else(|| anyhow!("path"))?,
            "--listen",
            "127.0.0.1:0",
            "--http-listen",
            "127.0.0.1:0",
            "--udp-workers",
            "1",
        ];
        let command = format!("RUST_LOG=info {BIN} {}", args.join(" "));
        let started = Instant::now();
        // Spawned from the main thread: the death signal follows this thread.
        let mut child = Command::new("setpriv")
            .args(["--pdeathsig", "TERM", "--", BIN])
            .args(args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting the server under setpriv (util-linux)")?;
        let stderr = child.stderr.take().ok_or_else(|| anyhow!("no stderr"))?;
        let log = Arc::new(Mutex::new(Vec::new()));
        let sink = log.clone();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let at = started.elapsed();
                let addr = strip_ansi(&line)
                    .split("addr=")
                    .nth(1)
                    .and_then(|a| a.split_whitespace().next().and_then(|a| a.parse::<SocketAddr>().ok()));
                if line.contains("HTTP /health") {
                    let _ = tx.send((true, addr));
                } else if line.contains("listening on UDP and TCP") {
                    let _ = tx.send((false, addr));
                }
                if let Ok(mut log) = sink.lock() {
                    log.push((at, line));
                }
            }
        });
        let mut me = Self {
            child,
            started,
            dns: SocketAddr::from(([127, 0, 0, 1], 0)),
            http: SocketAddr::from(([127, 0, 0, 1], 0)),
            command,
            log,
            stopped: false,
        };
        let (mut dns, mut http) = (None, None);
        while dns.is_none() || http.is_none() {
            match rx.recv_timeout(Duration::from_secs(30)) {
                Ok((true, a)) => http = a,
                Ok((false, a)) => dns = a,
                Err(_) => bail!("server did not start:\n{}", me.log_text()),
            }
        }
        me.dns = dns.ok_or_else(|| anyhow!("no DNS address"))?;
        me.http = http.ok_or_else(|| anyhow!("no HTTP address"))?;
        Ok(me)
    }

    /// Polls /ready every 10 ms; returns the time since start.
    fn wait_ready(&self, timeout: Duration) -> Result<Duration> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if http_status(self.http, "/ready") == Some(200) {
                return Ok(self.started.elapsed());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        bail!("server not ready within {} s:\n{}", timeout.as_secs(), self.log_text())
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// utime + stime of every thread, in seconds.
    fn cpu_seconds(&self) -> Result<f64> {
        cpu_seconds(self.pid())
    }

    /// A `kB` field of /proc/PID/status.
    fn status_kib(&self, key: &str) -> Result<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))?;
        let line = status.lines().find(|l| l.starts_with(key)).ok_or_else(|| anyhow!("no {key}"))?;
        Ok(line.split_whitespace().nth(1).ok_or_else(|| anyhow!("bad {key}"))?.parse()?)
    }

    fn log_lines(&self) -> Vec<(Duration, String)> {
        self.log.lock().map(|l| l.clone()).unwrap_or_default()
    }

    fn log_text(&self) -> String {
        self.log_lines().into_iter().map(|(_, l)| l + "\n").collect()
    }

    /// SIGINT: stops at once (SIGTERM would keep answering for the lameduck
    /// period); SIGKILL after 5 s.
    fn stop(&mut self) {
        if std::mem::replace(&mut self.stopped, true) {
            return;
        }
        let _ = Command::new("kill").args(["-INT", &self.pid().to_string()]).status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// utime + stime of every thread of `pid`, in seconds.
fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let rest = stat.rsplit_once(')').map(|(_, r)| r).ok_or_else(|| anyhow!("bad stat"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 of stat(5); `rest` starts at field 3.
    let ticks: u64 = fields.get(11).ok_or_else(|| anyhow!("bad stat"))?.parse::<u64>()?
        + fields.get(12).ok_or_else(|| anyhow!("bad stat"))?.parse::<u64>()?;
    Ok(ticks as f64 / clk_tck() as f64)
}

/// `GET path` over HTTP/1.0; the status code, `None` when unreachable.
fn http_status(addr: SocketAddr, path: &str) -> Option<u16> {
    http_get(addr, path)?.split_whitespace().nth(1)?.parse().ok()
}

/// The whole HTTP/1.0 response to `GET path`.
fn http_get(addr: SocketAddr, path: &str) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    Some(text)
}

// --- Small helpers ------------------------------------------------------------------

fn clk_tck() -> u64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100)
}

/// The first three fields of /proc/loadavg.
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ ... final byte in @..~
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) && c != '[' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

fn rate(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}
