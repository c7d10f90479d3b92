//! No half-dead server: panics injected into each task of the real binary
//! (debug builds arm `CLUSTERSET_DNS_FAULT` points) are survived and
//! counted, or fail `/health` and end the process non-zero.

use std::time::Duration;

use crate::fleet::metric;
use crate::harness::served::Served;
use crate::support::{q, tcp_raw, udp_raw};

/// A query for a name whose first label is `panic`: the `query` fault
/// point panics while answering it.
fn query_of_death() -> Vec<u8> {
    q("panic.web.shop.svc.clusterset.local.", "A").bytes()
}

/// Every one of `n` good queries, each from its own UDP source port, and
/// one over TCP, is answered.
#[track_caller]
fn all_answered(s: &Served, n: usize) {
    let good = q("web.shop.svc.clusterset.local.", "A");
    for i in 0..n {
        assert!(!good.udp(s.addr).answers.is_empty(), "UDP query {i} answered");
    }
    assert!(!good.tcp(s.addr).answers.is_empty(), "TCP query answered");
}

#[track_caller]
fn panics(s: &Served, task: &str) -> f64 {
    metric(s, &format!("clusterset_dns_panics_total{{task=\"{task}\"}}")).unwrap_or(-1.0)
}

#[test]
fn a_query_that_panics_loses_only_itself_on_every_worker_and_transport() {
    let s = Served::start_env("serve", &["--udp-workers", "2"], &[("CLUSTERSET_DNS_FAULT", "query")]);
    let death = query_of_death();
    // From many source ports, so the kernel spreads them over both workers.
    for _ in 0..20 {
        assert_eq!(udp_raw(s.addr, &death), None, "the query of death gets no answer");
    }
    assert_eq!(tcp_raw(s.addr, &death), None, "its connection is closed");
    all_answered(&s, 50);
    assert_eq!(panics(&s, "udp"), 20.0);
    assert_eq!(panics(&s, "tcp"), 1.0);
    assert_eq!(s.get("/health").0, 200, "the server is whole");
    assert!(s.log().contains("panic: fault injected at Query"), "{}", s.log());
}

#[test]
fn a_worker_loop_that_panics_is_restarted_on_its_socket() {
    let s = Served::start_env("serve", &[], &[("CLUSTERSET_DNS_FAULT", "udp-loop")]);
    let good = q("web.shop.svc.clusterset.local.", "A").bytes();
    // The first batch dies with the loop; the restarted loop answers.
    let _ = udp_raw(s.addr, &good);
    assert!(s.wait_log("UDP worker panicked; restarting it on the same socket"), "{}", s.log());
    all_answered(&s, 20);
    assert_eq!(panics(&s, "udp"), 1.0);
}

#[test]
fn the_tcp_accept_loop_and_the_probes_are_restarted() {
    let s = Served::start_env("serve", &["--probe"], &[("CLUSTERSET_DNS_FAULT", "tcp-accept,probe")]);
    assert!(s.wait_log("task=\"tcp-accept\""), "{}", s.log());
    assert!(s.wait_log("task=\"probe\""), "{}", s.log());
    all_answered(&s, 5);
    assert_eq!(panics(&s, "tcp-accept"), 1.0);
    assert_eq!(panics(&s, "probe"), 1.0);
    assert_eq!(s.get("/health").0, 200);
}

#[test]
fn a_panicking_http_request_gets_500_and_the_endpoint_lives_on() {
    let s = Served::start_env("serve", &[], &[("CLUSTERSET_DNS_FAULT", "http")]);
    assert_eq!(s.get("/ready").0, 500, "the request that panicked");
    assert_eq!(s.get("/health").0, 200);
    assert_eq!(panics(&s, "http"), 1.0);
}

/// An object for an edit of the objects file: the file watch sends only
/// files whose bytes changed.
const IMPORT: &str = "apiVersion: multicluster.x-k8s.io/v1alpha1\nkind: ServiceImport\nmetadata: {name: web, namespace: shop}\nspec: {type: Headless}\n";

#[test]
fn a_dead_store_writer_fails_health_and_ends_the_process_non_zero() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("objects.yaml");
    std::fs::write(&file, "").expect("write");
    let objects = dir.path().to_str().expect("utf-8").to_owned();
    let mut s = Served::start_env("serve", &["--objects", &objects], &[("CLUSTERSET_DNS_FAULT", "writer")]);
    // An edit makes the file watch send an update: the writer panics on
    // it, and the process goes.
    std::fs::write(&file, IMPORT).expect("write");
    let status = s.wait_exit(Duration::from_secs(20)).expect("the process exits");
    assert!(!status.success(), "{status}");
    let log = s.log();
    assert!(log.contains("task writer panicked and cannot be restarted"), "{log}");
}

#[test]
fn health_fails_once_a_task_that_cannot_be_restarted_died() {
    use clusterset_dns::fault::Faults;
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("objects.yaml");
    std::fs::write(&file, "").expect("write");
    let objects = dir.path().to_str().expect("utf-8");
    let argv = [&crate::support::SERVE_ARGV[..], &["--objects", objects]].concat();
    let mut cfg = crate::support::serve_config(&argv);
    cfg.wire.faults = Faults::parse("writer").expect("fault point");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let running = clusterset_dns::cmd::serve::start(&cfg).await.expect("starts");
        let http = running.http_addr;
        // An edit makes the file watch send an update, which kills the writer.
        std::fs::write(&file, IMPORT).expect("write");
        let reason = tokio::time::timeout(Duration::from_secs(10), running.failures.wait_fatal())
            .await
            .expect("the writer's death is recorded")
            .to_owned();
        assert!(reason.contains("writer"), "{reason}");
        let (code, body) =
            tokio::task::spawn_blocking(move || crate::harness::http::http_get(http, "/health"))
                .await
                .expect("get");
        assert_eq!(code, 500, "{body}");
        assert!(body.contains("task writer panicked"), "{body}");
        running.stop();
    });
}
