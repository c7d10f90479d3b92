//! The TCP path (RFC 7766): length-prefixed messages, several per connection
//! (pipelined, answered in order), and the limits that keep a flood of slow
//! or idle clients from starving everyone else:
//!
//! - an idle timeout between messages, and an I/O timeout for the rest of a
//!   message once its first byte came and for writing the response, so a
//!   client sending a byte at a time or never reading holds a connection
//!   for at most that long;
//! - a cap per client address, beyond which new connections are closed at
//!   once;
//! - a cap on connections open at once. The accept loop never waits for a
//!   slot: a slow client would then hold a fresh one back for up to a
//!   timeout, and the kernel drops new clients' SYNs once its accept queue
//!   behind the loop fills. Past the cap, each new connection is taken and
//!   one open connection is closed to make room (RFC 7766 §6.2.3): one
//!   waiting for its client (idle, or in the middle of a message) before
//!   one being answered, from the address holding the most connections,
//!   the longest waiting. A fresh client, one connection that has just
//!   arrived, is the last such choice. The cap is fitted to the open files
//!   limit at start ([`fit_open_files`]), so that accept() does not fail
//!   below it. Each connection closed so is counted
//!   (`clusterset_dns_tcp_connections_shed_total{server}`); shedding is
//!   logged at most every 10 s, with the number shed since.
//!
//! A panic while serving one connection closes that connection only; it is
//! counted (task `tcp`).

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::FutureExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tracing::{debug, info, warn};

use super::stats::{Arrival, LocalStats, QueryStats, TransferAsk};
use super::transfer::Transfer;
use super::{Scratch, Transport, WireConfig, respond_from};
use crate::fault::{Failures, Point, Task};
use crate::store::Reader;

/// TCP settings.
#[derive(Debug, Clone, Copy)]
pub struct TcpConfig {
    /// A connection with no message started for this long is closed.
    pub idle_timeout: Duration,
    /// Once a message's first byte arrived, the rest must arrive within
    /// this long; a response must be written within it too.
    pub io_timeout: Duration,
    /// Connections open at once; past it, each new connection closes an
    /// open one (the module's documentation says which).
    pub max_connections: usize,
    /// Connections open at once from one client address; more are closed.
    pub max_per_client: usize,
}

/// Connections asked to close that may still be open (their tasks not yet
/// run) before new connections are refused rather than taken: bounds the
/// file descriptors beyond `max_connections` if closing ever lags behind
/// accepting.
const CLOSING_SLACK: usize = 64;

/// Times the accept loop lets connections asked to close run before it
/// refuses a new connection for [`CLOSING_SLACK`].
const CLOSING_YIELDS: usize = 64;

/// How often, at most, shedding is logged.
const SHED_LOG_EVERY: Duration = Duration::from_secs(10);

/// What every connection of one listener shares. Outlives a restart of the
/// accept loop, so the limits still count the connections already open.
pub struct TcpServer {
    reader: Reader,
    wire: WireConfig,
    cfg: TcpConfig,
    stats: Arc<QueryStats>,
    failures: Arc<Failures>,
    /// Held for a map update or, when every slot is taken, one pass over
    /// the open connections; twice per connection, never per message and
    /// never across an await.
    conns: Mutex<Conns>,
    /// The origin of [`Conn::state`]'s milliseconds.
    epoch: Instant,
}

impl TcpServer {
    /// The shared state of a listener's connections.
    pub fn new(
        reader: Reader,
        wire: WireConfig,
        cfg: TcpConfig,
        stats: Arc<QueryStats>,
        failures: Arc<Failures>,
    ) -> Arc<Self> {
        Arc::new(Self {
            reader,
            wire,
            cfg,
            stats,
            failures,
            conns: Mutex::new(Conns::default()),
            epoch: Instant::now(),
        })
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(BUSY - 1)
    }

    /// Counts a connection from `ip`, asking another to close when every
    /// slot is taken (then also `true`), or says why it is refused.
    fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<(ClientSlot, bool), Refused> {
        let limits =
            Limits { max: self.cfg.max_connections.max(1), per_client: self.cfg.max_per_client.max(1) };
        let now = self.now_ms();
        let (conn, victim, shed_since_log) = {
            let mut conns = self.conns.lock().unwrap_or_else(PoisonError::into_inner);
            let (conn, victim) = conns.admit(ip, now, limits)?;
            let shed_since_log = if victim.is_some() { conns.shed_log(Instant::now()) } else { None };
            (conn, victim, shed_since_log)
        };
        let shed = victim.is_some();
        if let Some(victim) = victim {
            // A permit is stored if its task is not waiting right now.
            victim.shed.notify_one();
            self.stats.tcp_shed[0].fetch_add(1, Ordering::Relaxed);
        }
        if let Some(shed) = shed_since_log {
            warn!(
                max = limits.max,
                shed,
                "every TCP connection slot is taken (--tcp-max-connections): closing the longest \
                 waiting connection of the address holding the most for each new one"
            );
        }
        Ok((ClientSlot { server: self.clone(), conn, ip }, shed))
    }
}

