//! The `sync` command's composition root: connects the members, runs the
//! controller, takes part in the election of who writes which shard, and
//! serves `/health`, `/ready` and `/metrics`.
//!
//! Every replica runs the controller (its watches, its view of the fleet)
//! from the start; it writes only the services of the shards it leads, and
//! only while each shard's Lease is surely its own (controller::election).
//! A shard taken over is read from the members first, so a move with
//! nothing changed writes nothing.

use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use super::Process;
use crate::config::{LeaseConfig, SyncConfig};
use crate::controller::election::{self, ElectionConfig, ElectionError, ElectionStatus};
use crate::controller::link::{KubeLink, MemberLink};
use crate::controller::shard::Shards;
use crate::controller::stats::SyncStats;
use crate::controller::syncer::Syncer;
use crate::fault::{Failures, Point, Task};
use crate::fleet::inventory::{self, InventoryConfig};
use crate::fleet::member;
use crate::k8s::client::{self, ClientError};
use crate::k8s::watch::WatchHealth;
use crate::model::ClusterId;
use crate::ops::http::Endpoints;
use crate::supervise::Supervisor;

/// Why `sync` stopped.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// A member or the Lease's cluster could not be reached.
    #[error("{0}")]
    Client(#[from] ClientError),
    /// This replica cannot take part in the election (another `--shards`).
    #[error("leader election: {0}")]
    Election(#[from] ElectionError),
    /// The HTTP address could not be bound.
    #[error("--http-listen: {0}")]
    Bind(std::io::Error),
    /// A signal handler could not be installed.
    #[error("signals: {0}")]
    Signal(std::io::Error),
    /// A task that cannot be restarted died (the lease is released first).
    #[error("{0}")]
    Failed(String),
    /// The metrics could not be registered (a build defect).
    #[error("metrics: {0}")]
    Metrics(prometheus::Error),
    /// The election's thread could not be started.
    #[error("the election's thread: {0}")]
    Thread(std::io::Error),
}

/// Runs the controller until SIGTERM or SIGINT.
pub async fn run(cfg: SyncConfig) -> Result<(), SyncError> {
    run_in(cfg, Process::new().map_err(SyncError::Metrics)?).await
}

/// How long the election is given to release its shards at shutdown (one
/// list and the writes, each under a deadline of at most 5 s).
const RELEASE_WAIT: Duration = Duration::from_secs(12);

/// [`run`] as part of `process` (its registry and failures shared).
///
/// Every part runs as a task or thread of its own, so this loop only
/// composes: the election on its own thread ([`election::spawn`]), joins
/// of ClusterProfile members ([`inventory::join`]) and the members'
/// cluster ids ([`member::follow_ids`]) as supervised tasks, and the
/// controller, restarted over new members or ids. Nothing here waits on a
/// member.
pub async fn run_in(cfg: SyncConfig, process: Process) -> Result<(), SyncError> {
    let mut term = signal(SignalKind::terminate()).map_err(SyncError::Signal)?;
    let mut int = signal(SignalKind::interrupt()).map_err(SyncError::Signal)?;
    let agent = match &cfg.lease {
        Some(lease) => format!("sync/{}", lease.identity),
        None => "sync".to_owned(),
    };
    let statics =
        member::connect_all(&cfg.members, &agent, &cfg.behaviour.namespaces, cfg.kube_limits).await?;
    let stats = Arc::new(SyncStats::new().map_err(SyncError::Metrics)?);
    stats.set_members(&statics);
    let listener = tokio::net::TcpListener::bind(cfg.http_listen).await.map_err(SyncError::Bind)?;
    info!(addr = %listener.local_addr().map_err(SyncError::Bind)?, "HTTP /health /ready /metrics");
    let failures = process.failures.clone();
    let sup = Supervisor::new(failures.clone());
    let (shards, mut election, status) = match &cfg.lease {
        None => {
            info!("no leader election: syncing every service");
            (Shards::alone(), None, None)
        }
        Some(lease) => {
            let (shards, running, status) = elect(lease, &agent, &failures)?;
            (shards, Some(running), Some(status))
        }
    };
    stats.register(&process.registry, shards.clone(), status.clone()).map_err(SyncError::Metrics)?;
    // /health is the liveness probe: its server's death is fatal.
    let _http = sup.fatal(Task::Http, endpoints(&cfg, &process, status).serve(listener));
    // Members of the ClusterProfiles (--cluster-profiles), joined by a task
    // of their own; the controller starts after their first list, so it
    // does not start once without them.
    let (joined_tx, mut joined) = tokio::sync::watch::channel(None);
    let _joining = match &cfg.profiles {
        None => None,
        Some(p) => Some(join_profiles(&cfg, p, &agent, &statics, &sup, joined_tx).await?),
    };
    if cfg.profiles.is_some()
        && let Err(failed) = first_join(&mut term, &mut int, &failures, &mut joined).await
    {
        stop(election).await?;
        return failed.map_or(Ok(()), |reason| Err(SyncError::Failed(reason)));
    }
    let with_joined = |joined: &Option<Vec<member::Member>>| -> Vec<member::Member> {
        statics.iter().cloned().chain(joined.iter().flatten().cloned()).collect()
    };
    let members = with_joined(&joined.borrow());
    stats.set_members(&members);
    let mut controller = Controller::start(&cfg, &sup, stats.clone(), shards.clone(), members);
    let mut led = shards.led();
    let mut leading = false;
    let mut failed = None;
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = int.recv() => break,
            reason = failures.wait_fatal() => {
                failed = Some(SyncError::Failed(reason.to_owned()));
                break;
            }
            e = refused(&mut election) => {
                failed = Some(SyncError::Election(e));
                break;
            }
            Ok(()) = joined.changed() => {
                let members = with_joined(&joined.borrow_and_update());
                stats.set_members(&members);
                controller.restart_with(members);
            }
            Ok(()) = led.changed() => {
                let n = led.borrow_and_update().iter().filter(|l| **l).count();
                leading = log_leading(n, leading, &shards);
            }
            Ok(()) = controller.ids.changed() => controller.rekey(),
        }
    }
    controller.abort();
    stop(election).await?;
    failed.map_or(Ok(()), Err)
}

