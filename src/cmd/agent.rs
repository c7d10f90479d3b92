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
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use super::Process;
use super::sync::SyncError;
use crate::config::AgentConfig;
use crate::controller::election::{self, ElectionStatus};
use crate::controller::link::hub::HubLink;
use crate::controller::link::{KubeLink, MemberLink};
use crate::controller::shard::Shards;
use crate::controller::stats::SyncStats;
use crate::controller::syncer::{SyncBehaviour, Syncer};
use crate::fault::{Failures, Faults, Task};
use crate::fleet::member::{self, CONNECT_TIMEOUT, Member};
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

/// The hub's members (other than this one) as last read; `None` before the
/// first read.
type HubMembers = watch::Receiver<Option<BTreeSet<String>>>;

/// Runs the agent until SIGTERM or SIGINT.
pub async fn run(cfg: AgentConfig) -> Result<(), SyncError> {
    let process = Process::new().map_err(SyncError::Metrics)?;
    let mut stop = Stop::new()?;
    let name = cfg.member.name.clone();
    let agent = match &cfg.lease {
        Some(l) => format!("agent/{name}/{}", l.identity),
        None => format!("agent/{name}"),
    };
    let (own, hub, cluster_uid) = connect(&cfg, &agent).await?;
    let failures = process.failures.clone();
    let sup = Supervisor::new(failures.clone());
    let stats = Arc::new(SyncStats::new().map_err(SyncError::Metrics)?);
    let (shards, mut election, status) = elect(&cfg, &agent, &failures)?;
    stats.register(&process.registry, shards.clone(), status.clone()).map_err(SyncError::Metrics)?;
    let on = OnHub {
        hub: hub.clone(),
        namespace: record::namespace_of(&name),
        fence: WriteFence::new(shards.fence(0).clone(), 0),
        shards: shards.clone(),
        claim: Arc::default(),
    };
    let published = Arc::new(PublishStats::default());
    let skipped = Arc::new(AtomicU64::new(0));
    hub_families(&published, &skipped).register(&process.registry).map_err(SyncError::Metrics)?;
    let _http = serve_http(&cfg, &process, &sup, &on, status).await?;
    let _publishing = spawn_publisher(&sup, &on, &own, &published);
    let _beating = spawn_heartbeat(&sup, &on, &cfg, cluster_uid);
    let (members_tx, mut members) = watch::channel(None);
    let _following = {
        let (hub, me) = (hub.clone(), name.clone());
        sup.restartable(Task::Members, move || {
            heartbeat::members(hub.clone(), me.clone(), MEMBERS_EVERY, members_tx.clone())
        })
    };
    // The controller starts once the hub's members are known.
    loop {
        tokio::select! {
            () = stop.signalled() => return super::sync::stop(election).await,
            Ok(()) = members.changed() => if members.borrow_and_update().is_some() { break },
        }
    }
    let controller =
        Controller { own, hub, skipped, stats, behaviour: cfg.behaviour.clone(), shards, failures };
    let failed = controller.follow(&sup, &mut members, &mut stop, &mut election).await;
    super::sync::stop(election).await?;
    failed.map_or(Ok(()), Err)
}

/// SIGTERM or SIGINT.
struct Stop {
    term: Signal,
    int: Signal,
}

impl Stop {
    fn new() -> Result<Self, SyncError> {
        let term = signal(SignalKind::terminate()).map_err(SyncError::Signal)?;
        let int = signal(SignalKind::interrupt()).map_err(SyncError::Signal)?;
        Ok(Self { term, int })
    }