/// Why a new connection is closed at once.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
enum Refused {
    #[error("too many from this address (--tcp-max-per-client)")]
    PerClient,
    #[error("too many connections still closing")]
    Closing,
}

/// The caps, each at least 1.
#[derive(Debug, Clone, Copy)]
struct Limits {
    max: usize,
    per_client: usize,
}

/// [`Conn::state`] while a message is being answered.
const BUSY: u64 = u64::MAX;

/// What the accept loop reads of one open connection, and how it asks the
/// connection to close.
struct Conn {
    /// [`BUSY`], or the millisecond (since [`TcpServer::epoch`]) at which
    /// the connection began waiting for its next message: at connect and
    /// after each response. A first byte does not reset it, so a client
    /// trickling bytes grows as old as an idle one. Relaxed: only a
    /// heuristic reads it.
    state: AtomicU64,
    /// Notified when the connection is chosen to make room; its task then
    /// drops it, whatever it was doing.
    shed: Notify,
}

impl Conn {
    fn waiting_since(&self, now_ms: u64) {
        self.state.store(now_ms, Ordering::Relaxed);
    }

    fn busy(&self) {
        self.state.store(BUSY, Ordering::Relaxed);
    }
}

/// The open connections of one address.
#[derive(Default)]
struct Held {
    /// Open, including those asked to close: what `max_per_client` caps.
    open: usize,
    /// Those not asked to close: the candidates to make room.
    live: Vec<Arc<Conn>>,
}

/// Every open connection, by client address.
#[derive(Default)]
struct Conns {
    by_ip: HashMap<IpAddr, Held>,
    /// Open and not asked to close: what `max_connections` caps.
    live: usize,
    /// Open, including those asked to close.
    open: usize,
    /// Connections asked to close since shedding was last logged.
    shed_unlogged: u64,
    last_log: Option<Instant>,
}

impl Conns {
    /// Counts a new connection from `ip`; past `limits.max` also returns
    /// the open connection it displaces, already uncounted.
    fn admit(
        &mut self,
        ip: IpAddr,
        now_ms: u64,
        limits: Limits,
    ) -> Result<(Arc<Conn>, Option<Arc<Conn>>), Refused> {
        if self.by_ip.get(&ip).is_some_and(|h| h.open >= limits.per_client) {
            return Err(Refused::PerClient);
        }
        let mut victim = None;
        if self.live >= limits.max {
            if self.open >= limits.max + CLOSING_SLACK {
                return Err(Refused::Closing);
            }
            victim = self.take_victim(now_ms);
        }
        let conn = Arc::new(Conn { state: AtomicU64::new(now_ms), shed: Notify::new() });
        let held = self.by_ip.entry(ip).or_default();
        held.open += 1;
        held.live.push(conn.clone());
        self.live += 1;
        self.open += 1;
        Ok((conn, victim))
    }

    /// The connection to close to make room, uncounted from `live`: one
    /// waiting for its client before one being answered (a client that is
    /// sent nothing loses nothing it asked for), then from the address
    /// holding the most (a client behind one connection, such as a fresh
    /// one, is the last to lose it; a flood from a few addresses pays
    /// first), then the one waiting longest. One pass over the open
    /// connections: this runs only while every slot is taken.
    fn take_victim(&mut self, now_ms: u64) -> Option<Arc<Conn>> {
        let mut best: Option<((bool, usize, u64), IpAddr, usize)> = None;
        for (ip, held) in &self.by_ip {
            for (i, conn) in held.live.iter().enumerate() {
                let state = conn.state.load(Ordering::Relaxed);
                let key = (state != BUSY, held.live.len(), now_ms.saturating_sub(state));
                if best.as_ref().is_none_or(|(k, _, _)| key > *k) {
                    best = Some((key, *ip, i));
                }
            }
        }
        let (_, ip, i) = best?;
        let conn = self.by_ip.get_mut(&ip)?.live.swap_remove(i);
        self.live -= 1;
        self.shed_unlogged += 1;
        Some(conn)
    }

