//! A replica that lost its Lease sends nothing, checked from the API
//! servers' own audit logs under a seeded schedule of faults
//! (`harness::tenure`): three `sync --shards 6` replicas on three clusters
//! for two and a half minutes while exports are created, changed and
//! deleted; replicas frozen past their Lease and killed, member API
//! servers frozen and restarted, the Leases' cluster frozen. The long run
//! is `cargo bench --bench tenure` (BENCHMARKS.md).
//!
//! `TENURE_SEED=N` replays another schedule.

use std::time::Duration;

use crate::harness::clusters::TestClusters;
use crate::harness::tenure::{Plan, audit_args, check, converge, run};
use crate::watch::runtime;

#[test]
fn no_replica_writes_a_shard_after_another_took_its_lease_under_a_fault_schedule() {
    let dir = tempfile::tempdir().expect("tempdir");
    let args = audit_args(dir.path());
    let clusters = TestClusters::start_env(3, &[("CLUSTERS_APISERVER_ARGS", &args)]);
    let seed = std::env::var("TENURE_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(7);
    let plan = Plan {
        seed,
        run_for: Duration::from_secs(150),
        replicas: 3,
        shards: 6,
        lease: 5,
        services: 12,
        namespace: "tenure".into(),
    };
    let ran = run(&clusters, &plan);
    let rt = runtime();
    let converged = converge(&clusters, &plan.namespace, Duration::from_secs(60), &rt);
    let since_fault = ran.quiet_since.elapsed();
    let verdict = check(&clusters, &plan);
    eprintln!(
        "tenure seed {seed}: {} faults, {} changes; {} writes checked ({} refused), {} Lease writes, {} takeovers; \
         {} after a takeover, {} in flight, {} unattributed; converged {:?} ({:.1} s after the last fault)",
        ran.faults.len(),
        ran.changes,
        verdict.checked,
        verdict.refused,
        verdict.lease_writes,
        verdict.takeovers,
        verdict.after_takeover.len(),
        verdict.in_flight.len(),
        verdict.unattributed.len(),
        converged,
        since_fault.as_secs_f64()
    );
    for f in &ran.faults {
        eprintln!("  {:6.1} s  {} ({:.1} s)", f.at, f.what, f.lasted);
    }
    for w in &verdict.in_flight {
        eprintln!("  in flight: {w}");
    }
    let logs = || ran.replicas.iter().map(|r| r.log()).collect::<Vec<_>>().join("\n---\n");
    assert!(
        verdict.after_takeover.is_empty(),
        "seed {seed}: written after a takeover: {:#?}\n{}",
        verdict.after_takeover,
        logs()
    );
    assert!(
        verdict.unattributed.is_empty(),
        "seed {seed}: writes without a fence: {:#?}",
        verdict.unattributed
    );
    assert!(ran.faults.len() >= 5, "seed {seed}: {} faults", ran.faults.len());
    assert!(verdict.takeovers >= 2 && verdict.checked >= 50, "seed {seed}: too little happened: {verdict:?}");
    let took = converged.unwrap_or_else(|e| panic!("seed {seed}: not converged: {e}\n{}", logs()));
    assert!(
        since_fault <= Duration::from_secs(30),
        "seed {seed}: converged {:.1} s after the last fault (took {took:?})",
        since_fault.as_secs_f64()
    );
}
