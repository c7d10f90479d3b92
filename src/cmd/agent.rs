//! The `agent` command's composition root (hub mode): one per member. It
//! connects the member's own cluster and the hub, takes part in the
//! election of its replicas (a Lease in its own cluster), publishes what
//! the cluster exports on the hub (`hub::publish`) with its heartbeat
//! (`hub::heartbeat`), and runs the sync controller over its own cluster,
//! written, and every other member of the hub, read from their records
//! (`controller::link::hub`), restarted when members join or leave.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use tokio::signal::unix::{SignalKind, signal};
use tracing::{info, warn};

use super::Process;
use super::sync::SyncError;
use crate::config::AgentConfig;
use crate::controller::election::{self, ElectionConfig, ElectionStatus};
use crate::controller::link::hub::HubLink;
use crate::controller::link::{KubeLink, MemberLink};
use crate::controller::shard::Shards;
use crate::controller::stats::SyncStats;
use crate::controller::syncer::Syncer;
use crate::fault::{Faults, Task};
use crate::fleet::member::{self, CONNECT_TIMEOUT};
use crate::hub::heartbeat::{self, Claim, Heartbeat};
use crate::hub::publish::{PublishStats, Publisher};
use crate::hub::record;
use crate::k8s::client;
use crate::k8s::fence::WriteFence;
use crate::k8s::throttle::ThrottleStats;
use crate::ops::http::Endpoints;
use crate::scrape::{Families, Sample};
use crate::supervise::Supervisor;

/// How often the hub's member list is read again.
const MEMBERS_EVERY: Duration = Duration::from_secs(5);

