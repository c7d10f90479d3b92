//! Unit tests of the single writer (`writer.rs`).

use std::net::IpAddr;
use std::str::FromStr;

use hickory_proto::rr::Name;

use super::*;
use crate::model::{EndpointSet, ImportType, Port, Protocol};
use crate::store::hosts;
use crate::store::{self, Reader, ZoneConfig};

fn store() -> (Reader, Writer) {
    store::new(ZoneConfig::with_defaults(
        Name::from_str("clusterset.local.").unwrap(),
        store::AnswerConfig::standard(),
    ))
}

fn import(ns: &str, name: &str, ip: &str) -> Object {
    Object::Import(ServiceImport {
        key: ServiceKey { namespace: DnsLabel::parse(ns).unwrap(), name: DnsLabel::parse(name).unwrap() },
        kind: ImportType::ClusterSetIp,
        ips: vec![IpAddr::from_str(ip).unwrap()].into(),
        ports: vec![Port { name: None, protocol: Protocol::Tcp, port: 80 }].into(),
        answers: Default::default(),
    })
}

fn service_key(ns: &str, name: &str) -> ServiceKey {
    ServiceKey { namespace: DnsLabel::parse(ns).unwrap(), name: DnsLabel::parse(name).unwrap() }
}

/// A headless import of `ns/name` without ports.
fn headless(ns: &str, name: &str) -> Object {
    Object::Import(ServiceImport {
        key: service_key(ns, name),
        kind: ImportType::Headless,
        ips: Default::default(),
        ports: Default::default(),
        answers: Default::default(),
    })
}

/// An MCS IPv4 slice `slice_ns/slice_name` of `service`, cluster c1,
/// one ready endpoint at `ip`.
fn v4_slice(slice_ns: &str, slice_name: &str, service: ServiceKey, ip: &str) -> Object {
    use crate::model::{AddressFamily, ClusterId, Endpoint, SliceKey, SliceOrigin};
    Object::Slice(EndpointSet {
        slice: SliceKey { namespace: slice_ns.into(), name: slice_name.into() },
        service,
        cluster: ClusterId::parse("c1").unwrap(),
        family: AddressFamily::V4,
        ports: vec![],
        endpoints: vec![Endpoint::new(vec![IpAddr::from_str(ip).unwrap()].into(), true)],
        origin: SliceOrigin::Mcs,
        trigger: Default::default(),
    })
}

fn wire_key(ns: &str, name: &str) -> Vec<u8> {
    names::prefix_key(&[name, ns])
}

#[test]
fn an_edit_to_one_service_re_encodes_only_that_service() {
    let (reader, mut w) = store();
    let objects = (0..1000).map(|i| import("ns", &format!("svc{i}"), "10.0.0.1")).collect();
    w.apply(Update::Replace { source: SourceId::Watch(1), objects });
    assert_eq!(w.publish(), 1000);
    let before = reader.load_full();
    w.apply(Update::Upsert { source: SourceId::Watch(1), object: import("ns", "svc7", "10.0.0.2") });
    assert_eq!(w.publish(), 1);
    let after = reader.load_full();
    assert!(after.serial() > before.serial());
    let untouched = wire_key("ns", "svc8");
    assert!(
        Arc::ptr_eq(before.services.get(&*untouched).unwrap(), after.services.get(&*untouched).unwrap()),
        "untouched services are shared, not rebuilt"
    );
    assert!(!Arc::ptr_eq(
        before.services.get(&*wire_key("ns", "svc7")).unwrap(),
        after.services.get(&*wire_key("ns", "svc7")).unwrap()
    ));
}

#[test]
fn a_relabelled_slice_moves_to_its_new_service_and_is_removed_from_there() {
    use crate::model::SliceKey;
    let (reader, mut w) = store();
    let headless = |n: &str| headless("ns", n);
    let slice = |service: &str, ip: &str| v4_slice("ns", "the-slice", service_key("ns", service), ip);
    let answered = |reader: &Reader, n: &str| {
        let snap = reader.load_full();
        snap.service(&wire_key("ns", n)).and_then(|s| s.balance()).map_or(0, |b| b.endpoints.len())
    };
    let objects = vec![headless("a"), headless("b"), slice("a", "10.0.0.1")];
    w.apply(Update::Replace { source: SourceId::Watch(1), objects });
    w.publish();
    assert_eq!((answered(&reader, "a"), answered(&reader, "b")), (1, 0));
    w.apply(Update::Upsert { source: SourceId::Watch(1), object: slice("b", "10.0.0.2") });
    w.publish();
    assert_eq!((answered(&reader, "a"), answered(&reader, "b")), (0, 1), "moved, not copied");
    // The same again changes nothing; a delete finds it in its new service.
    w.apply(Update::Upsert { source: SourceId::Watch(1), object: slice("b", "10.0.0.2") });
    assert_eq!(w.publish(), 0);
    let id = ObjectId::Slice(SliceKey { namespace: "ns".into(), name: "the-slice".into() });
    w.apply(Update::Remove { source: SourceId::Watch(1), id: id.clone() });
    w.publish();
    assert_eq!((answered(&reader, "a"), answered(&reader, "b")), (0, 0));
    assert!(w.sources.values().all(|s| s.owners.is_empty()));
    // Back, then gone with a relist that no longer holds it.
    w.apply(Update::Upsert { source: SourceId::Watch(1), object: slice("a", "10.0.0.3") });
    w.publish();
    assert_eq!(answered(&reader, "a"), 1);
    w.apply(Update::Replace { source: SourceId::Watch(1), objects: vec![headless("a"), headless("b")] });
    w.publish();
    assert_eq!((answered(&reader, "a"), answered(&reader, "b")), (0, 0));
    assert!(w.sources.values().all(|s| s.owners.is_empty()), "nothing left in the index");
}

