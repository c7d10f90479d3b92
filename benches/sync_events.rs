//! The sync controller's work per event, in process: the real event loop
//! (`controller::syncer::Syncer`) over two fake members (the `fakes`
//! feature), one of which exports N services; once every import is written,
//! K endpoint changes of random services, one at a time, each waited for
//! until its slices are written. Reports the loop's CPU time per event
//! (`getrusage` of the one thread that runs everything) at N = 100 and
//! N = 10,000: flat when no event's work grows with the fleet.
//!
//! `cargo bench --bench sync_events --features fakes`
//! (`SYNC_EVENTS=K`, default 2,000).

#![allow(clippy::print_stdout, clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use clusterset_dns::controller::api::Kind;
use clusterset_dns::controller::link::MemberLink;
use clusterset_dns::controller::link::fake::FakeLink;
use clusterset_dns::controller::shard::Shards;
use clusterset_dns::controller::stats::SyncStats;
use clusterset_dns::controller::syncer::{CONCURRENCY, MemberLost, SyncBehaviour, Syncer};
use clusterset_dns::fault::Failures;
use clusterset_dns::fleet::member;
use clusterset_dns::fleet::state::{Change, Delta, MemberEvent};
use clusterset_dns::model::{ClusterId, DnsLabel, ServiceKey, SliceKey};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::DynamicObject;
use serde_json::json;

fn main() {
    if !std::env::args().skip(1).any(|a| a == "--bench") {
        // `cargo test --benches`: the same loop, small, so CI sees it run.
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let (per_event, _) = rt.block_on(run(20, 20));
        println!(
            "sync_events bench: 20 exports, 20 events ran ({:.1} µs of CPU per event); \
             measure with `cargo bench --bench sync_events --features fakes`",
            per_event * 1e6
        );
        return;
    }
    let events: usize = std::env::var("SYNC_EVENTS").ok().and_then(|v| v.parse().ok()).unwrap_or(2000);
    println!("command: cargo bench --bench sync_events --features fakes (SYNC_EVENTS={events})");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    for exports in [100, 10_000] {
        let (per_event, setup) = rt.block_on(run(exports, events));
        println!(
            "{exports:>6} exports: {:.1} µs of CPU per event ({events} events); first sync {:.1} s",
            per_event * 1e6,
            setup.as_secs_f64()
        );
    }
}

/// CPU seconds of this thread so far.
fn cpu() -> f64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct it is given.
    #[allow(unsafe_code)]
    let usage = unsafe {
        libc::getrusage(libc::RUSAGE_THREAD, usage.as_mut_ptr());
        usage.assume_init()
    };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(usage.ru_utime) + t(usage.ru_stime)
}

fn service(i: usize) -> (DynamicObject, Service, EndpointSlice) {
    let name = format!("svc-{i}");
    let export = serde_json::from_value(json!({
        "apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ServiceExport",
        "metadata": {"name": name, "namespace": "shop", "uid": format!("u{i}"),
                     "creationTimestamp": "2026-11-01T10:00:00Z"}}))
    .unwrap();
    let svc = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "shop"},
        "spec": {"type": "ClusterIP", "clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"],
                 "ipFamilies": ["IPv4"], "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}}))
    .unwrap();
    (export, svc, slice(i, 1))
}

fn slice(i: usize, generation: usize) -> EndpointSlice {
    serde_json::from_value(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("svc-{i}-x1"), "namespace": "shop",
                     "labels": {"kubernetes.io/service-name": format!("svc-{i}")}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [format!("10.{}.{}.{}", generation % 250, i / 250 % 250, i % 250)],
                       "conditions": {"ready": true}}],
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}))
    .unwrap()
}

/// The calls both members have received (read without copying them: the
/// bench's own cost must not grow with the fleet either).
fn calls(links: &[Arc<FakeLink>]) -> usize {
    links.iter().map(|l| l.api.calls.lock().unwrap().len()).sum()
}

/// The slice writes both members hold.
fn slices(links: &[Arc<FakeLink>]) -> usize {
    links
        .iter()
        .map(|l| l.api.objects.lock().unwrap().keys().filter(|(k, _, _)| *k == Kind::EndpointSlice).count())
        .sum()
}

async fn until(limit: Duration, f: impl Fn() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < limit, "not within {limit:?}");
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_micros(50)).await;
    }
}

/// Returns CPU seconds per event and the first sync's time.
async fn run(exports: usize, events: usize) -> (f64, Duration) {
    let links = vec![FakeLink::new("cluster-1"), FakeLink::new("cluster-2")];
    for l in &links {
        l.serves("v1beta1");
    }
    let shards = Shards::elected(1);
    let behaviour = SyncBehaviour {
        on_member_lost: MemberLost::Keep,
        lost_after: Duration::from_secs(300),
        auto_export_prefixes: vec![],
        namespaces: vec![],
        resync: Duration::from_secs(3600),
        concurrency: CONCURRENCY,
    };
    let members: Vec<Arc<dyn MemberLink>> =
        links.iter().map(|l| Arc::new(l.clone()) as Arc<dyn MemberLink>).collect();
    let stats = Arc::new(SyncStats::new().unwrap());
    let syncer = Syncer::new(members, behaviour, stats, shards.clone(), Failures::new());
    let task = tokio::spawn(syncer.run());
    let (mut e, mut s, mut sl) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..exports {
        let (a, b, c) = service(i);
        e.push(a);
        s.push(b);
        sl.push(c);
    }
    let cluster = ClusterId::parse("cluster-1").unwrap();
    let started = Instant::now();
    for event in member::listed(0, &cluster, &e, &s, &sl) {
        links[0].send(event).await;
    }
    for event in member::listed(1, &ClusterId::parse("cluster-2").unwrap(), &[], &[], &[]) {
        links[1].send(event).await;
    }
    shards.fence(0).held(tokio::time::Instant::now(), Duration::from_secs(1 << 30));
    shards.set_led(0, true);
    until(Duration::from_secs(600), || slices(&links) >= 2 * exports).await;
    // Every reconcile of the first sync ended: no call for a while.
    let mut last = calls(&links);
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = calls(&links);
        if now == last {
            break;
        }
        last = now;
    }
    let setup = started.elapsed();
    let mut rng = fastrand::Rng::with_seed(1);
    // Each service's own count of changes: its next address always differs
    // from the one it holds (a count shared by all could wrap back to it).
    let mut generation = vec![1usize; exports];
    let before = cpu();
    for _ in 0..events {
        let i = rng.usize(0..exports);
        generation[i] += 1;
        let written = calls(&links);
        let id = SliceKey { namespace: "shop".into(), name: format!("svc-{i}-x1") };
        let key = ServiceKey {
            namespace: DnsLabel::parse("shop").unwrap(),
            name: DnsLabel::parse(&format!("svc-{i}")).unwrap(),
        };
        let change = Change::Slices(Delta::Applied(id, key, Arc::new(slice(i, generation[i]))));
        links[0].send(MemberEvent { member: 0, change }).await;
        until(Duration::from_secs(10), || calls(&links) >= written + 2).await;
    }
    let per_event = (cpu() - before) / events as f64;
    task.abort();
    (per_event, setup)
}
