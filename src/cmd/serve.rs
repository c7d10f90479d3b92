//! The `serve` command's composition root: reads the sources, starts the
//! store's writer task, binds the listeners, and shuts everything down.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;
use tracing::{error, info, warn};

use super::Process;
use crate::config::ServeConfig;
use crate::fault::{Failures, Faults, Point, Task};
use crate::fleet::member;
use crate::k8s;
use crate::ops::memory::admission::Admission;
use crate::ops::memory::{Guard, OnMemoryLimit, PARSE_BYTES_PER_FILE_BYTE};
use crate::ops::{debug, http, metrics::Metrics};
use crate::source::files::{self, FileSlots, FileSource, LoadError};
use crate::source::objects::ParseError;
use crate::source::{centralized, embedded, kube};
use crate::store::{self, Reader, Relists, SourceId, Update, Writer};
use crate::supervise::Supervisor;
use crate::wire::stats::QueryStats;
use crate::wire::{tcp, udp};

/// Why the server could not start. Each message names what failed (the
/// flag, where there is one) and leaves the cause to the error's source,
/// which the command prints after it (`--objects: /x: No such file…`),
/// so that a cause is said once.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// An objects path could not be read at start.
    #[error("--objects")]
    Objects(#[from] LoadError),
    /// The embedded example does not parse (a build defect).
    #[error("embedded example")]
    Embedded(#[from] ParseError),
    /// No client for the Kubernetes API server could be made.
    #[error(transparent)]
    Kube(#[from] k8s::client::ClientError),
    /// The metrics could not be registered (a build defect).
    #[error("metrics")]
    Metrics(#[from] prometheus::Error),
    /// The first load does not fit the memory limit.
    #[error(transparent)]
    Memory(#[from] crate::ops::memory::OverBudget),
    /// A listen address could not be bound.
    #[error("{flag} {addr}")]
    Bind {
        /// The flag that named it.
        flag: &'static str,
        /// The address.
        addr: SocketAddr,
        /// The error.
        source: io::Error,
    },
}

/// Updates buffered between sources and the writer.
const UPDATE_QUEUE: usize = 4096;
/// Attempts to find a port free for both UDP and TCP when port 0 is asked for.
const PORT_ATTEMPTS: usize = 16;

/// A running server.
pub struct Running {
    /// The bound addresses (UDP and TCP each), ports resolved.
    pub addrs: Vec<SocketAddr>,
    /// The bound HTTP address.
    pub http_addr: SocketAddr,
    /// Read access to the store.
    pub reader: Reader,
    /// Set during lameduck: /ready fails while queries are still answered.
    pub draining: Arc<std::sync::atomic::AtomicBool>,
    /// Panics caught, and the fatal failure once a task that cannot be
    /// restarted died.
    pub failures: Arc<Failures>,
    /// Keeps the writer's queue open while the server runs, even with no
    /// source sending (the embedded example): the writer ending is fatal.
    _updates: mpsc::Sender<Update>,
    reload: Arc<Notify>,
    udp: Vec<udp::UdpWorkers>,
    tasks: Vec<JoinHandle<()>>,
}

impl Running {
    /// Re-reads every objects file now (what SIGHUP does).
    pub fn reload(&self) {
        self.reload.notify_one();
    }

    /// Stops answering and ends every task.
    pub fn stop(self) {
        for t in &self.tasks {
            t.abort();
        }
        for w in self.udp {
            w.stop();
        }
    }
}

/// Loads the sources and starts answering. Returns once every listener is
/// bound and the first snapshot is published.
pub async fn start(cfg: &ServeConfig) -> Result<Running, StartError> {
    start_in(cfg, &Process::new()?).await
}

/// [`start`] as part of `process` (its registry and failures shared with
/// the process's other parts).
pub async fn start_in(cfg: &ServeConfig, process: &Process) -> Result<Running, StartError> {
    let (reader, mut writer) = store::new(cfg.zone.clone());
    let (tx, rx) = mpsc::channel(UPDATE_QUEUE);
    let reload = Arc::new(Notify::new());
    let failures = process.failures.clone();
    let sup = Supervisor::new(failures.clone());
    let mut tasks = Started(Vec::new());

    let guard = cfg.memory.clone().map(|b| Arc::new(Guard::new(b, cfg.on_memory_limit)));
    // How the memory budget asks a source it refused to list again.
    let relists = Relists::default();
    // A changed objects file is weighed by its size before it is read.
    let admit: Option<files::Admit> =
        guard.clone().filter(|g| g.on_limit == OnMemoryLimit::KeepServing).map(|g| {
            Arc::new(move |source: SourceId, file: &std::path::Path, bytes: u64| {
                let needs = bytes.saturating_mul(PARSE_BYTES_PER_FILE_BYTE);
                let what = || format!("objects file {} ({} MiB)", file.display(), bytes.div_ceil(1 << 20));
                g.admit_file(source, what, needs).map_err(|e| e.to_string())
            }) as files::Admit
        });
    let mut healths = Vec::new();
    let mut liveness = None;
    if cfg.objects.is_empty() && cfg.kube.is_none() && cfg.members.is_empty() {
        let parsed = embedded::parse(cfg.interop)?;
        info!(
            objects = parsed.objects.len(),
            "no --objects given: serving the embedded example fleet (zones/)"
        );
        writer.apply(Update::Replace { source: SourceId::Example, objects: parsed.objects });
    } else {
        let mut sources = Vec::new();
        // The configuration holds at most u16::MAX paths: zip takes them all.
        for (path, i) in cfg.objects.iter().zip(0u16..) {
            let mut source = FileSource::new(i, path.clone()).with_interop(cfg.interop);
            if let Some(admit) = &admit {
                source = source.with_admit(admit.clone());
            }
            let (source, loaded) = files::load_blocking(source, true, false).await;
            for update in loaded? {
                writer.apply(update);
            }
            sources.push(source);
        }
        // A restarted watch starts from fresh sources: it re-reads every file.
        let paths: Vec<(PathBuf, FileSlots)> =
            sources.iter().map(|s| (s.path().to_owned(), s.slots())).collect();
        let mut first = Some(sources);
        let (tx, reload, interop, relists) = (tx.clone(), reload.clone(), cfg.interop, relists.clone());
        tasks.push(sup.restartable(Task::Files, move || {
            let sources = first.take().unwrap_or_else(|| {
                let restarted = paths.iter().zip(0u16..);
                restarted
                    .map(|((p, slots), i)| {
                        let s = FileSource::with_slots(i, p.clone(), slots.clone()).with_interop(interop);
                        match &admit {
                            Some(admit) => s.with_admit(admit.clone()),
                            None => s,
                        }
                    })
                    .collect()
            });
            files::watch(sources, tx.clone(), reload.clone(), relists.clone())
        }));
    }
    if let Some(src) = &cfg.kube {
        let client = k8s::client::connect(&src.connection, "serve").await?;
        for watch in kube::watches(src) {
            // Registered before the first publish: not ready until it lists.
            writer.apply(Update::Register(watch.source));
            healths.push(watch.health.clone());
            let (client, tx, relists) = (client.clone(), tx.clone(), relists.clone());
            tasks.push(sup.restartable(Task::Watch, move || {
                kube::run(watch.clone(), client.clone(), tx.clone(), relists.clone())
            }));
        }
    }
    if !cfg.members.is_empty() {
        let members = member::connect_all(&cfg.members, "serve", &[], None).await?;
        let source = SourceId::Members;
        writer.apply(Update::Register(source));
        healths.extend(members.iter().flat_map(|m| m.health.iter().cloned()));
        let state = centralized::Liveness::new(&members);
        liveness = Some(state.clone());
        let (m, dead_after, tx2, s2) = (members.clone(), cfg.cluster_dead_after, tx.clone(), state.clone());
        tasks.push(sup.restartable(Task::Liveness, move || {
            centralized::liveness(m.clone(), dead_after, s2.clone(), tx2.clone())
        }));
        let (tx2, lists, relists) = (tx.clone(), cfg.lists.clone(), relists.clone());
        tasks.push(sup.restartable(Task::Members, move || {
            let to = centralized::To { source, updates: tx2.clone(), relists: relists.clone() };
            centralized::run(members.clone(), lists.clone(), to, state.clone())
        }));
    }
    if let Some(probe) = cfg.probe {
        let (r, tx, faults) = (reader.clone(), tx.clone(), cfg.wire.faults.clone());
        tasks.push(sup.restartable(Task::Probe, move || {
            let (r, tx, faults) = (r.clone(), tx.clone(), faults.clone());
            async move {
                faults.point(Point::Probe, &[]);
                crate::health::probe::run(r, probe, tx).await;
            }
        }));
    }
    let metrics = Arc::new(Metrics::new(&process.registry, healths)?);
    metrics.register_health(reader.clone(), liveness, cfg.metrics_per_service)?;
    metrics.register_memory(guard.clone())?;
    let started = std::time::Instant::now();
    writer.publish();
    metrics.published(&reader.load(), started.elapsed());
    // The objects files are loaded: they must fit before anything is served.
    if let Some(budget) = &cfg.memory {
        budget.check(reader.load().service_count())?;
    }
    // The writer holds every source's objects: nothing can rebuild them in
    // this process, so its death fails the server (Kubernetes restarts it).
    // On an OS thread of its own, not the two-thread runtime: a relist or
    // reload at 100,000 services takes seconds of CPU to apply and build,
    // which would stall TCP answers, /health and every watch meanwhile.
    let (r, m, faults) = (reader.clone(), metrics.clone(), cfg.wire.faults.clone());
    let budget = guard.map(|g| Admission::new(g, relists));
    tasks.push(
        sup.fatal(
            Task::Writer,
            on_own_thread("writer", move || write_loop(writer, rx, r, m, faults, budget)),
        ),
    );

    let http_listener = tokio::net::TcpListener::bind(cfg.http_listen)
        .await
        .map_err(|source| StartError::Bind { flag: "--http-listen", addr: cfg.http_listen, source })?;
    let http_addr = http_listener.local_addr().map_err(|source| StartError::Bind {
        flag: "--http-listen",
        addr: cfg.http_listen,
        source,
    })?;
    let draining = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // `/ready` fails in lameduck (after SIGTERM, while still answering) and
    // until every source has delivered its first complete state.
    let (r, d) = (reader.clone(), draining.clone());
    let unready = move || {
        if d.load(std::sync::atomic::Ordering::Relaxed) {
            Some("shutting down".to_owned())
        } else if !r.load().is_ready() {
            Some("not ready: waiting for the first complete list of every source".to_owned())
        } else {
            None
        }
    };
    let endpoints =
        http::Endpoints::new(process.registry.clone(), failures.clone(), cfg.wire.faults.clone(), unready);
    let debug =
        debug::routes(reader.clone(), metrics.clone(), cfg.wire.debug.clone(), endpoints.exposition());
    let endpoints = endpoints.with(debug);
    // /health is the liveness probe: if its server is gone, so is the
    // process's usefulness; fatal, and Kubernetes restarts the Pod.
    tasks.push(sup.fatal(Task::Http, endpoints.serve(http_listener)));
    info!(addr = %http_addr, "HTTP /health /ready /metrics, /debug/ for --allow-debug");

    let (tcp_cfg, open_files) = tcp::fit_open_files(cfg.tcp, cfg.listen.len());
    if let Some(limit) = open_files {
        warn!(
            open_files = limit,
            tcp_max_connections = tcp_cfg.max_connections,
            "the open files limit leaves room for fewer TCP connections than --tcp-max-connections: \
             serving at most tcp_max_connections at once on each --listen address; raise the \
             limit (ulimit -n, LimitNOFILE=) to serve more"
        );
    }
    if let Some(everyone) = cfg.wire.trust_ecs.iter().find(|n| n.prefix_len() == 0) {
        warn!(
            network = %everyone,
            "--trust-ecs-from trusts a whole address family: any sender of it that puts an EDNS Client \
             Subnet in its query is answered as that subnet's cluster (consumer-clusters, local-first, \
             topology); trust only the resolvers that set the option themselves"
        );
    }
    let mut addrs = Vec::new();
    let mut udp = Vec::new();
    let mut servers = Vec::new();
    let mut workers_alive = Vec::new();
    for &addr in &cfg.listen {
        let stats = Arc::new(QueryStats::default());
        let (workers, listener) = bind_pair(addr, cfg, &reader, &stats, &failures).await?;
        let bound = workers.local_addr;
        servers.push((server_label(bound), stats.clone()));
        workers_alive.push((server_label(bound), workers.alive.clone()));
        let listener = Arc::new(listener);
        let server = tcp::TcpServer::new(reader.clone(), cfg.wire.clone(), tcp_cfg, stats, failures.clone());
        tasks.push(sup.restartable(Task::TcpAccept, move || tcp::serve(listener.clone(), server.clone())));
        udp.push(workers);
        addrs.push(bound);
        info!(addr = %bound, zone = %cfg.zone.origin, udp_workers = cfg.udp_workers, "listening on UDP and TCP");
    }
    metrics.register_queries(cfg.zone.origin.to_string(), servers)?;
    metrics.register_udp_workers(workers_alive)?;
    Ok(Running {
        addrs,
        http_addr,
        reader,
        draining,
        failures,
        _updates: tx,
        reload,
        udp,
        tasks: tasks.keep(),
    })
}

/// The tasks a start has spawned so far. If the start fails midway they
/// are aborted, so that none reports its own end (a writer whose updates
/// stopped) as the failure, after the error that really stopped it.
struct Started(Vec<JoinHandle<()>>);

impl Started {
    fn push(&mut self, task: JoinHandle<()>) {
        self.0.push(task);
    }

    /// The start succeeded: the tasks are the running server's.
    fn keep(mut self) -> Vec<JoinHandle<()>> {
        std::mem::take(&mut self.0)
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// Binds UDP workers and a TCP listener on the same address. With port 0,
/// the UDP side picks the port and TCP takes the same one, retrying when
/// another process holds that port for TCP.
async fn bind_pair(
    addr: SocketAddr,
    cfg: &ServeConfig,
    reader: &Reader,
    stats: &Arc<QueryStats>,
    failures: &Arc<Failures>,
) -> Result<(udp::UdpWorkers, tokio::net::TcpListener), StartError> {
    let fail = |source| StartError::Bind { flag: "--listen", addr, source };
    let mut attempts = if addr.port() == 0 { PORT_ATTEMPTS } else { 1 };
    loop {
        let workers = udp::start(
            addr,
            cfg.udp_workers,
            reader.clone(),
            cfg.wire.clone(),
            stats.clone(),
            failures.clone(),
        )
        .map_err(fail)?;
        match tcp::bind(workers.local_addr).await {
            Ok(listener) => return Ok((workers, listener)),
            Err(e) => {
                workers.stop();
                attempts -= 1;
                if attempts == 0 || e.kind() != io::ErrorKind::AddrInUse {
                    return Err(fail(e));
                }
            }
        }
    }
}

/// CoreDNS's `server` label: `dns://:53` when bound to every address.
fn server_label(addr: SocketAddr) -> String {
    if addr.ip().is_unspecified() { format!("dns://:{}", addr.port()) } else { format!("dns://{addr}") }
}

/// Runs `work` on a new OS thread named `name` and ends when it does; a
/// panic there is a panic here, so the supervisor counts and reports it as
/// the task's own.
async fn on_own_thread(name: &str, work: impl FnOnce() + Send + 'static) {
    let (done, ended) = tokio::sync::oneshot::channel();
    let spawned = std::thread::Builder::new().name(name.to_owned()).spawn(move || {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
        let _ = done.send(result);
    });
    if let Err(e) = spawned {
        error!(thread = name, error = %e, "cannot start the thread");
        return;
    }
    if let Ok(Err(panic)) = ended.await {
        std::panic::resume_unwind(panic);
    }
}

/// The writer: applies updates in batches and publishes once per batch,
/// so a burst of changes costs one snapshot. Blocks its thread.
///
/// With a memory budget, `budget` decides which updates are applied and
/// when a source whose update it refused lists again
/// ([`crate::ops::memory::admission`]); a store over the budget before it
/// was first ready (or with `--on-memory-limit exit`) ends the writer
/// (failing the server, which exits).
fn write_loop(
    mut writer: Writer,
    mut rx: mpsc::Receiver<Update>,
    reader: Reader,
    metrics: Arc<Metrics>,
    faults: Faults,
    mut budget: Option<Admission>,
) {
    let mut was_ready = reader.load().is_ready();
    while let Some(update) = receive(&mut rx, budget.as_mut()) {
        faults.point(Point::Writer, &[]);
        let started = std::time::Instant::now();
        let mut next = Some(update);
        while let Some(update) = next.take().or_else(|| rx.try_recv().ok()) {
            if budget.as_mut().is_some_and(|b| !b.admits(&writer, &update)) {
                writer.refused(&update);
                continue;
            }
            writer.apply(update);
        }
        let published = writer.publish();
        metrics.programmed(writer.take_programmed());
        if published > 0 || writer.is_ready() != was_ready {
            let snap = reader.load();
            metrics.published(&snap, started.elapsed());
            if snap.is_ready() && !was_ready {
                info!(services = snap.service_count(), "every source synced: ready");
            }
            let first = !was_ready;
            was_ready = snap.is_ready();
            if let Some(Err(e)) = budget.as_mut().map(|b| b.published(snap.service_count(), first)) {
                error!(error = %e, "stopping before the kernel's OOM killer does");
                return;
            }
        }
    }
}

/// How often the writer looks for an update while the memory budget
/// refuses updates: it must weigh the store again every
/// [`crate::ops::memory::admission::RECHECK`] even when no update comes,
/// and a blocking receive has no timeout. 10 ms: an update waits at most
/// that long, and looking costs microseconds.
const RECHECK_POLL: std::time::Duration = std::time::Duration::from_millis(10);

/// The next update; `None` once every sender is gone. While the budget
/// refuses updates, it is weighed again on time between updates.
fn receive(rx: &mut mpsc::Receiver<Update>, mut budget: Option<&mut Admission>) -> Option<Update> {
    loop {
        let Some(wait) = budget.as_deref().and_then(Admission::recheck_in) else {
            return rx.blocking_recv();
        };
        match rx.try_recv() {
            Ok(update) => return Some(update),
            Err(mpsc::error::TryRecvError::Disconnected) => return None,
            Err(mpsc::error::TryRecvError::Empty) if wait.is_zero() => {
                if let Some(b) = budget.as_deref_mut() {
                    b.recheck();
                }
            }
            Err(mpsc::error::TryRecvError::Empty) => std::thread::sleep(wait.min(RECHECK_POLL)),
        }
    }
}

/// Runs `serve` until SIGTERM (after the lameduck period) or SIGINT (at
/// once); SIGHUP reloads the objects files.
pub async fn run(cfg: ServeConfig) -> anyhow::Result<()> {
    run_in(cfg, Process::new()?).await
}

/// [`run`] as part of `process`.
pub async fn run_in(cfg: ServeConfig, process: Process) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    // Handlers first: a signal that arrives while starting must not take
    // the default action (exit without lameduck).
    let mut hup = signal(SignalKind::hangup())?;
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let running = start_in(&cfg, &process).await?;
    let failures = running.failures.clone();
    let lameduck = loop {
        tokio::select! {
            reason = failures.wait_fatal() => {
                running.stop();
                anyhow::bail!("{reason}");
            }
            _ = hup.recv() => {
                if cfg.objects.is_empty() {
                    warn!("SIGHUP: nothing to reload (no --objects)");
                } else {
                    info!("SIGHUP: reloading objects files");
                    running.reload();
                }
            }
            _ = term.recv() => break cfg.lameduck,
            _ = int.recv() => break std::time::Duration::ZERO,
        }
    };
    if !lameduck.is_zero() {
        // Kubernetes removes a Pod from its Service's endpoints some time
        // after SIGTERM; answering until then loses no query.
        running.draining.store(true, std::sync::atomic::Ordering::Relaxed);
        info!(seconds = lameduck.as_secs_f64(), "lameduck: still answering while /ready fails");
        tokio::select! {
            _ = tokio::time::sleep(lameduck) => {}
            _ = term.recv() => info!("second signal: stopping now"),
            _ = int.recv() => info!("second signal: stopping now"),
        }
    }
    info!("shutting down");
    running.stop();
    Ok(())
}
