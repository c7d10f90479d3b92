//! `clusterset-dns setup-dns --watch` (the real binary) against a real API
//! server of its own and a real CoreDNS that runs the `kube-system/coredns`
//! Corefile as a cluster would: the test copies the ConfigMap into
//! CoreDNS's Corefile at every change (the kubelet's part) and CoreDNS's
//! `reload` picks it up, so the proof query passes only while the ConfigMap
//! forwards the zone. The stanza removed by hand is back and proven; with
//! `--watch=report` it is not, the metric says 0 and an Event names the
//! change; a writer that keeps removing it makes the watcher back off.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

use crate::coredns::{coredns_bin, free_port, spawn_coredns};
use crate::harness::BIN;
use crate::harness::clusters::TestClusters;
use crate::harness::http::{metric_value, try_http_get};
use crate::harness::process::{Owned, capture_output};
use crate::harness::served::Served;
use crate::harness::within;
use crate::watch::runtime;
use clusterset_dns::cluster_dns::verify;

/// The check interval the watchers run with, in seconds.
const INTERVAL: u64 = 2;

const BEGIN: &str = "# BEGIN clusterset-dns";

fn kubeadm() -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/setup-dns/kubeadm.Corefile"),
    )
    .expect("read fixture")
}

/// The Corefile as CoreDNS on loopback runs it: every server block on
/// `port` bound to 127.0.0.1, the kubernetes plugin pointed at
/// `kubeconfig`, the HTTP plugins on fixed loopback ports (the same at
/// every copy, or each copy would differ), `reload` every 2 s (its
/// minimum; a cluster's is 30 s), `loop` left out.
fn runnable(corefile: &str, kubeconfig: &Path, [port, ready, health]: [u16; 3]) -> String {
    let mut out = String::new();
    for line in corefile.lines() {
        let t = line.trim();
        if !line.starts_with(' ') && t.ends_with('{') && t.contains(":53") {
            out.push_str(&line.replace(":53", &format!(":{port}")));
            out.push_str("\n    bind 127.0.0.1\n");
            continue;
        }
        match t {
            "loop" => continue,
            "reload" => out.push_str("    reload 2s 1s\n"),
            "ready" => out.push_str(&format!("    ready 127.0.0.1:{ready}\n")),
            "health {" => out.push_str(&format!("    health 127.0.0.1:{health} {{\n")),
            "prometheus :9153" => {}
            _ if t.starts_with("kubernetes ") => {
                out.push_str(line);
                out.push_str(&format!("\n       kubeconfig {}\n", kubeconfig.display()));
            }
            _ => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

/// A running `setup-dns --watch`.
struct Watcher {
    child: Owned,
    log: Arc<Mutex<String>>,
    http: std::net::SocketAddr,
}

impl Watcher {
    fn start(clusters: &TestClusters, server: &str, verify: &str, mode: &str) -> Self {
        let http: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
        let mut child = Command::new(BIN)
            .arg("setup-dns")
            .arg("--kubeconfig")
            .arg(clusters.kubeconfig(0))
            .args([mode, "--interval", &INTERVAL.to_string(), "--server", server, "--verify", verify])
            .args(["--http-listen", &http.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start setup-dns --watch");
        let log = capture_output(&mut child);
        Self { child: Owned::new(child), log, http }
    }

    /// `clusterset_dns_wiring_ok{layout="corefile"}`, when served.
    fn ok(&self) -> Option<f64> {
        let (_, body) = try_http_get(self.http, "/metrics")?;
        metric_value(&body, "clusterset_dns_wiring_ok{layout=\"corefile\"}")
    }

    /// `clusterset_dns_wiring_rewrites_total{layout="corefile"}`: in
    /// report mode, one more per check that finds the wiring changed.
    fn rewrites(&self) -> Option<f64> {
        let (_, body) = try_http_get(self.http, "/metrics")?;
        metric_value(&body, "clusterset_dns_wiring_rewrites_total{layout=\"corefile\"}")
    }

    fn log(&self) -> String {
        self.log.lock().expect("log").clone()
    }
}

struct Cluster {
    cms: Api<ConfigMap>,
    events: Api<Event>,
}

impl Cluster {
    async fn corefile(&self) -> String {
        let cm = self.cms.get("coredns").await.expect("get coredns");
        cm.data.and_then(|d| d.get("Corefile").cloned()).unwrap_or_default()
    }

    /// Sets the Corefile as `manager` would (a merge patch, as `kubectl
    /// edit` sends).
    async fn write(&self, manager: &str, corefile: &str) {
        let params = PatchParams { field_manager: Some(manager.into()), ..Default::default() };
        let patch = json!({"data": {"Corefile": corefile}});
        self.cms.patch("coredns", &params, &Patch::Merge(&patch)).await.expect("patch coredns");
    }

    /// Notes of the Events about ConfigMap coredns with `reason`.
    async fn events(&self, reason: &str) -> Vec<String> {
        let list = self.events.list(&ListParams::default()).await.expect("list events");
        list.items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("coredns"))
            .filter(|e| e.reason.as_deref() == Some(reason))
            .filter_map(|e| e.note)
            .collect()
    }
}

/// Copies the ConfigMap's Corefile, made runnable, into `file` whenever it
/// changes (what the kubelet does for a mounted ConfigMap, here every
/// 100 ms).
async fn mirror(cms: Api<ConfigMap>, file: PathBuf, kubeconfig: PathBuf, ports: [u16; 3]) {
    let mut last = String::new();
    loop {
        if let Ok(cm) = cms.get("coredns").await {
            let corefile = cm.data.and_then(|d| d.get("Corefile").cloned()).unwrap_or_default();
            if corefile != last {
                let _ = std::fs::write(&file, runnable(&corefile, &kubeconfig, ports));
                last = corefile;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[test]
fn setup_dns_watch_repairs_a_removed_stanza_reports_it_in_report_mode_and_backs_off_from_a_fight() {
    let clusters = TestClusters::start(1);
    let rt = runtime();
    let k = rt.block_on(async {
        let client = clusters.client(0).await;
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "kube-system");
        let body = json!({"apiVersion": "v1", "kind": "ConfigMap",
                          "metadata": {"name": "coredns", "namespace": "kube-system"},
                          "data": {"Corefile": kubeadm()}});
        cms.patch("coredns", &PatchParams::apply("tests").force(), &Patch::Apply(&body))
            .await
            .expect("apply");
        Cluster { cms, events: Api::namespaced(client, "kube-system") }
    });
    let ours = Served::start(&[]);
    let server = ours.addr.to_string();

    // CoreDNS runs what the ConfigMap says (the kubelet's copy, `reload`).
    let dir = tempfile::tempdir().expect("tempdir");
    let ports = [free_port(), free_port(), free_port()];
    let conf = runnable(&kubeadm(), &clusters.kubeconfig(0), ports);
    let (mut coredns, coredns_log) = spawn_coredns(coredns_bin(), dir.path(), &conf);
    let mirroring =
        rt.spawn(mirror(k.cms.clone(), dir.path().join("Corefile"), clusters.kubeconfig(0), ports));
    assert!(
        within(Duration::from_secs(30), || coredns_log
            .lock()
            .expect("log")
            .contains(&format!(":{}", ports[0]))),
        "CoreDNS did not start:\n{}",
        coredns_log.lock().expect("log")
    );
    let verify = format!("127.0.0.1:{}", ports[0]);
    let two_intervals = Duration::from_secs(2 * INTERVAL);

    // Reapply (the default): wires it first, proven through CoreDNS.
    let mut w = Watcher::start(&clusters, &server, &verify, "--watch");
    assert!(
        within(Duration::from_secs(60), || w.ok() == Some(1.0)),
        "never wired and proven:\n{}\nCoreDNS:\n{}",
        w.log(),
        coredns_log.lock().expect("log")
    );
    assert!(rt.block_on(k.corefile()).contains(BEGIN));

    // Removed by hand: back within two intervals, and proven through
    // CoreDNS (which reloaded without it meanwhile, or not yet).
    rt.block_on(k.write("by-hand", &kubeadm()));
    let removed = Instant::now();
    assert!(
        within(two_intervals, || rt.block_on(k.corefile()).contains(BEGIN)),
        "the stanza is not back within {two_intervals:?}:\n{}",
        w.log()
    );
    let back = removed.elapsed();
    let proven = within(two_intervals + Duration::from_secs(4), || {
        rt.block_on(k.events("Reapplied")).iter().any(|n| n.contains("proven: dns-version"))
            || rt.block_on(k.events("WiringProven")).len() > 1
    });
    eprintln!("removed by hand: back after {back:?}, proven after {:?}", removed.elapsed());
    assert!(
        proven,
        "not proven after the repair:\n{}\nCoreDNS:\n{}",
        w.log(),
        coredns_log.lock().expect("log")
    );
    assert_eq!(w.ok(), Some(1.0));
    let notes = rt.block_on(k.events("Reapplied"));
    assert!(
        notes.iter().any(|n| n.contains(
            "kube-system/coredns Corefile: the clusterset-dns wiring was removed (last written by field manager \"by-hand\"); re-applied"
        )),
        "{notes:?}"
    );
    w.child.stop("TERM", Duration::from_secs(5));

    // Report: removed, not written back; the metric goes to 0 and an Event
    // names what changed.
    let w = Watcher::start(&clusters, &server, &verify, "--watch=report");
    assert!(within(Duration::from_secs(30), || w.ok() == Some(1.0)), "report: not ok at first:\n{}", w.log());
    rt.block_on(k.write("by-hand", &kubeadm()));
    assert!(within(two_intervals, || w.ok() == Some(0.0)), "report: the metric stays 1:\n{}", w.log());
    let note = "kube-system/coredns Corefile: the clusterset-dns wiring was removed (last written by field manager \"by-hand\"); not re-applied (--watch=report)";
    assert!(
        within(two_intervals, || rt.block_on(k.events("WiringChanged")).iter().any(|n| n == note)),
        "{:?}\n{}",
        rt.block_on(k.events("WiringChanged")),
        w.log()
    );
    // A later check found it changed too, and reported it again.
    let reported = w.rewrites().expect("rewrites");
    assert!(
        within(2 * two_intervals, || w.rewrites().is_some_and(|n| n > reported)),
        "no check after the report:\n{}",
        w.log()
    );
    assert!(!rt.block_on(k.corefile()).contains(BEGIN), "report mode wrote:\n{}", w.log());
    // CoreDNS reloaded without the stanza: the proof query fails there now
    // (so the proofs above and below are the ConfigMap's doing).
    let at: std::net::SocketAddr = verify.parse().expect("addr");
    let proof = hickory_proto::rr::Name::from_ascii("dns-version.clusterset.local.").expect("name");
    let answers = || {
        let outcome = rt.block_on(verify::ask(at, &proof, Duration::from_secs(1)));
        matches!(outcome, verify::Outcome::Answered(_))
    };
    assert!(within(Duration::from_secs(10), || !answers()), "CoreDNS still forwards the zone");
    drop(w);

    // Back from there: written and proven through the reloaded CoreDNS.
    let started = Instant::now();
    let w = Watcher::start(&clusters, &server, &verify, "--watch");
    // Two intervals, plus the start of the process and CoreDNS's reload
    // (2 s ± 1 s, which the proof waits for).
    assert!(
        within(two_intervals + Duration::from_secs(4), || w.ok() == Some(1.0)),
        "not rewired and proven within two intervals:\n{}",
        w.log()
    );
    eprintln!("removed for a while: written and proven {:?} after the watcher started", started.elapsed());
    assert!(answers(), "proven, yet CoreDNS does not answer");

    // A fight: another writer removes it again each time it is back. Three
    // repairs; the fourth removal is left, reported, naming the writer.
    for round in 1..=3 {
        rt.block_on(k.write("fighter", &kubeadm()));
        assert!(
            within(two_intervals, || rt.block_on(k.corefile()).contains(BEGIN)),
            "rewrite {round} not repaired:\n{}",
            w.log()
        );
    }
    rt.block_on(k.write("fighter", &kubeadm()));
    assert!(within(two_intervals, || w.ok() == Some(0.0)), "the fourth rewrite: still ok:\n{}", w.log());
    assert!(
        within(two_intervals, || {
            rt.block_on(k.events("RewrittenByAnotherController"))
                .iter()
                .any(|n| n.starts_with("another controller (field manager \"fighter\") keeps rewriting kube-system/coredns Corefile"))
        }),
        "{:?}\n{}",
        rt.block_on(k.events("RewrittenByAnotherController")),
        w.log()
    );
    std::thread::sleep(2 * two_intervals);
    assert!(!rt.block_on(k.corefile()).contains(BEGIN), "it kept fighting:\n{}", w.log());
    assert!(w.log().contains("keeps rewriting"), "{}", w.log());
    drop(w);
    mirroring.abort();
    let _ = coredns.kill();
    let _ = coredns.wait();
}
