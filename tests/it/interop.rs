//! `--interop` (issue 13): Karmada's and Kosmos's objects, shaped exactly as
//! their controllers write them in a member cluster (the fixtures in
//! `tests/data/interop/` cite the upstream sources), answered over the wire.
//! This file reads them as `--objects` files: the answers a user reproduces
//! from `kubectl get -o yaml` output with no cluster. `watch.rs` serves the
//! same objects from a real API server.

use crate::support::{TestServer, check, check_unordered, q};

pub const KARMADA: &str = include_str!("../data/interop/karmada.yaml");
pub const KOSMOS: &str = include_str!("../data/interop/kosmos.yaml");

/// The answers of the Karmada fixture, as `watch.rs` expects them too.
pub const KARMADA_WEB_A: &str = "
    NoError aa rd
    ;; ANSWER
    web.shop.svc.clusterset.local. 5 IN A 10.96.120.15
";
pub const KARMADA_DB_A: &str = "
    NoError aa rd
    ;; ANSWER
    db.shop.svc.clusterset.local. 5 IN A 10.244.1.31
    db.shop.svc.clusterset.local. 5 IN A 10.244.1.32
";
pub const KARMADA_CACHE_A: &str = "
    NoError aa rd
    ;; ANSWER
    cache.shop.svc.clusterset.local. 5 IN A 10.96.130.7
";
pub const KOSMOS_WEB_A: &str = "
    NoError aa rd
    ;; ANSWER
    web.shop.svc.clusterset.local. 5 IN A 10.96.77.21
";
/// Both endpoints are ready; 10.233.65.32 is in the import's
/// `kosmos.io/disconnected-address`, so it is demoted like a failed probe.
pub const KOSMOS_DB_A: &str = "
    NoError aa rd
    ;; ANSWER
    db.shop.svc.clusterset.local. 5 IN A 10.233.64.31
";

#[test]
fn karmada_member_answers_from_files() {
    let s = TestServer::start(&[("karmada.yaml", KARMADA)], &["--interop", "karmada"]);
    check(&q("web.shop.svc.clusterset.local.", "A").udp(s.addr), KARMADA_WEB_A);
    check_unordered(&q("db.shop.svc.clusterset.local.", "A").udp(s.addr), KARMADA_DB_A);
    check(
        &q("db-0.member1.db.shop.svc.clusterset.local.", "A").udp(s.addr),
        "
        NoError aa rd
        ;; ANSWER
        db-0.member1.db.shop.svc.clusterset.local. 5 IN A 10.244.1.31
    ",
    );
    check(&q("cache.shop.svc.clusterset.local.", "A").udp(s.addr), KARMADA_CACHE_A);
    // The import's port, on the derived Service's address.
    let srv = q("_http._tcp.web.shop.svc.clusterset.local.", "SRV").udp(s.addr);
    assert!(
        crate::support::render(&srv).contains("SRV 0 100 80 web.shop.svc.clusterset.local."),
        "{}",
        crate::support::render(&srv)
    );
}

#[test]
fn without_interop_the_same_files_answer_as_before() {
    let s = TestServer::start(&[("karmada.yaml", KARMADA)], &[]);
    // The import without spec.ips: NODATA, as it always was.
    let m = q("web.shop.svc.clusterset.local.", "A").udp(s.addr);
    assert!(m.answers.is_empty(), "{}", crate::support::render(&m));
    assert_eq!(m.metadata.response_code, hickory_proto::op::ResponseCode::NoError);
    // No import, no name.
    let m = q("cache.shop.svc.clusterset.local.", "A").udp(s.addr);
    assert_eq!(m.metadata.response_code, hickory_proto::op::ResponseCode::NXDomain);
}

#[test]
fn kosmos_leaf_answers_from_files_with_the_disconnected_address_demoted() {
    let s = TestServer::start(&[("kosmos.yaml", KOSMOS)], &["--interop", "kosmos"]);
    check(&q("web.shop.svc.clusterset.local.", "A").udp(s.addr), KOSMOS_WEB_A);
    check_unordered(&q("db.shop.svc.clusterset.local.", "A").udp(s.addr), KOSMOS_DB_A);
    let report = clusterset_dns::ops::explain::report(
        &s.reader.load_full(),
        "db.shop.svc.clusterset.local",
        "A",
        None,
    )
    .expect("explain");
    assert!(report.contains("10.233.65.32") && report.contains("UNHEALTHY"), "{report}");
    // The root Service's port, not the import's placeholder 80.
    let srv = crate::support::render(&q("_pg._tcp.db.shop.svc.clusterset.local.", "SRV").udp(s.addr));
    assert!(srv.contains(" 5432 "), "{srv}");
}

/// The conflict rule, whatever order the objects come in: the import's own
/// `spec.ips` win over a backing Service, and MCS slices over foreign ones.
#[test]
fn mcs_objects_win_over_fleet_manager_shapes_in_any_order() {
    let import = "apiVersion: multicluster.x-k8s.io/v1alpha1
kind: ServiceImport
metadata: {name: web, namespace: shop}
spec: {type: ClusterSetIP, ips: [10.0.0.50], ports: [{name: http, port: 80, protocol: TCP}]}
";
    let mcs_slice = "apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-mcs
  namespace: shop
  labels: {multicluster.kubernetes.io/service-name: web, multicluster.kubernetes.io/source-cluster: east}
addressType: IPv4
endpoints: [{addresses: [10.1.0.9]}]
";
    let karmada = KARMADA
        .split("\n---\n")
        .filter(|d| d.contains("name: derived-web") || d.contains("imported-member1-web"))
        .collect::<Vec<_>>()
        .join("\n---\n");
    for files in [
        [("a.yaml", import.to_owned()), ("b.yaml", format!("{karmada}\n---\n{mcs_slice}"))],
        [("a.yaml", format!("{mcs_slice}\n---\n{karmada}")), ("b.yaml", import.to_owned())],
    ] {
        let files: Vec<(&str, &str)> = files.iter().map(|(n, t)| (*n, t.as_str())).collect();
        let s = TestServer::start(&files, &["--interop", "karmada", "--endpoint-answers"]);
        check(
            &q("web.shop.svc.clusterset.local.", "A").udp(s.addr),
            "
            NoError aa rd
            ;; ANSWER
            web.shop.svc.clusterset.local. 5 IN A 10.1.0.9
        ",
        );
        let s = TestServer::start(&files, &["--interop", "karmada"]);
        check(
            &q("web.shop.svc.clusterset.local.", "A").udp(s.addr),
            "
            NoError aa rd
            ;; ANSWER
            web.shop.svc.clusterset.local. 5 IN A 10.0.0.50
        ",
        );
    }
}
