//! The memory budget (`--memory-limit`) against a real API server: over
//! the budget, an edit is served at once and a new service is refused;
//! once the store fits again, the watch that was refused lists again and
//! the refused service appears. The server is the real binary under the
//! least-privilege identity of `deploy/serve/rbac.yaml`; the limit is set
//! from this machine's own figure for the same start, so the test does not
//! depend on the build.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::fleet::metric;
use crate::harness::clusters::shared;
use crate::harness::served::Served;
use crate::harness::{eventually, within};
use crate::watch::{Kube, headless, runtime, short, status, vip};

/// Resident bytes above the start that the limit leaves room for: two
/// starts of the same server differ by a few MiB.
const MARGIN_KIB: u64 = 16 * 1024;
/// Endpoints per ballast slice (the most an EndpointSlice may hold).
const BALLAST_ENDPOINTS: u32 = 1000;
/// Ballast slices: created with one endpoint each, then grown to
/// [`BALLAST_ENDPOINTS`], [`GROWN_AT_ONCE`] at a time, until the store is
/// well past the headroom (each takes ~280 KiB resident on this machine:
/// ~60 fill the margin, ~90 take it well past).
const BALLAST_SLICES: u32 = 200;
/// Ballast slices per headless service: a publish builds again only the
/// services it changed, and one service of 100,000 endpoints would make
/// each growth slower than the test's waits.
const SLICES_PER_SERVICE: u32 = 10;
/// Ballast slices grown between two readings of the resident size.
const GROWN_AT_ONCE: u32 = 5;
/// Resident KiB past the headroom that the grown ballast must reach: more
/// than the allocator gives back after a publish (the snapshot being
/// replaced).
const WELL_PAST_KIB: u64 = 8 * 1024;

/// `n` (at most 1,000) ready endpoints for ballast slice `i`, each address
/// its own: 10.{64 + i / 64}.{(i % 64) * 4 + j / 250}.x.
fn endpoints(i: u32, n: u32) -> Value {
    let address = |j: u32| format!("10.{}.{}.{}", 64 + i / 64, (i % 64) * 4 + j / 250, j % 250 + 1);
    Value::Array((0..n).map(|j| json!({"addresses": [address(j)]})).collect())
}

fn over(s: &Served) -> Option<f64> {
    metric(s, "clusterset_dns_memory_over_budget")
}

/// The headless service of ballast slice `i`.
fn ballast_service(i: u32) -> String {
    format!("ballast-{}", i / SLICES_PER_SERVICE)
}

/// Endpoints the server holds for the services whose `ns/name` starts with
/// `service`, in any state.
fn endpoints_of(s: &Served, service: &str) -> f64 {
    let prefix = format!("clusterset_dns_endpoints{{cluster=\"cluster-a\",service=\"{service}");
    let body = s.get("/metrics").1;
    let value = |l: &str| {
        l.strip_prefix(&prefix)?.split_once("\",state=")?.1.split_once(' ')?.1.trim().parse::<f64>().ok()
    };
    body.lines().filter_map(value).sum()
}

