//! A step of the wall clock moves no tenure. The leader runs under
//! libfaketime with its wall clock (CLOCK_REALTIME) stepped an hour
//! forward and back while its monotonic clock runs on: it keeps the shard
//! throughout, a standby takes nothing, each step is named and counted,
//! and the API servers' audit logs show one writer. (With the fence on the
//! wall clock, as before, the step forward closed it: the shard was lost
//! and taken again.)

use std::time::Duration;

use crate::harness::clusters::TestClusters;
use crate::harness::eventually;
use crate::harness::syncing::Syncing;
use crate::harness::tenure::{Plan, audit_args, check};
use crate::sync::{readers, users};
use crate::watch::runtime;

/// libfaketime's thread-safe build, from Debian's `libfaketime`
/// (scripts/test.sh installs it).
fn libfaketime() -> String {
    let found = std::fs::read_dir("/usr/lib")
        .expect("/usr/lib")
        .filter_map(|e| Some(e.ok()?.path().join("faketime/libfaketimeMT.so.1")))
        .find(|p| p.exists());
    found
        .unwrap_or_else(|| panic!("libfaketimeMT.so.1 not found: apt-get install libfaketime"))
        .display()
        .to_string()
}

#[test]
fn a_step_of_the_leaders_wall_clock_moves_no_shard() {
    let dir = tempfile::tempdir().expect("tempdir");
    let args = audit_args(dir.path());
    let clusters = TestClusters::start_env(2, &[("CLUSTERS_APISERVER_ARGS", &args)]);
    let rt = runtime();
    let ns = "sync-clock";
    let plan = Plan {
        seed: 0,
        run_for: Duration::ZERO,
        replicas: 2,
        shards: 1,
        lease: 5,
        services: 0,
        namespace: ns.into(),
    };
    let u = users(&rt, &clusters, ns);
    let r = readers(&rt, &clusters, ns);
    let offset = dir.path().join("faketime");
    std::fs::write(&offset, "+0\n").expect("write the offset");
    let (lib, offset_path) = (libfaketime(), offset.display().to_string());
    let env = [
        ("LD_PRELOAD", lib.as_str()),
        ("FAKETIME_TIMESTAMP_FILE", offset_path.as_str()),
        ("FAKETIME_NO_CACHE", "1"),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
    ];
    let lease = plan.lease_name(0);
    let replica = |id: &str, env: &[(&str, &str)]| {
        let args = ["--namespace", ns, "--lease-name", &lease, "--lease-duration", "5", "--identity", id];
        Syncing::start(&clusters, &args, env)
    };
    let stepped = replica("stepped", &env);
    eventually("the stepped replica leads", || stepped.metric("clusterset_dns_sync_leader") == Some(1.0));
    let standby = replica("standby", &[]);
    eventually("the standby runs", || standby.metric("clusterset_dns_sync_leader") == Some(0.0));
    let export =
        |i: usize| rt.block_on(u[0].exported_service(&format!("svc-{i}"), &format!("10.9.7.{}", i + 1)));
    export(0);
    for (step, offset_now) in [("+3600", 1), ("+0", 2)] {
        std::fs::write(&offset, format!("{step}\n")).expect("step the clock");
        // Three lease durations: renewals, checks and writes go on meanwhile.
        for k in 0..3 {
            std::thread::sleep(Duration::from_secs(5));
            export(offset_now * 10 + k);
        }
    }
    eventually("every export imported in both members", || {
        r.iter().all(|reader| rt.block_on(reader.ours()).0 == 7)
    });
    let log = stepped.log();
    assert!(
        !log.contains("stopped writing it") && !log.contains("lost the Lease"),
        "a step of the wall clock moved the shard:\n{log}"
    );
    assert_eq!(stepped.metric("clusterset_dns_sync_leader"), Some(1.0));
    assert_eq!(standby.metric("clusterset_dns_sync_leader"), Some(0.0), "{}", standby.log());
    assert!(!standby.log().contains("leading the shard"), "{}", standby.log());
    let steps = stepped.metric(r#"clusterset_dns_sync_lease_anomalies_total{anomaly="clock_step"}"#);
    assert_eq!(steps, Some(2.0), "each step named and counted:\n{log}");
    assert!(log.contains("the wall clock stepped"), "{log}");
    // One writer, from the audit logs: the fence's Audit-ID stamps are the
    // stepped replica's wall clock, so they are checked on its own clock's
    // terms: every write is the stepped replica's.
    let verdict = check(&clusters, &plan);
    assert!(verdict.checked > 0 && verdict.unattributed.is_empty(), "{verdict:?}");
    assert!(verdict.after_takeover.is_empty(), "{verdict:?}");
    let writers: std::collections::BTreeSet<String> = std::fs::read_to_string(clusters.apiserver_log(0))
        .expect("log")
        .lines()
        .filter(|l| l.contains("\"fence-") && l.contains(ns))
        .filter_map(|l| l.split(" sync/").nth(1)?.split('"').next().map(str::to_owned))
        .collect();
    assert_eq!(writers, ["stepped".to_owned()].into(), "writers");
}
