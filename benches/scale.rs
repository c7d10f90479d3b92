//! Start-up at scale with the Kubernetes watch source, against a real
//! kube-apiserver and etcd and the real release binary: a fresh cluster with
//! 10,000 ServiceImports (10 % headless) and 30,000 EndpointSlices (with
//! `SCALE_SERVICES=N`, N imports and 3N slices, N a multiple of 100); creation
//! time, then server starts one after the other on the same cluster, each
//! timed from spawn to ready and to the first correct answers, with CPU and
//! resident memory; then the same two lists without the server. The API
//! server runs with `--feature-gates=WatchList=true` (off by default in
//! v1.33, the test clusters' version) so that streaming lists can be
//! measured; paged lists do not use the gate.
//!
//! The servers (`SCALE_SERVERS`, a comma list, default `ours`): `ours` is
//! `serve --kubeconfig` (the serve identity), `ours-json` the same with
//! `--kube-encoding json`; each `ours…` runs once per way of listing in
//! `SCALE_LISTS` (`paged`, `whole`: one request, `stream`; default
//! `stream`). `coredns` is the incumbent: stock CoreDNS's `kubernetes`
//! plugin with `multicluster clusterset.local` (`common::coredns`, what it
//! lists and why), `coredns-noendpoints` the same with `noendpoints` (no
//! informer on every EndpointSlice). Starts go round by round, each round
//! one start of every server in the order given.
//!
//! `cargo bench --bench scale`; see `common` for how bench targets run.
//! `SCALE_STARTS=N` starts per server (default 3), `SCALE_READY_TIMEOUT=S`
//! seconds a start may take (default 600), `SCALE_BARE_LISTS=0` skips the
//! lists without the server.

#![allow(clippy::print_stdout)]

#[path = "../tests/harness/mod.rs"]
mod harness;

mod common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clusterset_dns::k8s::mcs::mcs_resource;
use hickory_proto::rr::Name;
use kube::api::{Api, ApiResource, DynamicObject, ListParams};

use common::coredns::{GO_RUNTIME_ENV, Incumbent};
use common::dns::{Dns, POLL_EVERY};
use common::objects::{Fleet, create_fleet, import_resource, slice_resource, timed_call};
use common::report::ms;
use common::{main_of, serve_with, start_clusters_env};
use harness::BIN;
use harness::procfs::loadavg;
use harness::served::Served;

fn main() {
    main_of("scale", scale);
}

/// utime + stime of a control-plane process, in seconds.
fn cpu_seconds(pid: u32) -> Result<f64> {
    harness::procfs::cpu_seconds(pid).ok_or_else(|| anyhow::anyhow!("no /proc/{pid}/stat"))
}

/// How long checking every service once may take, at most; the rest is
/// reported unchecked.
const CHECK_TIMEOUT: Duration = Duration::from_secs(300);

/// `NAME=N` from the environment, `default` when unset.
fn env_number(name: &str, default: usize) -> Result<usize> {
    match std::env::var(name) {
        Ok(n) => n.parse().map_err(|e| anyhow::anyhow!("{name}={n}: {e}")),
        Err(_) => Ok(default),
    }
}

