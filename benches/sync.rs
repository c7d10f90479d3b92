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
//! With `SYNC_FLEET=EXPORTS` (e.g. 1000), only the fleet at scale: that many
//! exports on ten clusters, once with one replica (and a standby, for the
//! failover) and once with two replicas sharing four shards (`--shards 4`):
//! time to converge, writes, each replica's CPU and peak RSS, the API
//! servers' CPU, and the time until one replica leads every shard after
//! the other is killed, with the writes that costs (none expected).
//!
//! With `SYNC_CHURN=N`, only change → answer across a fleet of ten (with
//! `SYNC_CHURN_MODE=hub`, an agent per member and a hub instead of sync): `serve`
//! in every member on its own API; while background changes run at
//! [`CHURN_PER_SECOND`], N exports created, N endpoints added and N removed
//! in one member, each timed from its write's return until `serve` in every
//! other member answers it.
//!
//! `cargo bench --bench sync`; see `common` for how bench targets run.

#![allow(clippy::print_stdout)]

#[path = "../tests/harness/mod.rs"]
mod harness;

mod common;

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use clusterset_dns::k8s::mcs::{ANNOTATION_TRIGGER_TIME, mcs_resource};
use hickory_proto::rr::Name;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::{Value, json};

use common::dns::{Answer, Dns};
use common::exports::{converge, export, export_all, hub_agents, own_slice, prepare, service};
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
    if let Ok(n) = std::env::var("SYNC_CHURN") {
        let n: usize = n.parse().context("SYNC_CHURN: a number of changes of each kind")?;
        return churn(rt, n);
    }
    if let Ok(n) = std::env::var("SYNC_FLEET") {
        let n: usize = n.parse().context("SYNC_FLEET: a number of exports")?;
        return fleet(rt, n);
    }
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

