//! The server's CPU per query under `dnsperf` while the Kubernetes watch
//! source takes updates, against a real kube-apiserver and etcd and the real
//! release binary: 1,000 ClusterSetIP ServiceImports (3 EndpointSlices
//! each), 3 rounds of dnsperf without changes and while 100 EndpointSlices
//! per second are patched, then the patches alone.
//!
//! `cargo bench --bench update_load`; see `common` for how bench targets run.
//! `UPDATE_SERVICES=N` measures a cluster of N services instead (fleet
//! scale: a multiple of 100, 10 % headless, 3N slices, listed by streaming).

#![allow(clippy::print_stdout)]

#[path = "../tests/harness/mod.rs"]
mod harness;

mod common;

use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use futures::{StreamExt, stream};
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::json;

use common::objects::{CLUSTER_IDS, Fleet, slice_resource};
use common::report::percentile;
use common::{SERVED_FLEET, ServedFleet, main_of};
use harness::procfs::loadavg;
use harness::served::Served;

/// EndpointSlice patches per second, and for how long.
const PATCH_RATE: u32 = 100;
const LOAD_SECONDS: u32 = 10;
/// Patches in flight at most (the rate is kept by a schedule).
const PATCH_CONCURRENCY: usize = 16;
/// Pairs of dnsperf runs (without, with changes).
const UPDATE_ROUNDS: usize = 3;

fn main() {
    main_of("update_load", |rt| {
        let services = match std::env::var("UPDATE_SERVICES") {
            Ok(n) => n.parse().map_err(|e| anyhow!("UPDATE_SERVICES={n}: {e}"))?,
            Err(_) => SERVED_FLEET,
        };
        ServedFleet::run(rt, services, |f| update_load(rt, &f.client, &f.server, &f.fleet))
    });
}

fn update_load(
    rt: &tokio::runtime::Runtime,
    client: &kube::Client,
    server: &Served,
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
        server.addr.port(),
        queries.display()
    );
    println!("dnsperf command: {dnsperf}");
    println!("query file: {} A queries, one per service", fleet.services());

    // Idle: the server's own background cost; nothing asked, nothing
    // changed. Twice: what follows the first list (its buffers given back)
    // shows in the first window only.
    let mut idle_cpu = 0.0;
    for window in ["just after ready", "a window later"] {
        let cpu0 = server.cpu_seconds();
        std::thread::sleep(Duration::from_secs(u64::from(LOAD_SECONDS)));
        idle_cpu = server.cpu_seconds() - cpu0;
        println!(
            "idle {LOAD_SECONDS} s {window} (no queries, no changes): server CPU {idle_cpu:.2} s; load average {}",
            loadavg()
        );
    }

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
    let (cpu0, t0) = (server.cpu_seconds(), Instant::now());
    let alone = rt.block_on(patch_slices(client, fleet, UPDATE_ROUNDS))?;
    std::thread::sleep(Duration::from_millis(500)); // let the last events arrive
    let idle_share = idle_cpu / f64::from(LOAD_SECONDS) * t0.elapsed().as_secs_f64();
    let alone_cpu = (server.cpu_seconds() - cpu0 - idle_share).max(0.0);

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
    server: &Served,
    dnsperf: &str,
    dir: &Path,
    during: impl FnOnce() -> Result<Option<Patched>>,
) -> Result<Measured> {
    let out_path = dir.join("dnsperf.out");
    let out = std::fs::File::create(&out_path)?;
    let cpu0 = server.cpu_seconds();
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
    let cpu = server.cpu_seconds() - cpu0;
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
        let p = |q: f64| percentile(&v, q);
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
