//! The UDP path: one SO_REUSEPORT socket and one OS thread per worker, each
//! a blocking loop of receive a batch → answer each → send the batch
//! (`mmsg`). The kernel spreads clients over the sockets; workers share
//! nothing but the snapshot pointer and reuse their buffers, so a query
//! takes no lock and allocates nothing.

mod mmsg;

use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};
use tracing::{debug, error, warn};

use super::stats::{Arrival, Limited, LocalStats, Outcome, QueryStats};
use super::{Scratch, Transport, WireConfig, respond_from};
use crate::fault::{Failures, Point, Task, panic_message};
use crate::store::{AnswerStats, Reader, Snapshot};

/// How often an idle worker looks at the stop flag.
const STOP_POLL: Duration = Duration::from_millis(200);
/// A worker adds its counts to the shared metrics at least this often…
const FLUSH_EVERY: Duration = Duration::from_secs(1);
/// …or after this many queries, whichever comes first.
const FLUSH_EVERY_QUERIES: usize = 4096;
/// Kernel receive buffer per socket: absorbs bursts while a worker is busy.
const RECV_BUFFER: usize = 4 << 20;

/// Running UDP workers; [`UdpWorkers::stop`] ends them.
pub struct UdpWorkers {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    /// The bound address (the port is resolved when 0 was asked for).
    pub local_addr: SocketAddr,
    /// Worker threads running their loop now (`clusterset_dns_udp_workers`):
    /// a thread leaves it only when stopped, or if it dies despite the
    /// restart on panic.
    pub alive: Arc<AtomicUsize>,
}

/// Counts a worker thread in [`UdpWorkers::alive`] while it lives, however it ends.
struct Alive(Arc<AtomicUsize>);

impl Alive {
    fn new(count: Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Self(count)
    }
}

