//! The `sync` command's composition root: connects the members, takes part
//! in leader election, runs the controller only while leading, and serves
//! `/health`, `/ready` and `/metrics`.
//!
//! A replica that loses the Lease stops its controller at once (the task is
//! aborted: every write is idempotent, so stopping anywhere is safe) and the
//! new leader starts from complete lists.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use k8s_openapi::api::coordination::v1::Lease;
use kube_lease_manager::{LeaseManagerBuilder, LeaseManagerError};
use tokio::signal::unix::{SignalKind, signal};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use prometheus::Registry;
use prometheus::proto::MetricType;

use super::Process;
use crate::config::SyncConfig;
use crate::controller::api::{ErrorReason, Kind};
use crate::controller::fence::Fence;
use crate::controller::stats::SyncStats;
use crate::controller::sync::Syncer;
use crate::fault::{Failures, Point, Task};
use crate::fleet::member;
use crate::k8s::client::{self, ClientError};
use crate::k8s::throttle::ThrottleStats;
use crate::k8s::watch::WatchHealth;
use crate::ops::metrics::{self, FamilyDecl, ScrapeCollector};
use crate::supervise::Supervisor;

/// Why `sync` stopped.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// A member or the Lease's cluster could not be reached.
    #[error("{0}")]
    Client(#[from] ClientError),
    /// Leader election failed to start.
    #[error("leader election: {0}")]
    Lease(#[from] LeaseManagerError),
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
    let mut members = member::connect_all(&cfg.members, &cfg.behaviour.namespaces, cfg.kube_limits).await?;
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
    let leading = Arc::new(AtomicBool::new(false));
    let listener = tokio::net::TcpListener::bind(cfg.http_listen).await.map_err(SyncError::Bind)?;
    info!(addr = %listener.local_addr().map_err(SyncError::Bind)?, "HTTP /health /ready /metrics");
    // The probe's health counts as the watches' do: a frozen API server
    // shows in the member's staleness.
    // Every member's write-latency series exists from the start (zero
    // counts), not from its first write.
    for m in &members {
        stats.write_seconds.with_label_values(&[m.name.as_str()]);
    }
    let healths: MemberHealth = members
        .iter()
        .map(|m| {
            let mut health = m.health.clone();
            health.push(m.probe.clone());
            (m.name.clone(), health, m.throttle.clone())
        })
        .collect();
    let failures = process.failures.clone();
    let sup = Supervisor::new(failures.clone());
    process
        .registry
        .register(Box::new(
            sync_collector(stats.clone(), leading.clone(), healths).map_err(SyncError::Metrics)?,
        ))
        .map_err(SyncError::Metrics)?;
    // /health is the liveness probe: its server's death is fatal.
    let _http = sup.fatal(Task::Http, http(listener, process.registry.clone(), failures.clone()));
    // The controller never returns while leading; if it panics or returns,
    // the process exits and the standby (or the restarted Pod) takes over.
    let start_controller = |syncer: SyncerFuture| {
        let faults = cfg.faults.clone();
        sup.fatal(Task::Controller, async move {
            let syncer = syncer.await;
            faults.point(Point::Controller, &[]);
            syncer.run().await;
        })
    };

    let Some(lease) = cfg.lease else {
        info!("no leader election: syncing");
        leading.store(true, Ordering::Relaxed);
        let syncer = |members: &[member::Member]| {
            Box::pin(Syncer::new(
                members.to_vec(),
                cfg.behaviour.clone(),
                stats.clone(),
                Arc::new(Fence::open()),
            )) as SyncerFuture
        };
        let mut controller = start_controller(syncer(&members));
        let failed = loop {
            tokio::select! {
                _ = term.recv() => break None,
                _ = int.recv() => break None,
                reason = failures.wait_fatal() => break Some(reason.to_owned()),
                () = &mut follow => {}
                Ok(()) = ids.changed() => {
                    rekey(&mut members, &ids.borrow_and_update());
                    controller.abort();
                    controller = start_controller(syncer(&members));
                }
            }
        };
        controller.abort();
        return failed.map_or(Ok(()), |r| Err(SyncError::Failed(r)));
    };
    let client = client::connect(&lease.connection).await?;
    // Writes only while the Lease is surely ours: a replica frozen past it
    // sends nothing once it runs again (controller::fence). Polled by this
    // function, as `follow` is, so it cannot die unseen.
    let fence = Arc::new(Fence::closed());
    let mut fencing = Box::pin(fence_on_lease(
        client.clone(),
        lease.namespace.clone(),
        lease.name.clone(),
        lease.identity.clone(),
        fence.clone(),
    ));
    let secs = lease.duration.as_secs();
    let manager = LeaseManagerBuilder::new(client, &lease.name)
        .with_namespace(&lease.namespace)
        .with_identity(&lease.identity)
        .with_duration(secs)
        // Renew a third of the duration before it runs out.
        .with_grace((secs / 3).max(1))
        .with_field_manager(crate::controller::desired::FIELD_MANAGER)
        .build()
        .await?;
    info!(lease = %format!("{}/{}", lease.namespace, lease.name), identity = %lease.identity, "standing by for the Lease");
    let (mut leader, election) = manager.watch().await;
    let mut controller: Option<JoinHandle<()>> = None;
    let mut failed = None;
    loop {
        let is_leader = *leader.borrow_and_update();
        leading.store(is_leader, Ordering::Relaxed);
        match (is_leader, controller.is_some()) {
            (true, false) => {
                info!(identity = %lease.identity, "leading: syncing");
                let syncer =
                    Syncer::new(members.clone(), cfg.behaviour.clone(), stats.clone(), fence.clone());
                controller = Some(start_controller(Box::pin(syncer)));
            }
            (false, true) => {
                warn!(identity = %lease.identity, "lost the Lease: stopped writing");
                if let Some(c) = controller.take() {
                    c.abort();
                }
            }
            _ => {}
        }
        tokio::select! {
            changed = leader.changed() => if changed.is_err() { break },
            () = &mut follow => {}
            () = &mut fencing => {}
            Ok(()) = ids.changed() => {
                rekey(&mut members, &ids.borrow_and_update());
                // Started again at the top of the loop, with the new ids.
                if let Some(c) = controller.take() {
                    c.abort();
                }
            }
            _ = term.recv() => break,
            _ = int.recv() => break,
            reason = failures.wait_fatal() => {
                failed = Some(reason.to_owned());
                break;
            }
        }
    }
    if let Some(c) = controller.take() {
        c.abort();
    }
    // Dropping the receiver makes the election task release the Lease, so a
    // standby takes over at once instead of after the lease duration.
    drop(leader);
    match election.await {
        Ok(Ok(_)) => info!("released the Lease"),
        Ok(Err(e)) => warn!(error = %e, "releasing the Lease failed"),
        Err(e) => warn!(error = %e, "election task ended"),
    }
    failed.map_or(Ok(()), |r| Err(SyncError::Failed(r)))
}

/// How often the Lease is read for the fence: well inside the renewal
/// margin (a third of the lease duration), so a renewal opens the fence
/// again before it closes.
const FENCE_READ: Duration = Duration::from_millis(500);

/// Keeps `fence` open until the Lease's expiry while `identity` holds it,
/// closed while another replica (or none) does; a read that is not answered
/// changes nothing, and the fence runs out by itself. Never returns.
async fn fence_on_lease(
    client: kube::Client,
    namespace: String,
    name: String,
    identity: String,
    fence: Arc<Fence>,
) {
    let api: kube::Api<Lease> = kube::Api::namespaced(client, &namespace);
    loop {
        match tokio::time::timeout(FENCE_READ * 4, api.get_opt(&name)).await {
            Ok(Ok(Some(lease))) => {
                let spec = lease.spec.unwrap_or_default();
                match (spec.holder_identity, spec.renew_time, spec.lease_duration_seconds) {
                    (Some(holder), Some(renewed), Some(secs)) if holder == identity => {
                        fence.held(renewed.0.into(), Duration::from_secs(u64::try_from(secs).unwrap_or(0)));
                    }
                    _ => fence.close(),
                }
            }
            Ok(Ok(None)) => fence.close(),
            Ok(Err(e)) => debug!(error = %e, "cannot read the Lease for the fence"),
            Err(_) => debug!("the Lease read for the fence was not answered"),
        }
        tokio::time::sleep(FENCE_READ).await;
    }
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

/// A controller being made (its first lists), started once made.
type SyncerFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Syncer> + Send>>;

/// Per member: its name, its watches' health, its client's rate limit.
type MemberHealth = Vec<(String, Vec<Arc<WatchHealth>>, Arc<ThrottleStats>)>;

async fn http(listener: tokio::net::TcpListener, registry: Registry, failures: Arc<Failures>) {
    let health = move || {
        let failures = failures.clone();
        async move {
            match failures.fatal_reason() {
                None => (axum::http::StatusCode::OK, "OK".to_owned()),
                Some(r) => (axum::http::StatusCode::INTERNAL_SERVER_ERROR, format!("failed: {r}\n")),
            }
        }
    };
    let app = Router::new().route("/health", get(health)).route("/ready", get(|| async { "OK" })).route(
        "/metrics",
        get(move || {
            let registry = registry.clone();
            async move { metrics::render(&registry) }
        }),
    );
    if let Err(e) = axum::serve(listener, app).await {
        warn!(error = %e, "HTTP server stopped");
    }
}

const SYNC_FAMILIES: &[FamilyDecl] = &[
    (
        "clusterset_dns_sync_leader",
        "1 while this replica holds the Lease and writes.",
        MetricType::GAUGE,
        &[],
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
    leading: Arc<AtomicBool>,
    members: MemberHealth,
) -> Result<ScrapeCollector, prometheus::Error> {
    ScrapeCollector::new(SYNC_FAMILIES, move || {
        let count = |c: &std::sync::atomic::AtomicU64| vec![metrics::counter(&[], c.load(Ordering::Relaxed))];
        vec![
            vec![metrics::gauge(&[], f64::from(u8::from(leading.load(Ordering::Relaxed))))],
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