/// `n` exports on [`FLEET_CLUSTERS`] clusters, with one replica and then
/// with two sharing four shards.
fn fleet(rt: &tokio::runtime::Runtime, n: usize) -> Result<()> {
    println!("\n## {n} exports on {FLEET_CLUSTERS} clusters, one replica");
    let clusters = start_clusters(FLEET_CLUSTERS);
    let clients: Vec<kube::Client> = (0..FLEET_CLUSTERS).map(|i| rt.block_on(clusters.client(i))).collect();
    let mut sync = Syncing::start_tied(&clusters, &["--identity", "leader"]);
    wait_leading(&sync)?;
    let standby = Syncing::start_tied(&clusters, &["--identity", "standby"]);
    standby.http();
    scale(rt, &clusters, &clients, &mut sync, standby, n, 30)?;
    drop(clusters);

    println!("\n## {n} exports on {FLEET_CLUSTERS} clusters, two replicas, --shards 4");
    let clusters = start_clusters(FLEET_CLUSTERS);
    let clients: Vec<kube::Client> = (0..FLEET_CLUSTERS).map(|i| rt.block_on(clusters.client(i))).collect();
    let sharded = ["--shards", "4", "--lease-duration", "15"];
    let mut a = Syncing::start_tied(&clusters, &[&sharded[..], &["--identity", "a"]].concat());
    let mut b = Syncing::start_tied(&clusters, &[&sharded[..], &["--identity", "b"]].concat());
    let since = Instant::now();
    while !(led(&a)? == 2 && led(&b)? == 2) {
        if since.elapsed() > FAILOVER_TIMEOUT {
            bail!("the shards did not split 2/2:\n{}\n{}", a.log(), b.log());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    println!("the shards split 2/2 {:.1} s after start", secs(since.elapsed()));
    prepare(rt, &clients, n)?;
    let control_plane = clusters.control_plane_pids();
    let cpu = |pids: &[u32]| pids.iter().map(|p| cpu_seconds(*p).unwrap_or(0.0)).sum::<f64>();
    let (plane0, a0, b0) = (cpu(&control_plane), a.cpu_seconds(), b.cpu_seconds());
    let (started, _) = export_all(&clients, n)?;
    let converged = converge(rt, &clients, n, started)?;
    let (plane, a_cpu, b_cpu) = (cpu(&control_plane) - plane0, a.cpu_seconds() - a0, b.cpu_seconds() - b0);
    let (wa, wb) = (quiet(&a)?, quiet(&b)?);
    println!(
        "every member holds {n} imports with a VIP {:.1} s after the exports were created; writes: a {wa}, b {wb} ({:.1} per export)",
        secs(converged),
        (wa + wb) / n as f64
    );
    println!(
        "CPU meanwhile: a {a_cpu:.1} s, b {b_cpu:.1} s, {FLEET_CLUSTERS} API servers + etcd {plane:.1} s; peak RSS a {} MiB, b {} MiB (load average {})",
        a.peak_rss_kib() / 1024,
        b.peak_rss_kib() / 1024,
        loadavg()
    );
    // One replica killed (its Leases not given up): the other takes its
    // shards once they have been unchanged for the lease duration.
    let before = metric(&b, "clusterset_dns_sync_writes_total")?;
    a.kill();
    let killed = Instant::now();
    while led(&b)? < 4 {
        if killed.elapsed() > FAILOVER_TIMEOUT {
            bail!("b did not take every shard:\n{}", b.log());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let took = killed.elapsed();
    let after = quiet(&b)?;
    println!(
        "a killed: b led all 4 shards {:.1} s later (lease 15 s); writes since {}",
        secs(took),
        after - before
    );
    b.stop();
    Ok(())
}

/// Background changes per second while `churn` measures.
const CHURN_PER_SECOND: u32 = 10;
/// Headless services the background changes are made to.
const CHURN_SERVICES: usize = 100;

/// Change → answer at ten members under [`CHURN_PER_SECOND`].
fn churn(rt: &tokio::runtime::Runtime, n: usize) -> Result<()> {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let hub = std::env::var("SYNC_CHURN_MODE").is_ok_and(|m| m == "hub");
    let mode = if hub { "hub mode, an agent per member" } else { "push mode, one sync" };
    println!(
        "\n## change → answer on {FLEET_CLUSTERS} clusters, {CHURN_PER_SECOND} background changes/s, {mode}"
    );
    // In hub mode cluster 0 is the hub and the members follow it.
    let first = usize::from(hub);
    let clusters = start_clusters(FLEET_CLUSTERS + first);
    let members: Vec<usize> = (first..first + FLEET_CLUSTERS).collect();
    let clients: Vec<kube::Client> = members.iter().map(|&i| rt.block_on(clusters.client(i))).collect();
    let ns = "churn";
    for c in &clients {
        let api: Api<Namespace> = Api::all(c.clone());
        let body = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
        rt.block_on(timed_call(api.patch(ns, &PatchParams::apply("bench"), &Patch::Apply(&body))))?;
    }
    let dir = tempfile::tempdir()?;
    let controllers = if hub {
        hub_agents(&clusters, dir.path(), &["--namespace", ns])?
    } else {
        let sync = Syncing::start_tied(&clusters, &["--identity", "leader", "--namespace", ns]);
        wait_leading(&sync)?;
        vec![sync]
    };
    let sync = &controllers[0];
    let controller_cpu = || controllers.iter().map(Syncing::cpu_seconds).sum::<f64>();
    let mut servers = Vec::new();
    for &i in &members {
        let kubeconfig = clusters.serve_kubeconfig(i);
        let s = common::serve_with(&kubeconfig, &["--namespace", ns]);
        s.wait_ready(SERVER_READY_TIMEOUT);
        servers.push(s);
    }
    let mut dns: Vec<Dns> = servers.iter().map(|s| Dns::new(s.addr)).collect::<Result<_>>()?;
    let services = ApiResource::erase::<k8s_openapi::api::core::v1::Service>(&());
    let slices = slice_resource();
    let exports = mcs_resource("v1alpha1", "ServiceExport", "serviceexports");
    // The background: headless services, one per member in turn, exported.
    for (c, client) in clients.iter().enumerate() {
        let mine: Vec<usize> = (0..CHURN_SERVICES).filter(|i| i % FLEET_CLUSTERS == c).collect();
        let svc = mine.iter().map(|i| (ns.into(), headless(ns, &format!("bg-{i}")))).collect();
        let sl = mine
            .iter()
            .map(|i| (ns.into(), slice_of(ns, &format!("bg-{i}"), &[address(c, *i, 0)])))
            .collect();
        let ex = mine.iter().map(|i| (ns.into(), export(ns, &format!("bg-{i}")))).collect();
        rt.block_on(create_all(client, &services, svc, "services"))?;
        rt.block_on(create_all(client, &slices, sl, "slices"))?;
        rt.block_on(create_all(client, &exports, ex, "exports"))?;
    }
    let last = Name::from_ascii(format!("bg-{}.{ns}.svc.clusterset.local.", CHURN_SERVICES - 1))?;
    for d in &mut dns {
        if d.poll_until(&last, Instant::now(), SYNC_CONVERGE_TIMEOUT, |a| !a.ips.is_empty()).is_none() {
            bail!("the background services were not answered everywhere:\n{}", sync.log());
        }
    }
    let stop = AtomicBool::new(false);
    let made = AtomicUsize::new(0);
    let cpu0 = controller_cpu();
    let began = Instant::now();
    let measured = std::thread::scope(|scope| -> Result<Measured> {
        // Each background change replaces one service's endpoint in its own
        // member; bounded by count and by `stop`.
        let churner = scope.spawn(|| -> Result<()> {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            let every = Duration::from_secs(1) / CHURN_PER_SECOND;
            let mut next = Instant::now();
            for k in 0..100_000usize {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let i = k % CHURN_SERVICES;
                let c = i % FLEET_CLUSTERS;
                let body = slice_of(ns, &format!("bg-{i}"), &[address(c, i, 1 + k / CHURN_SERVICES % 2)]);
                let api: Api<DynamicObject> = Api::namespaced_with(clients[c].clone(), ns, &slices);
                let name = format!("bg-{i}-own");
                rt.block_on(timed_call(api.patch(
                    &name,
                    &PatchParams::apply("bench").force(),
                    &Patch::Apply(&body),
                )))?;
                made.fetch_add(1, Ordering::Relaxed);
                next += every;
                if let Some(wait) = next.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
            }
            Ok(())
        });
        let result = measure_changes(rt, &clients[0], &mut dns, sync, n);
        stop.store(true, Ordering::Relaxed);
        churner.join().map_err(|_| anyhow!("the churner panicked"))??;
        result
    })?;
    let Measured { everywhere: [mut created, mut added, mut removed], each } = measured;
    let rate = made.load(Ordering::Relaxed) as f64 / began.elapsed().as_secs_f64();
    println!(
        "\nbackground: {rate:.1} changes/s achieved; controllers' CPU {:.1} s over {:.0} s (load average {})",
        controller_cpu() - cpu0,
        began.elapsed().as_secs_f64(),
        loadavg()
    );
    println!(
        "\n| change in member 1, until serve in all {} others answers it | n | p50 | p90 | p99 | max | goal |\n|---|---|---|---|---|---|---|",
        FLEET_CLUSTERS - 1
    );
    row("ServiceExport created (headless)", &mut created, "p99 ≤ 1 s");
    row("endpoint added", &mut added, "p99 ≤ 1 s");
    row("endpoint removed", &mut removed, "p99 ≤ 1 s");
    live_beside_bench(&servers[1..], each);
    for s in &mut servers {
        s.stop();
    }
    Ok(())
}

/// `serve`'s live histogram in the other members beside the bench's own
/// timing of the same changes, from each change's trigger time to each
/// member's answer. A created service's slice is written before its
/// ServiceImport and so is counted `unserved`, not observed: the
/// histogram holds the added and removed endpoints.
fn live_beside_bench(others: &[harness::served::Served], each: [Vec<Duration>; 3]) {
    let scrapes: Vec<String> = others.iter().map(|s| s.get("/metrics").1).collect();
    let buckets = programming_buckets(&scrapes);
    let unmeasured = |cause: &str| -> f64 {
        let line = format!("clusterset_dns_programming_unmeasured_total{{cause=\"{cause}\"}}");
        scrapes.iter().filter_map(|s| harness::http::metric_value(s, &line)).sum()
    };
    let [_, added, removed] = each;
    let mut bench: Vec<Duration> = added.into_iter().chain(removed).collect();
    bench.sort();
    let observed = buckets.last().map_or(0.0, |(_, c)| *c);
    println!(
        "\n| trigger time → answer, each of the {} others | n | p50 | p99 |\n|---|---|---|---|",
        others.len()
    );
    println!(
        "| bench: endpoint added or removed | {} | {:.1} ms | {:.1} ms |",
        bench.len(),
        common::report::percentile(&bench, 0.5),
        common::report::percentile(&bench, 0.99)
    );
    let cell = |(v, lo, hi): (f64, f64, f64)| format!("{v:.1} ms (bucket {lo:.0}–{hi:.0} ms)");
    println!(
        "| serve's clusterset_dns_programming_duration_seconds{{service_kind=\"headless\"}} | {observed} | {} | {} |",
        cell(bucket_quantile(&buckets, 0.5)),
        cell(bucket_quantile(&buckets, 0.99))
    );
    println!(
        "histogram quantiles interpolated linearly within the bucket holding the rank, as histogram_quantile does; \
         unmeasured: missing {} (the background, unstamped), unserved {}, repeated {}, future {}",
        unmeasured("missing"),
        unmeasured("unserved"),
        unmeasured("repeated"),
        unmeasured("future")
    );
}

/// What [`measure_changes`] timed, by kind of change (created, endpoint
/// added, endpoint removed).
struct Measured {
    /// From the write's return until the last of the other members answers.
    everywhere: [Vec<Duration>; 3],
    /// From the trigger time stamped on the source slice until each other
    /// member answers: one per change and member, what `serve`'s histogram
    /// observes (up to the answer following the publish).
    each: [Vec<Duration>; 3],
}

/// `n` changes of each kind in member 1 (`a`), each timed until every other
/// member's server answers it. Each change stamps its source slice with
/// its trigger time, as kube-controller-manager does; the background's
/// slices carry none, so that `serve`'s histogram holds these changes only.
fn measure_changes(
    rt: &tokio::runtime::Runtime,
    a: &kube::Client,
    dns: &mut [Dns],
    sync: &Syncing,
    n: usize,
) -> Result<Measured> {
    let ns = "churn";
    let services = ApiResource::erase::<k8s_openapi::api::core::v1::Service>(&());
    let slices = slice_resource();
    let exports = mcs_resource("v1alpha1", "ServiceExport", "serviceexports");
    let slice_api: Api<DynamicObject> = Api::namespaced_with(a.clone(), ns, &slices);
    let mut out = Measured { everywhere: Default::default(), each: Default::default() };
    let others = dns.len() - 1;
    for j in 0..n {
        let name = format!("m-{j}");
        let fqdn = Name::from_ascii(format!("{name}.{ns}.svc.clusterset.local."))?;
        let (first, second) = (address(0, 200 + j, 0), address(0, 200 + j, 1));
        rt.block_on(create_all(a, &services, vec![(ns.into(), headless(ns, &name))], "service"))?;
        let triggered = Instant::now();
        let slice = stamped(slice_of(ns, &name, &[first]));
        rt.block_on(create_all(a, &slices, vec![(ns.into(), slice)], "slice"))?;
        rt.block_on(create_all(a, &exports, vec![(ns.into(), export(ns, &name))], "export"))?;
        let returned = Instant::now();
        let at = answered(&mut dns[1..], &fqdn, returned, &|x: &Answer| x.ips.contains(&first))
            .with_context(|| {
                format!("{name} not answered by all {others} others within 20 s:\n{}", sync.log())
            })?;
        out.note(0, triggered, returned, &at);
        let patch = |addrs: &[Ipv4Addr]| -> Result<(Instant, Instant)> {
            let triggered = Instant::now();
            let body = stamped(slice_of(ns, &name, addrs));
            rt.block_on(timed_call(slice_api.patch(
                &format!("{name}-own"),
                &PatchParams::apply("bench").force(),
                &Patch::Apply(&body),
            )))?;
            Ok((triggered, Instant::now()))
        };
        let (triggered, returned) = patch(&[first, second])?;
        let at = answered(&mut dns[1..], &fqdn, returned, &|x: &Answer| x.ips.contains(&second))
            .with_context(|| format!("{name}'s added endpoint not answered everywhere"))?;
        out.note(1, triggered, returned, &at);
        let (triggered, returned) = patch(&[second])?;
        let at = answered(&mut dns[1..], &fqdn, returned, &|x: &Answer| {
            !x.ips.contains(&first) && x.ips.contains(&second)
        })
        .with_context(|| format!("{name}'s removed endpoint still answered"))?;
        out.note(2, triggered, returned, &at);
    }
    Ok(out)
}

impl Measured {
    /// A change of kind `k`, triggered and written at these instants, and
    /// answered by each other member at `at`.
    fn note(&mut self, k: usize, triggered: Instant, returned: Instant, at: &[Instant]) {
        let last = at.iter().copied().max().unwrap_or(returned);
        self.everywhere[k].push(last.saturating_duration_since(returned));
        self.each[k].extend(at.iter().map(|t| t.saturating_duration_since(triggered)));
    }
}

/// When each of `dns` first answers `name` as `done` wants, asking them in
/// turn every [`common::dns::POLL_EVERY`] so that one's time does not wait
/// for another's; `None` when one has not within 20 s of `from`.
fn answered(
    dns: &mut [Dns],
    name: &Name,
    from: Instant,
    done: &dyn Fn(&Answer) -> bool,
) -> Option<Vec<Instant>> {
    let mut at: Vec<Option<Instant>> = vec![None; dns.len()];
    while at.iter().any(Option::is_none) {
        for (d, t) in dns.iter_mut().zip(&mut at).filter(|(_, t)| t.is_none()) {
            if d.query_a(name, common::dns::POLL_EVERY).is_some_and(|a| done(&a)) {
                *t = Some(Instant::now());
            }
        }
        if from.elapsed() > Duration::from_secs(20) {
            return None;
        }
        std::thread::sleep(common::dns::POLL_EVERY);
    }
    Some(at.into_iter().flatten().collect())
}

/// `slice` with its trigger time (`endpoints.kubernetes.io/last-change-trigger-time`)
/// now, in RFC 3339 with nanoseconds as kube-controller-manager writes it.
fn stamped(mut slice: Value) -> Value {
    let now = k8s_openapi::jiff::Timestamp::now();
    slice["metadata"]["annotations"][ANNOTATION_TRIGGER_TIME] = json!(now.to_string());
    slice
}

/// `serve`'s `clusterset_dns_programming_duration_seconds` for headless
/// services, summed over `scrapes`: each bucket's upper bound in seconds
/// and its cumulative count.
fn programming_buckets(scrapes: &[String]) -> Vec<(f64, f64)> {
    let prefix = "clusterset_dns_programming_duration_seconds_bucket{service_kind=\"headless\",le=\"";
    let mut buckets: Vec<(f64, f64)> = Vec::new();
    for line in scrapes.iter().flat_map(|s| s.lines()) {
        let Some((le, count)) = line.strip_prefix(prefix).and_then(|r| r.split_once("\"} ")) else {
            continue;
        };
        let (Ok(le), Ok(count)) = (le.parse::<f64>(), count.trim().parse::<f64>()) else { continue };
        match buckets.iter_mut().find(|(b, _)| *b == le) {
            Some((_, c)) => *c += count,
            None => buckets.push((le, count)),
        }
    }
    buckets.sort_by(|x, y| x.0.total_cmp(&y.0));
    buckets
}

/// The `q` quantile in ms of cumulative `buckets` as Prometheus's
/// `histogram_quantile` takes it: linear within the bucket holding the
/// rank, from its lower bound (0 for the first) to its upper; the bucket's
/// bounds beside it. NaN without observations.
fn bucket_quantile(buckets: &[(f64, f64)], q: f64) -> (f64, f64, f64) {
    let total = buckets.last().map_or(0.0, |(_, c)| *c);
    let rank = q * total;
    let mut below = (0.0, 0.0);
    for &(le, count) in buckets {
        if count >= rank && total > 0.0 && le.is_finite() {
            let within = if count > below.1 { (rank - below.1) / (count - below.1) } else { 1.0 };
            return ((below.0 + (le - below.0) * within) * 1000.0, below.0 * 1000.0, le * 1000.0);
        }
        below = (le, count);
    }
    (f64::NAN, below.0 * 1000.0, f64::INFINITY)
}

/// A headless Service.
fn headless(ns: &str, name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": ns},
           "spec": {"clusterIP": "None", "ports": [{"name": "http", "protocol": "TCP", "port": 80}]}})
}

/// Address `v` (0, 1, 2) of service `i` in member `c`.
fn address(c: usize, i: usize, v: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 100 + c as u8, (i % 250) as u8, 1 + v as u8)
}

/// The Service's own EndpointSlice with these endpoints.
fn slice_of(ns: &str, name: &str, addrs: &[Ipv4Addr]) -> Value {
    let endpoints: Vec<Value> = addrs.iter().map(|a| json!({"addresses": [a.to_string()]})).collect();
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
           "metadata": {"name": format!("{name}-own"), "namespace": ns,
                        "labels": {"kubernetes.io/service-name": name}},
           "addressType": "IPv4", "ports": [{"name": "http", "protocol": "TCP", "port": 8080}],
           "endpoints": endpoints})
}