/// Waits for the first list of the ClusterProfiles' members; `Err` when a
/// signal (`None`) or a fatal failure (its reason) comes first.
async fn first_join(
    term: &mut Signal,
    int: &mut Signal,
    failures: &Failures,
    joined: &mut watch::Receiver<Option<Vec<member::Member>>>,
) -> Result<(), Option<String>> {
    loop {
        tokio::select! {
            _ = term.recv() => return Err(None),
            _ = int.recv() => return Err(None),
            reason = failures.wait_fatal() => return Err(Some(reason.to_owned())),
            Ok(()) = joined.changed() => if joined.borrow_and_update().is_some() { return Ok(()) },
        }
    }
}

/// The controller over the members, and the task that follows their
/// cluster ids (from their ClusterProperties).
struct Controller<'a> {
    cfg: &'a SyncConfig,
    sup: &'a Supervisor,
    stats: Arc<SyncStats>,
    shards: Arc<Shards>,
    members: Vec<member::Member>,
    /// The members' cluster ids, as the following task finds them.
    ids: watch::Receiver<Vec<ClusterId>>,
    following: JoinHandle<()>,
    running: JoinHandle<()>,
}

impl<'a> Controller<'a> {
    /// Starts the controller over `members`, and the task that follows
    /// their cluster ids.
    fn start(
        cfg: &'a SyncConfig,
        sup: &'a Supervisor,
        stats: Arc<SyncStats>,
        shards: Arc<Shards>,
        members: Vec<member::Member>,
    ) -> Self {
        let (ids_tx, ids) = watch::channel(Vec::new());
        let following = follow_ids(sup, &members, ids_tx);
        let running = run_controller(cfg, sup, &members, stats.clone(), shards.clone());
        Self { cfg, sup, stats, shards, members, ids, following, running }
    }

    /// A member joined or left (or is reached another way): the controller
    /// starts again over the new members, as after a cluster id change. A
    /// restart lists every member again and writes nothing that is
    /// unchanged, and it is the one path that already starts every
    /// member's watches, probes and lanes together; a fleet's membership
    /// changes weekly, not per second.
    fn restart_with(&mut self, members: Vec<member::Member>) {
        info!(members = ?members.iter().map(|m| m.name.as_str()).collect::<Vec<_>>(), "members changed: restarting the controller");
        self.abort();
        *self = Self::start(self.cfg, self.sup, self.stats.clone(), self.shards.clone(), members);
    }

    /// The members' cluster ids changed: the controller is started again
    /// from complete lists, with the new ids ([`rekey`]).
    fn rekey(&mut self) {
        rekey(&mut self.members, &self.ids.borrow_and_update());
        self.running.abort();
        self.running =
            run_controller(self.cfg, self.sup, &self.members, self.stats.clone(), self.shards.clone());
    }

    fn abort(&self) {
        self.running.abort();
        self.following.abort();
    }
}

/// The task that sends `members`' cluster ids on `tx`, restarted when it
/// ends.
fn follow_ids(
    sup: &Supervisor,
    members: &[member::Member],
    tx: watch::Sender<Vec<ClusterId>>,
) -> JoinHandle<()> {
    let members = members.to_vec();
    sup.restartable(Task::Members, move || member::follow_ids(members.clone(), tx.clone()))
}

