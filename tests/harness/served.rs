//! `clusterset-dns serve` (or `run`) as a user runs it: the real binary on
//! loopback ports it picks itself, its stderr kept line by line with the
//! time each line arrived, its HTTP endpoint, `dig` against it, and for the
//! benches its CPU time and memory.

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::http::{http_get, try_http_get};
use super::process::{Owned, each_line, tied};
use super::procfs;
use super::{BIN, within};

/// How long a start may take until both addresses are logged.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A running `clusterset-dns serve`; its stderr is collected; killed on drop
/// unless [`Served::stop`] stopped it first.
pub struct Served {
    child: Owned,
    /// The DNS address (UDP and TCP).
    pub addr: SocketAddr,
    /// The HTTP address (`/health`, `/ready`, `/metrics`).
    pub http: SocketAddr,
    /// When the process was spawned.
    pub started: Instant,
    /// The command line, as a shell would run it.
    pub command: String,
    log: Arc<Mutex<Vec<(Duration, String)>>>,
}

impl Served {
    /// `clusterset-dns serve` with `args`; `--listen`, `--http-listen` and
    /// `--udp-workers` default to `127.0.0.1:0`, `127.0.0.1:0` and `1`.
    pub fn start(args: &[&str]) -> Self {
        Self::start_as("serve", args)
    }

    /// `clusterset-dns COMMAND` with serve's options (`serve` or `run`).
    pub fn start_as(command: &str, args: &[&str]) -> Self {
        Self::start_env(command, args, &[])
    }

    /// [`Served::start_as`] with extra environment variables.
    pub fn start_env(command: &str, args: &[&str], env: &[(&str, &str)]) -> Self {
        Self::spawn(Command::new(BIN), command, args, env)
    }

    /// [`Served::start`] tied to this process (see [`tied`]): for benches.
    /// Call from the main thread.
    pub fn start_tied(args: &[&str]) -> Self {
        Self::spawn(tied(BIN), "serve", args, &[])
    }

    /// [`Served::start`] with a limit of `n` open files (soft and hard), set
    /// by util-linux's `prlimit`, which then runs the server in its place.
    pub fn start_open_files(n: u64, args: &[&str]) -> Self {
        let mut prlimit = Command::new("prlimit");
        prlimit.args([&format!("--nofile={n}:{n}"), "--", BIN]);
        Self::spawn(prlimit, "serve", args, &[])
    }

    fn spawn(mut program: Command, command: &str, args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut argv = vec![command, "--http-listen", "127.0.0.1:0"];
        if !args.contains(&"--udp-workers") {
            argv.extend(["--udp-workers", "1"]);
        }
        if !args.contains(&"--listen") {
            argv.extend(["--listen", "127.0.0.1:0"]);
        }
        argv.extend_from_slice(args);
        let shown = format!("RUST_LOG=info {BIN} {}", argv.join(" "));
        let started = Instant::now();
        let mut child = program
            .args(&argv)
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start clusterset-dns (benches: under setpriv, from util-linux)");
        let log = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = mpsc::channel();
        let sink = log.clone();
        each_line(stderr, move |line| {
            let at = started.elapsed();
            // `addr=…` in text logs, `"addr":"…"` with `--log-format json`.
            let addr = (line.split("addr=").nth(1).and_then(|a| a.split_whitespace().next()))
                .or_else(|| line.split("\"addr\":\"").nth(1).and_then(|a| a.split('"').next()));
            let addr = addr.and_then(|a| a.parse::<SocketAddr>().ok());
            if line.contains("HTTP /health") {
                let _ = tx.send(("http", addr));
            } else if line.contains("listening on UDP and TCP") {
                let _ = tx.send(("dns", addr));
            }
            sink.lock().expect("log lock").push((at, line));
        });
        let mut me = Self {
            child: Owned::new(child),
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            http: SocketAddr::from(([127, 0, 0, 1], 0)),
            started,
            command: shown,
            log,
        };
        let (mut addr, mut http) = (None, None);
        while addr.is_none() || http.is_none() {
            match rx.recv_timeout(START_TIMEOUT) {
                Ok(("http", a)) => http = a,
                Ok((_, a)) => addr = a,
                Err(_) => panic!("server did not start:\n{}", me.log()),
            }
        }
        let (Some(addr), Some(http)) = (addr, http) else { panic!("no addresses logged:\n{}", me.log()) };
        (me.addr, me.http) = (addr, http);
        me
    }

    /// Everything written to stderr so far.
    pub fn log(&self) -> String {
        self.log_lines().into_iter().map(|(_, line)| line + "\n").collect()
    }

    /// Stderr lines so far, each with when it arrived (since the spawn).
    pub fn log_lines(&self) -> Vec<(Duration, String)> {
        self.log.lock().expect("log lock").clone()
    }

    /// Waits (20 s at most) until the log contains `needle`.
    pub fn wait_log(&self, needle: &str) -> bool {
        within(Duration::from_secs(20), || self.log().contains(needle))
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(ok.success());
    }

    /// `GET path` on the HTTP endpoint: (status code, body).
    pub fn get(&self, path: &str) -> (u16, String) {
        http_get(self.http, path)
    }

    /// Whether `/ready` answers 200 now.
    pub fn is_ready(&self) -> bool {
        try_http_get(self.http, "/ready").is_some_and(|(status, _)| status == 200)
    }

    /// Polls `/ready` every 10 ms until it answers 200; returns the time
    /// since the spawn. Panics with the log after `timeout`.
    pub fn wait_ready(&self, timeout: Duration) -> Duration {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.is_ready() {
                return self.started.elapsed();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("server not ready within {} s:\n{}", timeout.as_secs(), self.log())
    }

    /// True once the process has exited.
    pub fn exited(&mut self) -> bool {
        self.child.try_wait().is_some()
    }

    /// The exit status, once the process exits within `within`.
    pub fn wait_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// `dig` with extra arguments; returns its short output.
    pub fn dig(&self, args: &[&str]) -> String {
        dig(self.addr, args)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// utime + stime of every thread, in seconds.
    pub fn cpu_seconds(&self) -> f64 {
        procfs::cpu_seconds(self.pid()).expect("/proc/PID/stat of the server")
    }

    /// A `kB` field of `/proc/PID/status` (`VmRSS`, `VmHWM`).
    pub fn status_kib(&self, key: &str) -> u64 {
        procfs::status_kib(self.pid(), key).unwrap_or_else(|| panic!("{key} of the server"))
    }

    /// SIGINT: stops at once (SIGTERM would keep answering for the lameduck
    /// period); SIGKILL after 5 s.
    pub fn stop(&mut self) {
        self.child.stop("INT", Duration::from_secs(5));
    }
}

/// Runs `dig @addr -p port ARGS +short +tries=2 +time=1`.
pub fn dig(addr: SocketAddr, args: &[&str]) -> String {
    let out = Command::new("dig")
        .args([&format!("@{}", addr.ip()), "-p", &addr.port().to_string(), "+time=1", "+tries=2"])
        .args(args)
        .output()
        .expect("dig (apt-get install bind9-dnsutils)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}
