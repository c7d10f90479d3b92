//! Validated configuration. Every check names the flag it concerns, and runs
//! once at start: a bad value stops the server before it answers anything.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::rr::Name;

use crate::cli::{
    DoctorArgs, MembersArgs, ProfilesArgs, RunArgs, ServeArgs, SetupDnsArgs, SyncArgs, SyncOptions,
};
use crate::cluster_dns::watch::Mode;
use crate::controller::sync::{MemberLost, SyncBehaviour};
use crate::diagnose::report::Format;
use crate::fault::Faults;
use crate::fleet::inventory::InventoryConfig;
use crate::fleet::member::MemberConfig;
use crate::health::probe::ProbeConfig;
use crate::k8s::client::Connection;
use crate::k8s::inventory::Providers;
use crate::k8s::throttle::Limits;
use crate::k8s::watch::{ListMode, Lists};
use crate::model::{ClusterId, DnsLabel, Interop, PolicyKind, ServiceKey};
use crate::ops::memory::MemoryBudget;
use crate::source::kube::KubeSource;
use crate::store::{AnswerConfig, ClientNet, Identity, ZoneConfig};
use crate::wire::cookie::CookieSecret;
use crate::wire::rrl::{Cidr, RateLimiter, RrlConfig};
use crate::wire::tcp::TcpConfig;
use crate::wire::{DebugAnswers, WireConfig};

/// A configuration value that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("{flag}: {problem}")]
pub struct ConfigError {
    /// The flag, e.g. `--zone`.
    pub flag: &'static str,
    /// What is wrong.
    pub problem: String,
}

fn bad(flag: &'static str, problem: impl Into<String>) -> ConfigError {
    ConfigError { flag, problem: problem.into() }
}

/// RFC 2181 §8: TTLs are at most 2^31 - 1.
const MAX_TTL: u32 = i32::MAX as u32;

/// Everything `serve` needs.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Objects files and directories; empty means the embedded example.
    pub objects: Vec<PathBuf>,
    /// The Kubernetes API server to watch, if any.
    pub kube: Option<KubeSource>,
    /// Member clusters watched directly (centralized mode).
    pub members: Vec<MemberConfig>,
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
    pub on_memory_limit: crate::ops::memory::OnMemoryLimit,
    /// Which fleet managers' shapes are read (`--interop`).
    pub interop: Interop,
}

impl ServeConfig {
    /// Validates command-line values.
    pub fn from_args(a: &ServeArgs) -> Result<Self, ConfigError> {
        let mut origin = Name::from_ascii(&a.zone)
            .map_err(|e| bad("--zone", format!("{:?} is not a domain name: {e}", a.zone)))?;
        origin.set_fqdn(true);
        if origin.is_root() {
            return Err(bad("--zone", "the root zone cannot be served"));
        }
        // Room for the longest fixed name below the apex (`hostmaster.`).
        if origin.len() > 240 {
            return Err(bad("--zone", "longer than 240 characters"));
        }
        let also = match &a.also_zone {
            None => None,
            Some(z) => {
                let mut also = Name::from_ascii(z)
                    .map_err(|e| bad("--also-zone", format!("{z:?} is not a domain name: {e}")))?
                    .to_lowercase();
                also.set_fqdn(true);
                let origin = origin.to_lowercase();
                if also.is_root() || also.zone_of(&origin) || origin.zone_of(&also) {
                    return Err(bad(
                        "--also-zone",
                        format!(
                            "{also} must be a zone apart from --zone {origin} (not the root, not above or below it)"
                        ),
                    ));
                }
                Some(also)
            }
        };
        for (flag, ttl) in [("--ttl", a.ttl), ("--negative-ttl", a.negative_ttl.unwrap_or(a.ttl))] {
            if ttl > MAX_TTL {
                return Err(bad(flag, format!("{ttl} is above the largest TTL, {MAX_TTL}")));
            }
        }
        if !(512..=4096).contains(&a.max_udp_payload) {
            return Err(bad("--max-udp-payload", format!("{} is outside 512-4096", a.max_udp_payload)));
        }
        if a.listen.is_empty() {
            return Err(bad("--listen", "at least one address is needed"));
        }
        let cluster_id =
            a.cluster_id.as_deref().map(ClusterId::parse).transpose().map_err(|e| {
                bad("--cluster-id", format!("{:?} {e}", a.cluster_id.as_deref().unwrap_or("")))
            })?;
        let udp_workers = match a.udp_workers {
            Some(0) => return Err(bad("--udp-workers", "must be at least 1")),
            Some(n) => n,
            None => std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        };
        if a.tcp_max_connections == 0 {
            return Err(bad("--tcp-max-connections", "must be at least 1"));
        }
        if a.tcp_idle_timeout == 0 {
            return Err(bad("--tcp-idle-timeout", "must be at least 1 second"));
        }
        if a.tcp_max_per_client == 0 {
            return Err(bad("--tcp-max-per-client", "must be at least 1"));
        }
        if !(a.tcp_io_timeout.is_finite() && (0.05..=60.0).contains(&a.tcp_io_timeout)) {
            return Err(bad("--tcp-io-timeout", format!("{} is outside 0.05-60 seconds", a.tcp_io_timeout)));
        }
        let wire = wire_config(a)?;
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
            DnsLabel::parse(ns).map_err(|e| bad("--namespace", format!("{ns:?} {e}")))?;
        }
        let answers = answer_config(a, cluster_id.clone())?;
        if !(1..=3600).contains(&a.cluster_dead_after) {
            return Err(bad(
                "--cluster-dead-after",
                format!("{} is outside 1-3600 seconds", a.cluster_dead_after),
            ));
        }
        let probe = probe_config(a)?;
        let memory =
            crate::ops::memory::parse_limit(&a.memory_limit).map_err(|e| bad("--memory-limit", e))?;
        let interop = Interop::parse(&a.interop).map_err(|e| bad("--interop", e))?;
        let list_mode = ListMode::parse(&a.list_mode).map_err(|e| bad("--list-mode", e))?;
        let lists = Lists::new(list_mode, std::num::NonZeroU32::new(a.list_page_size));
        Ok(Self {
            interop,
            objects: a.objects.clone(),
            kube: connection.map(|connection| KubeSource {
                connection,
                namespaces: a.namespaces.clone(),
                interop,
                lists: lists.clone(),
            }),
            members: members(&a.members)?,
            lists,
            listen: a.listen.clone(),
            http_listen: a.http_listen,
            lameduck: Duration::from_secs(a.lameduck),
            zone: ZoneConfig {
                origin: origin.to_lowercase(),
                ttl: a.ttl,
                negative_ttl: a.negative_ttl.unwrap_or(a.ttl),
                advertise: a.advertise_address.clone(),
                answers,
                identity: identity(a)?,
                also,
            },
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
            probe,
            memory,
            on_memory_limit: match a.on_memory_limit {
                crate::cli::OnMemoryLimit::KeepServing => crate::ops::memory::OnMemoryLimit::KeepServing,
                crate::cli::OnMemoryLimit::Exit => crate::ops::memory::OnMemoryLimit::Exit,
            },
        })
    }
}

