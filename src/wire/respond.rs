//! One query, bytes to bytes, in three steps: [`route`] decides what the
//! question is (a zone transfer, a debug name, the zone's data, or
//! unreadable) and so what answers it; [`rate_limit`] decides whether the
//! response goes out whole, truncated, as BADCOOKIE, or not at all;
//! [`write()`] writes it and counts what was answered.

use std::net::IpAddr;

use super::cookie::{self, ClientCookie};
use super::debug::{self, within};
use super::request::{ClientSubnet, Request, parse};
use super::response::{self, Written};
use super::rrl::{self, Action};
use super::stats::{self, EcsUse, Limited, Outcome, TransferAsk};
use super::{Transport, WireConfig};
use crate::answer::{self, Answer, Picks, Question, Rcode, class, rtype};
use crate::fault::Point;
use crate::model::Cidr;
use crate::store::{Client, Records, Snapshot};

/// Largest response over TCP (RFC 1035 §4.2.2: a two-byte length).
const TCP_LIMIT: usize = u16::MAX as usize;
/// Largest response over UDP to a client without EDNS, and the least an
/// EDNS client may offer (RFC 6891 §6.2.5).
const UDP_LIMIT: u16 = 512;

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

/// Who asks, for the answer policies and `consumer-clusters`.
#[derive(Clone, Copy)]
struct Asking {
    /// The client they see.
    client: Client,
    /// The ECS SOURCE PREFIX-LENGTH that found it; 0 when the client was
    /// not found by ECS (the echo's scope is then 0 or the network's).
    ecs_bits: u8,
    /// What became of the query's ECS, when it had one.
    ecs: Option<EcsUse>,
}

/// Who sent a query: its EDNS Client Subnet when a resolver we trust
/// (`--trust-ecs-from`; no `peer`: asked in process, trusted) sent it
/// (RFC 7871: the resolver speaks for its client), else the packet's
/// source address, else (`peer` unknown) `--cluster-id`. An ECS from any
/// other sender is ignored, never an error: a client may not choose the
/// cluster it is answered as, and a resolver that adds ECS for everyone
/// still gets the answers its own address earns.
fn client_of(snap: &Snapshot, ecs: Option<ClientSubnet>, peer: Option<IpAddr>, trust: &[Cidr]) -> Asking {
    let l = &snap.zone().localities;
    let believed = ecs.filter(|_| peer.is_none_or(|ip| Cidr::allows(trust, ip)));
    let used = ecs.map(|_| if believed.is_some() { EcsUse::Believed } else { EcsUse::Ignored });
    let (client, ecs_bits) = match (believed, peer) {
        // A /0 subnet reveals nothing: the resolver's own address still does.
        (Some(e), _) if e.source_prefix > 0 => {
            (l.client(e.address(), e.family == 2, e.source_prefix), e.source_prefix)
        }
        (_, Some(addr)) => (l.client_at(addr), 0),
        (_, None) => (l.client(&[], false, 0), 0),
    };
    Asking { client, ecs_bits, ecs: used }
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
/// its cluster (`--client-cluster`), or its EDNS Client Subnet's when
/// `peer` is a resolver in `--trust-ecs-from`; its DNS
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
    let asker = Asker { peer, client: None };
    answer(snap, packet, asker, transport, cfg, scratch, out)
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
    let asker = Asker { peer: None, client: Some(client) };
    answer(snap, packet, asker, transport, cfg, scratch, out)
}

/// Who asks: the packet's source (`None`: asked in process, trusted), and
/// the client the answer policies see when it is given rather than found.
#[derive(Clone, Copy)]
struct Asker {
    peer: Option<IpAddr>,
    client: Option<Client>,
}

impl Asker {
    /// Who asks, as the policies see it.
    fn asking(self, snap: &Snapshot, req: &Request<'_>, cfg: &WireConfig) -> Asking {
        match self.client {
            // Given (explain's own query, which carries no ECS): nothing to
            // believe or ignore.
            Some(client) => Asking { client, ecs_bits: 0, ecs: None },
            None => client_of(snap, req.edns.and_then(|e| e.ecs), self.peer, &cfg.trust_ecs),
        }
    }
}

