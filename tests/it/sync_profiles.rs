//! `sync --cluster-profiles`: members from the ClusterProfiles of a hub
//! (sigs.k8s.io/cluster-inventory-api, KEP-4322) on real clusters. Cluster
//! 0 is also the hub: the upstream CRD installed there, a namespace labelled
//! `multicluster.x-k8s.io/clusterset`, one profile per member whose access
//! provider points at that cluster's API server and CA. Credentials come
//! from a KEP-5339 exec plugin written here (a shell script printing an
//! ExecCredential with the token of the cluster's sync identity), chosen by
//! the provider file (`provideClusterInfo`) and told the cluster by the
//! profile's `client.authentication.k8s.io/exec` extension, handed to it in
//! `KUBERNETES_EXEC_INFO` as the exec protocol does. (Not KEP-5339's
//! `additional-args` extension: upstream writes it as a YAML list, which the
//! upstream CRD refuses, `extension` being `type: object`.) The shared
//! clusters do: nothing here stops a component, and everything is in this
//! test's own namespaces.

use std::path::Path;

use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams};
use serde_json::{Value, json};

use crate::deploy::kubectl_ok;
use crate::harness::clusters::{TestClusters, shared};
use crate::harness::eventually;
use crate::harness::syncing::Syncing;
use crate::sync::{readers, users};
use crate::watch::runtime;

const PROVIDER: &str = "test-token";
const EXEC_EXTENSION: &str = "client.authentication.k8s.io/exec";

fn profile_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("multicluster.x-k8s.io", "v1alpha1", "ClusterProfile"),
        "clusterprofiles",
    )
}

/// The upstream CRD, and the namespace of the profiles, labelled as a
/// fleet manager labels it; the sync identity may read the profiles there
/// (deploy/sync/rbac.yaml's ClusterRole, bound in that namespace).
fn hub(clusters: &TestClusters, profiles_ns: &str) {
    let admin = clusters.kubeconfig(0);
    let crd = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/cluster-inventory/multicluster.x-k8s.io_clusterprofiles.yaml");
    let crd = std::fs::read_to_string(crd).expect("CRD fixture");
    kubectl_ok(&admin, &["apply", "--server-side", "-f", "-"], &crd);
    kubectl_ok(
        &admin,
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/clusterprofiles.multicluster.x-k8s.io",
        ],
        "",
    );
    let objects = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": profiles_ns,
         "labels": {"multicluster.x-k8s.io/clusterset": "test-set"}}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "clusterset-dns-sync-cluster-profiles", "namespace": profiles_ns},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": "clusterset-dns-sync-cluster-profiles"},
         "subjects": [{"kind": "ServiceAccount", "name": "clusterset-dns-sync", "namespace": "clusterset-dns"}]},
    ]});
    kubectl_ok(&admin, &["apply", "--server-side", "-f", "-"], &objects.to_string());
}

/// The sync identity's kubeconfig of cluster `i`, as YAML.
fn sync_kubeconfig(clusters: &TestClusters, i: usize) -> Value {
    let text = std::fs::read_to_string(clusters.role_kubeconfig(i, "sync")).expect("sync kubeconfig");
    serde_yaml_ng::from_str(&text).expect("kubeconfig YAML")
}

/// The plugin, the credential of every cluster beside it, and the provider
/// file naming it; returns the provider file.
fn plugin(clusters: &TestClusters, dir: &Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let script = dir.join("token-plugin");
    // The plugin prints an ExecCredential; the profile's exec extension
    // arrives as spec.cluster.config of KUBERNETES_EXEC_INFO.
    let text = r#"#!/bin/sh
cluster=$(printf %s "$KUBERNETES_EXEC_INFO" | sed -n 's/.*"config":{"cluster":"\([a-z0-9-]*\)"}.*/\1/p')
[ -n "$cluster" ] || { echo "no cluster in KUBERNETES_EXEC_INFO: $KUBERNETES_EXEC_INFO" >&2; exit 1; }
exec cat "$(dirname "$0")/$cluster.credential"
"#;
    std::fs::write(&script, text).expect("plugin");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    for i in 0..clusters.len() {
        let token =
            sync_kubeconfig(clusters, i)["users"][0]["user"]["token"].as_str().expect("token").to_owned();
        let credential = json!({"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
                                "status": {"token": token}});
        std::fs::write(dir.join(format!("{}.credential", clusters.name(i))), credential.to_string())
            .expect("credential");
    }
    let providers = dir.join("providers.json");
    let file = json!({"providers": [{"name": PROVIDER, "execConfig": {
        "apiVersion": "client.authentication.k8s.io/v1", "command": script, "args": null, "env": null,
        "provideClusterInfo": true}}]});
    std::fs::write(&providers, file.to_string()).expect("providers file");
    providers
}

