//! Bytes in, bytes out: DNS messages to and from [`crate::answer`].
//!
//! [`respond`] is the one entry point every transport uses (UDP workers, TCP
//! connections, benchmarks, the fuzz target), so both transports give the
//! same answers by construction. It parses the question in place for the
//! common query shape and lets hickory-proto parse everything else; then it
//! writes the header, echoes the question bytes, and copies pre-encoded
//! records until the size limit.

pub mod cookie;
mod request;
mod response;
pub mod rrl;
pub mod stats;
pub mod tcp;
pub mod transfer;
pub mod udp;

pub use request::{ClientEdns, ClientSubnet, Request, parse};

use std::net::IpAddr;
use std::sync::Arc;

use crate::answer::{self, Answer, Picks, Question, Rcode};
use crate::fault::{Faults, Point};
use crate::model::Cidr;
use crate::store::{Client, Snapshot};
use cookie::CookieSecret;
use rrl::{Action, RateLimiter};
use stats::{Limited, Outcome, TransferAsk};

/// The labels of a lower-case wire-form name, for building a `Name`.
fn label_iter(name: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut i = 0;
    std::iter::from_fn(move || {
        let len = usize::from(*name.get(i)?);
        let label = name.get(i + 1..i + 1 + len).filter(|_| len > 0)?;
        i += 1 + len;
        Some(label)
    })
}

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
}

impl Default for WireConfig {
    /// 1232-byte UDP answers, no cookies, no rate limiting, no debug
    /// answers, no zone transfers.
    fn default() -> Self {
        Self {
            max_udp_payload: 1232,
            cookies: None,
            rrl: None,
            faults: Faults::default(),
            debug: None,
            allow_transfer: Vec::new(),
        }
    }
}

/// Explains an answer in words: what `clusterset-dns explain` prints. Given
/// to the wire layer by the command (the report lives in `ops`, above it).
pub trait Explain: Send + Sync {
    /// The report's lines for `qname` (lower-case wire form) and `qtype`
    /// as answered to `client`, described as `who`.
    fn explain(&self, snap: &Snapshot, qname: &[u8], qtype: u16, client: Client, who: &str) -> Vec<String>;
}

/// `dig CH TXT <name in the zone>` answers the explain report for that
/// name as the asker would be answered, and `dig CH TXT whoami.<zone>`
/// what the server attributes to the asker: only to `allow` (refused and
/// counted otherwise), each line one TXT record.
pub struct DebugAnswers {
    /// Clients that may ask (`--allow-debug`).
    pub allow: Vec<Cidr>,
    /// The report.
    pub explain: Arc<dyn Explain>,
}

impl DebugAnswers {
    /// Whether a client at `ip` may ask (`--allow-debug`). The one rule for
    /// every debug door, DNS names here and HTTP `/debug/` in `ops::debug`,
    /// so that the flag means the same wherever it is asked. An IPv4 client
    /// of a dual-stack socket (`::ffff:a.b.c.d`) is matched as the IPv4
    /// address it is, or a loopback-only default would refuse 127.0.0.1
    /// seen through `[::]`.
    pub fn allows(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.allow.iter().any(|c| c.contains(ip))
    }
}

impl std::fmt::Debug for DebugAnswers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DebugAnswers").field("allow", &self.allow).finish_non_exhaustive()
    }
}

/// True when `name` (lower-case wire form) is `zone` or below it.
fn within(name: &[u8], zone: &[u8]) -> bool {
    let mut i = 0;
    while let Some(&len) = name.get(i) {
        if name.get(i..) == Some(zone) {
            return true;
        }
        if len == 0 {
            return false;
        }
        i += 1 + usize::from(len);
    }
    false
}