/// Runs the agent until SIGTERM or SIGINT.
pub async fn run(cfg: AgentConfig) -> Result<(), SyncError> {
    let process = Process::new().map_err(SyncError::Metrics)?;
    let mut term = signal(SignalKind::terminate()).map_err(SyncError::Signal)?;
    let mut int = signal(SignalKind::interrupt()).map_err(SyncError::Signal)?;
    let name = cfg.member.name.clone();
    let agent = match &cfg.lease {
        Some(l) => format!("agent/{name}/{}", l.identity),
        None => format!("agent/{name}"),
    };
    let own =
        member::connect(&cfg.member, &agent, CONNECT_TIMEOUT, &cfg.behaviour.namespaces, cfg.kube_limits)
            .await?;
    let hub_throttle = Arc::new(ThrottleStats::default());
    let hub = client::connect_limited(&cfg.hub, &agent, cfg.kube_limits, "hub", hub_throttle).await?;
    // The cluster's identity: its kube-system namespace's uid.
    let cluster_uid = match Api::<Namespace>::all(own.client.clone()).get("kube-system").await {
        Ok(ns) => ns.metadata.uid.unwrap_or_default(),
        Err(e) => {
            warn!(error = %e, "cannot read this cluster's kube-system namespace: its uid names it on the hub; using the member name");
            name.clone()
        }
    };
    let failures = process.failures.clone();
    let sup = Supervisor::new(failures.clone());
    let stats = Arc::new(SyncStats::new().map_err(SyncError::Metrics)?);
    let (shards, mut election, status) = match &cfg.lease {
        None => (Shards::alone(), None, None),
        Some(lease) => {
            let shards = Shards::elected(1);
            let status = Arc::new(ElectionStatus::default());
            let ec = ElectionConfig {
                namespace: lease.namespace.clone(),
                name: lease.name.clone(),
                identity: lease.identity.clone(),
                shards: 1,
                duration: lease.duration,
            };
            let connect =
                election::connect_leases(lease.connection.clone(), agent.clone(), lease.namespace.clone());
            let running = election::spawn(ec, connect, shards.clone(), status.clone(), failures.clone())
                .map_err(SyncError::Thread)?;
            (shards, Some(running), Some(status))
        }
    };
    stats.register(&process.registry, shards.clone(), status.clone()).map_err(SyncError::Metrics)?;
    let fence = WriteFence::new(shards.fence(0).clone(), 0);
    let namespace = record::namespace_of(&name);
    let claim = Arc::new(Claim::default());
    let published = Arc::new(PublishStats::default());
    let skipped = Arc::new(AtomicU64::new(0));
    hub_families(&published, &skipped).register(&process.registry).map_err(SyncError::Metrics)?;
    let listener = tokio::net::TcpListener::bind(cfg.http_listen).await.map_err(SyncError::Bind)?;
    info!(addr = %listener.local_addr().map_err(SyncError::Bind)?, member = %name, hub_namespace = %namespace, "HTTP /health /ready /metrics");
    let (election_status, refused) = (status.clone(), claim.clone());
    let endpoints =
        Endpoints::new(process.registry.clone(), failures.clone(), Faults::default(), move || {
            if let Some(why) = refused.refused() {
                return Some(why);
            }
            let why = election_status.as_ref()?.unreachable()?;
            Some(format!("cannot read the Leases, leading nothing: {why}"))
        });
    let _http = sup.fatal(Task::Http, endpoints.serve(listener));
    let identity = cfg.lease.as_ref().map_or_else(|| name.clone(), |l| l.identity.clone());
    let duration = cfg.lease.as_ref().map_or(Duration::from_secs(15), |l| l.duration);
    let _publishing = {
        let (own, hub, ns, fence, led, stats, claim) = (
            own.clone(),
            hub.clone(),
            namespace.clone(),
            fence.clone(),
            shards.clone(),
            published.clone(),
            claim.clone(),
        );
        sup.restartable(Task::Members, move || {
            Publisher {
                cluster: own.clone(),
                hub: hub.clone(),
                namespace: ns.clone(),
                fence: fence.clone(),
                leading: led.led(),
                stats: stats.clone(),
                claim: claim.clone(),
            }
            .run()
        })
    };
    let _beating = {
        let (hub, member, ns, fence, led, claim) =
            (hub.clone(), name.clone(), namespace.clone(), fence.clone(), shards.clone(), claim.clone());
        sup.restartable(Task::Liveness, move || {
            Heartbeat {
                hub: hub.clone(),
                member: member.clone(),
                namespace: ns.clone(),
                identity: identity.clone(),
                cluster_uid: cluster_uid.clone(),
                duration,
                fence: fence.clone(),
                leading: led.led(),
                claim: claim.clone(),
            }
            .run()
        })
    };
    let (members_tx, mut members) = tokio::sync::watch::channel(None);
    let _following = {
        let (hub, me) = (hub.clone(), name.clone());
        sup.restartable(Task::Members, move || {
            heartbeat::members(hub.clone(), me.clone(), MEMBERS_EVERY, members_tx.clone())
        })
    };
    // The controller starts once the hub's members are known.
    loop {
        tokio::select! {
            _ = term.recv() => return super::sync::stop(election).await,
            _ = int.recv() => return super::sync::stop(election).await,
            Ok(()) = members.changed() => if members.borrow_and_update().is_some() { break },
        }
    }
    let start_controller = |others: &BTreeSet<String>| {
        let mut links: Vec<Arc<dyn MemberLink>> = vec![Arc::new(KubeLink(own.clone()))];
        for m in others {
            match HubLink::new(m, hub.clone(), skipped.clone()) {
                Ok(link) => links.push(Arc::new(link)),
                Err(e) => warn!("skipping a member of the hub: {e}"),
            }
        }
        stats.set_members(std::slice::from_ref(&own));
        let syncer =
            Syncer::new(links, cfg.behaviour.clone(), stats.clone(), shards.clone(), failures.clone());
        sup.fatal(Task::Controller, syncer.run())
    };
    let mut others = members.borrow().clone().unwrap_or_default();
    info!(members = ?others, "hub mode: syncing this member from the hub's records");
    let mut controller = start_controller(&others);
    let mut failed = None;
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = int.recv() => break,
            reason = failures.wait_fatal() => {
                failed = Some(SyncError::Failed(reason.to_owned()));
                break;
            }
            e = super::sync::refused(&mut election) => {
                failed = Some(SyncError::Election(e));
                break;
            }
            Ok(()) = members.changed() => {
                let now = members.borrow_and_update().clone().unwrap_or_default();
                if now != others {
                    info!(members = ?now, "the hub's members changed: restarting the controller");
                    others = now;
                    controller.abort();
                    controller = start_controller(&others);
                }
            }
        }
    }
    controller.abort();
    super::sync::stop(election).await?;
    failed.map_or(Ok(()), Err)
}

/// `clusterset_dns_hub_*`: what the publisher wrote, and the records of
/// other members that could not be read.
fn hub_families(p: &Arc<PublishStats>, skipped: &Arc<AtomicU64>) -> Families {
    let count = |f: fn(&PublishStats) -> &AtomicU64| {
        let p = p.clone();
        move || vec![Sample::count(&[], f(&p).load(Ordering::Relaxed))]
    };
    let skipped = skipped.clone();
    let mut f = Families::new();
    f.counter(
        "clusterset_dns_hub_records_written_total",
        "ExportRecords this member wrote on the hub (only those whose content changed).",
        &[],
        count(|p| &p.written),
    )
    .counter(
        "clusterset_dns_hub_records_deleted_total",
        "ExportRecords this member deleted on the hub (its export gone, or fewer continuations).",
        &[],
        count(|p| &p.deleted),
    )
    .counter(
        "clusterset_dns_hub_records_unchanged_total",
        "Writes of this member's ExportRecords skipped: the hub already held that content.",
        &[],
        count(|p| &p.unchanged),
    )
    .counter(
        "clusterset_dns_hub_records_failed_total",
        "Writes or deletes of this member's ExportRecords that failed (each retried; fenced ones included).",
        &[],
        count(|p| &p.failed),
    )
    .counter(
        "clusterset_dns_hub_records_skipped_total",
        "Other members' ExportRecords that could not be read (a hand edit, another version): skipped, each named in the log.",
        &[],
        move || vec![Sample::count(&[], skipped.load(Ordering::Relaxed))],
    );
    f
}
