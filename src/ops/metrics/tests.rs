//! A scrape of every family `serve` registers, each counter holding a value
//! of its own: a family that read another's counter, or was declared with
//! another's name, shows a value not its own.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};

use arc_swap::ArcSwap;
use hickory_proto::rr::Name;

use super::*;
use crate::k8s::watch::Reporter;
use crate::model::{
    AddressFamily, ClusterId, DnsLabel, Endpoint, EndpointSet, ImportType, Port, Protocol, ServiceImport,
    ServiceKey, SliceKey, SliceOrigin,
};
use crate::ops::memory::{Guard, LimitSource, MemoryBudget, OnMemoryLimit};
use crate::scrape::{assert_series, render, series};
use crate::source::centralized::Liveness;
use crate::store::{self, AnswerConfig, Object, SourceId, Update, Writer, ZoneConfig};
use crate::wire::stats::{RCODES, request_slot, type_slot};

/// Headless `ns/web`: three endpoints in c1 (10.0.0.2 probed down), one in c2.
fn store() -> Reader {
    let key = ServiceKey { namespace: DnsLabel::parse("ns").unwrap(), name: DnsLabel::parse("web").unwrap() };
    let slice = |cluster: &str, addrs: &[&str]| {
        Object::Slice(EndpointSet {
            slice: SliceKey { namespace: "ns".into(), name: format!("web-{cluster}") },
            service: key.clone(),
            cluster: ClusterId::parse(cluster).unwrap(),
            family: AddressFamily::V4,
            ports: vec![Port { name: None, protocol: Protocol::Tcp, port: 80 }],
            endpoints: addrs
                .iter()
                .map(|a| Endpoint::new(vec![a.parse::<IpAddr>().unwrap()].into(), true))
                .collect(),
            origin: SliceOrigin::Mcs,
            trigger: Default::default(),
        })
    };
    let (reader, mut w): (Reader, Writer) = store::new(ZoneConfig::with_defaults(
        Name::from_ascii("clusterset.local.").unwrap(),
        AnswerConfig::standard(),
    ));
    let import = ServiceImport {
        key: key.clone(),
        kind: ImportType::Headless,
        ips: Default::default(),
        ports: Default::default(),
        answers: Default::default(),
    };
    let objects = vec![
        Object::Import(import),
        slice("c1", &["10.0.0.1", "10.0.0.2", "10.0.0.3"]),
        slice("c2", &["10.0.1.1"]),
    ];
    w.apply(Update::Replace { source: SourceId::Watch(1), objects });
    let down = "10.0.0.2".parse().unwrap();
    w.apply(Update::EndpointHealth { service: key, address: down, healthy: false });
    w.publish();
    reader
}

fn set(counter: &AtomicU64, n: u64) {
    counter.store(n, Ordering::Relaxed);
}

/// The query counters of one listener, each its own value.
fn queries() -> Arc<QueryStats> {
    let s = QueryStats::default();
    let (a, other) = (type_slot(1), type_slot(65_000));
    set(&s.requests[request_slot(0, 0, 0, a)], 201);
    set(&s.requests[request_slot(1, 1, 1, other)], 202);
    set(&s.do_requests[0], 203);
    set(&s.responses[0], 204);
    set(&s.responses[RCODES.len() + 3], 205);
    set(&s.duration[0][0], 206);
    set(&s.duration_nanos[0], 2_500_000_000);
    set(&s.request_size[0][1], 207);
    set(&s.request_bytes[0], 208);
    set(&s.response_size[0][2], 209);
    set(&s.response_bytes[0], 210);
    for (c, n) in s.limited.iter().zip([211, 212]) {
        set(c, n);
    }
    for (c, n) in s.debug.iter().zip([213, 214]) {
        set(c, n);
    }
    for (c, n) in s.transfers.iter().zip([215, 216, 217]) {
        set(c, n);
    }
    for (c, n) in s.ecs.iter().zip([219, 220]) {
        set(c, n);
    }
    set(&s.tcp_shed[0], 218);
    Arc::new(s)
}