fn scale(rt: &tokio::runtime::Runtime) -> Result<()> {
    let services = env_number("SCALE_SERVICES", 10_000)?;
    if services < 1_000 || !services.is_multiple_of(100) {
        bail!("SCALE_SERVICES={services}: at least 1,000, a multiple of 100 (100 namespaces)");
    }
    let servers = scale_servers()?;
    let starts = env_number("SCALE_STARTS", 3)?;
    let timeout = Duration::from_secs(env_number("SCALE_READY_TIMEOUT", 600)? as u64);
    println!(
        "\n## scale: {services} ServiceImports (10 % headless), {} EndpointSlices",
        services * common::objects::CLUSTER_IDS.len()
    );
    let fleet = Fleet { prefix: "s", namespaces: 100, per_namespace: services / 100, headless_every: 10 };
    let clusters = start_clusters_env(1, &[("CLUSTERS_APISERVER_ARGS", "--feature-gates=WatchList=true")]);
    let client = rt.block_on(clusters.client(0));
    rt.block_on(create_fleet(&client, &fleet))?;
    println!("load average after creation: {}", loadavg());
    let kubeconfigs = Kubeconfigs {
        serve: clusters.serve_kubeconfig(0),
        coredns: if servers.iter().any(|s| matches!(s.kind, Kind::CoreDns(_))) {
            rt.block_on(check_v1alpha1(&client, fleet.services()))?;
            Some(rt.block_on(common::coredns::identity(&client, &clusters.serve_kubeconfig(0)))?)
        } else {
            None
        },
    };

    let mut runs = Vec::new();
    for round in 1..=starts {
        for server in &servers {
            let r = start_server(server, &kubeconfigs, clusters.pids(0), &fleet, timeout, round == 1)?;
            runs.push(r);
        }
    }
    println!("\nservers, each started {starts} times:\n");
    for server in &servers {
        if let Some(r) = runs.iter().find(|r| r.server == server.label) {
            println!("- {}: `{}`", server.label, r.command);
        }
    }
    if let Some(r) = runs.iter().find(|r| r.corefile.is_some()) {
        println!(
            "\n{}, Go runtime defaults ({} unset; GOMAXPROCS = {} CPUs), Corefile (`coredns-noendpoints` adds `noendpoints`):\n\n```\n{}```",
            common::coredns::version(),
            GO_RUNTIME_ENV.join(", "),
            harness::procfs::cpus(),
            r.corefile.as_deref().unwrap_or_default()
        );
    }
    println!(
        "\n{starts} rounds, each one start of every server, on the same cluster, one after the other; \
         ms from process start (spawn) to:\n"
    );
    println!(
        "| start | server | lists | ServiceImports listed (log) | EndpointSlices listed (log) | first correct ClusterSetIP A | \
         first correct headless A (12) | ready (200) | CPU to ready: server, kube-apiserver, etcd | VmRSS ready | VmRSS +5 s | VmHWM | wrong answers | load avg |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (k, r) in runs.iter().enumerate() {
        let unchecked = if r.unchecked > 0 { format!(" ({} unchecked)", r.unchecked) } else { String::new() };
        let logged = |t: Option<Duration>| t.map_or("–".to_owned(), |t| format!("{:.0}", ms(t)));
        println!(
            "| {} | {} | {} | {} | {} | {:.0} | {:.0} | **{:.0}** | {:.2} s, {:.2} s, {:.2} s | {:.1} MB | {:.1} MB | {:.1} MB | {} of {}{unchecked} | {} |",
            k + 1,
            r.server,
            r.lists,
            logged(r.imports_listed),
            logged(r.slices_listed),
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
    println!(
        "\nready: ours `/ready`, CoreDNS its `ready` plugin's `/ready` (polled every 10 ms); \
         CPU to ready: from spawn until ready and both answers correct"
    );
    println!("goals (ours): /ready ≤ 5,000 ms; VmRSS ≤ 300 MB");
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

/// The servers `SCALE_SERVERS` may name.
const SERVERS: [(&str, Kind); 4] = [
    ("ours", Kind::Ours(&[])),
    ("ours-json", Kind::Ours(&["--kube-encoding", "json"])),
    ("coredns", Kind::CoreDns(&[])),
    ("coredns-noendpoints", Kind::CoreDns(&["noendpoints"])),
];

/// What kind of server, and its options.
#[derive(Clone, Copy)]
enum Kind {
    /// `clusterset-dns serve` with these flags (and a way of listing).
    Ours(&'static [&'static str]),
    /// CoreDNS with these lines added to its `kubernetes` block.
    CoreDns(&'static [&'static str]),
}

/// One server configuration of the runs.
struct Server {
    /// Its name in `SCALE_SERVERS`, as the report shows it.
    label: String,
    /// The way of listing, as the report shows it.
    lists: &'static str,
    kind: Kind,
    /// Ours: the flags for the way of listing.
    list_flags: &'static [&'static str],
}