/// Who the server says it is: `--server-id`, else `$HOSTNAME` (a Pod's
/// name), else the kernel's host name.
fn identity(a: &ServeArgs) -> Result<Identity, ConfigError> {
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
fn wire_config(a: &ServeArgs) -> Result<WireConfig, ConfigError> {
    let cookies = match (a.cookies, &a.cookie_secret) {
        (false, _) => None,
        (true, Some(hex)) => Some(CookieSecret::from_hex(hex).map_err(|e| bad("--cookie-secret", e))?),
        (true, None) => Some(CookieSecret::random().map_err(|e| bad("--cookies", e))?),
    };
    if a.rrl_slip > 10 {
        return Err(bad("--rrl-slip", format!("{} is outside 0-10", a.rrl_slip)));
    }
    if a.rrl_ipv4_prefix > 32 {
        return Err(bad("--rrl-ipv4-prefix", format!("{} is outside 0-32", a.rrl_ipv4_prefix)));
    }
    if a.rrl_ipv6_prefix > 128 {
        return Err(bad("--rrl-ipv6-prefix", format!("{} is outside 0-128", a.rrl_ipv6_prefix)));
    }
    if !(1..=1 << 24).contains(&a.rrl_table_size) {
        return Err(bad("--rrl-table-size", format!("{} is outside 1-16777216", a.rrl_table_size)));
    }
    let exempt = cidrs("--rrl-exempt", &a.rrl_exempt)?;
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
    let allow = cidrs("--allow-debug", &a.allow_debug)?;
    let debug = Some(Arc::new(DebugAnswers { allow, explain: Arc::new(crate::ops::explain::Report) }));
    let allow_transfer = cidrs("--allow-transfer", &a.allow_transfer)?;
    Ok(WireConfig { max_udp_payload: a.max_udp_payload, cookies, rrl, faults, debug, allow_transfer })
}

/// The networks of a repeatable CIDR flag, or the flag and the bad value.
fn cidrs(flag: &'static str, values: &[String]) -> Result<Vec<Cidr>, ConfigError> {
    values.iter().map(|c| Cidr::parse(c).map_err(|e| bad(flag, format!("{c:?}: {e}")))).collect()
}

/// The `--probe-…` flags, checked even without `--probe` (a typo there
/// should not wait until probes are turned on to be found).
fn probe_config(a: &ServeArgs) -> Result<Option<ProbeConfig>, ConfigError> {
    let seconds = |flag: &'static str, v: f64| {
        if v.is_finite() && (0.01..=3600.0).contains(&v) {
            Ok(Duration::from_secs_f64(v))
        } else {
            Err(bad(flag, format!("{v} is outside 0.01-3600 seconds")))
        }
    };
    let interval = seconds("--probe-interval", a.probe_interval)?;
    let recheck = seconds("--probe-recheck", a.probe_recheck)?;
    let timeout = seconds("--probe-timeout", a.probe_timeout)?;
    for (flag, n) in
        [("--probe-fall", a.probe_fall), ("--probe-rise", a.probe_rise), ("--probe-rate", a.probe_rate)]
    {
        if n == 0 {
            return Err(bad(flag, "must be at least 1"));
        }
    }
    if a.probe_concurrency == 0 {
        return Err(bad("--probe-concurrency", "must be at least 1"));
    }
    Ok(a.probe.then_some(ProbeConfig {
        interval,
        recheck,
        timeout,
        fall: a.probe_fall,
        rise: a.probe_rise,
        concurrency: a.probe_concurrency,
        rate: a.probe_rate,
    }))
}

/// Everything `sync` needs.
#[derive(Debug, Clone)]
pub struct SyncConfig {
    /// The members.
    pub members: Vec<MemberConfig>,
    /// Members from the ClusterProfiles of a hub, beside `members`.
    pub profiles: Option<InventoryConfig>,
    /// Address of the HTTP endpoints.
    pub http_listen: SocketAddr,
    /// Leader election, unless disabled.
    pub lease: Option<LeaseConfig>,
    /// The controller's behaviour.
    pub behaviour: SyncBehaviour,
    /// The rate limit of each member's client; `None`: none.
    pub kube_limits: Option<Limits>,
    /// Test-only fault injection (armed in debug builds only).
    pub faults: Faults,
}

/// Where and how replicas elect the one that writes.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    /// The cluster holding the Lease.
    pub connection: Connection,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// This replica's identity.
    pub identity: String,
    /// Lease duration.
    pub duration: Duration,
    /// How many shards the services are split into (`--shards`).
    pub shards: u32,
}

