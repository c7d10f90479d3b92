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
use std::sync::atomic::Ordering;

use arc_swap::ArcSwap;
use tokio::signal::unix::{SignalKind, signal};
use tracing::{info, warn};

use prometheus::proto::MetricType;

use super::Process;
use crate::config::SyncConfig;
use crate::controller::api::{ErrorReason, Kind};
use crate::controller::election::{ElectionConfig, ElectionError, ElectionStatus, Elector, KubeLeases};
use crate::controller::shard::Shards;
use crate::controller::stats::SyncStats;
use crate::controller::sync::Syncer;
use crate::fault::{Point, Task};
use crate::fleet::{inventory, member};
use crate::k8s::client::{self, ClientError};
use crate::k8s::throttle::ThrottleStats;
use crate::k8s::watch::WatchHealth;
use crate::ops::http::serve_probes;
use crate::ops::metrics::{self, FamilyDecl, ScrapeCollector};
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
    for h in [
        Box::new(stats.reconcile_seconds.clone()) as Box<dyn prometheus::core::Collector>,
        Box::new(stats.write_seconds.clone()),
    ] {
        process.registry.register(h).map_err(SyncError::Metrics)?;
    }
    let listener = tokio::net::TcpListener::bind(cfg.http_listen).await.map_err(SyncError::Bind)?;
    info!(addr = %listener.local_addr().map_err(SyncError::Bind)?, "HTTP /health /ready /metrics");
    // Every member's write-latency series exists from the start (zero
    // counts), not from its first write.
    for m in &members {
        stats.write_seconds.with_label_values(&[m.name.as_str()]);
    }
    let healths = Arc::new(ArcSwap::from_pointee(member_health(&members)));
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
    process
        .registry
        .register(Box::new(
            sync_collector(stats.clone(), shards.clone(), healths.clone()).map_err(SyncError::Metrics)?,
        ))
        .map_err(SyncError::Metrics)?;
    let election_status = elector.as_ref().map(|(_, s)| s.clone());
    // /health is the liveness probe: its server's death is fatal.
    let _http =
        // `/ready` fails, saying why, while the Leases' cluster cannot be
        // read: such a replica leads nothing.
        sup.fatal(
            Task::Http,
            serve_probes(listener, process.registry.clone(), failures.clone(), move || {
                let why = election_status.as_ref()?.unreachable()?;
                Some(format!("cannot read the Leases, leading nothing: {why}"))
            }),
        );
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
                    let gone: Vec<String> = members.iter().map(|m| m.name.clone()).collect();
                    members = statics.iter().cloned().chain(joined.members().cloned()).collect();
                    for name in gone.iter().filter(|n| !members.iter().any(|m| &m.name == *n)) {
                        let _ = stats.write_seconds.remove_label_values(&[name.as_str()]);
                    }
                    for m in &members {
                        stats.write_seconds.with_label_values(&[m.name.as_str()]);
                    }
                    healths.store(Arc::new(member_health(&members)));
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

/// Per member: its name, its watches' health, its client's rate limit.
type MemberHealth = Vec<(String, Vec<Arc<WatchHealth>>, Arc<ThrottleStats>)>;

/// The probe's health counts as the watches' do (a frozen API server shows
/// in the member's staleness), and so does its ClusterProfile's mark.
fn member_health(members: &[member::Member]) -> MemberHealth {
    members
        .iter()
        .map(|m| {
            let mut health = m.health.clone();
            health.push(m.probe.clone());
            health.push(m.inventory.clone());
            (m.name.clone(), health, m.throttle.clone())
        })
        .collect()
}