/// What a question is, and so what answers it.
enum Route<'q> {
    /// Not readable as a question: the parser's response code.
    Unreadable(Rcode),
    /// A question without a name the lookup can read.
    NoName,
    /// A zone transfer (AXFR, IXFR of the apex) and what it gets.
    Transfer(TransferAsk),
    /// A debug name (CHAOS TXT in the zone): its records, or `None` when
    /// the client may not ask.
    Debug(Option<Records>),
    /// A question for the zone's data.
    Lookup(&'q [u8]),
}

/// What the outcome reports of a route: set where the route is decided, so
/// that the lookup path never looks at the route twice.
#[derive(Clone, Copy, Default)]
struct Report {
    /// A debug name: answered, or refused to a client not allowed.
    debug: Option<bool>,
    /// A zone transfer, and what it got.
    transfer: Option<TransferAsk>,
    /// What became of the query's EDNS Client Subnet.
    ecs: Option<EcsUse>,
}

/// The one internal entry behind the three public ones.
fn answer(
    snap: &Snapshot,
    packet: &[u8],
    asker: Asker,
    transport: Transport,
    cfg: &WireConfig,
    scratch: &mut Scratch,
    out: &mut Vec<u8>,
) -> Option<Outcome> {
    out.clear();
    let req = parse(packet, &mut scratch.slow)?;
    cfg.faults.point(Point::Query, req.question.unwrap_or_default());
    let mut server_cookie = [0u8; cookie::SERVER_LEN];
    let client_cookie = req.edns.and_then(|e| e.cookie).filter(|_| req.error.is_none());
    let verdict = match (&cfg.cookies, &client_cookie) {
        (Some(secret), Some(c)) => secret.check(c, asker.peer, cookie::now(), &mut server_cookie),
        _ => cookie::Verdict::None,
    };
    let asking = asker.asking(snap, &req, cfg);
    let client = asking.client;
    let lower = lower_qname(&req, &mut scratch.lower);
    let (route, mut report) = route(snap, &req, lower, asker.peer, asking, transport, cfg);
    report.ecs = asking.ecs;
    let outcome = |rcode, in_zone, limited| outcome(&req, rcode, in_zone, limited, report);
    let mut answer = match &route {
        Route::Lookup(name) => {
            let q = Question { name, qtype: req.qtype, qclass: req.qclass };
            answer::lookup_for(snap, &q, &client, &mut scratch.picks)
        }
        // The connection streams the zone (`transfer`): nothing to write.
        Route::Transfer(TransferAsk::Stream) => return Some(outcome(Rcode::NoError, true, Limited::No)),
        Route::Transfer(TransferAsk::Refused) => {
            Answer { in_zone: true, ..Answer::bare(Rcode::Refused, false) }
        }
        Route::Transfer(TransferAsk::Udp) => transfer_over_udp(snap, req.qtype),
        Route::Debug(Some(records)) => {
            Answer { answer: Some(records), in_zone: false, ..Answer::bare(Rcode::NoError, true) }
        }
        Route::Debug(None) => Answer::bare(Rcode::Refused, false),
        Route::Unreadable(rcode) => Answer::bare(*rcode, false),
        Route::NoName => Answer::bare(Rcode::FormErr, false),
    };
    let (limited, truncate) =
        match rate_limit(cfg, transport, asker.peer, verdict, answer.rcode, lower, req.qtype) {
            Limit::Send => (Limited::No, false),
            Limit::Drop => return Some(outcome(answer.rcode, answer.in_zone, Limited::Dropped)),
            Limit::Truncate => (Limited::Slipped, true),
            Limit::BadCookie => {
                answer = Answer::bare(Rcode::BadCookie, answer.authoritative);
                (Limited::Slipped, false)
            }
        };
    let cookie = match (verdict, &client_cookie) {
        (cookie::Verdict::None, _) | (_, None) => None,
        (_, Some(c)) => Some((c, &server_cookie)),
    };
    let counted = (scratch.picks.as_slice(), &mut *scratch.hits);
    write(snap, &req, &answer, asking, cookie, truncate, transport, cfg, counted, out);
    Some(outcome(answer.rcode, answer.in_zone, limited))
}

