//! Real Kubernetes clusters for tests and benches: independent control planes (one etcd
//! and one kube-apiserver each) on loopback, with RBAC, token auth, the MCS
//! CRDs and the serve RBAC installed. A thin wrapper over
//! `scripts/clusters.sh up N DIR`, which supervises the processes (see the
//! script's header).
//!
//! [`TestClusters::start`] runs no kubelets and no controller-manager:
//! nothing runs pods and a deleted namespace stays `Terminating`. Use a fresh
//! namespace per test. [`TestClusters::start_with_nodes`] adds
//! kube-scheduler, kube-controller-manager and KWOK with one fake Node per
//! cluster, so Deployments get Running, Ready pods with IPs and the real
//! EndpointSlice controller writes their Services' slices.
//!
//! Indices are 0-based here: index `i` is the script's cluster `i + 1`,
//! named `cluster-{i+1}`.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use kube::config::{KubeConfigOptions, Kubeconfig};

use super::process::each_line;

/// A cold build of etcd and kube-apiserver (first run on a fresh machine).
const BUILD_TIMEOUT: Duration = Duration::from_secs(40 * 60);
/// From built binaries to `READY`: ~8 s for one cluster, ~20 s for three on 2 cores
/// (with nodes: scheduler, controller-manager and KWOK add their start).
const READY_TIMEOUT: Duration = Duration::from_secs(240);
/// How long `Drop` waits for the supervisor before killing its process group.
const STOP_TIMEOUT: Duration = Duration::from_secs(60);
/// The script's stderr kept for failure messages.
const LOG_LIMIT: usize = 256 * 1024;

/// A process of one cluster's control plane.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Component {
    /// The cluster's etcd (its data survives a stop).
    Etcd,
    /// The cluster's kube-apiserver.
    ApiServer,
}

impl Component {
    fn arg(self) -> &'static str {
        match self {
            Self::Etcd => "etcd",
            Self::ApiServer => "apiserver",
        }
    }
}

/// One cluster as `DIR/state` describes it.
#[derive(Debug)]
struct Cluster {
    name: String,
    apiserver_port: u16,
    apiserver_pid: u32,
    etcd_pid: u32,
}

/// N running clusters; stopped (every process, and their directory removed)
/// when dropped.
pub struct TestClusters {
    dir: PathBuf,
    clusters: Vec<Cluster>,
    supervisor: Supervisor,
}

impl TestClusters {
    /// Starts `n` clusters and waits until they serve, with the MCS CRDs
    /// established and `deploy/serve/rbac.yaml` applied. Builds etcd and
    /// kube-apiserver first if they are not cached (minutes). Panics, with
    /// the script's output, if anything fails: never skips.
    ///
    /// `CLUSTERS_KEEP_DIR=1` keeps the directory (logs, kubeconfigs) after
    /// the clusters have stopped.
    pub fn start(n: usize) -> Self {
        Self::spawn(n, false, &[])
    }

    /// [`TestClusters::start`] with `env` set for `scripts/clusters.sh`
    /// (e.g. `CLUSTERS_SERVICE_CIDR`).
    pub fn start_env(n: usize, env: &[(&str, &str)]) -> Self {
        Self::spawn(n, false, env)
    }

    /// [`TestClusters::start`] with kube-scheduler, kube-controller-manager
    /// and KWOK with one fake Node (`node-1`) in every cluster
    /// (`CLUSTERS_NODES=1`, see `scripts/clusters.sh`): Deployments and
    /// StatefulSets get Running, Ready pods with IPs (pod CIDR
    /// `10.(200+i+1).0.0/16`), Services their real EndpointSlices, deleted
    /// namespaces go away. The pods run nothing: no exec, no traffic.
    pub fn start_with_nodes(n: usize) -> Self {
        Self::spawn(n, true, &[])
    }

    fn spawn(n: usize, nodes: bool, env: &[(&str, &str)]) -> Self {
        assert!(n > 0, "TestClusters::start(0)");
        let dir = tempfile::Builder::new()
            .prefix("clusterset-dns-clusters.")
            .tempdir()
            .expect("create a temporary directory for the clusters")
            .keep();
        let remove = if std::env::var_os("CLUSTERS_KEEP_DIR").is_some_and(|v| v == "1") { "0" } else { "1" };
        let started = Instant::now();
        let child = Command::new(script())
            .arg("up")
            .arg(n.to_string())
            .arg(&dir)
            .env("CLUSTERS_PARENT_PID", std::process::id().to_string())
            .env("CLUSTERS_REMOVE_DIR", remove)
            .env("CLUSTERS_NODES", if nodes { "1" } else { "0" })
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group: the last resort of `Drop` kills all of it.
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", script().display()));
        let mut supervisor = Supervisor::new(child, "scripts/clusters.sh up", "clusters");
        supervisor.wait_for("BINARIES", BUILD_TIMEOUT);
        supervisor.wait_for("READY", READY_TIMEOUT);
        let clusters = read_state(&dir);
        assert_eq!(
            clusters.len(),
            n,
            "{}/state lists {} clusters, expected {n}",
            dir.display(),
            clusters.len()
        );
        eprintln!(
            "[clusters] {n} cluster(s) ready in {:.1}s under {}",
            started.elapsed().as_secs_f64(),
            dir.display()
        );
        Self { dir, clusters, supervisor }
    }

