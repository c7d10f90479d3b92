//! Per-query cost of the answer path, in process (no sockets): parse the
//! query, look it up, write the response. A hickory-proto round trip
//! (decode the query, build and encode a response) is measured beside it as
//! the baseline of "what a general DNS library costs". Also: the cost of
//! publishing one changed service in a store of 10,000.

// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

use std::hint::black_box;
use std::net::IpAddr;

use clusterset_dns::model::{
    AddressFamily, ClusterId, DnsLabel, Endpoint, EndpointSet, ImportType, Port, Protocol, ServiceImport,
    ServiceKey, SliceKey,
};
use clusterset_dns::store::{self, Object, Reader, SourceId, Update, Writer, ZoneConfig};
use clusterset_dns::wire::cookie::CookieSecret;
use clusterset_dns::wire::rrl::{RateLimiter, RrlConfig};
use clusterset_dns::wire::{Scratch, Transport, WireConfig, respond, respond_from};
use criterion::{Criterion, criterion_group, criterion_main};
use hickory_proto::op::{Edns, Message, Query};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::rdata::opt::{EdnsCode, EdnsOption};
use hickory_proto::rr::{Name, RData, Record, RecordType};

/// Services in the benchmark store; every 10th is headless with 4 endpoints
/// in each of 3 clusters (the shape of benches/workload.py).
const SERVICES: usize = 10_000;

fn key(i: usize) -> ServiceKey {
    ServiceKey {
        namespace: DnsLabel::parse(&format!("ns{}", i % 10)).expect("label"),
        name: DnsLabel::parse(&format!("svc{i}")).expect("label"),
    }
}

fn objects(ip_offset: u32) -> Vec<Object> {
    let mut out = Vec::new();
    let port =
        Port { name: Some(DnsLabel::parse("http").expect("label")), protocol: Protocol::Tcp, port: 80 };
    for i in 0..SERVICES {
        let headless = i % 10 == 0;
        let ip = IpAddr::from(std::net::Ipv4Addr::from(0x0AC8_0000 + i as u32 + ip_offset));
        out.push(Object::Import(ServiceImport {
            key: key(i),
            kind: if headless { ImportType::Headless } else { ImportType::ClusterSetIp },
            ips: if headless { Default::default() } else { vec![ip].into() },
            ports: vec![port.clone()].into(),
            answers: Default::default(),
        }));
        if headless {
            for c in 0..3u32 {
                let endpoints = (0..4u32)
                    .map(|e| {
                        let ip =
                            IpAddr::from(std::net::Ipv4Addr::from(0x0A40_0000 + (i as u32) * 16 + c * 4 + e));
                        Endpoint::new(vec![ip].into(), true)
                    })
                    .collect();
                out.push(Object::Slice(EndpointSet {
                    slice: SliceKey { namespace: format!("ns{}", i % 10), name: format!("svc{i}-c{c}") },
                    service: key(i),
                    cluster: ClusterId::parse(&format!("cluster{c}")).expect("id"),
                    family: AddressFamily::V4,
                    ports: vec![port.clone()],
                    endpoints,
                    origin: clusterset_dns::model::SliceOrigin::Mcs,
                    trigger: Default::default(),
                }));
            }
        }
    }
    out
}

fn store() -> (Reader, Writer) {
    store_with(store::AnswerConfig::standard())
}

fn store_with(answers: store::AnswerConfig) -> (Reader, Writer) {
    let (reader, mut writer) =
        store::new(ZoneConfig::with_defaults(Name::from_ascii("clusterset.local.").expect("zone"), answers));
    writer.apply(Update::Replace { source: SourceId::Watch(1), objects: objects(0) });
    writer.publish();
    (reader, writer)
}

fn query(name: &str, rtype: RecordType, edns: bool) -> Vec<u8> {
    let mut m = Message::query();
    m.metadata.id = 7;
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(Name::from_ascii(name).expect("name"), rtype));
    if edns {
        let mut e = Edns::new();
        e.set_max_payload(1232);
        m.set_edns(e);
    }
    m.to_vec().expect("encode")
}

