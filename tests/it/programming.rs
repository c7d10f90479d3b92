//! The DNS programming latency SLI end to end, on clusters that run pods
//! ([`TestClusters::start_with_nodes`]: the real kube-controller-manager
//! stamps `endpoints.kubernetes.io/last-change-trigger-time`): a Pod
//! turned ready in cluster-1 is observed by `serve` in cluster-2 in
//! `clusterset_dns_programming_duration_seconds`, within what the test
//! itself measured from outside; a slice that carries no trigger time is
//! counted as `missing`, not observed.

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

use crate::fleet::User;
use crate::harness::clusters::TestClusters;
use crate::harness::eventually;
use crate::harness::http::metric_value;
use crate::harness::served::Served;
use crate::harness::syncing::Syncing;
use crate::watch::runtime;
use crate::workload::deployment;

const MANAGER: &str = "clusterset-dns-tests";
const TRIGGER: &str = "endpoints.kubernetes.io/last-change-trigger-time";
/// Deployment, ReplicaSet, scheduler and KWOK in a row, on 2 busy cores.
const PODS_TIMEOUT: Duration = Duration::from_secs(120);
const COUNT: &str = "clusterset_dns_programming_duration_seconds_count{service_kind=\"headless\"}";
const SUM: &str = "clusterset_dns_programming_duration_seconds_sum{service_kind=\"headless\"}";

fn unmeasured(cause: &str) -> String {
    format!("clusterset_dns_programming_unmeasured_total{{cause=\"{cause}\"}}")
}

/// The addresses `serve` answers for `name`, sorted.
fn answered(serve: &Served, name: &str) -> BTreeSet<String> {
    serve.dig(&[name, "A", "+short"]).lines().map(str::to_owned).filter(|l| !l.is_empty()).collect()
}

