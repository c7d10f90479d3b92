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
use crate::harness::eventually;
use crate::harness::served::Served;
use crate::watch::{Kube, headless, runtime, short, status, vip};

/// Resident bytes above the start that the limit leaves room for: two
/// starts of the same server differ by a few MiB.
const MARGIN_KIB: u64 = 16 * 1024;
/// Endpoints per ballast slice (the most an EndpointSlice may hold).
const BALLAST_ENDPOINTS: u32 = 1000;
/// Ballast slices created at most before the store must be over the
/// budget (each takes ~300 KiB resident on this machine: ~55 fill the
/// margin).
const BALLAST_MAX: u32 = 400;

/// `n` (at most 1,000) ready endpoints for ballast slice `i`, each address
/// its own: 10.{64 + i / 64}.{(i % 64) * 4 + j / 250}.x.
fn endpoints(i: u32, n: u32) -> Value {
    let address = |j: u32| format!("10.{}.{}.{}", 64 + i / 64, (i % 64) * 4 + j / 250, j % 250 + 1);
    Value::Array((0..n).map(|j| json!({"addresses": [address(j)]})).collect())
}

fn over(s: &Served) -> Option<f64> {
    metric(s, "clusterset_dns_memory_over_budget")
}

/// Endpoints the server holds for `service` (`ns/name`), in any state.
fn endpoints_of(s: &Served, service: &str) -> f64 {
    let prefix = format!("clusterset_dns_endpoints{{cluster=\"cluster-a\",service=\"{service}\",state=");
    let body = s.get("/metrics").1;
    body.lines().filter_map(|l| l.strip_prefix(&prefix)?.split_once(' ')?.1.trim().parse::<f64>().ok()).sum()
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

    // Ballast: slices of 1,000 endpoints. Each is weighed as one object
    // but takes far more once served, so they are admitted while the store
    // fits and take it past the budget; the rest are refused.
    rt.block_on(k.import("ballast", headless()));
    let mut made = 0;
    while made < BALLAST_MAX && over(&s) != Some(1.0) {
        rt.block_on(k.slice(
            &format!("ballast-{made}"),
            "ballast",
            "cluster-a",
            endpoints(made, BALLAST_ENDPOINTS),
            None,
        ));
        made += 1;
        // Applied (or refused): the next is weighed against what this took.
        let held = f64::from(made * BALLAST_ENDPOINTS);
        eventually("the ballast slice applied or refused", || {
            over(&s) == Some(1.0) || endpoints_of(&s, &format!("{ns}/ballast")) == held
        });
        if made % 20 == 0 {
            eprintln!("{made} ballast slices: {} KiB resident, limit {limit_kib} KiB", s.status_kib("VmRSS"));
        }
    }
    assert_eq!(over(&s), Some(1.0), "{made} ballast slices, still within the budget:\n{}", s.log());
    eprintln!(
        "over the budget after {made} ballast slices: {} KiB resident, limit {limit_kib} KiB",
        s.status_kib("VmRSS")
    );
    // As many again, so that the store stays past the budget whichever of
    // them are admitted.
    for i in made..made * 2 {
        rt.block_on(k.slice(
            &format!("ballast-{i}"),
            "ballast",
            "cluster-a",
            endpoints(i, BALLAST_ENDPOINTS),
            None,
        ));
    }
    let ballast = made * 2;
    // Settled: what the watch delivered is applied (or refused), so that
    // the edit below waits behind no backlog.
    let mut last = -1.0;
    eventually("the ballast settled", || {
        std::thread::sleep(Duration::from_millis(500));
        let now = endpoints_of(&s, &format!("{ns}/ballast"));
        std::mem::replace(&mut last, now) == now
    });
    let resident_kib = s.status_kib("VmRSS");
    assert!(resident_kib > limit_kib * 9 / 10, "{resident_kib} KiB resident, limit {limit_kib} KiB");

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
        for i in 0..ballast {
            k.delete_slice(&format!("ballast-{i}")).await;
        }
        k.delete_import("ballast").await;
    });
    eventually("the refused service answered", || short(&s, &late, "A") == ["10.91.0.1"]);
    eprintln!("refused service answered {:?} after the ballast went", freed.elapsed());
    eventually("within the budget again", || over(&s) == Some(0.0));
    assert!(s.log().contains("listing again, as the consumer asked"), "{}", s.log());
    assert_eq!(short(&s, &web, "A"), ["10.90.0.1"]);
}