#[test]
fn slices_of_one_name_in_two_namespaces_stay_apart_and_a_misfiled_one_is_skipped() {
    use crate::model::SliceKey;
    let (reader, mut w) = store();
    let headless = |ns: &str| headless(ns, "db");
    // A slice is filed by name under its service, its namespace the
    // service's: `slice_ns` differing from `service_ns` is a source's bug.
    let slice = |slice_ns: &str, service_ns: &str, ip: &str| {
        v4_slice(slice_ns, "db-c1", service_key(service_ns, "db"), ip)
    };
    let answered = |reader: &Reader, ns: &str| {
        let snap = reader.load_full();
        let service = snap.service(&wire_key(ns, "db"));
        service.and_then(|s| s.balance()).map(|b| s_addresses(service.unwrap(), b)).unwrap_or_default()
    };
    let objects = vec![
        headless("a"),
        headless("b"),
        slice("a", "a", "10.0.0.1"),
        slice("b", "b", "10.0.0.2"),
        slice("a", "b", "10.0.0.3"),
    ];
    w.apply(Update::Replace { source: SourceId::Watch(1), objects });
    w.publish();
    assert_eq!(answered(&reader, "a"), ["10.0.0.1"]);
    assert_eq!(answered(&reader, "b"), ["10.0.0.2"], "the misfiled slice is not b's");
    // Each is found again by its own id: removing a's leaves b's.
    let id = |ns: &str| ObjectId::Slice(SliceKey { namespace: ns.into(), name: "db-c1".into() });
    w.apply(Update::Remove { source: SourceId::Watch(1), id: id("a") });
    w.publish();
    assert!(answered(&reader, "a").is_empty());
    assert_eq!(answered(&reader, "b"), ["10.0.0.2"]);
    w.apply(Update::Remove { source: SourceId::Watch(1), id: id("b") });
    w.publish();
    assert!(answered(&reader, "b").is_empty());
    assert!(w.sources.values().all(|s| s.owners.is_empty()), "nothing left in the index");
}

#[test]
fn imports_and_slices_with_equal_ports_hold_one_list() {
    use crate::model::{AddressFamily, ClusterId, EndpointSet, SliceKey, SliceOrigin};
    let (_reader, mut w) = store();
    let label = |s: &str| DnsLabel::parse(s).unwrap();
    let http = || vec![Port { name: Some(label("http")), protocol: Protocol::Tcp, port: 80 }];
    let key = |n: &str| ServiceKey { namespace: label("ns"), name: label(n) };
    let import = |n: &str| {
        Object::Import(ServiceImport {
            key: key(n),
            kind: ImportType::Headless,
            ips: Default::default(),
            ports: http().into(),
            answers: Default::default(),
        })
    };
    let slice = |n: &str| {
        Object::Slice(EndpointSet {
            slice: SliceKey { namespace: "ns".into(), name: format!("{n}-c1") },
            service: key(n),
            cluster: ClusterId::parse("c1").unwrap(),
            family: AddressFamily::V4,
            ports: http(),
            endpoints: vec![],
            origin: SliceOrigin::Mcs,
            trigger: Default::default(),
        })
    };
    let objects = vec![import("a"), import("b"), slice("a"), slice("b")];
    w.apply(Update::Replace { source: SourceId::Watch(1), objects });
    let lists: Vec<&Arc<[Port]>> = ["a", "b"]
        .iter()
        .flat_map(|n| {
            let state = &w.services[&key(n)];
            state.imports.values().map(|i| &i.ports).chain(state.slices.values().map(|s| &s.ports))
        })
        .collect();
    assert_eq!(lists.len(), 4);
    assert!(lists.iter().all(|l| Arc::ptr_eq(l, lists[0])), "one allocation for all four");
}

/// The addresses a balanced service answers, as text.
fn s_addresses(names: &ServiceNames, b: &crate::store::Balance) -> Vec<String> {
    b.endpoints.iter().flat_map(|e| names.endpoint_addresses(e)).map(|a| a.to_string()).collect()
}