fn answer_path(c: &mut Criterion) {
    let (reader, _writer) = store();
    let snap = reader.load_full();
    let cfg = WireConfig::default();
    let mut scratch = Scratch::default();
    let mut out = Vec::with_capacity(65535);
    let cases = [
        ("hit_a", query("svc1.ns1.svc.clusterset.local.", RecordType::A, false)),
        ("hit_a_edns", query("svc1.ns1.svc.clusterset.local.", RecordType::A, true)),
        ("hit_headless_a_12", query("svc10.ns0.svc.clusterset.local.", RecordType::A, true)),
        ("hit_srv", query("_http._tcp.svc1.ns1.svc.clusterset.local.", RecordType::SRV, true)),
        // 12 SRV records and their 12 targets' A records.
        ("hit_headless_srv_12", query("_http._tcp.svc10.ns0.svc.clusterset.local.", RecordType::SRV, true)),
        // A headless endpoint's own name, and the reverse names of an
        // endpoint and of a VIP.
        (
            "hit_endpoint_a",
            query("10-64-0-166.cluster1.svc10.ns0.svc.clusterset.local.", RecordType::A, true),
        ),
        ("hit_ptr_endpoint", query("166.0.64.10.in-addr.arpa.", RecordType::PTR, true)),
        ("hit_ptr_vip", query("1.0.200.10.in-addr.arpa.", RecordType::PTR, true)),
        ("miss_nxdomain", query("missing42.ns0.svc.clusterset.local.", RecordType::A, false)),
        ("refused", query("example.com.", RecordType::A, false)),
    ];
    let mut g = c.benchmark_group("respond");
    for (name, packet) in &cases {
        g.bench_function(*name, |b| {
            b.iter(|| {
                respond(&snap, black_box(packet), Transport::Udp, &cfg, &mut scratch, &mut out);
                black_box(out.len())
            })
        });
    }
    g.finish();

    // DNS cookies (on by default) and rate limiting: the same query with
    // cookies off, with cookies on and no COOKIE option, with a client
    // cookie (a SipHash to make ours), with our valid server cookie (a
    // SipHash to check it), and with RRL counting (a rate never reached).
    let with_cookie = |cookie: &[u8]| {
        let mut m =
            Message::from_vec(&query("svc1.ns1.svc.clusterset.local.", RecordType::A, true)).expect("query");
        if let Some(e) = m.edns.as_mut() {
            e.options_mut().insert(EdnsOption::Unknown(10, cookie.to_vec()));
        }
        m.to_vec().expect("encode")
    };
    let cookies = WireConfig {
        cookies: Some(CookieSecret::from_hex("00112233445566778899aabbccddeeff").expect("hex")),
        ..WireConfig::default()
    };
    let rrl = WireConfig {
        rrl: Some(std::sync::Arc::new(RateLimiter::new(RrlConfig {
            rate: u32::MAX,
            errors_rate: u32::MAX,
            slip: 2,
            ipv4_prefix: 24,
            ipv6_prefix: 56,
            exempt: vec![],
            table_size: 65536,
        }))),
        ..WireConfig::default()
    };
    let peer = Some("198.51.100.7".parse().expect("ip"));
    let client_only = with_cookie(&[1, 2, 3, 4, 5, 6, 7, 8]);
    respond_from(&snap, &client_only, peer, Transport::Udp, &cookies, &mut scratch, &mut out);
    let full = Message::from_vec(&out)
        .ok()
        .and_then(|m| match m.edns.as_ref()?.option(EdnsCode::Cookie) {
            Some(EdnsOption::Unknown(_, c)) => Some(c.clone()),
            _ => None,
        })
        .expect("a server cookie");
    let plain = query("svc1.ns1.svc.clusterset.local.", RecordType::A, true);
    let guard_cases: [(&str, &WireConfig, Vec<u8>); 5] = [
        ("cookies_off", &cfg, client_only.clone()),
        ("cookies_on_no_option", &cookies, plain.clone()),
        ("cookies_on_client_cookie", &cookies, client_only),
        ("cookies_on_server_cookie", &cookies, with_cookie(&full)),
        ("rrl_on_never_limiting", &rrl, plain),
    ];
    let mut g = c.benchmark_group("guard");
    for (name, config, packet) in &guard_cases {
        g.bench_function(*name, |b| {
            b.iter(|| {
                respond_from(&snap, black_box(packet), peer, Transport::Udp, config, &mut scratch, &mut out);
                black_box(out.len())
            })
        });
    }
    g.finish();

    // Baseline: what answering with a general DNS library costs per query.
    let packet = &cases[0].1;
    let owner = Name::from_ascii("svc1.ns1.svc.clusterset.local.").expect("name");
    c.bench_function("hickory_proto_round_trip/hit_a", |b| {
        b.iter(|| {
            let q = Message::from_vec(black_box(packet)).expect("decode");
            let mut r = Message::response(q.metadata.id, q.metadata.op_code);
            r.metadata.authoritative = true;
            r.add_queries(q.queries.iter().cloned());
            r.add_answer(Record::from_rdata(owner.clone(), 5, RData::A(A::new(10, 200, 0, 1))));
            black_box(r.to_vec().expect("encode").len())
        })
    });
}