impl SyncConfig {
    /// Validates command-line values.
    pub fn from_args(a: &SyncArgs) -> Result<Self, ConfigError> {
        let members = members(&a.members)?;
        let profiles = profiles(&a.profiles)?;
        if members.is_empty() && profiles.is_none() {
            return Err(bad(
                "--cluster",
                "sync needs at least one member (--cluster or --members) or --cluster-profiles",
            ));
        }
        let first = members.first().map(|m| &m.connection).or(profiles.as_ref().map(|p| &p.hub));
        Ok(Self {
            lease: lease(&a.options, first)?,
            profiles,
            behaviour: behaviour(&a.options, &a.namespaces)?,
            kube_limits: kube_limits(&a.options)?,
            members,
            http_listen: a.http_listen,
            faults: Faults::from_env().map_err(|e| bad("CLUSTERSET_DNS_FAULT", e))?,
        })
    }
}

/// Everything `run` needs: DNS from this cluster, the controller over the members.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// DNS (never centralized: the members are the controller's).
    pub serve: ServeConfig,
    /// The controller.
    pub sync: SyncConfig,
}

impl RunConfig {
    /// Validates command-line values.
    pub fn from_args(a: &RunArgs) -> Result<Self, ConfigError> {
        let mut serve = ServeConfig::from_args(&a.serve)?;
        let members = std::mem::take(&mut serve.members);
        if members.is_empty() {
            return Err(bad("--cluster", "run needs the members to sync (--cluster or --members)"));
        }
        if serve.kube.is_none() {
            return Err(bad(
                "--kubeconfig",
                "run answers from this cluster's ServiceImports: give --kubeconfig or --in-cluster",
            ));
        }
        let sync = SyncConfig {
            lease: lease(&a.sync, members.first().map(|m| &m.connection))?,
            profiles: None,
            behaviour: behaviour(&a.sync, &a.serve.namespaces)?,
            kube_limits: kube_limits(&a.sync)?,
            members,
            http_listen: a.sync_http_listen,
            faults: serve.wire.faults.clone(),
        };
        Ok(Self { serve, sync })
    }
}

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
    pub mode: crate::cluster_dns::watch::Mode,
    /// Between checks.
    pub interval: Duration,
    /// /health, /ready, /metrics.
    pub http_listen: SocketAddr,
}

/// `IP` or `IP:PORT` (port 53 by default).
fn socket_addr(flag: &'static str, value: &str) -> Result<SocketAddr, ConfigError> {
    value
        .parse::<SocketAddr>()
        .or_else(|_| value.parse::<IpAddr>().map(|ip| SocketAddr::new(ip, 53)))
        .map_err(|_| bad(flag, format!("{value:?} is not IP or IP:PORT")))
}

