//! Every rule of the contract in `docs/answers.md`, over UDP and TCP. Each
//! test names the rule it guards; the expected answers are zone-file text.

use crate::harness::served::Served;
use crate::support::{TestServer, check, check_unordered, decode, q, tcp_raw, udp_raw};

const FIXTURE: &str = include_str!("../data/contract.yaml");

fn server() -> TestServer {
    TestServer::start(&[("contract.yaml", FIXTURE)], &["--advertise-address", "192.0.2.53"])
}

/// Checks the same query over UDP and TCP. Record order within a section
/// is not compared: the contract leaves it open and the answer policies
/// (rotation by default for headless services) use that room.
#[track_caller]
fn both(s: &TestServer, query: crate::support::Q, expected: &str) {
    check_unordered(&query.udp(s.addr), expected);
    check_unordered(&query.tcp(s.addr), expected);
}

#[test]
fn dns_version_txt_is_1_0_0_with_ttl_28800() {
    let s = server();
    both(
        &s,
        q("dns-version.clusterset.local.", "TXT"),
        r#"
        NoError aa rd
        ;; ANSWER
        dns-version.clusterset.local. 28800 IN TXT 1.0.0
    "#,
    );
}

#[test]
fn clusterset_ip_a_and_aaaa_answer_the_vips_of_each_family() {
    let s = server();
    both(
        &s,
        q("vip.ns1.svc.clusterset.local.", "A"),
        "
        NoError aa rd
        ;; ANSWER
        vip.ns1.svc.clusterset.local. 5 IN A 10.0.0.1
    ",
    );
    both(
        &s,
        q("vip.ns1.svc.clusterset.local.", "AAAA"),
        "
        NoError aa rd
        ;; ANSWER
        vip.ns1.svc.clusterset.local. 5 IN AAAA fd00::1
    ",
    );
}

#[test]
fn clusterset_ip_answer_ignores_endpoint_readiness() {
    let s = server();
    both(
        &s,
        q("vip4.ns1.svc.clusterset.local.", "A"),
        "
        NoError aa rd
        ;; ANSWER
        vip4.ns1.svc.clusterset.local. 5 IN A 10.0.0.2
    ",
    );
}

#[test]
fn family_without_vip_and_import_without_ips_are_nodata_with_soa() {
    let s = server();
    for (name, t) in [("vip4.ns1.svc.clusterset.local.", "AAAA"), ("noip.ns1.svc.clusterset.local.", "A")] {
        let m = q(name, t).udp(s.addr);
        assert_eq!(m.metadata.response_code, hickory_proto::op::ResponseCode::NoError, "{name} {t}");
        assert!(m.answers.is_empty());
        assert_eq!(m.authorities.len(), 1);
        assert_eq!(m.authorities[0].record_type(), hickory_proto::rr::RecordType::SOA);
        assert!(m.metadata.authoritative);
    }
}

#[test]
fn headless_a_and_aaaa_answer_ready_endpoints_of_every_cluster() {
    let s = server();
    both(
        &s,
        q("hl.ns1.svc.clusterset.local.", "A"),
        "
        NoError aa rd
        ;; ANSWER
        hl.ns1.svc.clusterset.local. 5 IN A 10.1.0.1
        hl.ns1.svc.clusterset.local. 5 IN A 10.1.0.2
        hl.ns1.svc.clusterset.local. 5 IN A 10.2.0.1
    ",
    );
    both(
        &s,
        q("hl.ns1.svc.clusterset.local.", "AAAA"),
        "
        NoError aa rd
        ;; ANSWER
        hl.ns1.svc.clusterset.local. 5 IN AAAA fd00:2::10
    ",
    );
}

#[test]
fn headless_without_ready_endpoints_is_nxdomain() {
    let s = server();
    let m = q("hl-down.ns2.svc.clusterset.local.", "A").udp(s.addr);
    assert_eq!(m.metadata.response_code, hickory_proto::op::ResponseCode::NXDomain);
    assert_eq!(m.authorities.len(), 1, "SOA in authority");
    // …and nothing below it exists either.
    let m = q("_http._tcp.hl-down.ns2.svc.clusterset.local.", "SRV").udp(s.addr);
    assert_eq!(m.metadata.response_code, hickory_proto::op::ResponseCode::NXDomain);
    // The namespace still exists: it holds a ServiceImport.
    let m = q("ns2.svc.clusterset.local.", "A").udp(s.addr);
    assert_eq!(m.metadata.response_code, hickory_proto::op::ResponseCode::NoError);
}