#[test]
fn an_endpoints_addresses_are_read_back_from_its_records() {
    use crate::model::{AddressFamily, ClusterId, Endpoint, EndpointSet, SliceKey, SliceOrigin};
    let (reader, mut w) = store();
    let key = ServiceKey { namespace: DnsLabel::parse("ns").unwrap(), name: DnsLabel::parse("db").unwrap() };
    let ip = |s: &str| IpAddr::from_str(s).unwrap();
    let ep = |a: &str, target: Option<&str>| {
        Endpoint::new(vec![ip(a)].into(), true).with_names(None, None, target)
    };
    let slice = |name: &str, family, endpoints| {
        Object::Slice(EndpointSet {
            slice: SliceKey { namespace: "ns".into(), name: name.into() },
            service: key.clone(),
            cluster: ClusterId::parse("c1").unwrap(),
            family,
            ports: vec![],
            endpoints,
            origin: SliceOrigin::Mcs,
            trigger: Default::default(),
        })
    };
    let objects = vec![
        Object::Import(ServiceImport {
            key: key.clone(),
            kind: ImportType::Headless,
            ips: Default::default(),
            ports: Default::default(),
            answers: Default::default(),
        }),
        // Pod p0 in both families (paired by targetRef); p1 IPv4 only;
        // an endpoint without a target; and p2 repeating p1's address.
        slice(
            "v4",
            AddressFamily::V4,
            vec![
                ep("10.0.0.1", Some("Pod/ns/p0")),
                ep("10.0.0.2", Some("Pod/ns/p1")),
                ep("10.0.0.3", None),
                ep("10.0.0.2", Some("Pod/ns/p2")),
            ],
        ),
        slice("v6", AddressFamily::V6, vec![ep("fd00::1", Some("Pod/ns/p0"))]),
    ];
    w.apply(Update::Replace { source: SourceId::Watch(1), objects });
    w.publish();
    let snap = reader.load_full();
    let names = snap.service(&wire_key("ns", "db")).unwrap();
    let b = names.balance().unwrap();
    let got: Vec<(String, Vec<IpAddr>)> = b
        .endpoints
        .iter()
        .map(|e| (names.endpoint_label(e), names.endpoint_addresses(e).collect()))
        .collect();
    assert_eq!(
        got,
        vec![
            ("Pod/ns/p0".to_owned(), vec![ip("10.0.0.1"), ip("fd00::1")]),
            ("Pod/ns/p1".to_owned(), vec![ip("10.0.0.2")]),
            ("10.0.0.3".to_owned(), vec![ip("10.0.0.3")]),
            // One record per address: the first endpoint naming it has it.
            ("Pod/ns/p2".to_owned(), vec![]),
        ]
    );
}

#[test]
fn a_cluster_set_ip_services_srv_additional_records_are_its_a_answer() {
    let (reader, mut w) = store();
    let named = |name: &str, ip: &str| {
        let mut object = import("ns", name, ip);
        if let Object::Import(i) = &mut object {
            i.ports = vec![Port {
                name: Some(DnsLabel::parse("http").unwrap()),
                protocol: Protocol::Tcp,
                port: 80,
            }]
            .into();
        }
        object
    };
    w.apply(Update::Replace {
        source: SourceId::Watch(1),
        objects: vec![named("one", "10.0.0.1"), named("two", "10.0.0.2")],
    });
    w.publish();
    let snap = reader.load();
    let set = |svc: &str, prefix: &[&str], rtype: u16| {
        let names = &snap.services.get(&*wire_key("ns", svc)).unwrap().names;
        names.get(&names::prefix_key(prefix)).unwrap().get(rtype).unwrap().clone()
    };
    let (a, srv, port) = (set("one", &[], 1), set("one", &[], 33), set("one", &["_http", "_tcp"], 33));
    assert_eq!(srv.additional, a.answer);
    assert!(srv.additional.same_allocation(&a.answer), "the same records, kept once");
    assert!(port.shifted && port.additional.same_allocation(&a.answer));
    // Nothing to share across services: hickory-proto writes an SRV
    // target in full (RFC 2782), and the target is the service name.
    let other = set("two", &[], 33);
    assert_eq!(srv.answer.bytes()[..18], other.answer.bytes()[..18], "owner, TTL, weight, port");
    assert_ne!(srv.answer.bytes(), other.answer.bytes());
}

#[test]
fn a_single_named_ports_srv_answer_is_the_service_names_own() {
    let (reader, mut w) = store();
    let mut one = import("ns", "one", "10.0.0.1");
    let mut two = import("ns", "two", "10.0.0.2");
    if let Object::Import(i) = &mut one {
        i.ports =
            vec![Port { name: Some(DnsLabel::parse("http").unwrap()), protocol: Protocol::Tcp, port: 80 }]
                .into();
    }
    if let Object::Import(i) = &mut two {
        i.ports = vec![
            Port { name: Some(DnsLabel::parse("http").unwrap()), protocol: Protocol::Tcp, port: 80 },
            Port { name: Some(DnsLabel::parse("dns").unwrap()), protocol: Protocol::Udp, port: 53 },
        ]
        .into();
    }
    w.apply(Update::Replace { source: SourceId::Watch(1), objects: vec![one, two] });
    w.publish();
    let snap = reader.load();
    let srv = |svc: &str, prefix: &[&str]| {
        let names = &snap.services.get(&*wire_key("ns", svc)).unwrap().names;
        names.get(&names::prefix_key(prefix)).unwrap().get(33).unwrap().answer.clone()
    };
    let (bare, port) = (srv("one", &[]), srv("one", &["_http", "_tcp"]));
    assert_eq!(bare.len(), 1);
    assert!(bare.same_allocation(&port), "one named port: the same records, kept once");
    // Two ports: the bare name answers both (weight 50 each), each port
    // name its own (weight 100).
    let (bare, http) = (srv("two", &[]), srv("two", &["_http", "_tcp"]));
    assert_eq!((bare.len(), http.len()), (2, 1));
    assert!(!bare.same_allocation(&http) && bare.get(0) != http.get(0));
}