impl SetupDnsConfig {
    /// Validates command-line values.
    pub fn from_args(a: &SetupDnsArgs) -> Result<Self, ConfigError> {
        let mut zone = Name::from_ascii(&a.zone)
            .map_err(|e| bad("--zone", format!("{:?} is not a domain name: {e}", a.zone)))?;
        zone.set_fqdn(true);
        if zone.is_root() {
            return Err(bad("--zone", "the root zone cannot be forwarded"));
        }
        let server = a.server.as_deref().map(|v| socket_addr("--server", v)).transpose()?;
        let verify_at = a.verify.as_deref().map(|v| socket_addr("--verify", v)).transpose()?;
        if !(a.verify_timeout.is_finite() && (1.0..=3600.0).contains(&a.verify_timeout)) {
            return Err(bad("--verify-timeout", format!("{} is outside 1-3600 seconds", a.verify_timeout)));
        }
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
        let watch = match a.watch.as_deref() {
            None => None,
            Some(mode) => {
                let mode = match mode {
                    "reapply" => Mode::Reapply,
                    "report" => Mode::Report,
                    other => return Err(bad("--watch", format!("{other:?} is not reapply or report"))),
                };
                if a.dry_run || a.remove {
                    return Err(bad("--watch", "keeps the wiring: not with --dry-run or --remove"));
                }
                if !(1..=86_400).contains(&a.interval) {
                    return Err(bad("--interval", format!("{} is outside 1-86400 seconds", a.interval)));
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
            server,
            zone: zone.to_lowercase().to_string().trim_end_matches('.').to_owned(),
            dry_run: a.dry_run,
            remove: a.remove,
            verify_at,
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
        let mut zone = Name::from_ascii(&a.zone)
            .map_err(|e| bad("--zone", format!("{:?} is not a domain name: {e}", a.zone)))?;
        zone.set_fqdn(true);
        if zone.is_root() {
            return Err(bad("--zone", "the root zone cannot be served"));
        }
        let zone = zone.to_lowercase();
        let key = service_name(&a.name, &zone).map_err(|problem| bad("NAME", problem))?;
        let members = members(&a.members)?;
        if members.is_empty() {
            return Err(bad("--cluster", "doctor needs the members to read (--cluster or --members)"));
        }
        let mut dns = Vec::new();
        for spec in &a.dns {
            let (member, addr) =
                spec.split_once('=').ok_or_else(|| bad("--dns", format!("{spec:?} is not CLUSTER=ADDR")))?;
            if !members.iter().any(|m| m.name == member) {
                return Err(bad("--dns", format!("{member:?} is not one of the members given")));
            }
            let addr = socket_addr("--dns", addr)?;
            if dns.iter().any(|(m, _)| m == member) {
                return Err(bad("--dns", format!("member {member:?} is given twice")));
            }
            dns.push((member.to_owned(), addr));
        }
        if !(a.timeout.is_finite() && (0.1..=300.0).contains(&a.timeout)) {
            return Err(bad("--timeout", format!("{} is outside 0.1-300 seconds", a.timeout)));
        }
        let format = match a.output.as_str() {
            "text" => Format::Text,
            "json" => Format::Json,
            other => return Err(bad("--output", format!("{other:?} is not text or json"))),
        };
        Ok(Self { key, zone, members, dns, timeout: Duration::from_secs_f64(a.timeout), format })
    }
}

/// `NAME.NAMESPACE` or `NAME.NAMESPACE.svc.ZONE` (any letter case, with or
/// without the final dot) → the service.
fn service_name(text: &str, zone: &Name) -> Result<ServiceKey, String> {
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
    let label = |what: &str, v: &str| DnsLabel::parse(v).map_err(|e| format!("{text:?}: {what} {v:?} {e}"));
    Ok(ServiceKey { name: label("service name", name)?, namespace: label("namespace", namespace)? })
}

/// The controller behaviour of `sync` options.
pub fn behaviour(o: &SyncOptions, namespaces: &[String]) -> Result<SyncBehaviour, ConfigError> {
    let on_member_lost = match o.on_member_lost.as_str() {
        "keep" => MemberLost::Keep,
        "remove" => MemberLost::Remove,
        other => return Err(bad("--on-member-lost", format!("{other:?} is not keep or remove"))),
    };
    if o.member_lost_after == 0 {
        return Err(bad("--member-lost-after", "must be at least 1 second"));
    }
    for p in &o.auto_export_namespace_prefixes {
        if p.is_empty() || !p.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-') {
            return Err(bad(
                "--auto-export-namespace-prefix",
                format!("{p:?} cannot start a namespace name"),
            ));
        }
    }
    for ns in namespaces {
        DnsLabel::parse(ns).map_err(|e| bad("--namespace", format!("{ns:?} {e}")))?;
    }
    Ok(SyncBehaviour {
        namespaces: namespaces.to_vec(),
        on_member_lost,
        lost_after: Duration::from_secs(o.member_lost_after),
        resync: Duration::from_secs(o.resync_interval),
        auto_export_prefixes: o.auto_export_namespace_prefixes.clone(),
    })
}

/// The members' client rate limit of `sync` options (`--kube-qps 0`: none).
pub fn kube_limits(o: &SyncOptions) -> Result<Option<Limits>, ConfigError> {
    if !(o.kube_qps.is_finite() && o.kube_qps >= 0.0) {
        return Err(bad("--kube-qps", format!("{} is not a rate (0 or more per second)", o.kube_qps)));
    }
    if o.kube_qps == 0.0 {
        return Ok(None);
    }
    if o.kube_burst == 0 {
        return Err(bad("--kube-burst", "must be at least 1 (or --kube-qps 0 for no limit)"));
    }
    Ok(Some(Limits { qps: o.kube_qps, burst: o.kube_burst }))
}

/// The leader-election settings of `sync` options.
/// `first`: where the Lease is without --lease-kubeconfig (the first
/// member, else the hub of the ClusterProfiles).
pub fn lease(o: &SyncOptions, first: Option<&Connection>) -> Result<Option<LeaseConfig>, ConfigError> {
    let most = crate::controller::shard::MAX_SHARDS;
    if !(1..=most).contains(&o.shards) {
        return Err(bad("--shards", format!("{} is outside 1-{most}", o.shards)));
    }
    if o.no_leader_election {
        if o.shards > 1 {
            return Err(bad(
                "--shards",
                "needs leader election (not --no-leader-election): shards are led on Leases",
            ));
        }
        return Ok(None);
    }
    DnsLabel::parse(&o.lease_namespace)
        .map_err(|e| bad("--lease-namespace", format!("{:?} {e}", o.lease_namespace)))?;
    ClusterId::parse(&o.lease_name).map_err(|e| bad("--lease-name", format!("{:?} {e}", o.lease_name)))?;
    if !(5..=3600).contains(&o.lease_duration) {
        return Err(bad("--lease-duration", format!("{} is outside 5-3600 seconds", o.lease_duration)));
    }
    let connection = match (&o.lease_kubeconfig, first) {
        (Some(path), _) => {
            if !path.is_file() {
                return Err(bad("--lease-kubeconfig", format!("{} is not a readable file", path.display())));
            }
            Connection::Kubeconfig { path: path.clone(), context: None }
        }
        (None, Some(first)) => first.clone(),
        (None, None) => return Err(bad("--lease-kubeconfig", "needed when there are no members")),
    };
    let identity = match &o.identity {
        Some(id) if id.is_empty() => return Err(bad("--identity", "is empty")),
        Some(id) => id.clone(),
        None => std::env::var("POD_NAME").ok().filter(|n| !n.is_empty()).unwrap_or_else(|| {
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
            format!("{}-{}", host.trim(), std::process::id())
        }),
    };
    Ok(Some(LeaseConfig {
        connection,
        namespace: o.lease_namespace.clone(),
        name: o.lease_name.clone(),
        identity,
        duration: Duration::from_secs(o.lease_duration),
        shards: o.shards,
    }))
}

/// The members of `--cluster` and `--members`, checked: names are cluster
/// ids, kubeconfig files exist, no name is given twice.
pub fn members(a: &MembersArgs) -> Result<Vec<MemberConfig>, ConfigError> {
    let mut members = Vec::new();
    for spec in &a.clusters {
        let (name, rest) = spec
            .split_once('=')
            .ok_or_else(|| bad("--cluster", format!("{spec:?} is not NAME=KUBECONFIG")))?;
        let (path, context) = match rest.split_once('#') {
            Some((p, c)) => (p, Some(c.to_owned())),
            None => (rest, None),
        };
        members.push(member("--cluster", name, path, context)?);
    }
    if let Some(file) = &a.members_file {
        let text = std::fs::read_to_string(file)
            .map_err(|e| bad("--members", format!("{}: {e}", file.display())))?;
        let parsed: MembersFile =
            serde_path_to_error::deserialize(serde_yaml_ng::Deserializer::from_str(&text))
                .map_err(|e| bad("--members", format!("{}: {}: {}", file.display(), e.path(), e.inner())))?;
        for m in parsed.members {
            members.push(member("--members", &m.name, &m.kubeconfig, m.context)?);
        }
    }
    for (i, m) in members.iter().enumerate() {
        if members[..i].iter().any(|o| o.name == m.name) {
            return Err(bad("--cluster", format!("member {:?} is given twice", m.name)));
        }
    }
    Ok(members)
}

/// `--cluster-profiles`: the namespace, the hub, the provider file (read
/// and checked now: a provider that cannot run a plugin fails the start).
fn profiles(a: &ProfilesArgs) -> Result<Option<InventoryConfig>, ConfigError> {
    let Some(namespace) = &a.cluster_profiles else { return Ok(None) };
    DnsLabel::parse(namespace).map_err(|e| bad("--cluster-profiles", format!("{namespace:?} {e}")))?;
    // clap requires it with --cluster-profiles.
    let Some(file) = &a.cluster_profile_providers else {
        return Err(bad("--cluster-profile-providers", "needed with --cluster-profiles"));
    };
    let text = std::fs::read_to_string(file)
        .map_err(|e| bad("--cluster-profile-providers", format!("{}: {e}", file.display())))?;
    let providers = Providers::parse(&text)
        .map_err(|e| bad("--cluster-profile-providers", format!("{}: {e}", file.display())))?;
    let hub = match &a.hub_kubeconfig {
        Some(path) if !path.is_file() => {
            return Err(bad("--hub-kubeconfig", format!("{} is not a readable file", path.display())));
        }
        Some(path) => Connection::Kubeconfig { path: path.clone(), context: None },
        None => Connection::InCluster,
    };
    Ok(Some(InventoryConfig { hub, namespace: namespace.clone(), providers }))
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct MembersFile {
    members: Vec<MemberEntry>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct MemberEntry {
    name: String,
    kubeconfig: String,
    #[serde(default)]
    context: Option<String>,
}

fn member(
    flag: &'static str,
    name: &str,
    path: &str,
    context: Option<String>,
) -> Result<MemberConfig, ConfigError> {
    ClusterId::parse(name).map_err(|e| bad(flag, format!("member name {name:?} {e}")))?;
    let path = PathBuf::from(path);
    if !path.is_file() {
        return Err(bad(flag, format!("{name}: kubeconfig {} is not a readable file", path.display())));
    }
    Ok(MemberConfig { name: name.to_owned(), connection: Connection::Kubeconfig { path, context } })
}

fn answer_config(a: &ServeArgs, default_cluster: Option<ClusterId>) -> Result<AnswerConfig, ConfigError> {
    let policy: PolicyKind = a.answer_policy.parse().map_err(|e: String| bad("--answer-policy", e))?;
    let clients = a.client_clusters.iter().map(|v| client_net(v)).collect::<Result<_, _>>()?;
    let regions = a
        .cluster_regions
        .iter()
        .map(|v| {
            let (cluster, region) = v
                .split_once('=')
                .ok_or_else(|| bad("--cluster-region", format!("{v:?} is not CLUSTER=REGION")))?;
            let cluster =
                ClusterId::parse(cluster).map_err(|e| bad("--cluster-region", format!("{cluster:?} {e}")))?;
            if region.is_empty() {
                return Err(bad("--cluster-region", format!("{v:?} has no region")));
            }
            Ok((cluster, region.to_owned()))
        })
        .collect::<Result<_, _>>()?;
    let fallback_boundary = a.fallback_boundary.parse().map_err(|e: String| bad("--fallback-boundary", e))?;
    if a.local_min_healthy == 0 {
        return Err(bad("--local-min-healthy", "must be at least 1"));
    }
    Ok(AnswerConfig {
        policy,
        max_answers: a.max_answers,
        local_min_healthy: a.local_min_healthy,
        fail_open: a.fail_open,
        endpoint_answers: a.endpoint_answers,
        fallback_boundary,
        clients,
        regions,
        default_cluster,
    })
}

/// `CIDR=NAME[/ZONE]`, the network in canonical form (host bits zero).
fn client_net(v: &str) -> Result<ClientNet, ConfigError> {
    const FLAG: &str = "--client-cluster";
    let (cidr, who) = v.split_once('=').ok_or_else(|| bad(FLAG, format!("{v:?} is not CIDR=NAME")))?;
    let (addr, prefix) = cidr.split_once('/').unwrap_or((cidr, ""));
    let addr: IpAddr = addr.parse().map_err(|_| bad(FLAG, format!("{cidr:?} is not an IP network")))?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let prefix: u8 = match prefix {
        "" => max,
        p => p
            .parse()
            .ok()
            .filter(|p| *p <= max)
            .ok_or_else(|| bad(FLAG, format!("{cidr:?}: bad prefix length")))?,
    };
    let addr = match addr {
        IpAddr::V4(a) => IpAddr::from(std::net::Ipv4Addr::from(
            u32::from(a) & u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0),
        )),
        IpAddr::V6(a) => IpAddr::from(std::net::Ipv6Addr::from(
            u128::from(a) & u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0),
        )),
    };
    let (cluster, zone) = match who.split_once('/') {
        Some((c, z)) if !z.is_empty() => (c, Some(z.to_owned())),
        Some((c, _)) => (c, None),
        None => (who, None),
    };
    let cluster = ClusterId::parse(cluster).map_err(|e| bad(FLAG, format!("{cluster:?} {e}")))?;
    Ok(ClientNet { addr, prefix, cluster, zone })
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};

    fn config(args: &[&str]) -> Result<ServeConfig, ConfigError> {
        let cli = Cli::try_parse_from([&["clusterset-dns", "serve"], args].concat()).unwrap();
        let Command::Serve(a) = cli.command else { unreachable!() };
        ServeConfig::from_args(&a)
    }

    fn setup_dns(args: &[&str]) -> Result<SetupDnsConfig, ConfigError> {
        let cli = Cli::try_parse_from([&["clusterset-dns", "setup-dns", "--kubeconfig", "k"], args].concat())
            .unwrap();
        let Command::SetupDns(a) = cli.command else { unreachable!() };
        SetupDnsConfig::from_args(&a)
    }

    #[test]
    fn setup_dns_watch_reapplies_by_default_every_minute_and_bad_values_name_their_flag() {
        assert!(setup_dns(&[]).unwrap().watch.is_none());
        let w = setup_dns(&["--watch"]).unwrap().watch.unwrap();
        assert_eq!((w.mode, w.interval), (Mode::Reapply, Duration::from_secs(60)));
        let w = setup_dns(&["--watch=report", "--interval", "2"]).unwrap().watch.unwrap();
        assert_eq!((w.mode, w.interval), (Mode::Report, Duration::from_secs(2)));
        assert_eq!(setup_dns(&["--watch=fight"]).unwrap_err().flag, "--watch");
        assert_eq!(setup_dns(&["--watch", "--interval", "0"]).unwrap_err().flag, "--interval");
        assert_eq!(setup_dns(&["--watch", "--dry-run"]).unwrap_err().flag, "--watch");
        assert_eq!(setup_dns(&["--watch", "--remove"]).unwrap_err().flag, "--watch");
    }

    #[test]
    fn defaults_serve_the_example_on_an_unprivileged_port() {
        let c = config(&[]).unwrap();
        assert_eq!(c.zone.origin.to_string(), "clusterset.local.");
        assert_eq!((c.zone.ttl, c.zone.negative_ttl), (5, 5));
        assert_eq!(c.listen, ["127.0.0.1:1053".parse().unwrap()]);
        assert!(c.objects.is_empty());
        assert_eq!(c.wire.max_udp_payload, 1232);
    }

    #[test]
    fn watches_list_in_pages_unless_told_to_take_all_at_once() {
        let page = |args: &[&str]| {
            config(&[&["--kubeconfig", "k"], args].concat()).unwrap().kube.unwrap().lists.page_size()
        };
        assert_eq!(page(&[]).map(|n| n.get()), Some(500));
        assert_eq!(page(&["--list-page-size", "50"]).map(|n| n.get()), Some(50));
        assert_eq!(page(&["--list-page-size", "0"]), None);
    }

    #[test]
    fn watches_stream_their_lists_where_allowed_unless_told_otherwise() {
        let mode = |args: &[&str]| {
            config(&[&["--kubeconfig", "k"], args].concat()).map(|c| c.kube.unwrap().lists.mode())
        };
        assert_eq!(mode(&[]).unwrap(), ListMode::Auto);
        assert_eq!(mode(&["--list-mode", "auto"]).unwrap(), ListMode::Auto);
        assert_eq!(mode(&["--list-mode", "stream"]).unwrap(), ListMode::Stream);
        assert_eq!(mode(&["--list-mode", "paged"]).unwrap(), ListMode::Paged);
        let e = mode(&["--list-mode", "Stream"]).unwrap_err();
        assert_eq!(e.flag, "--list-mode");
        assert!(e.problem.contains("auto, stream, paged"), "{}", e.problem);
        assert_eq!(mode(&["--list-mode", ""]).unwrap_err().flag, "--list-mode");
    }

    #[test]
    fn bad_values_name_their_flag() {
        assert_eq!(config(&["--zone", "a..b"]).unwrap_err().flag, "--zone");
        assert_eq!(config(&["--ttl", "4294967295"]).unwrap_err().flag, "--ttl");
        assert_eq!(config(&["--cluster-id", "bad_id"]).unwrap_err().flag, "--cluster-id");
        assert_eq!(config(&["--max-udp-payload", "100"]).unwrap_err().flag, "--max-udp-payload");
        assert_eq!(config(&["--udp-workers", "0"]).unwrap_err().flag, "--udp-workers");
        assert_eq!(config(&["--namespace", "shop"]).unwrap_err().flag, "--namespace");
        assert_eq!(config(&["--in-cluster", "--namespace", "Not_OK"]).unwrap_err().flag, "--namespace");
        assert_eq!(config(&["--cluster", "no-equals-sign"]).unwrap_err().flag, "--cluster");
        assert_eq!(config(&["--cluster", "a=/does/not/exist"]).unwrap_err().flag, "--cluster");
        assert_eq!(config(&["--members", "/does/not/exist"]).unwrap_err().flag, "--members");
    }

    fn sync_config(args: &[&str]) -> Result<SyncConfig, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let kc = dir.path().join("kc");
        std::fs::write(&kc, "apiVersion: v1").unwrap();
        let member = format!("a={}", kc.display());
        let cli =
            Cli::try_parse_from([&["clusterset-dns", "sync", "--cluster", &member], args].concat()).unwrap();
        let Command::Sync(a) = cli.command else { unreachable!() };
        SyncConfig::from_args(&a)
    }

