//! The one-shot commands' configuration: `setup-dns` (and its watch) and
//! `doctor`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use hickory_proto::rr::Name;

use crate::cli::{DoctorArgs, SetupDnsArgs};
use crate::diagnose::report::Format;
use crate::fleet::member::MemberConfig;
use crate::k8s::client::Connection;
use crate::model::{DnsLabel, ServiceKey};

use super::*;

/// Everything `setup-dns` needs.
#[derive(Debug, Clone)]
pub struct SetupDnsConfig {
    /// The cluster.
    pub connection: Connection,
    /// clusterset-dns's address; `None`: the ClusterIP of Service
    /// clusterset-dns/clusterset-dns, port 53.
    pub server: Option<SocketAddr>,
    /// The zone forwarded (no final dot).
    pub zone: String,
    /// Show, do not write.
    pub dry_run: bool,
    /// Take the change out.
    pub remove: bool,
    /// Where to prove it: `None` with `verify` true is kube-dns's ClusterIP.
    pub verify_at: Option<SocketAddr>,
    /// Prove it at all.
    pub verify: bool,
    /// How long to keep asking.
    pub verify_timeout: Duration,
    /// `--watch`: keep the wiring, checking it every `interval`.
    pub watch: Option<WatchConfig>,
}

/// `setup-dns --watch`.
#[derive(Debug, Clone)]
pub struct WatchConfig {
    /// Write again, or only report.
    pub mode: crate::cluster_dns::repair::Mode,
    /// Between checks.
    pub interval: Duration,
    /// /health, /ready, /metrics.
    pub http_listen: SocketAddr,
}

impl SetupDnsConfig {
    /// Validates command-line values.
    pub fn from_args(a: &SetupDnsArgs) -> Result<Self, ConfigError> {
        let connection = if a.in_cluster {
            Connection::InCluster
        } else {
            let path = a
                .kubeconfig
                .clone()
                .or_else(|| std::env::var_os("KUBECONFIG").map(PathBuf::from))
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".kube/config")))
                .ok_or_else(|| bad("--kubeconfig", "no kubeconfig given, no $KUBECONFIG and no $HOME"))?;
            Connection::Kubeconfig { path, context: a.kube_context.clone() }
        };
        let watch = match a.watch {
            None => None,
            Some(mode) => {
                if a.dry_run || a.remove {
                    return Err(bad("--watch", "keeps the wiring: not with --dry-run or --remove"));
                }
                Some(WatchConfig {
                    mode,
                    interval: Duration::from_secs(a.interval),
                    http_listen: a.http_listen,
                })
            }
        };
        Ok(Self {
            watch,
            connection,
            server: a.server,
            zone: a.zone.to_string().trim_end_matches('.').to_owned(),
            dry_run: a.dry_run,
            remove: a.remove,
            verify_at: a.verify,
            verify: !a.no_verify && !a.dry_run,
            verify_timeout: Duration::from_secs_f64(a.verify_timeout),
        })
    }
}

/// Everything `doctor` needs.
#[derive(Debug, Clone)]
pub struct DoctorConfig {
    /// The service diagnosed.
    pub key: ServiceKey,
    /// The zone it is served in (lower case, fully qualified).
    pub zone: Name,
    /// The members read.
    pub members: Vec<MemberConfig>,
    /// The DNS server asked per member: (member name, address).
    pub dns: Vec<(String, SocketAddr)>,
    /// How long one member's reads, or one DNS query, may take.
    pub timeout: Duration,
    /// Text or JSON.
    pub format: Format,
}

impl DoctorConfig {
    /// Validates command-line values.
    pub fn from_args(a: &DoctorArgs) -> Result<Self, ConfigError> {
        let zone = a.zone.clone();
        let key = service_name(&a.name, &zone).map_err(|problem| bad("NAME", problem))?;
        let members = members(&a.members)?;
        if members.is_empty() {
            return Err(bad("--cluster", "doctor needs the members to read (--cluster or --members)"));
        }
        // clap split each --dns into a name and an address; which names
        // are members is known only now.
        let mut dns: Vec<(String, SocketAddr)> = Vec::new();
        for (member, addr) in &a.dns {
            if !members.iter().any(|m| &m.name == member) {
                return Err(bad("--dns", format!("{member:?} is not one of the members given")));
            }
            if dns.iter().any(|(m, _)| m == member) {
                return Err(bad("--dns", format!("member {member:?} is given twice")));
            }
            dns.push((member.clone(), *addr));
        }
        Ok(Self { key, zone, members, dns, timeout: Duration::from_secs_f64(a.timeout), format: a.output })
    }
}

/// `NAME.NAMESPACE` or `NAME.NAMESPACE.svc.ZONE` (any letter case, with or
/// without the final dot) → the service.
pub(super) fn service_name(text: &str, zone: &Name) -> Result<ServiceKey, String> {
    let lower = text.trim_end_matches('.').to_ascii_lowercase();
    let zone_text = zone.to_string();
    let suffix = format!(".svc.{}", zone_text.trim_end_matches('.'));
    let short = lower.strip_suffix(&suffix).unwrap_or(&lower);
    let wanted =
        || format!("{text:?} is not NAME.NAMESPACE or NAME.NAMESPACE.svc.{zone_text} (e.g. web.shop)");
    let (name, namespace) = short.split_once('.').ok_or_else(wanted)?;
    if namespace.contains('.') {
        return Err(wanted());
    }
    let label = |what: &str, v: &str| {
        DnsLabel::parse(v).map_err(|e| format!("{text:?}: {what} {}", not_a_label(v, &e)))
    };
    Ok(ServiceKey { name: label("service name", name)?, namespace: label("namespace", namespace)? })
}