    /// Forgets a closed connection from `ip`.
    fn close(&mut self, ip: IpAddr, conn: &Arc<Conn>) {
        let Some(held) = self.by_ip.get_mut(&ip) else { return };
        if let Some(i) = held.live.iter().position(|c| Arc::ptr_eq(c, conn)) {
            held.live.swap_remove(i);
            self.live -= 1;
        }
        held.open = held.open.saturating_sub(1);
        self.open = self.open.saturating_sub(1);
        if held.open == 0 {
            self.by_ip.remove(&ip);
        }
    }

    /// The connections shed since the last log line, when one is due.
    fn shed_log(&mut self, now: Instant) -> Option<u64> {
        if self.last_log.is_some_and(|t| now.duration_since(t) < SHED_LOG_EVERY) {
            return None;
        }
        self.last_log = Some(now);
        Some(std::mem::take(&mut self.shed_unlogged))
    }
}

/// One connection counted against the caps until dropped.
struct ClientSlot {
    server: Arc<TcpServer>,
    conn: Arc<Conn>,
    ip: IpAddr,
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut conns = self.server.conns.lock().unwrap_or_else(PoisonError::into_inner);
        conns.close(self.ip, &self.conn);
    }
}

/// File descriptors kept for everything but TCP connections when the cap
/// is fitted to the open files limit: UDP and HTTP sockets, connections to
/// API servers, probes (64 at once by default), watched files.
const OTHER_FILES: u64 = 256;

/// `cfg` with `max_connections` lowered when the process's limit on open
/// files (the soft `RLIMIT_NOFILE`) cannot hold that many connections on
/// each of `listeners` listeners, with those closing and `OTHER_FILES`;
/// then also the limit. Past the limit accept() fails (EMFILE) and a
/// connection waits in the kernel's queue, behind whatever is there, until
/// a timeout frees a descriptor: a cap that fits keeps shedding in charge
/// instead. systemd's default soft limit, 1,024, is the default cap's size.
pub fn fit_open_files(cfg: TcpConfig, listeners: usize) -> (TcpConfig, Option<u64>) {
    // `None`: unlimited.
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
    match limit.map(|limit| (limit, fitted_max(cfg.max_connections, listeners, limit))) {
        Some((limit, max)) if max < cfg.max_connections => {
            (TcpConfig { max_connections: max, ..cfg }, Some(limit))
        }
        _ => (cfg, None),
    }
}

/// The connections per listener that `limit` open files leave room for.
fn fitted_max(max: usize, listeners: usize, limit: u64) -> usize {
    let per_listener = limit.saturating_sub(OTHER_FILES) / u64::try_from(listeners.max(1)).unwrap_or(1);
    let room = usize::try_from(per_listener).unwrap_or(usize::MAX).saturating_sub(CLOSING_SLACK);
    max.min(room).max(1)
}

/// Binds the TCP listener (separately from serving, so bind errors surface
/// at start-up). An IPv6 listener takes IPv6 only, as the UDP sockets do, so
/// `--listen 0.0.0.0:53 --listen [::]:53` can both be bound.
pub async fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    TcpListener::from_std(socket.into())
}

