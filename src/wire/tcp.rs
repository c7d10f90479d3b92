//! The TCP path (RFC 7766): length-prefixed messages, several per connection
//! (pipelined, answered in order), an idle timeout, and a cap on open
//! connections so a flood of idle clients cannot exhaust the server.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tracing::{debug, warn};

use super::stats::{Arrival, LocalStats, QueryStats};
use super::{Scratch, Transport, WireConfig, respond_from};
use crate::store::Reader;

/// TCP settings.
#[derive(Debug, Clone, Copy)]
pub struct TcpConfig {
    /// A connection with no complete query for this long is closed.
    pub idle_timeout: Duration,
    /// Connections open at once; more wait in the accept queue.
    pub max_connections: usize,
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

/// Serves connections from `listener` until the task is dropped, counting
/// what it answers into `stats`.
pub async fn serve(
    listener: TcpListener,
    reader: Reader,
    wire: WireConfig,
    cfg: TcpConfig,
    stats: Arc<QueryStats>,
) {
    let permits = Arc::new(Semaphore::new(cfg.max_connections.max(1)));
    loop {
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                warn!(error = %e, "TCP accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let (reader, stats) = (reader.clone(), stats.clone());
        let arrival = Arrival { proto: 1, family: usize::from(peer.is_ipv6()) };
        tokio::spawn(async move {
            if let Err(e) = connection(stream, peer, &reader, &wire, cfg.idle_timeout, &stats, arrival).await
            {
                debug!(error = %e, %peer, "TCP connection ended");
            }
            drop(permit);
        });
    }
}

async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    reader: &Reader,
    wire: &WireConfig,
    idle: Duration,
    stats: &QueryStats,
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
        let len = match tokio::time::timeout(idle, rd.read_u16()).await {
            Err(_) => return Ok(()), // idle
            Ok(Err(e)) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Ok(r) => usize::from(r?),
        };
        tokio::time::timeout(idle, rd.read_exact(&mut packet[..len]))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "query not completed in time"))??;
        let started = std::time::Instant::now();
        let outcome = {
            let snap = reader.load();
            let outcome = respond_from(
                &snap,
                &packet[..len],
                Some(peer.ip()),
                Transport::Tcp,
                wire,
                &mut scratch,
                &mut out,
            );
            scratch.flush_answers(&snap.zone().answer_stats);
            outcome
        };
        if let Some(outcome) = outcome {
            wr.write_all(&(out.len() as u16).to_be_bytes()).await?;
            wr.write_all(&out).await?;
            // TCP carries little of the load: add every message's counts
            // to the shared ones at once.
            local.record(&outcome, arrival, len, out.len());
            local.record_duration(outcome.in_zone, 1, started.elapsed());
            local.flush(stats);
        }
    }
}
