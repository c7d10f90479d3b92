//! Query latency while the server relists a fleet from a real API server:
//! the real release binary watching a real kube-apiserver and etcd with
//! `RELIST_SERVICES` services (default 100,000; every 10th headless, 3
//! EndpointSlices each, streaming lists), UDP and TCP A queries at a
//! steady rate, and the API server stopped and started again
//! `RELIST_ROUNDS` times (default 2), so that every watch fails and lists
//! everything again. The relist is the window from the start of the first
//! list that completed to the end of the last (each "watch listed" line in
//! the server's log says how long its list took), plus 1 s for the last
//! publish; its latencies are reported beside those of the 5 s before the
//! API server stopped, and the server's log of its watches follows.
//!
//! `cargo bench --bench relist`; bounded: one UDP and one TCP query every
//! 2 ms, each waiting 1 s at most, a round ends at the latest 600 s after
//! its API server stopped; the cluster and the server are stopped at the
//! end and when the bench fails.

#![allow(clippy::print_stdout)]

#[path = "../tests/harness/mod.rs"]
mod harness;

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use hickory_proto::rr::Name;

use common::load::{Transport, ask, cells, select};
use common::report::secs;
use common::{ServedFleet, main_of};
use harness::clusters::Component;
use harness::procfs::{cpu_seconds, loadavg};

fn env_number(name: &str, default: usize) -> Result<usize> {
    match std::env::var(name) {
        Ok(v) => v.parse().map_err(|e| anyhow!("{name}={v}: {e}")),
        Err(_) => Ok(default),
    }
}

fn main() {
    main_of("relist", |rt| {
        let services = env_number("RELIST_SERVICES", 100_000)?;
        let rounds = env_number("RELIST_ROUNDS", 2)?;
        ServedFleet::run(rt, services, |f| relist(f, rounds))
    });
}

/// One query of each transport this often.
const QUERY_EVERY: Duration = Duration::from_millis(2);
/// Queries before the API server stops, for the latency outside a relist.
const BEFORE: Duration = Duration::from_secs(5);
/// How long a round may take from the API server's stop.
const ROUND_TIMEOUT: Duration = Duration::from_secs(600);
/// The last list's publish, after its "watch listed" line.
const PUBLISH: Duration = Duration::from_secs(1);

