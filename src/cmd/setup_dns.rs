//! `clusterset-dns setup-dns`: reads the cluster's DNS configuration,
//! plans the change (`cluster_dns::plan`), prints it as a diff, writes it
//! unless `--dry-run`, and proves it by resolving `dns-version.<zone>`
//! through the cluster's DNS (`cluster_dns::verify`). With `--watch` it
//! keeps doing so (`wiring`).

mod wiring;

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};

use hickory_proto::rr::Name;

use crate::cluster_dns::verify::{self, Outcome};
use crate::cluster_dns::{kube, plan};
use crate::config::SetupDnsConfig;
use crate::k8s::client;

/// Proven (or a dry run).
pub const DONE: u8 = 0;
/// Written, or already in place, but not proven.
pub const UNPROVEN: u8 = 1;
/// Nothing changed: the layout is not recognised, needs a person, or the
/// API refused.
pub const UNCHANGED: u8 = 2;

/// Runs the command: the report (stdout) and the exit status.
pub async fn run(cfg: SetupDnsConfig) -> (String, u8) {
    let mut out = String::new();
    match steps(&cfg, &mut out).await {
        Ok(status) => (out, status),
        Err(e) => {
            let _ = writeln!(out, "error: {e}");
            (out, UNCHANGED)
        }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// clusterset-dns's address: `--server`, else its Service's ClusterIP.
async fn server(cfg: &SetupDnsConfig, client: &::kube::Client) -> Result<SocketAddr, BoxError> {
    match cfg.server {
        Some(s) => Ok(s),
        None => {
            let ip = kube::cluster_ip(client, "clusterset-dns", "clusterset-dns").await?.ok_or(
                "no --server given and Service clusterset-dns/clusterset-dns has no ClusterIP: install clusterset-dns first, or pass --server",
            )?;
            Ok(SocketAddr::new(ip.parse::<IpAddr>()?, 53))
        }
    }
}

/// What to write: the zone forwarded to `server`.
fn want(cfg: &SetupDnsConfig, server: SocketAddr) -> plan::Want {
    // As `forward` takes it: the port only when it is not 53.
    let upstream = if server.port() == 53 { server.ip().to_string() } else { server.to_string() };
    plan::Want { zone: cfg.zone.clone(), upstream, remove: cfg.remove }
}

/// Where the proof asks: `--verify`, else the ClusterIP of kube-dns.
async fn verify_at(cfg: &SetupDnsConfig, client: &::kube::Client) -> Result<SocketAddr, BoxError> {
    match cfg.verify_at {
        Some(a) => Ok(a),
        None => {
            let ip = kube::cluster_ip(client, "kube-system", "kube-dns")
                .await?
                .ok_or("no --verify given and Service kube-system/kube-dns has no ClusterIP")?;
            Ok(SocketAddr::new(ip.parse::<IpAddr>()?, 53))
        }
    }
}

async fn steps(cfg: &SetupDnsConfig, out: &mut String) -> Result<u8, BoxError> {
    let client = client::connect(&cfg.connection, "setup-dns").await?;
    let server = server(cfg, &client).await?;
    if let Some(w) = &cfg.watch {
        wiring::run(cfg, w, client, server).await?;
        return Ok(DONE);
    }
    let read = kube::read(&client).await?;
    let want = want(cfg, server);
    let plan = match plan::plan(&read.observed, &want) {
        Ok(p) => p,
        Err(e) => {
            let _ = writeln!(out, "{e}");
            return Ok(UNCHANGED);
        }
    };
    let _ = writeln!(out, "DNS layout: {}", plan.layout);
    if let Some(why) = plan::nodelocal_unwired(read.nodelocal_daemonset, &read.observed, &want) {
        let _ = writeln!(out, "warning: {why}");
    }
    if let Some(manual) = &plan.manual {
        let _ = writeln!(out, "nothing was changed. {manual}");
        return Ok(UNCHANGED);
    }
    if plan.changes.is_empty() {
        let _ = writeln!(
            out,
            "no change: {} already {}",
            cfg.zone,
            if cfg.remove { "absent" } else { "forwarded to clusterset-dns" }
        );
    }
    for change in &plan.changes {
        out.push_str(&change.diff);
    }
    if cfg.dry_run {
        let _ = writeln!(out, "dry run: nothing was written");
        return Ok(DONE);
    }
    for change in &plan.changes {
        kube::write(&client, &read, &change.edit).await?;
    }
    if !plan.changes.is_empty() {
        let _ = writeln!(out, "written: {} change(s)", plan.changes.len());
    }
    if !cfg.verify || cfg.remove {
        return Ok(DONE);
    }
    let at = verify_at(cfg, &client).await?;
    let name = Name::from_ascii(format!("dns-version.{}.", cfg.zone))?;
    let (outcome, took) = verify::until_answered(at, &name, cfg.verify_timeout).await;
    match outcome {
        Outcome::Answered(text) => {
            let _ = writeln!(
                out,
                "proven: {name} TXT \"{text}\" through the cluster DNS at {at}, after {:.1} s",
                took.as_secs_f64()
            );
            Ok(DONE)
        }
        Outcome::Code(code) => {
            let _ = writeln!(
                out,
                "not proven: the cluster DNS at {at} answers {name} with {code} after {:.0} s, so it does not forward {zone} yet. CoreDNS reloads an edited ConfigMap within about two minutes when its Corefile has `reload`; otherwise restart it (kubectl -n kube-system rollout restart deployment coredns). clusterset-dns itself, asked directly at {server}: {direct:?}",
                took.as_secs_f64(),
                zone = cfg.zone,
                direct = verify::ask(server, &name, std::time::Duration::from_secs(2)).await,
            );
            Ok(UNPROVEN)
        }
        Outcome::Silent(e) => {
            let _ = writeln!(
                out,
                "not proven: the cluster DNS at {at} did not answer ({e}). Its ClusterIP is reachable only from inside the cluster: run setup-dns in a Pod, or pass --verify with an address that reaches it."
            );
            Ok(UNPROVEN)
        }
    }
}