#[test]
fn a_headless_services_srv_records_are_written_per_query_as_the_encoder_writes_them() {
    use hickory_proto::rr::rdata::SRV;
    use hickory_proto::rr::{RData, Record, RecordType};
    let (reader, mut w) = store();
    let label = |s: &str| DnsLabel::parse(s).unwrap();
    let http = Port { name: Some(label("http")), protocol: Protocol::Tcp, port: 80 };
    let dns = Port { name: Some(label("dns")), protocol: Protocol::Udp, port: 53 };
    let key = ServiceKey { namespace: label("ns"), name: label("hl") };
    let import = ServiceImport {
        key: key.clone(),
        kind: ImportType::Headless,
        ips: Default::default(),
        ports: vec![http.clone(), dns.clone()].into(),
        answers: Default::default(),
    };
    let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
    let endpoint = |addrs: &[IpAddr], hostname: Option<&str>| {
        crate::model::Endpoint::new(addrs.into(), true).with_names(hostname.map(label).as_ref(), None, None)
    };
    let slice = |family, endpoints| {
        Object::Slice(EndpointSet {
            slice: SliceKey { namespace: "ns".into(), name: format!("hl-{family:?}") },
            service: key.clone(),
            cluster: ClusterId::parse("east").unwrap(),
            family,
            ports: vec![http.clone(), dns.clone()],
            endpoints,
            origin: crate::model::SliceOrigin::Mcs,
            trigger: Default::default(),
        })
    };
    let objects = vec![
        Object::Import(import),
        slice(
            crate::model::AddressFamily::V4,
            vec![
                endpoint(&[ip("10.0.0.1"), ip("10.0.0.2")], Some("web-0")),
                endpoint(&[ip("10.0.0.3")], None),
            ],
        ),
        slice(crate::model::AddressFamily::V6, vec![endpoint(&[ip("fd00::1")], Some("web-0"))]),
    ];
    w.apply(Update::Replace { source: SourceId::Watch(1), objects });
    w.publish();
    let snap = reader.load();
    let service = snap.services.get(&*wire_key("ns", "hl")).unwrap();
    let zone = &snap.zone().wire;
    let name = |s: &str| Name::from_str(s).unwrap();
    let (web, other) =
        (name("web-0.east.hl.ns.svc.clusterset.local."), name("10-0-0-3.east.hl.ns.svc.clusterset.local."));
    // Every target once in the additional section, in the order of the
    // first record naming it, A before AAAA.
    let additional = [(&web, "10.0.0.1"), (&web, "10.0.0.2"), (&web, "fd00::1"), (&other, "10.0.0.3")];
    for (prefix, owner, svc_at, records) in [
        (vec![], "hl.ns.svc.clusterset.local.", 0, vec![(80, &web), (53, &web), (80, &other), (53, &other)]),
        (vec!["_http", "_tcp"], "_http._tcp.hl.ns.svc.clusterset.local.", 11, vec![(80, &web), (80, &other)]),
        (vec!["_dns", "_udp"], "_dns._udp.hl.ns.svc.clusterset.local.", 10, vec![(53, &web), (53, &other)]),
    ] {
        let prefix = names::prefix_key(&prefix);
        let set = service.names.get(&prefix).unwrap().get(33).unwrap();
        assert!(set.from_hosts && set.answer.is_empty() && set.additional.is_empty(), "{owner}: not encoded");
        let owner = name(owner);
        let weight = 100 / records.len() as u16;
        let srv: Vec<Record> = records
            .iter()
            .map(|(port, target)| {
                Record::from_rdata(
                    owner.clone(),
                    5,
                    RData::SRV(SRV::new(0, weight, *port, (*target).clone())),
                )
            })
            .collect();
        let addresses: Vec<Record> = additional
            .iter()
            .map(|(target, a)| {
                let rdata = match ip(a) {
                    IpAddr::V4(v4) => RData::A(v4.into()),
                    IpAddr::V6(v6) => RData::AAAA(v6.into()),
                };
                Record::from_rdata((*target).clone(), 5, rdata)
            })
            .collect();
        let expected = super::super::encode::records(&owner, RecordType::SRV, &srv).unwrap();
        let expected_additional = super::super::encode::records(&owner, RecordType::SRV, &addresses).unwrap();
        let hosts = &service.hosts;
        let written = hosts.srv(&prefix).unwrap();
        let mut out = Vec::new();
        assert_eq!(written.write_answer(hosts, zone, 5, &mut out, usize::MAX), (records.len() as u16, true));
        assert_eq!(out, expected.bytes(), "{owner}: answer");
        out.clear();
        assert_eq!(written.write_additional(hosts, svc_at, 5, &mut out, usize::MAX), 4);
        assert_eq!(out, expected_additional.bytes(), "{owner}: additional");
        // Whole records only, within the budget.
        let first = expected.get(0).len();
        out.clear();
        assert_eq!(written.write_answer(hosts, zone, 5, &mut out, first + 1), (1, false));
        assert_eq!(out, expected.get(0));
        out.clear();
        assert_eq!(written.write_additional(hosts, svc_at, 5, &mut out, expected_additional.start(2)), 2);
    }
}

/// The PTR targets answered for `ip`.
fn ptr(reader: &Reader, ip: &str) -> Vec<String> {
    use hickory_proto::serialize::binary::{BinDecodable, BinDecoder};
    let snap = reader.load();
    let ip = IpAddr::from_str(ip).unwrap();
    let Some(ptrs) = snap.reverse(ip) else { return vec![] };
    ptrs.targets()
        .map(|target| {
            // Each record follows a question for the reverse name; a
            // pointer to it is all the owner is, so any question works.
            let mut buf = vec![0u8; 12];
            buf.extend_from_slice(b"\x01x\x00\x00\x0c\x00\x01");
            let start = buf.len();
            assert!(hosts::write_ptr(&mut buf, ip, target, &snap.zone().wire, 5, usize::MAX));
            let mut d = BinDecoder::new(&buf);
            d.read_slice(start).unwrap();
            hickory_proto::rr::Record::read(&mut d).unwrap().data.to_string()
        })
        .collect()
}