impl Drop for Alive {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Binds `workers` sockets on `addr` and starts one thread per socket; they
/// count what they answer into `stats`.
///
/// A panic while answering one query loses that query only: it is caught,
/// counted in `failures` (task `udp`), and the worker goes on with fresh
/// buffers. A panic anywhere else in the loop restarts the loop on the same
/// socket. So no packet can take a worker, and with it a share of the
/// clients the kernel hashes to its socket, away for good.
pub fn start(
    addr: SocketAddr,
    workers: usize,
    reader: Reader,
    cfg: WireConfig,
    stats: Arc<QueryStats>,
    failures: Arc<Failures>,
) -> io::Result<UdpWorkers> {
    let stop = Arc::new(AtomicBool::new(false));
    let alive = Arc::new(AtomicUsize::new(0));
    let first = bind(addr)?;
    // With port 0, the first socket picks the port and the rest join it.
    let local_addr = first.local_addr()?;
    let mut sockets = vec![first];
    for _ in 1..workers.max(1) {
        sockets.push(bind(local_addr)?);
    }
    let threads = sockets
        .into_iter()
        .enumerate()
        .map(|(i, socket)| {
            let (reader, stop, stats, cfg, failures) =
                (reader.clone(), stop.clone(), stats.clone(), cfg.clone(), failures.clone());
            let alive = Alive::new(alive.clone());
            std::thread::Builder::new().name(format!("udp-{i}")).spawn(move || {
                let _alive = alive;
                loop {
                    let run = catch_unwind(AssertUnwindSafe(|| {
                        serve(&socket, &reader, &cfg, &stats, &stop, &failures)
                    }));
                    match run {
                        Ok(()) => break,
                        Err(payload) => {
                            failures.panicked(Task::Udp);
                            error!(
                                worker = i,
                                panic = panic_message(&*payload),
                                "UDP worker panicked; restarting it on the same socket"
                            );
                        }
                    }
                }
            })
        })
        .collect::<io::Result<_>>()?;
    Ok(UdpWorkers { stop, threads, local_addr, alive })
}

impl UdpWorkers {
    /// Stops the workers and waits for them.
    pub fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

fn bind(addr: SocketAddr) -> io::Result<UdpSocket> {
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    socket.set_reuse_port(true)?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    if let Err(e) = socket.set_recv_buffer_size(RECV_BUFFER) {
        debug!(error = %e, "could not enlarge the UDP receive buffer");
    }
    socket.bind(&addr.into())?;
    socket.set_read_timeout(Some(STOP_POLL))?;
    Ok(socket.into())
}

fn serve(
    socket: &UdpSocket,
    reader: &Reader,
    cfg: &WireConfig,
    stats: &QueryStats,
    stop: &AtomicBool,
    failures: &Failures,
) {
    let fd = socket.as_raw_fd();
    let family = usize::from(socket.local_addr().is_ok_and(|a| a.is_ipv6()));
    let arrival = Arrival { proto: 0, family };
    let Batch { mut queries, mut lens, mut peers, mut responses, mut to } = Batch::new();
    let mut scratch = Scratch::default();
    let mut local = LocalStats::default();
    // The zone, and so its answer counters, is the same in every snapshot.
    let answers = reader.load().zone().answer_stats.clone();
    let mut last_flush = Instant::now();
    let mut pending = 0;
    while !stop.load(Ordering::Relaxed) {
        let n = match mmsg::recv(fd, &mut queries, &mut lens, &mut peers) {
            Ok(n) => n,
            Err(e) if idle(&e) => {
                if pending > 0 {
                    flush_counts(&mut local, &mut scratch, stats, &answers);
                    pending = 0;
                }
                continue;
            }
            Err(e) => {
                // ICMP errors from earlier sends surface here on Linux; they
                // concern one client, not the socket.
                debug!(error = %e, "UDP receive error");
                continue;
            }
        };
        let received = Instant::now();
        cfg.faults.point(Point::UdpLoop, &[]);
        let mut m = 0;
        let (mut answered, mut in_zone) = (0, 0);
        {
            let snap = reader.load();
            for i in (0..n).filter(|&i| lens[i] > 0) {
                let query = &queries[i][..lens[i]];
                let peer = peers[i].ip();
                let Some(outcome) =
                    answer_one(&snap, query, peer, cfg, &mut scratch, &mut responses[m], failures)
                else {
                    continue;
                };
                local.record(&outcome, arrival, query.len(), responses[m].len());
                answered += 1;
                in_zone += u64::from(outcome.in_zone);
                if outcome.limited != Limited::Dropped {
                    to[m] = peers[i];
                    m += 1;
                }
            }
        }
        send_all(fd, &responses[..m], &to[..m]);
        // Every query of the batch waited for the whole batch.
        let now = Instant::now();
        let took = now - received;
        local.record_duration(true, in_zone, took);
        local.record_duration(false, answered - in_zone, took);
        pending += m;
        if pending >= FLUSH_EVERY_QUERIES || now - last_flush >= FLUSH_EVERY {
            flush_counts(&mut local, &mut scratch, stats, &answers);
            last_flush = now;
            pending = 0;
        }
    }
    flush_counts(&mut local, &mut scratch, stats, &answers);
    if let Ok(addr) = socket.local_addr() {
        debug!(%addr, "UDP worker stopped");
    } else {
        warn!("UDP worker stopped");
    }
}

/// One batch's buffers, kept by a worker for its life: the queries as
/// received (lengths, senders), the responses and whom they go to.
struct Batch {
    queries: Vec<[u8; mmsg::MAX_QUERY]>,
    lens: [usize; mmsg::BATCH],
    peers: [mmsg::Peer; mmsg::BATCH],
    responses: Vec<Vec<u8>>,
    to: [mmsg::Peer; mmsg::BATCH],
}

impl Batch {
    fn new() -> Self {
        use mmsg::{BATCH, MAX_QUERY, Peer};
        Self {
            queries: vec![[0u8; MAX_QUERY]; BATCH],
            lens: [0; BATCH],
            peers: [Peer::default(); BATCH],
            // UDP responses never exceed --max-udp-payload (at most 4096
            // bytes), so these buffers are never grown.
            responses: (0..BATCH).map(|_| Vec::with_capacity(MAX_QUERY)).collect(),
            to: [Peer::default(); BATCH],
        }
    }
}

/// Adds the worker's query counts and answer counts to the shared metrics.
fn flush_counts(local: &mut LocalStats, scratch: &mut Scratch, stats: &QueryStats, answers: &AnswerStats) {
    local.flush(stats);
    scratch.flush_answers(answers);
}

/// A receive that found nothing to read (the stop poll's timeout) or was
/// interrupted: not an error.
fn idle(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted)
}

/// Answers one query into `out`. A panic (a bug) is counted for the
/// worker's task and the query gets no answer; the worker goes on with
/// fresh scratch buffers.
#[inline]
fn answer_one(
    snap: &Snapshot,
    query: &[u8],
    peer: Option<IpAddr>,
    cfg: &WireConfig,
    scratch: &mut Scratch,
    out: &mut Vec<u8>,
    failures: &Failures,
) -> Option<Outcome> {
    match catch_unwind(AssertUnwindSafe(|| {
        respond_from(snap, query, peer, Transport::Udp, cfg, scratch, out)
    })) {
        Ok(outcome) => outcome,
        Err(_) => {
            // Logged by the panic hook.
            failures.panicked(Task::Udp);
            *scratch = Scratch::default();
            None
        }
    }
}

/// Sends each response to its peer, in as few system calls as the kernel
/// allows; one the kernel refuses is dropped (it concerns one client).
fn send_all(fd: RawFd, responses: &[Vec<u8>], to: &[mmsg::Peer]) {
    let mut sent = 0;
    while sent < responses.len() {
        match mmsg::send(fd, &responses[sent..], &to[sent..]) {
            Ok(0) => break,
            Ok(k) => sent += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                debug!(error = %e, "UDP send failed; dropping that response");
                sent += 1;
            }
        }
    }
}
