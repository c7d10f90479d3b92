//! Bytes in, bytes out: DNS messages to and from [`crate::answer`].
//!
//! [`respond`] is the one entry point every transport uses (UDP workers, TCP
//! connections, benchmarks, the fuzz target), so both transports give the
//! same answers by construction. It parses the question in place for the
//! common query shape and lets hickory-proto parse everything else; then it
//! writes the header, echoes the question bytes, and copies pre-encoded
//! records until the size limit.

mod request;
mod response;
pub mod stats;
pub mod tcp;
pub mod udp;

pub use request::{ClientEdns, Request, parse};

use crate::answer::{self, Answer, Question};
use crate::store::Snapshot;
use stats::Outcome;

/// How the query arrived; decides the size limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// UDP: 512 bytes without EDNS, else the client's size up to our cap.
    Udp,
    /// TCP: up to 65,535 bytes.
    Tcp,
}

/// Settings of the wire layer.
#[derive(Debug, Clone, Copy)]
pub struct WireConfig {
    /// Largest UDP response we send to an EDNS client, whatever it offers
    /// (1232 by default: DNS Flag Day 2020, no IP fragmentation).
    pub max_udp_payload: u16,
}

/// Buffers reused across queries so answering allocates nothing.
pub struct Scratch {
    lower: [u8; 256],
    slow: Vec<u8>,
}

impl Default for Scratch {
    fn default() -> Self {
        Self { lower: [0; 256], slow: Vec::with_capacity(512) }
    }
}

/// Answers one DNS message. Writes the response into `out` (cleared first)
/// and says what it answered, or returns `None` when the message gets no
/// response at all (too short to hold a header, or itself a response).
pub fn respond(
    snap: &Snapshot,
    packet: &[u8],
    transport: Transport,
    cfg: &WireConfig,
    scratch: &mut Scratch,
    out: &mut Vec<u8>,
) -> Option<Outcome> {
    out.clear();
    let req = parse(packet, &mut scratch.slow)?;
    let limit = match (transport, req.edns) {
        (Transport::Tcp, _) => usize::from(u16::MAX),
        (Transport::Udp, None) => 512,
        (Transport::Udp, Some(e)) => usize::from(e.payload.clamp(512, cfg.max_udp_payload.max(512))),
    };
    let answer = match (req.error, req.question) {
        (Some(rcode), _) => Answer::bare(rcode, false),
        (None, None) => Answer::bare(answer::Rcode::FormErr, false),
        (None, Some(q)) => {
            let name = &q[..req.qname_len];
            let lower = &mut scratch.lower[..name.len()];
            lower.copy_from_slice(name);
            lower.make_ascii_lowercase(); // length bytes are < 64, never letters
            answer::lookup(snap, &Question { name: lower, qtype: req.qtype, qclass: req.qclass })
        }
    };
    response::write(out, &req, &answer, snap, cfg.max_udp_payload, limit);
    Some(Outcome {
        rcode: answer.rcode,
        in_zone: answer.in_zone,
        qtype: req.qtype,
        dnssec_ok: req.edns.is_some_and(|e| e.dnssec_ok),
    })
}