#[test]
fn reverse_names_follow_every_edit_and_are_shared_when_untouched() {
    let (reader, mut w) = store();
    w.apply(Update::Replace { source: SourceId::Watch(1), objects: vec![import("ns", "a", "10.0.0.1")] });
    w.publish();
    assert_eq!(ptr(&reader, "10.0.0.1"), ["a.ns.svc.clusterset.local."]);
    // The VIP moves: the old address is no longer named.
    w.apply(Update::Upsert { source: SourceId::Watch(1), object: import("ns", "a", "10.0.0.2") });
    w.publish();
    assert!(ptr(&reader, "10.0.0.1").is_empty());
    assert_eq!(ptr(&reader, "10.0.0.2"), ["a.ns.svc.clusterset.local."]);
    // Two services naming one address: both answered.
    w.apply(Update::Upsert { source: SourceId::Watch(1), object: import("ns", "b", "10.0.0.2") });
    w.publish();
    assert_eq!(ptr(&reader, "10.0.0.2"), ["a.ns.svc.clusterset.local.", "b.ns.svc.clusterset.local."]);
    // A publish that rebuilds no service shares them.
    let before = reader.load_full();
    w.apply(Update::Register(SourceId::Watch(2)));
    w.publish();
    let after = reader.load_full();
    assert!(after.serial() > before.serial());
    assert!(
        after.services.shares_all(&before.services) && after.reverse.shares_all(&before.reverse),
        "no service rebuilt: shared"
    );
    // Gone with the services.
    w.apply(Update::Replace { source: SourceId::Watch(1), objects: vec![import("ns", "b", "10.0.0.2")] });
    w.publish();
    assert_eq!(ptr(&reader, "10.0.0.2"), ["b.ns.svc.clusterset.local."]);
    w.apply(Update::Replace { source: SourceId::Watch(1), objects: vec![] });
    w.publish();
    assert!(ptr(&reader, "10.0.0.2").is_empty());
    assert!(reader.load().reverse.is_empty() && w.named_twice.is_empty(), "nothing left behind");
}

#[test]
fn unchanged_objects_publish_nothing() {
    let (reader, mut w) = store();
    w.apply(Update::Replace { source: SourceId::Watch(1), objects: vec![import("ns", "a", "10.0.0.1")] });
    w.publish();
    let serial = reader.load().serial();
    w.apply(Update::Replace { source: SourceId::Watch(1), objects: vec![import("ns", "a", "10.0.0.1")] });
    assert_eq!(w.publish(), 0);
    assert_eq!(reader.load().serial(), serial);
}

#[test]
fn a_registered_source_keeps_the_store_unready_until_its_first_replace() {
    let (reader, mut w) = store();
    w.apply(Update::Replace { source: SourceId::Watch(1), objects: vec![] });
    w.apply(Update::Register(SourceId::Watch(2)));
    w.publish();
    assert!(!reader.load().is_ready());
    w.apply(Update::Replace { source: SourceId::Watch(2), objects: vec![] });
    w.publish();
    assert!(reader.load().is_ready());
}

#[test]
fn replace_removes_what_the_source_no_longer_holds() {
    let (reader, mut w) = store();
    w.apply(Update::Replace {
        source: SourceId::Watch(1),
        objects: vec![import("ns", "a", "10.0.0.1"), import("ns", "b", "10.0.0.1")],
    });
    w.publish();
    assert_eq!(reader.load().service_count(), 2);
    w.apply(Update::Replace { source: SourceId::Watch(1), objects: vec![import("ns", "b", "10.0.0.1")] });
    w.publish();
    let snap = reader.load();
    assert_eq!(snap.service_count(), 1);
    assert!(snap.service(&wire_key("ns", "a")).is_none());
}

#[test]
fn a_replace_finds_the_sources_imports_without_an_index_and_leaves_other_sources_alone() {
    let (reader, mut w) = store();
    let both = || vec![import("ns", "a", "10.0.0.1"), import("ns", "b", "10.0.0.1")];
    w.apply(Update::Replace { source: SourceId::Watch(1), objects: both() });
    w.apply(Update::Replace { source: SourceId::Watch(2), objects: vec![import("ns", "b", "10.0.0.2")] });
    let key = |name: &str| ServiceKey {
        namespace: DnsLabel::parse("ns").unwrap(),
        name: DnsLabel::parse(name).unwrap(),
    };
    w.apply(Update::Remove { source: SourceId::Watch(1), id: ObjectId::Import(key("a")) });
    // Removing what the source does not hold changes nothing.
    w.apply(Update::Remove { source: SourceId::Watch(1), id: ObjectId::Import(key("a")) });
    w.apply(Update::Remove { source: SourceId::Watch(3), id: ObjectId::Import(key("b")) });
    w.publish();
    assert_eq!(reader.load().service_count(), 1);
    // Source 1 lets go of b; source 2 still holds it.
    w.apply(Update::Replace { source: SourceId::Watch(1), objects: vec![] });
    w.publish();
    assert_eq!(reader.load().service_count(), 1);
    assert!(reader.load().service(&wire_key("ns", "b")).is_some());
    w.apply(Update::Replace { source: SourceId::Watch(2), objects: vec![] });
    w.publish();
    assert_eq!(reader.load().service_count(), 0);
    // Nothing is left of either source: a new list is a first list again.
    assert!(w.sources.values().all(|s| s.owners.is_empty()));
    assert!(w.services.values().all(|s| s.imports.is_empty()));
    w.apply(Update::Replace { source: SourceId::Watch(1), objects: both() });
    w.publish();
    assert_eq!(reader.load().service_count(), 2);
}

