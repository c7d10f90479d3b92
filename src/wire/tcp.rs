//! The TCP path (RFC 7766): length-prefixed messages, several per connection
//! (pipelined, answered in order), and the limits that keep a flood of slow
//! or idle clients from starving everyone else:
//!
//! - an idle timeout between messages, and an I/O timeout for the rest of a
//!   message once its first byte came and for writing the response, so a
//!   client sending a byte at a time or never reading holds a connection
//!   for at most that long;
//! - a cap on connections open at once, and a smaller one per client
//!   address, beyond which new connections are closed at once;
//! - under pressure (every connection slot taken), idle connections are
//!   closed so waiting clients get their slots (RFC 7766 §6.2.3).
//!
//! A panic while serving one connection closes that connection only; it is
//! counted (task `tcp`).

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::FutureExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, Semaphore};
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
    /// Connections open at once; more wait in the accept queue while idle
    /// connections are closed to make room.
    pub max_connections: usize,
    /// Connections open at once from one client address; more are closed.
    pub max_per_client: usize,
}

/// What every connection of one listener shares. Outlives a restart of the
/// accept loop, so the limits still count the connections already open.
pub struct TcpServer {
    reader: Reader,
    wire: WireConfig,
    cfg: TcpConfig,
    stats: Arc<QueryStats>,
    failures: Arc<Failures>,
    permits: Arc<Semaphore>,
    per_client: Mutex<HashMap<IpAddr, usize>>,
    /// Notified when every slot is taken: idle connections close.
    pressure: Notify,
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
            permits: Arc::new(Semaphore::new(cfg.max_connections.max(1))),
            per_client: Mutex::new(HashMap::new()),
            pressure: Notify::new(),
        })
    }

    /// Counts a connection from `ip`, or `None` when that address has its
    /// maximum open already.
    fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<ClientSlot> {
        // Held for a map update only, never across an await.
        let mut open = self.per_client.lock().unwrap_or_else(PoisonError::into_inner);
        let n = open.entry(ip).or_insert(0);
        if *n >= self.cfg.max_per_client.max(1) {
            return None;
        }
        *n += 1;
        Some(ClientSlot { server: self.clone(), ip })
    }
}

/// One connection counted against its client address until dropped.
struct ClientSlot {
    server: Arc<TcpServer>,
    ip: IpAddr,
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut open = self.server.per_client.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = open.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
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
/// can run this again on the same socket.
pub async fn serve(listener: Arc<TcpListener>, server: Arc<TcpServer>) {
    loop {
        server.wire.faults.point(Point::TcpAccept, &[]);
        let permit = match server.permits.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                // Every slot taken: idle connections make room.
                server.pressure.notify_waiters();
                match server.permits.clone().acquire_owned().await {
                    Ok(p) => p,
                    Err(_) => return,
                }
            }
        };
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                warn!(error = %e, "TCP accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(slot) = server.admit(peer.ip()) else {
            debug!(%peer, "TCP connection refused: too many from this address");
            continue;
        };
        let server = server.clone();
        tokio::spawn(async move {
            let arrival = Arrival { proto: 1, family: usize::from(peer.is_ipv6()) };
            match AssertUnwindSafe(connection(stream, peer, &server, arrival)).catch_unwind().await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => debug!(error = %e, %peer, "TCP connection ended"),
                Err(_) => {
                    // Logged by the panic hook; this connection is closed.
                    server.failures.panicked(Task::Tcp);
                }
            }
            drop(slot);
            drop(permit);
        });
    }
}

async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    server: &TcpServer,
    arrival: Arrival,
) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let (rd, mut wr) = stream.into_split();
    let mut rd = BufReader::new(rd);
    let mut packet = vec![0u8; 65535];
    let mut out = Vec::with_capacity(65535 + 2);
    let mut scratch = Scratch::default();
    let mut local = LocalStats::default();
    loop {
        // Idle until the next message starts; under pressure, closed.
        let first = tokio::select! {
            r = tokio::time::timeout(server.cfg.idle_timeout, rd.read_u8()) => match r {
                Err(_) => return Ok(()), // idle
                Ok(Err(e)) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
                Ok(r) => r?,
            },
            _ = server.pressure.notified() => return Ok(()),
        };
        let len = tokio::time::timeout(server.cfg.io_timeout, async {
            let second = rd.read_u8().await?;
            let len = usize::from(u16::from_be_bytes([first, second]));
            rd.read_exact(&mut packet[..len]).await?;
            Ok::<_, io::Error>(len)
        })
        .await
        .map_err(|_| timed_out("query"))??;
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
    let Some(mut xfr) = Transfer::new(snap, query, server.wire.max_udp_payload) else {
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
