//! The sync controller against the faults real fleets have, on real
//! clusters: a member whose kube-apiserver is frozen (SIGSTOP: the kernel
//! still accepts its connections, nothing answers) delays no other member,
//! is marked unreachable as a stopped one is, and converges once it thaws;
//! objects of ours edited or deleted while no controller ran are repaired
//! when one starts, and an idle restart writes nothing.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::json;

use crate::deploy::kubectl_ok;
use crate::fleet::export_resource;
use crate::harness::clusters::{TestClusters, shared};
use crate::harness::eventually;
use crate::harness::process::Frozen;
use crate::harness::syncing::Syncing;
use crate::sync::users;
use crate::watch::{import_resource, runtime};

const OURS: &str = "app.kubernetes.io/managed-by=clusterset-dns-sync";

fn import(
    rt: &tokio::runtime::Runtime,
    clusters: &TestClusters,
    i: usize,
    ns: &str,
    name: &str,
) -> Option<serde_json::Value> {
    rt.block_on(async {
        let api: Api<DynamicObject> =
            Api::namespaced_with(clusters.client(i).await, ns, &import_resource("v1beta1"));
        api.get_opt(name).await.expect("get ServiceImport").map(|o| serde_json::to_value(o).expect("json"))
    })
}

fn conditions(
    rt: &tokio::runtime::Runtime,
    clusters: &TestClusters,
    i: usize,
    ns: &str,
    name: &str,
) -> String {
    rt.block_on(async {
        let api: Api<DynamicObject> = Api::namespaced_with(clusters.client(i).await, ns, &export_resource());
        let o = api.get_opt(name).await.expect("get ServiceExport");
        o.and_then(|o| o.data.pointer("/status/conditions").cloned())
            .map_or_else(String::new, |c| c.to_string())
    })
}

#[test]
fn a_frozen_member_delays_no_other_member_and_converges_once_it_thaws() {
    // Its own clusters: one of them is frozen.
    let clusters = TestClusters::start(3);
    let rt = runtime();
    let ns = "sync-frozen";
    let u = users(&rt, &clusters, ns);
    let export = |name: &str, ip: &str| {
        rt.block_on(async {
            u[0].service(name, json!({})).await;
            u[0].endpoints(&format!("{name}-a"), name, json!([{"addresses": [ip]}])).await;
            u[0].export(name).await;
        })
    };
    let sync = Syncing::start(&clusters, &["--namespace", ns, "--no-leader-election"], &[]);
    // Without a fault.
    let start = Instant::now();
    export("before", "10.1.0.1");
    eventually("the first export in cluster-3", || import(&rt, &clusters, 2, ns, "before").is_some());
    let healthy = start.elapsed();
    eventually("and in cluster-2", || import(&rt, &clusters, 1, ns, "before").is_some());
    // cluster-2's kube-apiserver frozen: connections accepted, nothing answered.
    let frozen = Frozen::new(clusters.pids(1).0);
    let start = Instant::now();
    export("during", "10.1.0.2");
    eventually("the export made while cluster-2 hangs, in cluster-3", || {
        import(&rt, &clusters, 2, ns, "during").is_some()
    });
    let with_fault = start.elapsed();
    eprintln!("export -> import in cluster-3: {healthy:?} healthy, {with_fault:?} with cluster-2 frozen");
    // Marked as a stopped member is: Ready on the export names it.
    let except = format!("except {}: unreachable", clusters.name(1));
    eventually("Ready names the frozen member", || {
        conditions(&rt, &clusters, 0, ns, "during").contains(&except)
    });
    let stale = format!("clusterset_dns_sync_member_stale_seconds{{member=\"{}\"}}", clusters.name(1));
    assert!(sync.metric(&stale).is_some_and(|s| s > 0.0), "{}", sync.get("/metrics"));
    // Changes keep flowing to the healthy members meanwhile.
    export("later", "10.1.0.3");
    eventually("a second export while frozen, in cluster-3", || {
        import(&rt, &clusters, 2, ns, "later").is_some()
    });
    drop(frozen);
    eventually("both exports reach cluster-2 once it thaws", || {
        import(&rt, &clusters, 1, ns, "during").is_some() && import(&rt, &clusters, 1, ns, "later").is_some()
    });
    eventually("Ready says every member again", || {
        let c = conditions(&rt, &clusters, 0, ns, "during");
        c.contains("\"Ready\"") && !c.contains("unreachable")
    });
    assert!(sync.log().contains("member unreachable"), "{}", sync.log());
}

