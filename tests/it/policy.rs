//! Answer policies over the wire (issue 6): the client's cluster from its
//! source address or its EDNS Client Subnet (RFC 7871), the ECS echo and
//! its scope, endpoint answers for ClusterSetIP services, annotations.

use std::net::IpAddr;

use hickory_proto::op::{Edns, Message, ResponseCode};
use hickory_proto::rr::rdata::opt::{ClientSubnet, EdnsCode, EdnsOption};

use crate::support::{Q, TestServer, check_unordered, decode, q, tcp_raw, udp_raw};

const FIXTURE: &str = include_str!("../data/contract.yaml");

/// `hl.ns1` has ready endpoints in `east` (10.1.0.1, 10.1.0.2) and
/// `west.eu` (10.2.0.1, fd00:2::10); loopback clients are in `east`.
fn local_first() -> TestServer {
    local_first_with(&[])
}

/// As [`local_first`], with `extra` flags after its own.
fn local_first_with(extra: &[&str]) -> TestServer {
    let mut args = vec![
        "--answer-policy",
        "local-first",
        "--client-cluster",
        "127.0.0.0/8=east",
        "--client-cluster",
        "198.51.100.0/24=west.eu",
        "--client-cluster",
        "2001:db8::/32=west.eu",
    ];
    args.extend_from_slice(extra);
    TestServer::start(&[("contract.yaml", FIXTURE)], &args)
}

fn with_ecs(mut query: Q, addr: &str, prefix: u8) -> Q {
    let mut edns = Edns::new();
    edns.set_max_payload(1232);
    edns.options_mut().insert(EdnsOption::Subnet(ClientSubnet::new(addr.parse().expect("valid"), prefix, 0)));
    query.msg.set_edns(edns);
    query
}

fn addresses(m: &Message) -> Vec<String> {
    let mut v: Vec<String> = m.answers.iter().map(|r| r.data.to_string()).collect();
    v.sort();
    v
}

fn ecs(m: &Message) -> Option<ClientSubnet> {
    match m.edns.as_ref()?.option(EdnsCode::Subnet)? {
        EdnsOption::Subnet(s) => Some(*s),
        _ => None,
    }
}

#[test]
fn local_first_answers_the_source_address_cluster_over_udp_and_tcp() {
    let s = local_first();
    for m in [
        q("hl.ns1.svc.clusterset.local.", "A").udp(s.addr),
        q("hl.ns1.svc.clusterset.local.", "A").tcp(s.addr),
    ] {
        assert_eq!(addresses(&m), ["10.1.0.1", "10.1.0.2"]);
        assert!(ecs(&m).is_none(), "no ECS asked, none answered");
    }
}

#[test]
fn edns_client_subnet_takes_precedence_and_is_echoed_with_the_network_scope() {
    let s = local_first();
    for query in [
        with_ecs(q("hl.ns1.svc.clusterset.local.", "A"), "198.51.100.0", 24),
        with_ecs(q("hl.ns1.svc.clusterset.local.", "A"), "2001:db8:1::", 48),
    ] {
        for m in [query.udp(s.addr), query.tcp(s.addr)] {
            assert_eq!(addresses(&m), ["10.2.0.1"], "the subnet's cluster, not the sender's");
            let e = ecs(&m).expect("ECS echoed");
            let sent = match query.msg.edns.as_ref().and_then(|e| e.option(EdnsCode::Subnet)) {
                Some(EdnsOption::Subnet(s)) => *s,
                _ => unreachable!(),
            };
            assert_eq!((e.addr(), e.source_prefix()), (sent.addr(), sent.source_prefix()));
            // The answer holds for the whole client network that decided it.
            let scope = if sent.addr().is_ipv4() { 24 } else { 32 };
            assert_eq!(e.scope_prefix(), scope);
        }
    }
    // A subnet no network holds: an unknown client, answered for that subnet only.
    let m = with_ecs(q("hl.ns1.svc.clusterset.local.", "A"), "203.0.113.0", 24).udp(s.addr);
    assert_eq!(addresses(&m).len(), 3);
    assert_eq!(ecs(&m).expect("ECS").scope_prefix(), 24);
    // A /0 subnet reveals nothing: the sender's own address decides.
    let m = with_ecs(q("hl.ns1.svc.clusterset.local.", "A"), "0.0.0.0", 0).udp(s.addr);
    assert_eq!(addresses(&m), ["10.1.0.1", "10.1.0.2"]);
}