#[test]
fn endpoint_names_use_hostname_else_the_address_and_cluster_ids_may_hold_dots() {
    let s = server();
    both(
        &s,
        q("web-0.east.hl.ns1.svc.clusterset.local.", "A"),
        "
        NoError aa rd
        ;; ANSWER
        web-0.east.hl.ns1.svc.clusterset.local. 5 IN A 10.1.0.1
    ",
    );
    both(
        &s,
        q("10-2-0-1.west.eu.hl.ns1.svc.clusterset.local.", "A"),
        "
        NoError aa rd
        ;; ANSWER
        10-2-0-1.west.eu.hl.ns1.svc.clusterset.local. 5 IN A 10.2.0.1
    ",
    );
    both(
        &s,
        q("fd00-2--10.west.eu.hl.ns1.svc.clusterset.local.", "AAAA"),
        "
        NoError aa rd
        ;; ANSWER
        fd00-2--10.west.eu.hl.ns1.svc.clusterset.local. 5 IN AAAA fd00:2::10
    ",
    );
}

#[test]
fn not_ready_endpoints_have_no_names() {
    let s = server();
    let m = q("web-2.east.hl.ns1.svc.clusterset.local.", "A").udp(s.addr);
    assert_eq!(m.metadata.response_code, hickory_proto::op::ResponseCode::NXDomain);
}

#[test]
fn clusterset_ip_srv_has_one_record_per_named_port() {
    let s = server();
    both(
        &s,
        q("_http._tcp.vip.ns1.svc.clusterset.local.", "SRV"),
        "
        NoError aa rd
        ;; ANSWER
        _http._tcp.vip.ns1.svc.clusterset.local. 5 IN SRV 0 100 80 vip.ns1.svc.clusterset.local.
        ;; ADDITIONAL
        vip.ns1.svc.clusterset.local. 5 IN A 10.0.0.1
        vip.ns1.svc.clusterset.local. 5 IN AAAA fd00::1
    ",
    );
    both(
        &s,
        q("_dns._udp.vip.ns1.svc.clusterset.local.", "SRV"),
        "
        NoError aa rd
        ;; ANSWER
        _dns._udp.vip.ns1.svc.clusterset.local. 5 IN SRV 0 100 53 vip.ns1.svc.clusterset.local.
        ;; ADDITIONAL
        vip.ns1.svc.clusterset.local. 5 IN A 10.0.0.1
        vip.ns1.svc.clusterset.local. 5 IN AAAA fd00::1
    ",
    );
    // The protocol must match: there is no _dns._tcp.
    let m = q("_dns._tcp.vip.ns1.svc.clusterset.local.", "SRV").udp(s.addr);
    assert_eq!(m.metadata.response_code, hickory_proto::op::ResponseCode::NXDomain);
}

/// SRV targets are written in full, lower case (RFC 2782 forbids compressing
/// them); owners elsewhere are compressed against the question and so echo
/// its letter case, which DNS treats as the same name (RFC 4343).
#[test]
fn srv_names_match_case_insensitively_and_echo_the_query_case() {
    let s = server();
    both(
        &s,
        q("_HTTP._Tcp.VIP.ns1.svc.ClusterSet.local.", "SRV"),
        "
        NoError aa rd
        ;; ANSWER
        _HTTP._Tcp.VIP.ns1.svc.ClusterSet.local. 5 IN SRV 0 100 80 vip.ns1.svc.clusterset.local.
        ;; ADDITIONAL
        VIP.ns1.svc.ClusterSet.local. 5 IN A 10.0.0.1
        VIP.ns1.svc.ClusterSet.local. 5 IN AAAA fd00::1
    ",
    );
}

#[test]
fn bare_service_name_srv_lists_every_port_and_collapses_duplicates() {
    let s = server();
    // Four ports, two of them identical (8080/TCP unnamed twice) → three records, weight 100/3.
    both(
        &s,
        q("vip.ns1.svc.clusterset.local.", "SRV"),
        "
        NoError aa rd
        ;; ANSWER
        vip.ns1.svc.clusterset.local. 5 IN SRV 0 33 80 vip.ns1.svc.clusterset.local.
        vip.ns1.svc.clusterset.local. 5 IN SRV 0 33 53 vip.ns1.svc.clusterset.local.
        vip.ns1.svc.clusterset.local. 5 IN SRV 0 33 8080 vip.ns1.svc.clusterset.local.
        ;; ADDITIONAL
        vip.ns1.svc.clusterset.local. 5 IN A 10.0.0.1
        vip.ns1.svc.clusterset.local. 5 IN AAAA fd00::1
    ",
    );
}