/// Cluster `i`'s profile as a fleet manager writes it: the object, then its
/// status (a subresource) with the access provider and `ControlPlaneHealthy`.
async fn profile(hub: &kube::Client, ns: &str, clusters: &TestClusters, i: usize, healthy: bool) {
    let api: Api<DynamicObject> = Api::namespaced_with(hub.clone(), ns, &profile_resource());
    let name = clusters.name(i);
    let object = json!({"apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ClusterProfile",
        "metadata": {"name": name, "labels": {"x-k8s.io/cluster-manager": "test-manager"}},
        "spec": {"displayName": name, "clusterManager": {"name": "test-manager"}}});
    let pp = PatchParams::apply("test-manager").force();
    api.patch(name, &pp, &Patch::Apply(&object)).await.expect("apply ClusterProfile");
    let cluster = &sync_kubeconfig(clusters, i)["clusters"][0]["cluster"];
    let status = json!({"apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ClusterProfile",
        "status": {
            "accessProviders": [{"name": PROVIDER, "cluster": {
                "server": clusters.server(i),
                "certificate-authority-data": cluster["certificate-authority-data"],
                "extensions": [{"name": EXEC_EXTENSION, "extension": {"cluster": name}}]}}],
            "conditions": [{"type": "ControlPlaneHealthy", "status": if healthy { "True" } else { "False" },
                "reason": if healthy { "Healthy" } else { "Unreachable" }, "message": "as the test says",
                "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
    api.patch_status(name, &pp, &Patch::Apply(&status)).await.expect("apply ClusterProfile status");
}

#[test]
fn members_join_leave_and_are_marked_by_their_cluster_profiles_without_a_restart() {
    let clusters = shared();
    let rt = runtime();
    let (ns, profiles_ns) = ("sync-profiles", "sync-profiles-fleet");
    let u = users(&rt, clusters, ns);
    let r = readers(&rt, clusters, ns);
    hub(clusters, profiles_ns);
    let dir = tempfile::tempdir().expect("tempdir");
    let providers = plugin(clusters, dir.path());
    let hub_client = rt.block_on(clusters.client(0));
    rt.block_on(async {
        for i in [0, 1] {
            profile(&hub_client, profiles_ns, clusters, i, true).await;
        }
        for (user, ip) in [(&u[0], "10.1.0.1"), (&u[1], "10.2.0.1")] {
            user.service("web", json!({"clusterIP": "None"})).await;
            user.endpoints("web-x", "web", json!([{"addresses": [ip]}])).await;
            user.export("web").await;
        }
    });
    let hub_kubeconfig = clusters.role_kubeconfig(0, "sync");
    let mut sync = Syncing::start_without_members(&[
        "--cluster-profiles",
        profiles_ns,
        "--cluster-profile-providers",
        providers.to_str().expect("path"),
        "--hub-kubeconfig",
        hub_kubeconfig.to_str().expect("path"),
        "--namespace",
        ns,
        "--no-leader-election",
    ]);
    // The two profiled members sync each other's exports; the third,
    // without a profile, is no member.
    for i in [0, 1] {
        eventually(&format!("both clusters' slices in {}", clusters.name(i)), || {
            rt.block_on(r[i].ours()) == (1, 0, 2)
        });
    }
    assert_eq!(rt.block_on(r[2].ours()), (0, 0, 0), "a cluster without a profile got an import");
    // A profile created: the member joins, in the same process.
    rt.block_on(profile(&hub_client, profiles_ns, clusters, 2, true));
    eventually("the new member gets the import", || rt.block_on(r[2].ours()) == (1, 0, 2));
    assert!(sync.try_wait().is_none(), "sync exited:\n{}", sync.log());
    // ControlPlaneHealthy False: the member is unreachable to the
    // controller, its endpoints kept everywhere and marked on the imports.
    let reachable = |i: usize| rt.block_on(r[i].condition("web", "clusterset-dns.io/SourcesReachable"));
    assert_eq!(reachable(0).as_deref(), Some("True"));
    rt.block_on(profile(&hub_client, profiles_ns, clusters, 1, false));
    eventually("marked unreachable by its profile", || reachable(0).as_deref() == Some("False"));
    assert_eq!(rt.block_on(r[0].ours()), (1, 0, 2), "the unhealthy member's endpoints were removed");
    let stale = format!("clusterset_dns_sync_member_stale_seconds{{member=\"{}\"}}", clusters.name(1));
    assert!(sync.metric(&stale).is_some_and(|s| s > 0.0), "{}", sync.get("/metrics"));
    rt.block_on(profile(&hub_client, profiles_ns, clusters, 1, true));
    eventually("reachable again", || reachable(0).as_deref() == Some("True"));
    // A profile deleted: the member leaves; its export leaves the others'
    // imports.
    rt.block_on(async {
        let api: Api<DynamicObject> =
            Api::namespaced_with(hub_client.clone(), profiles_ns, &profile_resource());
        api.delete(clusters.name(1), &DeleteParams::default()).await.expect("delete ClusterProfile");
    });
    for i in [0, 2] {
        eventually(&format!("only cluster 0's slice left in {}", clusters.name(i)), || {
            rt.block_on(r[i].ours()) == (1, 0, 1)
        });
        let o = rt.block_on(r[i].import("web")).expect("import");
        assert_eq!(o["status"]["clusters"], json!([{"cluster": clusters.name(0)}]), "{}", clusters.name(i));
    }
    assert!(sync.try_wait().is_none(), "sync exited:\n{}", sync.log());
}
