//! `serve`'s configuration: DNS, the sources, answers, health, the wire.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::cli::{ClientCluster, MemoryLimit, ServeArgs};
use crate::fault::Faults;
use crate::fleet::member::MemberConfig;
use crate::health::probe::ProbeConfig;
use crate::k8s::client::Connection;
use crate::k8s::protobuf::Encoding;
use crate::k8s::watch::Lists;
use crate::model::{ClusterId, DnsLabel, Interop};
use crate::ops::memory::{LimitSource, MemoryBudget, OnMemoryLimit};
use crate::source::kube::KubeSource;
use crate::store::{AnswerConfig, ClientNet, Identity, ZoneConfig};
use crate::wire::cookie::CookieSecret;
use crate::wire::rrl::{RateLimiter, RrlConfig};
use crate::wire::tcp::TcpConfig;
use crate::wire::{DebugAnswers, WireConfig};

use super::*;

/// Everything `serve` needs.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Objects files and directories; empty means the embedded example.
    pub objects: Vec<PathBuf>,
    /// The Kubernetes API server to watch, if any.
    pub kube: Option<KubeSource>,
    /// Member clusters watched directly (centralized mode).
    pub members: Vec<MemberConfig>,
    /// The hub whose ExportRecords give the fleet (centralized mode from a
    /// hub, `--hub-kubeconfig`); never with `members`.
    pub hub: Option<Connection>,
    /// How watches list (`--list-mode`, `--list-page-size`): the kube
    /// source's, and the members' (each its own after a refusal).
    pub lists: Lists,
    /// Addresses to answer on.
    pub listen: Vec<SocketAddr>,
    /// Address of the HTTP endpoints.
    pub http_listen: SocketAddr,
    /// How long to keep answering after SIGTERM while /ready fails.
    pub lameduck: Duration,
    /// The zone.
    pub zone: ZoneConfig,
    /// This server's cluster, when set.
    pub cluster_id: Option<ClusterId>,
    /// UDP worker threads per listen address.
    pub udp_workers: usize,
    /// Wire settings.
    pub wire: WireConfig,
    /// TCP settings.
    pub tcp: TcpConfig,
    /// How long a member may fail to answer before its endpoints are demoted.
    pub cluster_dead_after: Duration,
    /// Active probes of endpoints, when `--probe` is given.
    pub probe: Option<ProbeConfig>,
    /// The memory limit kept to (`--memory-limit`), if any.
    pub memory: Option<MemoryBudget>,
    /// What to do when an update would not fit it (`--on-memory-limit`).
    pub on_memory_limit: OnMemoryLimit,
    /// Which fleet managers' shapes are read (`--interop`).
    pub interop: Interop,
    /// The per-service families on `/metrics` too (`--metrics-per-service`).
    pub metrics_per_service: bool,
}

impl ServeConfig {
    /// Validates command-line values.
    pub fn from_args(a: &ServeArgs) -> Result<Self, ConfigError> {
        // Each path numbers its files' sources (`SourceId::File`) by its
        // position, in 16 bits.
        if a.objects.len() > usize::from(u16::MAX) {
            return Err(bad("--objects", format!("given {} times, at most {}", a.objects.len(), u16::MAX)));
        }
        if a.listen.is_empty() {
            return Err(bad("--listen", "at least one address is needed"));
        }
        let cluster_id = a
            .cluster_id
            .as_deref()
            .map(|id| ClusterId::parse(id).map_err(|e| bad("--cluster-id", not_a_label(id, &e))))
            .transpose()?;
        // clap holds --udp-workers to at least 1.
        let udp_workers = a
            .udp_workers
            .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
        let wire = wire_config(a)?;
        let lists = Lists::new(a.list_mode, std::num::NonZeroU32::new(a.list_page_size));
        let (members, hub) = fleet_source(a)?;
        Ok(Self {
            interop: a.interop,
            objects: a.objects.clone(),
            kube: kube_source(a, &lists)?,
            members,
            hub,
            lists,
            listen: a.listen.clone(),
            http_listen: a.http_listen,
            lameduck: Duration::from_secs(a.lameduck),
            zone: zone_config(a, cluster_id.clone())?,
            cluster_id,
            udp_workers,
            wire,
            tcp: TcpConfig {
                idle_timeout: Duration::from_secs(a.tcp_idle_timeout),
                io_timeout: Duration::from_secs_f64(a.tcp_io_timeout),
                max_connections: a.tcp_max_connections,
                max_per_client: a.tcp_max_per_client,
            },
            cluster_dead_after: Duration::from_secs(a.cluster_dead_after),
            probe: probe_config(a),
            memory: match a.memory_limit {
                MemoryLimit::Auto => crate::ops::memory::cgroup_limit(),
                MemoryLimit::None => None,
                MemoryLimit::Bytes(limit) => Some(MemoryBudget { limit, source: LimitSource::Flag }),
            },
            on_memory_limit: a.on_memory_limit,
            metrics_per_service: a.metrics_per_service,
        })
    }
}

