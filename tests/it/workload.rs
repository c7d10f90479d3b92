//! The sync controller on clusters that run pods
//! ([`TestClusters::start_with_nodes`]: kube-scheduler,
//! kube-controller-manager and a KWOK node per cluster): a real Deployment
//! behind a real Service, its EndpointSlices written by the real
//! EndpointSlice controller, exported as a user would, seen in the other
//! cluster as a ServiceImport and MCS EndpointSlices holding the pods' IPs,
//! following a scale-up.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

use crate::fleet::User;
use crate::harness::clusters::TestClusters;
use crate::harness::syncing::Syncing;
use crate::harness::{eventually, within};
use crate::watch::{import_resource, runtime};

const MANAGER: &str = "clusterset-dns-tests";
/// Deployment, ReplicaSet, scheduler and KWOK in a row, on 2 busy cores: more
/// than `eventually`'s 20 s at times.
const PODS_TIMEOUT: Duration = Duration::from_secs(120);

/// A Deployment of `replicas` pods labelled `app=NAME`. The image is never
/// pulled: KWOK runs no containers, it only reports the pods Running.
pub(crate) fn deployment(name: &str, ns: &str, replicas: u32) -> serde_json::Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                    "ports": [{"name": "http", "containerPort": 8080}]}]}}}})
}

/// The IPs of the Running, Ready pods labelled `app=NAME`.
async fn ready_pod_ips(client: &kube::Client, ns: &str, name: &str) -> BTreeSet<String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let list = pods.list(&ListParams::default().labels(&format!("app={name}"))).await.expect("list pods");
    list.items
        .iter()
        .filter_map(|p| {
            let status = p.status.as_ref()?;
            let ready = status.conditions.iter().flatten().any(|c| c.type_ == "Ready" && c.status == "True");
            (status.phase.as_deref() == Some("Running") && ready).then(|| status.pod_ip.clone())?
        })
        .collect()
}

/// The ready addresses of the slices matching `selector`.
async fn slice_ips(client: &kube::Client, ns: &str, selector: &str) -> BTreeSet<String> {
    let api: Api<EndpointSlice> = Api::namespaced(client.clone(), ns);
    let list = api.list(&ListParams::default().labels(selector)).await.expect("list EndpointSlices");
    list.items
        .iter()
        .flat_map(|s| s.endpoints.iter())
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
        .flat_map(|e| e.addresses.iter().cloned())
        .collect()
}

#[test]
fn a_deployments_service_exported_from_pods_reaches_the_other_cluster() {
    let clusters = TestClusters::start_with_nodes(2);
    let rt = runtime();
    let ns = "workload";
    let (a, b) = rt.block_on(async { (clusters.client(0).await, clusters.client(1).await) });
    let users = rt.block_on(async { [User::new(&clusters, 0, ns).await, User::new(&clusters, 1, ns).await] });

    // A user's Deployment and Service in cluster-1; nothing but the real
    // controllers writes pods or slices.
    let deployments: Api<Deployment> = Api::namespaced(a.clone(), ns);
    let apply = PatchParams::apply(MANAGER).force();
    rt.block_on(async {
        deployments
            .patch("web", &apply, &Patch::Apply(&deployment("web", ns, 2)))
            .await
            .expect("apply Deployment");
        users[0]
            .service(
                "web",
                json!({"selector": {"app": "web"},
                       "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": "http"}]}),
            )
            .await;
    });
    let mut pods = BTreeSet::new();
    let two = within(PODS_TIMEOUT, || {
        pods = rt.block_on(ready_pod_ips(&a, ns, "web"));
        pods.len() == 2
    });
    assert!(two, "two Running, Ready pods with IPs in cluster-1, got {pods:?}");
    assert!(
        pods.iter().all(|ip| ip.starts_with("10.201.")),
        "pod IPs from KWOK's CIDR of cluster-1: {pods:?}"
    );
    let local = "kubernetes.io/service-name=web,endpointslice.kubernetes.io/managed-by=endpointslice-controller.k8s.io";
    eventually("the EndpointSlice controller's slice holds the pods", || {
        rt.block_on(slice_ips(&a, ns, local)) == pods
    });

    rt.block_on(users[0].export("web"));
    let lease = format!("sync-{ns}");
    let sync = Syncing::start(&clusters, &["--namespace", ns, "--lease-name", &lease], &[]);

    // In cluster-2: the ServiceImport, and MCS slices with the pods' addresses.
    let imports: Api<kube::api::DynamicObject> =
        Api::namespaced_with(b.clone(), ns, &import_resource("v1beta1"));
    eventually("the ServiceImport in cluster-2", || {
        rt.block_on(imports.get_opt("web")).expect("get ServiceImport").is_some()
    });
    let import = serde_json::to_value(rt.block_on(imports.get("web")).expect("ServiceImport")).expect("json");
    assert_eq!(import["spec"]["type"], "ClusterSetIP", "{import}");
    assert_eq!(import["spec"]["ports"], json!([{"name": "http", "protocol": "TCP", "port": 80}]), "{import}");
    let mirrored = format!(
        "multicluster.kubernetes.io/service-name=web,multicluster.kubernetes.io/source-cluster={}",
        clusters.name(0)
    );
    eventually("cluster-2's MCS slices hold cluster-1's pod IPs", || {
        rt.block_on(slice_ips(&b, ns, &mirrored)) == pods
    });
    let slices: Api<EndpointSlice> = Api::namespaced(b.clone(), ns);
    for s in rt.block_on(slices.list(&ListParams::default().labels(&mirrored))).expect("list").items {
        let ports: Vec<_> = s.ports.iter().flatten().map(|p| (p.name.clone(), p.port)).collect();
        assert_eq!(ports, [(Some("http".to_owned()), Some(8080))], "the pods' port, by name: {s:?}");
    }

    // Scaled up: the new pod reaches cluster-2 through the same chain.
    rt.block_on(deployments.patch("web", &apply, &Patch::Apply(&deployment("web", ns, 3))))
        .expect("scale Deployment");
    let three = within(PODS_TIMEOUT, || {
        pods = rt.block_on(ready_pod_ips(&a, ns, "web"));
        pods.len() == 3
    });
    assert!(three, "three Running, Ready pods in cluster-1, got {pods:?}");
    eventually("cluster-2 follows the scale-up", || rt.block_on(slice_ips(&b, ns, &mirrored)) == pods);
    drop(sync);
}