    /// How many clusters there are.
    pub fn len(&self) -> usize {
        self.clusters.len()
    }

    /// The clusters' directory (logs in `cluster-N/{etcd,apiserver}.log`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The name of cluster `i` (0-based): `cluster-{i+1}`; also its kubeconfig context.
    pub fn name(&self, i: usize) -> &str {
        &self.cluster(i).name
    }

    /// The API server URL of cluster `i`.
    pub fn server(&self, i: usize) -> String {
        format!("https://127.0.0.1:{}", self.cluster(i).apiserver_port)
    }

    /// Admin (`system:masters`) kubeconfig of cluster `i`.
    pub fn kubeconfig(&self, i: usize) -> PathBuf {
        self.cluster_dir(i).join("kubeconfig")
    }

    /// Kubeconfig of cluster `i` for ServiceAccount `clusterset-dns/clusterset-dns`,
    /// which holds only ClusterRole `clusterset-dns-serve` (list/watch of
    /// ServiceImports and EndpointSlices).
    pub fn serve_kubeconfig(&self, i: usize) -> PathBuf {
        self.cluster_dir(i).join("serve.kubeconfig")
    }

    /// Kubeconfig of cluster `i` for the ServiceAccount of
    /// `deploy/<role>/rbac.yaml` (`centralized`, `sync`), which holds only
    /// that file's ClusterRole.
    pub fn role_kubeconfig(&self, i: usize, role: &str) -> PathBuf {
        self.cluster_dir(i).join(format!("{role}.kubeconfig"))
    }

    /// One kubeconfig with every cluster as admin, contexts `cluster-1`..`cluster-N`.
    pub fn kubeconfig_all(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }

    /// An admin client of cluster `i`.
    pub async fn client(&self, i: usize) -> kube::Client {
        client_from(&self.kubeconfig(i)).await
    }

    /// A client of cluster `i` as the serve ServiceAccount.
    pub async fn serve_client(&self, i: usize) -> kube::Client {
        client_from(&self.serve_kubeconfig(i)).await
    }

    /// Stops `component` of cluster `i` (SIGTERM; returns once it has exited).
    pub fn stop(&self, i: usize, component: Component) {
        self.control("stop", i, component);
    }

    /// Starts `component` of cluster `i` again, with the same ports and data;
    /// returns once it serves (after etcd: once the API server serves again).
    pub fn start_component(&self, i: usize, component: Component) {
        self.control("start", i, component);
    }

    /// The pids of cluster `i`'s (kube-apiserver, etcd), as `DIR/state` says
    /// now (a restarted component has a new one).
    pub fn pids(&self, i: usize) -> (u32, u32) {
        let state = &read_state(&self.dir)[i];
        (state.apiserver_pid, state.etcd_pid)
    }

    /// The pids of every kube-apiserver and etcd of every cluster.
    pub fn control_plane_pids(&self) -> Vec<u32> {
        read_state(&self.dir).iter().flat_map(|c| [c.apiserver_pid, c.etcd_pid]).collect()
    }

    fn cluster(&self, i: usize) -> &Cluster {
        self.clusters.get(i).unwrap_or_else(|| panic!("no cluster {i}: there are {}", self.clusters.len()))
    }

    /// Cluster `i`'s kube-apiserver log (its standard output and error,
    /// so also an audit log written to `-`).
    pub fn apiserver_log(&self, i: usize) -> PathBuf {
        self.cluster_dir(i).join("apiserver.log")
    }

    fn cluster_dir(&self, i: usize) -> PathBuf {
        self.dir.join(&self.cluster(i).name)
    }

    fn control(&self, verb: &str, i: usize, component: Component) {
        let name = &self.cluster(i).name;
        let out = Command::new(script())
            .args([verb, &self.dir.to_string_lossy(), &(i + 1).to_string(), component.arg()])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", script().display()));
        assert!(
            out.status.success(),
            "clusters.sh {verb} {name} {}: {}\n{}\n--- supervisor ---\n{}",
            component.arg(),
            out.status,
            String::from_utf8_lossy(&out.stderr),
            self.supervisor.log()
        );
    }
}

impl Drop for TestClusters {
    fn drop(&mut self) {
        self.supervisor.stop();
    }
}