    #[test]
    fn members_clients_are_rate_limited_unless_told_otherwise() {
        let limits = |args: &[&str]| sync_config(args).unwrap().kube_limits;
        assert_eq!(limits(&[]), Some(Limits { qps: 50.0, burst: 100 }));
        assert_eq!(limits(&["--kube-qps", "2.5", "--kube-burst", "1"]), Some(Limits { qps: 2.5, burst: 1 }));
        assert_eq!(limits(&["--kube-qps", "0"]), None, "0 turns the limit off");
        for bad in ["--kube-qps=-1", "--kube-qps=NaN", "--kube-qps=inf"] {
            assert_eq!(sync_config(&[bad]).unwrap_err().flag, "--kube-qps", "{bad:?}");
        }
        assert_eq!(sync_config(&["--kube-burst", "0"]).unwrap_err().flag, "--kube-burst");
    }

    #[test]
    fn cluster_profiles_alone_are_members_enough_and_bad_files_name_their_flag() {
        let dir = tempfile::tempdir().unwrap();
        let hub = dir.path().join("hub");
        std::fs::write(&hub, "apiVersion: v1").unwrap();
        let good = dir.path().join("providers.json");
        std::fs::write(
            &good,
            r#"{"providers": [{"name": "t", "execConfig": {"apiVersion": "client.authentication.k8s.io/v1", "command": "/bin/t"}}]}"#,
        )
        .unwrap();
        let broken = dir.path().join("broken.json");
        std::fs::write(&broken, r#"{"providers": [{"name": "t"}]}"#).unwrap();
        let (hub, good, broken) = (hub.to_str().unwrap(), good.to_str().unwrap(), broken.to_str().unwrap());
        let parse = |args: &[&str]| {
            let cli = Cli::try_parse_from([&["clusterset-dns", "sync"], args].concat()).unwrap();
            let Command::Sync(a) = cli.command else { unreachable!() };
            SyncConfig::from_args(&a)
        };
        let c = parse(&[
            "--cluster-profiles",
            "fleet",
            "--cluster-profile-providers",
            good,
            "--hub-kubeconfig",
            hub,
        ])
        .unwrap();
        let p = c.profiles.expect("profiles");
        assert_eq!((p.namespace.as_str(), p.providers.names()), ("fleet", vec!["t"]));
        // Without a --cluster member the Lease is in the hub.
        let lease = c.lease.expect("lease").connection;
        assert!(matches!(lease, Connection::Kubeconfig { path, .. } if path.to_str() == Some(hub)));
        let flag = |args: &[&str]| parse(args).unwrap_err().flag;
        assert_eq!(flag(&[]), "--cluster", "neither members nor profiles");
        assert_eq!(
            flag(&["--cluster-profiles", "fleet", "--cluster-profile-providers", broken]),
            "--cluster-profile-providers"
        );
        assert_eq!(
            flag(&["--cluster-profiles", "fleet", "--cluster-profile-providers", "/no/such"]),
            "--cluster-profile-providers"
        );
        assert_eq!(
            flag(&["--cluster-profiles", "Fleet!", "--cluster-profile-providers", good]),
            "--cluster-profiles"
        );
        assert_eq!(
            flag(&[
                "--cluster-profiles",
                "fleet",
                "--cluster-profile-providers",
                good,
                "--hub-kubeconfig",
                "/no/such"
            ]),
            "--hub-kubeconfig"
        );
        // clap: the namespace needs the provider file.
        assert!(Cli::try_parse_from(["clusterset-dns", "sync", "--cluster-profiles", "fleet"]).is_err());
    }

    #[test]
    fn shards_need_leader_election_and_a_sane_count() {
        let shards = |args: &[&str]| sync_config(args).unwrap().lease.map(|l| l.shards);
        assert_eq!(shards(&[]), Some(1));
        assert_eq!(shards(&["--shards", "4"]), Some(4));
        let e = sync_config(&["--shards", "4", "--no-leader-election"]).unwrap_err();
        assert_eq!(e.flag, "--shards");
        assert!(sync_config(&["--shards", "1", "--no-leader-election"]).is_ok());
        for n in ["0", "65"] {
            assert_eq!(sync_config(&["--shards", n]).unwrap_err().flag, "--shards", "{n}");
        }
    }

    #[test]
    fn members_come_from_flags_and_a_file_and_are_unique() {
        let dir = tempfile::tempdir().unwrap();
        let kc = dir.path().join("kc");
        std::fs::write(&kc, "apiVersion: v1").unwrap();
        let kc = kc.to_str().unwrap();
        let file = dir.path().join("members.yaml");
        std::fs::write(&file, format!("members:\n- {{name: b, kubeconfig: {kc}, context: ctx}}\n")).unwrap();
        let c = config(&["--cluster", &format!("a={kc}"), "--members", file.to_str().unwrap()]).unwrap();
        assert_eq!(c.members.iter().map(|m| m.name.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        let Connection::Kubeconfig { context, .. } = &c.members[1].connection else { panic!() };
        assert_eq!(context.as_deref(), Some("ctx"));
        let e = config(&["--cluster", &format!("a={kc}"), "--cluster", &format!("a={kc}")]).unwrap_err();
        assert!(e.problem.contains("twice"), "{e}");
        std::fs::write(&file, "members:\n- {name: b, kubeconfg: x}\n").unwrap();
        let e = config(&["--members", file.to_str().unwrap()]).unwrap_err();
        assert!(e.problem.contains("members[0]"), "{e}");
        assert!(config(&["--cluster", &format!("Bad_Name={kc}")]).is_err());
    }

    #[test]
    fn policy_flags_are_checked() {
        assert_eq!(config(&["--answer-policy", "fastest"]).unwrap_err().flag, "--answer-policy");
        assert_eq!(config(&["--client-cluster", "10.0.0.0/8"]).unwrap_err().flag, "--client-cluster");
        assert_eq!(config(&["--client-cluster", "10.0.0.0/33=a"]).unwrap_err().flag, "--client-cluster");
        assert_eq!(config(&["--client-cluster", "nonsense=a"]).unwrap_err().flag, "--client-cluster");
        assert_eq!(
            config(&["--client-cluster", "10.0.0.0/8=Bad_Name"]).unwrap_err().flag,
            "--client-cluster"
        );
        assert_eq!(config(&["--cluster-region", "a"]).unwrap_err().flag, "--cluster-region");
        assert_eq!(config(&["--fallback-boundary", "planet"]).unwrap_err().flag, "--fallback-boundary");
        assert_eq!(config(&["--local-min-healthy", "0"]).unwrap_err().flag, "--local-min-healthy");
    }

    #[test]
    fn health_flags_are_checked() {
        assert_eq!(config(&["--cluster-dead-after", "0"]).unwrap_err().flag, "--cluster-dead-after");
        assert_eq!(config(&[]).unwrap().cluster_dead_after, Duration::from_secs(15));
        assert!(config(&[]).unwrap().probe.is_none(), "probes are off by default");
        assert_eq!(config(&["--probe-interval", "0"]).unwrap_err().flag, "--probe-interval");
        assert_eq!(config(&["--probe-timeout", "NaN"]).unwrap_err().flag, "--probe-timeout");
        assert_eq!(config(&["--probe-recheck", "0"]).unwrap_err().flag, "--probe-recheck");
        assert_eq!(config(&["--probe-fall", "0"]).unwrap_err().flag, "--probe-fall");
        assert_eq!(config(&["--probe-rise", "0"]).unwrap_err().flag, "--probe-rise");
        assert_eq!(config(&["--probe-concurrency", "0"]).unwrap_err().flag, "--probe-concurrency");
        assert_eq!(config(&["--probe-rate", "0"]).unwrap_err().flag, "--probe-rate");
        let p = config(&["--probe", "--probe-interval", "0.5"]).unwrap().probe.unwrap();
        assert_eq!((p.interval, p.timeout), (Duration::from_millis(500), Duration::from_secs(1)));
        assert_eq!(p.recheck, Duration::from_millis(500));
        assert_eq!((p.fall, p.rise, p.concurrency, p.rate), (3, 2, 64, 200));
    }

    #[test]
    fn client_networks_are_canonical_and_may_name_a_zone() {
        let c =
            config(&["--client-cluster", "10.1.2.3/16=cluster-a/zone-1", "--client-cluster", "fd00::1/64=b"])
                .unwrap();
        let nets = &c.zone.answers.clients;
        assert_eq!(nets[0].addr, "10.1.0.0".parse::<IpAddr>().unwrap());
        assert_eq!((nets[0].prefix, nets[0].zone.as_deref()), (16, Some("zone-1")));
        assert_eq!(nets[1].addr, "fd00::".parse::<IpAddr>().unwrap());
        assert_eq!(c.zone.answers.policy, PolicyKind::Rotation);
        assert!(c.zone.answers.fail_open);
        assert_eq!(c.zone.answers.fallback_boundary, crate::model::Boundary::None);
        let c = config(&["--fallback-boundary", "region"]).unwrap();
        assert_eq!(c.zone.answers.fallback_boundary, crate::model::Boundary::Region);
    }

    fn doctor(args: &[&str]) -> Result<DoctorConfig, ConfigError> {
        let cli = Cli::try_parse_from([&["clusterset-dns", "doctor"], args].concat()).unwrap();
        let Command::Doctor(a) = cli.command else { unreachable!() };
        DoctorConfig::from_args(&a)
    }

    #[test]
    fn doctor_takes_the_short_or_the_full_name_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let kc = dir.path().join("kc");
        std::fs::write(&kc, "apiVersion: v1").unwrap();
        let a = format!("a={}", kc.display());
        for name in ["web.shop", "Web.Shop.svc.clusterset.local", "web.shop.svc.clusterset.local."] {
            let c = doctor(&[name, "--cluster", &a]).unwrap();
            assert_eq!(c.key.to_string(), "shop/web", "{name}");
        }
        let c = doctor(&["web.shop.svc.fleet.example", "--zone", "fleet.example", "--cluster", &a]).unwrap();
        assert_eq!(c.key.to_string(), "shop/web");
        for name in [
            "web",
            "web.shop.svc",
            "web.shop.svc.cluster.local",
            "a.b.c",
            "web_x.shop",
            "web.shop.svc.clusterset.local.x",
        ] {
            let e = doctor(&[name, "--cluster", &a]).unwrap_err();
            assert_eq!(e.flag, "NAME", "{name}: {e}");
        }
        assert_eq!(doctor(&["web.shop"]).unwrap_err().flag, "--cluster");
        let c = doctor(&["web.shop", "--cluster", &a, "--dns", "a=127.0.0.1:5353"]).unwrap();
        assert_eq!(c.dns, [("a".to_owned(), "127.0.0.1:5353".parse().unwrap())]);
        let c = doctor(&["web.shop", "--cluster", &a, "--dns", "a=10.0.0.10"]).unwrap();
        assert_eq!(c.dns[0].1, "10.0.0.10:53".parse::<SocketAddr>().unwrap());
        assert_eq!(doctor(&["web.shop", "--cluster", &a, "--dns", "b=10.0.0.10"]).unwrap_err().flag, "--dns");
        assert_eq!(doctor(&["web.shop", "--cluster", &a, "--dns", "a=nowhere"]).unwrap_err().flag, "--dns");
        assert_eq!(doctor(&["web.shop", "--cluster", &a, "--output", "yaml"]).unwrap_err().flag, "--output");
        assert_eq!(doctor(&["web.shop", "--cluster", &a, "--timeout", "0"]).unwrap_err().flag, "--timeout");
    }

    #[test]
    fn zone_names_are_folded_to_lower_case() {
        assert_eq!(config(&["--zone", "Fleet.Example."]).unwrap().zone.origin.to_string(), "fleet.example.");
        let also = config(&["--also-zone", "Cluster.Local"]).unwrap().zone.also;
        assert_eq!(also.map(|a| a.to_string()).as_deref(), Some("cluster.local."));
        for bad_zone in [".", "clusterset.local", "local", "x.clusterset.local", "a..b"] {
            let e = config(&["--also-zone", bad_zone]).unwrap_err().to_string();
            assert!(e.contains("--also-zone"), "{bad_zone}: {e}");
        }
    }
}
