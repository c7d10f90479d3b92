//! Tenure under a fault schedule: three `sync --shards 6` replicas on three
//! loopback clusters with audit logging, for `TENURE_MINUTES` (default 30)
//! while exports are created, changed and deleted, one fault at a time from
//! a seeded schedule (`TENURE_SEED`, default 1): a replica frozen past its
//! Lease and resumed, a replica killed and restarted, a member's API server
//! frozen or restarted, the Leases' cluster frozen. Then the checker
//! (`tests/harness/tenure.rs`) reads every API server's audit log and
//! reports the writes checked, those whose fence passed after another
//! replica took the shard (must be 0), those in flight at a takeover, and
//! how long after the last fault every member held what the exports want.
//!
//! `cargo bench --bench tenure`; see `common` for how bench targets run.

#![allow(clippy::print_stdout)]

#[path = "../tests/harness/mod.rs"]
mod harness;

mod common;

use std::time::Duration;

use anyhow::{Result, bail};

use common::{main_of, start_clusters_env};
use harness::tenure::{Plan, audit_args, check, converge, run};

fn main() {
    main_of("tenure", tenure_bench);
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn tenure_bench(rt: &tokio::runtime::Runtime) -> Result<()> {
    let (seed, minutes) = (env_or("TENURE_SEED", 1), env_or("TENURE_MINUTES", 30));
    let dir = tempfile::tempdir()?;
    let args = audit_args(dir.path());
    let clusters = start_clusters_env(3, &[("CLUSTERS_APISERVER_ARGS", &args)]);
    let plan = Plan {
        seed,
        run_for: Duration::from_secs(minutes * 60),
        replicas: 3,
        shards: 6,
        lease: 5,
        services: 24,
        namespace: "tenure".into(),
    };
    println!(
        "plan: seed {seed}, {minutes} min of faults, {} replicas, --shards {}, --lease-duration {}, {} services",
        plan.replicas, plan.shards, plan.lease, plan.services
    );
    let ran = run(&clusters, &plan);
    let converged = converge(&clusters, &plan.namespace, Duration::from_secs(120), rt);
    let after_fault = ran.quiet_since.elapsed();
    let v = check(&clusters, &plan);
    let mut kinds = std::collections::BTreeMap::<&str, usize>::new();
    for f in &ran.faults {
        let kind = if f.what.contains("Leases' cluster") {
            "Leases' cluster frozen"
        } else if f.what.contains("API server frozen") {
            "member API server frozen"
        } else if f.what.contains("restarted") && f.what.contains("API server") {
            "member API server restarted"
        } else if f.what.contains("frozen") {
            "replica frozen past its Lease"
        } else {
            "replica killed and restarted"
        };
        *kinds.entry(kind).or_default() += 1;
    }
    println!("faults injected: {} ({kinds:?}); changes of exports: {}", ran.faults.len(), ran.changes);
    for f in &ran.faults {
        println!("  {:7.1} s  {} ({:.1} s)", f.at, f.what, f.lasted);
    }
    println!(
        "writes checked: {} ({} refused by the API server); Lease writes: {}; takeovers: {}",
        v.checked, v.refused, v.lease_writes, v.takeovers
    );
    println!("written after another replica's takeover: {}", v.after_takeover.len());
    for w in &v.after_takeover {
        println!("  {w}");
    }
    println!("in flight at a takeover (fence passed before it): {}", v.in_flight.len());
    for w in &v.in_flight {
        println!("  {w}");
    }
    println!("writes without a fence's Audit-ID: {}", v.unattributed.len());
    match &converged {
        Ok(_) => println!("converged {:.1} s after the last fault", after_fault.as_secs_f64()),
        Err(e) => println!("not converged 120 s after the last fault: {e}"),
    }
    if !v.after_takeover.is_empty() || !v.unattributed.is_empty() || converged.is_err() {
        bail!("tenure violated or not converged (seed {seed})");
    }
    Ok(())
}
