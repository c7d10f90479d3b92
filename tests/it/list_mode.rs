//! `--list-mode` against real kube-apiservers with their `WatchList`
//! feature gate on and off (`CLUSTERS_APISERVER_ARGS`): streaming lists
//! serve what existed before the start, follow changes after it and relist
//! by streaming after an API server restart; where the gate is off, `auto`
//! lists in pages after one warning, `stream` stays un-ready and says why,
//! naming the flag. Centralized serve's member watches list the same way.

use std::time::Duration;

use serde_json::json;

use crate::deploy::kubectl_ok;
use crate::fleet::User;
use crate::harness::clusters::{Component, TestClusters};
use crate::harness::served::Served;
use crate::harness::{eventually, within};
use crate::watch::{Kube, headless, runtime, short, status, vip};

const NS: &str = "list-mode";
const WEB: &str = "web.list-mode.svc.clusterset.local.";
const DB: &str = "db.list-mode.svc.clusterset.local.";
const API: &str = "api.list-mode.svc.clusterset.local.";
/// What the store's kube source lists.
const STORE: &[&str] = &["serviceimports", "endpointslices"];
/// What a centralized member's watches list.
const MEMBER: &[&str] = &["serviceexports", "services", "endpointslices"];
/// A headless service's endpoint, as centralized serve names it (member `member`).
const MEMBER_DB: &str = "db-0.member.hdb.list-mode.svc.clusterset.local.";

/// One cluster whose API server runs with `--feature-gates=WatchList=…`.
fn cluster(gate: bool) -> TestClusters {
    let args = format!("--feature-gates=WatchList={gate}");
    TestClusters::start_env(1, &[("CLUSTERS_APISERVER_ARGS", &args)])
}

/// Every namespace (the default), as the chart runs it, in `mode`.
fn serve(clusters: &TestClusters, mode: &str) -> Served {
    let kubeconfig = clusters.serve_kubeconfig(0);
    Served::start(&["--kubeconfig", kubeconfig.to_str().expect("path"), "--list-mode", mode])
}

/// `web` with a VIP and `db` headless with one endpoint, written from `rt`
/// (the client lives in it).
fn objects(clusters: &TestClusters, rt: &tokio::runtime::Runtime) -> Kube {
    rt.block_on(async {
        let k = Kube::new(clusters.client(0).await, NS).await;
        k.import("web", vip(&["10.77.0.1"])).await;
        k.import("db", headless()).await;
        k.slice("db-a", "db", "cluster-a", json!([{"addresses": ["10.78.0.1"]}]), None).await;
        k
    })
}

/// LIST requests for `resources` (e.g. `serviceimports`) the API server has
/// served (its `apiserver_request_total`): what says, independently of our
/// logs, whether a watch listed in pages or by streaming (a WATCH).
fn lists_served(clusters: &TestClusters, resources: &[&str]) -> f64 {
    let (metrics, _) = kubectl_ok(&clusters.kubeconfig(0), &["get", "--raw", "/metrics"], "");
    metrics
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{") && l.contains("verb=\"LIST\""))
        .filter(|l| resources.iter().any(|r| l.contains(&format!("resource=\"{r}\""))))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Headless `hdb` with endpoint `db-0` 10.79.0.1, exported, for centralized
/// serve.
fn exported(clusters: &TestClusters, rt: &tokio::runtime::Runtime) {
    rt.block_on(async {
        let user = User::new(clusters, 0, NS).await;
        user.service("hdb", json!({"clusterIP": "None"})).await;
        user.endpoints("hdb-x", "hdb", json!([{"addresses": ["10.79.0.1"], "hostname": "db-0"}])).await;
        user.export("hdb").await;
    });
}

/// Centralized serve with the cluster as member `member`, in `mode`.
fn centralized(clusters: &TestClusters, mode: &str) -> Served {
    let member = format!("member={}", clusters.role_kubeconfig(0, "centralized").display());
    Served::start(&["--cluster", &member, "--list-mode", mode])
}

/// Log lines containing `needle`.
fn lines(s: &Served, needle: &str) -> usize {
    s.log().lines().filter(|l| l.contains(needle)).count()
}