/// The servers `SCALE_SERVERS` names (default `ours`), each `ours…` once per
/// way of listing in `SCALE_LISTS` (default `stream`), in their order.
fn scale_servers() -> Result<Vec<Server>> {
    let names = std::env::var("SCALE_SERVERS").unwrap_or_else(|_| "ours".to_owned());
    let lists = std::env::var("SCALE_LISTS").unwrap_or_else(|_| "stream".to_owned());
    let lists =
        lists
            .split(',')
            .map(|name| {
                LISTS.iter().find(|(n, _, _)| *n == name).map(|&(_, what, flags)| (what, flags)).ok_or_else(
                    || anyhow::anyhow!("SCALE_LISTS: {name:?} is not one of paged, whole, stream"),
                )
            })
            .collect::<Result<Vec<_>>>()?;
    let mut servers = Vec::new();
    for name in names.split(',') {
        let Some(&(label, kind)) = SERVERS.iter().find(|(n, _)| *n == name) else {
            let known: Vec<&str> = SERVERS.iter().map(|(n, _)| *n).collect();
            bail!("SCALE_SERVERS: {name:?} is not one of {}", known.join(", "));
        };
        match kind {
            Kind::Ours(flags) => {
                for flag in flags.iter().filter(|f| f.starts_with("--")) {
                    ensure_flag(flag)?;
                }
                for &(lists, list_flags) in &lists {
                    servers.push(Server { label: label.to_owned(), lists, kind, list_flags });
                }
            }
            Kind::CoreDns(_) => {
                servers.push(Server { label: label.to_owned(), lists: "informers", kind, list_flags: &[] })
            }
        }
    }
    Ok(servers)
}

/// Fails unless this build's `serve --help` knows `flag`: before minutes of
/// creating objects, not after.
fn ensure_flag(flag: &str) -> Result<()> {
    let help = std::process::Command::new(BIN).args(["serve", "--help"]).output().context("serve --help")?;
    if !String::from_utf8_lossy(&help.stdout).contains(flag) {
        bail!("{BIN} serve has no {flag} (SCALE_SERVERS names a server that needs it)");
    }
    Ok(())
}

/// Fails unless the API server serves every ServiceImport as v1alpha1,
/// the version CoreDNS reads (the CRD of `deploy/crds/` serves v1alpha1 and
/// v1beta1, schemas identical, v1beta1 stored); prints the first as
/// v1alpha1.
async fn check_v1alpha1(client: &kube::Client, services: usize) -> Result<()> {
    let api: Api<DynamicObject> =
        Api::all_with(client.clone(), &mcs_resource("v1alpha1", "ServiceImport", "serviceimports"));
    let list = timed_call(api.list(&ListParams::default().limit(1))).await.context("list v1alpha1")?;
    let seen = list.items.len() + list.metadata.remaining_item_count.unwrap_or(0).max(0) as usize;
    let Some(first) = list.items.first() else { bail!("no ServiceImport served as v1alpha1") };
    println!(
        "\nServiceImports served as multicluster.x-k8s.io/v1alpha1 (what CoreDNS lists): {seen}; the first: {} {}/{} spec {}",
        first.types.as_ref().map_or("", |t| t.api_version.as_str()),
        first.metadata.namespace.as_deref().unwrap_or_default(),
        first.metadata.name.as_deref().unwrap_or_default(),
        first.data["spec"]
    );
    if seen != services {
        bail!("{seen} ServiceImports served as v1alpha1, {services} created");
    }
    Ok(())
}

/// The kubeconfigs the servers run with.
struct Kubeconfigs {
    /// Ours: the serve ServiceAccount (ServiceImports and EndpointSlices).
    serve: PathBuf,
    /// CoreDNS: its own ServiceAccount (`common::coredns::identity`).
    coredns: Option<PathBuf>,
}