/// Three clusters shared by every test of this process, started on first
/// use. For tests that do not stop components; each test works in its own
/// namespaces. Statics are never dropped: the supervisor stops the clusters
/// when this process exits (it polls for its parent every second).
pub fn shared() -> &'static TestClusters {
    static SHARED: OnceLock<TestClusters> = OnceLock::new();
    SHARED.get_or_init(|| TestClusters::start(3))
}

/// `scripts/clusters.sh` of this repository.
fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/clusters.sh")
}

async fn client_from(path: &Path) -> kube::Client {
    let kubeconfig =
        Kubeconfig::read_from(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap_or_else(|e| panic!("loading {}: {e}", path.display()));
    kube::Client::try_from(config).unwrap_or_else(|e| panic!("client from {}: {e}", path.display()))
}

/// Parses `DIR/state`: one line per cluster.
fn read_state(dir: &Path) -> Vec<Cluster> {
    super::read_state(dir, |l| Cluster {
        name: l.get("name").to_owned(),
        apiserver_port: l.parse("apiserver_port"),
        apiserver_pid: l.parse("apiserver_pid"),
        etcd_pid: l.parse("etcd_pid"),
    })
}

/// The `clusters.sh up` (or `dataplane.sh up`) process, its stdout lines and its stderr.
pub(super) struct Supervisor {
    child: Child,
    /// Stdout lines; in a Mutex only so that `TestClusters` is `Sync` (`shared`).
    lines: Mutex<mpsc::Receiver<String>>,
    log: Arc<Mutex<String>>,
    stopped: bool,
    /// The script and verb, for messages: `scripts/clusters.sh up`.
    what: &'static str,
}

impl Supervisor {
    /// `what` names the script in messages; its stderr lines are echoed
    /// with `[tag]` in front.
    pub(super) fn new(mut child: Child, what: &'static str, tag: &'static str) -> Self {
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr = child.stderr.take().expect("piped stderr");
        let (tx, lines) = mpsc::channel();
        // Both pipes are drained until the script exits, so it never blocks on
        // (or dies of) a full or closed pipe.
        each_line(stdout, move |line| {
            let _ = tx.send(line);
        });
        let log = Arc::new(Mutex::new(String::new()));
        let sink = Arc::clone(&log);
        each_line(stderr, move |line| keep_stderr(tag, line, &sink));
        Self { child, lines: Mutex::new(lines), log, stopped: false, what }
    }

    /// Waits for a stdout line starting with `word`; panics with the
    /// script's output if it exits or times out first.
    pub(super) fn wait_for(&mut self, word: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let next = match self.lines.get_mut() {
                Ok(lines) => lines.recv_timeout(left),
                Err(poisoned) => poisoned.into_inner().recv_timeout(left),
            };
            match next {
                Ok(line) if line.starts_with(word) => return,
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => {
                    self.stop();
                    panic!("{}: no {word} within {}s\n{}", self.what, timeout.as_secs(), self.log());
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let status = self.child.wait().map(|s| s.to_string()).unwrap_or_else(|e| e.to_string());
                    self.stopped = true;
                    // Let the stderr reader reach the end.
                    std::thread::sleep(Duration::from_millis(200));
                    panic!(
                        "{} failed ({status}) before {word}; the Kubernetes binaries \
                         come from scripts/k8s-bins.sh (Go toolchain and module proxy)\n{}",
                        self.what,
                        self.log()
                    );
                }
            }
        }
    }

    pub(super) fn log(&self) -> String {
        self.log.lock().map(|log| log.clone()).unwrap_or_default()
    }

    /// SIGTERM, then up to `STOP_TIMEOUT` for the supervisor to stop what it
    /// started; then SIGKILL to its whole process group.
    pub(super) fn stop(&mut self) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + STOP_TIMEOUT;
        while Instant::now() < deadline {
            match self.child.try_wait() {
                Ok(Some(_)) | Err(_) => return,
                Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
        eprintln!(
            "[clusters] supervisor {pid} still running after {}s: killing its process group",
            STOP_TIMEOUT.as_secs()
        );
        let _ = Command::new("kill").args(["-KILL", "--", &format!("-{pid}")]).status();
        let _ = self.child.wait();
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Keeps a line of the script's stderr in `sink` (bounded) and copies it to
/// this process's stderr.
fn keep_stderr(tag: &str, line: String, sink: &Mutex<String>) {
    eprintln!("[{tag}] {line}");
    if let Ok(mut log) = sink.lock() {
        if log.len() > LOG_LIMIT {
            let cut = log.len() - LOG_LIMIT / 2;
            let cut = (cut..log.len()).find(|&i| log.is_char_boundary(i)).unwrap_or(log.len());
            log.drain(..cut);
        }
        log.push_str(&line);
        log.push('\n');
    }
}