#[test]
fn headless_srv_targets_each_ready_endpoint_with_its_slice_port() {
    let s = server();
    both(&s, q("_http._tcp.hl.ns1.svc.clusterset.local.", "SRV"), "
        NoError aa rd
        ;; ANSWER
        _http._tcp.hl.ns1.svc.clusterset.local. 5 IN SRV 0 25 8080 web-0.east.hl.ns1.svc.clusterset.local.
        _http._tcp.hl.ns1.svc.clusterset.local. 5 IN SRV 0 25 8080 web-1.east.hl.ns1.svc.clusterset.local.
        _http._tcp.hl.ns1.svc.clusterset.local. 5 IN SRV 0 25 8081 10-2-0-1.west.eu.hl.ns1.svc.clusterset.local.
        _http._tcp.hl.ns1.svc.clusterset.local. 5 IN SRV 0 25 8081 fd00-2--10.west.eu.hl.ns1.svc.clusterset.local.
        ;; ADDITIONAL
        web-0.east.hl.ns1.svc.clusterset.local. 5 IN A 10.1.0.1
        web-1.east.hl.ns1.svc.clusterset.local. 5 IN A 10.1.0.2
        10-2-0-1.west.eu.hl.ns1.svc.clusterset.local. 5 IN A 10.2.0.1
        fd00-2--10.west.eu.hl.ns1.svc.clusterset.local. 5 IN AAAA fd00:2::10
    ");
}

#[test]
fn clusterset_ip_services_have_no_per_cluster_names() {
    let s = server();
    for name in ["east.vip4.ns1.svc.clusterset.local.", "x.east.vip4.ns1.svc.clusterset.local."] {
        let m = q(name, "A").udp(s.addr);
        assert_eq!(m.metadata.response_code, hickory_proto::op::ResponseCode::NXDomain, "{name}");
    }
}

#[test]
fn empty_non_terminals_are_nodata_not_nxdomain() {
    let s = server();
    for name in [
        "svc.clusterset.local.",
        "ns1.svc.clusterset.local.",
        "east.hl.ns1.svc.clusterset.local.",
        "west.eu.hl.ns1.svc.clusterset.local.",
        "eu.hl.ns1.svc.clusterset.local.",
        "_tcp.vip.ns1.svc.clusterset.local.",
        "dns.clusterset.local.",
    ] {
        let m = q(name, "A").udp(s.addr);
        assert_eq!(m.metadata.response_code, hickory_proto::op::ResponseCode::NoError, "{name}");
        assert!(m.answers.is_empty(), "{name}");
        assert_eq!(m.authorities.len(), 1, "{name}: SOA in authority");
    }
}

#[test]
fn names_that_do_not_exist_are_nxdomain_with_soa() {
    let s = server();
    both(
        &s,
        q("nope.ns1.svc.clusterset.local.", "A"),
        &format!(
            "
        NXDomain aa rd
        ;; AUTHORITY
        clusterset.local. 5 IN SOA ns.dns.clusterset.local. hostmaster.clusterset.local. {} 7200 1800 86400 5
    ",
            serial(&s)
        ),
    );
    for name in [
        "nope.svc.clusterset.local.",
        "x.nope.clusterset.local.",
        "web.ns1.pod.clusterset.local.",
        "vip.ns1.pod.clusterset.local.",
    ] {
        let m = q(name, "A").udp(s.addr);
        assert_eq!(m.metadata.response_code, hickory_proto::op::ResponseCode::NXDomain, "{name}");
    }
}

fn serial(s: &TestServer) -> u32 {
    s.reader.load().serial()
}

#[test]
fn apex_answers_soa_and_ns_with_glue() {
    let s = server();
    both(
        &s,
        q("clusterset.local.", "SOA"),
        &format!(
            "
        NoError aa rd
        ;; ANSWER
        clusterset.local. 5 IN SOA ns.dns.clusterset.local. hostmaster.clusterset.local. {} 7200 1800 86400 5
    ",
            serial(&s)
        ),
    );
    both(
        &s,
        q("clusterset.local.", "NS"),
        "
        NoError aa rd
        ;; ANSWER
        clusterset.local. 5 IN NS ns.dns.clusterset.local.
        ;; ADDITIONAL
        ns.dns.clusterset.local. 5 IN A 192.0.2.53
    ",
    );
    both(
        &s,
        q("ns.dns.clusterset.local.", "A"),
        "
        NoError aa rd
        ;; ANSWER
        ns.dns.clusterset.local. 5 IN A 192.0.2.53
    ",
    );
}

#[test]
fn types_a_name_does_not_have_are_nodata() {
    let s = server();
    for t in ["MX", "TXT", "SOA", "PTR", "CNAME", "NS"] {
        let m = q("vip.ns1.svc.clusterset.local.", t).udp(s.addr);
        assert_eq!(m.metadata.response_code, hickory_proto::op::ResponseCode::NoError, "{t}");
        assert!(m.answers.is_empty(), "{t}");
        assert_eq!(m.authorities.len(), 1, "{t}");
    }
}

#[test]
fn ttl_and_negative_ttl_are_configurable() {
    let s = TestServer::start(&[("c.yaml", FIXTURE)], &["--ttl", "30", "--negative-ttl", "7"]);
    let m = q("vip.ns1.svc.clusterset.local.", "A").udp(s.addr);
    assert_eq!(m.answers[0].ttl, 30);
    let m = q("nope.ns1.svc.clusterset.local.", "A").udp(s.addr);
    let soa = &m.authorities[0];
    assert_eq!(soa.ttl, 7);
    assert!(soa.to_string().ends_with(" 7200 1800 86400 7"), "{soa}");
}

#[test]
fn outside_the_zone_is_refused_without_aa_or_records() {
    let s = server();
    for (name, t) in [
        (".", "NS"),
        ("example.com.", "A"),
        // A reverse name of an address no service names (those that are
        // named answer PTR: tests/it/reverse.rs).
        ("1.2.0.192.in-addr.arpa.", "PTR"),
        ("local.", "SOA"),
        ("xclusterset.local.", "A"),
    ] {
        for m in [q(name, t).udp(s.addr), q(name, t).tcp(s.addr)] {
            assert_eq!(m.metadata.response_code, hickory_proto::op::ResponseCode::Refused, "{name}");
            assert!(!m.metadata.authoritative, "{name}");
            assert!(m.answers.is_empty() && m.authorities.is_empty() && m.additionals.is_empty(), "{name}");
            assert_eq!(m.queries.len(), 1, "{name}: question echoed");
        }
    }
}

#[test]
fn any_gets_the_rfc8482_hinfo() {
    let s = server();
    both(
        &s,
        q("vip.ns1.svc.clusterset.local.", "ANY"),
        r#"
        NoError aa rd
        ;; ANSWER
        vip.ns1.svc.clusterset.local. 5 IN HINFO RFC8482 
    "#,
    );
    let m = q("nope.ns1.svc.clusterset.local.", "ANY").udp(s.addr);
    assert_eq!(m.metadata.response_code, hickory_proto::op::ResponseCode::NXDomain);
}

#[test]
fn zone_transfers_are_refused_outside_the_allow_list() {
    // Loopback is allowed by default; this server allows another network
    // only (the allowed transfers are tests/it/transfer.rs's).
    let s = TestServer::start(&[("contract.yaml", FIXTURE)], &["--allow-transfer", "192.0.2.0/24"]);
    for t in ["AXFR", "IXFR"] {
        let m = q("clusterset.local.", t).tcp(s.addr);
        assert_eq!(m.metadata.response_code, hickory_proto::op::ResponseCode::Refused, "{t}");
        assert!(m.answers.is_empty(), "{t}");
    }
}

#[test]
fn reply_echoes_id_question_case_and_rd() {
    let s = server();
    let mut query = q("VIP.Ns1.Svc.ClusterSet.Local.", "A");
    query.msg.metadata.id = 0xBEEF;
    query.msg.metadata.recursion_desired = false;
    let m = query.udp(s.addr);
    assert_eq!(m.metadata.id, 0xBEEF);
    assert!(!m.metadata.recursion_desired);
    assert_eq!(m.queries[0].name().to_string(), "VIP.Ns1.Svc.ClusterSet.Local.");
    assert_eq!(
        m.answers[0].name.to_string(),
        "VIP.Ns1.Svc.ClusterSet.Local.",
        "owner echoes the query's case"
    );
    assert!(!m.metadata.recursion_available);
}

#[test]
fn edns_is_echoed_only_when_asked_and_version_above_zero_gets_badvers() {
    let s = server();
    let m = q("vip.ns1.svc.clusterset.local.", "A").udp(s.addr);
    let edns = m.edns.expect("OPT echoed");
    assert_eq!((edns.max_payload(), edns.version()), (1232, 0));
    let m = q("vip.ns1.svc.clusterset.local.", "A").no_edns().udp(s.addr);
    assert!(m.edns.is_none());
    let mut query = q("vip.ns1.svc.clusterset.local.", "A");
    if let Some(e) = query.msg.edns.as_mut() {
        e.set_version(1);
    }
    let m = query.udp(s.addr);
    // 16 is BADVERS with an OPT (hickory-proto names the number BADSIG).
    assert_eq!(u16::from(m.metadata.response_code), 16);
    assert!(m.answers.is_empty());
    assert_eq!(m.edns.map(|e| e.version()), Some(0));
}

#[test]
fn edns_do_bit_is_copied() {
    let s = server();
    let mut query = q("vip.ns1.svc.clusterset.local.", "A");
    if let Some(e) = query.msg.edns.as_mut() {
        e.set_dnssec_ok(true);
    }
    assert!(query.udp(s.addr).edns.expect("OPT").flags().dnssec_ok);
}

/// A headless ServiceImport `ns/name` and its EndpointSlice `slice` from
/// `cluster`, one http port, with `endpoints` (YAML list items).
fn headless_yaml(ns: &str, name: &str, cluster: &str, slice: &str, endpoints: &str) -> String {
    format!(
        "apiVersion: multicluster.x-k8s.io/v1beta1
kind: ServiceImport
metadata: {{name: {name}, namespace: {ns}}}
spec: {{type: Headless, ports: [{{name: http, protocol: TCP, port: 80}}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {slice}
  namespace: {ns}
  labels: {{multicluster.kubernetes.io/service-name: {name}, multicluster.kubernetes.io/source-cluster: {cluster}}}
addressType: IPv4
ports: [{{name: http, protocol: TCP, port: 80}}]
endpoints:
{endpoints}"
    )
}

/// A headless service with `n` ready endpoints in one cluster.
fn big_headless(n: usize) -> String {
    let mut eps = String::new();
    for i in 0..n {
        eps += &format!("- addresses: [10.50.{}.{}]\n  hostname: pod-{i}\n", i / 250, i % 250 + 1);
    }
    headless_yaml("ns1", "big", "a", "big-a", &eps)
}

#[test]
fn too_large_for_udp_sends_whole_records_with_tc_and_tcp_sends_all() {
    let s = TestServer::start(&[("big.yaml", &big_headless(200))], &[]);
    let name = "big.ns1.svc.clusterset.local.";
    // No EDNS: at most 512 bytes.
    let raw = udp_raw(s.addr, &q(name, "A").no_edns().bytes()).expect("response");
    assert!(raw.len() <= 512, "{} bytes", raw.len());
    let m = decode(&raw);
    assert!(m.metadata.truncation);
    assert_eq!(m.answers.len(), (512 - 12 - (name.len() + 1) - 4) / 16);
    // EDNS 1232: more records, still TC, and the OPT survives.
    let raw = udp_raw(s.addr, &q(name, "A").bytes()).expect("response");
    assert!(raw.len() <= 1232);
    let m = decode(&raw);
    assert!(m.metadata.truncation);
    assert!(m.edns.is_some(), "OPT kept on a truncated answer");
    assert_eq!(m.answers.len(), (1232 - 11 - 12 - (name.len() + 1) - 4) / 16);
    // A client offering more than our cap still gets at most 1232.
    assert!(udp_raw(s.addr, &q(name, "A").payload(4096).bytes()).expect("response").len() <= 1232);
    // A client offering less than 512 still gets 512.
    assert!(
        decode(&udp_raw(s.addr, &q(name, "A").payload(100).bytes()).expect("response")).answers.len() > 20
    );
    // TCP: everything.
    let m = q(name, "A").tcp(s.addr);
    assert!(!m.metadata.truncation);
    assert_eq!(m.answers.len(), 200);
}

/// Huge objects: a slice of 1,000 endpoints with long hostnames, and a
/// service whose endpoint name would pass 255 bytes (a 63-byte hostname,
/// cluster id, service and namespace).
fn huge_objects() -> String {
    let mut eps = String::new();
    for i in 0..1000 {
        eps += &format!(
            "- addresses: [10.60.{}.{}]\n  hostname: {}-{i:04}\n",
            i / 250,
            i % 250 + 1,
            "h".repeat(50)
        );
    }
    let (svc, ns, c1, c2, host) =
        ("s".repeat(63), "n".repeat(63), "c".repeat(63), "d".repeat(63), "x".repeat(63));
    let long = format!("- addresses: [10.61.0.1]\n  hostname: {host}\n");
    format!(
        "{}---\n{}---
apiVersion: multicluster.x-k8s.io/v1beta1
kind: ServiceImport
metadata: {{name: small, namespace: ns1}}
spec: {{type: ClusterSetIP, ips: [10.0.0.9], ports: [{{name: http, protocol: TCP, port: 80}}]}}
",
        headless_yaml("ns1", "big", &c1, "big-a", &eps),
        headless_yaml(&ns, &svc, &c2, "long-a", &long)
    )
}

/// A huge object is served or left out by name, never taking the others
/// with it: 1,000 endpoints answer A over TCP whole (16 KB) and SRV over
/// TCP as many whole records as 64 KiB holds, with TC; an endpoint name
/// over 255 bytes is left out with a warning naming the service and slice,
/// its address still answered; the other services answer as before.
#[test]
fn a_thousand_endpoints_and_names_past_255_bytes_are_served_or_left_out_by_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("huge.yaml"), huge_objects()).expect("write");
    let s = Served::start(&["--objects", dir.path().to_str().expect("path")]);
    s.wait_ready(std::time::Duration::from_secs(20));
    let big = "big.ns1.svc.clusterset.local.";
    let m = q(big, "A").tcp(s.addr);
    assert_eq!((m.answers.len(), m.metadata.truncation), (1000, false));
    let m = q(big, "A").udp(s.addr);
    assert!(m.metadata.truncation && !m.answers.is_empty(), "UDP: whole records and TC");
    let raw = tcp_raw(s.addr, &q(big, "SRV").bytes()).expect("response");
    assert!(raw.len() <= 65535);
    let m = decode(&raw);
    assert!(m.metadata.truncation, "1,000 SRV records of ~180 bytes do not fit in 64 KiB");
    assert!(m.answers.len() > 300, "as many whole records as fit: {}", m.answers.len());
    let host = format!("{}-0007.{}.{big}", "h".repeat(50), "c".repeat(63));
    assert_eq!(q(&host, "A").udp(s.addr).answers.len(), 1, "each endpoint has its name");

    let long = format!("{}.{}.svc.clusterset.local.", "s".repeat(63), "n".repeat(63));
    let m = q(&long, "A").udp(s.addr);
    assert_eq!(m.answers.len(), 1, "the service is answered: {m:?}");
    let m = q(&long, "SRV").udp(s.addr);
    assert_eq!((m.answers.len(), m.authorities.len()), (0, 1), "no SRV target that fits: NODATA");
    assert!(
        s.log().lines().any(|l| l.contains("endpoint name too long")
            && l.contains(&"s".repeat(63))
            && l.contains("long-a")),
        "a warning names the service and the slice:\n{}",
        s.log()
    );
    assert_eq!(q("small.ns1.svc.clusterset.local.", "A").udp(s.addr).answers.len(), 1);
}

#[test]
fn additional_records_that_do_not_fit_are_dropped_without_tc() {
    let s = TestServer::start(&[("big.yaml", &big_headless(6))], &[]);
    // 6 SRV answers (~57 bytes each) fit in 512 bytes; their 6 A records do not all fit.
    let m = q("_http._tcp.big.ns1.svc.clusterset.local.", "SRV").no_edns().udp(s.addr);
    assert_eq!(m.answers.len(), 6);
    assert!(!m.metadata.truncation);
    assert!((1..6).contains(&m.additionals.len()), "{} additional records", m.additionals.len());
    // With room, every additional record is there.
    assert_eq!(q("_http._tcp.big.ns1.svc.clusterset.local.", "SRV").udp(s.addr).additionals.len(), 6);
}

#[test]
fn malformed_queries_get_formerr_or_nothing() {
    let s = server();
    // Shorter than a header: dropped.
    assert!(udp_raw(s.addr, &[0x12, 0x34, 0x01]).is_none());
    // A response (QR=1) is never answered.
    let mut resp = q("vip.ns1.svc.clusterset.local.", "A").bytes();
    resp[2] |= 0x80;
    assert!(udp_raw(s.addr, &resp).is_none());
    // A header with a question that runs off the end: FORMERR, ID echoed.
    let mut cut = q("vip.ns1.svc.clusterset.local.", "A").no_edns().bytes();
    cut.truncate(20);
    let m = decode(&udp_raw(s.addr, &cut).expect("FORMERR"));
    assert_eq!((m.metadata.id, m.metadata.response_code), (0x4242, hickory_proto::op::ResponseCode::FormErr));
    // Two questions: FORMERR.
    let mut two = q("vip.ns1.svc.clusterset.local.", "A").no_edns();
    two.msg.add_query(hickory_proto::op::Query::query(
        hickory_proto::rr::Name::from_ascii("vip4.ns1.svc.clusterset.local.").unwrap(),
        hickory_proto::rr::RecordType::A,
    ));
    let m = decode(&udp_raw(s.addr, &two.bytes()).expect("FORMERR"));
    assert_eq!(m.metadata.response_code, hickory_proto::op::ResponseCode::FormErr);
    // No question at all: FORMERR.
    let m = decode(&udp_raw(s.addr, &[0x12, 0x34, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]).expect("FORMERR"));
    assert_eq!(m.metadata.response_code, hickory_proto::op::ResponseCode::FormErr);
    // A compression pointer looping on itself in the question: FORMERR, no hang.
    let looped = [0x12, 0x34, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xC0, 12, 0, 1, 0, 1];
    let m = decode(&udp_raw(s.addr, &looped).expect("FORMERR"));
    assert_eq!(m.metadata.response_code, hickory_proto::op::ResponseCode::FormErr);
    // The server still answers afterwards.
    assert_eq!(q("vip.ns1.svc.clusterset.local.", "A").udp(s.addr).answers.len(), 1);
}

/// A raw query for a name of exactly `wire_len` bytes in wire form (root
/// included), built from 63-byte labels of `x` and one shorter label.
fn query_of_wire_len(wire_len: usize) -> Vec<u8> {
    let mut name = Vec::new();
    let mut left = wire_len - 1; // the root byte
    while left > 0 {
        let label = (left - 1).min(63);
        name.push(label as u8);
        name.extend(std::iter::repeat_n(b'x', label));
        left -= label + 1;
    }
    name.push(0);
    assert_eq!(name.len(), wire_len);
    let mut q = vec![0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0];
    q.extend(name);
    q.extend([0, 1, 0, 1]);
    q
}

/// RFC 1035 §3.1: names are at most 255 bytes in wire form. Found by the
/// fuzzer: a 256-byte name was answered and echoed, and the response could
/// not be decoded.
#[test]
fn names_longer_than_255_bytes_are_formerr() {
    let s = server();
    let m = decode(&udp_raw(s.addr, &query_of_wire_len(255)).expect("answer"));
    assert_eq!(
        m.metadata.response_code,
        hickory_proto::op::ResponseCode::Refused,
        "255 bytes is a valid name"
    );
    for len in [256, 300] {
        let m = decode(&udp_raw(s.addr, &query_of_wire_len(len)).expect("FORMERR"));
        assert_eq!(m.metadata.response_code, hickory_proto::op::ResponseCode::FormErr, "{len} bytes");
        assert!(m.queries.is_empty(), "{len} bytes: an invalid name is not echoed");
    }
}

#[test]
fn opcodes_other_than_query_get_notimp() {
    let s = server();
    let mut notify = q("clusterset.local.", "SOA");
    notify.msg.metadata.op_code = hickory_proto::op::OpCode::Notify;
    let m = notify.udp(s.addr);
    assert_eq!(m.metadata.response_code, hickory_proto::op::ResponseCode::NotImp);
    assert_eq!(m.metadata.op_code, hickory_proto::op::OpCode::Notify);
}

#[test]
fn queries_of_other_classes_are_refused() {
    // CHAOS answers only the server's identity names (tests/it/dig_debug.rs)
    // and debug TXT of zone names; everything else of another class is refused.
    let s = server();
    for (name, rtype, class) in [
        ("authors.bind.", "TXT", hickory_proto::rr::DNSClass::CH),
        ("vip.ns1.svc.clusterset.local.", "A", hickory_proto::rr::DNSClass::CH),
        ("vip.ns1.svc.clusterset.local.", "A", hickory_proto::rr::DNSClass::HS),
        ("version.bind.", "TXT", hickory_proto::rr::DNSClass::HS),
    ] {
        let mut other = q(name, rtype);
        other.msg.queries[0].set_query_class(class);
        assert_eq!(
            other.udp(s.addr).metadata.response_code,
            hickory_proto::op::ResponseCode::Refused,
            "{name} {rtype} {class:?}"
        );
    }
}

#[test]
fn tcp_connections_answer_pipelined_queries_in_order() {
    use std::io::Write;
    let s = server();
    let mut conn = std::net::TcpStream::connect(s.addr).expect("connect");
    conn.set_read_timeout(Some(std::time::Duration::from_secs(2))).expect("timeout");
    let mut burst = Vec::new();
    for (i, name) in
        ["vip.ns1.svc.clusterset.local.", "vip4.ns1.svc.clusterset.local.", "nope.ns1.svc.clusterset.local."]
            .iter()
            .enumerate()
    {
        let mut query = q(name, "A");
        query.msg.metadata.id = i as u16;
        let b = query.bytes();
        burst.extend_from_slice(&(b.len() as u16).to_be_bytes());
        burst.extend_from_slice(&b);
    }
    conn.write_all(&burst).expect("write");
    for i in 0..3u16 {
        let m = decode(&crate::support::read_frame(&mut conn).expect("frame"));
        assert_eq!(m.metadata.id, i);
    }
    let _ = tcp_raw; // single-shot helper used elsewhere
}

/// The policies, as `--answer-policy` names them.
const POLICIES: [&str; 6] = ["all", "rotation", "random", "weighted", "local-first", "topology"];

/// The contract's rules that concern balanced answers, under every policy:
/// with no client cluster known and no --max-answers, every policy answers
/// every ready endpoint (only the order differs); negative answers, NODATA,
/// ClusterSetIP VIPs, SRV and truncation are untouched.
#[test]
fn every_answer_policy_keeps_the_contract() {
    for policy in POLICIES {
        let s = TestServer::start(
            &[("contract.yaml", FIXTURE), ("big.yaml", &big_headless(200))],
            &["--answer-policy", policy],
        );
        if policy == "all" {
            // The one policy with a fixed order: clusters, then endpoints.
            check(
                &q("hl.ns1.svc.clusterset.local.", "A").udp(s.addr),
                "
                NoError aa rd
                ;; ANSWER
                hl.ns1.svc.clusterset.local. 5 IN A 10.1.0.1
                hl.ns1.svc.clusterset.local. 5 IN A 10.1.0.2
                hl.ns1.svc.clusterset.local. 5 IN A 10.2.0.1
            ",
            );
        }
        for _ in 0..3 {
            both(
                &s,
                q("hl.ns1.svc.clusterset.local.", "A"),
                "
                NoError aa rd
                ;; ANSWER
                hl.ns1.svc.clusterset.local. 5 IN A 10.1.0.1
                hl.ns1.svc.clusterset.local. 5 IN A 10.1.0.2
                hl.ns1.svc.clusterset.local. 5 IN A 10.2.0.1
            ",
            );
            both(
                &s,
                q("hl.ns1.svc.clusterset.local.", "AAAA"),
                "
                NoError aa rd
                ;; ANSWER
                hl.ns1.svc.clusterset.local. 5 IN AAAA fd00:2::10
            ",
            );
        }
        both(
            &s,
            q("vip.ns1.svc.clusterset.local.", "A"),
            "
            NoError aa rd
            ;; ANSWER
            vip.ns1.svc.clusterset.local. 5 IN A 10.0.0.1
        ",
        );
        let m = q("hl-down.ns2.svc.clusterset.local.", "A").udp(s.addr);
        assert_eq!(m.metadata.response_code, hickory_proto::op::ResponseCode::NXDomain, "{policy}");
        let m = q("hl.ns1.svc.clusterset.local.", "MX").udp(s.addr);
        assert_eq!((m.answers.len(), m.authorities.len()), (0, 1), "{policy}: NODATA");
        let m = q("web-0.east.hl.ns1.svc.clusterset.local.", "A").udp(s.addr);
        assert_eq!(m.answers.len(), 1, "{policy}: endpoint names are not balanced");
        // Truncation: whole records, TC, the OPT kept; TCP has them all.
        let name = "big.ns1.svc.clusterset.local.";
        for _ in 0..3 {
            let raw = udp_raw(s.addr, &q(name, "A").no_edns().bytes()).expect("response");
            assert!(raw.len() <= 512, "{policy}");
            let m = decode(&raw);
            assert!(m.metadata.truncation, "{policy}");
            assert_eq!(m.answers.len(), (512 - 12 - (name.len() + 1) - 4) / 16, "{policy}");
            let m = q(name, "A").tcp(s.addr);
            assert!(!m.metadata.truncation, "{policy}");
            assert_eq!(m.answers.len(), 200, "{policy}");
        }
    }
}

/// With a client cluster and a subset size, every policy still answers
/// only ready endpoints, at least one, never more than asked.
#[test]
fn every_answer_policy_answers_a_subset_of_ready_endpoints() {
    let ready: [&str; 3] = ["10.1.0.1", "10.1.0.2", "10.2.0.1"];
    for policy in POLICIES {
        let s = TestServer::start(
            &[("contract.yaml", FIXTURE)],
            &["--answer-policy", policy, "--max-answers", "2", "--client-cluster", "127.0.0.0/8=east"],
        );
        for _ in 0..12 {
            for m in [
                q("hl.ns1.svc.clusterset.local.", "A").udp(s.addr),
                q("hl.ns1.svc.clusterset.local.", "A").tcp(s.addr),
            ] {
                assert!(m.metadata.authoritative && !m.metadata.truncation, "{policy}");
                assert!((1..=2).contains(&m.answers.len()), "{policy}: {} answers", m.answers.len());
                for r in &m.answers {
                    let ip = r.data.to_string();
                    assert!(ready.contains(&ip.as_str()), "{policy}: {ip} is not a ready endpoint");
                }
                if policy == "local-first" || policy == "topology" {
                    assert!(
                        m.answers.iter().all(|r| r.data.to_string().starts_with("10.1.")),
                        "{policy}: east is local"
                    );
                }
            }
        }
    }
}