#[test]
fn drift_made_while_no_controller_ran_is_repaired_and_an_idle_restart_writes_nothing() {
    let clusters = shared();
    let rt = runtime();
    let ns = "sync-drift";
    let u = users(&rt, clusters, ns);
    rt.block_on(async {
        u[0].service("web", json!({})).await;
        u[0].endpoints("web-a", "web", json!([{"addresses": ["10.1.0.7"]}])).await;
        u[0].export("web").await;
    });
    let args = ["--namespace", ns, "--no-leader-election"];
    let ours = |i: usize| {
        rt.block_on(async {
            let c = clusters.client(i).await;
            let s: Api<EndpointSlice> = Api::namespaced(c.clone(), ns);
            let v: Api<Service> = Api::namespaced(c, ns);
            let lp = ListParams::default().labels(OURS);
            (s.list(&lp).await.expect("slices").items, v.list(&lp).await.expect("services").items)
        })
    };
    let address = |i: usize| {
        ours(i)
            .0
            .first()
            .and_then(|s| s.endpoints.first().map(|e| e.addresses[0].clone()))
            .unwrap_or_default()
    };
    let mut sync = Syncing::start(clusters, &args, &[]);
    eventually("the import, VIP and slice in cluster-2", || {
        let (slices, vips) = ours(1);
        slices.len() == 1 && vips.len() == 1 && import(&rt, clusters, 1, ns, "web").is_some()
    });
    eventually("Ready on the export", || conditions(&rt, clusters, 0, ns, "web").contains("\"Exported\""));
    sync.stop();
    // While no controller runs: a slice's address edited and the VIP
    // deleted in cluster-2, the import's ports changed in cluster-3, the
    // export's conditions removed in cluster-1.
    let (s, vips) = ours(1);
    rt.block_on(async {
        let c = clusters.client(1).await;
        let slices: Api<EndpointSlice> = Api::namespaced(c.clone(), ns);
        let name = s[0].metadata.name.clone().expect("slice name");
        let patch = json!({"endpoints": [{"addresses": ["10.66.6.6"]}]});
        slices.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("edit slice");
        let services: Api<Service> = Api::namespaced(c, ns);
        let vip = vips[0].metadata.name.clone().expect("VIP name");
        services.delete(&vip, &Default::default()).await.expect("delete VIP");
        // In cluster-3, whose VIP stays: nothing else changes its import.
        let imports: Api<DynamicObject> =
            Api::namespaced_with(clusters.client(2).await, ns, &import_resource("v1beta1"));
        let patch = json!({"spec": {"ports": [{"port": 9999, "protocol": "TCP"}]}});
        imports.patch("web", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("edit import");
        let exports: Api<DynamicObject> =
            Api::namespaced_with(clusters.client(0).await, ns, &export_resource());
        let patch = json!({"status": {"conditions": null}});
        exports
            .patch_status("web", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("clear conditions");
    });
    assert_eq!(address(1), "10.66.6.6");
    let restarted = Instant::now();
    let mut sync = Syncing::start(clusters, &args, &[]);
    eventually("the slice's address repaired", || address(1) == "10.1.0.7");
    eventually("the VIP re-created", || ours(1).1.len() == 1);
    eventually("the import's ports repaired", || {
        import(&rt, clusters, 2, ns, "web").is_some_and(|o| o["spec"]["ports"][0]["port"] == 80)
    });
    eventually("the export's conditions back", || {
        conditions(&rt, clusters, 0, ns, "web").contains("\"Exported\"")
    });
    let took = restarted.elapsed();
    assert!(took < Duration::from_secs(30), "repaired {took:?} after the start, not within 30 s");
    let drift =
        |kind: &str| sync.metric(&format!("clusterset_dns_sync_drift_repaired_total{{kind=\"{kind}\"}}"));
    assert_eq!(drift("EndpointSlice"), Some(1.0), "{}", sync.get("/metrics"));
    assert_eq!(drift("ServiceImport"), Some(1.0), "{}", sync.get("/metrics"));
    // An idle restart: everything is as wanted, nothing is written.
    sync.stop();
    let sync = Syncing::start(clusters, &args, &[]);
    // Every reconcile it started has ended, nothing queued, twice in a row:
    // whatever it was to write is written (and counted).
    sync.settle(0.0, 1.0, "the restarted controller reconciled the service");
    assert_eq!(sync.metric("clusterset_dns_sync_writes_total"), Some(0.0), "{}", sync.log());
    assert!(sync.metric("clusterset_dns_sync_unchanged_total").is_some_and(|n| n > 0.0));
}

/// ServiceExport events the API server of cluster `i` has sent to its
/// watchers (its `apiserver_watch_events_total`, read as admin).
fn export_events_sent(clusters: &TestClusters, i: usize) -> f64 {
    let (scrape, _) = kubectl_ok(&clusters.kubeconfig(i), &["get", "--raw", "/metrics"], "");
    scrape
        .lines()
        .filter(|l| l.starts_with("apiserver_watch_events_total{"))
        .filter(|l| l.contains("kind=\"ServiceExport\"") || l.contains("resource=\"serviceexports\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
fn a_leader_cut_off_from_its_lease_leads_nothing_once_the_lease_runs_out() {
    // Its own clusters: the Lease's cluster is frozen.
    let clusters = TestClusters::start(2);
    let rt = runtime();
    let ns = "sync-fenced";
    let u = users(&rt, &clusters, ns);
    let export = |name: &str| {
        rt.block_on(async {
            u[0].service(name, json!({})).await;
            u[0].endpoints(&format!("{name}-a"), name, json!([{"addresses": ["10.1.0.9"]}])).await;
            u[0].export(name).await;
        })
    };
    // The Lease lives in cluster-2; the service is exported from cluster-1
    // and imported there too.
    let lease = clusters.role_kubeconfig(1, "sync");
    let lease = lease.to_string_lossy();
    let sync = Syncing::start(
        &clusters,
        &[
            "--namespace",
            ns,
            "--lease-name",
            "sync-fenced",
            "--lease-kubeconfig",
            &lease,
            "--lease-duration",
            "5",
        ],
        &[],
    );
    eventually("leading", || sync.leading());
    export("before");
    eventually("written while the Lease is held", || import(&rt, &clusters, 0, ns, "before").is_some());
    let frozen = Frozen::new(clusters.pids(1).0);
    let cut = Instant::now();
    // The renewal is not answered: the shard's fence runs out with the
    // Lease (another replica that reaches cluster-2 could lead by now), the
    // replica leads nothing and says so.
    eventually("leading nothing once the Lease ran out unrenewed", || {
        sync.metric("clusterset_dns_sync_leader") == Some(0.0)
    });
    let lost = cut.elapsed();
    assert!(lost >= Duration::from_secs(3), "gave up a Lease still valid after {lost:?}");
    let (code, body) = crate::harness::http::http_get(sync.http(), "/ready");
    assert!(code == 503 && body.contains("cannot read the Leases"), "/ready: {code} {body}");
    let sent = export_events_sent(&clusters, 0);
    export("after");
    // Sent to the controller's export watch (the only one in cluster-1),
    // and the controller idle since (a reconcile it started would have
    // ended, its writes made).
    eventually("the new export sent to the controller's watch", || export_events_sent(&clusters, 0) > sent);
    sync.settle(0.0, 0.0, "after the new export");
    assert!(
        import(&rt, &clusters, 0, ns, "after").is_none(),
        "written {:?} after the Lease's cluster stopped answering:\n{}",
        cut.elapsed(),
        sync.log()
    );
    drop(frozen);
    let back =
        crate::harness::within(Duration::from_secs(60), || import(&rt, &clusters, 0, ns, "after").is_some());
    assert!(back, "not written once the Lease was renewed:\n{}", sync.log());
}
