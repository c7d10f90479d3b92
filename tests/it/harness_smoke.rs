//! The real-cluster harness itself (`tests/harness/clusters.rs`, `scripts/clusters.sh`):
//! independent clusters, the serve identity's RBAC, components that stop and
//! come back with their data, and nothing left running afterwards.

use std::process::Command;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, PostParams};
use serde_json::json;

use crate::harness::clusters::{Component, TestClusters};

fn service_imports() -> ApiResource {
    crate::watch::import_resource("v1beta1")
}

fn service_import(name: &str) -> DynamicObject {
    DynamicObject::new(name, &service_imports()).within("default").data(json!({
        "spec": {"type": "ClusterSetIP", "ips": ["10.42.0.1"], "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}
    }))
}

async fn names(api: &Api<DynamicObject>) -> Vec<String> {
    let list = api.list(&ListParams::default()).await.expect("list serviceimports");
    list.items.into_iter().filter_map(|o| o.metadata.name).collect()
}

#[test]
fn clusters_are_independent_restartable_and_leave_nothing_behind() {
    let clusters = TestClusters::start(2);
    assert_eq!(clusters.len(), 2);
    assert_eq!((clusters.name(0), clusters.name(1)), ("cluster-1", "cluster-2"));
    let dir = clusters.dir().to_path_buf();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let ar = service_imports();
        let mut admin = Vec::new();
        for i in 0..clusters.len() {
            let client = clusters.client(i).await;
            let namespaces = Api::<Namespace>::all(client.clone()).list(&ListParams::default()).await;
            let namespaces: Vec<String> = namespaces
                .unwrap_or_else(|e| panic!("{}: list namespaces: {e}", clusters.name(i)))
                .items
                .into_iter()
                .filter_map(|n| n.metadata.name)
                .collect();
            assert!(namespaces.iter().any(|n| n == "clusterset-dns"), "{namespaces:?}");
            admin.push(Api::<DynamicObject>::namespaced_with(client, "default", &ar));
        }

        // Independent clusters: what is created in one is not in the other.
        admin[0]
            .create(&PostParams::default(), &service_import("smoke"))
            .await
            .expect("create ServiceImport");
        assert_eq!(names(&admin[0]).await, ["smoke"]);
        assert!(names(&admin[1]).await.is_empty(), "cluster-2 sees cluster-1's ServiceImport");

        // The serve identity reads ServiceImports in every namespace, and writes nothing.
        let serve = Api::<DynamicObject>::all_with(clusters.serve_client(0).await, &ar);
        assert_eq!(names(&serve).await, ["smoke"]);
        let serve_ns = Api::<DynamicObject>::namespaced_with(clusters.serve_client(0).await, "default", &ar);
        match serve_ns.create(&PostParams::default(), &service_import("denied")).await {
            Err(kube::Error::Api(status)) if status.code == 403 => {}
            other => panic!("serve identity created a ServiceImport: {other:?}"),
        }
        let forbidden =
            Api::<Namespace>::all(clusters.serve_client(0).await).list(&ListParams::default()).await;
        assert!(
            matches!(forbidden, Err(kube::Error::Api(s)) if s.code == 403),
            "serve identity lists namespaces"
        );

        // Stop cluster-1's control plane: its API fails, cluster-2 carries on.
        clusters.stop(0, Component::ApiServer);
        clusters.stop(0, Component::Etcd);
        assert!(admin[0].list(&ListParams::default()).await.is_err(), "cluster-1 answers with no API server");
        assert!(names(&admin[1]).await.is_empty());

        // Back with the same ports, certificate and data; the same clients work.
        clusters.start_component(0, Component::Etcd);
        clusters.start_component(0, Component::ApiServer);
        assert_eq!(names(&admin[0]).await, ["smoke"]);
        assert_eq!(names(&serve).await, ["smoke"]);
    });
    drop(rt);

    drop(clusters);
    let dir = dir.to_string_lossy().into_owned();
    let left = Command::new("pgrep").args(["-a", "-f", &dir]).output().expect("run pgrep");
    assert!(left.stdout.is_empty(), "processes left behind:\n{}", String::from_utf8_lossy(&left.stdout));
    assert!(!std::path::Path::new(&dir).exists(), "{dir} not removed");
}
