//! The incumbent for the Kubernetes benches: stock CoreDNS (v1.12.4, the
//! binary `scripts/k8s-bins.sh coredns` builds) whose `kubernetes` plugin
//! answers `clusterset.local` from ServiceImports (mcs-api v1alpha1) and
//! MCS EndpointSlices with its `multicluster` option. The external
//! coredns/multicluster plugin is not this: the Go module proxy does not
//! serve it (docs/benchmarks-incumbent.md).
//!
//! What the plugin does at start, from its source (coredns v1.12.4,
//! `plugin/kubernetes/controller.go` `newdnsController`, `Run`,
//! `HasSynced`; `kubernetes.go` `InitKubeCache`): informers on Services,
//! Namespaces and every EndpointSlice, whatever the zones (the first
//! skipped by `noendpoints`), and with `multicluster` two more, on
//! EndpointSlices labelled `multicluster.kubernetes.io/service-name` and on
//! v1alpha1 ServiceImports; DNS is served once all have synced or after
//! `startup_timeout` (5 s), and `ready` answers 200 once all have synced.
//! It runs as a ServiceAccount of its own that may list and watch exactly
//! those resources ([`identity`]), as a cluster's CoreDNS runs.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, PostParams};
use serde_json::json;

use super::objects::timed_call;
use crate::harness::coredns::{coredns_bin, free_port};
use crate::harness::http::try_http_get;
use crate::harness::process::{Owned, each_line, tied};
use crate::harness::procfs;

/// The ServiceAccount (in `clusterset-dns`, which `deploy/serve/rbac.yaml`
/// creates) and ClusterRole of the incumbent.
const IDENTITY: &str = "coredns-incumbent";

/// Environment variables of the Go runtime the incumbent is started
/// without, so that it runs with Go's defaults (GOMAXPROCS: every CPU).
pub const GO_RUNTIME_ENV: [&str; 3] = ["GOMAXPROCS", "GOGC", "GOMEMLIMIT"];

/// A running CoreDNS; its output is kept line by line with the time each
/// line arrived. Killed on drop unless [`Incumbent::stop`] stopped it.
pub struct Incumbent {
    child: Owned,
    /// DNS (UDP and TCP), 127.0.0.1.
    pub addr: SocketAddr,
    /// The `ready` plugin's HTTP address.
    pub ready: SocketAddr,
    /// When the process was spawned.
    pub started: Instant,
    /// The command line, as a shell would run it (in the Corefile's directory).
    pub command: String,
    /// The configuration it runs.
    pub corefile: String,
    log: Arc<Mutex<Vec<(Duration, String)>>>,
    _dir: tempfile::TempDir,
}

impl Incumbent {
    /// Starts CoreDNS tied to this process (call from the main thread)
    /// serving `clusterset.local` from the cluster of `kubeconfig`, with
    /// `options` added to the `kubernetes` block. Returns at once: DNS is
    /// served only after the plugin's informers have synced.
    pub fn start(kubeconfig: &Path, options: &[&str]) -> Result<Self> {
        let bin = coredns_bin();
        let (port, ready_port) = (free_port(), free_port());
        let mut block = format!(
            "    kubernetes clusterset.local {{\n        kubeconfig {}\n        multicluster clusterset.local\n",
            kubeconfig.display()
        );
        for option in options {
            block.push_str(&format!("        {option}\n"));
        }
        let corefile = format!(
            "clusterset.local:{port} {{\n    bind 127.0.0.1\n    ready 127.0.0.1:{ready_port}\n{block}    }}\n}}\n"
        );
        let dir = tempfile::tempdir().context("tempdir for the Corefile")?;
        std::fs::write(dir.path().join("Corefile"), &corefile).context("write Corefile")?;
        let started = Instant::now();
        let mut command = tied(&bin.to_string_lossy());
        command.args(["-conf", "Corefile"]).current_dir(dir.path());
        for var in GO_RUNTIME_ENV {
            command.env_remove(var);
        }
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("start {} (under setpriv, from util-linux)", bin.display()))?;
        let log = Arc::new(Mutex::new(Vec::new()));
        for pipe in [
            Box::new(child.stdout.take().expect("stdout")) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().expect("stderr")),
        ] {
            let sink = log.clone();
            each_line(pipe, move |line| sink.lock().expect("log lock").push((started.elapsed(), line)));
        }
        Ok(Self {
            child: Owned::new(child),
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            ready: SocketAddr::from(([127, 0, 0, 1], ready_port)),
            started,
            command: format!("{} -conf Corefile", bin.display()),
            corefile,
            log,
            _dir: dir,
        })
    }

    /// Whether the `ready` plugin answers 200 now.
    pub fn is_ready(&self) -> bool {
        try_http_get(self.ready, "/ready").is_some_and(|(status, _)| status == 200)
    }

    /// The exit status, once it has exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// utime + stime of every thread, in seconds.
    pub fn cpu_seconds(&self) -> f64 {
        procfs::cpu_seconds(self.pid()).expect("/proc/PID/stat of CoreDNS")
    }

    /// A `kB` field of `/proc/PID/status` (`VmRSS`, `VmHWM`).
    pub fn status_kib(&self, key: &str) -> u64 {
        procfs::status_kib(self.pid(), key).unwrap_or_else(|| panic!("{key} of CoreDNS"))
    }

    /// Output lines so far (stdout and stderr), each with when it arrived.
    pub fn log_lines(&self) -> Vec<(Duration, String)> {
        self.log.lock().expect("log lock").clone()
    }

    /// Everything written so far.
    pub fn log(&self) -> String {
        self.log_lines().into_iter().map(|(_, line)| line + "\n").collect()
    }

    /// SIGTERM (no `health` lameduck is configured), SIGKILL after 5 s.
    pub fn stop(&mut self) {
        self.child.stop("TERM", Duration::from_secs(5));
    }
}