#[test]
fn each_family_shows_its_own_values() {
    let reader = store();
    let snap = reader.load_full();
    let web = snap.service(&store::names_key("ns", "web")).unwrap().balance().unwrap();
    snap.zone().answer_stats.add(web.clusters[0].stat, 251);
    snap.zone().answer_stats.add(web.clusters[1].stat, 252);
    snap.zone().answer_stats.add(store::AnswerStats::cluster_slot(web.clusters[0].id), 253);
    snap.zone().answer_stats.add(store::AnswerStats::cluster_slot(web.clusters[1].id), 254);

    let registry = Registry::new();
    let failures = Failures::new();
    (0..221).for_each(|_| failures.panicked(Task::Udp));
    (0..222).for_each(|_| failures.panicked(Task::Http));
    register_panics(&registry, failures).unwrap();
    let (healthy, failing) =
        (Arc::new(WatchHealth::new("w1".into())), Arc::new(WatchHealth::new("w2".into())));
    let mut w1 = Reporter::new(healthy.clone());
    (0..231).for_each(|_| w1.failed("gone"));
    w1.ok();
    let mut w2 = Reporter::new(failing.clone());
    (0..232).for_each(|_| w2.failed("gone"));
    // Stale for longer than the millisecond staleness is counted in.
    std::thread::sleep(Duration::from_millis(20));
    let m = Metrics::new(&registry, vec![healthy, failing]).unwrap();
    (0..261).for_each(|_| m.http_debug(true));
    (0..262).for_each(|_| m.http_debug(false));
    m.published(&snap, Duration::from_millis(3));
    let mut programmed = store::Programmed {
        observed: vec![
            (ImportType::Headless, Duration::from_millis(250)),
            (ImportType::Headless, Duration::from_millis(125)),
            (ImportType::ClusterSetIp, Duration::from_millis(1500)),
        ],
        unmeasured: Vec::new(),
    };
    for (cause, n) in store::Unmeasured::ALL.into_iter().zip(271..) {
        programmed.unmeasured.extend(std::iter::repeat_n(cause, n));
    }
    m.programmed(programmed);
    m.register_queries("clusterset.local.".into(), vec![("dns://:53".into(), queries())]).unwrap();
    m.register_udp_workers(vec![("dns://:53".into(), Arc::new(AtomicUsize::new(241)))]).unwrap();
    let guard =
        Guard::new(MemoryBudget { limit: 1 << 30, source: LimitSource::Flag }, OnMemoryLimit::KeepServing);
    guard.refused(crate::store::SourceId::File { path: 0, file: 0 }, Some(1), true);
    m.register_memory(Some(Arc::new(guard))).unwrap();
    let clusters = [("c1", true), ("c2", false)]
        .map(|(c, alive)| (ArcSwap::from_pointee(ClusterId::parse(c).unwrap()), AtomicBool::new(alive)));
    m.register_health(reader.clone(), Some(Arc::new(Liveness { clusters: clusters.into() })), false).unwrap();

    let text = render(&registry);
    let mut got = series(&text);
    // CoreDNS's buckets: 1 ms doubling; 0.25 s falls in le=0.256.
    let bucket = |kind: &str, le: &str| {
        got.get(&format!(
            r#"clusterset_dns_programming_duration_seconds_bucket{{service_kind="{kind}",le="{le}"}}"#
        ))
        .copied()
    };
    assert_eq!(bucket("headless", "0.064"), Some(0.0));
    assert_eq!(bucket("headless", "0.128"), Some(1.0));
    assert_eq!(bucket("headless", "0.256"), Some(2.0));
    assert_eq!(bucket("clusterset_ip", "1.024"), Some(0.0));
    assert_eq!(bucket("clusterset_ip", "524.288"), Some(1.0));
    got.retain(|k, _| !k.contains("_bucket{"));
    let stale = got.remove(r#"clusterset_dns_watch_stale_seconds{watch="w2"}"#);
    assert!(stale.is_some_and(|v| v > 0.0 && v < 60.0), "w2's staleness: {stale:?}");
    let l = r#"server="dns://:53",view="",zone="clusterset.local.""#;
    let dropped = r#"server="dns://:53",view="",zone="dropped""#;
    let mut want: Vec<(String, f64)> = [
        ("clusterset_dns_services", 1.0),
        ("clusterset_dns_snapshot_serial", f64::from(snap.serial())),
        ("clusterset_dns_ready", 1.0),
        ("clusterset_dns_snapshot_publish_seconds_sum", 0.003),
        ("clusterset_dns_snapshot_publish_seconds_count", 1.0),
        (r#"clusterset_dns_http_debug_requests_total{result="answered"}"#, 261.0),
        (r#"clusterset_dns_http_debug_requests_total{result="refused"}"#, 262.0),
        (r#"clusterset_dns_panics_total{task="udp"}"#, 221.0),
        (r#"clusterset_dns_panics_total{task="http"}"#, 222.0),
        (r#"clusterset_dns_watch_stale_seconds{watch="w1"}"#, 0.0),
        (r#"clusterset_dns_watch_errors_total{watch="w1"}"#, 231.0),
        (r#"clusterset_dns_watch_errors_total{watch="w2"}"#, 232.0),
        (r#"clusterset_dns_watch_json_answers_total{watch="w1"}"#, 0.0),
        (r#"clusterset_dns_watch_json_answers_total{watch="w2"}"#, 0.0),
        (r#"clusterset_dns_udp_workers{server="dns://:53"}"#, 241.0),
        ("clusterset_dns_memory_over_budget", 1.0),
        (r#"clusterset_dns_cluster_endpoints{cluster="c1",state="healthy"}"#, 2.0),
        (r#"clusterset_dns_cluster_endpoints{cluster="c1",state="unhealthy"}"#, 1.0),
        (r#"clusterset_dns_cluster_endpoints{cluster="c2",state="healthy"}"#, 1.0),
        (r#"clusterset_dns_cluster_endpoints{cluster="c2",state="unhealthy"}"#, 0.0),
        (r#"clusterset_dns_cluster_answers_total{cluster="c1"}"#, 253.0),
        (r#"clusterset_dns_cluster_answers_total{cluster="c2"}"#, 254.0),
        (r#"clusterset_dns_cluster_alive{cluster="c1"}"#, 1.0),
        (r#"clusterset_dns_cluster_alive{cluster="c2"}"#, 0.0),
        (r#"clusterset_dns_rrl_responses_total{action="dropped",server="dns://:53"}"#, 211.0),
        (r#"clusterset_dns_rrl_responses_total{action="slipped",server="dns://:53"}"#, 212.0),
        (r#"clusterset_dns_debug_queries_total{result="answered",server="dns://:53"}"#, 213.0),
        (r#"clusterset_dns_debug_queries_total{result="refused",server="dns://:53"}"#, 214.0),
        (r#"clusterset_dns_transfers_total{result="streamed",server="dns://:53"}"#, 215.0),
        (r#"clusterset_dns_transfers_total{result="udp",server="dns://:53"}"#, 216.0),
        (r#"clusterset_dns_transfers_total{result="refused",server="dns://:53"}"#, 217.0),
        (r#"clusterset_dns_ecs_queries_total{result="believed",server="dns://:53"}"#, 219.0),
        (r#"clusterset_dns_ecs_queries_total{result="ignored",server="dns://:53"}"#, 220.0),
        (r#"clusterset_dns_tcp_connections_shed_total{server="dns://:53"}"#, 218.0),
        (r#"clusterset_dns_programming_duration_seconds_sum{service_kind="headless"}"#, 0.375),
        (r#"clusterset_dns_programming_duration_seconds_count{service_kind="headless"}"#, 2.0),
        (r#"clusterset_dns_programming_duration_seconds_sum{service_kind="clusterset_ip"}"#, 1.5),
        (r#"clusterset_dns_programming_duration_seconds_count{service_kind="clusterset_ip"}"#, 1.0),
        (r#"clusterset_dns_programming_unmeasured_total{cause="missing"}"#, 271.0),
        (r#"clusterset_dns_programming_unmeasured_total{cause="unparsable"}"#, 272.0),
        (r#"clusterset_dns_programming_unmeasured_total{cause="future"}"#, 273.0),
        (r#"clusterset_dns_programming_unmeasured_total{cause="stale"}"#, 274.0),
        (r#"clusterset_dns_programming_unmeasured_total{cause="repeated"}"#, 275.0),
        (r#"clusterset_dns_programming_unmeasured_total{cause="unserved"}"#, 276.0),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    for task in Task::ALL.into_iter().filter(|t| ![Task::Udp, Task::Http].contains(t)) {
        want.push((format!(r#"clusterset_dns_panics_total{{task="{}"}}"#, task.name()), 0.0));
    }
    want.extend([
        (
            r#"coredns_dns_requests_total{family="1",proto="udp",server="dns://:53",type="A",view="",zone="clusterset.local."}"#
                .to_owned(),
            201.0,
        ),
        (
            r#"coredns_dns_requests_total{family="2",proto="tcp",server="dns://:53",type="other",view="",zone="dropped"}"#
                .to_owned(),
            202.0,
        ),
        (format!("coredns_dns_do_requests_total{{{l}}}"), 203.0),
        (format!(r#"coredns_dns_responses_total{{plugin="clusterset",rcode="NOERROR",{l}}}"#), 204.0),
        (format!(r#"coredns_dns_responses_total{{plugin="clusterset",rcode="NXDOMAIN",{dropped}}}"#), 205.0),
        (format!("coredns_dns_request_duration_seconds_sum{{{l}}}"), 2.5),
        (format!("coredns_dns_request_duration_seconds_count{{{l}}}"), 206.0),
        (format!(r#"coredns_dns_request_size_bytes_sum{{proto="udp",{l}}}"#), 208.0),
        (format!(r#"coredns_dns_request_size_bytes_count{{proto="udp",{l}}}"#), 207.0),
        (format!(r#"coredns_dns_response_size_bytes_sum{{proto="udp",{l}}}"#), 210.0),
        (format!(r#"coredns_dns_response_size_bytes_count{{proto="udp",{l}}}"#), 209.0),
    ]);
    assert_series(&got, &want.into_iter().collect::<BTreeMap<_, _>>());

    // The types dashboards and alert rules read the families as.
    for (name, kind) in [
        ("clusterset_dns_services", "gauge"),
        ("clusterset_dns_snapshot_serial", "gauge"),
        ("clusterset_dns_ready", "gauge"),
        ("clusterset_dns_snapshot_publish_seconds", "histogram"),
        ("clusterset_dns_http_debug_requests_total", "counter"),
        ("clusterset_dns_panics_total", "counter"),
        ("clusterset_dns_watch_stale_seconds", "gauge"),
        ("clusterset_dns_watch_errors_total", "counter"),
        ("clusterset_dns_watch_json_answers_total", "counter"),
        ("clusterset_dns_udp_workers", "gauge"),
        ("clusterset_dns_memory_over_budget", "gauge"),
        ("clusterset_dns_cluster_endpoints", "gauge"),
        ("clusterset_dns_cluster_answers_total", "counter"),
        ("clusterset_dns_cluster_alive", "gauge"),
        ("clusterset_dns_rrl_responses_total", "counter"),
        ("clusterset_dns_debug_queries_total", "counter"),
        ("clusterset_dns_transfers_total", "counter"),
        ("clusterset_dns_ecs_queries_total", "counter"),
        ("clusterset_dns_tcp_connections_shed_total", "counter"),
        ("clusterset_dns_programming_duration_seconds", "histogram"),
        ("clusterset_dns_programming_unmeasured_total", "counter"),
        ("coredns_dns_requests_total", "counter"),
        ("coredns_dns_do_requests_total", "counter"),
        ("coredns_dns_responses_total", "counter"),
        ("coredns_dns_request_duration_seconds", "histogram"),
        ("coredns_dns_request_size_bytes", "histogram"),
        ("coredns_dns_response_size_bytes", "histogram"),
    ] {
        let line = format!("# TYPE {name} {kind}");
        assert!(text.lines().any(|l| l == line), "{line:?} not in\n{text}");
    }

    // The per-service view, alone in its own registry (/debug/metrics).
    let per_service = render(m.per_service());
    let want: BTreeMap<String, f64> = [
        (r#"clusterset_dns_endpoints{cluster="c1",service="ns/web",state="healthy"}"#, 2.0),
        (r#"clusterset_dns_endpoints{cluster="c1",service="ns/web",state="unhealthy"}"#, 1.0),
        (r#"clusterset_dns_endpoints{cluster="c2",service="ns/web",state="healthy"}"#, 1.0),
        (r#"clusterset_dns_endpoints{cluster="c2",service="ns/web",state="unhealthy"}"#, 0.0),
        (r#"clusterset_dns_answers_total{cluster="c1",service="ns/web"}"#, 251.0),
        (r#"clusterset_dns_answers_total{cluster="c2",service="ns/web"}"#, 252.0),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    assert_series(&series(&per_service), &want);
    for (name, kind) in [("clusterset_dns_endpoints", "gauge"), ("clusterset_dns_answers_total", "counter")] {
        let line = format!("# TYPE {name} {kind}");
        assert!(per_service.lines().any(|l| l == line), "{line:?} not in\n{per_service}");
    }
}

/// The families of `register_health` scraped from a fresh registry over
/// `reader`, with `--metrics-per-service` or without.
fn health_scrape(reader: &Reader, per_service: bool) -> String {
    let registry = Registry::new();
    let m = Metrics::new(&registry, Vec::new()).unwrap();
    m.register_health(reader.clone(), None, per_service).unwrap();
    render(&registry)
}

#[test]
fn metrics_per_service_adds_the_series_per_service_to_the_scrape() {
    let reader = store();
    let text = health_scrape(&reader, true);
    let got = series(&text);
    for s in [
        r#"clusterset_dns_endpoints{cluster="c1",service="ns/web",state="unhealthy"}"#,
        r#"clusterset_dns_cluster_endpoints{cluster="c1",state="unhealthy"}"#,
    ] {
        assert_eq!(got.get(s), Some(&1.0), "{s} in\n{text}");
    }
    assert!(!health_scrape(&reader, false).contains("clusterset_dns_endpoints{"));
}

/// Headless services `svc-0` … `svc-(n-1)` in namespace `ns`, each with
/// one endpoint in each of `c1` and `c2`.
fn fleet(n: usize) -> Reader {
    let (reader, mut w): (Reader, Writer) = store::new(ZoneConfig::with_defaults(
        Name::from_ascii("clusterset.local.").unwrap(),
        AnswerConfig::standard(),
    ));
    let mut objects = Vec::new();
    for i in 0..n {
        let key = ServiceKey {
            namespace: DnsLabel::parse("ns").unwrap(),
            name: DnsLabel::parse(&format!("svc-{i}")).unwrap(),
        };
        objects.push(Object::Import(ServiceImport {
            key: key.clone(),
            kind: ImportType::Headless,
            ips: Default::default(),
            ports: Default::default(),
            answers: Default::default(),
        }));
        for (c, cluster) in ["c1", "c2"].into_iter().enumerate() {
            let ip = IpAddr::from([10, c as u8, (i >> 8) as u8, i as u8]);
            objects.push(Object::Slice(EndpointSet {
                slice: SliceKey { namespace: "ns".into(), name: format!("svc-{i}-{cluster}") },
                service: key.clone(),
                cluster: ClusterId::parse(cluster).unwrap(),
                family: AddressFamily::V4,
                ports: vec![Port { name: None, protocol: Protocol::Tcp, port: 80 }],
                endpoints: vec![Endpoint::new(vec![ip].into(), true)],
                origin: SliceOrigin::Mcs,
                trigger: Default::default(),
            }));
        }
    }
    w.apply(Update::Replace { source: SourceId::Watch(1), objects });
    w.publish();
    reader
}

/// A Prometheus operator caps the series of a target: by default nothing
/// on /metrics grows with the fleet (the per-service families grew by 6
/// series a service here, 200,000 at 100,000 services × 10 clusters).
#[test]
fn the_default_scrape_does_not_grow_with_the_fleet() {
    let (one, many) = (fleet(1), fleet(2_000));
    for r in [&one, &many] {
        let snap = r.load_full();
        for names in snap.services.values() {
            let b = names.balance().unwrap();
            snap.zone().answer_stats.add(b.clusters[0].stat, 1);
            snap.zone().answer_stats.add(store::AnswerStats::cluster_slot(b.clusters[0].id), 1);
        }
    }
    let (small, large) = (health_scrape(&one, false), health_scrape(&many, false));
    assert_eq!(small.lines().count(), large.lines().count(), "1 service:\n{small}\n2,000:\n{large}");
    let got = series(&large);
    assert_eq!(got.get(r#"clusterset_dns_cluster_endpoints{cluster="c2",state="healthy"}"#), Some(&2_000.0));
    assert_eq!(got.get(r#"clusterset_dns_cluster_answers_total{cluster="c1"}"#), Some(&2_000.0));
    assert_eq!(got.get(r#"clusterset_dns_cluster_answers_total{cluster="c2"}"#), Some(&0.0));
}
