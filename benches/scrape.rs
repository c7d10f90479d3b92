//! `/metrics` at fleet scale: how large and how slow a scrape is, what it
//! costs the server, and what it does to query latency. The real release
//! binary serves an objects file (`SCRAPE_OBJECTS`, a directory from
//! `benches/workload.py DIR --services 100000 --namespaces 100
//! --clusters 10`: its `objects.yaml`, and its `queries.txt` for names);
//! for each configuration, a quiet phase (UDP and TCP queries only) and a
//! scraping phase (the same queries while one client scrapes back to back,
//! the worst case of several Prometheus servers), each `SCRAPE_SECONDS`
//! (default 10).
//!
//! `SCRAPE_CONFIGS` (a comma list, default `default`): `default` scrapes
//! `/metrics` as the server starts by default; `per-service` scrapes
//! `/metrics` with `--metrics-per-service`; `debug` scrapes
//! `/debug/metrics` (the per-service view on request).
//!
//! `SCRAPE_OBJECTS=DIR cargo bench --bench scrape`; bounded: one UDP and
//! one TCP query every 2 ms, each waiting 1 s at most, and one scrape at a
//! time with a 30 s timeout; the server is stopped at the end.

#![allow(clippy::print_stdout)]

#[path = "../tests/harness/mod.rs"]
mod harness;

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use hickory_proto::rr::Name;

use common::load::{Transport, ask, cells, select};
use common::main_of;
use common::report::{ms, percentile};
use harness::BIN;
use harness::procfs::loadavg;
use harness::served::Served;

fn main() {
    main_of("scrape", |_| scrape());
}

/// A way of running and scraping the server: name, flags, path scraped.
const CONFIGS: [(&str, &[&str], &str); 3] = [
    ("default", &[], "/metrics"),
    ("per-service", &["--metrics-per-service"], "/metrics"),
    ("debug", &[], "/debug/metrics"),
];

/// One query of each transport this often.
const QUERY_EVERY: Duration = Duration::from_millis(2);
/// Names asked: the first A queries of `queries.txt`.
const NAMES: usize = 10_000;

fn scrape() -> Result<()> {
    let dir = PathBuf::from(std::env::var("SCRAPE_OBJECTS").context(
        "SCRAPE_OBJECTS=DIR: a directory from benches/workload.py DIR --services 100000 --namespaces 100 --clusters 10",
    )?);
    let seconds: u64 =
        std::env::var("SCRAPE_SECONDS").map_or(Ok(10), |s| s.parse()).context("SCRAPE_SECONDS")?;
    let phase = Duration::from_secs(seconds);
    let configs = std::env::var("SCRAPE_CONFIGS").unwrap_or_else(|_| "default".to_owned());
    let configs = configs
        .split(',')
        .map(|name| {
            CONFIGS.iter().find(|(n, _, _)| *n == name).copied().ok_or_else(|| {
                anyhow::anyhow!("SCRAPE_CONFIGS: {name:?} is not one of default, per-service, debug")
            })
        })
        .collect::<Result<Vec<_>>>()?;
    for (_, flags, _) in &configs {
        for flag in *flags {
            ensure_flag(flag)?;
        }
    }
    let names = names(&dir.join("queries.txt"))?;
    let objects = dir.join("objects.yaml");
    println!(
        "\n## scrape: {} ({} MB), queries from {} names; phases of {seconds} s",
        objects.display(),
        std::fs::metadata(&objects).context("objects.yaml")?.len() / 1_000_000,
        names.len()
    );
    println!(
        "\n| config | path | scrape bytes | lines | scrapes | scrape p50 / max | server CPU per scrape | \
         UDP quiet: n, p50, p99, max | UDP scraping | TCP quiet | TCP scraping | load avg |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (name, flags, path) in configs {
        let row = run(&objects, flags, path, &names, phase)?;
        println!("| {name} | `{path}` | {row} |");
    }
    Ok(())
}

/// The A names of a dnsperf query file, the first [`NAMES`].
fn names(file: &Path) -> Result<Vec<Name>> {
    let text = std::fs::read_to_string(file).with_context(|| format!("read {}", file.display()))?;
    let names = text
        .lines()
        .filter_map(|l| l.strip_suffix(" A"))
        .take(NAMES)
        .map(|n| Name::from_ascii(format!("{n}.")).map_err(anyhow::Error::from))
        .collect::<Result<Vec<_>>>()?;
    if names.is_empty() {
        bail!("no A query in {}", file.display());
    }
    Ok(names)
}

