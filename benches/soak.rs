//! A soak: the real release binary watching a real kube-apiserver through a
//! long run of query load, EndpointSlice churn and relists, reported per
//! window. 10,000 services (every 10th headless, 3 slices each), A queries
//! at a steady rate over UDP, 100 EndpointSlice patches a second (the first
//! endpoint of a headless service's first slice flips between two
//! addresses), and every `SOAK_RELIST_SECONDS` the API server stopped and
//! started again, so that every watch fails and relists. Per window: answers
//! right, wrong (an address set no state of the service ever had, or an
//! error code) and lost (no answer in 1 s), p99 latency, resident size and
//! open file descriptors; at the end, RSS growth from the first window to
//! the last.
//!
//! `cargo bench --bench soak`; `SOAK_SECONDS` (default 1800),
//! `SOAK_WINDOW_SECONDS` (300), `SOAK_RELIST_SECONDS` (300),
//! `SOAK_SERVICES` (10,000, a multiple of 100), `SOAK_QPS` (500). Every
//! loop ends with the run; the cluster and the server are stopped at the
//! end and when the bench fails.

#![allow(clippy::print_stdout)]

#[path = "../tests/harness/mod.rs"]
mod harness;

mod common;

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow};
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::Name;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::json;

use common::dns::Dns;
use common::objects::{Fleet, slice_resource};
use common::report::percentile;
use common::{ServedFleet, main_of};
use harness::clusters::Component;

fn env_or(name: &str, default: u64) -> Result<u64> {
    match std::env::var(name) {
        Ok(v) => v.parse().map_err(|e| anyhow!("{name}={v}: {e}")),
        Err(_) => Ok(default),
    }
}

fn main() {
    main_of("soak", |rt| {
        let services = env_or("SOAK_SERVICES", 10_000)? as usize;
        ServedFleet::run(rt, services, |f| soak(rt, f))
    });
}

/// One window's counts.
#[derive(Default)]
struct Window {
    right: u64,
    wrong: u64,
    lost: u64,
    latencies: Vec<Duration>,
    patches: u64,
    patch_errors: u64,
}

/// The address the first endpoint of service (n, i)'s first slice flips to.
fn flipped(n: usize, i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 250, n as u8, (i % 250) as u8)
}