/// The zone, its names' TTLs, answers and identity. clap read both zones
/// (`cli::parse::zone`): names, lower case, not the root; how they sit to
/// each other is judged here.
fn zone_config(a: &ServeArgs, cluster_id: Option<ClusterId>) -> Result<ZoneConfig, ConfigError> {
    let origin = a.zone.clone();
    let also = match &a.also_zone {
        Some(also) if also.zone_of(&origin) || origin.zone_of(also) => {
            return Err(bad(
                "--also-zone",
                format!("{also} must be a zone apart from --zone {origin} (not above or below it)"),
            ));
        }
        also => also.clone(),
    };
    Ok(ZoneConfig {
        origin,
        ttl: a.ttl,
        negative_ttl: a.negative_ttl.unwrap_or(a.ttl),
        advertise: a.advertise_address.clone(),
        answers: answer_config(a, cluster_id),
        identity: identity(a)?,
        also,
    })
}

/// The cluster whose ServiceImports are watched (`--kubeconfig`,
/// `--in-cluster`), in `--namespace`s.
fn kube_source(a: &ServeArgs, lists: &Lists) -> Result<Option<KubeSource>, ConfigError> {
    let connection = match (&a.kubeconfig, a.in_cluster) {
        (Some(path), _) => {
            Some(Connection::Kubeconfig { path: path.clone(), context: a.kube_context.clone() })
        }
        (None, true) => Some(Connection::InCluster),
        (None, false) => None,
    };
    if connection.is_none() && !a.namespaces.is_empty() {
        return Err(bad("--namespace", "needs --kubeconfig or --in-cluster"));
    }
    for ns in &a.namespaces {
        DnsLabel::parse(ns).map_err(|e| bad("--namespace", not_a_label(ns, &e)))?;
    }
    Ok(connection.map(|connection| KubeSource {
        connection,
        namespaces: a.namespaces.clone(),
        interop: a.interop,
        lists: lists.clone(),
        encoding: Encoding::new(a.kube_encoding),
    }))
}

/// Centralized mode's fleet: the members watched one by one (`--cluster`,
/// `--members`) or the hub they publish on (`--hub-kubeconfig`), not both:
/// a member would be read twice, once by each path, under ids that need
/// not agree.
fn fleet_source(a: &ServeArgs) -> Result<(Vec<MemberConfig>, Option<Connection>), ConfigError> {
    let members = members(&a.members)?;
    let Some(path) = &a.hub_kubeconfig else { return Ok((members, None)) };
    if !members.is_empty() {
        return Err(bad(
            "--hub-kubeconfig",
            "reads the fleet from the hub's records: give it or the members (--cluster, --members), not both",
        ));
    }
    Ok((members, Some(Connection::Kubeconfig { path: path.clone(), context: None })))
}