/// The controller over `members`. It never returns; if it panics or
/// returns, the process exits and the other replicas (or the restarted
/// Pod) take its shards.
fn run_controller(
    cfg: &SyncConfig,
    sup: &Supervisor,
    members: &[member::Member],
    stats: Arc<SyncStats>,
    shards: Arc<Shards>,
) -> JoinHandle<()> {
    let faults = cfg.faults.clone();
    let links: Vec<Arc<dyn MemberLink>> =
        members.iter().map(|m| Arc::new(KubeLink(m.clone())) as Arc<dyn MemberLink>).collect();
    let syncer = Syncer::new(links, cfg.behaviour.clone(), stats, shards, sup.failures().clone());
    sup.fatal(Task::Controller, async move {
        faults.point(Point::Controller, &[]);
        syncer.run().await;
    })
}

/// Stands for the shards' Leases of `lease` on a thread of its own: the
/// shards this replica may lead, the running election and its status.
pub(super) fn elect(
    lease: &LeaseConfig,
    agent: &str,
    failures: &Arc<Failures>,
) -> Result<(Arc<Shards>, election::Running, Arc<ElectionStatus>), SyncError> {
    let shards = Shards::elected(lease.shards);
    let status = Arc::new(ElectionStatus::default());
    let election = ElectionConfig {
        namespace: lease.namespace.clone(),
        name: lease.name.clone(),
        identity: lease.identity.clone(),
        shards: lease.shards,
        duration: lease.duration,
    };
    info!(lease = %format!("{}/{}", lease.namespace, lease.name), shards = lease.shards, identity = %lease.identity, "standing by for the shards' Leases");
    let connect =
        election::connect_leases(lease.connection.clone(), agent.to_owned(), lease.namespace.clone());
    let running = election::spawn(election, connect, shards.clone(), status.clone(), failures.clone())
        .map_err(SyncError::Thread)?;
    Ok((shards, running, status))
}

/// `/health`, `/ready` and `/metrics` of `process`. `/ready` fails, saying
/// why, while the Leases' cluster cannot be read: such a replica leads
/// nothing.
fn endpoints(cfg: &SyncConfig, process: &Process, election: Option<Arc<ElectionStatus>>) -> Endpoints {
    Endpoints::new(process.registry.clone(), process.failures.clone(), cfg.faults.clone(), move || {
        let why = election.as_ref()?.unreachable()?;
        Some(format!("cannot read the Leases, leading nothing: {why}"))
    })
}

/// Starts the task that joins the members of the ClusterProfiles in
/// `profiles` (beside the `statics` given by --cluster) and sends them on
/// `joined` at each change.
async fn join_profiles(
    cfg: &SyncConfig,
    profiles: &InventoryConfig,
    agent: &str,
    statics: &[member::Member],
    sup: &Supervisor,
    joined: tokio::sync::watch::Sender<Option<Vec<member::Member>>>,
) -> Result<JoinHandle<()>, SyncError> {
    let hub = client::connect(&profiles.hub, agent).await?;
    let health = Arc::new(WatchHealth::new(format!("ClusterProfiles in {} of the hub", profiles.namespace)));
    info!(namespace = %profiles.namespace, providers = ?profiles.providers.names(), "members from ClusterProfiles");
    let how = inventory::JoinAs {
        taken: statics.iter().map(|m| m.name.clone()).collect(),
        agent: agent.to_owned(),
        namespaces: cfg.behaviour.namespaces.clone(),
        limits: cfg.kube_limits,
    };
    let p = profiles.clone();
    Ok(sup.restartable(Task::Members, move || {
        inventory::join(p.clone(), hub.clone(), health.clone(), how.clone(), joined.clone())
    }))
}

/// Says when this replica starts or stops leading (`led` shards now);
/// returns whether it leads.
fn log_leading(led: usize, leading: bool, shards: &Shards) -> bool {
    match (led > 0, leading) {
        (true, false) => info!(shards = led, of = shards.count(), "leading: syncing"),
        (false, true) => warn!("lost the Lease: stopped writing"),
        _ => {}
    }
    led > 0
}

/// The election's refusal, once it ends with one (never without an election).
pub(super) async fn refused(election: &mut Option<election::Running>) -> ElectionError {
    match election {
        Some(e) => e.refused().await,
        None => std::future::pending().await,
    }
}

/// Stops the election: emptying the shards' Leases lets the other replicas
/// take them at once instead of after the lease duration.
pub(super) async fn stop(election: Option<election::Running>) -> Result<(), SyncError> {
    if let Some(e) = election {
        e.stop(RELEASE_WAIT).await;
    }
    Ok(())
}

/// Gives members their new cluster ids. The controller is then started
/// again from complete lists, as after a failover: what it finds under the
/// old id (MCS slices named and labelled by it, import statuses listing it)
/// is no longer wanted and goes, once every member has listed; what did not
/// change is not written again.
fn rekey(members: &mut [member::Member], ids: &[crate::model::ClusterId]) {
    for (m, id) in members.iter_mut().zip(ids) {
        if m.cluster != *id {
            info!(member = %m.name, from = %m.cluster, to = %id, "restarting the controller with the member's new cluster id");
            m.cluster = id.clone();
        }
    }
}
