//! The same name in every cluster (`--also-zone cluster.local`): every
//! multi-cluster service also answers under the second zone, owners, SRV
//! targets and their addresses in it, so a cluster DNS that falls through
//! to this server resolves `<svc>.<ns>.svc.cluster.local` for services that
//! exist only in other clusters. Against the embedded example over UDP and
//! TCP; through a real CoreDNS with the kubernetes plugin in
//! tests/it/coredns.rs.

use hickory_proto::op::ResponseCode;

use crate::support::{TestServer, check_unordered, q};

fn server() -> TestServer {
    TestServer::embedded_with(&["--also-zone", "cluster.local"])
}

#[test]
fn service_names_answer_in_the_second_zone_with_its_owners_and_targets() {
    let s = server();
    for m in
        [q("web.shop.svc.cluster.local.", "A").udp(s.addr), q("web.shop.svc.cluster.local.", "A").tcp(s.addr)]
    {
        check_unordered(&m, "NoError aa rd\n;; ANSWER\nweb.shop.svc.cluster.local. 5 IN A 10.42.0.10\n");
    }
    check_unordered(
        &q("_postgres._tcp.db.shop.svc.cluster.local.", "SRV").tcp(s.addr),
        "NoError aa rd
;; ANSWER
_postgres._tcp.db.shop.svc.cluster.local. 5 IN SRV 0 33 5432 db-0.cluster-a.db.shop.svc.cluster.local.
_postgres._tcp.db.shop.svc.cluster.local. 5 IN SRV 0 33 5432 db-1.cluster-a.db.shop.svc.cluster.local.
_postgres._tcp.db.shop.svc.cluster.local. 5 IN SRV 0 33 5432 db-0.cluster-b.db.shop.svc.cluster.local.
;; ADDITIONAL
db-0.cluster-a.db.shop.svc.cluster.local. 5 IN A 10.1.4.10
db-1.cluster-a.db.shop.svc.cluster.local. 5 IN A 10.1.5.11
db-0.cluster-b.db.shop.svc.cluster.local. 5 IN A 10.2.4.10
",
    );
    check_unordered(
        &q("db-0.cluster-a.db.shop.svc.cluster.local.", "A").udp(s.addr),
        "NoError aa rd\n;; ANSWER\ndb-0.cluster-a.db.shop.svc.cluster.local. 5 IN A 10.1.4.10\n",
    );
    // The first zone is unchanged: its SRV targets stay in it.
    let m = q("_postgres._tcp.db.shop.svc.clusterset.local.", "SRV").udp(s.addr);
    assert!(m.answers.iter().all(|r| r.data.to_string().ends_with(".svc.clusterset.local.")), "{m:?}");
}

#[test]
fn the_rest_of_the_second_zone_is_not_ours() {
    let s = server();
    // Below `svc`: names that do not exist are NXDOMAIN, with an SOA owned
    // by the second zone's apex (cached by the asker for the negative TTL).
    let m = q("nope.shop.svc.cluster.local.", "A").udp(s.addr);
    assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
    assert_eq!(m.authorities[0].name.to_string(), "cluster.local.");
    // A namespace with services is an empty non-terminal (NODATA), and a
    // type the name does not have is NODATA.
    for (name, t) in [("shop.svc.cluster.local.", "A"), ("web.shop.svc.cluster.local.", "MX")] {
        let m = q(name, t).udp(s.addr);
        assert_eq!(m.metadata.response_code, ResponseCode::NoError, "{name}");
        assert!(m.answers.is_empty(), "{name}");
    }
    // The apex and everything outside `svc` (pods, the cluster's own
    // records) belong to the cluster's DNS: refused.
    for name in ["cluster.local.", "1-2-3-4.shop.pod.cluster.local.", "kubernetes.default.cluster.local."] {
        let m = q(name, "A").udp(s.addr);
        assert_eq!(m.metadata.response_code, ResponseCode::Refused, "{name}");
        assert!(!m.metadata.authoritative, "{name}");
    }
    // Without the flag the second zone is not served at all.
    let plain = TestServer::embedded();
    assert_eq!(
        q("web.shop.svc.cluster.local.", "A").udp(plain.addr).metadata.response_code,
        ResponseCode::Refused
    );
    // And no zone transfer of it.
    assert_eq!(q("cluster.local.", "AXFR").tcp(s.addr).metadata.response_code, ResponseCode::Refused);
}