#[test]
fn over_the_budget_edits_are_served_at_once_and_a_refused_service_appears_once_it_fits() {
    let clusters = shared();
    let rt = runtime();
    let ns = "memory-budget";
    let k = rt.block_on(async { Kube::new(clusters.client(0).await, ns).await });
    let ready = |a: &str, b: &str| json!([{"addresses": [a]}, {"addresses": [b]}]);
    rt.block_on(async {
        k.import("web", headless()).await;
        k.slice("web-a", "web", "cluster-a", ready("10.90.0.1", "10.90.0.2"), None).await;
    });
    let kubeconfig = clusters.serve_kubeconfig(0);
    let kubeconfig = kubeconfig.to_str().expect("path");
    // --metrics-per-service: `endpoints_of` reads the per-service series.
    let args = |limit: &str| -> Vec<String> {
        ["--kubeconfig", kubeconfig, "--namespace", ns, "--memory-limit", limit, "--metrics-per-service"]
            .map(str::to_owned)
            .to_vec()
    };
    let start = |limit: &str| {
        let args = args(limit);
        let s = Served::start(&args.iter().map(String::as_str).collect::<Vec<_>>());
        s.wait_ready(Duration::from_secs(30));
        s
    };
    let mut idle = start("none");
    let start_kib = idle.status_kib("VmRSS");
    idle.stop();
    let limit_kib = (start_kib + MARGIN_KIB) * 10 / 9;
    let s = start(&format!("{limit_kib}Ki"));
    eprintln!("started: {start_kib} KiB resident, then {} KiB; limit {limit_kib} KiB", s.status_kib("VmRSS"));
    let web = format!("web.{ns}.svc.clusterset.local");
    assert_eq!(short(&s, &web, "A"), ["10.90.0.1", "10.90.0.2"]);
    assert_eq!(over(&s), Some(0.0));

    // Ballast: small slices, admitted while the store fits, then edited
    // to 1,000 endpoints each. An edit of a held object adds no object and
    // is applied however far over (so that an endpoint turning not-ready
    // is never refused), so the store grows past the budget as far as the
    // test wants, whatever the resident size does between publishes: well
    // past, a new service below is refused whatever the allocator gives
    // back meanwhile.
    rt.block_on(async {
        for service in 0..BALLAST_SLICES.div_ceil(SLICES_PER_SERVICE) {
            k.import(&format!("ballast-{service}"), headless()).await;
        }
        for i in 0..BALLAST_SLICES {
            k.slice(&format!("ballast-{i}"), &ballast_service(i), "cluster-a", endpoints(i, 1), None).await;
        }
    });
    let ballast_endpoints = || endpoints_of(&s, &format!("{ns}/ballast-"));
    eventually("the small ballast slices applied", || ballast_endpoints() == f64::from(BALLAST_SLICES));
    assert_eq!(over(&s), Some(0.0), "{BALLAST_SLICES} one-endpoint slices refused:\n{}", s.log());
    let headroom_kib = limit_kib * 9 / 10;
    let mut grown = 0;
    let resident_kib = loop {
        // Read once the allocator gave back what the last publish freed.
        std::thread::sleep(Duration::from_millis(300));
        let resident_kib = s.status_kib("VmRSS");
        if resident_kib > headroom_kib + WELL_PAST_KIB {
            break resident_kib;
        }
        assert!(
            grown < BALLAST_SLICES,
            "{grown} ballast slices of {BALLAST_ENDPOINTS} endpoints, {resident_kib} KiB resident, still not well past the headroom ({headroom_kib} KiB)"
        );
        rt.block_on(async {
            for i in grown..grown + GROWN_AT_ONCE {
                k.slice(
                    &format!("ballast-{i}"),
                    &ballast_service(i),
                    "cluster-a",
                    endpoints(i, BALLAST_ENDPOINTS),
                    None,
                )
                .await;
            }
        });
        grown += GROWN_AT_ONCE;
        let held = f64::from(BALLAST_SLICES + grown * (BALLAST_ENDPOINTS - 1));
        let applied = within(Duration::from_secs(20), || ballast_endpoints() == held);
        assert!(
            applied,
            "{grown} ballast slices grown, {} of {held} endpoints served:\n{}",
            ballast_endpoints(),
            s.log()
        );
    };
    eprintln!("{grown} ballast slices grown: {resident_kib} KiB resident, headroom {headroom_kib} KiB");
    eventually("over the budget", || over(&s) == Some(1.0));

    // An endpoint turns not-ready: an edit, applied however far over.
    let edited = Instant::now();
    let not_ready = json!([{"addresses": ["10.90.0.1"]},
                           {"addresses": ["10.90.0.2"], "conditions": {"ready": false}}]);
    rt.block_on(k.slice("web-a", "web", "cluster-a", not_ready, None));
    let took = edited.elapsed()
        + eventually("the not-ready endpoint dropped", || short(&s, &web, "A") == ["10.90.0.1"]);
    eprintln!("not-ready endpoint dropped {took:?} after the write");
    assert!(took < Duration::from_secs(1), "dropped after {took:?}:\n{}", s.log());
    assert_eq!(over(&s), Some(1.0));

    // A new service while over: refused, not answered.
    let late = format!("late.{ns}.svc.clusterset.local");
    rt.block_on(async {
        k.import("late", vip(&["10.91.0.1"])).await;
        k.slice("late-a", "late", "cluster-a", ready("10.91.1.1", "10.91.1.2"), None).await;
    });
    assert!(s.wait_log("1 ServiceImport more from watch #0"), "the new import not refused:\n{}", s.log());
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(status(&s, &late), "NXDOMAIN", "a refused service answered");
    assert_eq!(over(&s), Some(1.0));
    assert_eq!(s.get("/ready").0, 200, "the last good state is served: ready");

    // The ballast goes (removals are never refused): the store fits, the
    // watches that refused list again, and the refused service appears.
    let freed = Instant::now();
    rt.block_on(async {
        for i in 0..BALLAST_SLICES {
            k.delete_slice(&format!("ballast-{i}")).await;
        }
        for service in 0..BALLAST_SLICES.div_ceil(SLICES_PER_SERVICE) {
            k.delete_import(&format!("ballast-{service}")).await;
        }
    });
    eventually("the refused service answered", || short(&s, &late, "A") == ["10.91.0.1"]);
    eprintln!("refused service answered {:?} after the ballast went", freed.elapsed());
    eventually("within the budget again", || over(&s) == Some(0.0));
    assert!(s.log().contains("listing again, as the consumer asked"), "{}", s.log());
    assert_eq!(short(&s, &web, "A"), ["10.90.0.1"]);
}
