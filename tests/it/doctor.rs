//! `clusterset-dns doctor` (the real binary) on three real clusters, as the
//! read-only identity of `deploy/centralized/rbac.yaml`. The real `sync`
//! creates what a user has (imports, VIPs, MCS slices, conditions) for a
//! healthy service and for services that are then broken in one way each,
//! by hand or by a conflicting export; `serve` in cluster-3 answers DNS.
//! Each case asserts the exit code and its verdict line.

use std::process::Command;
use std::time::{Duration, Instant};

use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use serde_json::json;

use crate::fleet::User;
use crate::harness::clusters::{TestClusters, shared};
use crate::harness::syncing::Syncing;
use crate::harness::{BIN, past_second_of};
use crate::watch::{import_resource, runtime, serve, wait_ready};

const NS: &str = "doctor";

/// One run of the binary.
struct Run {
    code: i32,
    out: String,
    err: String,
}

impl Run {
    fn has(&self, line: &str) -> bool {
        self.out.lines().any(|l| l.trim_end() == line)
    }

    fn shown(&self) -> String {
        format!("exit {}\n--- stdout ---\n{}--- stderr ---\n{}", self.code, self.out, self.err)
    }
}

fn run(args: &[String]) -> Run {
    let out = Command::new(BIN)
        .arg("doctor")
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run clusterset-dns doctor");
    Run {
        code: out.status.code().unwrap_or(-1),
        out: String::from_utf8_lossy(&out.stdout).into_owned(),
        err: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// How long doctor may wait for one read here. Every server these tests read
/// answers, so the bound is only ever reached under load (CI builds the
/// release image beside them; 5 s was once not enough): generous costs nothing.
const TIMEOUT: &str = "30";

/// `doctor NAME` over every cluster as the identity of deploy/`role`/rbac.yaml.
fn doctor(clusters: &TestClusters, role: &str, name: &str, extra: &[String]) -> Run {
    let mut args = vec![name.to_owned(), "--timeout".into(), TIMEOUT.into()];
    for i in 0..clusters.len() {
        args.push("--cluster".into());
        args.push(format!("{}={}", clusters.name(i), clusters.role_kubeconfig(i, role).display()));
    }
    args.extend_from_slice(extra);
    run(&args)
}

/// Runs `doctor` until `done` holds for its result (at most 60 s).
fn until(what: &str, mut attempt: impl FnMut() -> Run, done: impl Fn(&Run) -> bool) -> Run {
    let start = Instant::now();
    loop {
        let r = attempt();
        if done(&r) {
            return r;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{what}: not within 60 s; last run:\n{}",
            r.shown()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// An admin's ServiceImport API of cluster `i`.
async fn imports(clusters: &TestClusters, i: usize) -> Api<DynamicObject> {
    Api::namespaced_with(clusters.client(i).await, NS, &import_resource("v1beta1"))
}

async fn vip_of(clusters: &TestClusters, i: usize, name: &str) -> String {
    let o = imports(clusters, i).await.get(name).await.expect("get ServiceImport");
    o.data.pointer("/spec/ips/0").and_then(|v| v.as_str()).expect("import ips").to_owned()
}

#[test]
fn doctor_passes_a_healthy_service_and_names_what_is_broken_in_the_others() {
    let clusters = shared();
    let rt = runtime();
    let u: Vec<User> = rt.block_on(async {
        let mut v = Vec::new();
        for i in 0..clusters.len() {
            v.push(User::new(clusters, i, NS).await);
        }
        v
    });
    let mut sync = Syncing::start(clusters, &["--namespace", NS, "--no-leader-election"], &[]);
    // ClusterSetIP services exported by cluster-1 and cluster-2, one ready
    // endpoint each; `porty` and `typey` exported by cluster-1 first and a
    // second later by cluster-2 with another port / as headless (creation
    // timestamps have one-second resolution).
    let plain = ["healthy", "noimport", "stale", "vipbad"];
    rt.block_on(async {
        for name in plain {
            for (i, user) in u[..2].iter().enumerate() {
                user.service(name, json!({})).await;
                let ip = format!("10.{}.0.1", i + 1);
                user.endpoints(&format!("{name}-own"), name, json!([{"addresses": [ip]}])).await;
                user.export(name).await;
            }
        }
        for name in ["porty", "typey"] {
            u[0].service(name, json!({})).await;
            u[0].export(name).await;
        }
    });
    // cluster-2's exports in a later second than cluster-1's last.
    let r0 = rt.block_on(crate::sync::Reader::new(clusters, 0, NS));
    let last =
        ["porty", "typey"].map(|name| rt.block_on(r0.export_created(name)).expect("cluster-1's export"));
    past_second_of(last.iter().max().expect("exports"));
    rt.block_on(async {
        u[1].service("porty", json!({"ports": [{"name": "http", "protocol": "TCP", "port": 8080}]})).await;
        u[1].export("porty").await;
        u[1].service("typey", json!({"clusterIP": "None"})).await;
        u[1].export("typey").await;
    });
    // What sync wrote is healthy: doctor says so once it has converged.
    for name in plain {
        until(
            &format!("{name} healthy"),
            || doctor(clusters, "centralized", &format!("{name}.{NS}"), &[]),
            |r| r.code == 0,
        );
    }
    // Conflicts: the conditions written, nothing but the conflict to say.
    let porty = until(
        "porty's conflict on its exports",
        || doctor(clusters, "centralized", &format!("porty.{NS}"), &[]),
        |r| {
            r.out.contains("PortConflict:")
                && !r.out.contains("StaleCondition")
                && !r.out.contains("NoConditions")
        },
    );
    assert_eq!(porty.code, 1, "{}", porty.shown());
    assert!(
        porty.has(
            "  error    PortConflict: cluster-2 exports port http (TCP/8080) but the import lists http (TCP/80): PortConflict, the oldest export, in cluster-1, wins"
        ),
        "{}",
        porty.shown()
    );
    let typey = until(
        "typey's conflict on its exports",
        || doctor(clusters, "centralized", &format!("typey.{NS}"), &[]),
        |r| {
            r.out.contains("TypeConflict:")
                && !r.out.contains("StaleCondition")
                && !r.out.contains("NoConditions")
        },
    );
    assert_eq!(typey.code, 1, "{}", typey.shown());
    assert!(
        typey.has(
            "  error    TypeConflict: cluster-2's Service is Headless but the import is ClusterSetIP (from cluster-1): TypeConflict, the oldest export, in cluster-1, wins"
        ),
        "{}",
        typey.shown()
    );
    assert!(
        typey
            .out
            .lines()
            .any(|l| l.starts_with("    condition     Conflict=True TypeConflict: Conflicting type.")),
        "the export's condition and its message are shown:\n{}",
        typey.shown()
    );

    // From here on nothing repairs what is broken by hand.
    sync.stop();
    let s3 = serve(&clusters.serve_kubeconfig(2), NS);
    wait_ready(&s3);
    let dns3 = |member: &str| vec!["--dns".to_owned(), format!("{member}={}", s3.addr)];

    // Healthy, with cluster-3's DNS asked: its answer is its import's VIP.
    let healthy =
        doctor(clusters, "centralized", &format!("healthy.{NS}.svc.clusterset.local"), &dns3("cluster-3"));
    assert_eq!(healthy.code, 0, "{}", healthy.shown());
    let vip3 = rt.block_on(vip_of(clusters, 2, "healthy"));
    assert!(healthy.out.contains(&format!("A {vip3} |")), "{}", healthy.shown());
    assert!(healthy.out.contains("Healthy: no problems found"), "{}", healthy.shown());
    let json = doctor(clusters, "centralized", &format!("healthy.{NS}"), &["--output".into(), "json".into()]);
    assert_eq!(json.code, 0, "{}", json.shown());
    let v: serde_json::Value = serde_json::from_str(&json.out).expect("JSON report");
    assert_eq!(
        (v["healthy"].as_bool(), v["verdicts"].as_array().map(Vec::len)),
        (Some(true), Some(0)),
        "{v}"
    );

    // cluster-2's DNS forwards to cluster-3's server: answers that are not cluster-2's VIP.
    let vip2 = rt.block_on(vip_of(clusters, 1, "healthy"));
    let wrong = doctor(clusters, "centralized", &format!("healthy.{NS}"), &dns3("cluster-2"));
    assert_eq!(wrong.code, 1, "{}", wrong.shown());
    let line = format!(
        "  error    DnsMismatch: cluster-2's DNS {} answers {vip3} for healthy.{NS}.svc.clusterset.local. but the ServiceImport there lists ips {vip2}",
        s3.addr
    );
    assert!(wrong.has(&line), "no line\n{line}\nin\n{}", wrong.shown());

    // The import deleted in cluster-3: missing, and its DNS says NXDOMAIN.
    rt.block_on(async {
        imports(clusters, 2).await.delete("noimport", &DeleteParams::default()).await.expect("delete import");
    });
    let missing = until(
        "cluster-3's DNS without noimport",
        || doctor(clusters, "centralized", &format!("noimport.{NS}"), &dns3("cluster-3")),
        |r| r.out.contains("A NXDOMAIN"),
    );
    assert_eq!(missing.code, 1, "{}", missing.shown());
    assert!(
        missing.has(&format!(
            "  error    ImportMissing: cluster-3 has no ServiceImport {NS}/noimport: noimport.{NS}.svc.clusterset.local. does not resolve there"
        )),
        "{}",
        missing.shown()
    );

    // cluster-2 unexports `stale`: its slices stay in every member.
    rt.block_on(u[1].unexport("stale"));
    let stale = doctor(clusters, "centralized", &format!("stale.{NS}"), &[]);
    assert_eq!(stale.code, 1, "{}", stale.shown());
    for member in ["cluster-1", "cluster-2", "cluster-3"] {
        let line = format!(
            "  error    StaleSlices: {member} has MCS EndpointSlices from cluster-2, which does not export {NS}/stale (validly): 1 ready endpoint(s) there still get traffic (written by sync.clusterset-dns.io)"
        );
        assert!(stale.has(&line), "no line\n{line}\nin\n{}", stale.shown());
    }
    assert!(stale.out.contains("  note     NotExportedHere: cluster-2 has a Service"), "{}", stale.shown());

    // cluster-1's import edited to an address that is not its VIP.
    let vip1 = rt.block_on(async {
        let body = json!({"apiVersion": "multicluster.x-k8s.io/v1beta1", "kind": "ServiceImport",
                          "metadata": {"name": "vipbad", "namespace": NS}, "spec": {"ips": ["10.101.255.254"]}});
        imports(clusters, 0)
            .await
            .patch("vipbad", &PatchParams::apply("doctor-test").force(), &Patch::Apply(&body))
            .await
            .expect("patch import");
        vip_of(clusters, 0, "vipbad").await
    });
    assert_eq!(vip1, "10.101.255.254");
    let bad = doctor(clusters, "centralized", &format!("vipbad.{NS}"), &[]);
    assert_eq!(bad.code, 1, "{}", bad.shown());
    let line =
        bad.out.lines().find(|l| l.contains("VipMismatch:")).unwrap_or_else(|| panic!("{}", bad.shown()));
    assert!(
        line.starts_with(
            "  error    VipMismatch: cluster-1's ServiceImport lists ips 10.101.255.254 but the clusterset VIP allocated there is 10.101."
        ),
        "{line}"
    );
}

#[test]
fn doctor_says_what_it_may_not_read_and_exits_2_for_a_member_it_cannot_reach() {
    let clusters = shared();
    // serve's identity may not list Services or ServiceExports.
    let r = doctor(clusters, "serve", &format!("anything.{NS}"), &[]);
    assert_eq!(r.code, 1, "{}", r.shown());
    assert!(
        r.out
            .lines()
            .any(|l| l
                .starts_with("  warning  Forbidden: cluster-1: may not list ServiceExports in namespace")),
        "{}",
        r.shown()
    );
    // A member whose API server is not there.
    let dir = tempfile::tempdir().expect("tempdir");
    let good = clusters.role_kubeconfig(0, "centralized");
    let text = std::fs::read_to_string(&good).expect("kubeconfig");
    assert!(text.contains(&clusters.server(0)), "{text}");
    let dead = dir.path().join("dead.kubeconfig");
    std::fs::write(&dead, text.replace(&clusters.server(0), "https://127.0.0.1:1"))
        .expect("write kubeconfig");
    let r = run(&[
        format!("web.{NS}"),
        "--cluster".into(),
        format!("cluster-1={}", good.display()),
        "--cluster".into(),
        format!("cluster-9={}", dead.display()),
        // The dead member refuses the connection at once; the live one may be slow.
        "--timeout".into(),
        TIMEOUT.into(),
    ]);
    assert_eq!(r.code, 2, "{}", r.shown());
    assert!(
        r.out.lines().any(|l| l.starts_with("  error    Unreachable: cluster-9: cannot read its API")),
        "{}",
        r.shown()
    );
    // A name that is not a service's: the command line is wrong.
    let r = run(&[
        "web.shop.svc.cluster.local".into(),
        "--cluster".into(),
        format!("cluster-1={}", good.display()),
    ]);
    assert_eq!(r.code, 64, "{}", r.shown());
    assert!(r.err.contains("NAME: \"web.shop.svc.cluster.local\" is not NAME.NAMESPACE"), "{}", r.shown());
}