fn publish(c: &mut Criterion) {
    let (_reader, mut writer) = store();
    // Alternate between two VIPs per service so every upsert is a change.
    let imports = |offset| -> Vec<Object> {
        objects(offset).into_iter().filter(|o| matches!(o, Object::Import(_))).collect()
    };
    let sets = [imports(1), imports(0)];
    let mut i = 0;
    c.bench_function("publish/one_service_of_10000", |b| {
        b.iter(|| {
            i += 1;
            let set = &sets[(i / SERVICES) % 2];
            writer.apply(Update::Upsert { source: SourceId::Watch(1), object: set[i % SERVICES].clone() });
            let rebuilt = writer.publish();
            debug_assert_eq!(rebuilt, 1);
            black_box(rebuilt)
        })
    });
}

/// What counting one query for the metrics costs the UDP worker: one
/// `record` per query, plus one `record_duration` and one `flush` per batch
/// (a flush happens at most about once a second; counted here per query as
/// the worst case).
fn counting(c: &mut Criterion) {
    use clusterset_dns::answer::Rcode;
    use clusterset_dns::wire::stats::{Arrival, Limited, LocalStats, Outcome, QueryStats};
    let shared = QueryStats::default();
    let mut local = LocalStats::default();
    let outcome = Outcome {
        rcode: Rcode::NoError,
        in_zone: true,
        qtype: 1,
        dnssec_ok: false,
        limited: Limited::No,
        debug: None,
        transfer: None,
        ecs: None,
    };
    let arrival = Arrival { proto: 0, family: 0 };
    c.bench_function("stats/record", |b| b.iter(|| local.record(black_box(&outcome), arrival, 47, 63)));
    c.bench_function("stats/record_duration", |b| {
        b.iter(|| local.record_duration(true, black_box(1), std::time::Duration::from_micros(20)))
    });
    c.bench_function("stats/record_and_flush", |b| {
        b.iter(|| {
            local.record(black_box(&outcome), arrival, 47, 63);
            local.flush(&shared)
        })
    });
}

/// Each answer policy's cost per query against plain answers (`all`: the
/// stored order, what every query cost before policies), on the headless
/// service with 12 endpoints in 3 clusters, from a client of `cluster0`.
fn policies(c: &mut Criterion) {
    use clusterset_dns::model::{ClusterId, PolicyKind};
    let packet = query("svc10.ns0.svc.clusterset.local.", RecordType::A, true);
    let cfg = WireConfig::default();
    let peer = Some("127.0.0.1".parse().expect("ip"));
    let mut g = c.benchmark_group("policy");
    for max_answers in [0u16, 2] {
        for policy in PolicyKind::ALL {
            let mut answers = store::AnswerConfig::standard();
            answers.policy = policy;
            answers.max_answers = max_answers;
            answers.clients.push(store::ClientNet {
                net: "127.0.0.0/8".parse().expect("network"),
                cluster: ClusterId::parse("cluster0").expect("id"),
                zone: None,
            });
            let (reader, _writer) = store_with(answers);
            let snap = reader.load_full();
            let mut scratch = Scratch::default();
            let mut out = Vec::with_capacity(65535);
            g.bench_function(format!("{policy}/max{max_answers}"), |b| {
                b.iter(|| {
                    respond_from(
                        &snap,
                        black_box(&packet),
                        peer,
                        Transport::Udp,
                        &cfg,
                        &mut scratch,
                        &mut out,
                    );
                    black_box(out.len())
                })
            });
        }
    }
    g.finish();
}

criterion_group!(benches, answer_path, publish, counting, policies);
criterion_main!(benches);