#[test]
fn the_same_import_from_two_sources_serves_the_first_and_survives_either_removal() {
    let (reader, mut w) = store();
    w.apply(Update::Replace { source: SourceId::Watch(2), objects: vec![import("ns", "a", "10.0.0.2")] });
    w.apply(Update::Replace { source: SourceId::Watch(1), objects: vec![import("ns", "a", "10.0.0.1")] });
    w.publish();
    let a = |r: &Reader| {
        r.load()
            .service(&wire_key("ns", "a"))
            .and_then(|s| s.get(b""))
            .and_then(|n| n.get(1))
            .map(|s| s.answer.bytes().to_vec())
    };
    let first = a(&reader).unwrap();
    assert!(first.ends_with(&[10, 0, 0, 1]));
    w.apply(Update::Remove {
        source: SourceId::Watch(1),
        id: ObjectId::Import(ServiceKey {
            namespace: DnsLabel::parse("ns").unwrap(),
            name: DnsLabel::parse("a").unwrap(),
        }),
    });
    w.publish();
    assert!(a(&reader).unwrap().ends_with(&[10, 0, 0, 2]));
}

#[test]
fn namespaces_exist_while_they_hold_an_import() {
    let (reader, mut w) = store();
    w.apply(Update::Replace { source: SourceId::Watch(1), objects: vec![import("ns", "a", "10.0.0.1")] });
    w.publish();
    assert!(reader.load().zone_name(&names::prefix_key(&["ns", "svc"])).is_some());
    w.apply(Update::Replace { source: SourceId::Watch(1), objects: vec![] });
    w.publish();
    assert!(reader.load().zone_name(&names::prefix_key(&["ns", "svc"])).is_none());
    assert!(reader.load().zone_name(&names::prefix_key(&["svc"])).is_none());
}

/// The services `reader` serves, by name.
fn served(reader: &Reader, names: &[&str]) -> Vec<bool> {
    let snap = reader.load();
    names.iter().map(|n| snap.service(&wire_key("ns", n)).is_some()).collect()
}

#[test]
fn a_list_in_parts_serves_as_it_arrives_and_removes_what_it_lacks_at_its_end() {
    let (reader, mut w) = store();
    let one = |n: &str| import("ns", n, "10.0.0.1");
    let s = SourceId::Watch(1);
    // A first list in parts: not synced (not ready) until its last part.
    w.apply(Update::Part { source: s, objects: vec![one("a"), one("b")], first: true });
    w.publish();
    assert_eq!(served(&reader, &["a", "b"]), [true, true]);
    assert!(!reader.load().is_ready());
    w.apply(Update::LastPart { source: s, objects: vec![one("c")] });
    w.publish();
    assert!(reader.load().is_ready());
    assert_eq!(served(&reader, &["a", "b", "c"]), [true, true, true]);
    // A relist in parts without `b`: `b` stays until the list ends.
    w.apply(Update::Part { source: s, objects: vec![one("a"), one("d")], first: true });
    w.publish();
    assert_eq!(served(&reader, &["a", "b", "c", "d"]), [true, true, true, true]);
    w.apply(Update::LastPart { source: s, objects: vec![one("c")] });
    w.publish();
    assert_eq!(served(&reader, &["a", "b", "c", "d"]), [true, false, true, true]);
}

#[test]
fn a_list_cut_short_counts_for_nothing_in_the_next() {
    let (reader, mut w) = store();
    let one = |n: &str| import("ns", n, "10.0.0.1");
    let s = SourceId::Watch(1);
    w.apply(Update::Replace { source: s, objects: vec![one("a"), one("b")] });
    // A relist brings `c`, then fails; the next list has only `a`, in one
    // piece or in parts: `b` and `c` are gone either way.
    w.apply(Update::Part { source: s, objects: vec![one("a"), one("c")], first: true });
    w.apply(Update::Replace { source: s, objects: vec![one("a")] });
    w.publish();
    assert_eq!(served(&reader, &["a", "b", "c"]), [true, false, false]);
    w.apply(Update::Part { source: s, objects: vec![one("b"), one("c")], first: true });
    w.apply(Update::Part { source: s, objects: vec![one("a")], first: true });
    w.apply(Update::LastPart { source: s, objects: vec![] });
    w.publish();
    assert_eq!(served(&reader, &["a", "b", "c"]), [true, false, false]);
}