/// What the query got, for the counters.
fn outcome(req: &Request<'_>, rcode: Rcode, in_zone: bool, limited: Limited, report: Report) -> Outcome {
    let dnssec_ok = req.edns.is_some_and(|e| e.dnssec_ok);
    let Report { debug, transfer, ecs } = report;
    Outcome { rcode, in_zone, qtype: req.qtype, dnssec_ok, limited, debug, transfer, ecs }
}

/// The lower-case QNAME into `buf`, read once: the lookup, the debug
/// answers and rate limiting's key all use it. Both readers keep QNAME
/// within 255 bytes; `get` makes that a FORMERR rather than a panic should
/// either ever fail to.
fn lower_qname<'b>(req: &Request<'_>, buf: &'b mut [u8; 256]) -> Option<&'b [u8]> {
    let (None, Some(q)) = (req.error, req.question) else { return None };
    let (name, lower) = (q.get(..req.qname_len)?, buf.get_mut(..req.qname_len)?);
    lower.copy_from_slice(name);
    lower.make_ascii_lowercase(); // length bytes are < 64, never letters
    Some(lower)
}

/// What the question is. Zone transfers (AXFR, IXFR of the apex) go only to
/// `--allow-transfer` (no peer: asked in process, trusted): over TCP the
/// connection streams the zone; over UDP, IXFR gets the SOA alone, which
/// RFC 1995 §2 says tells the client to ask again over TCP, and AXFR,
/// which has no UDP form (RFC 5936 §4.2), FORMERR as BIND answers it.
/// Debug names are CHAOS TXT (or ANY) questions for names in the zone,
/// answered when `--allow-debug` lets the client ask.
fn route<'q>(
    snap: &Snapshot,
    req: &Request<'_>,
    lower: Option<&'q [u8]>,
    peer: Option<IpAddr>,
    asking: Asking,
    transport: Transport,
    cfg: &WireConfig,
) -> (Route<'q>, Report) {
    let none = Report::default();
    let name = match (req.error, lower) {
        (Some(rcode), _) => return (Route::Unreadable(rcode), none),
        (None, None) => return (Route::NoName, none),
        (None, Some(name)) => name,
    };
    let zone = &*snap.zone().wire;
    if matches!(req.qtype, rtype::AXFR | rtype::IXFR) && req.qclass == class::IN && name == zone {
        let allowed = peer.is_none_or(|ip| Cidr::allows(&cfg.allow_transfer, ip));
        let ask = match (allowed, transport) {
            (false, _) => TransferAsk::Refused,
            (true, Transport::Udp) => TransferAsk::Udp,
            (true, Transport::Tcp) => TransferAsk::Stream,
        };
        return (Route::Transfer(ask), Report { transfer: Some(ask), ..none });
    }
    if let Some(debug) = &cfg.debug
        && req.qclass == class::CH
        && matches!(req.qtype, rtype::TXT | rtype::ANY)
        && within(name, zone)
    {
        let ecs = req.edns.and_then(|e| e.ecs).map(|e| (e, asking.ecs == Some(EcsUse::Believed)));
        let records = debug::records(debug, snap, name, peer, ecs, asking.client);
        let report = Report { debug: Some(records.is_some()), ..none };
        return (Route::Debug(records), report);
    }
    (Route::Lookup(name), none)
}

/// A transfer asked over UDP: IXFR gets the SOA alone, AXFR FORMERR.
fn transfer_over_udp(snap: &Snapshot, qtype: u16) -> Answer<'_> {
    match (qtype, snap.zone_name(&[]).and_then(|apex| apex.get(rtype::SOA))) {
        (rtype::IXFR, Some(soa)) => {
            Answer { answer: Some(&soa.answer), ..Answer::bare(Rcode::NoError, true) }
        }
        _ => Answer { in_zone: true, ..Answer::bare(Rcode::FormErr, false) },
    }
}

/// What rate limiting does to a response.
enum Limit {
    /// Sent as answered.
    Send,
    /// Not sent.
    Drop,
    /// Sent with TC and no records: a real client retries over TCP.
    Truncate,
    /// Sent as BADCOOKIE with a server cookie (RFC 7873 §5.2.3), which the
    /// client's next query carries and is then exempt.
    BadCookie,
}

