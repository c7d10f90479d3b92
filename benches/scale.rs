//! Start-up at scale with the Kubernetes watch source, against a real
//! kube-apiserver and etcd and the real release binary: a fresh cluster with
//! 10,000 ServiceImports (10 % headless) and 30,000 EndpointSlices (with
//! `SCALE_SERVICES=N`, N imports and 3N slices, N a multiple of 100); creation
//! time, then three server starts per way of listing (paged, one request,
//! streaming), each timed from spawn to `/ready` and to the first correct
//! answers, with resident memory; then the same two lists without the
//! server. The API server runs with `--feature-gates=WatchList=true` (off by
//! default in v1.33, the test clusters' version) so that streaming lists
//! can be measured; paged lists do not use the gate.
//!
//! `cargo bench --bench scale`; see `common` for how bench targets run.
//! `SCALE_LISTS=paged,whole,stream` chooses the ways of listing (default:
//! all three), `SCALE_STARTS=N` the starts per way (default 3), and
//! `SCALE_BARE_LISTS=0` skips the lists without the server.

#![allow(clippy::print_stdout)]

#[path = "../tests/harness/mod.rs"]
mod harness;

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use hickory_proto::rr::Name;
use kube::api::{Api, ApiResource, DynamicObject, ListParams};

use common::dns::{Dns, POLL_EVERY};
use common::objects::{Fleet, create_fleet, import_resource, slice_resource, timed_call};
use common::report::ms;
use common::{SERVER_READY_TIMEOUT, main_of, serve_with, start_clusters_env};
use harness::procfs::loadavg;

fn main() {
    main_of("scale", scale);
}

/// utime + stime of a control-plane process, in seconds.
fn cpu_seconds(pid: u32) -> Result<f64> {
    harness::procfs::cpu_seconds(pid).ok_or_else(|| anyhow::anyhow!("no /proc/{pid}/stat"))
}

fn scale(rt: &tokio::runtime::Runtime) -> Result<()> {
    let services: usize = match std::env::var("SCALE_SERVICES") {
        Ok(n) => n.parse().map_err(|e| anyhow::anyhow!("SCALE_SERVICES={n}: {e}"))?,
        Err(_) => 10_000,
    };
    if services < 1_000 || !services.is_multiple_of(100) {
        bail!("SCALE_SERVICES={services}: at least 1,000, a multiple of 100 (100 namespaces)");
    }
    println!(
        "\n## scale: {services} ServiceImports (10 % headless), {} EndpointSlices",
        services * common::objects::CLUSTER_IDS.len()
    );
    let fleet = Fleet { prefix: "s", namespaces: 100, per_namespace: services / 100, headless_every: 10 };
    let lists = scale_lists()?;
    let starts: usize = match std::env::var("SCALE_STARTS") {
        Ok(n) => n.parse().map_err(|e| anyhow::anyhow!("SCALE_STARTS={n}: {e}"))?,
        Err(_) => 3,
    };
    let clusters = start_clusters_env(1, &[("CLUSTERS_APISERVER_ARGS", "--feature-gates=WatchList=true")]);
    let client = rt.block_on(clusters.client(0));
    rt.block_on(create_fleet(&client, &fleet))?;
    println!("load average after creation: {}", loadavg());

    let mut runs = Vec::new();
    for (paging, extra) in &lists {
        for run in 1..=starts {
            let r = start_server(&clusters.serve_kubeconfig(0), clusters.pids(0), &fleet, extra, run == 1)?;
            runs.push((*paging, r));
        }
    }
    println!("\nserver: {}\n", runs.first().map_or("", |(_, r)| r.command.as_str()));
    println!(
        "{starts} starts of the server on the same cluster per way of listing, one after the other; \
         ms from process start (spawn) to:\n"
    );
    println!(
        "| start | lists | ServiceImports listed (log) | EndpointSlices listed (log) | first correct ClusterSetIP A | \
         first correct headless A (12) | /ready 200 | CPU to ready: server, kube-apiserver, etcd | VmRSS ready | VmRSS +5 s | VmHWM | wrong answers | load avg |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (k, (paging, r)) in runs.iter().enumerate() {
        println!(
            "| {} | {paging} | {:.0} | {:.0} | {:.0} | {:.0} | **{:.0}** | {:.2} s, {:.2} s, {:.2} s | {:.1} MB | {:.1} MB | {:.1} MB | {} of {} | {} |",
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
    if std::env::var("SCALE_BARE_LISTS").is_ok_and(|v| v == "0") {
        drop(clusters);
        return Ok(());
    }

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
    drop(clusters);
    Ok(())
}

/// The server's ways of listing: (name in `SCALE_LISTS`, in the report, flags).
const LISTS: [(&str, &str, &[&str]); 3] = [
    ("paged", "pages of 500", &["--list-mode", "paged"]),
    ("whole", "one request", &["--list-mode", "paged", "--list-page-size", "0"]),
    ("stream", "streaming", &["--list-mode", "stream"]),
];

/// The ways of listing `SCALE_LISTS` names (all by default), in its order.
fn scale_lists() -> Result<Vec<(&'static str, &'static [&'static str])>> {
    let Ok(names) = std::env::var("SCALE_LISTS") else {
        return Ok(LISTS.iter().map(|&(_, what, flags)| (what, flags)).collect());
    };
    names
        .split(',')
        .map(|name| {
            LISTS
                .iter()
                .find(|(n, _, _)| *n == name)
                .map(|&(_, what, flags)| (what, flags))
                .ok_or_else(|| anyhow::anyhow!("SCALE_LISTS: {name:?} is not one of paged, whole, stream"))
        })
        .collect()
}

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
    extra: &[&str],
    print_log: bool,
) -> Result<StartRun> {
    let (vn, vi) = (fleet.namespaces - 1, fleet.per_namespace - 1);
    let (hn, hi) = (fleet.namespaces - 1, fleet.per_namespace - fleet.headless_every);
    let vip_name = Name::from_ascii(fleet.fqdn(vn, vi))?;
    let headless_name = Name::from_ascii(fleet.fqdn(hn, hi))?;
    let (vip_want, headless_want) = (fleet.expected(vn, vi), fleet.expected(hn, hi));

    let (apiserver0, etcd0) = (cpu_seconds(apiserver)?, cpu_seconds(etcd)?);
    let mut server = serve_with(kubeconfig, extra);
    let start = server.started;
    let mut dns = Dns::new(server.addr)?;
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
                server.log()
            );
        }
        if ready_at.is_none() && last_ready_check.elapsed() >= Duration::from_millis(10) {
            last_ready_check = Instant::now();
            if server.is_ready() {
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
    let cpu_ready = server.cpu_seconds();
    let apiserver_cpu = cpu_seconds(apiserver)? - apiserver0;
    let etcd_cpu = cpu_seconds(etcd)? - etcd0;
    let rss_ready = server.status_kib("VmRSS");
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
    let rss_later = server.status_kib("VmRSS");
    let hwm = server.status_kib("VmHWM");
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
                println!("{:>7.0} ms  {}", ms(*t), line);
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
