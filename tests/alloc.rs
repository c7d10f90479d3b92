//! The read path allocates nothing for common queries: a counting global
//! allocator watches `Reader::load` + `wire::respond` for every query shape
//! the UDP workers see most.
// A test-only allocator wrapper needs `unsafe impl GlobalAlloc`; it only
// counts and forwards to the system allocator.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use clusterset_dns::model::{Boundary, ClusterId, PolicyKind};
use clusterset_dns::source::embedded;
use clusterset_dns::store::{self, SourceId, Update, ZoneConfig};
use clusterset_dns::wire::{Scratch, Transport, WireConfig, respond_from};
use hickory_proto::op::{Edns, Message, Query};
use hickory_proto::rr::rdata::opt::{ClientSubnet, EdnsCode, EdnsOption};
use hickory_proto::rr::{Name, RecordType};

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: forwards every call unchanged to `System`; the counter is a
// const-initialised thread-local Cell, which itself never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn query(name: &str, rtype: RecordType, edns: bool) -> Vec<u8> {
    let mut m = Message::query();
    m.add_query(Query::query(Name::from_ascii(name).expect("name"), rtype));
    if edns {
        m.set_edns(Edns::new());
    }
    m.to_vec().expect("encode")
}

/// The embedded example published with `answers`.
fn example(answers: store::AnswerConfig) -> store::Reader {
    let (reader, mut writer) =
        store::new(ZoneConfig::with_defaults(Name::from_ascii("clusterset.local.").expect("zone"), answers));
    writer.apply(Update::Replace {
        source: SourceId::Example,
        objects: embedded::parse(Default::default()).expect("embedded example").objects,
    });
    writer.publish();
    reader
}

/// Allocations made answering `q` from `peer` 100 times over `transport`,
/// after one warm-up answer (the first load on a thread may register with
/// arc-swap), which must be a response.
fn allocations(
    reader: &store::Reader,
    q: &[u8],
    peer: Option<std::net::IpAddr>,
    transport: Transport,
    cfg: &WireConfig,
    scratch: &mut Scratch,
    out: &mut Vec<u8>,
) -> usize {
    let snap = reader.load();
    assert!(respond_from(&snap, q, peer, transport, cfg, scratch, out).is_some());
    drop(snap);
    let before = ALLOCATIONS.with(Cell::get);
    for _ in 0..100 {
        let snap = reader.load();
        respond_from(&snap, q, peer, transport, cfg, scratch, out);
    }
    ALLOCATIONS.with(Cell::get) - before
}

#[test]
fn answering_common_queries_allocates_nothing() {
    let reader = example(store::AnswerConfig::standard());
    let cfg = WireConfig::default();
    let mut scratch = Scratch::default();
    let mut out = Vec::with_capacity(65535);
    let queries = [
        query("web.shop.svc.clusterset.local.", RecordType::A, false),
        query("api.shop.svc.clusterset.local.", RecordType::AAAA, true),
        query("db.shop.svc.clusterset.local.", RecordType::A, true),
        query("_postgres._tcp.db.shop.svc.clusterset.local.", RecordType::SRV, true),
        query("db.shop.svc.clusterset.local.", RecordType::SRV, false),
        query("db-0.cluster-a.db.shop.svc.clusterset.local.", RecordType::A, false),
        query("fd00-1--6-20.cluster-a.cache.shop.svc.clusterset.local.", RecordType::AAAA, true),
        query("10.0.42.10.in-addr.arpa.", RecordType::PTR, false),
        query("10.4.1.10.in-addr.arpa.", RecordType::PTR, true),
        query(
            "0.2.0.0.6.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.1.0.0.0.0.0.d.f.ip6.arpa.",
            RecordType::PTR,
            true,
        ),
        query("nope.shop.svc.clusterset.local.", RecordType::A, false),
        query("web.shop.svc.clusterset.local.", RecordType::MX, true),
        query("shop.svc.clusterset.local.", RecordType::A, false),
        query("example.com.", RecordType::A, false),
        query("web.shop.svc.clusterset.local.", RecordType::ANY, false),
    ];
    for transport in [Transport::Udp, Transport::Tcp] {
        for q in &queries {
            let allocated = allocations(&reader, q, None, transport, &cfg, &mut scratch, &mut out);
            assert_eq!(allocated, 0, "{transport:?} {:?}", Message::from_vec(q).unwrap().queries);
        }
    }
}

