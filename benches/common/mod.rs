//! What the Kubernetes benchmarks (`propagation`, `update_load`, `scale`,
//! `sync`) share beyond the fleet harness of `tests/harness/`: a fleet of
//! ServiceImports and EndpointSlices written with bounded concurrency, a UDP
//! poller that times answers to the millisecond, query loops over UDP and
//! TCP that keep every latency with its moment (`load`), a fleet of exports
//! for the controller benches (`exports`), the incumbent (CoreDNS's
//! `kubernetes` plugin with `multicluster`), and the report's format.
//! The clusters and the server processes are the tests' own
//! (`tests/harness/`, included by each bench next to this module).
//!
//! Each bench is `harness = false`: `cargo bench --bench NAME` runs it;
//! without `--bench` (how `cargo test --all-targets` runs bench targets) it
//! prints one line and exits. The server binary is the one cargo builds for
//! the bench target (`CARGO_BIN_EXE_clusterset-dns`): `cargo bench` builds
//! it with the bench profile, which inherits `release`, at
//! `target/release/clusterset-dns`.

// Each bench is its own crate and uses a part of this module.
#![allow(dead_code, unreachable_pub)]

pub mod coredns;
pub mod dns;
pub mod exports;
pub mod load;
pub mod objects;
pub mod report;

use std::time::{Duration, Instant};

use anyhow::Result;

use crate::harness::BIN;
use crate::harness::clusters::TestClusters;
use crate::harness::procfs::{clk_tck, cpus};
use crate::harness::served::Served;
use objects::{Fleet, create_fleet};
use report::{ms, secs};

/// Server start to ready, at most, before a bench gives up.
pub const SERVER_READY_TIMEOUT: Duration = Duration::from_secs(120);

/// The `main` of a bench named `name`: prints the command, the binary and
/// the machine, runs `run` on a 2-thread runtime, and exits 1 (after
/// printing the error) when it fails.
pub fn main_of(name: &str, run: impl FnOnce(&tokio::runtime::Runtime) -> Result<()>) {
    if !std::env::args().skip(1).any(|a| a == "--bench") {
        println!("{name} bench: compiled; a bench runs with `cargo bench --bench {name}`, not in cargo test");
        return;
    }
    println!("command: cargo bench --bench {name}");
    println!("server binary: {BIN}");
    println!("clock ticks per second: {}; cpus: {}", clk_tck(), cpus());
    let result = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|rt| run(&rt));
    if let Err(e) = result {
        println!("{name} bench failed: {e:#}");
        std::process::exit(1);
    }
}

/// `n` clusters (`scripts/clusters.sh`); prints how long they took.
pub fn start_clusters(n: usize) -> TestClusters {
    start_clusters_env(n, &[])
}

/// [`start_clusters`] with `env` for `scripts/clusters.sh` (e.g.
/// `CLUSTERS_APISERVER_ARGS`); prints it too.
pub fn start_clusters_env(n: usize, env: &[(&str, &str)]) -> TestClusters {
    let started = Instant::now();
    for (k, v) in env {
        println!("clusters with {k}={v:?}");
    }
    let clusters = TestClusters::start_env(n, env);
    println!("cluster ready in {:.1} s ({})", secs(started.elapsed()), clusters.dir().display());
    clusters
}

/// `clusterset-dns serve` (tied to this process) watching through
/// `kubeconfig`, all namespaces.
pub fn serve(kubeconfig: &std::path::Path) -> Served {
    serve_with(kubeconfig, &[])
}

/// [`serve`] with `extra` arguments.
pub fn serve_with(kubeconfig: &std::path::Path, extra: &[&str]) -> Served {
    let kubeconfig = kubeconfig.to_string_lossy();
    let mut args = vec!["--kubeconfig", &kubeconfig];
    args.extend_from_slice(extra);
    Served::start_tied(&args)
}

/// The cluster `propagation` and `update_load` measure, and a ready server
/// watching it through the serve identity. At the default 1,000: ClusterSetIP
/// services in 10 namespaces, 3 slices each. Larger (fleet scale, a multiple
/// of 100): 100 namespaces, every 10th service headless as in `scale`, and
/// the server lists by streaming (the API server with the WatchList gate),
/// so that it is ready in seconds rather than minutes of pages.
pub struct ServedFleet {
    pub clusters: TestClusters,
    pub client: kube::Client,
    pub server: Served,
    pub fleet: Fleet,
}

/// The size of [`ServedFleet`] unless a bench is told otherwise.
pub const SERVED_FLEET: usize = 1_000;

impl ServedFleet {
    pub fn start(rt: &tokio::runtime::Runtime, services: usize) -> Result<Self> {
        let large = services > SERVED_FLEET;
        if large && !services.is_multiple_of(100) {
            anyhow::bail!("{services} services: a multiple of 100 (100 namespaces)");
        }
        let fleet = if large {
            Fleet { prefix: "p", namespaces: 100, per_namespace: services / 100, headless_every: 10 }
        } else {
            Fleet { prefix: "p", namespaces: 10, per_namespace: services.div_ceil(10), headless_every: 0 }
        };
        println!("\n## cluster of {} services", fleet.services());
        let (env, lists): (&[(&str, &str)], &[&str]) = if large {
            (&[("CLUSTERS_APISERVER_ARGS", "--feature-gates=WatchList=true")], &["--list-mode", "stream"])
        } else {
            (&[], &[])
        };
        let clusters = start_clusters_env(1, env);
        let client = rt.block_on(clusters.client(0));
        rt.block_on(create_fleet(&client, &fleet))?;
        let server = serve_with(&clusters.serve_kubeconfig(0), lists);
        let ready = server.wait_ready(SERVER_READY_TIMEOUT);
        println!("server ready {:.0} ms after start", ms(ready));
        Ok(Self { clusters, client, server, fleet })
    }

    /// Starts the cluster and the server, runs `bench` on them, then stops
    /// the server (SIGINT) and the cluster.
    pub fn run(
        rt: &tokio::runtime::Runtime,
        services: usize,
        bench: impl FnOnce(&Self) -> Result<()>,
    ) -> Result<()> {
        let mut served = Self::start(rt, services)?;
        bench(&served)?;
        served.server.stop();
        drop(served.clusters);
        Ok(())
    }
}