/// Rate limiting: UDP only (a TCP client has proved its address, as has
/// one with a valid cookie). NOERROR counts per (name, type), every error
/// in one budget.
fn rate_limit(
    cfg: &WireConfig,
    transport: Transport,
    peer: Option<IpAddr>,
    cookie: cookie::Verdict,
    rcode: Rcode,
    name: Option<&[u8]>,
    qtype: u16,
) -> Limit {
    let (Transport::Udp, Some(rrl), Some(ip)) = (transport, &cfg.rrl, peer) else { return Limit::Send };
    if cookie == cookie::Verdict::Valid {
        return Limit::Send;
    }
    let class = match (rcode, name) {
        (Rcode::NoError, Some(name)) => rrl::Class::Response(name, qtype),
        _ => rrl::Class::Error,
    };
    match rrl.check(ip, class) {
        Action::Send => Limit::Send,
        Action::Drop => Limit::Drop,
        Action::Slip if cookie == cookie::Verdict::Fresh => Limit::BadCookie,
        Action::Slip => Limit::Truncate,
    }
}

/// Writes the response: the size limit of the transport, the ECS scope
/// (RFC 7871 §7.2.1: for which addresses the answer holds: the client
/// network that decided it, else the whole given subnet; 0 when the answer
/// is the same for everyone), the cookie, NSID; and counts the answer
/// against its service.
#[allow(clippy::too_many_arguments)] // the parts of one query, each used once
fn write(
    snap: &Snapshot,
    req: &Request<'_>,
    answer: &Answer<'_>,
    Asking { client, ecs_bits, .. }: Asking,
    cookie: Option<(&ClientCookie, &[u8; cookie::SERVER_LEN])>,
    truncate: bool,
    transport: Transport,
    cfg: &WireConfig,
    (picks, hits): (&[u32], &mut stats::AnswerHits),
    out: &mut Vec<u8>,
) {
    let limit = match (transport, req.edns) {
        (Transport::Tcp, _) => TCP_LIMIT,
        (Transport::Udp, None) => usize::from(UDP_LIMIT),
        (Transport::Udp, Some(e)) => {
            usize::from(e.payload.clamp(UDP_LIMIT, cfg.max_udp_payload.max(UDP_LIMIT)))
        }
    };
    let scope = match (answer.client_dependent, client.prefix) {
        (false, _) => 0,
        (true, 0) => ecs_bits,
        (true, p) => p.min(ecs_bits),
    };
    if let (Some(b), Some(_), false) = (answer.balance, answer.answer, truncate) {
        let family = usize::from(req.qtype == rtype::AAAA);
        hits.count(&snap.zone().answer_stats, b, family, answer.pick, picks);
    }
    let written = Written {
        picks,
        ecs_scope: scope,
        cookie: cookie.map(|(c, server)| (c.client(), server)),
        truncate,
        nsid: req.edns.filter(|e| e.nsid).map(|_| snap.zone().config.identity.server_id.as_bytes()),
    };
    response::write(out, req, answer, snap, cfg.max_udp_payload, limit, &written);
}

#[cfg(test)]
mod tests {
    use hickory_proto::op::{Edns, Message, Query};
    use hickory_proto::rr::rdata::opt::{EdnsCode, EdnsOption};
    use hickory_proto::rr::{Name, RecordType};

    use super::*;
    use crate::store::{self, AnswerConfig, ZoneConfig};