/// Accepts connections from `listener` and serves each on its own task,
/// until the task is dropped. The listener is shared so that a supervisor
/// can run this again on the same socket. Never waits for anything but the
/// next connection: the caps close connections, they do not hold the loop.
pub async fn serve(listener: Arc<TcpListener>, server: Arc<TcpServer>) {
    loop {
        server.wire.faults.point(Point::TcpAccept, &[]);
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                warn!(error = %e, "TCP accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let mut yields = 0;
        let admitted = loop {
            match server.admit(peer.ip()) {
                // Connections asked to close are closed by their tasks:
                // let them run rather than turn a client away.
                Err(Refused::Closing) if yields < CLOSING_YIELDS => {
                    yields += 1;
                    tokio::task::yield_now().await;
                }
                other => break other,
            }
        };
        let (slot, shed) = match admitted {
            Ok(admitted) => admitted,
            Err(why) => {
                debug!(%peer, %why, "TCP connection refused");
                continue;
            }
        };
        let server = server.clone();
        tokio::spawn(async move {
            let arrival = Arrival { proto: 1, family: usize::from(peer.is_ipv6()) };
            let conn = &slot.conn;
            tokio::select! {
                r = AssertUnwindSafe(connection(stream, peer, &server, arrival, conn)).catch_unwind() => match r {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => debug!(error = %e, %peer, "TCP connection ended"),
                    Err(_) => {
                        // Logged by the panic hook; this connection is closed.
                        server.failures.panicked(Task::Tcp);
                    }
                },
                // Dropping the connection's future closes its socket.
                () = conn.shed.notified() => debug!(%peer, "TCP connection closed to make room"),
            }
            drop(slot);
        });
        if shed {
            // The connection chosen to make room closes when its task
            // runs. With connections queued, accept() stays ready and the
            // loop would run on for its whole scheduling budget (128
            // accepts) first, the closing ones piling up past
            // CLOSING_SLACK and new clients refused: seen as a fresh
            // query refused behind 2,000 idle connections.
            tokio::task::yield_now().await;
        }
    }
}

async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    server: &TcpServer,
    arrival: Arrival,
    conn: &Conn,
) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let (rd, mut wr) = stream.into_split();
    let mut rd = BufReader::new(rd);
    let mut packet = vec![0u8; 65535];
    let mut out = Vec::with_capacity(65535 + 2);
    let mut scratch = Scratch::default();
    let mut local = LocalStats::default();
    loop {
        // Idle until the next message starts.
        let first = match tokio::time::timeout(server.cfg.idle_timeout, rd.read_u8()).await {
            Err(_) => return Ok(()), // idle
            Ok(Err(e)) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Ok(r) => r?,
        };
        let len = tokio::time::timeout(server.cfg.io_timeout, async {
            let second = rd.read_u8().await?;
            let len = usize::from(u16::from_be_bytes([first, second]));
            rd.read_exact(&mut packet[..len]).await?;
            Ok::<_, io::Error>(len)
        })
        .await
        .map_err(|_| timed_out("query"))??;
        conn.busy();
        let started = std::time::Instant::now();
        let (outcome, snap) = {
            let snap = server.reader.load();
            let outcome = respond_from(
                &snap,
                &packet[..len],
                Some(peer.ip()),
                Transport::Tcp,
                &server.wire,
                &mut scratch,
                &mut out,
            );
            scratch.flush_answers(&snap.zone().answer_stats);
            // A zone transfer is streamed from the snapshot it was decided on.
            let transfer = outcome.is_some_and(|o| o.transfer == Some(TransferAsk::Stream));
            (outcome, transfer.then(|| Arc::clone(&*snap)))
        };
        if let Some(outcome) = outcome {
            let mut sent = out.len();
            if let Some(snap) = snap {
                sent = transfer(snap, &packet[..len], peer, server, &mut wr, &mut out).await?;
            } else {
                write_message(&mut wr, &out, server.cfg.io_timeout, "response write").await?;
            }
            // TCP carries little of the load: add every message's counts
            // to the shared ones at once.
            local.record(&outcome, arrival, len, sent);
            local.record_duration(outcome.in_zone, 1, started.elapsed());
            local.flush(&server.stats);
        }
        conn.waiting_since(server.now_ms());
    }
}

fn timed_out(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, format!("{what} not completed in time"))
}

/// Streams a zone transfer of `snap` answering `query`, each message
/// written within the I/O timeout; returns the bytes sent. Logged once
/// per transfer (a rare, operator-initiated event, like BIND's and Knot's
/// transfer log lines).
async fn transfer(
    snap: Arc<crate::store::Snapshot>,
    query: &[u8],
    peer: SocketAddr,
    server: &TcpServer,
    wr: &mut tokio::net::tcp::OwnedWriteHalf,
    out: &mut Vec<u8>,
) -> io::Result<usize> {
    let Some(mut xfr) = Transfer::new(snap, query, server.wire.max_udp_payload, peer.ip()) else {
        warn!(%peer, "zone transfer could not start: query unreadable or zone without SOA");
        return Err(io::Error::other("zone transfer could not start"));
    };
    let started = std::time::Instant::now();
    let mut sent = 0;
    while xfr.next_message(out)? {
        write_message(wr, out, server.cfg.io_timeout, "zone transfer write").await?;
        sent += out.len() + 2;
    }
    info!(
        %peer,
        serial = xfr.serial(),
        records = xfr.records,
        messages = xfr.messages,
        bytes = sent,
        took_ms = started.elapsed().as_millis() as u64,
        "zone transferred"
    );
    Ok(sent)
}

