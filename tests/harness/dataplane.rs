//! A data plane for [`TestClusters`]: `scripts/dataplane.sh up DIR` gives
//! each cluster a node (a network namespace running the real kube-proxy in
//! nftables mode) and Pods (network namespaces running
//! `scripts/dataplane-pod.py`), on one flat network. See the script's
//! header for the addresses: cluster `i` (0-based) is the script's `i + 1`,
//! its Pods are `198.18.{i+1}.0/24` and `2001:2:0:{i+1}::/64`, its Services
//! `198.19.{i+1}.0/24` and `2001:2:0:{i+1}00::/112`, and the host is
//! [`HOST`] (where `clusterset-dns serve` listens for them).
//!
//! The clusters must be started with [`SERVICE_CIDR`], which
//! [`DataplaneFleet::start`] does. One data plane runs on a machine at a
//! time (fixed addresses): tests share [`DataplaneFleet`] behind a lock.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::clusters::{Supervisor, TestClusters};

/// `CLUSTERS_SERVICE_CIDR` for the data plane's clusters: dual-stack.
pub const SERVICE_CIDR: &str = "198.19.{I}.0/24,2001:2:0:{I}00::/112";
/// The host's address on the data plane's bridge.
pub const HOST: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
/// The ports every server Pod answers on, TCP and UDP.
pub const PORTS: [u16; 2] = [8080, 8081];
/// Server Pods per cluster (`pod-1`, `pod-2`).
pub const SERVER_PODS: usize = 2;

/// A cold kube-proxy build (it shares kube-apiserver's build cache) and the setup.
const READY_TIMEOUT: Duration = Duration::from_secs(20 * 60);

/// One Pod (or node) of the data plane, as `DIR/state` describes it.
#[derive(Clone, Debug)]
pub struct Pod {
    /// `cluster-{i+1}`.
    pub cluster: String,
    /// `pod-1`, `pod-2`, `client`, `dns`, or `node`.
    pub name: String,
    pub netns: String,
    pub ip: Ipv4Addr,
    pub ip6: Ipv6Addr,
    /// Its server (kube-proxy for a node); 0: none.
    pub pid: u32,
}

/// Three clusters with their data plane; stopped when dropped.
pub struct DataplaneFleet {
    // Field order: the data plane goes before the clusters it reads.
    dataplane: Dataplane,
    pub clusters: TestClusters,
}

impl DataplaneFleet {
    /// `n` clusters with Service CIDRs in 198.19.0.0/16, then their data plane.
    pub fn start(n: usize) -> Self {
        let clusters = TestClusters::start_env(n, &[("CLUSTERS_SERVICE_CIDR", SERVICE_CIDR)]);
        let dataplane = Dataplane::start(&clusters);
        Self { dataplane, clusters }
    }

    pub fn dataplane(&self) -> &Dataplane {
        &self.dataplane
    }
}

/// The running `dataplane.sh up`.
pub struct Dataplane {
    dir: PathBuf,
    pods: Vec<Pod>,
    supervisor: Supervisor,
}

impl Dataplane {
    /// Builds the data plane of `clusters` and waits until every node's
    /// kube-proxy has programmed its cluster's kube-dns VIP. Panics with the
    /// script's output (naming the command that failed) otherwise.
    pub fn start(clusters: &TestClusters) -> Self {
        let child = Command::new(script())
            .arg("up")
            .arg(clusters.dir())
            .env("DATAPLANE_PARENT_PID", std::process::id().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", script().display()));
        let mut supervisor = Supervisor::new(child, "scripts/dataplane.sh up", "dataplane");
        supervisor.wait_for("READY", READY_TIMEOUT);
        let dir = clusters.dir().join("dataplane");
        let pods = read_state(&dir);
        Self { dir, pods, supervisor }
    }

    /// `DIR` of the script: `state`, kube-proxy and Pod logs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Pod `name` of cluster `i` (0-based); `node` is the node.
    pub fn pod(&self, i: usize, name: &str) -> &Pod {
        let cluster = format!("cluster-{}", i + 1);
        self.pods
            .iter()
            .find(|p| p.cluster == cluster && p.name == name)
            .unwrap_or_else(|| panic!("no {name} in {cluster}: {:?}", self.pods))
    }

    /// The server Pods of cluster `i`.
    pub fn servers(&self, i: usize) -> Vec<&Pod> {
        (1..=SERVER_PODS).map(|k| self.pod(i, &format!("pod-{k}"))).collect()
    }

    /// `ip netns exec NETNS program`: a command in Pod `name` of cluster `i`,
    /// which resolves names through that cluster's kube-dns VIP.
    pub fn exec(&self, i: usize, name: &str, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.pod(i, name).netns, program]);
        c
    }

    /// The last lines of the kube-proxy log of cluster `i`, for failure messages.
    pub fn kube_proxy_log(&self, i: usize) -> String {
        let path = self.dir.join(format!("kube-proxy-{}.log", i + 1));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| format!("{}: {e}", path.display()));
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// The nftables rules kube-proxy wrote in cluster `i`'s node.
    pub fn kube_proxy_rules(&self, i: usize) -> String {
        let out = self
            .exec(i, "node", "nft")
            .args(["list", "table", "ip", "kube-proxy"])
            .output()
            .expect("run ip netns exec nft");
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
    }

    pub fn log(&self) -> String {
        self.supervisor.log()
    }
}

impl Drop for Dataplane {
    fn drop(&mut self) {
        self.supervisor.stop();
    }
}

/// `scripts/dataplane.sh` of this repository.
pub fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/dataplane.sh")
}

/// `scripts/dataplane-pod.py` of this repository.
pub fn pod_program() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/dataplane-pod.py")
}

fn read_state(dir: &Path) -> Vec<Pod> {
    super::read_state(dir, |l| Pod {
        cluster: l.get("cluster").to_owned(),
        name: l.get("name").to_owned(),
        netns: l.get("netns").to_owned(),
        ip: l.parse("ip"),
        ip6: l.parse("ip6"),
        pid: l.parse("pid"),
    })
}