/// The debug answer to a CHAOS TXT query for `name` in the zone: the
/// lines, or `None` when the client may not ask.
fn debug_lines(
    debug: &DebugAnswers,
    snap: &Snapshot,
    name: &[u8],
    qtype: u16,
    peer: Option<IpAddr>,
    ecs: Option<ClientSubnet>,
    client: Client,
) -> Option<Vec<String>> {
    // No peer: asked in-process (`explain`), which is trusted.
    if let Some(ip) = peer
        && !debug.allows(ip)
    {
        return None;
    }
    let l = &snap.zone().localities;
    let cluster = client.cluster.and_then(|c| l.cluster_name(c)).map_or("(unknown)", |c| c.as_str());
    let zone = client.zone.and_then(|z| l.zone_name(z)).unwrap_or("(unknown)");
    let address = peer.map_or_else(|| "(in process)".to_owned(), |ip| ip.to_string());
    let ecs = ecs.map(|e| {
        let mut bytes = [0u8; 16];
        bytes[..e.address().len()].copy_from_slice(e.address());
        let ip: IpAddr = if e.family == 1 {
            std::net::Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3]).into()
        } else {
            std::net::Ipv6Addr::from(bytes).into()
        };
        format!("{ip}/{}", e.source_prefix)
    });
    let whoami = [b"\x06whoami".as_slice(), &snap.zone().wire].concat();
    if name == whoami.as_slice() {
        let mut lines = vec![format!("address {address}")];
        lines.extend(ecs.map(|e| format!("ecs {e}")));
        lines.push(format!("cluster {cluster}"));
        lines.push(format!("zone {zone}"));
        return Some(lines);
    }
    let who = match &ecs {
        Some(e) => format!("{address} (ECS {e}, cluster {cluster})"),
        None => format!("{address} (cluster {cluster})"),
    };
    // Asked with TXT (or ANY) of the CHAOS class; the report is for the
    // A answer unless the name only has others (SRV names).
    let _ = qtype;
    Some(debug.explain.explain(snap, name, 1, client, &who))
}

/// Buffers reused across queries so answering allocates nothing.
pub struct Scratch {
    lower: [u8; 256],
    slow: Vec<u8>,
    picks: Box<Picks>,
    /// Answers per (service, cluster), counted here and flushed with the
    /// query counters ([`Scratch::flush_answers`]).
    hits: Box<stats::AnswerHits>,
}

impl Default for Scratch {
    fn default() -> Self {
        Self { lower: [0; 256], slow: Vec::with_capacity(512), picks: Box::default(), hits: Box::default() }
    }
}

impl Scratch {
    /// Adds the answers counted since the last call to `shared` (the
    /// zone's [`crate::store::AnswerStats`]).
    pub fn flush_answers(&mut self, shared: &crate::store::AnswerStats) {
        self.hits.flush(shared);
    }
}

/// Who sent a query, for the answer policies: its EDNS Client Subnet when it
/// has one (RFC 7871: the resolver speaks for its client), else the
/// packet's source address, else (`peer` unknown) `--cluster-id`.
fn client_of(snap: &Snapshot, ecs: Option<ClientSubnet>, peer: Option<IpAddr>) -> (Client, u8) {
    let l = &snap.zone().localities;
    match (ecs, peer) {
        // A /0 subnet reveals nothing: the resolver's own address still does.
        (Some(e), _) if e.source_prefix > 0 => {
            (l.client(e.address(), e.family == 2, e.source_prefix), e.source_prefix)
        }
        (_, Some(addr)) => (l.client_at(addr), 0),
        (_, None) => (l.client(&[], false, 0), 0),
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
    respond_from(snap, packet, None, transport, cfg, scratch, out)
}

/// [`respond`] to a query that came from `peer`: the answer policies see
/// its cluster (`--client-cluster`), or its EDNS Client Subnet's; its DNS
/// cookie is checked against its address, and over UDP it counts against
/// its network's rate limit.
pub fn respond_from(
    snap: &Snapshot,
    packet: &[u8],
    peer: Option<IpAddr>,
    transport: Transport,
    cfg: &WireConfig,
    scratch: &mut Scratch,
    out: &mut Vec<u8>,
) -> Option<Outcome> {
    let ecs_peer = |snap: &Snapshot, req: &Request<'_>| client_of(snap, req.edns.and_then(|e| e.ecs), peer);
    answer_as(snap, packet, peer, &ecs_peer, transport, cfg, scratch, out)
}

/// [`respond`] as if the query came from `client` (`explain --from-cluster`).
pub fn respond_as(
    snap: &Snapshot,
    packet: &[u8],
    client: Client,
    transport: Transport,
    cfg: &WireConfig,
    scratch: &mut Scratch,
    out: &mut Vec<u8>,
) -> Option<Outcome> {
    answer_as(snap, packet, None, &|_: &Snapshot, _: &Request<'_>| (client, 0), transport, cfg, scratch, out)
}

/// What rate limiting counts a response against: NOERROR per (name,
/// type), every error in one budget.
fn rrl_class<'q>(rcode: Rcode, name: Option<&'q [u8]>, qtype: u16) -> rrl::Class<'q> {
    match (rcode, name) {
        (Rcode::NoError, Some(name)) => rrl::Class::Response(name, qtype),
        _ => rrl::Class::Error,
    }
}

