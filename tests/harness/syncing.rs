//! `clusterset-dns sync` (the real binary) over every cluster of a
//! [`TestClusters`], as the identity of `deploy/sync/rbac.yaml`: its log,
//! its HTTP endpoint and metrics, its CPU time.

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::BIN;
use super::clusters::TestClusters;
use super::http::{http_get, metric_sum, metric_value};
use super::process::{Owned, capture_output, tied};
use super::procfs;

/// A running `clusterset-dns sync`; killed on drop (its log printed when
/// the drop is part of a panic) unless [`Syncing::stop`] stopped it first.
pub struct Syncing {
    child: Owned,
    log: Arc<Mutex<String>>,
}

impl Syncing {
    /// `clusterset-dns sync --http-listen 127.0.0.1:0 --cluster NAME=KUBECONFIG…`
    /// (every cluster, sync identity) followed by `extra`, with `env` added.
    /// `RUST_LOG` is `$SYNC_LOG`, else `info`.
    pub fn start(clusters: &TestClusters, extra: &[&str], env: &[(&str, &str)]) -> Self {
        Self::spawn(Command::new(BIN), clusters, extra, env)
    }

    /// [`Syncing::start`] tied to this process (see [`tied`]): for benches.
    /// Call from the main thread.
    pub fn start_tied(clusters: &TestClusters, extra: &[&str]) -> Self {
        Self::spawn(tied(BIN), clusters, extra, &[])
    }

    /// `clusterset-dns sync --http-listen 127.0.0.1:0` followed by `extra`
    /// only: no `--cluster` (e.g. members from `--cluster-profiles`).
    pub fn start_without_members(extra: &[&str]) -> Self {
        Self::run(Command::new(BIN), &[], extra, &[])
    }

    /// `clusterset-dns agent --http-listen 127.0.0.1:0` followed by `args`
    /// (hub mode: one per member).
    pub fn agent(args: &[&str]) -> Self {
        Self::run_agent(Command::new(BIN), args)
    }

    /// [`Syncing::agent`] tied to this process (see [`tied`]): for benches.
    /// Call from the main thread.
    pub fn agent_tied(args: &[&str]) -> Self {
        Self::run_agent(tied(BIN), args)
    }

    fn run_agent(program: Command, args: &[&str]) -> Self {
        let mut all: Vec<String> = vec!["agent".into(), "--http-listen".into(), "127.0.0.1:0".into()];
        all.extend(args.iter().map(|s| s.to_string()));
        Self::exec(program, &all, &[])
    }

    fn spawn(program: Command, clusters: &TestClusters, extra: &[&str], env: &[(&str, &str)]) -> Self {
        let mut members: Vec<String> = Vec::new();
        for i in 0..clusters.len() {
            members.push("--cluster".into());
            members.push(format!("{}={}", clusters.name(i), clusters.role_kubeconfig(i, "sync").display()));
        }
        Self::run(program, &members, extra, env)
    }

    fn run(program: Command, members: &[String], extra: &[&str], env: &[(&str, &str)]) -> Self {
        let mut args: Vec<String> = vec!["sync".into(), "--http-listen".into(), "127.0.0.1:0".into()];
        args.extend(members.iter().cloned());
        args.extend(extra.iter().map(|s| s.to_string()));
        Self::exec(program, &args, env)
    }

    fn exec(mut program: Command, args: &[String], env: &[(&str, &str)]) -> Self {
        let mut child = program
            .args(args)
            .env("RUST_LOG", std::env::var("SYNC_LOG").unwrap_or_else(|_| "info".into()))
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start clusterset-dns sync (benches: under setpriv, from util-linux)");
        let log = capture_output(&mut child);
        Self { child: Owned::new(child), log }
    }

    pub fn log(&self) -> String {
        self.log.lock().expect("log").clone()
    }

