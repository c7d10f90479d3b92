//! Reverse names (`dig -x`): PTR answers for the addresses the services
//! name, a clusterset VIP to its service and a headless endpoint to its own
//! name, over UDP and TCP against the embedded example fleet; every other
//! address is refused, so its reverse name stays the cluster DNS's.
//! Through a real CoreDNS with the kubernetes plugin: tests/it/coredns.rs.

use hickory_proto::op::ResponseCode;

use crate::harness::served::Served;
use crate::support::{TestServer, check};

#[test]
fn addresses_the_services_name_answer_ptr_and_others_are_refused() {
    let s = TestServer::embedded();
    for (ip, name) in [
        // A ClusterSetIP service's VIP (zones/shop.yaml).
        ("10.0.42.10.in-addr.arpa.", "web.shop.svc.clusterset.local."),
        // Headless: a StatefulSet Pod's hostname, and an endpoint without one.
        ("10.4.1.10.in-addr.arpa.", "db-0.cluster-a.db.shop.svc.clusterset.local."),
        ("20.6.1.10.in-addr.arpa.", "10-1-6-20.cluster-a.cache.shop.svc.clusterset.local."),
        (
            "0.2.0.0.6.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.1.0.0.0.0.0.d.f.ip6.arpa.",
            "fd00-1--6-20.cluster-a.cache.shop.svc.clusterset.local.",
        ),
    ] {
        let expected = format!("NoError aa rd\n;; ANSWER\n{ip} 5 IN PTR {name}\n");
        check(&crate::support::q(ip, "PTR").udp(s.addr), &expected);
        check(&crate::support::q(ip, "PTR").tcp(s.addr), &expected);
    }
    // The name exists without other types: NODATA, with no SOA (the
    // reverse zone is not ours to give one for).
    check(&crate::support::q("10.0.42.10.in-addr.arpa.", "A").udp(s.addr), "NoError aa rd\n");
    // The owner echoes the query's spelling.
    let m = crate::support::q("10.0.42.10.IN-ADDR.Arpa.", "PTR").udp(s.addr);
    assert_eq!(m.answers[0].name.to_string(), "10.0.42.10.IN-ADDR.Arpa.");
    // Addresses no service names, reverse zones and malformed names: refused.
    for name in
        ["9.9.9.10.in-addr.arpa.", "0.42.10.in-addr.arpa.", "010.0.42.10.in-addr.arpa.", "in-addr.arpa."]
    {
        let m = crate::support::q(name, "PTR").udp(s.addr);
        assert_eq!(m.metadata.response_code, ResponseCode::Refused, "{name}");
        assert!(!m.metadata.authoritative && m.answers.is_empty(), "{name}");
    }
}

#[test]
fn dig_x_of_a_vip_gives_the_service_name_never_the_vip_service() {
    let s = Served::start(&[]);
    assert_eq!(s.dig(&["-x", "10.42.0.10", "+short"]).trim(), "web.shop.svc.clusterset.local.");
    assert_eq!(
        s.dig(&["-x", "fd00:1::6:20", "+short"]).trim(),
        "fd00-1--6-20.cluster-a.cache.shop.svc.clusterset.local."
    );
    assert!(s.dig(&["-x", "192.0.2.1"]).contains("status: REFUSED"));
}
