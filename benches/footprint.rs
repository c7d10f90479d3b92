//! Memory and publish cost of the store at fleet scale, in process: heap
//! bytes per service held by the writer's model and by the published
//! snapshot, the peak while the first snapshot is built, the time to build
//! it, and the time to publish one changed EndpointSlice once the whole
//! fleet is loaded. The fleet is the shape of
//! `benches/workload.py --clusters 10`: every 10th service
//! headless with 4 endpoints in each of 10 clusters, the others ClusterSetIP.
//!
//! `cargo bench --bench footprint` (sizes 10,000 and 100,000; set
//! `FOOTPRINT_SERVICES=N` for one other size, and
//! `FOOTPRINT_HEADLESS_EVERY=K` for every K-th service headless instead of
//! every 10th: 1 for all, 0 for none, to see what each kind costs). Without `--bench` (how
//! `cargo test --benches` runs bench targets) it checks 1,000 services and
//! fails when their bytes per service exceed [`BUDGET_AT_1000`].
// A counting allocator wrapper needs `unsafe impl GlobalAlloc`; it only
// counts and forwards to the server's allocator (jemalloc), so the resident
// memory it reports beside the counted bytes is what `serve` would hold.
#![allow(unsafe_code, clippy::print_stdout)]

use std::alloc::{GlobalAlloc, Layout};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use clusterset_dns::model::{
    AddressFamily, ClusterId, DnsLabel, Endpoint, EndpointSet, ImportType, Port, Protocol, ServiceImport,
    ServiceKey, SliceKey, SliceOrigin,
};
use clusterset_dns::ops::memory::resident_bytes;
use clusterset_dns::store::{self, Object, SourceId, Update, ZoneConfig};
use hickory_proto::rr::Name;
use tikv_jemallocator::Jemalloc;

/// Live heap bytes and the most they reached since the last reset.
static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

struct Counting;