    /// Issue 40: a query's EDNS Client Subnet says who asks only when a
    /// resolver in `--trust-ecs-from` sent it; from anyone else the packet's
    /// source does, for `consumer-clusters` as for the policies, and the
    /// option is echoed with scope 0 (RFC 7871 §12.1: supported, not used).
    #[test]
    fn a_client_subnet_is_believed_only_from_trusted_resolvers() {
        // hl.ns is for clients of c2 only; 10.<n>.0.0/16 are c<n>'s clients.
        let (reader, _w) = crate::answer::consumer_tests::fleet(Some(&["c2"]));
        let query = |subnet: &str| {
            let mut m = Message::query();
            m.add_query(Query::query(
                Name::from_ascii("hl.ns.svc.clusterset.local.").expect("name"),
                RecordType::A,
            ));
            let mut edns = Edns::new();
            edns.options_mut().insert(EdnsOption::Subnet(subnet.parse().expect("subnet")));
            m.set_edns(edns);
            m.to_vec().expect("encode")
        };
        let cfg =
            WireConfig { trust_ecs: vec![Cidr::parse("127.0.0.1").expect("cidr")], ..Default::default() };
        let (mut scratch, mut out) = (Scratch::default(), Vec::new());
        let mut ask = |peer: Option<&str>, subnet: &str| {
            let peer = peer.map(|p| p.parse().expect("ip"));
            let o = respond_from(
                &reader.load(),
                &query(subnet),
                peer,
                Transport::Udp,
                &cfg,
                &mut scratch,
                &mut out,
            )
            .expect("answered");
            let m = Message::from_vec(&out).expect("decode");
            let scope = match m.edns.as_ref().and_then(|e| e.option(EdnsCode::Subnet)) {
                Some(EdnsOption::Subnet(s)) => s.scope_prefix(),
                _ => panic!("ECS not echoed"),
            };
            (o.rcode, o.ecs, scope)
        };
        let (yes, ignored) = (Some(EcsUse::Believed), Some(EcsUse::Ignored));
        // The trusted resolver speaks for a client of c2: the service
        // exists for it, for the client's /16.
        assert_eq!(ask(Some("127.0.0.1"), "10.2.3.0/24"), (Rcode::NoError, yes, 16));
        assert_eq!(ask(Some("::ffff:127.0.0.1"), "10.2.3.0/24"), (Rcode::NoError, yes, 16));
        // Asked in process (explain, benches): trusted.
        assert_eq!(ask(None, "10.2.3.0/24").0, Rcode::NoError);
        // The same claim from anyone else: its own address decides.
        assert_eq!(ask(Some("127.0.0.2"), "10.2.3.0/24"), (Rcode::NxDomain, ignored, 0), "no cluster's");
        assert_eq!(ask(Some("10.1.0.7"), "10.2.3.0/24"), (Rcode::NxDomain, ignored, 0), "c1's");
        assert_eq!(ask(Some("10.2.0.7"), "10.1.3.0/24"), (Rcode::NoError, ignored, 0), "c2's own");
        // A trusted resolver's claim for a client of c1 is believed too.
        assert_eq!(ask(Some("127.0.0.1"), "10.1.3.0/24"), (Rcode::NxDomain, yes, 16));
        // A /0 subnet names no client: the resolver's own address decides.
        assert_eq!(ask(Some("127.0.0.1"), "0.0.0.0/0"), (Rcode::NxDomain, yes, 0));
    }

    #[test]
    fn transfers_go_to_ipv4_clients_of_dual_stack_sockets_as_to_the_ipv4_address() {
        let zone = Name::from_ascii("clusterset.local.").expect("zone");
        let (reader, mut writer) =
            store::new(ZoneConfig::with_defaults(zone.clone(), AnswerConfig::standard()));
        writer.publish();
        let mut ixfr = Message::query();
        ixfr.add_query(Query::query(zone, RecordType::IXFR));
        let packet = ixfr.to_vec().expect("encode");
        let cfg = WireConfig {
            allow_transfer: vec![Cidr::parse("127.0.0.0/8").expect("cidr")],
            ..Default::default()
        };
        let (mut scratch, mut out) = (Scratch::default(), Vec::new());
        for (peer, got) in [
            ("127.0.0.1", TransferAsk::Udp),
            ("::ffff:127.0.0.1", TransferAsk::Udp),
            ("10.0.0.1", TransferAsk::Refused),
            ("::ffff:10.0.0.1", TransferAsk::Refused),
            ("::1", TransferAsk::Refused),
        ] {
            let peer = Some(peer.parse().expect("ip"));
            let snap = reader.load();
            let outcome = respond_from(&snap, &packet, peer, Transport::Udp, &cfg, &mut scratch, &mut out)
                .expect("answered");
            assert_eq!(outcome.transfer, Some(got), "{peer:?}");
            let rcode = if got == TransferAsk::Udp { Rcode::NoError } else { Rcode::Refused };
            assert_eq!(outcome.rcode, rcode, "{peer:?}");
        }
    }
}
