//! A steady trickle of queries over UDP or TCP whose every latency is kept
//! with the moment it was asked, for benches that compare query latency
//! while something else happens (a scrape, a relist) with latency outside
//! it. Bounded: a loop asks at most once per `every` until its deadline or
//! its stop flag, and waits at most [`WAIT`] for an answer.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Result;
use hickory_proto::op::{Message, Query};
use hickory_proto::rr::{Name, RecordType};

use super::dns::Dns;
use super::report::ms;

/// How long a query may wait for its answer before it counts as lost.
pub const WAIT: Duration = Duration::from_secs(1);

/// The transports a loop asks over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Udp,
    Tcp,
}

impl Transport {
    pub fn name(self) -> &'static str {
        match self {
            Self::Udp => "UDP",
            Self::Tcp => "TCP",
        }
    }
}

/// One query: when it was asked, and how long its answer took (`None`:
/// lost, no answer within [`WAIT`]).
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    pub sent: Instant,
    pub took: Option<Duration>,
}

/// One DNS client over TCP: a connection kept open (opened again after an
/// error), messages framed by their 2-byte length.
struct Tcp {
    server: SocketAddr,
    conn: Option<TcpStream>,
    id: u16,
}

impl Tcp {
    /// One A query; `None` when no whole answer with its id came within
    /// `wait` (the connection is then dropped).
    fn query_a(&mut self, name: &Name, wait: Duration) -> Option<()> {
        let result = self.exchange(name, wait);
        if result.is_none() {
            self.conn = None;
        }
        result
    }

    fn exchange(&mut self, name: &Name, wait: Duration) -> Option<()> {
        self.id = self.id.wrapping_add(1);
        let mut m = Message::query();
        m.metadata.id = self.id;
        m.add_query(Query::query(name.clone(), RecordType::A));
        let packet = m.to_vec().ok()?;
        if self.conn.is_none() {
            self.conn = Some(TcpStream::connect_timeout(&self.server, wait).ok()?);
        }
        let conn = self.conn.as_mut()?;
        conn.set_nodelay(true).ok()?;
        conn.set_read_timeout(Some(wait)).ok()?;
        let mut framed = (packet.len() as u16).to_be_bytes().to_vec();
        framed.extend_from_slice(&packet);
        conn.write_all(&framed).ok()?;
        let mut len = [0u8; 2];
        conn.read_exact(&mut len).ok()?;
        let mut answer = vec![0u8; usize::from(u16::from_be_bytes(len))];
        conn.read_exact(&mut answer).ok()?;
        (answer.get(..2)? == self.id.to_be_bytes()).then_some(())
    }
}

/// Asks `names` in turn over `transport`, one query every `every`, until
/// `until` or until `stop` is set; returns every query's sample.
pub fn ask(
    server: SocketAddr,
    transport: Transport,
    names: &[Name],
    every: Duration,
    until: Instant,
    stop: &AtomicBool,
) -> Result<Vec<Sample>> {
    let mut udp = Dns::new(server)?;
    let mut tcp = Tcp { server, conn: None, id: 0 };
    let mut samples = Vec::new();
    let mut next = Instant::now();
    let mut k = 0usize;
    while !stop.load(Ordering::Relaxed) && Instant::now() < until && !names.is_empty() {
        let name = &names[k % names.len()];
        k += 1;
        let sent = Instant::now();
        let answered = match transport {
            Transport::Udp => udp.query_a(name, WAIT).map(|_| ()),
            Transport::Tcp => tcp.query_a(name, WAIT),
        };
        samples.push(Sample { sent, took: answered.map(|()| sent.elapsed()) });
        next += every;
        match next.checked_duration_since(Instant::now()) {
            Some(wait) => std::thread::sleep(wait),
            None => next = Instant::now(),
        }
    }
    Ok(samples)
}

/// The samples asked while `inside` holds: (answered latencies sorted, lost).
pub fn select(samples: &[Sample], inside: impl Fn(Instant) -> bool) -> (Vec<Duration>, usize) {
    let mut answered = Vec::new();
    let mut lost = 0;
    for s in samples.iter().filter(|s| inside(s.sent)) {
        match s.took {
            Some(d) => answered.push(d),
            None => lost += 1,
        }
    }
    answered.sort();
    (answered, lost)
}

/// "n, p50, p99, max" of sorted latencies and the lost count, as table
/// cells: `n (lost) | p50 | p99 | max`.
pub fn cells(sorted: &[Duration], lost: usize) -> String {
    let p = |q: f64| super::report::percentile(sorted, q);
    format!(
        "{}{} | {:.2} ms | {:.2} ms | {:.2} ms",
        sorted.len(),
        if lost > 0 { format!(" ({lost} lost)") } else { String::new() },
        p(0.5),
        p(0.99),
        sorted.last().map_or(f64::NAN, |d| ms(*d))
    )
}