/// How many shards a replica leads.
fn led(s: &Syncing) -> Result<usize> {
    let scrape = s.get("/metrics");
    Ok(scrape
        .lines()
        .filter(|l| l.starts_with("clusterset_dns_sync_shard_leader{") && l.ends_with(" 1"))
        .count())
}

fn wait_leading(sync: &Syncing) -> Result<()> {
    let since = Instant::now();
    while !sync.leading() {
        if since.elapsed() > FAILOVER_TIMEOUT {
            bail!("sync did not lead within {} s:\n{}", FAILOVER_TIMEOUT.as_secs(), sync.log());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
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
    let services = ApiResource::erase::<k8s_openapi::api::core::v1::Service>(&());
    let writes0 = metric(sync, "clusterset_dns_sync_writes_total")?;
    prepare(rt, clients, n)?;
    let control_plane = clusters.control_plane_pids();
    let cpu = |pids: &[u32]| pids.iter().map(|p| cpu_seconds(*p).unwrap_or(0.0)).sum::<f64>();
    let (plane0, sync0) = (cpu(&control_plane), sync.cpu_seconds());
    let (started, created) = export_all(clients, n)?;
    let converged = converge(rt, clients, n, started)?;
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
    while standby.reconciles() < n as f64 {
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

/// A counter or gauge without labels from sync's `/metrics`.
fn metric(sync: &Syncing, name: &str) -> Result<f64> {
    sync.metric(name).with_context(|| format!("no {name} in sync's /metrics"))
}