#[test]
fn streaming_lists_serve_objects_from_before_the_start_and_follow_changes_and_restarts() {
    let clusters = cluster(true);
    let rt = runtime();
    let k = objects(&clusters, &rt);
    let before = lists_served(&clusters, STORE);
    let s = serve(&clusters, "stream");
    s.wait_ready(Duration::from_secs(30));
    assert_eq!(lists_served(&clusters, STORE), before, "streaming lists are no LIST requests");
    // Both watches (imports, MCS slices) listed by streaming, at once.
    assert_eq!(lines(&s, "list=\"streamed\""), 2, "{}", s.log());
    assert_eq!(
        lines(&s, "list=\"paged\"") + lines(&s, "refuses") + lines(&s, "watch failing"),
        0,
        "{}",
        s.log()
    );
    assert_eq!(short(&s, WEB, "A"), ["10.77.0.1"]);
    assert_eq!(short(&s, DB, "A"), ["10.78.0.1"]);

    // Changes after the list arrive as watch events.
    rt.block_on(async {
        k.import("api", vip(&["10.77.0.2"])).await;
        k.slice("db-b", "db", "cluster-b", json!([{"addresses": ["10.78.0.2"]}]), None).await;
        k.delete_import("web").await;
    });
    eventually("the changes after the streaming list are served", || {
        short(&s, API, "A") == ["10.77.0.2"]
            && short(&s, DB, "A") == ["10.78.0.1", "10.78.0.2"]
            && status(&s, WEB) == "NXDOMAIN"
    });

    // An API server restart: the watches relist, by streaming again, and
    // what changed while it was down is served.
    clusters.stop(0, Component::ApiServer);
    clusters.start_component(0, Component::ApiServer);
    rt.block_on(async {
        k.delete_slice("db-a").await;
        k.import("web", vip(&["10.77.0.3"])).await;
    });
    eventually("the changes after the restart are served", || {
        short(&s, WEB, "A") == ["10.77.0.3"] && short(&s, DB, "A") == ["10.78.0.2"]
    });
    // The restarted API server counts from zero: no LIST since, either.
    assert_eq!(lists_served(&clusters, STORE), 0.0, "the relists stream too");
    assert!(lines(&s, "list=\"streamed\"") >= 3, "a streamed relist after the restart:\n{}", s.log());
    assert_eq!(lines(&s, "list=\"paged\"") + lines(&s, "refuses"), 0, "{}", s.log());

    // auto streams where the gate is on, without a word about it.
    let auto = serve(&clusters, "auto");
    auto.wait_ready(Duration::from_secs(30));
    assert_eq!(lists_served(&clusters, STORE), 0.0, "auto streams where the gate is on");
    assert_eq!(lines(&auto, "list=\"streamed\""), 2, "{}", auto.log());
    assert_eq!(lines(&auto, "refuses") + lines(&auto, "list=\"paged\""), 0, "{}", auto.log());
    assert_eq!(short(&auto, WEB, "A"), ["10.77.0.3"]);

    // Centralized serve's member watches stream too.
    exported(&clusters, &rt);
    let before = lists_served(&clusters, MEMBER);
    let c = centralized(&clusters, "stream");
    c.wait_ready(Duration::from_secs(30));
    eventually("the member's export is served", || short(&c, MEMBER_DB, "A") == ["10.79.0.1"]);
    assert_eq!(lists_served(&clusters, MEMBER), before, "the member watches stream");
    assert_eq!(lines(&c, "list=\"streamed\""), 3, "{}", c.log());
    assert_eq!(lines(&c, "refuses") + lines(&c, "list=\"paged\""), 0, "{}", c.log());
}

#[test]
fn without_the_watch_list_gate_auto_lists_in_pages_after_one_warning_and_stream_names_the_flag() {
    let clusters = cluster(false);
    let rt = runtime();
    objects(&clusters, &rt);
    let before = lists_served(&clusters, STORE);

    // auto (the default): refused once, one warning, then paged lists; no
    // watch reported failing, and the answers are right.
    let auto = serve(&clusters, "auto");
    auto.wait_ready(Duration::from_secs(30));
    assert_eq!(lists_served(&clusters, STORE), before + 2.0, "one LIST per watch");
    assert_eq!(lines(&auto, "refuses streaming lists"), 1, "{}", auto.log());
    assert_eq!(
        lines(&auto, "WatchList feature gate is enabled"),
        1,
        "the API server's reason:\n{}",
        auto.log()
    );
    assert_eq!(lines(&auto, "list=\"paged\""), 2, "{}", auto.log());
    assert_eq!(lines(&auto, "list=\"streamed\"") + lines(&auto, "watch failing"), 0, "{}", auto.log());
    assert_eq!(short(&auto, WEB, "A"), ["10.77.0.1"]);
    assert_eq!(short(&auto, DB, "A"), ["10.78.0.1"]);

    // stream insists: never ready, SERVFAIL, and the log says why and what to do.
    let stream = serve(&clusters, "stream");
    assert!(stream.wait_log("--list-mode auto or paged"), "{}", stream.log());
    // Not ready after the retries either: both watches (imports, slices)
    // refused again.
    let retried = || {
        let scrape = stream.get("/metrics").1;
        let errors: Vec<f64> = scrape
            .lines()
            .filter_map(|l| {
                l.strip_prefix("clusterset_dns_watch_errors_total{")?.rsplit(' ').next()?.parse().ok()
            })
            .collect();
        errors.iter().filter(|&&n| n >= 2.0).count() >= 2
    };
    assert!(within(Duration::from_secs(30), retried), "each watch refused twice:\n{}", stream.log());
    assert!(!stream.is_ready(), "{}", stream.log());
    assert_eq!(status(&stream, WEB), "SERVFAIL");
    let log = stream.log();
    assert!(log.contains("watch failing") && log.contains("enable its WatchList feature gate"), "{log}");
    assert_eq!(lines(&stream, "watch listed"), 0, "{log}");

    // paged never asks.
    let paged = serve(&clusters, "paged");
    paged.wait_ready(Duration::from_secs(30));
    assert_eq!(lines(&paged, "list=\"paged\""), 2, "{}", paged.log());
    assert_eq!(lines(&paged, "refuses") + lines(&paged, "watch failing"), 0, "{}", paged.log());

    // Centralized serve's member watches fall back the same way.
    exported(&clusters, &rt);
    let c = centralized(&clusters, "auto");
    c.wait_ready(Duration::from_secs(30));
    eventually("the member's export is served", || short(&c, MEMBER_DB, "A") == ["10.79.0.1"]);
    assert_eq!(lines(&c, "refuses streaming lists"), 1, "{}", c.log());
    assert_eq!(lines(&c, "list=\"paged\""), 3, "{}", c.log());
    assert_eq!(lines(&c, "list=\"streamed\"") + lines(&c, "watch failing"), 0, "{}", c.log());
}