/// Fails unless this build's `serve --help` knows `flag`.
fn ensure_flag(flag: &str) -> Result<()> {
    let help = std::process::Command::new(BIN).args(["serve", "--help"]).output().context("serve --help")?;
    if !String::from_utf8_lossy(&help.stdout).contains(flag) {
        bail!("{BIN} serve has no {flag} (SCRAPE_CONFIGS names a configuration that needs it)");
    }
    Ok(())
}

/// One configuration: start, a quiet phase, a scraping phase; the table row.
fn run(objects: &Path, flags: &[&str], path: &str, names: &[Name], phase: Duration) -> Result<String> {
    let objects = objects.to_string_lossy();
    let mut args = vec!["--objects", &objects, "--memory-limit", "none", "--lameduck", "0"];
    args.extend_from_slice(flags);
    let mut server = Served::start_tied(&args);
    let ready = server.wait_ready(Duration::from_secs(300));
    eprintln!("[bench] {}: ready in {:.1} s", server.command, ready.as_secs_f64());
    let stop = AtomicBool::new(false);
    let load = |until: Instant| {
        std::thread::scope(|s| {
            let udp = s.spawn(|| ask(server.addr, Transport::Udp, names, QUERY_EVERY, until, &stop));
            let tcp = s.spawn(|| ask(server.addr, Transport::Tcp, names, QUERY_EVERY, until, &stop));
            let udp = udp.join().map_err(|_| anyhow::anyhow!("UDP loop panicked"))?;
            let tcp = tcp.join().map_err(|_| anyhow::anyhow!("TCP loop panicked"))?;
            Ok::<_, anyhow::Error>((udp?, tcp?))
        })
    };
    // Warm: every name once in the server's caches.
    load(Instant::now() + Duration::from_secs(1))?;
    let cpu_quiet = server.cpu_seconds();
    let quiet = load(Instant::now() + phase)?;
    let cpu_quiet = server.cpu_seconds() - cpu_quiet;

    let cpu0 = server.cpu_seconds();
    let until = Instant::now() + phase;
    let (scraping, scrapes) = std::thread::scope(|s| {
        let scraper = s.spawn(|| {
            let mut scrapes = Vec::new();
            while Instant::now() < until {
                let started = Instant::now();
                let body = get(server.http, path)?;
                scrapes.push((started.elapsed(), body.len(), body.iter().filter(|b| **b == b'\n').count()));
            }
            Ok::<_, anyhow::Error>(scrapes)
        });
        let queries = load(until);
        let scrapes = scraper.join().map_err(|_| anyhow::anyhow!("scraper panicked"))?;
        Ok::<_, anyhow::Error>((queries?, scrapes?))
    })?;
    let cpu = server.cpu_seconds() - cpu0;
    let load_avg = loadavg();
    server.stop();

    let mut times: Vec<Duration> = scrapes.iter().map(|s| s.0).collect();
    times.sort();
    let (bytes, lines) = scrapes.last().map(|s| (s.1, s.2)).unwrap_or_default();
    let all = |_| true;
    let (uq, ul) = select(&quiet.0, all);
    let (us, usl) = select(&scraping.0, all);
    let (tq, tl) = select(&quiet.1, all);
    let (ts, tsl) = select(&scraping.1, all);
    Ok(format!(
        "{bytes} | {lines} | {} | {:.1} / {:.1} ms | {:.1} ms | {} | {} | {} | {} | {load_avg}",
        scrapes.len(),
        percentile(&times, 0.5),
        times.last().map_or(f64::NAN, |d| ms(*d)),
        // The queries cost the same in both phases: what the scraping
        // phase took beyond the quiet one, over its scrapes.
        (cpu - cpu_quiet).max(0.0) * 1000.0 / scrapes.len().max(1) as f64,
        cells(&uq, ul),
        cells(&us, usl),
        cells(&tq, tl),
        cells(&ts, tsl),
    ))
}

/// `GET path` over HTTP/1.0: the body, failing unless the status is 200.
fn get(http: SocketAddr, path: &str) -> Result<Vec<u8>> {
    let mut s = TcpStream::connect_timeout(&http, Duration::from_secs(1))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
    let mut text = Vec::new();
    s.read_to_end(&mut text)?;
    let end = text.windows(4).position(|w| w == b"\r\n\r\n").context("no end of headers")?;
    let head = String::from_utf8_lossy(&text[..end]);
    if head.split_whitespace().nth(1) != Some("200") {
        bail!("GET {path}: {}", head.lines().next().unwrap_or_default());
    }
    Ok(text.split_off(end + 4))
}
