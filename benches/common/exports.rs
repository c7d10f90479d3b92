//! A fleet of exports for the controller benches (`sync`, `hub`): `n`
//! Services with one EndpointSlice each in namespace [`NS`] of every member,
//! spread over the members (service `i` lives in member `i % members`),
//! their ServiceExports created at once, and the wait until every member
//! holds every import with a VIP. Also what each API server says it was
//! asked to write (`apiserver_request_total`), independently of our
//! counters.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use clusterset_dns::k8s::mcs::mcs_resource;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::{Value, json};

use super::objects::{create_all, import_resource, slice_resource, timed_call};
use crate::harness::BIN;
use crate::harness::clusters::TestClusters;
use crate::harness::syncing::Syncing;

/// The namespace the exported Services live in, in every member.
pub const NS: &str = "sync-s";
/// How long exports may take to converge before a bench fails.
pub const CONVERGE_TIMEOUT: Duration = Duration::from_secs(300);

/// `n` Services with a slice each, spread over the clusters, in namespace
/// `sync-s` of every member (created before the clock starts).
pub fn prepare(rt: &tokio::runtime::Runtime, clients: &[kube::Client], n: usize) -> Result<()> {
    let c_n = clients.len();
    let ns = NS;
    for c in clients {
        let api: Api<Namespace> = Api::all(c.clone());
        let body = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
        rt.block_on(timed_call(api.patch(ns, &PatchParams::apply("bench"), &Patch::Apply(&body))))?;
    }
    let services = ApiResource::erase::<k8s_openapi::api::core::v1::Service>(&());
    let slices = slice_resource();
    for (c, client) in clients.iter().enumerate() {
        let mine: Vec<usize> = (0..n).filter(|i| i % c_n == c).collect();
        let svc: Vec<(String, Value)> =
            mine.iter().map(|i| (ns.into(), service(ns, &format!("s-{i}")))).collect();
        let sl: Vec<(String, Value)> =
            mine.iter().map(|i| (ns.into(), own_slice(ns, &format!("s-{i}"), c, *i))).collect();
        rt.block_on(create_all(client, &services, svc, "services"))?;
        rt.block_on(create_all(client, &slices, sl, "slices"))?;
    }
    Ok(())
}

/// The `n` services' exports, each cluster's created at once from a thread
/// of its own; returns when the first create began and how long all took.
pub fn export_all(clients: &[kube::Client], n: usize) -> Result<(Instant, Duration)> {
    let c_n = clients.len();
    let ns = NS;
    let exports = mcs_resource("v1alpha1", "ServiceExport", "serviceexports");
    let started = Instant::now();
    std::thread::scope(|scope| -> Result<()> {
        let handles: Vec<_> = (0..c_n)
            .map(|c| {
                let client = clients[c].clone();
                let exports = exports.clone();
                let objects: Vec<(String, Value)> = (0..n)
                    .filter(|i| i % c_n == c)
                    .map(|i| (ns.into(), export(ns, &format!("s-{i}"))))
                    .collect();
                scope.spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
                    rt.block_on(create_all(&client, &exports, objects, "exports"))
                })
            })
            .collect();
        for h in handles {
            h.join().map_err(|_| anyhow!("export creator panicked"))??;
        }
        Ok(())
    })?;
    Ok((started, started.elapsed()))
}

/// Waits until every member holds `n` imports with a VIP; the time since
/// `started`.
pub fn converge(
    rt: &tokio::runtime::Runtime,
    clients: &[kube::Client],
    n: usize,
    started: Instant,
) -> Result<Duration> {
    let imports = import_resource();
    loop {
        let mut done = true;
        for c in clients {
            let api: Api<DynamicObject> = Api::namespaced_with(c.clone(), NS, &imports);
            let list = rt.block_on(timed_call(api.list(&ListParams::default())))?;
            let with_vip = list.items.iter().filter(|o| o.data.pointer("/spec/ips/0").is_some()).count();
            done &= with_vip == n;
        }
        if done {
            return Ok(started.elapsed());
        }
        if started.elapsed() > CONVERGE_TIMEOUT {
            bail!("{n} exports not converged within {} s", CONVERGE_TIMEOUT.as_secs());
        }
        // Listing every member's imports is work for the API servers too:
        // not too often.
        std::thread::sleep(Duration::from_secs(1));
    }
}

