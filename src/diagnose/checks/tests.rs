//! Unit tests of doctor's checks (`checks.rs`).

use super::*;
use crate::diagnose::observed::{SeenCondition, SeenImport, SeenService};
use crate::diagnose::report::{HEALTHY, INCOMPLETE, PROBLEMS, exit_status};
use crate::fleet::export::SessionAffinity;
use crate::model::{DnsLabel, Protocol, ServiceKey};

fn port(name: &str, number: u16) -> ServicePortSpec {
    ServicePortSpec {
        name: Some(DnsLabel::parse(name).unwrap()),
        protocol: Protocol::Tcp,
        port: number,
        app_protocol: None,
    }
}

fn service(kind: ImportType, ports: Vec<ServicePortSpec>) -> SeenService {
    SeenService {
        type_: "ClusterIP".into(),
        headless: kind == ImportType::Headless,
        cluster_ips: vec![],
        exported: Exported::Service(ExportedService {
            kind,
            ports,
            session_affinity: SessionAffinity::None,
            affinity_timeout: None,
            ip_families: vec![AddressFamily::V4],
            cluster_ips: vec![],
            traffic_distribution: None,
            internal_traffic_policy: None,
        }),
    }
}

fn export(created: i64, conflict: Option<&str>) -> SeenExport {
    let c = |t: &str, s: &str, r: &str| SeenCondition {
        type_: t.into(),
        status: s.into(),
        reason: r.into(),
        message: String::new(),
    };
    let conflict = match conflict {
        None => c("Conflict", "False", "NoConflicts"),
        Some(r) => c("Conflict", "True", r),
    };
    SeenExport {
        created,
        created_text: format!("t{created}"),
        conditions: vec![c("Valid", "True", "Valid"), conflict, c("Ready", "True", "Exported")],
        annotations: Default::default(),
        metadata: Default::default(),
    }
}

fn import(ips: &[&str], ports: Vec<ServicePortSpec>, clusters: &[&str]) -> SeenImport {
    SeenImport {
        type_: if ips.is_empty() { "Headless" } else { "ClusterSetIP" }.into(),
        ips: ips.iter().map(|s| (*s).to_owned()).collect(),
        ports,
        clusters: clusters.iter().map(|s| (*s).to_owned()).collect(),
        unreachable: vec![],
        endpoint_answers: false,
    }
}

fn slice(source: Option<&str>, ready: &[&str]) -> SeenSlice {
    SeenSlice {
        name: format!("web-{}", source.unwrap_or("x")),
        source: source.map(str::to_owned),
        managed_by: source.map(|_| MANAGED_BY.to_owned()),
        service_name: None,
        ready: ready.iter().map(|a| a.parse().unwrap()).collect(),
        not_ready: 0,
    }
}

fn member(name: &str) -> MemberSeen {
    MemberSeen {
        name: name.into(),
        cluster: ClusterId::parse(name).unwrap(),
        service: Seen::Read(None),
        export: Seen::Read(None),
        import: Seen::Read(None),
        vip: Seen::Read(None),
        mcs_slices: Seen::Read(vec![]),
        own_slices: Seen::Read(vec![]),
        dns: None,
    }
}

/// cluster-a and cluster-b export web (http 80, one endpoint each);
/// cluster-c only imports. Every member has the import, its VIP and
/// both clusters' slices.
fn healthy() -> Observed {
    let mut members = Vec::new();
    for (i, name) in ["cluster-a", "cluster-b", "cluster-c"].into_iter().enumerate() {
        let mut m = member(name);
        if i < 2 {
            m.service = Seen::Read(Some(service(ImportType::ClusterSetIp, vec![port("http", 80)])));
            m.export = Seen::Read(Some(export(10 + i as i64, None)));
            m.own_slices = Seen::Read(vec![slice(None, &[&format!("10.{i}.0.1")])]);
        }
        let vip = format!("10.96.0.{}", 10 + i);
        m.import = Seen::Read(Some(import(&[&vip], vec![port("http", 80)], &["cluster-a", "cluster-b"])));
        m.vip = Seen::Read(Some(vec![vip]));
        m.mcs_slices = Seen::Read(vec![
            slice(Some("cluster-a"), &["10.0.0.1"]),
            slice(Some("cluster-b"), &["10.1.0.1"]),
        ]);
        members.push(m);
    }
    Observed {
        key: ServiceKey {
            namespace: DnsLabel::parse("shop").unwrap(),
            name: DnsLabel::parse("web").unwrap(),
        },
        fqdn: "web.shop.svc.clusterset.local.".into(),
        vip_name: "web-clusterset-19ea9383".into(),
        members,
    }
}