#[test]
fn a_list_with_a_refused_part_removes_nothing_and_refuses_its_rest() {
    let (reader, mut w) = store();
    let one = |n: &str| import("ns", n, "10.0.0.1");
    let s = SourceId::Watch(1);
    w.apply(Update::Replace { source: s, objects: vec![one("a"), one("b")] });
    w.publish();
    // A relist of three objects where two were held grows the source by one.
    let first = Update::Part { source: s, objects: vec![one("a"), one("c"), one("d")], first: true };
    assert_eq!(w.growth(&first), Growth::Adds(Kinds { imports: 1, ..Kinds::default() }));
    w.refused(&first);
    let rest = Update::Part { source: s, objects: vec![one("e")], first: false };
    assert_eq!(w.growth(&rest), Growth::CutShort, "the rest of a list cut by the budget is refused too");
    w.refused(&rest);
    let last = Update::LastPart { source: s, objects: vec![] };
    assert_eq!(w.growth(&last), Growth::CutShort);
    w.refused(&last);
    w.publish();
    assert_eq!(served(&reader, &["a", "b", "c", "d", "e"]), [true, true, false, false, false]);
    // The next list starts afresh.
    let next = Update::Part { source: s, objects: vec![one("a")], first: true };
    assert_eq!(w.growth(&next), Growth::Adds(Kinds::default()));
    w.apply(next);
    w.apply(Update::LastPart { source: s, objects: vec![] });
    w.publish();
    assert_eq!(served(&reader, &["a", "b"]), [true, false]);
}

/// `Growth::Adds` of these counts (`endpoints`: of the new slices).
fn adds(imports: usize, slices: usize, endpoints: usize) -> Growth {
    Growth::Adds(Kinds { imports, slices, services: 0, endpoints })
}

#[test]
fn an_edit_or_a_removal_adds_nothing_and_a_new_object_adds_one_of_its_kind() {
    let (_, mut w) = store();
    let (s, other) = (SourceId::Watch(1), SourceId::Watch(2));
    let web = service_key("ns", "web");
    let upsert = |object: Object| Update::Upsert { source: s, object };
    w.apply(Update::Replace {
        source: s,
        objects: vec![import("ns", "web", "10.0.0.1"), v4_slice("ns", "web-a", web.clone(), "10.1.0.1")],
    });
    // Edits of held objects: the endpoint turned not-ready, a new VIP.
    let Object::Slice(mut set) = v4_slice("ns", "web-a", web.clone(), "10.1.0.1") else { unreachable!() };
    set.endpoints[0] = crate::model::Endpoint::new(vec![IpAddr::from_str("10.1.0.1").unwrap()].into(), false);
    assert_eq!(w.growth(&upsert(Object::Slice(set))), adds(0, 0, 0), "an endpoint turned not-ready");
    assert_eq!(w.growth(&upsert(import("ns", "web", "10.0.0.2"))), adds(0, 0, 0));
    // A slice relabelled to another service is still the one held.
    assert_eq!(
        w.growth(&upsert(v4_slice("ns", "web-a", service_key("ns", "api"), "10.1.0.1"))),
        adds(0, 0, 0)
    );
    let removal = Update::Remove { source: s, id: ObjectId::Import(web.clone()) };
    assert_eq!(w.growth(&removal), adds(0, 0, 0));
    // New objects, each counted as its kind.
    assert_eq!(w.growth(&upsert(import("ns", "api", "10.0.0.3"))), adds(1, 0, 0));
    assert_eq!(w.growth(&upsert(v4_slice("ns", "web-b", web.clone(), "10.1.0.2"))), adds(0, 1, 1));
    // Held by another source only: new to this one.
    let theirs = Update::Upsert { source: other, object: import("ns", "web", "10.0.0.1") };
    assert_eq!(w.growth(&theirs), adds(1, 0, 0));
}

#[test]
fn a_list_counts_what_it_brings_beyond_what_its_source_held_kind_by_kind() {
    let (_, mut w) = store();
    let s = SourceId::Watch(1);
    let web = service_key("ns", "web");
    let slice = |n: &str| v4_slice("ns", n, web.clone(), "10.1.0.1");
    w.apply(Update::Replace {
        source: s,
        objects: vec![import("ns", "web", "10.0.0.1"), import("ns", "api", "10.0.0.2"), slice("a")],
    });
    // One import fewer does not pay for two slices more.
    let relist = Update::Replace {
        source: s,
        objects: vec![import("ns", "web", "10.0.0.1"), slice("a"), slice("b"), slice("c")],
    };
    assert_eq!(w.growth(&relist), adds(0, 2, 2));
    assert_eq!(
        format!("{}", Kinds { imports: 1, slices: 2, services: 0, endpoints: 40 }),
        "1 ServiceImport, 2 EndpointSlices with 40 new endpoints"
    );
    assert_eq!(format!("{}", Kinds::default()), "no objects");
    // The same list in parts: the slices beyond the one held count as they come.
    let first =
        Update::Part { source: s, objects: vec![import("ns", "web", "10.0.0.1"), slice("a")], first: true };
    assert_eq!(w.growth(&first), adds(0, 0, 0));
    w.apply(first);
    let rest = Update::LastPart { source: s, objects: vec![slice("b"), slice("c")] };
    assert_eq!(w.growth(&rest), adds(0, 2, 2));
}

/// `v4_slice` with `n` endpoints.
fn big_slice(name: &str, service: ServiceKey, n: u16) -> Object {
    let Object::Slice(mut set) = v4_slice("ns", name, service, "10.1.0.1") else { unreachable!() };
    set.endpoints = (0..n)
        .map(|i| {
            let ip = IpAddr::from(std::net::Ipv4Addr::from(0x0a01_0000 + u32::from(i)));
            crate::model::Endpoint::new(vec![ip].into(), true)
        })
        .collect();
    Object::Slice(set)
}