/// `coredns -version`, on one line (`CoreDNS-1.12.4 linux/amd64, go1.26.8`).
pub fn version() -> String {
    Command::new(coredns_bin())
        .arg("-version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).split_whitespace().collect::<Vec<_>>().join(" "))
        .map(|v| v.trim_end_matches(',').to_owned())
        .unwrap_or_else(|e| format!("coredns -version: {e}"))
}

/// The incumbent's identity in the cluster of `admin`: ServiceAccount
/// `clusterset-dns/coredns-incumbent`, allowed to list and watch what the
/// plugin watches (Services, Namespaces, EndpointSlices, ServiceImports)
/// and nothing else, and a kubeconfig for it written next to
/// `serve_kubeconfig` (whose cluster entry it copies, token replaced).
pub async fn identity(admin: &kube::Client, serve_kubeconfig: &Path) -> Result<PathBuf> {
    let pp = PostParams::default();
    let role: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": IDENTITY},
        "rules": [
            {"apiGroups": [""], "resources": ["services", "namespaces"], "verbs": ["list", "watch"]},
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
            {"apiGroups": ["multicluster.x-k8s.io"], "resources": ["serviceimports"], "verbs": ["list", "watch"]}
        ]
    }))?;
    timed_call(Api::<ClusterRole>::all(admin.clone()).create(&pp, &role)).await.context("ClusterRole")?;
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": IDENTITY},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": IDENTITY},
        "subjects": [{"kind": "ServiceAccount", "name": IDENTITY, "namespace": "clusterset-dns"}]
    }))?;
    timed_call(Api::<ClusterRoleBinding>::all(admin.clone()).create(&pp, &binding))
        .await
        .context("ClusterRoleBinding")?;
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), "clusterset-dns");
    let account: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": IDENTITY}}))?;
    timed_call(accounts.create(&pp, &account)).await.context("ServiceAccount")?;
    let request: TokenRequest =
        serde_json::from_value(json!({"spec": {"audiences": [], "expirationSeconds": 86_400}}))?;
    let token = timed_call(accounts.create_token_request(IDENTITY, &pp, &request))
        .await
        .context("TokenRequest")?
        .status
        .context("TokenRequest without a status")?
        .token;
    let text = std::fs::read_to_string(serve_kubeconfig)
        .with_context(|| format!("read {}", serve_kubeconfig.display()))?;
    let mut replaced = 0;
    let kubeconfig: String = text
        .lines()
        .map(|line| match line.split_once("token: ") {
            Some((indent, _)) if indent.trim().is_empty() => {
                replaced += 1;
                format!("{indent}token: {token}\n")
            }
            _ => format!("{line}\n"),
        })
        .collect();
    if replaced != 1 {
        bail!("{}: {replaced} token lines, expected 1", serve_kubeconfig.display());
    }
    let path = serve_kubeconfig.with_file_name(format!("{IDENTITY}.kubeconfig"));
    std::fs::write(&path, kubeconfig).with_context(|| format!("write {}", path.display()))?;
    Ok(path)
}