pub fn service(ns: &str, name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": ns},
           "spec": {"ports": [{"name": "http", "protocol": "TCP", "port": 80}]}})
}

/// The Service's own EndpointSlice in cluster `c`: one endpoint.
pub fn own_slice(ns: &str, name: &str, c: usize, i: usize) -> Value {
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
           "metadata": {"name": format!("{name}-own"), "namespace": ns,
                        "labels": {"kubernetes.io/service-name": name}},
           "addressType": "IPv4", "ports": [{"name": "http", "protocol": "TCP", "port": 8080}],
           "endpoints": [{"addresses": [Ipv4Addr::new(10, 100 + c as u8, (i >> 8) as u8, (i & 255) as u8).to_string()]}]})
}

pub fn export(ns: &str, name: &str) -> Value {
    json!({"apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ServiceExport",
           "metadata": {"name": name, "namespace": ns}})
}

/// Write requests the API server behind `client` has served so far, by its
/// own `apiserver_request_total` (POST, PUT, PATCH, DELETE, DELETECOLLECTION
/// and APPLY): all of them, and those on Leases (heartbeats and elections).
pub async fn writes_served(client: &kube::Client) -> Result<(f64, f64)> {
    let request = http::Request::get("/metrics").body(Vec::new())?;
    let text = timed_call(client.request_text(request)).await?;
    let (mut all, mut leases) = (0.0, 0.0);
    for line in text.lines().filter(|l| l.starts_with("apiserver_request_total{")) {
        let write = ["POST", "PUT", "PATCH", "DELETE", "DELETECOLLECTION", "APPLY"]
            .iter()
            .any(|v| line.contains(&format!("verb=\"{v}\"")));
        let Some(n) = line.rsplit(' ').next().and_then(|n| n.parse::<f64>().ok()) else {
            continue;
        };
        if write {
            all += n;
            if line.contains("resource=\"leases\"") {
                leases += n;
            }
        }
    }
    if all == 0.0 {
        return Err(anyhow!("no write in the API server's apiserver_request_total: not its /metrics?"));
    }
    Ok((all, leases))
}

/// Hub mode on `clusters`: cluster 0 is the hub, each of clusters `1..`
/// is enrolled with the real `hub enrol` (its hub kubeconfig written into
/// `dir`) and runs an agent (tied to this process, without leader
/// election) on its own cluster's agent identity, with `extra` arguments.
/// Call from the main thread.
pub fn hub_agents(clusters: &TestClusters, dir: &Path, extra: &[&str]) -> Result<Vec<Syncing>> {
    (1..clusters.len())
        .map(|i| {
            let hub = enrol(clusters, i, dir.join(format!("{}.hub.kubeconfig", clusters.name(i))))?;
            let own = clusters.role_kubeconfig(i, "agent").display().to_string();
            let (id, hub) = (format!("agent-{}", clusters.name(i)), hub.display().to_string());
            let mut args = vec![
                "--member",
                clusters.name(i),
                "--kubeconfig",
                &own,
                "--hub-kubeconfig",
                &hub,
                "--identity",
                &id,
                "--no-leader-election",
            ];
            args.extend_from_slice(extra);
            let agent = Syncing::agent_tied(&args);
            agent.http();
            Ok(agent)
        })
        .collect()
}

/// Enrols member `i` with the real command; its hub kubeconfig.
fn enrol(clusters: &TestClusters, i: usize, out: PathBuf) -> Result<PathBuf> {
    let done = Command::new(BIN)
        .args(["hub", "enrol", clusters.name(i), "--hub-kubeconfig"])
        .arg(clusters.kubeconfig(0))
        .arg("--out")
        .arg(&out)
        .output()?;
    if !done.status.success() {
        bail!("hub enrol {}: {}", clusters.name(i), String::from_utf8_lossy(&done.stderr));
    }
    Ok(out)
}
