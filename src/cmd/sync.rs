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

use tokio::signal::unix::{SignalKind, signal};
use tracing::{info, warn};

use super::Process;
use crate::config::SyncConfig;
use crate::controller::election::{self, ElectionConfig, ElectionError, ElectionStatus};
use crate::controller::link::{KubeLink, MemberLink};
use crate::controller::shard::Shards;
use crate::controller::stats::SyncStats;
use crate::controller::syncer::Syncer;
use crate::fault::{Point, Task};
use crate::fleet::{inventory, member};
use crate::k8s::client::{self, ClientError};
use crate::k8s::watch::WatchHealth;
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
                election::connect_leases(lease.connection.clone(), agent.clone(), lease.namespace.clone());
            let running =
                election::spawn(election, connect, shards.clone(), status.clone(), failures.clone())
                    .map_err(SyncError::Thread)?;
            (shards, Some(running), Some(status))
        }
    };
    stats.register(&process.registry, shards.clone(), status.clone()).map_err(SyncError::Metrics)?;
    // `/ready` fails, saying why, while the Leases' cluster cannot be
    // read: such a replica leads nothing.
    let election_status = status.clone();
    let endpoints =
        Endpoints::new(process.registry.clone(), failures.clone(), cfg.faults.clone(), move || {
            let why = election_status.as_ref()?.unreachable()?;
            Some(format!("cannot read the Leases, leading nothing: {why}"))
        });
    // /health is the liveness probe: its server's death is fatal.
    let _http = sup.fatal(Task::Http, endpoints.serve(listener));
    let static_names: Vec<String> = statics.iter().map(|m| m.name.clone()).collect();
    // Members of the ClusterProfiles (--cluster-profiles), joined by a task
    // of their own; the controller starts after their first list, so it
    // does not start once without them.
    let (joined_tx, mut joined) = tokio::sync::watch::channel(None);
    let _joining = match &cfg.profiles {
        None => None,
        Some(p) => {
            let hub = client::connect(&p.hub, &agent).await?;
            let health = Arc::new(WatchHealth::new(format!("ClusterProfiles in {} of the hub", p.namespace)));
            info!(namespace = %p.namespace, providers = ?p.providers.names(), "members from ClusterProfiles");
            let how = inventory::JoinAs {
                taken: static_names.clone(),
                agent: agent.clone(),
                namespaces: cfg.behaviour.namespaces.clone(),
                limits: cfg.kube_limits,
            };
            let (p, joined_tx) = (p.clone(), joined_tx.clone());
            Some(sup.restartable(Task::Members, move || {
                inventory::join(p.clone(), hub.clone(), health.clone(), how.clone(), joined_tx.clone())
            }))
        }
    };
    if cfg.profiles.is_some() {
        loop {
            tokio::select! {
                _ = term.recv() => return stop(election).await,
                _ = int.recv() => return stop(election).await,
                reason = failures.wait_fatal() => {
                    let reason = reason.to_owned();
                    stop(election).await?;
                    return Err(SyncError::Failed(reason));
                }
                Ok(()) = joined.changed() => if joined.borrow_and_update().is_some() { break },
            }
        }
    }
    let with_joined = |joined: &Option<Vec<member::Member>>| -> Vec<member::Member> {
        statics.iter().cloned().chain(joined.iter().flatten().cloned()).collect()
    };
    let mut members = with_joined(&joined.borrow());
    stats.set_members(&members);
    // Members' cluster ids follow their ClusterProperties, in a task
    // restarted with the members.
    let (ids_tx, mut ids) = tokio::sync::watch::channel(Vec::new());
    let follow_ids = |members: &[member::Member],
                      tx: tokio::sync::watch::Sender<Vec<crate::model::ClusterId>>| {
        let members = members.to_vec();
        sup.restartable(Task::Members, move || member::follow_ids(members.clone(), tx.clone()))
    };
    let mut following = follow_ids(&members, ids_tx);
    // The controller never returns; if it panics or returns, the process
    // exits and the other replicas (or the restarted Pod) take its shards.
    let start_controller = |members: &[member::Member]| {
        let faults = cfg.faults.clone();
        let links: Vec<Arc<dyn MemberLink>> =
            members.iter().map(|m| Arc::new(KubeLink(m.clone())) as Arc<dyn MemberLink>).collect();
        let syncer =
            Syncer::new(links, cfg.behaviour.clone(), stats.clone(), shards.clone(), failures.clone());
        sup.fatal(Task::Controller, async move {
            faults.point(Point::Controller, &[]);
            syncer.run().await;
        })
    };
    let mut controller = start_controller(&members);
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
                // A member joined or left (or is reached another way): the
                // controller starts again over the new members, as after a
                // cluster id change. A restart lists every member again and
                // writes nothing that is unchanged, and it is the one path
                // that already starts every member's watches, probes and
                // lanes together; a fleet's membership changes weekly, not
                // per second.
                members = with_joined(&joined.borrow_and_update());
                stats.set_members(&members);
                info!(members = ?members.iter().map(|m| m.name.as_str()).collect::<Vec<_>>(), "members changed: restarting the controller");
                let (ids_tx, ids_rx) = tokio::sync::watch::channel(Vec::new());
                ids = ids_rx;
                following.abort();
                following = follow_ids(&members, ids_tx);
                controller.abort();
                controller = start_controller(&members);
            }
            Ok(()) = led.changed() => {
                let n = led.borrow_and_update().iter().filter(|l| **l).count();
                match (n > 0, leading) {
                    (true, false) => info!(shards = n, of = shards.count(), "leading: syncing"),
                    (false, true) => warn!("lost the Lease: stopped writing"),
                    _ => {}
                }
                leading = n > 0;
            }
            Ok(()) = ids.changed() => {
                rekey(&mut members, &ids.borrow_and_update());
                // Started again from complete lists, with the new ids.
                controller.abort();
                controller = start_controller(&members);
            }
        }
    }
    controller.abort();
    following.abort();
    stop(election).await?;
    failed.map_or(Ok(()), Err)
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