/// A running server of either kind.
enum Running {
    Ours(Served),
    CoreDns(Incumbent),
}

impl Running {
    fn start(server: &Server, kubeconfigs: &Kubeconfigs) -> Result<Self> {
        Ok(match server.kind {
            Kind::Ours(flags) => {
                let mut extra = server.list_flags.to_vec();
                extra.extend_from_slice(flags);
                Self::Ours(serve_with(&kubeconfigs.serve, &extra))
            }
            Kind::CoreDns(options) => {
                let kubeconfig = kubeconfigs.coredns.as_deref().context("no CoreDNS identity")?;
                Self::CoreDns(Incumbent::start(kubeconfig, options)?)
            }
        })
    }

    fn addr(&self) -> SocketAddr {
        match self {
            Self::Ours(s) => s.addr,
            Self::CoreDns(c) => c.addr,
        }
    }

    fn started(&self) -> Instant {
        match self {
            Self::Ours(s) => s.started,
            Self::CoreDns(c) => c.started,
        }
    }

    fn is_ready(&self) -> bool {
        match self {
            Self::Ours(s) => s.is_ready(),
            Self::CoreDns(c) => c.is_ready(),
        }
    }

    /// Whether the process has exited.
    fn exited(&mut self) -> bool {
        match self {
            Self::Ours(s) => s.exited(),
            Self::CoreDns(c) => c.exited().is_some(),
        }
    }

    fn cpu_seconds(&self) -> f64 {
        match self {
            Self::Ours(s) => s.cpu_seconds(),
            Self::CoreDns(c) => c.cpu_seconds(),
        }
    }

    fn status_kib(&self, key: &str) -> u64 {
        match self {
            Self::Ours(s) => s.status_kib(key),
            Self::CoreDns(c) => c.status_kib(key),
        }
    }

    fn log_lines(&self) -> Vec<(Duration, String)> {
        match self {
            Self::Ours(s) => s.log_lines(),
            Self::CoreDns(c) => c.log_lines(),
        }
    }

    fn log(&self) -> String {
        match self {
            Self::Ours(s) => s.log(),
            Self::CoreDns(c) => c.log(),
        }
    }

    fn command(&self) -> &str {
        match self {
            Self::Ours(s) => &s.command,
            Self::CoreDns(c) => &c.command,
        }
    }

    fn stop(&mut self) {
        match self {
            Self::Ours(s) => s.stop(),
            Self::CoreDns(c) => c.stop(),
        }
    }
}

struct StartRun {
    server: String,
    lists: &'static str,
    command: String,
    corefile: Option<String>,
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
    unchecked: usize,
    load: String,
}