#[test]
fn a_new_slice_is_weighed_by_its_endpoints_and_a_held_one_by_none_in_lists_too() {
    let (_, mut w) = store();
    let s = SourceId::Watch(1);
    let web = service_key("ns", "web");
    w.apply(Update::Replace {
        source: s,
        objects: vec![import("ns", "web", "10.0.0.1"), big_slice("a", web.clone(), 1)],
    });
    let upsert = |object: Object| Update::Upsert { source: s, object };
    assert_eq!(w.growth(&upsert(big_slice("b", web.clone(), 1000))), adds(0, 1, 1000));
    // Held: an edit, however many endpoints it brings.
    assert_eq!(w.growth(&upsert(big_slice("a", web.clone(), 1000))), adds(0, 0, 0));
    // A list: the held slice grown counts nothing, the new one its own.
    let relist = Update::Replace {
        source: s,
        objects: vec![
            import("ns", "web", "10.0.0.1"),
            big_slice("a", web.clone(), 1000),
            big_slice("c", web.clone(), 7),
        ],
    };
    assert_eq!(w.growth(&relist), adds(0, 1, 7));
    let first = Update::Part { source: s, objects: vec![big_slice("a", web.clone(), 1000)], first: true };
    assert_eq!(w.growth(&first), adds(0, 0, 0));
    w.apply(first);
    let last = Update::LastPart { source: s, objects: vec![big_slice("d", web.clone(), 300)] };
    assert_eq!(w.growth(&last), adds(0, 1, 300));
}

/// `v4_slice` with a trigger time.
fn timed_slice(name: &str, service: &str, ip: &str, trigger: crate::model::ChangeTrigger) -> Object {
    let Object::Slice(mut set) = v4_slice("ns", name, service_key("ns", service), ip) else { unreachable!() };
    set.trigger = trigger;
    Object::Slice(set)
}

#[test]
fn a_slice_change_is_measured_from_its_trigger_once_answered() {
    use crate::model::ChangeTrigger;
    use crate::store::Unmeasured;
    use std::time::{Duration, SystemTime};
    let (_reader, mut w) = store();
    let src = SourceId::Watch(1);
    let ago = |ms: u64| ChangeTrigger::At(SystemTime::now() - Duration::from_millis(ms));
    // The first list is the server starting: nothing measured.
    w.apply(Update::Replace {
        source: src,
        objects: vec![headless("ns", "web"), timed_slice("web-a", "web", "10.0.0.1", ago(5_000))],
    });
    w.publish();
    assert!(w.take_programmed().is_empty());
    // A change 50 ms after its trigger: observed once published.
    w.apply(Update::Upsert { source: src, object: timed_slice("web-a", "web", "10.0.0.2", ago(50)) });
    assert!(w.take_programmed().is_empty(), "measured before it was answered");
    w.publish();
    let p = w.take_programmed();
    assert_eq!(p.observed.len(), 1, "{p:?}");
    let (kind, took) = p.observed[0];
    assert_eq!(kind, ImportType::Headless);
    assert!(took >= Duration::from_millis(50) && took < Duration::from_secs(5), "{took:?}");
    assert!(w.take_programmed().is_empty(), "taken once");
    // A new trigger time alone: nothing answered changed, nothing measured.
    let retimed = ago(10);
    w.apply(Update::Upsert { source: src, object: timed_slice("web-a", "web", "10.0.0.2", retimed) });
    assert_eq!(w.publish(), 0);
    assert!(w.take_programmed().is_empty());
    // A change that comes with the time the slice already carries (a
    // repair, a rewrite) is counted, not observed; so is one without any,
    // one that does not parse, one from the future and a years-old one.
    let cases = [
        (retimed, Unmeasured::Repeated),
        (ChangeTrigger::Missing, Unmeasured::Missing),
        (ChangeTrigger::Unparsable, Unmeasured::Unparsable),
        (ChangeTrigger::At(SystemTime::now() + Duration::from_secs(60)), Unmeasured::Future),
        (ChangeTrigger::At(SystemTime::now() - Duration::from_secs(3 * 365 * 86_400)), Unmeasured::Stale),
    ];
    for (i, (trigger, cause)) in cases.into_iter().enumerate() {
        let ip = format!("10.0.1.{i}");
        w.apply(Update::Upsert { source: src, object: timed_slice("web-a", "web", &ip, trigger) });
        w.publish();
        let p = w.take_programmed();
        assert_eq!((p.observed.len(), p.unmeasured.as_slice()), (0, &[cause][..]), "{trigger:?}");
    }
    // A slice of a service with no import is not answered.
    w.apply(Update::Upsert { source: src, object: timed_slice("db-a", "db", "10.0.2.1", ago(20)) });
    w.publish();
    assert_eq!(w.take_programmed().unmeasured, [Unmeasured::Unserved]);
    // A relist's changed slice is measured (the change waited for it);
    // its unchanged ones and its removals are not changes.
    w.apply(Update::Replace {
        source: src,
        objects: vec![headless("ns", "web"), timed_slice("web-a", "web", "10.0.3.1", ago(30))],
    });
    w.publish();
    let p = w.take_programmed();
    assert_eq!((p.observed.len(), p.unmeasured.len()), (1, 0), "{p:?}");
}
