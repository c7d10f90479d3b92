//! DNS over UDP for the benches: one connected socket, A queries as raw
//! hickory-proto messages, answers matched by id, and polling every
//! millisecond until an answer is what a bench waits for.
//!
//! Not the tests' `support::q` / `udp_raw`: those bind a socket per query,
//! wait up to a second and panic; a bench asks every 1 ms and counts a
//! missing answer as "not yet".

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use anyhow::Result;
use hickory_proto::op::{Message, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};

/// How often the server is asked while waiting for a change.
pub const POLL_EVERY: Duration = Duration::from_millis(1);

/// What an A query got: the response code and the addresses answered.
pub struct Answer {
    pub rcode: ResponseCode,
    pub ips: BTreeSet<Ipv4Addr>,
}

/// A UDP client of one server, numbering its queries.
pub struct Dns {
    sock: UdpSocket,
    id: u16,
    buf: Vec<u8>,
}

impl Dns {
    pub fn new(server: SocketAddr) -> Result<Self> {
        let sock = UdpSocket::bind("127.0.0.1:0")?;
        sock.connect(server)?;
        Ok(Self { sock, id: 0, buf: vec![0; 65535] })
    }

    /// One A query; waits at most `wait` for its answer (stale answers are dropped).
    pub fn query_a(&mut self, name: &Name, wait: Duration) -> Option<Answer> {
        self.id = self.id.wrapping_add(1);
        let mut m = Message::query();
        m.metadata.id = self.id;
        m.add_query(Query::query(name.clone(), RecordType::A));
        let packet = m.to_vec().ok()?;
        self.sock.send(&packet).ok()?;
        let deadline = Instant::now() + wait;
        loop {
            let left = deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero())?;
            self.sock.set_read_timeout(Some(left)).ok()?;
            let len = self.sock.recv(&mut self.buf).ok()?;
            let Ok(r) = Message::from_vec(&self.buf[..len]) else { continue };
            if r.metadata.id != self.id {
                continue;
            }
            let ips = r
                .answers
                .iter()
                .filter_map(|rec| match &rec.data {
                    RData::A(a) => Some(a.0),
                    _ => None,
                })
                .collect();
            return Some(Answer { rcode: r.metadata.response_code, ips });
        }
    }

    /// Asks every `POLL_EVERY` from now until `done` holds; returns when it
    /// first did, or `None` after `timeout` from `from`.
    pub fn poll_until(
        &mut self,
        name: &Name,
        from: Instant,
        timeout: Duration,
        done: impl Fn(&Answer) -> bool,
    ) -> Option<Instant> {
        let mut next = Instant::now();
        loop {
            if self.query_a(name, POLL_EVERY).is_some_and(|a| done(&a)) {
                return Some(Instant::now());
            }
            next += POLL_EVERY;
            let now = Instant::now();
            if now.duration_since(from) > timeout {
                return None;
            }
            if let Some(wait) = next.checked_duration_since(now) {
                std::thread::sleep(wait);
            } else {
                next = now;
            }
        }
    }
}