/// Issue 40: an EDNS Client Subnet says who asks only when a resolver in
/// `--trust-ecs-from` sent it. 127.0.0.2, a client like the rest of
/// loopback in `east` but not the trusted resolver 127.0.0.1, claims west's
/// subnet: it gets east's endpoints, the answer for its own address, over
/// UDP and TCP, the option echoed with scope 0 (the answer is the same
/// whatever subnet it claims); from 127.0.0.1 the same query gets west's.
#[test]
fn a_spoofed_client_subnet_from_an_untrusted_sender_gets_the_senders_answer() {
    let s = local_first_with(&["--trust-ecs-from", "127.0.0.1"]);
    let (trusted, client): (IpAddr, IpAddr) = ([127, 0, 0, 1].into(), [127, 0, 0, 2].into());
    for spoofed in [
        with_ecs(q("hl.ns1.svc.clusterset.local.", "A"), "198.51.100.0", 24),
        with_ecs(q("hl.ns1.svc.clusterset.local.", "A"), "2001:db8:1::", 48),
    ] {
        for m in [spoofed.udp_from(client, s.addr), spoofed.tcp_from(client, s.addr)] {
            assert_eq!(addresses(&m), ["10.1.0.1", "10.1.0.2"], "east's: the sender's cluster");
            assert_eq!(ecs(&m).expect("ECS echoed").scope_prefix(), 0);
        }
        for m in [spoofed.udp_from(trusted, s.addr), spoofed.tcp_from(trusted, s.addr)] {
            assert_eq!(addresses(&m), ["10.2.0.1"], "west's: the trusted resolver's client");
            assert_ne!(ecs(&m).expect("ECS echoed").scope_prefix(), 0);
        }
    }
    // Without ECS the untrusted client is answered as before.
    let plain = q("hl.ns1.svc.clusterset.local.", "A");
    assert_eq!(addresses(&plain.udp_from(client, s.addr)), ["10.1.0.1", "10.1.0.2"]);
}

#[test]
fn answers_that_do_not_depend_on_the_client_have_scope_zero() {
    let s = local_first();
    for name in ["vip.ns1.svc.clusterset.local.", "nope.ns1.svc.clusterset.local."] {
        let m = with_ecs(q(name, "A"), "198.51.100.0", 24).udp(s.addr);
        assert_eq!(ecs(&m).expect("ECS echoed").scope_prefix(), 0, "{name}");
    }
    let plain = TestServer::start(&[("contract.yaml", FIXTURE)], &[]);
    let m = with_ecs(q("hl.ns1.svc.clusterset.local.", "A"), "198.51.100.0", 24).udp(plain.addr);
    assert_eq!(ecs(&m).expect("ECS echoed").scope_prefix(), 0, "rotation is the same for everyone");
}

#[test]
fn malformed_client_subnet_options_get_formerr() {
    let s = local_first();
    let base = q("hl.ns1.svc.clusterset.local.", "A").bytes();
    // Replace the OPT's empty RDATA with a hand-made ECS option.
    let with_option = |data: &[u8]| {
        let mut p = base.clone();
        let rdlen = p.len() - 2;
        let mut opt = vec![0, 8];
        opt.extend_from_slice(&(data.len() as u16).to_be_bytes());
        opt.extend_from_slice(data);
        p[rdlen..].copy_from_slice(&(opt.len() as u16).to_be_bytes());
        p.extend_from_slice(&opt);
        p
    };
    for (why, data) in [
        ("a scope set in a query", vec![0, 1, 24, 24, 198, 51, 100]),
        ("bits set beyond the prefix", vec![0, 1, 12, 0, 10, 0xFF]),
        ("more address bytes than the prefix needs", vec![0, 1, 8, 0, 10, 0]),
        ("prefix longer than IPv4", vec![0, 1, 33, 0, 1, 2, 3, 4, 5]),
        ("unknown family", vec![0, 3, 0, 0]),
        ("too short", vec![0, 1]),
    ] {
        let m = decode(&udp_raw(s.addr, &with_option(&data)).expect("response"));
        assert_eq!(m.metadata.response_code, ResponseCode::FormErr, "{why}");
    }
    // And a well-formed one is fine.
    let m = decode(&udp_raw(s.addr, &with_option(&[0, 1, 16, 0, 198, 51])).expect("response"));
    assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    let m = decode(&tcp_raw(s.addr, &with_option(&[0, 1, 24, 0, 198, 51, 100])).expect("response"));
    assert_eq!(addresses(&m), ["10.2.0.1"]);
}

const ANNOTATED: &str = "
apiVersion: multicluster.x-k8s.io/v1beta1
kind: ServiceImport
metadata:
  name: api
  namespace: ns1
  annotations:
    clusterset-dns.io/endpoint-answers: \"true\"
    clusterset-dns.io/max-answers: \"1\"
spec:
  type: ClusterSetIP
  ips: [10.0.0.9]
  ports: [{name: http, protocol: TCP, port: 80}]