fn soak(rt: &tokio::runtime::Runtime, f: &ServedFleet) -> Result<()> {
    let total = Duration::from_secs(env_or("SOAK_SECONDS", 1800)?);
    let window = Duration::from_secs(env_or("SOAK_WINDOW_SECONDS", 300)?);
    let relist_every = Duration::from_secs(env_or("SOAK_RELIST_SECONDS", 300)?);
    let qps = env_or("SOAK_QPS", 500)?;
    let fleet = &f.fleet;
    println!(
        "\n## soak: {} services, {qps} queries/s, 100 slice patches/s, a relist every {} s, {} s in windows of {} s",
        fleet.services(),
        relist_every.as_secs(),
        total.as_secs(),
        window.as_secs()
    );
    let headless: Vec<(usize, usize)> =
        (0..fleet.services()).map(|j| fleet.service(j)).filter(|(_, i)| fleet.headless(*i)).collect();
    // Every answer a headless service may give: its first endpoint of the
    // first cluster either as created or flipped.
    let allowed = |n: usize, i: usize, got: &BTreeSet<Ipv4Addr>| {
        let expected = fleet.expected(n, i);
        if *got == expected {
            return true;
        }
        let mut other = expected;
        other.remove(&fleet.endpoint_ip(0, n, i, 0));
        other.insert(flipped(n, i));
        *got == other
    };
    let start = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let windows: Arc<Mutex<Vec<Window>>> = Arc::new(Mutex::new(Vec::new()));
    let index = |at: Instant| (at.duration_since(start).as_nanos() / window.as_nanos().max(1)) as usize;
    let record = |windows: &Mutex<Vec<Window>>, at: Instant, f: &dyn Fn(&mut Window)| {
        let mut w = windows.lock().expect("windows");
        let i = index(at);
        while w.len() <= i {
            w.push(Window::default());
        }
        f(&mut w[i]);
    };
    let patches = AtomicU64::new(0);
    std::thread::scope(|scope| -> Result<()> {
        // Churn: 100 patches a second, the schedule kept by the clock.
        let churn = scope.spawn(|| {
            let api_of = |ns: &str| -> Api<DynamicObject> {
                Api::namespaced_with(f.client.clone(), ns, &slice_resource())
            };
            let mut k = 0usize;
            let mut next = Instant::now();
            while !stop.load(Ordering::Relaxed) && start.elapsed() < total {
                let (n, i) = headless[k % headless.len()];
                let flip = (k / headless.len()).is_multiple_of(2);
                let endpoints = fleet.endpoints(0, n, i, flip.then(|| flipped(n, i)));
                let patch = json!({"endpoints": endpoints});
                let name = Fleet::slice_name(i, 0);
                let ns = fleet.namespace(n);
                let api = api_of(&ns);
                let ok = rt
                    .block_on(async {
                        let (pp, merge) = (PatchParams::default(), Patch::Merge(&patch));
                        tokio::time::timeout(Duration::from_secs(2), api.patch(&name, &pp, &merge)).await
                    })
                    .is_ok_and(|r| r.is_ok());
                let now = Instant::now();
                record(&windows, now, &|w| if ok { w.patches += 1 } else { w.patch_errors += 1 });
                patches.fetch_add(1, Ordering::Relaxed);
                k += 1;
                next += Duration::from_millis(10);
                if let Some(wait) = next.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                } else {
                    next = Instant::now();
                }
            }
        });
        // Queries at `qps`, every service in turn.
        let queries = scope.spawn(|| -> Result<()> {
            let mut dns = Dns::new(f.server.addr)?;
            let every = Duration::from_nanos(1_000_000_000 / qps.max(1));
            let mut next = Instant::now();
            let mut j = 0usize;
            while !stop.load(Ordering::Relaxed) && start.elapsed() < total {
                let (n, i) = fleet.service(j % fleet.services());
                j += 1;
                let name = Name::from_ascii(fleet.fqdn(n, i))?;
                let asked = Instant::now();
                let got = dns.query_a(&name, Duration::from_secs(1));
                let took = asked.elapsed();
                record(&windows, asked, &|w| match &got {
                    None => w.lost += 1,
                    Some(a)
                        if a.rcode == ResponseCode::NoError
                            && (if fleet.headless(i) {
                                allowed(n, i, &a.ips)
                            } else {
                                a.ips == fleet.expected(n, i)
                            }) =>
                    {
                        w.right += 1;
                        w.latencies.push(took);
                    }
                    Some(_) => w.wrong += 1,
                });
                next += every;
                if let Some(wait) = next.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                } else {
                    next = Instant::now();
                }
            }
            Ok(())
        });
        // Relists, and the server's size sampled at each window's end.
        let mut samples: Vec<(u64, usize)> = Vec::new();
        let mut next_relist = start + relist_every;
        let mut next_sample = start + window;
        let mut relists = 0;
        while start.elapsed() < total && !churn.is_finished() && !queries.is_finished() {
            let now = Instant::now();
            if now >= next_relist {
                f.clusters.stop(0, Component::ApiServer);
                f.clusters.start_component(0, Component::ApiServer);
                relists += 1;
                next_relist = Instant::now() + relist_every;
            }
            if now >= next_sample {
                samples.push((f.server.status_kib("VmRSS"), open_fds(f.server.pid())));
                next_sample += window;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        stop.store(true, Ordering::Relaxed);
        churn.join().map_err(|_| anyhow!("the churn thread panicked"))?;
        queries.join().map_err(|_| anyhow!("the query thread panicked"))??;
        samples.push((f.server.status_kib("VmRSS"), open_fds(f.server.pid())));
        let windows = windows.lock().expect("windows");
        println!("\nrelists: {relists}; slice patches sent: {}", patches.load(Ordering::Relaxed));
        println!(
            "\n| window | answers right | wrong | lost | p99 | slice patches (failed) | RSS at its end | fds |\n|---|---|---|---|---|---|---|---|"
        );
        for (k, w) in windows.iter().enumerate() {
            let mut l = w.latencies.clone();
            l.sort();
            let (rss, fds) = samples.get(k).copied().unwrap_or((0, 0));
            println!(
                "| {}-{} s | {} | {} | {} | {:.2} ms | {} ({}) | {} MiB | {fds} |",
                k as u64 * window.as_secs(),
                (k as u64 + 1) * window.as_secs(),
                w.right,
                w.wrong,
                w.lost,
                percentile(&l, 0.99),
                w.patches,
                w.patch_errors,
                rss / 1024,
            );
        }
        if let (Some(first), Some(last)) = (samples.first(), samples.last()) {
            println!(
                "RSS {} MiB after the first window, {} MiB at the end: {:+.1} %",
                first.0 / 1024,
                last.0 / 1024,
                (last.0 as f64 / first.0.max(1) as f64 - 1.0) * 100.0
            );
        }
        let wrong: u64 = windows.iter().map(|w| w.wrong + w.lost).sum();
        println!("wrong or lost answers: {wrong} (goal 0)");
        Ok(())
    })
}

/// Open file descriptors of process `pid`.
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}