fn grew(by: usize) {
    let now = LIVE.fetch_add(by, Ordering::Relaxed) + by;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

// SAFETY: forwards every call unchanged to `Jemalloc`; the counters are
// atomics, which never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        grew(layout.size());
        // SAFETY: same contract as the caller's.
        unsafe { Jemalloc.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { Jemalloc.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size >= layout.size() {
            grew(new_size - layout.size());
        } else {
            LIVE.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { Jemalloc.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

// The server's jemalloc options (src/main.rs), so the resident bytes
// reported are what `serve` would hold.
#[unsafe(export_name = "_rjem_malloc_conf")]
static MALLOC_CONF: &[u8; clusterset_dns::ops::memory::ALLOCATOR_OPTIONS.len()] =
    clusterset_dns::ops::memory::ALLOCATOR_OPTIONS;

fn live() -> usize {
    LIVE.load(Ordering::Relaxed)
}

fn reset_peak() {
    PEAK.store(live(), Ordering::Relaxed);
}

const CLUSTERS: u32 = 10;
const ENDPOINTS: u32 = 4;

/// Counted heap bytes per service (writer model and snapshot) that
/// `cargo test --benches` holds 1,000 services of the default shape to:
/// about 10 % above the 2,325 bytes of 2026-11-26 (BENCHMARKS.md "Fleet
/// scale"), so a change that adds bytes to every service fails CI and
/// says how many, and one that saves them should lower it. Counted bytes
/// are what the store asks for, the same on every run and machine, not a
/// timing.
const BUDGET_AT_1000: usize = 2_560;

fn label(s: &str) -> DnsLabel {
    DnsLabel::parse(s).expect("label")
}

fn key(i: usize) -> ServiceKey {
    ServiceKey { namespace: label(&format!("ns{}", i % 100)), name: label(&format!("svc{i}")) }
}

/// One cluster's slice of headless service `i`; `moved` gives it addresses
/// no other endpoint has.
fn slice(i: usize, c: u32, moved: bool) -> Object {
    let port = Port { name: Some(label("http")), protocol: Protocol::Tcp, port: 80 + (i % 7) as u16 };
    let first = if moved { 0x0B40_0000 } else { 0x0A40_0000 + i as u32 * CLUSTERS * ENDPOINTS };
    let base = first + c * ENDPOINTS;
    Object::Slice(EndpointSet {
        slice: SliceKey { namespace: format!("ns{}", i % 100), name: format!("svc{i}-cluster{c}") },
        service: key(i),
        cluster: ClusterId::parse(&format!("cluster{c}")).expect("id"),
        family: AddressFamily::V4,
        ports: vec![port],
        endpoints: (0..ENDPOINTS)
            .map(|e| Endpoint::new(vec![IpAddr::V4(Ipv4Addr::from(base + e))].into(), true))
            .collect(),
        origin: SliceOrigin::Mcs,
        trigger: Default::default(),
    })
}

/// Whether service `i` is headless: every `every`-th, none when 0.
fn is_headless(i: usize, every: usize) -> bool {
    every != 0 && i.is_multiple_of(every)
}

fn fleet(services: usize, every: usize) -> Vec<Object> {
    let mut out = Vec::with_capacity(services * 2);
    for i in 0..services {
        let headless = is_headless(i, every);
        let port = Port { name: Some(label("http")), protocol: Protocol::Tcp, port: 80 + (i % 7) as u16 };
        out.push(Object::Import(ServiceImport {
            key: key(i),
            kind: if headless { ImportType::Headless } else { ImportType::ClusterSetIp },
            ips: if headless {
                Default::default()
            } else {
                vec![IpAddr::V4(Ipv4Addr::from(0x0AC8_0000 + i as u32))].into()
            },
            ports: vec![port].into(),
            answers: Default::default(),
        }));
        if headless {
            out.extend((0..CLUSTERS).map(|c| slice(i, c, false)));
        }
    }
    out
}

struct Figures {
    services: usize,
    objects_bytes: usize,
    model_and_snapshot: usize,
    /// Resident bytes the model and snapshot added to the process: the
    /// counted bytes plus the allocator's size classes and part-used pages.
    resident: u64,
    snapshot: usize,
    peak_build: usize,
    build: Duration,
    /// `None` when no service is headless (the change is to a headless
    /// service's slice).
    publish_one: Option<Duration>,
    answers: bool,
}

fn measure(services: usize, every: usize, publishes: usize) -> Figures {
    let (reader, mut writer) = store::new(ZoneConfig::with_defaults(
        Name::from_ascii("clusterset.local.").expect("zone"),
        store::AnswerConfig::standard(),
    ));
    let empty = live();
    let resident_empty = resident_bytes().unwrap_or(0);
    let objects = fleet(services, every);
    let objects_bytes = live() - empty;
    reset_peak();
    let t = Instant::now();
    writer.apply(Update::Replace { source: SourceId::Watch(1), objects });
    writer.publish();
    let build = t.elapsed();
    let peak_build = PEAK.load(Ordering::Relaxed) - empty;
    let model_and_snapshot = live() - empty;
    let resident = resident_bytes().unwrap_or(0).saturating_sub(resident_empty);

    // One headless service's slice in one cluster changes, back and forth.
    let headless: Vec<usize> = (0..services).filter(|&i| is_headless(i, every)).collect();
    let mut times = Vec::with_capacity(publishes);
    if let Some(&headless) = headless.get(headless.len() / 2) {
        for n in 0..publishes {
            let object = slice(headless, 3, n % 2 == 0);
            let t = Instant::now();
            writer.apply(Update::Upsert { source: SourceId::Watch(1), object });
            writer.publish();
            times.push(t.elapsed());
        }
    }
    times.sort();
    let publish_one = times.get(times.len() / 2).copied();

    let snap = reader.load_full();
    let answers = snap.service_count() == services && snap.is_ready();
    drop(writer);
    let snapshot = live() - empty;
    drop(snap);
    Figures {
        services,
        objects_bytes,
        model_and_snapshot,
        resident,
        snapshot,
        peak_build,
        build,
        publish_one,
        answers,
    }
}

fn per(bytes: usize, services: usize) -> String {
    format!("{:.0}", bytes as f64 / services as f64)
}

fn main() {
    let bench = std::env::args().skip(1).any(|a| a == "--bench");
    let sizes: Vec<usize> = match std::env::var("FOOTPRINT_SERVICES").ok().and_then(|s| s.parse().ok()) {
        Some(n) => vec![n],
        None if bench => vec![10_000, 100_000],
        None => vec![1_000],
    };
    let every: usize =
        std::env::var("FOOTPRINT_HEADLESS_EVERY").ok().and_then(|s| s.parse().ok()).unwrap_or(10);
    let headless = match every {
        0 => "none headless".to_owned(),
        1 => "all headless".to_owned(),
        k => format!("every {k}th headless"),
    };
    println!(
        "\n## footprint: heap bytes per service ({headless}, {CLUSTERS} clusters × {ENDPOINTS} endpoints)\n"
    );
    println!(
        "| services | objects as the store takes them | writer model + snapshot | resident | snapshot alone | peak while building | build (all CPUs) | publish one changed slice (median) |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for services in sizes {
        let f = measure(services, every, if bench { 200 } else { 20 });
        assert!(f.answers, "the snapshot serves every service");
        if !bench && services == 1_000 && every == 10 {
            let per_service = f.model_and_snapshot / services;
            assert!(
                per_service <= BUDGET_AT_1000,
                "{per_service} heap bytes per service at 1,000 services, over the budget of {BUDGET_AT_1000}: \
                 find what grew (BENCHMARKS.md \"Fleet scale\"), or raise the budget in the same commit and say why"
            );
        }
        println!(
            "| {} | {} B | {} B ({:.0} MB) | {:.0} MB | {} B ({:.0} MB) | {:.0} MB | {:.2} s | {} |",
            f.services,
            per(f.objects_bytes, f.services),
            per(f.model_and_snapshot, f.services),
            f.model_and_snapshot as f64 / 1e6,
            f.resident as f64 / 1e6,
            per(f.snapshot, f.services),
            f.snapshot as f64 / 1e6,
            f.peak_build as f64 / 1e6,
            f.build.as_secs_f64(),
            f.publish_one.map_or("-".to_owned(), |t| format!("{:.3} ms", t.as_secs_f64() * 1e3)),
        );
    }
}