/// Polls `dig` every 2 ms (bounded) until `serve` answers `want` many
/// addresses for `name`; the moment it did.
fn answered_at(serve: &Served, name: &str, want: usize) -> SystemTime {
    let deadline = std::time::Instant::now() + PODS_TIMEOUT;
    while std::time::Instant::now() < deadline {
        if answered(serve, name).len() == want {
            return SystemTime::now();
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    panic!("{name}: {want} addresses not answered within {PODS_TIMEOUT:?}: {:?}", answered(serve, name));
}

fn scrape(serve: &Served, line: &str) -> f64 {
    metric_value(&serve.get("/metrics").1, line).unwrap_or_else(|| panic!("/metrics has no {line}"))
}

fn secs(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH).expect("after 1970").as_secs_f64()
}

#[test]
fn a_pod_turned_ready_in_one_member_is_measured_in_another_and_a_slice_without_a_trigger_is_counted() {
    let clusters = TestClusters::start_with_nodes(2);
    let rt = runtime();
    let ns = "programming";
    let (a, b) = rt.block_on(async { (clusters.client(0).await, clusters.client(1).await) });
    let users = rt.block_on(async { [User::new(&clusters, 0, ns).await, User::new(&clusters, 1, ns).await] });
    let lease = format!("sync-{ns}");
    let sync = Syncing::start(&clusters, &["--namespace", ns, "--lease-name", &lease], &[]);
    let kubeconfig = clusters.kubeconfig(1);
    let serve = Served::start(&["--kubeconfig", kubeconfig.to_str().expect("path"), "--namespace", ns]);
    serve.wait_ready(Duration::from_secs(30));

    // 1. A user's headless Service with a slice of their own: no
    // EndpointSlice controller wrote it, so it carries no trigger time.
    let manual = format!("manual.{ns}.svc.clusterset.local");
    rt.block_on(async {
        users[0].service("manual", json!({"clusterIP": "None"})).await;
        users[0].endpoints("manual-a", "manual", json!([{"addresses": ["10.40.0.1"]}])).await;
        users[0].export("manual").await;
    });
    answered_at(&serve, &manual, 1);
    // The counts follow the publish that answers (settled well within this).
    std::thread::sleep(Duration::from_secs(1));
    let (missing, observed) = (scrape(&serve, &unmeasured("missing")), scrape(&serve, COUNT));
    rt.block_on(users[0].endpoints(
        "manual-a",
        "manual",
        json!([{"addresses": ["10.40.0.1"]}, {"addresses": ["10.40.0.2"]}]),
    ));
    answered_at(&serve, &manual, 2);
    eventually("the change without a trigger time is counted as missing", || {
        scrape(&serve, &unmeasured("missing")) > missing
    });
    assert_eq!(scrape(&serve, COUNT), observed, "a change without a trigger time was observed");

    // 2. A Deployment behind a headless Service: the real EndpointSlice
    // controller writes its slices with the trigger time.
    let web = format!("web.{ns}.svc.clusterset.local");
    let deployments: Api<Deployment> = Api::namespaced(a.clone(), ns);
    let apply = PatchParams::apply(MANAGER).force();
    rt.block_on(async {
        deployments.patch("web", &apply, &Patch::Apply(&deployment("web", ns, 1))).await.expect("Deployment");
        users[0]
            .service(
                "web",
                json!({"clusterIP": "None", "selector": {"app": "web"},
                       "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": "http"}]}),
            )
            .await;
        users[0].export("web").await;
    });
    answered_at(&serve, &web, 1);
    // Whatever the first pod's changes were, they are in by now.
    std::thread::sleep(Duration::from_secs(2));
    let (count, sum) = (scrape(&serve, COUNT), scrape(&serve, SUM));
    let missing = scrape(&serve, &unmeasured("missing"));

    // A second pod: it turns ready in cluster-1 after this moment (its
    // Ready condition's time, whole seconds, is no earlier than this
    // second), and is answered in cluster-2 at `answer`.
    let scaled = SystemTime::now();
    rt.block_on(deployments.patch("web", &apply, &Patch::Apply(&deployment("web", ns, 2)))).expect("scale");
    let answer = answered_at(&serve, &web, 2);
    // The trigger time sync carried onto cluster-2's slice (kube-controller-
    // manager's, for the pod that turned ready): the outside measure is
    // answer - trigger, on this machine's one clock.
    let mirrored = format!(
        "multicluster.kubernetes.io/service-name=web,multicluster.kubernetes.io/source-cluster={}",
        clusters.name(0)
    );
    let slices: Api<EndpointSlice> = Api::namespaced(b.clone(), ns);
    let trigger = rt
        .block_on(slices.list(&ListParams::default().labels(&mirrored)))
        .expect("list cluster-2's MCS slices")
        .items
        .iter()
        .filter_map(|s| s.metadata.annotations.as_ref()?.get(TRIGGER).cloned())
        .map(|t| t.parse::<Timestamp>().unwrap_or_else(|e| panic!("{TRIGGER}: {t}: {e}")))
        .max()
        .unwrap_or_else(|| panic!("cluster-2's slices of web carry no {TRIGGER}\n{}", sync.log()));
    let trigger = trigger.as_millisecond() as f64 / 1000.0;
    assert!(
        trigger >= secs(scaled).floor(),
        "the trigger time {trigger} is the new pod's, not older than the scale-up at {}",
        secs(scaled)
    );
    let outside = secs(answer) - trigger;

    let mut took = Vec::new();
    eventually("serve in cluster-2 observes the pod turned ready", || {
        let now = SystemTime::now();
        let (c, s) = (scrape(&serve, COUNT), scrape(&serve, SUM));
        took = vec![c - count, s - sum, secs(now)];
        c > count
    });
    let (n, total, scraped) = (took[0], took[1], took[2]);
    // Every change observed since began at or after the scale-up's second
    // and was published before the scrape that counts it: each lies in
    // [0, scraped - floor(scaled)]; the one answering the pod is at most
    // the outside measure (its publish came before dig saw the answer).
    let bound = scraped - secs(scaled).floor();
    assert!(total >= 0.0 && total <= n * bound, "{n} observations summing {total} s, each at most {bound} s");
    assert_eq!(scrape(&serve, &unmeasured("missing")), missing, "the pod's change was counted as missing");
    for cause in ["unparsable", "future", "stale"] {
        assert_eq!(scrape(&serve, &unmeasured(cause)), 0.0, "{cause}");
    }
    eprintln!(
        "programming latency, pod turned ready in {} → answered in {}: outside {:.1} ms; \
         histogram {n} observation(s), mean {:.1} ms (trigger time in whole seconds)",
        clusters.name(0),
        clusters.name(1),
        outside * 1000.0,
        total / n * 1000.0
    );
    if n == 1.0 {
        assert!(
            total <= outside + 0.001,
            "the histogram's {total} s is longer than the answer took ({outside} s from the trigger)"
        );
    }
    drop(serve);
    drop(sync);
}