fn dns(a: &[&str]) -> SeenDns {
    SeenDns {
        server: "127.0.0.1:53".parse().unwrap(),
        name: "web.shop.svc.clusterset.local.".into(),
        a: Answer::Response { rcode: "NOERROR".into(), records: a.iter().map(|s| (*s).to_owned()).collect() },
        aaaa: Answer::Response { rcode: "NOERROR".into(), records: vec![] },
        srv: Answer::Response {
            rcode: "NOERROR".into(),
            records: vec!["0 100 80 web.shop.svc.clusterset.local.".into()],
        },
    }
}

fn codes(o: &Observed) -> Vec<&'static str> {
    verdicts(o).iter().map(|v| v.code).collect()
}

fn find(o: &Observed, code: &str) -> Verdict {
    let all = verdicts(o);
    all.iter().find(|v| v.code == code).cloned().unwrap_or_else(|| panic!("no {code} in {all:#?}"))
}

#[test]
fn a_consistent_service_has_no_verdict() {
    let mut o = healthy();
    o.members[2].dns = Some(dns(&["10.96.0.12"]));
    assert_eq!(codes(&o), Vec::<&str>::new(), "{:#?}", verdicts(&o));
    assert_eq!(exit_status(&o, &verdicts(&o)), HEALTHY);
}

#[test]
fn a_port_conflict_names_the_cluster_the_port_and_the_winner() {
    let mut o = healthy();
    o.members[1].service = Seen::Read(Some(service(ImportType::ClusterSetIp, vec![port("http", 8080)])));
    o.members[0].export = Seen::Read(Some(export(10, Some("PortConflict"))));
    o.members[1].export = Seen::Read(Some(export(11, Some("PortConflict"))));
    let v = find(&o, "PortConflict");
    assert_eq!(v.severity, Severity::Error);
    assert_eq!(v.clusters, ["cluster-b", "cluster-a"]);
    assert_eq!(
        v.problem,
        "cluster-b exports port http (TCP/8080) but the import lists http (TCP/80): PortConflict, the oldest export, in cluster-a, wins"
    );
    assert!(v.action.contains("cluster-b's Service port http (TCP/80)"), "{}", v.action);
    // The conditions agree with the objects: nothing stale.
    assert!(!codes(&o).contains(&"StaleCondition"), "{:#?}", verdicts(&o));
    assert_eq!(exit_status(&o, &verdicts(&o)), PROBLEMS);
    // A condition that does not show the conflict yet is stale.
    o.members[1].export = Seen::Read(Some(export(11, None)));
    assert_eq!(find(&o, "StaleCondition").clusters, ["cluster-b"]);
}

#[test]
fn the_oldest_export_wins_whatever_the_member_order() {
    let mut o = healthy();
    o.members[0].service = Seen::Read(Some(service(ImportType::Headless, vec![port("http", 80)])));
    o.members[0].export = Seen::Read(Some(export(20, Some("TypeConflict"))));
    o.members[1].export = Seen::Read(Some(export(5, Some("TypeConflict"))));
    let v = find(&o, "TypeConflict");
    assert_eq!(
        v.problem,
        "cluster-a's Service is Headless but the import is ClusterSetIP (from cluster-b): TypeConflict, the oldest export, in cluster-b, wins"
    );
}

#[test]
fn a_missing_import_and_its_nxdomain_are_one_verdict() {
    let mut o = healthy();
    o.members[2].import = Seen::Read(None);
    o.members[2].dns = Some(SeenDns {
        a: Answer::Response { rcode: "NXDOMAIN".into(), records: vec![] },
        aaaa: Answer::Response { rcode: "NXDOMAIN".into(), records: vec![] },
        ..dns(&[])
    });
    assert_eq!(codes(&o), ["ImportMissing"]);
    assert_eq!(find(&o, "ImportMissing").clusters, ["cluster-c"]);
}

#[test]
fn slices_from_a_cluster_that_no_longer_exports_are_stale() {
    let mut o = healthy();
    o.members[1].export = Seen::Read(None);
    for m in &mut o.members {
        if let Seen::Read(Some(i)) = &mut m.import {
            i.clusters = vec!["cluster-a".into()];
        }
    }
    let v = find(&o, "StaleSlices");
    assert_eq!(v.severity, Severity::Error);
    assert!(
        v.problem
            .starts_with("cluster-a has MCS EndpointSlices from cluster-b, which does not export shop/web"),
        "{}",
        v.problem
    );
    assert!(v.action.contains("multicluster.kubernetes.io/source-cluster=cluster-b"), "{}", v.action);
    // cluster-b still has the Service: a note, not a problem.
    assert!(codes(&o).contains(&"NotExportedHere"));
}

