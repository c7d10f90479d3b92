//! Hub mode against push mode, in one run, on real API servers and the real
//! release binary: `n` exports spread over M members (as `sync`'s fleet
//! bench: one Service and slice each, exported at once), and the time
//! until every member holds every import with a VIP.
//!
//! - **push**: one `clusterset-dns sync` with every member's credentials.
//! - **hub**: an extra API server as the hub, each member enrolled with
//!   `clusterset-dns hub enrol`, and one `clusterset-dns agent` per member
//!   with its own cluster's agent identity and its restricted hub identity.
//!
//! For each: cold convergence; the writes each API server says it served
//! (its own `apiserver_request_total`, Lease writes apart, the bench's own
//! export creates taken off) until the controllers are quiet; CPU of each
//! controller process and of the API servers with their etcds; each
//! controller's peak RSS before the exports (idle) and after.
//!
//! `cargo bench --bench hub`: `HUB_EXPORTS` (default 1,000) and
//! `HUB_MEMBERS` (default `3,10`; push mode runs at the largest). Both
//! modes use the default client rate limit (`--kube-qps`).

#![allow(clippy::print_stdout)]

#[path = "../tests/harness/mod.rs"]
mod harness;

mod common;

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use common::exports::{CONVERGE_TIMEOUT, NS, converge, export_all, hub_agents, prepare, writes_served};
use common::report::secs;
use common::{main_of, start_clusters};
use harness::clusters::TestClusters;
use harness::procfs::{cpu_seconds, loadavg};
use harness::syncing::Syncing;

fn main() {
    main_of("hub", hub_bench);
}

/// One mode at one size: what the table prints.
struct Run {
    mode: &'static str,
    members: usize,
    exports: usize,
    converged: Duration,
    /// Writes served per member API server (mean), Leases apart.
    member_writes: f64,
    /// Writes the hub served (hub mode), Leases apart, and on Leases.
    hub_writes: Option<(f64, f64)>,
    /// CPU seconds of the controllers (sum) and of the busiest one.
    controller_cpu: (f64, f64),
    /// CPU seconds of the members' API servers + etcds, and the hub's.
    plane_cpu: (f64, f64),
    /// Peak RSS of the largest controller process before the exports and
    /// after, in KiB.
    rss_kib: (u64, u64),
}

fn hub_bench(rt: &tokio::runtime::Runtime) -> Result<()> {
    let n: usize = match std::env::var("HUB_EXPORTS") {
        Ok(v) => v.parse().context("HUB_EXPORTS: a number of exports")?,
        Err(_) => 1000,
    };
    let sizes: Vec<usize> = match std::env::var("HUB_MEMBERS") {
        Ok(v) => {
            v.split(',').map(|m| m.trim().parse()).collect::<Result<_, _>>().context("HUB_MEMBERS: 3,10")?
        }
        Err(_) => vec![3, 10],
    };
    let largest = *sizes.iter().max().context("HUB_MEMBERS is empty")?;
    let mut runs = vec![push(rt, largest, n)?];
    for &m in &sizes {
        runs.push(hub(rt, m, n)?);
    }
    report(&runs);
    Ok(())
}

/// Push mode: one `sync` replica writing every member.
fn push(rt: &tokio::runtime::Runtime, m: usize, n: usize) -> Result<Run> {
    println!("\n## push: {n} exports on {m} members, one sync replica");
    let clusters = start_clusters(m);
    let clients: Vec<kube::Client> = (0..m).map(|i| rt.block_on(clusters.client(i))).collect();
    let sync = Syncing::start_tied(&clusters, &["--identity", "push", "--no-leader-election"]);
    sync.http();
    let controllers = [sync];
    measure(rt, "push", &clusters, &clients, None, &controllers, n)
}

/// Hub mode: cluster 0 is the hub, clusters 1..=m the members, an agent each.
fn hub(rt: &tokio::runtime::Runtime, m: usize, n: usize) -> Result<Run> {
    println!("\n## hub: {n} exports on {m} members, an agent each, one hub");
    let clusters = start_clusters(m + 1);
    let dir = tempfile::tempdir()?;
    let agents = hub_agents(&clusters, dir.path(), &[])?;
    let members: Vec<kube::Client> = (1..=m).map(|i| rt.block_on(clusters.client(i))).collect();
    let hub_client = rt.block_on(clusters.client(0));
    measure(rt, "hub", &clusters, &members, Some(&hub_client), &agents, n)
}