#[allow(clippy::too_many_arguments)] // the one internal entry behind the three public ones
fn answer_as(
    snap: &Snapshot,
    packet: &[u8],
    peer: Option<IpAddr>,
    who: &dyn Fn(&Snapshot, &Request<'_>) -> (Client, u8),
    transport: Transport,
    cfg: &WireConfig,
    scratch: &mut Scratch,
    out: &mut Vec<u8>,
) -> Option<Outcome> {
    out.clear();
    let req = parse(packet, &mut scratch.slow)?;
    cfg.faults.point(Point::Query, req.question.unwrap_or_default());
    let limit = match (transport, req.edns) {
        (Transport::Tcp, _) => usize::from(u16::MAX),
        (Transport::Udp, None) => 512,
        (Transport::Udp, Some(e)) => usize::from(e.payload.clamp(512, cfg.max_udp_payload.max(512))),
    };
    let mut server_cookie = [0u8; cookie::SERVER_LEN];
    let client_cookie = req.edns.and_then(|e| e.cookie).filter(|_| req.error.is_none());
    let cookie = match (&cfg.cookies, &client_cookie) {
        (Some(secret), Some(c)) => secret.check(c, peer, cookie::now(), &mut server_cookie),
        _ => cookie::Verdict::None,
    };
    let (client, ecs_bits) = who(snap, &req);
    // The lower-case QNAME, read once: the lookup, the debug answers and
    // rate limiting's key all use it. Both readers keep QNAME within 255
    // bytes; `get` makes that a FORMERR rather than a panic should either
    // ever fail to.
    let lower = match (req.error, req.question) {
        (None, Some(q)) => match (q.get(..req.qname_len), scratch.lower.get_mut(..req.qname_len)) {
            (Some(name), Some(lower)) => {
                lower.copy_from_slice(name);
                lower.make_ascii_lowercase(); // length bytes are < 64, never letters
                Some(&*lower)
            }
            _ => None,
        },
        _ => None,
    };
    // Zone transfers (AXFR, IXFR of the apex): only to `allow_transfer`
    // (no peer: asked in process, trusted). Over TCP the connection streams
    // the zone (`transfer`); over UDP, IXFR gets the SOA alone, which RFC
    // 1995 §2 says tells the client to ask again over TCP, and AXFR, which
    // has no UDP form (RFC 5936 §4.2), FORMERR as BIND answers it.
    let mut transfer = None;
    if let (None, Some(name), answer::rtype::AXFR | answer::rtype::IXFR, answer::class::IN) =
        (req.error, lower, req.qtype, req.qclass)
        && name == &*snap.zone().wire
    {
        let allowed = peer.is_none_or(|ip| cfg.allow_transfer.iter().any(|c| c.contains(ip)));
        transfer = Some(match (allowed, transport) {
            (false, _) => TransferAsk::Refused,
            (true, Transport::Udp) => TransferAsk::Udp,
            (true, Transport::Tcp) => {
                return Some(Outcome {
                    rcode: Rcode::NoError,
                    in_zone: true,
                    qtype: req.qtype,
                    dnssec_ok: req.edns.is_some_and(|e| e.dnssec_ok),
                    limited: Limited::No,
                    debug: None,
                    transfer: Some(TransferAsk::Stream),
                });
            }
        });
    }
    // Debug answers (CHAOS TXT for names of the zone), built per query.
    let mut debug_records = None;
    if let (Some(debug), Some(name), 3) = (&cfg.debug, lower, req.qclass)
        && (req.qtype == 16 || req.qtype == 255)
        && within(name, &snap.zone().wire)
    {
        let ecs = req.edns.and_then(|e| e.ecs);
        debug_records = Some(debug_lines(debug, snap, name, req.qtype, peer, ecs, client).map(|lines| {
            let owner = hickory_proto::rr::Name::from_labels(label_iter(name)).unwrap_or_default();
            crate::store::chaos_txt_answer(&owner, &lines)
        }));
    }
    let mut answer = match (req.error, lower, &debug_records) {
        _ if transfer == Some(TransferAsk::Refused) => {
            Answer { in_zone: true, ..Answer::bare(Rcode::Refused, false) }
        }
        _ if transfer == Some(TransferAsk::Udp) => {
            match (req.qtype, snap.zone_name(&[]).and_then(|apex| apex.get(answer::rtype::SOA))) {
                (answer::rtype::IXFR, Some(soa)) => {
                    Answer { answer: Some(&soa.answer), ..Answer::bare(Rcode::NoError, true) }
                }
                _ => Answer { in_zone: true, ..Answer::bare(Rcode::FormErr, false) },
            }
        }
        (_, _, Some(Some(records))) => {
            Answer { answer: Some(records), in_zone: false, ..Answer::bare(Rcode::NoError, true) }
        }
        (_, _, Some(None)) => Answer::bare(Rcode::Refused, false),
        (Some(rcode), _, None) => Answer::bare(rcode, false),
        (None, None, None) => Answer::bare(Rcode::FormErr, false),
        (None, Some(name), None) => {
            let q = Question { name, qtype: req.qtype, qclass: req.qclass };
            answer::lookup_for(snap, &q, &client, &mut scratch.picks)
        }
    };
    // Rate limiting: UDP only (a TCP client has proved its address, as has
    // one with a valid cookie).
    let action = match (transport, &cfg.rrl, peer) {
        (Transport::Udp, Some(rrl), Some(ip)) if cookie != cookie::Verdict::Valid => {
            rrl.check(ip, rrl_class(answer.rcode, lower, req.qtype))
        }
        _ => Action::Send,
    };
    let mut limited = Limited::No;
    let mut truncate = false;
    match action {
        Action::Send => {}
        Action::Drop => {
            return Some(Outcome {
                rcode: answer.rcode,
                in_zone: answer.in_zone,
                qtype: req.qtype,
                dnssec_ok: req.edns.is_some_and(|e| e.dnssec_ok),
                limited: Limited::Dropped,
                debug: debug_records.as_ref().map(Option::is_some),
                transfer,
            });
        }
        Action::Slip => {
            limited = Limited::Slipped;
            if cookie == cookie::Verdict::Fresh {
                // RFC 7873 §5.2.3: BADCOOKIE with a server cookie, which
                // the client's next query carries and is then exempt.
                answer = Answer::bare(Rcode::BadCookie, answer.authoritative);
            } else {
                // TC and no records: a real client retries over TCP.
                truncate = true;
            }
        }
    }
    // RFC 7871 §7.2.1: the scope says for which addresses the answer holds:
    // the client network that decided it, else the whole given subnet; 0
    // when the answer is the same for everyone.
    let scope = match (answer.client_dependent, client.prefix) {
        (false, _) => 0,
        (true, 0) => ecs_bits,
        (true, p) => p.min(ecs_bits),
    };
    if let (Some(b), Some(_), false) = (answer.balance, answer.answer, truncate) {
        let fam = usize::from(req.qtype == 28);
        scratch.hits.count(&snap.zone().answer_stats, b, fam, answer.pick, scratch.picks.as_slice());
    }
    let written = response::Written {
        picks: scratch.picks.as_slice(),
        ecs_scope: scope,
        cookie: match (cookie, &client_cookie) {
            (cookie::Verdict::None, _) | (_, None) => None,
            (_, Some(c)) => Some((c.client(), &server_cookie)),
        },
        truncate,
        nsid: req.edns.filter(|e| e.nsid).map(|_| snap.zone().config.identity.server_id.as_bytes()),
    };
    response::write(out, &req, &answer, snap, cfg.max_udp_payload, limit, &written);
    Some(Outcome {
        rcode: answer.rcode,
        in_zone: answer.in_zone,
        qtype: req.qtype,
        dnssec_ok: req.edns.is_some_and(|e| e.dnssec_ok),
        limited,
        debug: debug_records.as_ref().map(Option::is_some),
        transfer,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A report of no lines: these tests are about who may ask.
    struct NoReport;

    impl Explain for NoReport {
        fn explain(&self, _: &Snapshot, _: &[u8], _: u16, _: Client, _: &str) -> Vec<String> {
            Vec::new()
        }
    }

    #[test]
    fn debug_access_is_the_allowed_networks_for_ipv4_clients_of_dual_stack_sockets_too() {
        let allow = ["127.0.0.0/8", "::1", "192.0.2.0/24"];
        let allow = allow.iter().map(|c| Cidr::parse(c).expect("cidr")).collect();
        let debug = DebugAnswers { allow, explain: Arc::new(NoReport) };
        for (ip, allowed) in [
            ("127.0.0.1", true),
            ("127.0.0.2", true),
            ("::1", true),
            ("192.0.2.77", true),
            ("::ffff:127.0.0.1", true),
            ("::ffff:192.0.2.77", true),
            ("10.0.0.1", false),
            ("::ffff:10.0.0.1", false),
            ("::2", false),
            ("2001:db8::1", false),
        ] {
            let ip: IpAddr = ip.parse().expect("ip");
            assert_eq!(debug.allows(ip), allowed, "{ip}");
        }
    }
}