#[test]
fn a_cluster_missing_from_a_members_slices_is_an_error_and_a_short_one_is_stale() {
    let mut o = healthy();
    o.members[2].mcs_slices = Seen::Read(vec![slice(Some("cluster-a"), &["10.0.0.1"])]);
    let v = find(&o, "SlicesMissing");
    assert_eq!(v.clusters, ["cluster-c", "cluster-b"]);
    o.members[2].mcs_slices =
        Seen::Read(vec![slice(Some("cluster-a"), &["10.0.0.1"]), slice(Some("cluster-b"), &[])]);
    assert_eq!(find(&o, "SlicesStale").severity, Severity::Warning);
}

#[test]
fn import_ips_are_checked_against_the_vip_and_the_dns_answer() {
    let mut o = healthy();
    o.members[2].vip = Seen::Read(Some(vec!["10.96.0.99".into()]));
    o.members[1].dns = Some(dns(&["10.96.0.77"]));
    let v = find(&o, "VipMismatch");
    assert!(
        v.problem.contains("lists ips 10.96.0.12 but the clusterset VIP allocated there is 10.96.0.99"),
        "{}",
        v.problem
    );
    assert!(!v.problem.contains("19ea9383"), "the internal name is not what users call: {}", v.problem);
    let d = find(&o, "DnsMismatch");
    assert_eq!(d.clusters, ["cluster-b"]);
    assert!(
        d.problem.contains("answers 10.96.0.77") && d.problem.contains("lists ips 10.96.0.11"),
        "{}",
        d.problem
    );
    // Answers with the ready endpoints are endpoint answers, a note.
    o.members[1].dns = Some(dns(&["10.0.0.1", "10.1.0.1"]));
    assert!(codes(&o).contains(&"EndpointAnswers"));
    assert!(!codes(&o).contains(&"DnsMismatch"));
}

#[test]
fn headless_answers_must_be_ready_endpoints_and_a_subset_is_a_note() {
    let mut o = healthy();
    for m in &mut o.members {
        if let Seen::Read(Some(s)) = &mut m.service {
            *s = service(ImportType::Headless, vec![port("http", 80)]);
        }
        m.import = Seen::Read(Some(import(&[], vec![port("http", 80)], &["cluster-a", "cluster-b"])));
        m.vip = Seen::Read(None);
    }
    o.members[2].dns = Some(dns(&["10.0.0.1"]));
    assert_eq!(codes(&o), ["DnsSubset"]);
    o.members[2].dns = Some(dns(&["10.0.0.1", "10.9.9.9"]));
    assert_eq!(codes(&o), ["DnsMismatch"]);
    o.members[2].dns = Some(SeenDns { a: Answer::NoResponse("no answer within 1s".into()), ..dns(&[]) });
    assert_eq!(codes(&o), ["DnsNoAnswer"]);
}

#[test]
fn an_export_without_a_service_and_a_service_nobody_exports() {
    let mut o = healthy();
    o.members[1].service = Seen::Read(None);
    o.members[1].own_slices = Seen::Read(vec![]);
    let v = find(&o, "NoService");
    assert_eq!(v.problem, "cluster-b exports shop/web but has no Service shop/web");
    let mut o = healthy();
    for m in &mut o.members {
        m.export = Seen::Read(None);
        m.import = Seen::Read(None);
        m.vip = Seen::Read(None);
        m.mcs_slices = Seen::Read(vec![]);
    }
    let v = find(&o, "NotExported");
    assert_eq!(v.clusters, ["cluster-a", "cluster-b"]);
    assert!(v.problem.contains("Services exist in cluster-a, cluster-b"), "{}", v.problem);
}

#[test]
fn forbidden_reads_are_warnings_and_an_unreachable_member_is_incomplete() {
    let mut o = healthy();
    o.members[2].import = Seen::Forbidden("serviceimports is forbidden".into());
    assert_eq!(codes(&o), ["Forbidden"]);
    assert_eq!(exit_status(&o, &verdicts(&o)), PROBLEMS);
    // Exports that cannot be read make nothing stale.
    o.members[1].export = Seen::Forbidden("serviceexports is forbidden".into());
    assert!(!codes(&o).contains(&"StaleSlices"), "{:#?}", verdicts(&o));
    o.members[1].service = Seen::Failed("connection refused".into());
    assert!(codes(&o).contains(&"Unreachable"));
    assert_eq!(exit_status(&o, &verdicts(&o)), INCOMPLETE);
}