/// Every answer policy, with a subset size, client networks and queries
/// with and without an EDNS Client Subnet, from a resolver trusted with it
/// and from a sender that is not: still nothing allocated.
#[test]
fn answering_with_every_policy_allocates_nothing() {
    let mut ecs = Message::query();
    ecs.add_query(Query::query(Name::from_ascii("db.shop.svc.clusterset.local.").unwrap(), RecordType::A));
    let mut edns = Edns::new();
    edns.options_mut().insert(EdnsOption::Subnet(ClientSubnet::new("10.2.0.0".parse().unwrap(), 16, 0)));
    ecs.set_edns(edns);
    let queries = [
        query("db.shop.svc.clusterset.local.", RecordType::A, true),
        query("db.shop.svc.clusterset.local.", RecordType::AAAA, false),
        query("api.shop.svc.clusterset.local.", RecordType::A, true),
        ecs.to_vec().unwrap(),
    ];
    // The boundaries (issue 31) add a pass over the endpoints, not a buffer.
    let shapes = [0, 2].into_iter().flat_map(|m| Boundary::ALL.map(|b| (m, b)));
    for policy in PolicyKind::ALL {
        for (max_answers, boundary) in shapes.clone() {
            let mut answers = store::AnswerConfig::standard();
            answers.policy = policy;
            answers.max_answers = max_answers;
            answers.fallback_boundary = boundary;
            answers.endpoint_answers = true;
            for (net, cluster) in [("127.0.0.0/16", "cluster-a"), ("10.2.0.0/16", "cluster-b")] {
                answers.clients.push(store::ClientNet {
                    net: net.parse().unwrap(),
                    cluster: ClusterId::parse(cluster).unwrap(),
                    zone: None,
                });
            }
            let reader = example(answers);
            let cfg = WireConfig { trust_ecs: vec!["127.0.0.1".parse().unwrap()], ..WireConfig::default() };
            let mut scratch = Scratch::default();
            let mut out = Vec::with_capacity(65535);
            for peer in ["127.0.0.1", "127.0.0.2"].map(|p| Some(p.parse().unwrap())) {
                for transport in [Transport::Udp, Transport::Tcp] {
                    for q in &queries {
                        let allocated =
                            allocations(&reader, q, peer, transport, &cfg, &mut scratch, &mut out);
                        assert_eq!(
                            allocated,
                            0,
                            "{policy} {max_answers} {boundary} {peer:?} {transport:?} {:?}",
                            Message::from_vec(q).unwrap().queries
                        );
                    }
                }
            }
        }
    }
}

/// DNS cookies on and rate limiting on, with queries that carry a client
/// cookie, a valid server cookie, or none, some of them over the limit
/// (dropped, slipped as TC or as BADCOOKIE): still nothing allocated.
#[test]
fn cookies_and_rate_limiting_allocate_nothing() {
    use clusterset_dns::wire::cookie::CookieSecret;
    use clusterset_dns::wire::rrl::{RateLimiter, RrlConfig};
    let reader = example(store::AnswerConfig::standard());
    let cfg = WireConfig {
        cookies: Some(CookieSecret::from_hex("00112233445566778899aabbccddeeff").unwrap()),
        rrl: Some(std::sync::Arc::new(RateLimiter::new(RrlConfig {
            rate: 5,
            errors_rate: 5,
            slip: 2,
            ipv4_prefix: 24,
            ipv6_prefix: 56,
            exempt: vec![],
            table_size: 1024,
        }))),
        ..WireConfig::default()
    };
    let with_cookie = |name: &str, cookie: &[u8]| {
        let mut m = Message::query();
        m.add_query(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
        let mut edns = Edns::new();
        edns.options_mut().insert(EdnsOption::Unknown(10, cookie.to_vec()));
        m.set_edns(edns);
        m.to_vec().unwrap()
    };
    let mut scratch = Scratch::default();
    let mut out = Vec::with_capacity(65535);
    let peer = Some("198.51.100.1".parse().unwrap());
    // A valid server cookie for this peer, from a first answer.
    let client = [1, 2, 3, 4, 5, 6, 7, 8];
    let first = with_cookie("web.shop.svc.clusterset.local.", &client);
    respond_from(&reader.load(), &first, peer, Transport::Tcp, &cfg, &mut scratch, &mut out).unwrap();
    let answered = Message::from_vec(&out).unwrap();
    let Some(EdnsOption::Unknown(_, full)) = answered.edns.as_ref().unwrap().option(EdnsCode::Cookie) else {
        panic!("no cookie in {answered:?}");
    };
    let queries = [
        first.clone(),
        with_cookie("web.shop.svc.clusterset.local.", full),
        with_cookie("nope.shop.svc.clusterset.local.", &client),
        query("web.shop.svc.clusterset.local.", RecordType::A, true),
    ];
    for transport in [Transport::Udp, Transport::Tcp] {
        for q in &queries {
            let allocated = allocations(&reader, q, peer, transport, &cfg, &mut scratch, &mut out);
            assert_eq!(allocated, 0, "{transport:?} {:?}", Message::from_vec(q).unwrap().queries);
        }
    }
}