    /// Its HTTP address, from its log; waits up to 60 s for the line.
    pub fn http(&self) -> SocketAddr {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let log = self.log();
            let addr = log
                .lines()
                .find(|l| l.contains("HTTP /health"))
                .and_then(|l| l.split("addr=").nth(1))
                .and_then(|a| a.split_whitespace().next())
                .and_then(|a| a.parse().ok());
            match addr {
                Some(addr) => return addr,
                None if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
                None => panic!("no HTTP address logged:\n{log}"),
            }
        }
    }

    /// The body of `GET path` on its HTTP endpoint.
    pub fn get(&self, path: &str) -> String {
        http_get(self.http(), path).1
    }

    /// The value of one metric line (`name{labels}`) in a scrape of `/metrics`.
    pub fn metric(&self, line: &str) -> Option<f64> {
        metric_value(&self.get("/metrics"), line)
    }

    /// Reconciles started (`clusterset_dns_sync_reconciles_total`, every
    /// reason); 0 before the first scrape answers it.
    pub fn reconciles(&self) -> f64 {
        metric_sum(&self.get("/metrics"), "clusterset_dns_sync_reconciles_total").unwrap_or(0.0)
    }

    /// Idle in one scrape: nothing queued, and every reconcile started has
    /// ended (`clusterset_dns_sync_reconciles_total`, counted as one starts,
    /// equals the count of `clusterset_dns_sync_reconcile_seconds`,
    /// observed as one ends). Returns the reconciles then.
    fn idle(&self) -> Option<f64> {
        let scrape = self.get("/metrics");
        let started = metric_sum(&scrape, "clusterset_dns_sync_reconciles_total")?;
        let ended = metric_value(&scrape, "clusterset_dns_sync_reconcile_seconds_count")?;
        let depth = metric_value(&scrape, "clusterset_dns_sync_queue_depth")?;
        (depth == 0.0 && started == ended).then_some(started)
    }

    /// Waits (up to 60 s) until at least `since + passes` reconciles have
    /// started and the controller is idle in two scrapes in a row with no
    /// reconcile started between them: every change it had received by the
    /// time the wait began is reconciled (its writes made). What those
    /// writes bring back by the watches is covered only as far as the
    /// 0.1 s between the two scrapes goes, and a service waiting out a
    /// retry's backoff is not counted as busy. Callers make sure the change
    /// they care about was received first (a later change from the same
    /// watch observed done, or the reconciles it causes). Panics naming
    /// `what` with the log otherwise.
    pub fn settle(&self, since: f64, passes: f64, what: &str) {
        let mut last = None;
        let settled = super::within(Duration::from_secs(60), || {
            let now = self.idle().filter(|&n| n >= since + passes);
            let twice = now.is_some() && now == last;
            last = now;
            if !twice {
                std::thread::sleep(Duration::from_millis(100));
            }
            twice
        });
        assert!(settled, "{what}: the controller not idle within 60 s:\n{}", self.log());
    }

    /// Whether it holds the Lease (by its log).
    pub fn leading(&self) -> bool {
        self.log().contains("leading: syncing") && !self.log().contains("lost the Lease")
    }

    /// utime + stime of every thread, in seconds.
    pub fn cpu_seconds(&self) -> f64 {
        procfs::cpu_seconds(self.child.id()).expect("/proc/PID/stat of sync")
    }

    /// Its peak resident set (`VmHWM`), in KiB; 0 once it has exited.
    pub fn peak_rss_kib(&self) -> u64 {
        procfs::status_kib(self.child.id(), "VmHWM").unwrap_or(0)
    }

    /// The exit status, once it has exited.
    pub fn try_wait(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait()
    }

    pub fn kill(&mut self) {
        self.child.kill();
    }

    /// Sends `signal` (`STOP`, `CONT`) and returns at once.
    pub fn signal(&self, signal: &str) {
        let sent = Command::new("kill").args([&format!("-{signal}"), &self.child.id().to_string()]).status();
        assert!(sent.is_ok_and(|s| s.success()), "kill -{signal} {}", self.child.id());
    }

    /// SIGTERM (gives up the Lease), SIGKILL after 10 s.
    pub fn stop(&mut self) {
        self.child.stop("TERM", Duration::from_secs(10));
    }
}

impl Drop for Syncing {
    fn drop(&mut self) {
        // The process itself is killed when `child` drops, after this.
        if std::thread::panicking() {
            eprintln!("--- clusterset-dns sync log ---\n{}", self.log());
        }
    }
}
