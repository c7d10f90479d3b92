//! Bytes in, bytes out: DNS messages to and from [`crate::answer`].
//!
//! [`respond()`] is the one entry point every transport uses (UDP workers, TCP
//! connections, benchmarks, the fuzz target), so both transports give the
//! same answers by construction. It parses the question in place for the
//! common query shape and lets hickory-proto parse everything else; then it
//! routes the question (a zone transfer, a debug name, the zone's data),
//! applies rate limiting, writes the header, echoes the question bytes, and
//! copies pre-encoded records until the size limit (`respond.rs`).

pub mod cookie;
mod debug;
mod request;
mod respond;
mod response;
pub mod rrl;
pub mod stats;
pub mod tcp;
pub mod transfer;
pub mod udp;

pub use debug::{DebugAnswers, Explain};
pub use request::{ClientEdns, ClientSubnet, Request, parse};
pub use respond::{Scratch, respond, respond_as, respond_from};

use std::sync::Arc;

use crate::fault::Faults;
use crate::model::Cidr;
use cookie::CookieSecret;
use rrl::RateLimiter;

/// How the query arrived; decides the size limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// UDP: 512 bytes without EDNS, else the client's size up to our cap.
    Udp,
    /// TCP: up to 65,535 bytes.
    Tcp,
}

/// Settings of the wire layer.
#[derive(Debug, Clone)]
pub struct WireConfig {
    /// Largest UDP response we send to an EDNS client, whatever it offers
    /// (1232 by default: DNS Flag Day 2020, no IP fragmentation).
    pub max_udp_payload: u16,
    /// DNS Cookies (RFC 7873): answered with server cookies made with this
    /// secret; `None` ignores the COOKIE option, as a server without
    /// cookie support does.
    pub cookies: Option<CookieSecret>,
    /// Response Rate Limiting of UDP answers, when on.
    pub rrl: Option<Arc<RateLimiter>>,
    /// Test-only fault injection (armed in debug builds only).
    pub faults: Faults,
    /// Debug answers over DNS (`dig CH TXT <name>`, `whoami.<zone>`), when on.
    pub debug: Option<Arc<DebugAnswers>>,
    /// Clients that may transfer the zone (AXFR, IXFR); others are refused.
    pub allow_transfer: Vec<Cidr>,
    /// Senders whose EDNS Client Subnet is believed (`--trust-ecs-from`):
    /// the resolvers that speak for their clients. From any other sender
    /// the packet's source address decides who asks, and the option is
    /// echoed with SCOPE PREFIX-LENGTH 0.
    pub trust_ecs: Vec<Cidr>,
}

impl Default for WireConfig {
    /// 1232-byte UDP answers, no cookies, no rate limiting, no debug
    /// answers, no zone transfers, no sender's Client Subnet believed (a
    /// query asked in process, without a peer, is trusted all the same).
    fn default() -> Self {
        Self {
            max_udp_payload: 1232,
            cookies: None,
            rrl: None,
            faults: Faults::default(),
            debug: None,
            allow_transfer: Vec::new(),
            trust_ecs: Vec::new(),
        }
    }
}