const SYNC_FAMILIES: &[FamilyDecl] = &[
    (
        "clusterset_dns_sync_leader",
        "1 while this replica leads a shard (with --shards 1: holds the Lease) and writes.",
        MetricType::GAUGE,
        &[],
    ),
    (
        "clusterset_dns_sync_shard_leader",
        "1 for each shard (of --shards) this replica leads.",
        MetricType::GAUGE,
        &["shard"],
    ),
    (
        "clusterset_dns_sync_writes_total",
        "API writes (apply, delete) made by the controller.",
        MetricType::COUNTER,
        &[],
    ),
    ("clusterset_dns_sync_reads_total", "API reads (list, get).", MetricType::COUNTER, &[]),
    (
        "clusterset_dns_sync_unchanged_total",
        "Writes skipped because the object was already as wanted.",
        MetricType::COUNTER,
        &[],
    ),
    ("clusterset_dns_sync_reconciles_total", "Services reconciled.", MetricType::COUNTER, &[]),
    (
        "clusterset_dns_sync_conflicts",
        "Services whose exports conflict now (their ServiceExports carry Conflict=True; the oldest export's spec wins).",
        MetricType::GAUGE,
        &[],
    ),
    (
        "clusterset_dns_sync_errors_total",
        "Failed reconciles of a service, by reason (throttled, forbidden, conflict, invalid, server, unreachable, fenced: not sent, the Lease may have run out); each is retried with its own exponential backoff.",
        MetricType::COUNTER,
        &["reason"],
    ),
    (
        "clusterset_dns_sync_queue_depth",
        "Services waiting to be reconciled (changed, at startup, or touched while being reconciled); retries waiting out their backoff are not counted.",
        MetricType::GAUGE,
        &[],
    ),
    (
        "clusterset_dns_sync_drift_repaired_total",
        "Objects of ours found changed or deleted by someone else (live, by a watch, or at start and resync) and written again, by kind.",
        MetricType::COUNTER,
        &["kind"],
    ),
    (
        "clusterset_dns_sync_member_stale_seconds",
        "Seconds since a member's API last answered its watches or the controller's probe (0 while healthy); its endpoints are kept meanwhile unless --on-member-lost=remove.",
        MetricType::GAUGE,
        &["member"],
    ),
    (
        "clusterset_dns_sync_client_throttled_total",
        "Requests to a member's API server that waited for the client-side rate limit (--kube-qps, --kube-burst).",
        MetricType::COUNTER,
        &["member"],
    ),
    (
        "clusterset_dns_sync_client_throttled_seconds_total",
        "Time requests to a member's API server waited for the client-side rate limit, summed.",
        MetricType::COUNTER,
        &["member"],
    ),
];

/// The controller's metrics, read from its counters at every scrape.
fn sync_collector(
    s: Arc<SyncStats>,
    shards: Arc<Shards>,
    members: Arc<ArcSwap<MemberHealth>>,
) -> Result<ScrapeCollector, prometheus::Error> {
    ScrapeCollector::new(SYNC_FAMILIES, move || {
        let members = members.load();
        let count = |c: &std::sync::atomic::AtomicU64| vec![metrics::counter(&[], c.load(Ordering::Relaxed))];
        vec![
            vec![metrics::gauge(&[], f64::from(u8::from(shards.led_count() > 0)))],
            (0..shards.count() as usize)
                .map(|i| metrics::gauge(&[("shard", &i.to_string())], f64::from(u8::from(shards.leads(i)))))
                .collect(),
            count(&s.writes),
            count(&s.reads),
            count(&s.unchanged),
            count(&s.reconciles),
            vec![metrics::gauge(&[], s.conflicts.load(Ordering::Relaxed) as f64)],
            ErrorReason::ALL
                .iter()
                .zip(&s.errors)
                .map(|(r, c)| metrics::counter(&[("reason", r.as_str())], c.load(Ordering::Relaxed)))
                .collect(),
            vec![metrics::gauge(&[], s.queue_depth.load(Ordering::Relaxed) as f64)],
            Kind::ALL
                .iter()
                .zip(&s.drift_repaired)
                .map(|(k, c)| metrics::counter(&[("kind", k.as_str())], c.load(Ordering::Relaxed)))
                .collect(),
            members
                .iter()
                .map(|(name, health, _)| {
                    let stale = health.iter().map(|h| h.stale_seconds()).fold(0.0, f64::max);
                    metrics::gauge(&[("member", name)], stale)
                })
                .collect(),
            members
                .iter()
                .map(|(name, _, t)| {
                    metrics::counter(&[("member", name)], t.throttled.load(Ordering::Relaxed))
                })
                .collect(),
            members
                .iter()
                .map(|(name, _, t)| metrics::counter_f64(&[("member", name)], t.waited_seconds()))
                .collect(),
        ]
    })
}