/// Writes one length-prefixed message within `timeout` (`what` names it in
/// the error when it does not complete in time).
async fn write_message(
    wr: &mut tokio::net::tcp::OwnedWriteHalf,
    msg: &[u8],
    timeout: Duration,
    what: &str,
) -> io::Result<()> {
    let len = u16::try_from(msg.len()).map_err(io::Error::other)?;
    tokio::time::timeout(timeout, async {
        wr.write_all(&len.to_be_bytes()).await?;
        wr.write_all(msg).await
    })
    .await
    .map_err(|_| timed_out(what))?
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    const LIMITS: Limits = Limits { max: 4, per_client: 3 };

    #[test]
    fn past_the_address_cap_a_connection_is_refused() {
        let mut conns = Conns::default();
        for _ in 0..3 {
            assert!(conns.admit(ip(1), 0, LIMITS).is_ok());
        }
        assert_eq!(conns.admit(ip(1), 0, LIMITS).err(), Some(Refused::PerClient));
        assert!(conns.admit(ip(2), 0, LIMITS).is_ok(), "another address still gets in");
    }

    #[test]
    fn past_the_cap_the_longest_waiting_of_the_busiest_address_makes_room() {
        let mut conns = Conns::default();
        let (a_old, _) = conns.admit(ip(1), 0, LIMITS).unwrap();
        let (a_young, _) = conns.admit(ip(1), 50, LIMITS).unwrap();
        let (b_oldest, _) = conns.admit(ip(2), 0, LIMITS).unwrap();
        b_oldest.waiting_since(0);
        let (c, none) = conns.admit(ip(3), 60, LIMITS).unwrap();
        assert!(none.is_none(), "room left below the cap");
        // Full: the new connection takes the place of address 1's oldest,
        // though address 2's connection has waited as long.
        let (fresh, victim) = conns.admit(ip(4), 100, LIMITS).unwrap();
        assert!(victim.is_some_and(|v| Arc::ptr_eq(&v, &a_old)));
        assert_eq!((conns.live, conns.open), (4, 5), "the victim is open until its task closes it");
        // Every address holds one now: the longest waiting goes.
        let (_, victim) = conns.admit(ip(5), 110, LIMITS).unwrap();
        assert!(victim.is_some_and(|v| Arc::ptr_eq(&v, &b_oldest)));
        // One being answered goes after every waiting one, however old.
        a_young.busy();
        c.busy();
        let (_, victim) = conns.admit(ip(6), 120, LIMITS).unwrap();
        assert!(victim.is_some_and(|v| Arc::ptr_eq(&v, &fresh)), "the oldest waiting, not a busy one");
        // The victims close: their slots were already given away.
        conns.close(ip(1), &a_old);
        conns.close(ip(2), &b_oldest);
        assert_eq!((conns.live, conns.open), (4, 5));
        assert!(!conns.by_ip.contains_key(&ip(2)));
    }

    #[test]
    fn a_fresh_connection_is_not_chosen_while_older_ones_wait() {
        let limits = Limits { max: 100, per_client: 100 };
        let mut conns = Conns::default();
        // 100 slow clients, 10 per address, then one fresh client from
        // its own address, then 50 more slow ones.
        for i in 0..100u64 {
            conns.admit(ip(10 + (i % 10) as u8), i, limits).unwrap();
        }
        let (fresh, _) = conns.admit(ip(1), 200, limits).unwrap();
        for i in 0..50u64 {
            let (_, victim) = conns.admit(ip(10 + (i % 10) as u8), 300 + i, limits).unwrap();
            assert!(!victim.is_some_and(|v| Arc::ptr_eq(&v, &fresh)), "fresh client shed at {i}");
        }
        assert_eq!(conns.live, 100);
    }

    #[test]
    fn new_connections_are_refused_while_too_many_are_still_closing() {
        let limits = Limits { max: 1, per_client: 1000 };
        let mut conns = Conns::default();
        conns.admit(ip(1), 0, limits).unwrap();
        for _ in 0..CLOSING_SLACK {
            assert!(conns.admit(ip(1), 0, limits).unwrap().1.is_some());
        }
        assert_eq!(conns.admit(ip(1), 0, limits).err(), Some(Refused::Closing));
    }

    #[test]
    fn the_cap_is_fitted_to_the_open_files_limit() {
        // systemd's default soft limit under the default cap: 1024 - 256
        // for the rest, less 64 that may be closing.
        assert_eq!(fitted_max(1024, 1, 1024), 704);
        assert_eq!(fitted_max(1024, 2, 1024), 320, "shared by the listeners");
        assert_eq!(fitted_max(1024, 1, 1_048_576), 1024, "a container's limit leaves the cap");
        assert_eq!(fitted_max(1024, 1, 100), 1, "never below one");
    }

    #[test]
    fn shedding_is_logged_at_most_every_ten_seconds_with_the_count() {
        let mut conns = Conns::default();
        let t0 = Instant::now();
        conns.shed_unlogged = 3;
        assert_eq!(conns.shed_log(t0), Some(3));
        conns.shed_unlogged = 5;
        assert_eq!(conns.shed_log(t0 + Duration::from_secs(9)), None);
        assert_eq!(conns.shed_log(t0 + SHED_LOG_EVERY), Some(5));
    }
}