    /// Returns when either arrives.
    async fn signalled(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}

/// This member's own cluster, the hub, and the cluster's identity on the
/// hub (its kube-system namespace's uid; the member name when that cannot
/// be read).
async fn connect(cfg: &AgentConfig, agent: &str) -> Result<(Member, kube::Client, String), SyncError> {
    let own =
        member::connect(&cfg.member, agent, CONNECT_TIMEOUT, &cfg.behaviour.namespaces, cfg.kube_limits)
            .await?;
    let hub_throttle = Arc::new(ThrottleStats::default());
    let hub = client::connect_limited(&cfg.hub, agent, cfg.kube_limits, "hub", hub_throttle).await?;
    let cluster_uid = match Api::<Namespace>::all(own.client.clone()).get("kube-system").await {
        Ok(ns) => ns.metadata.uid.unwrap_or_default(),
        Err(e) => {
            warn!(error = %e, "cannot read this cluster's kube-system namespace: its uid names it on the hub; using the member name");
            cfg.member.name.clone()
        }
    };
    Ok((own, hub, cluster_uid))
}

/// The shards this replica leads, its election running, and its status.
type Elected = (Arc<Shards>, Option<election::Running>, Option<Arc<ElectionStatus>>);

/// The election of this member's replicas (one shard, on a Lease in its
/// own cluster), running; every shard led at once without one.
fn elect(cfg: &AgentConfig, agent: &str, failures: &Arc<Failures>) -> Result<Elected, SyncError> {
    let Some(lease) = &cfg.lease else { return Ok((Shards::alone(), None, None)) };
    // One Lease: the config refuses --shards above 1 for an agent.
    let (shards, running, status) = super::sync::elect(lease, agent, failures)?;
    Ok((shards, Some(running), Some(status)))
}

/// What the agent's tasks on the hub share: its client, this member's
/// namespace there, the tenure each write carries, and whether the
/// member's name is ours.
struct OnHub {
    hub: kube::Client,
    namespace: String,
    fence: WriteFence,
    shards: Arc<Shards>,
    claim: Arc<Claim>,
}

/// `/health`, `/ready` and `/metrics`; `/ready` fails, saying why, while
/// the member's name is another cluster's or the Leases cannot be read.
async fn serve_http(
    cfg: &AgentConfig,
    process: &Process,
    sup: &Supervisor,
    on: &OnHub,
    election: Option<Arc<ElectionStatus>>,
) -> Result<JoinHandle<()>, SyncError> {
    let listener = tokio::net::TcpListener::bind(cfg.http_listen).await.map_err(SyncError::Bind)?;
    info!(addr = %listener.local_addr().map_err(SyncError::Bind)?, member = %cfg.member.name, hub_namespace = %on.namespace, "HTTP /health /ready /metrics");
    let refused = on.claim.clone();
    let endpoints =
        Endpoints::new(process.registry.clone(), process.failures.clone(), Faults::default(), move || {
            if let Some(why) = refused.refused() {
                return Some(why);
            }
            let why = election.as_ref()?.unreachable()?;
            Some(format!("cannot read the Leases, leading nothing: {why}"))
        });
    Ok(sup.fatal(Task::Http, endpoints.serve(listener)))
}

/// Publishes what `own` exports on the hub (`hub::publish`), restarted if
/// it fails.
fn spawn_publisher(sup: &Supervisor, on: &OnHub, own: &Member, stats: &Arc<PublishStats>) -> JoinHandle<()> {
    let (hub, namespace, fence, shards, claim) =
        (on.hub.clone(), on.namespace.clone(), on.fence.clone(), on.shards.clone(), on.claim.clone());
    let (own, stats) = (own.clone(), stats.clone());
    sup.restartable(Task::Members, move || {
        Publisher {
            cluster: own.clone(),
            hub: hub.clone(),
            namespace: namespace.clone(),
            fence: fence.clone(),
            leading: shards.led(),
            stats: stats.clone(),
            claim: claim.clone(),
        }
        .run()
    })
}

/// Renews this member's heartbeat on the hub (`hub::heartbeat`) while this
/// replica leads, restarted if it fails.
fn spawn_heartbeat(sup: &Supervisor, on: &OnHub, cfg: &AgentConfig, cluster_uid: String) -> JoinHandle<()> {
    let (hub, namespace, fence, shards, claim) =
        (on.hub.clone(), on.namespace.clone(), on.fence.clone(), on.shards.clone(), on.claim.clone());
    let member = cfg.member.name.clone();
    let identity = cfg.lease.as_ref().map_or_else(|| member.clone(), |l| l.identity.clone());
    let duration = cfg.lease.as_ref().map_or(Duration::from_secs(15), |l| l.duration);
    sup.restartable(Task::Liveness, move || {
        Heartbeat {
            hub: hub.clone(),
            member: member.clone(),
            namespace: namespace.clone(),
            identity: identity.clone(),
            cluster_uid: cluster_uid.clone(),
            duration,
            fence: fence.clone(),
            leading: shards.led(),
            claim: claim.clone(),
        }
        .run()
    })
}

/// The sync controller over this member's own cluster, written, and the
/// hub's other members, read from their records.
struct Controller {
    own: Member,
    hub: kube::Client,
    /// Other members' records that could not be read.
    skipped: Arc<AtomicU64>,
    stats: Arc<SyncStats>,
    behaviour: SyncBehaviour,
    shards: Arc<Shards>,
    failures: Arc<Failures>,
}

impl Controller {
    /// The controller over this member and `others`, running.
    fn start(&self, sup: &Supervisor, others: &BTreeSet<String>) -> JoinHandle<()> {
        let mut links: Vec<Arc<dyn MemberLink>> = vec![Arc::new(KubeLink(self.own.clone()))];
        for m in others {
            match HubLink::new(m, self.hub.clone(), self.skipped.clone()) {
                Ok(link) => links.push(Arc::new(link)),
                Err(e) => warn!("skipping a member of the hub: {e}"),
            }
        }
        self.stats.set_members(std::slice::from_ref(&self.own));
        let syncer = Syncer::new(
            links,
            self.behaviour.clone(),
            self.stats.clone(),
            self.shards.clone(),
            self.failures.clone(),
        );
        sup.fatal(Task::Controller, syncer.run())
    }

    /// Runs the controller, started again whenever the hub's members
    /// change, until a signal (`None`), a fatal failure or the election's
    /// refusal (why).
    async fn follow(
        &self,
        sup: &Supervisor,
        members: &mut HubMembers,
        stop: &mut Stop,
        election: &mut Option<election::Running>,
    ) -> Option<SyncError> {
        let mut others = members.borrow().clone().unwrap_or_default();
        info!(members = ?others, "hub mode: syncing this member from the hub's records");
        let mut controller = self.start(sup, &others);
        let failed = loop {
            tokio::select! {
                () = stop.signalled() => break None,
                reason = self.failures.wait_fatal() => break Some(SyncError::Failed(reason.to_owned())),
                e = super::sync::refused(election) => break Some(SyncError::Election(e)),
                Ok(()) = members.changed() => {
                    let now = members.borrow_and_update().clone().unwrap_or_default();
                    if now != others {
                        info!(members = ?now, "the hub's members changed: restarting the controller");
                        others = now;
                        controller.abort();
                        controller = self.start(sup, &others);
                    }
                }
            }
        };
        controller.abort();
        failed
    }
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