---
apiVersion: multicluster.x-k8s.io/v1beta1
kind: ServiceImport
metadata:
  name: odd
  namespace: ns1
  annotations:
    clusterset-dns.io/answer-policy: fastest
    clusterset-dns.io/cluster-weights: nonsense
spec:
  type: Headless
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: api-east
  namespace: ns1
  labels: {multicluster.kubernetes.io/service-name: api, multicluster.kubernetes.io/source-cluster: east}
addressType: IPv4
endpoints:
- addresses: [10.1.9.1]
- addresses: [10.1.9.2]
- addresses: [10.1.9.3]
  conditions: {ready: false}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: odd-east
  namespace: ns1
  labels: {multicluster.kubernetes.io/service-name: odd, multicluster.kubernetes.io/source-cluster: east}
addressType: IPv4
endpoints:
- addresses: [10.1.8.1]
- addresses: [10.1.8.2]
";

#[test]
fn endpoint_answers_replace_the_vip_by_annotation_and_by_flag() {
    let s = TestServer::start(&[("contract.yaml", FIXTURE), ("a.yaml", ANNOTATED)], &[]);
    let mut seen = Vec::new();
    for _ in 0..4 {
        let m = q("api.ns1.svc.clusterset.local.", "A").udp(s.addr);
        assert_eq!(m.answers.len(), 1, "max-answers 1");
        seen.extend(addresses(&m));
    }
    seen.sort();
    seen.dedup();
    assert_eq!(seen, ["10.1.9.1", "10.1.9.2"], "ready endpoints, rotated; never the VIP");
    // Other ClusterSetIP services keep the spec's VIP…
    assert_eq!(addresses(&q("vip4.ns1.svc.clusterset.local.", "A").udp(s.addr)), ["10.0.0.2"]);
    // …unless the flag turns endpoint answers on for all (no ready endpoint: still the VIP).
    let all = TestServer::start(&[("contract.yaml", FIXTURE)], &["--endpoint-answers"]);
    assert_eq!(addresses(&q("vip4.ns1.svc.clusterset.local.", "A").udp(all.addr)), ["10.0.0.2"]);
}

#[test]
fn a_service_with_bad_annotations_is_served_with_the_defaults() {
    let s = TestServer::start(&[("a.yaml", ANNOTATED)], &[]);
    check_unordered(
        &q("odd.ns1.svc.clusterset.local.", "A").udp(s.addr),
        "
        NoError aa rd
        ;; ANSWER
        odd.ns1.svc.clusterset.local. 5 IN A 10.1.8.1
        odd.ns1.svc.clusterset.local. 5 IN A 10.1.8.2
    ",
    );
}

#[test]
fn rotation_spreads_first_answers_over_udp() {
    let s = TestServer::start(&[("contract.yaml", FIXTURE)], &[]);
    let mut first = std::collections::BTreeMap::<IpAddr, u32>::new();
    for _ in 0..60 {
        let m = q("hl.ns1.svc.clusterset.local.", "A").udp(s.addr);
        assert_eq!(m.answers.len(), 3);
        let ip: IpAddr = m.answers[0].data.to_string().parse().expect("valid");
        *first.entry(ip).or_default() += 1;
    }
    assert_eq!(first.values().copied().collect::<Vec<_>>(), [20, 20, 20], "{first:?}");
}

#[test]
fn explain_shows_candidates_decision_and_the_exact_answer() {
    let s = TestServer::start(&[("contract.yaml", FIXTURE)], &["--answer-policy", "local-first"]);
    let report = clusterset_dns::ops::explain::report(
        &s.reader.load_full(),
        "hl.ns1.svc.clusterset.local",
        "A",
        Some("west.eu"),
    )
    .expect("valid");
    assert!(report.contains("policy: local-first"), "{report}");
    assert!(report.contains("candidates (4):"), "{report}");
    // Each candidate with its slice's zone, or none.
    let line = |name: &str| report.lines().find(|l| l.contains(name)).unwrap_or_default().to_owned();
    assert!(line("web-0").contains("zone us-east-1a"), "{report}");
    assert!(line("web-1").contains("zone -"), "{report}");
    assert!(report.contains("decision:"), "{report}");
    assert!(
        report.ends_with("answer: NoError\n  hl.ns1.svc.clusterset.local. 5 IN A 10.2.0.1\n"),
        "{report}"
    );
    assert!(
        clusterset_dns::ops::explain::report(
            &s.reader.load_full(),
            "hl.ns1.svc.clusterset.local",
            "A",
            Some("nowhere")
        )
        .is_err()
    );
}

