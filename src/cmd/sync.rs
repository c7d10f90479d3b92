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

use tokio::signal::unix::{SignalKind, signal};
use tracing::{info, warn};

use super::Process;
use crate::config::SyncConfig;
use crate::controller::election::{ElectionConfig, ElectionError, ElectionStatus, Elector, KubeLeases};
use crate::controller::shard::Shards;
use crate::controller::stats::SyncStats;
use crate::controller::sync::Syncer;
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
}

/// Runs the controller until SIGTERM or SIGINT.
pub async fn run(cfg: SyncConfig) -> Result<(), SyncError> {
    run_in(cfg, Process::new().map_err(SyncError::Metrics)?).await
}

/// [`run`] as part of `process` (its registry and failures shared).
pub async fn run_in(cfg: SyncConfig, process: Process) -> Result<(), SyncError> {
    let mut term = signal(SignalKind::terminate()).map_err(SyncError::Signal)?;
    let mut int = signal(SignalKind::interrupt()).map_err(SyncError::Signal)?;
    let agent = match &cfg.lease {
        Some(lease) => format!("sync/{}", lease.identity),
        None => "sync".to_owned(),
    };
    let statics =
        member::connect_all(&cfg.members, &agent, &cfg.behaviour.namespaces, cfg.kube_limits).await?;
    let static_names: Vec<String> = statics.iter().map(|m| m.name.clone()).collect();
    // Members of the ClusterProfiles (--cluster-profiles), followed by this
    // function as `follow` is. The controller starts after their first list,
    // so it does not start once without them.
    let (profiles_tx, mut profiles) = tokio::sync::watch::channel(None);
    let mut joined = inventory::Joined::default();
    let mut inventory_follow: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> = match &cfg
        .profiles
    {
        None => Box::pin(std::future::pending()),
        Some(p) => {
            let hub = client::connect(&p.hub, &agent).await?;
            let health = Arc::new(WatchHealth::new(format!("ClusterProfiles in {} of the hub", p.namespace)));
            info!(namespace = %p.namespace, providers = ?p.providers.names(), "members from ClusterProfiles");
            Box::pin(inventory::follow(p.clone(), hub, health, profiles_tx))
        }
    };
    if cfg.profiles.is_some() {
        loop {
            tokio::select! {
                _ = term.recv() => return Ok(()),
                _ = int.recv() => return Ok(()),
                () = &mut inventory_follow => {}
                Ok(()) = profiles.changed() => if profiles.borrow_and_update().is_some() { break },
            }
        }
        let now = profiles.borrow().clone().unwrap_or_default();
        joined.update(&now, &static_names, &agent, &cfg.behaviour.namespaces, cfg.kube_limits).await;
    }
    let mut members: Vec<member::Member> = statics.iter().cloned().chain(joined.members().cloned()).collect();
    // Members' cluster ids follow their ClusterProperties. Polled by this
    // function, not a task of its own: it never ends, and a panic in it ends
    // `run_in`, so it cannot die unseen.
    let (ids_tx, mut ids) = tokio::sync::watch::channel(Vec::new());
    let mut follow = Box::pin(member::follow_ids(members.clone(), ids_tx));
    let stats = Arc::new(SyncStats::new().map_err(SyncError::Metrics)?);
    stats.set_members(&members);
    let listener = tokio::net::TcpListener::bind(cfg.http_listen).await.map_err(SyncError::Bind)?;
    info!(addr = %listener.local_addr().map_err(SyncError::Bind)?, "HTTP /health /ready /metrics");
    let (shards, mut elector) = match &cfg.lease {
        None => {
            info!("no leader election: syncing every service");
            (Shards::alone(), None)
        }
        Some(lease) => {
            let shards = Shards::elected(lease.shards);
            let status = Arc::new(ElectionStatus::default());
            let api = Arc::new(KubeLeases::new(
                client::connect(&lease.connection, &agent).await?,
                &lease.namespace,
            ));
            let election = ElectionConfig {
                namespace: lease.namespace.clone(),
                name: lease.name.clone(),
                identity: lease.identity.clone(),
                shards: lease.shards,
                duration: lease.duration,
            };
            info!(lease = %format!("{}/{}", lease.namespace, lease.name), shards = lease.shards, identity = %lease.identity, "standing by for the shards' Leases");
            (shards.clone(), Some((Elector::new(election, api, shards, status.clone()), status)))
        }
    };
    let failures = process.failures.clone();
    let sup = Supervisor::new(failures.clone());
    stats.register(&process.registry, shards.clone()).map_err(SyncError::Metrics)?;
    let election_status = elector.as_ref().map(|(_, s)| s.clone());
    // `/ready` fails, saying why, while the Leases' cluster cannot be
    // read: such a replica leads nothing.
    let endpoints =
        Endpoints::new(process.registry.clone(), failures.clone(), cfg.faults.clone(), move || {
            let why = election_status.as_ref()?.unreachable()?;
            Some(format!("cannot read the Leases, leading nothing: {why}"))
        });
    // /health is the liveness probe: its server's death is fatal.
    let _http = sup.fatal(Task::Http, endpoints.serve(listener));
    // The controller never returns; if it panics or returns, the process
    // exits and the other replicas (or the restarted Pod) take its shards.
    let start_controller = |members: &[member::Member]| {
        let faults = cfg.faults.clone();
        let syncer = Syncer::new(members.to_vec(), cfg.behaviour.clone(), stats.clone(), shards.clone());
        sup.fatal(Task::Controller, async move {
            let syncer = syncer.await;
            faults.point(Point::Controller, &[]);
            syncer.run().await;
        })
    };
    let mut controller = start_controller(&members);
    let mut led = shards.led();
    let mut leading = false;
    let mut failed = None;
    {
        // The election is polled by this function, as `follow` is: it
        // cannot die unseen. Without one, it never ends.
        let mut electing = std::pin::pin!(async {
            match elector.as_mut() {
                Some((e, _)) => e.run().await,
                None => std::future::pending().await,
            }
        });
        loop {
            tokio::select! {
                _ = term.recv() => break,
                _ = int.recv() => break,
                reason = failures.wait_fatal() => {
                    failed = Some(SyncError::Failed(reason.to_owned()));
                    break;
                }
                e = &mut electing => {
                    failed = Some(SyncError::Election(e));
                    break;
                }
                () = &mut follow => {}
                () = &mut inventory_follow => {}
                Ok(()) = profiles.changed() => {
                    let now = profiles.borrow_and_update().clone().unwrap_or_default();
                    let ns = &cfg.behaviour.namespaces;
                    if !joined.update(&now, &static_names, &agent, ns, cfg.kube_limits).await {
                        continue;
                    }
                    // A member joined or left (or is reached another way):
                    // the controller starts again over the new members, as
                    // after a cluster id change. A restart lists every member
                    // again and writes nothing that is unchanged, and it is
                    // the one path that already starts every member's
                    // watches, probes and lanes together; a fleet's
                    // membership changes weekly, not per second.
                    members = statics.iter().cloned().chain(joined.members().cloned()).collect();
                    stats.set_members(&members);
                    info!(members = ?members.iter().map(|m| m.name.as_str()).collect::<Vec<_>>(), "members changed: restarting the controller");
                    let (ids_tx, ids_rx) = tokio::sync::watch::channel(Vec::new());
                    ids = ids_rx;
                    follow = Box::pin(member::follow_ids(members.clone(), ids_tx));
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
    }
    controller.abort();
    // Emptying the shards' Leases lets the other replicas take them at
    // once instead of after the lease duration.
    if let Some((e, _)) = elector.as_mut() {
        e.release().await;
    }
    failed.map_or(Ok(()), Err)
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