/// Starts the server, polls its readiness (every 10 ms) and two names
/// (every 1 ms) whose answers need everything listed: a ClusterSetIP VIP
/// and a headless service's 12 endpoints. Then checks every service once
/// and reads the memory again 5 s later.
fn start_server(
    server: &Server,
    kubeconfigs: &Kubeconfigs,
    (apiserver, etcd): (u32, u32),
    fleet: &Fleet,
    timeout: Duration,
    print_log: bool,
) -> Result<StartRun> {
    let (vn, vi) = (fleet.namespaces - 1, fleet.per_namespace - 1);
    let (hn, hi) = (fleet.namespaces - 1, fleet.per_namespace - fleet.headless_every);
    let vip_name = Name::from_ascii(fleet.fqdn(vn, vi))?;
    let headless_name = Name::from_ascii(fleet.fqdn(hn, hi))?;
    let (vip_want, headless_want) = (fleet.expected(vn, vi), fleet.expected(hn, hi));

    let (apiserver0, etcd0) = (cpu_seconds(apiserver)?, cpu_seconds(etcd)?);
    let mut running = Running::start(server, kubeconfigs)?;
    let start = running.started();
    let mut dns = Dns::new(running.addr())?;
    let (mut ready_at, mut vip_at, mut headless_at) = (None, None, None);
    let mut last_ready_check = Instant::now() - Duration::from_secs(1);
    let deadline = start + timeout;
    let (ready_at, vip_at, headless_at) = loop {
        if let (Some(r), Some(v), Some(h)) = (ready_at, vip_at, headless_at) {
            break (r, v, h);
        }
        if Instant::now() > deadline || running.exited() {
            let why = if running.exited() { "exited" } else { "timed out" };
            bail!(
                "{}: {why}, not ready and answering within {} s (SCALE_READY_TIMEOUT); log:\n{}",
                server.label,
                timeout.as_secs(),
                running.log()
            );
        }
        if ready_at.is_none() && last_ready_check.elapsed() >= Duration::from_millis(10) {
            last_ready_check = Instant::now();
            if running.is_ready() {
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
    let cpu_ready = running.cpu_seconds();
    let apiserver_cpu = cpu_seconds(apiserver)? - apiserver0;
    let etcd_cpu = cpu_seconds(etcd)? - etcd0;
    let rss_ready = running.status_kib("VmRSS");
    let load = loadavg();
    // Every service, asked once, for CHECK_TIMEOUT at most.
    let (mut wrong, mut unchecked) = (0usize, 0usize);
    let check_started = Instant::now();
    let check_deadline = check_started + CHECK_TIMEOUT;
    for j in 0..fleet.services() {
        if Instant::now() > check_deadline {
            unchecked = fleet.services() - j;
            break;
        }
        let (n, i) = fleet.service(j);
        let ok = dns
            .query_a(&Name::from_ascii(fleet.fqdn(n, i))?, Duration::from_millis(500))
            .is_some_and(|a| a.ips == fleet.expected(n, i));
        wrong += usize::from(!ok);
    }
    eprintln!(
        "[bench] {}: ready {:.0} ms after its start; every service asked in {:.1} s, {wrong} wrong, {unchecked} unchecked",
        server.label,
        ms(ready_at),
        check_started.elapsed().as_secs_f64()
    );
    std::thread::sleep(Duration::from_secs(5));
    let rss_later = running.status_kib("VmRSS");
    let hwm = running.status_kib("VmHWM");
    let log = running.log_lines();
    let listed = |what: &str| {
        log.iter().find(|(_, l)| l.contains("watch listed") && l.contains(what)).map(|(t, _)| *t)
    };
    if print_log {
        print_start_log(&server.label, &log);
    }
    let run = StartRun {
        server: server.label.clone(),
        lists: server.lists,
        command: running.command().to_owned(),
        corefile: match &running {
            Running::CoreDns(c) => Some(c.corefile.clone()),
            Running::Ours(_) => None,
        },
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
        unchecked,
        load,
    };
    running.stop();
    Ok(run)
}

/// The lines of a first start's log that say how it started: ours its
/// watches and listeners; CoreDNS all but the `ready` plugin's line per
/// 503 answer, which are counted.
fn print_start_log(label: &str, log: &[(Duration, String)]) {
    let not_ready = log.iter().filter(|(_, l)| l.contains("Plugins not ready")).count();
    println!("\nlog of {label}'s first start, ms after process start (when the bench read the line):\n");
    println!("```");
    let shown = |line: &str| {
        if label.starts_with("coredns") {
            !line.contains("Plugins not ready")
        } else {
            ["watching", "listed", "ready", "HTTP", "listening", "WARN", "ERROR"]
                .iter()
                .any(|w| line.contains(w))
        }
    };
    for (t, line) in log.iter().filter(|(_, l)| shown(l)).take(60) {
        println!("{:>7.0} ms  {}", ms(*t), line);
    }
    println!("```");
    if not_ready > 0 {
        println!("(and {not_ready} lines `[INFO] plugin/ready: Plugins not ready: …`, one per 503)");
    }
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