fn relist(f: &ServedFleet, rounds: usize) -> Result<()> {
    let fleet = &f.fleet;
    let step = (fleet.services() / 10_000).max(1);
    let names = (0..fleet.services())
        .step_by(step)
        .map(|j| {
            let (n, i) = fleet.service(j);
            Name::from_ascii(fleet.fqdn(n, i)).map_err(anyhow::Error::from)
        })
        .collect::<Result<Vec<_>>>()?;
    let watches = f.server.log().lines().filter(|l| l.contains("watch listed")).count();
    println!(
        "\n## relist: {} services, {watches} watches, {rounds} API server restarts; one UDP and one TCP query every {} ms",
        fleet.services(),
        QUERY_EVERY.as_millis()
    );
    println!(
        "\n| round | relist from the API server's return | relist took | server CPU in it | UDP before: n, p50, p99, max | UDP relisting | TCP before | TCP relisting | load avg |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let mut logs = Vec::new();
    for round in 1..=rounds {
        let (row, log) = one_round(f, &names, watches)?;
        println!("| {round} | {row} |");
        logs.push(log);
    }
    for (round, log) in logs.iter().enumerate() {
        println!("\nround {}: the server's watch log, s from the API server's return:\n\n```", round + 1);
        for line in log {
            println!("{line}");
        }
        println!("```");
    }
    Ok(())
}

/// One restart of the API server under query load; the table row and
/// the server's log of it.
fn one_round(f: &ServedFleet, names: &[Name], watches: usize) -> Result<(String, Vec<String>)> {
    let server = &f.server;
    let stop = AtomicBool::new(false);
    let started = Instant::now();
    let until = started + BEFORE + ROUND_TIMEOUT;
    let at = |d: Duration| server.started + d;
    std::thread::scope(|s| {
        let udp = s.spawn(|| ask(server.addr, Transport::Udp, names, QUERY_EVERY, until, &stop));
        let tcp = s.spawn(|| ask(server.addr, Transport::Tcp, names, QUERY_EVERY, until, &stop));
        // The server's CPU time every 100 ms, to read what the relist took.
        let cpu = s.spawn(|| {
            let mut samples = Vec::new();
            while !stop.load(Ordering::Relaxed) && Instant::now() < until {
                samples.push((Instant::now(), cpu_seconds(server.pid()).unwrap_or(f64::NAN)));
                std::thread::sleep(Duration::from_millis(100));
            }
            samples
        });
        let window = (|| {
            std::thread::sleep(BEFORE);
            let seen = server.log_lines().len();
            let stopped = Instant::now();
            f.clusters.stop(0, Component::ApiServer);
            f.clusters.start_component(0, Component::ApiServer);
            let back = Instant::now();
            // Every watch lists once more. A list's "watch listed" line
            // says how long it took: the relist is from the start of the
            // first list that completed to the end of the last (lists the
            // API server broke off before are not in it).
            loop {
                let log = server.log_lines();
                let new = &log[seen.min(log.len())..];
                let lists: Vec<(Instant, Instant)> = new
                    .iter()
                    .filter(|(_, l)| l.contains("watch listed"))
                    .map(|(t, l)| {
                        let took = Duration::from_secs_f64(field(l, "seconds=").unwrap_or(0.0));
                        (at(*t) - took, at(*t))
                    })
                    .collect();
                if lists.len() >= watches {
                    let first = lists.iter().map(|l| l.0).min().unwrap_or(back);
                    let last = lists.iter().map(|l| l.1).max().unwrap_or(back);
                    // Queries go on past the publish, so the window is whole.
                    std::thread::sleep(
                        (last + PUBLISH + Duration::from_millis(200))
                            .saturating_duration_since(Instant::now()),
                    );
                    let shown = new
                        .iter()
                        .filter(|(_, l)| l.contains("watch"))
                        .map(|(t, l)| format!("{:>+8.1} s  {l}", signed_secs(at(*t), back)))
                        .collect();
                    return Ok(Window { stopped, back, first, end: last + PUBLISH, log: shown });
                }
                if stopped.elapsed() > ROUND_TIMEOUT {
                    bail!("no relist within {} s; log:\n{}", ROUND_TIMEOUT.as_secs(), server.log());
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })();
        stop.store(true, Ordering::Relaxed);
        let udp = udp.join().map_err(|_| anyhow!("UDP loop panicked"))??;
        let tcp = tcp.join().map_err(|_| anyhow!("TCP loop panicked"))??;
        let cpu = cpu.join().map_err(|_| anyhow!("CPU sampler panicked"))?;
        let Window { stopped, back, first, end, log } = window?;
        // CPU between the last sample before the window and the first after.
        let cpu_at = |t: Instant, after: bool| {
            let found = if after {
                cpu.iter().find(|(at, _)| *at >= t)
            } else {
                cpu.iter().rev().find(|(at, _)| *at <= t)
            };
            found.map_or(f64::NAN, |(_, c)| *c)
        };
        let relist_cpu = cpu_at(end, true) - cpu_at(first, false);
        let before = |t: Instant| t >= started && t < stopped;
        let during = |t: Instant| t >= first && t <= end;
        let (ub, ubl) = select(&udp, before);
        let (ud, udl) = select(&udp, during);
        let (tb, tbl) = select(&tcp, before);
        let (td, tdl) = select(&tcp, during);
        let row = format!(
            "{:.1} s | {:.1} s | {relist_cpu:.1} s | {} | {} | {} | {} | {}",
            signed_secs(first, back),
            secs(end - PUBLISH - first),
            cells(&ub, ubl),
            cells(&ud, udl),
            cells(&tb, tbl),
            cells(&td, tdl),
            loadavg()
        );
        Ok((row, log))
    })
}

/// One round's relist: when the API server stopped and was back, the
/// relist's start and end (its last publish included), the server's log
/// lines about its watches from the stop on.
struct Window {
    stopped: Instant,
    back: Instant,
    first: Instant,
    end: Instant,
    log: Vec<String>,
}

/// `t - from` in seconds, negative when `t` is earlier.
fn signed_secs(t: Instant, from: Instant) -> f64 {
    match t.checked_duration_since(from) {
        Some(d) => secs(d),
        None => -secs(from - t),
    }
}

/// The number after `name` (e.g. `seconds=`) in a log line.
fn field(line: &str, name: &str) -> Option<f64> {
    line.split(name).nth(1)?.split_whitespace().next()?.parse().ok()
}