/// Issue 31: `hl` has one endpoint in `east` (region eu) and one in `west`
/// (us); `open` lifts the flag's boundary, `typo` misspells it. Clients:
/// loopback in `east`, 203.0.113.0/24 in `north` (region ap, no endpoint).
const BOUNDED: &str = "
apiVersion: multicluster.x-k8s.io/v1beta1
kind: ServiceImport
metadata: {name: hl, namespace: fence}
spec: {type: Headless}
---
apiVersion: multicluster.x-k8s.io/v1beta1
kind: ServiceImport
metadata:
  name: open
  namespace: fence
  annotations: {clusterset-dns.io/fallback-boundary: none}
spec: {type: Headless}
---
apiVersion: multicluster.x-k8s.io/v1beta1
kind: ServiceImport
metadata:
  name: typo
  namespace: fence
  annotations: {clusterset-dns.io/fallback-boundary: regoin}
spec: {type: Headless}
";

fn bounded_slices(svc: &str) -> String {
    ["east", "west"]
        .iter()
        .zip(["10.1.0.1", "10.2.0.1"])
        .map(|(cluster, ip)| {
            format!(
                "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {svc}-{cluster}\n  \
                 namespace: fence\n  labels: {{multicluster.kubernetes.io/service-name: {svc}, \
                 multicluster.kubernetes.io/source-cluster: {cluster}}}\naddressType: IPv4\nendpoints:\n\
                 - addresses: [{ip}]\n"
            )
        })
        .collect()
}

#[test]
fn a_fallback_boundary_never_answers_outside_it_and_explain_shows_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bounded.yaml");
    let text =
        format!("{BOUNDED}{}{}{}", bounded_slices("hl"), bounded_slices("open"), bounded_slices("typo"));
    std::fs::write(&path, text).expect("write");
    let s = crate::harness::served::Served::start(&[
        "--objects",
        path.to_str().expect("path"),
        "--answer-policy",
        "topology",
        "--fallback-boundary",
        "region",
        "--negative-ttl",
        "30",
        "--client-cluster",
        "127.0.0.0/8=east",
        "--client-cluster",
        "203.0.113.0/24=north",
        "--cluster-region",
        "east=eu",
        "--cluster-region",
        "west=us",
        "--cluster-region",
        "north=ap",
    ]);
    s.wait_ready(std::time::Duration::from_secs(10));
    let short = |name: &str, more: &[&str]| {
        let mut args = vec![name, "A", "+short"];
        args.extend_from_slice(more);
        s.dig(&args).lines().map(str::to_owned).collect::<Vec<_>>()
    };
    // East's client: east's endpoint, never west's (other region).
    assert_eq!(short("hl.fence.svc.clusterset.local", &[]), ["10.1.0.1"]);
    // North's client has nothing inside ap: NOERROR, no address, the SOA
    // with the zone's negative TTL.
    let north = ["+subnet=203.0.113.0/24"];
    let full = s.dig(&["hl.fence.svc.clusterset.local", "A", north[0], "+noall", "+comments", "+authority"]);
    assert!(full.contains("status: NOERROR"), "{full}");
    assert!(full.contains("ANSWER: 0,"), "{full}");
    let soa = full.lines().find(|l| l.contains("\tSOA\t")).unwrap_or_else(|| panic!("no SOA: {full}"));
    assert_eq!(soa.split_whitespace().nth(1), Some("30"), "the negative TTL: {soa}");
    // `none` lifts the flag's boundary for one service.
    let mut open = short("open.fence.svc.clusterset.local", &north);
    open.sort();
    assert_eq!(open, ["10.1.0.1", "10.2.0.1"]);
    // A value not understood is logged, naming the object and the
    // annotation, and leaves the flag's boundary in place.
    assert!(short("typo.fence.svc.clusterset.local", &north).is_empty());
    let log = s.log();
    assert!(
        log.lines().any(|l| l.contains("ServiceImport fence/typo")
            && l.contains("clusterset-dns.io/fallback-boundary")
            && l.contains("regoin")),
        "{log}"
    );
    // `dig CH TXT` shows the boundary, what is inside, and who is outside.
    let out = s.dig(&["CH", "TXT", "hl.fence.svc.clusterset.local", "+short", "+tcp"]);
    let lines: Vec<&str> = out.lines().map(|l| l.trim_matches('"')).collect();
    assert!(lines.contains(&"boundary: region (inside: region eu; never answered outside it)"), "{out}");
    let west = lines.iter().find(|l| l.contains("10.2.0.1") && l.contains("cluster west")).expect("west");
    assert!(west.contains("tier outside"), "{out}");
    let out = s.dig(&["CH", "TXT", "hl.fence.svc.clusterset.local", "+short", "+tcp", north[0]]);
    assert!(out.contains("decision: no ready endpoint inside the region boundary: NODATA"), "{out}");
}
