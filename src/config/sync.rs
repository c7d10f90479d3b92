//! `sync`'s and `run`'s configuration: members, leader election and
//! shards, the controller's behaviour.

use std::net::SocketAddr;
use std::time::Duration;

use crate::cli::{AgentArgs, ProfilesArgs, RunArgs, SyncArgs, SyncOptions};
use crate::controller::syncer::{CONCURRENCY, SyncBehaviour};
use crate::fault::Faults;
use crate::fleet::inventory::InventoryConfig;
use crate::fleet::member::MemberConfig;
use crate::k8s::client::Connection;
use crate::k8s::inventory::Providers;
use crate::k8s::throttle::Limits;
use crate::model::{ClusterId, DnsLabel};

use super::*;

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

/// Everything `agent` needs (hub mode).
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// This member: its name and its own cluster.
    pub member: MemberConfig,
    /// The hub.
    pub hub: Connection,
    /// Address of the HTTP endpoints.
    pub http_listen: SocketAddr,
    /// Leader election of this member's agents (in its own cluster by
    /// default), unless disabled.
    pub lease: Option<LeaseConfig>,
    /// The controller's behaviour.
    pub behaviour: SyncBehaviour,
    /// The rate limit of the member's and the hub's clients.
    pub kube_limits: Option<Limits>,
}

impl AgentConfig {
    /// Validates command-line values.
    pub fn from_args(a: &AgentArgs) -> Result<Self, ConfigError> {
        ClusterId::parse(&a.member).map_err(|e| bad("--member", not_a_label(&a.member, &e)))?;
        let connection = match &a.kubeconfig {
            Some(path) if !path.is_file() => {
                return Err(bad("--kubeconfig", format!("{} is not a readable file", path.display())));
            }
            Some(path) => Connection::Kubeconfig { path: path.clone(), context: None },
            None => Connection::InCluster,
        };
        if !a.hub_kubeconfig.is_file() {
            return Err(bad(
                "--hub-kubeconfig",
                format!("{} is not a readable file", a.hub_kubeconfig.display()),
            ));
        }
        if a.options.shards > 1 {
            return Err(bad(
                "--shards",
                "an agent writes one member: its replicas share one Lease (--shards 1)",
            ));
        }
        let member = MemberConfig { name: a.member.clone(), connection };
        Ok(Self {
            lease: lease(&a.options, Some(&member.connection))?,
            behaviour: behaviour(&a.options, &a.namespaces)?,
            kube_limits: kube_limits(&a.options)?,
            hub: Connection::Kubeconfig { path: a.hub_kubeconfig.clone(), context: None },
            member,
            http_listen: a.http_listen,
        })
    }
}

/// The controller behaviour of `sync` options.
pub fn behaviour(o: &SyncOptions, namespaces: &[String]) -> Result<SyncBehaviour, ConfigError> {
    for p in &o.auto_export_namespace_prefixes {
        if p.is_empty() || !p.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-') {
            return Err(bad(
                "--auto-export-namespace-prefix",
                format!("{p:?} cannot start a namespace name"),
            ));
        }
    }
    for ns in namespaces {
        DnsLabel::parse(ns).map_err(|e| bad("--namespace", not_a_label(ns, &e)))?;
    }
    Ok(SyncBehaviour {
        namespaces: namespaces.to_vec(),
        on_member_lost: o.on_member_lost,
        lost_after: Duration::from_secs(o.member_lost_after),
        resync: Duration::from_secs(o.resync_interval),
        auto_export_prefixes: o.auto_export_namespace_prefixes.clone(),
        // clap holds it to 1-1024.
        concurrency: usize::try_from(o.concurrent_syncs).unwrap_or(CONCURRENCY),
    })
}

/// The members' client rate limit of `sync` options (`--kube-qps 0`: none;
/// clap refuses a negative or infinite rate).
pub fn kube_limits(o: &SyncOptions) -> Result<Option<Limits>, ConfigError> {
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
    // clap holds --shards to 1-MAX_SHARDS and --lease-duration to 5-3600.
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
        .map_err(|e| bad("--lease-namespace", not_a_label(&o.lease_namespace, &e)))?;
    ClusterId::parse(&o.lease_name).map_err(|e| bad("--lease-name", not_a_label(&o.lease_name, &e)))?;
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

/// `--cluster-profiles`: the namespace, the hub, the provider file (read
/// and checked now: a provider that cannot run a plugin fails the start).
pub(super) fn profiles(a: &ProfilesArgs) -> Result<Option<InventoryConfig>, ConfigError> {
    let Some(namespace) = &a.cluster_profiles else { return Ok(None) };
    DnsLabel::parse(namespace).map_err(|e| bad("--cluster-profiles", not_a_label(namespace, &e)))?;
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