/// Who the server says it is: `--server-id`, else `$HOSTNAME` (a Pod's
/// name), else the kernel's host name.
pub(super) fn identity(a: &ServeArgs) -> Result<Identity, ConfigError> {
    let server_id = a
        .server_id
        .clone()
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()))
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok().map(|h| h.trim().to_owned()))
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "clusterset-dns".into());
    if server_id.len() > 255 || server_id.chars().any(char::is_control) {
        return Err(bad("--server-id", format!("{server_id:?}: at most 255 bytes, no control characters")));
    }
    Ok(Identity { server_id, version: (!a.hide_version).then(crate::store::version) })
}

/// The wire layer's settings: UDP size, cookies, rate limiting, and (debug
/// builds) the fault points armed by `CLUSTERSET_DNS_FAULT`.
pub(super) fn wire_config(a: &ServeArgs) -> Result<WireConfig, ConfigError> {
    let cookies = match (a.cookies, &a.cookie_secret) {
        (false, _) => None,
        (true, Some(hex)) => Some(CookieSecret::from_hex(hex).map_err(|e| bad("--cookie-secret", e))?),
        (true, None) => Some(CookieSecret::random().map_err(|e| bad("--cookies", e))?),
    };
    let exempt = a.rrl_exempt.clone();
    if a.rrl_rate == 0 && (a.rrl_errors_rate.is_some() || !exempt.is_empty()) {
        return Err(bad("--rrl-rate", "rate limiting options were given but --rrl-rate is 0 (off)"));
    }
    let rrl = (a.rrl_rate > 0).then(|| {
        Arc::new(RateLimiter::new(RrlConfig {
            rate: a.rrl_rate,
            errors_rate: a.rrl_errors_rate.unwrap_or(a.rrl_rate),
            slip: a.rrl_slip,
            ipv4_prefix: a.rrl_ipv4_prefix,
            ipv6_prefix: a.rrl_ipv6_prefix,
            exempt,
            table_size: a.rrl_table_size,
        }))
    });
    let faults = Faults::from_env().map_err(|e| bad("CLUSTERSET_DNS_FAULT", e))?;
    let debug = Some(Arc::new(DebugAnswers {
        allow: a.allow_debug.clone(),
        explain: Arc::new(crate::ops::explain::Report),
    }));
    let allow_transfer = a.allow_transfer.clone();
    let trust_ecs = a.trust_ecs_from.clone();
    Ok(WireConfig {
        max_udp_payload: a.max_udp_payload,
        cookies,
        rrl,
        faults,
        debug,
        allow_transfer,
        trust_ecs,
    })
}

/// The `--probe-…` flags (clap checks them even without `--probe`: a typo
/// there should not wait until probes are turned on to be found).
pub(super) fn probe_config(a: &ServeArgs) -> Option<ProbeConfig> {
    a.probe.then(|| ProbeConfig {
        interval: Duration::from_secs_f64(a.probe_interval),
        recheck: Duration::from_secs_f64(a.probe_recheck),
        timeout: Duration::from_secs_f64(a.probe_timeout),
        fall: a.probe_fall,
        rise: a.probe_rise,
        concurrency: a.probe_concurrency,
        rate: a.probe_rate,
    })
}

/// The answer settings; clap parsed and checked every one.
pub(super) fn answer_config(a: &ServeArgs, default_cluster: Option<ClusterId>) -> AnswerConfig {
    AnswerConfig {
        policy: a.answer_policy,
        max_answers: a.max_answers,
        local_min_healthy: a.local_min_healthy,
        fail_open: a.fail_open,
        endpoint_answers: a.endpoint_answers,
        fallback_boundary: a.fallback_boundary,
        clients: a.client_clusters.iter().cloned().map(ClientNet::from).collect(),
        regions: a.cluster_regions.clone(),
        default_cluster,
    }
}

impl From<ClientCluster> for ClientNet {
    fn from(c: ClientCluster) -> Self {
        Self { net: c.net, cluster: c.cluster, zone: c.zone }
    }
}