/// Prepares the Services, exports them, waits for convergence and for the
/// controllers to be quiet; what it cost.
fn measure(
    rt: &tokio::runtime::Runtime,
    mode: &'static str,
    clusters: &TestClusters,
    members: &[kube::Client],
    hub: Option<&kube::Client>,
    controllers: &[Syncing],
    n: usize,
) -> Result<Run> {
    let m = members.len();
    prepare(rt, members, n)?;
    // Whatever the controllers did at start (CRDs, heartbeats) is not the
    // sync: settle, then take every baseline.
    quiet(rt, members, hub)?;
    let idle_rss = controllers.iter().map(Syncing::peak_rss_kib).max().unwrap_or(0);
    let member_writes0 = served(rt, members)?;
    let hub_writes0 = hub.map(|h| rt.block_on(writes_served(h))).transpose()?;
    let hub_index = usize::from(hub.is_some());
    let plane_pids: Vec<u32> = {
        let all = clusters.control_plane_pids();
        // Each cluster's API server and etcd, in cluster order.
        all[2 * hub_index..].to_vec()
    };
    let hub_pids: Vec<u32> = if hub.is_some() {
        let (a, e) = clusters.pids(0);
        vec![a, e]
    } else {
        Vec::new()
    };
    let cpu = |pids: &[u32]| pids.iter().map(|p| cpu_seconds(*p).unwrap_or(0.0)).sum::<f64>();
    let (plane0, hub0) = (cpu(&plane_pids), cpu(&hub_pids));
    let controller0: Vec<f64> = controllers.iter().map(Syncing::cpu_seconds).collect();

    let (started, _) = export_all(members, n)?;
    let converged = converge(rt, members, n, started)?;
    quiet(rt, members, hub)?;

    let member_writes = served(rt, members)? - member_writes0 - n as f64;
    let hub_writes = match (hub, hub_writes0) {
        (Some(h), Some((w0, l0))) => {
            let (w, l) = rt.block_on(writes_served(h))?;
            Some((w - w0, l - l0))
        }
        _ => None,
    };
    let spent: Vec<f64> = controllers.iter().zip(&controller0).map(|(c, c0)| c.cpu_seconds() - c0).collect();
    let run = Run {
        mode,
        members: m,
        exports: n,
        converged,
        member_writes: member_writes / m as f64,
        hub_writes,
        controller_cpu: (spent.iter().sum(), spent.iter().copied().fold(0.0, f64::max)),
        plane_cpu: (cpu(&plane_pids) - plane0, cpu(&hub_pids) - hub0),
        rss_kib: (idle_rss, controllers.iter().map(Syncing::peak_rss_kib).max().unwrap_or(0)),
    };
    println!(
        "{mode}, {m} members: converged {:.1} s after the first create; load average {}",
        secs(converged),
        loadavg()
    );
    Ok(run)
}

/// Writes served by the members' API servers (Leases apart), summed.
fn served(rt: &tokio::runtime::Runtime, members: &[kube::Client]) -> Result<f64> {
    let mut all = 0.0;
    for c in members {
        let (w, leases) = rt.block_on(writes_served(c))?;
        all += w - leases;
    }
    Ok(all)
}

/// Waits until no API server has served a write (Leases apart) for 5 s:
/// the controllers are done, whatever their counters say.
fn quiet(rt: &tokio::runtime::Runtime, members: &[kube::Client], hub: Option<&kube::Client>) -> Result<()> {
    let total = || -> Result<f64> {
        let hub = match hub {
            Some(h) => {
                let (w, l) = rt.block_on(writes_served(h))?;
                w - l
            }
            None => 0.0,
        };
        Ok(served(rt, members)? + hub)
    };
    let since = Instant::now();
    let (mut last, mut still) = (total()?, Instant::now());
    while still.elapsed() < Duration::from_secs(5) {
        if since.elapsed() > CONVERGE_TIMEOUT {
            bail!("still writing {} s after the exports converged", CONVERGE_TIMEOUT.as_secs());
        }
        std::thread::sleep(Duration::from_millis(500));
        let now = total()?;
        if now != last {
            (last, still) = (now, Instant::now());
        }
    }
    Ok(())
}

/// The side-by-side table, and the growth each figure shows.
fn report(runs: &[Run]) {
    println!(
        "\n## {} exports in namespace {NS}: push and hub, one run",
        runs.first().map_or(0, |r| r.exports)
    );
    println!(
        "| mode | members | cold convergence | writes per member API server | hub writes (+ Lease) | controller CPU, all (largest) | members' API servers + etcd CPU | hub's CPU | controller peak RSS idle → after |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for r in runs {
        let hub = r.hub_writes.map_or("—".to_string(), |(w, l)| format!("{w:.0} (+{l:.0})"));
        let hub_cpu = if r.hub_writes.is_some() { format!("{:.1} s", r.plane_cpu.1) } else { "—".into() };
        println!(
            "| {} | {} | {:.1} s | {:.0} ({:.2} per export) | {hub} | {:.1} s ({:.1} s) | {:.1} s | {hub_cpu} | {} → {} MiB |",
            r.mode,
            r.members,
            secs(r.converged),
            r.member_writes,
            r.member_writes / r.exports as f64,
            r.controller_cpu.0,
            r.controller_cpu.1,
            r.plane_cpu.0,
            r.rss_kib.0 / 1024,
            r.rss_kib.1 / 1024,
        );
    }
    // Memory per export, from the idle and loaded peaks of the largest
    // controller: what the growth laws in ARCHITECTURE.md scale.
    for r in runs {
        let per_export = (r.rss_kib.1.saturating_sub(r.rss_kib.0)) as f64 * 1024.0 / r.exports as f64;
        println!(
            "{} at {} members: {:.0} bytes of peak RSS per export of the fleet (largest controller)",
            r.mode, r.members, per_export
        );
    }
}
