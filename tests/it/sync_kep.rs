//! The sync controller against the parts of KEP-1645 and the mcs-api
//! conformance suite that reach past the basics, and regressions of bugs a
//! review found, each on real clusters: our own VIP Services are never
//! auto-exported; unnamed ports that differ across clusters give a working
//! import; a re-created export gets fresh conditions; exported labels,
//! annotations and `internalTrafficPolicy` reach the import (with their
//! conflicts); mirrored slices keep what kube-proxy needs.

use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DynamicObject, ListParams};
use serde_json::{Value, json};

use crate::fleet::{User, export_resource};
use crate::harness::clusters::{TestClusters, shared};
use crate::harness::syncing::Syncing;
use crate::harness::{eventually, past_second_of, within};
use crate::sync::users;
use crate::watch::{import_resource, runtime};

const OURS: &str = "app.kubernetes.io/managed-by=clusterset-dns-sync";

fn syncing(clusters: &TestClusters, namespaces: &[&str], extra: &[&str]) -> Syncing {
    let lease = format!("sync-{}", namespaces[0]);
    let mut args = vec!["--no-leader-election", "--lease-name", &lease];
    for ns in namespaces {
        args.extend(["--namespace", ns]);
    }
    args.extend_from_slice(extra);
    Syncing::start(clusters, &args, &[])
}

/// Polls `f` for up to `secs` seconds; panics naming `what` otherwise.
fn until(secs: u64, what: &str, f: impl FnMut() -> bool) {
    assert!(within(Duration::from_secs(secs), f), "{what}: not within {secs} s");
}

async fn client(clusters: &TestClusters, i: usize) -> kube::Client {
    clusters.client(i).await
}

async fn get(c: &kube::Client, ns: &str, ar: &kube::api::ApiResource, name: &str) -> Option<Value> {
    let api: Api<DynamicObject> = Api::namespaced_with(c.clone(), ns, ar);
    api.get_opt(name).await.expect("get").map(|o| serde_json::to_value(o).expect("json"))
}

/// The `creationTimestamp` of the export `name` in member `i`.
fn created(rt: &tokio::runtime::Runtime, clusters: &TestClusters, i: usize, ns: &str, name: &str) -> String {
    rt.block_on(async {
        let o = get(&client(clusters, i).await, ns, &export_resource(), name).await.expect("export");
        o["metadata"]["creationTimestamp"].as_str().expect("creationTimestamp").to_owned()
    })
}

async fn import(c: &kube::Client, ns: &str, name: &str) -> Option<Value> {
    get(c, ns, &import_resource("v1beta1"), name).await
}

/// The export's conditions as `type=status reason: message`.
async fn conditions(c: &kube::Client, ns: &str, name: &str) -> Vec<String> {
    let Some(o) = get(c, ns, &export_resource(), name).await else { return vec![] };
    o.pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|c| {
            let f = |k: &str| c[k].as_str().unwrap_or("").to_owned();
            format!("{}={} {}: {}", f("type"), f("status"), f("reason"), f("message"))
        })
        .collect()
}

async fn count<K>(api: Api<K>, labels: &str) -> usize
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.list_metadata(&ListParams::default().labels(labels)).await.expect("list").items.len()
}

#[test]
fn auto_export_of_a_namespace_exports_its_services_and_never_our_own() {
    let clusters = shared();
    let rt = runtime();
    let ns = "autoexp-hundred";
    let n = 100;
    let u = rt.block_on(User::new(clusters, 0, ns));
    for i in 1..clusters.len() {
        rt.block_on(User::new(clusters, i, ns));
    }
    let sync = syncing(clusters, &[ns], &["--auto-export-namespace-prefix", "autoexp-"]);
    rt.block_on(async {
        for i in 0..n {
            u.service(&format!("svc-{i:03}"), json!({})).await;
        }
    });
    let c: Vec<kube::Client> = rt.block_on(async {
        let mut v = Vec::new();
        for i in 0..clusters.len() {
            v.push(client(clusters, i).await);
        }
        v
    });
    let exports = |i: usize| {
        rt.block_on(async {
            let api: Api<DynamicObject> = Api::namespaced_with(c[i].clone(), ns, &export_resource());
            api.list_metadata(&ListParams::default()).await.expect("list exports").items.len()
        })
    };
    let vips = |i: usize| rt.block_on(count(Api::<Service>::namespaced(c[i].clone(), ns), OURS));
    let imports = |i: usize| {
        rt.block_on(count(
            Api::<DynamicObject>::namespaced_with(c[i].clone(), ns, &import_resource("v1beta1")),
            OURS,
        ))
    };
    // Every member imports every service, each with its one VIP Service.
    until(120, "100 imports and VIPs in every member", || {
        (0..clusters.len()).all(|i| imports(i) == n && vips(i) == n)
    });
    // Before the fix, each VIP Service was exported in turn, which made a
    // VIP Service of its own, and so on. One more Service, made after every
    // VIP Service of the exporting member: once it is imported everywhere,
    // the controller has received the events of those VIP Services (one
    // watch, in order), and once it is idle it has reconciled them (and
    // would have exported them, its write made before the reconcile ends).
    let since = sync.reconciles();
    rt.block_on(u.service("sentinel", json!({})));
    let n = n + 1;
    until(60, "the sentinel imported in every member", || {
        (0..clusters.len()).all(|i| imports(i) == n && vips(i) == n)
    });
    sync.settle(since, 1.0, "the VIP Services' events reconciled");
    assert_eq!(exports(0), n, "exports in the exporting member");
    for i in 0..clusters.len() {
        assert_eq!((imports(i), vips(i)), (n, n), "imports and VIP Services in {}", clusters.name(i));
    }
    for i in 1..clusters.len() {
        assert_eq!(exports(i), 0, "exports in {}, which has no Services", clusters.name(i));
    }
}

#[test]
fn unnamed_ports_that_differ_across_clusters_give_a_working_import() {
    let clusters = shared();
    let rt = runtime();
    let ns = "sync-unnamed";
    let u = users(&rt, clusters, ns);
    let c0 = rt.block_on(client(clusters, 2));
    let _sync = syncing(clusters, &[ns], &[]);
    // Each cluster's Service has one unnamed port, as most single-port
    // Services are written; the numbers differ.
    rt.block_on(async {
        for (i, port, target, ip) in [(0, 80, 8080, "10.1.0.1"), (1, 8080, 9090, "10.2.0.1")] {
            u[i].service("web", json!({"ports": [{"protocol": "TCP", "port": port}]})).await;
            u[i].endpoints_on(
                "web-x",
                "web",
                json!([{"protocol": "TCP", "port": target}]),
                json!([{"addresses": [ip], "conditions": {"ready": true}}]),
            )
            .await;
            u[i].export("web").await;
        }
    });
    // The import offers both, unnamed as exported.
    let want = json!([{"protocol": "TCP", "port": 80}, {"protocol": "TCP", "port": 8080}]);
    until(30, "the union of unnamed ports imported", || {
        rt.block_on(import(&c0, ns, "web")).is_some_and(|o| o["spec"]["ports"] == want)
    });
    // The VIP Service the API server accepted names them, and each cluster's
    // mirrored slice carries the name of its own port, so kube-proxy pairs
    // them.
    let vip: Vec<Service> = rt.block_on(async {
        Api::<Service>::namespaced(c0.clone(), ns)
            .list(&ListParams::default().labels(OURS))
            .await
            .expect("list VIP Services")
            .items
    });
    assert_eq!(vip.len(), 1, "{vip:?}");
    let ports: Vec<(Option<String>, i32)> = vip[0]
        .spec
        .as_ref()
        .and_then(|s| s.ports.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|p| (p.name, p.port))
        .collect();
    assert_eq!(ports, [(Some("tcp-80".into()), 80), (Some("tcp-8080".into()), 8080)]);
    let mut slices: Vec<(String, Option<String>, Option<i32>)> = rt.block_on(async {
        Api::<EndpointSlice>::namespaced(c0.clone(), ns)
            .list(&ListParams::default().labels(OURS))
            .await
            .expect("list slices")
            .items
            .into_iter()
            .map(|s| {
                let cluster =
                    s.metadata.labels.unwrap_or_default()["multicluster.kubernetes.io/source-cluster"]
                        .clone();
                let p = s.ports.unwrap_or_default().remove(0);
                (cluster, p.name, p.port)
            })
            .collect()
    });
    slices.sort();
    assert_eq!(
        slices,
        [
            (clusters.name(0).to_owned(), Some("tcp-80".into()), Some(8080)),
            (clusters.name(1).to_owned(), Some("tcp-8080".into()), Some(9090)),
        ]
    );
    // The ports differ: the KEP's conflict, on both exports.
    for i in [0, 1] {
        let c = rt.block_on(client(clusters, i));
        until(20, "PortConflict on both exports", || {
            rt.block_on(conditions(&c, ns, "web"))
                .iter()
                .any(|c| c.starts_with("Conflict=True PortConflict: Exported ports differ"))
        });
    }
}

#[test]
fn a_re_created_export_gets_fresh_conditions() {
    let clusters = shared();
    let rt = runtime();
    let ns = "sync-recreate";
    let u = rt.block_on(User::new(clusters, 0, ns));
    for i in 1..clusters.len() {
        rt.block_on(User::new(clusters, i, ns));
    }
    let c = rt.block_on(client(clusters, 0));
    let _sync = syncing(clusters, &[ns], &[]);
    rt.block_on(async {
        u.service("web", json!({})).await;
        u.export("web").await;
    });
    until(30, "conditions on the export", || {
        rt.block_on(conditions(&c, ns, "web")).iter().any(|c| c.starts_with("Ready=True"))
    });
    // The first export's last transition (its times, as creation
    // timestamps, in whole seconds): the new export must come a second
    // later, so that its transitions, were they carried over, are older.
    let old = rt.block_on(get(&c, ns, &export_resource(), "web")).expect("export");
    let last = old["status"]["conditions"]
        .as_array()
        .expect("conditions")
        .iter()
        .filter_map(|c| c["lastTransitionTime"].as_str())
        .max()
        .expect("a transition")
        .to_owned();
    rt.block_on(u.unexport("web"));
    until(30, "import gone", || rt.block_on(import(&c, ns, "web")).is_none());
    past_second_of(&last);
    rt.block_on(u.export("web"));
    until(30, "conditions on the re-created export", || {
        rt.block_on(conditions(&c, ns, "web")).iter().any(|c| c.starts_with("Ready=True"))
    });
    let o = rt.block_on(get(&c, ns, &export_resource(), "web")).expect("export");
    let created = o["metadata"]["creationTimestamp"].as_str().expect("created").to_owned();
    for cond in o["status"]["conditions"].as_array().expect("conditions") {
        let t = cond["lastTransitionTime"].as_str().expect("time");
        assert!(t >= created.as_str(), "{cond} is older than the export ({created})");
    }
}

#[test]
fn exported_labels_annotations_and_internal_traffic_policy_reach_the_import() {
    let clusters = shared();
    let rt = runtime();
    let ns = "sync-labels";
    let u = users(&rt, clusters, ns);
    let c2 = rt.block_on(client(clusters, 2));
    let _sync = syncing(clusters, &[ns], &[]);
    rt.block_on(async {
        u[0].annotated_service("web", json!({"internalTrafficPolicy": "Cluster"}), json!({"svc-note": "no"}))
            .await;
        u[0].export_with(
            "web",
            json!({"exportedLabels": {"dummy-label": "true"}, "exportedAnnotations": {"dummy-annotation": "true"}}),
        )
        .await;
    });
    until(30, "labels, annotations and policy on the import", || {
        rt.block_on(import(&c2, ns, "web")).is_some_and(|o| {
            o["metadata"]["labels"]["dummy-label"] == "true"
                && o["metadata"]["annotations"]["dummy-annotation"] == "true"
                && o["spec"]["internalTrafficPolicy"] == "Cluster"
        })
    });
    let o = rt.block_on(import(&c2, ns, "web")).expect("import");
    assert!(o["metadata"]["annotations"].get("svc-note").is_none(), "the Service's own annotation: {o}");
    assert_eq!(o["metadata"]["labels"]["app.kubernetes.io/managed-by"], "clusterset-dns-sync");

    // A second, newer export with other labels and another policy: the
    // oldest wins, and both exports say so. Newer by its creationTimestamp
    // (whole seconds): made in a later second than the first.
    past_second_of(&created(&rt, clusters, 0, ns, "web"));
    rt.block_on(async {
        u[1].service("web", json!({"internalTrafficPolicy": "Local"})).await;
        u[1].export_with(
            "web",
            json!({"exportedLabels": {"dummy-label2": "true"}, "exportedAnnotations": {"dummy-annotation2": "true"}}),
        )
        .await;
    });
    for i in [0, 1] {
        let c = rt.block_on(client(clusters, i));
        until(30, "the conflicts on both exports", || {
            rt.block_on(conditions(&c, ns, "web")).iter().any(|c| {
                c.starts_with(
                    "Conflict=True InternalTrafficPolicyConflict,LabelsConflict,AnnotationsConflict:",
                )
            })
        });
    }
    let o = rt.block_on(import(&c2, ns, "web")).expect("import");
    assert_eq!(o["metadata"]["labels"]["dummy-label"], "true");
    assert!(o["metadata"]["labels"].get("dummy-label2").is_none(), "{o}");
    assert!(o["metadata"]["annotations"].get("dummy-annotation2").is_none(), "{o}");
    assert_eq!(o["spec"]["internalTrafficPolicy"], "Cluster");
    // The VIP Service routes to every cluster whatever the policy says.
    let vip = rt.block_on(async {
        Api::<Service>::namespaced(c2.clone(), ns)
            .list(&ListParams::default().labels(OURS))
            .await
            .expect("list")
    });
    let policy = vip.items[0].spec.as_ref().and_then(|s| s.internal_traffic_policy.clone());
    assert_eq!(policy.as_deref(), Some("Cluster"));
}

#[test]
fn mirrored_slices_keep_what_kube_proxy_needs() {
    let clusters = shared();
    let rt = runtime();
    let ns = "sync-mirror";
    let u = rt.block_on(User::new(clusters, 0, ns));
    for i in 1..clusters.len() {
        rt.block_on(User::new(clusters, i, ns));
    }
    let c1 = rt.block_on(client(clusters, 1));
    let _sync = syncing(clusters, &[ns], &[]);
    let endpoint = json!({
        "addresses": ["10.1.0.7"],
        "conditions": {"ready": false, "serving": true, "terminating": true},
        "nodeName": "node-7",
        "zone": "zone-a",
        "hints": {"forZones": [{"name": "zone-a"}]},
        "targetRef": {"kind": "Pod", "namespace": ns, "name": "web-7"},
    });
    rt.block_on(async {
        u.service("web", json!({})).await;
        u.endpoints("web-x", "web", json!([endpoint.clone()])).await;
        u.export("web").await;
    });
    let mirrored = || {
        rt.block_on(async {
            Api::<EndpointSlice>::namespaced(c1.clone(), ns)
                .list(&ListParams::default().labels(OURS))
                .await
                .expect("list")
                .items
        })
    };
    until(30, "the mirrored slice", || !mirrored().is_empty());
    let slice = serde_json::to_value(&mirrored()[0]).expect("json");
    let e = &slice["endpoints"][0];
    for field in ["conditions", "nodeName", "zone", "hints"] {
        assert_eq!(e[field], endpoint[field], "{field} in {slice}");
    }
    eventually("still one slice", || mirrored().len() == 1);
}

#[test]
fn objects_of_ours_deleted_or_edited_by_hand_are_written_again() {
    let clusters = shared();
    let rt = runtime();
    let ns = "sync-repair";
    let u = rt.block_on(User::new(clusters, 0, ns));
    for i in 1..clusters.len() {
        rt.block_on(User::new(clusters, i, ns));
    }
    let c = rt.block_on(client(clusters, 1));
    let _sync = syncing(clusters, &[ns], &[]);
    rt.block_on(async {
        u.service("web", json!({})).await;
        u.endpoints("web-x", "web", json!([{"addresses": ["10.1.0.9"], "conditions": {"ready": true}}]))
            .await;
        u.export("web").await;
    });
    let imports: Api<DynamicObject> = Api::namespaced_with(c.clone(), ns, &import_resource("v1beta1"));
    let services: Api<Service> = Api::namespaced(c.clone(), ns);
    let slices: Api<EndpointSlice> = Api::namespaced(c.clone(), ns);
    let ours = ListParams::default().labels(OURS);
    let vip = || {
        rt.block_on(services.list(&ours))
            .expect("list")
            .items
            .first()
            .and_then(|s| Some((s.metadata.name.clone()?, s.spec.as_ref()?.cluster_ip.clone()?)))
    };
    // In step: the import in cluster-2 lists the VIP cluster-2 allocated,
    // and its slice has the exported endpoint.
    let consistent = || {
        let Some((_, ip)) = vip() else { return false };
        let Some(i) = rt.block_on(import(&c, ns, "web")) else { return false };
        let addresses: Vec<String> = rt
            .block_on(slices.list(&ours))
            .expect("list")
            .items
            .iter()
            .flat_map(|s| s.endpoints.iter().flat_map(|e| e.addresses.clone()))
            .collect();
        i["spec"]["ips"] == json!([ip]) && addresses == ["10.1.0.9"]
    };
    until(30, "imported into cluster-2", consistent);
    let edit = kube::api::PatchParams::default();
    let merge = |v: Value| kube::api::Patch::Merge(v);

    rt.block_on(imports.delete("web", &Default::default())).expect("delete import");
    until(20, "a deleted ServiceImport written again", consistent);

    rt.block_on(imports.patch("web", &edit, &merge(json!({"spec": {"ips": ["10.255.255.1"]}}))))
        .expect("edit import");
    until(20, "an edited ServiceImport written again", consistent);

    let (name, before) = vip().expect("VIP");
    rt.block_on(services.delete(&name, &Default::default())).expect("delete VIP Service");
    until(20, "a deleted VIP Service written again, and the import following its new address", || {
        vip().is_some_and(|(_, ip)| ip != before) && consistent()
    });

    let slice = rt.block_on(slices.list(&ours)).expect("list").items[0].metadata.name.clone().expect("name");
    rt.block_on(slices.delete(&slice, &Default::default())).expect("delete slice");
    until(20, "a deleted MCS EndpointSlice written again", consistent);

    rt.block_on(slices.patch(&slice, &edit, &merge(json!({"endpoints": [{"addresses": ["10.9.9.9"]}]}))))
        .expect("edit slice");
    until(20, "an edited MCS EndpointSlice written again", consistent);
}

#[test]
fn members_sharing_a_cluster_id_are_reported_on_every_export_and_never_mixed() {
    // Its own clusters: a ClusterProperty is cluster-wide.
    let clusters = TestClusters::start(2);
    let rt = runtime();
    let ns = "sync-dupid";
    let u: Vec<User> = rt.block_on(async {
        let mut v = Vec::new();
        for i in 0..2 {
            set_cluster_id(&clusters, i, "same").await;
            let user = User::new(&clusters, i, ns).await;
            user.service("web", json!({})).await;
            user.endpoints("web-x", "web", json!([{"addresses": [format!("10.{i}.0.1")]}])).await;
            user.export("web").await;
            v.push(user);
        }
        v
    });
    let _sync = syncing(&clusters, &[ns], &[]);
    for i in 0..2 {
        let c = rt.block_on(client(&clusters, i));
        until(30, "DuplicateClusterID on each export", || {
            rt.block_on(conditions(&c, ns, "web")).iter().any(|c| {
                c.starts_with(
                    "Valid=False DuplicateClusterID: Members cluster-1, cluster-2 all have cluster id same",
                )
            })
        });
        assert!(
            rt.block_on(import(&c, ns, "web")).is_none(),
            "imported from members that cannot be told apart"
        );
    }
    drop(u);
}

#[test]
fn a_namespace_created_after_the_export_gets_the_import() {
    let clusters = shared();
    let rt = runtime();
    let ns = "sync-late-ns";
    let u = rt.block_on(User::new(clusters, 0, ns));
    let c0 = rt.block_on(client(clusters, 0));
    let _sync = syncing(clusters, &[ns], &[]);
    rt.block_on(async {
        u.service("web", json!({})).await;
        u.export("web").await;
    });
    until(30, "imported where the namespace is", || rt.block_on(import(&c0, ns, "web")).is_some());
    let c2 = rt.block_on(client(clusters, 2));
    assert!(rt.block_on(import(&c2, ns, "web")).is_none(), "cluster-3 has no such namespace yet");
    // Namespace sameness: once cluster-3 has the namespace, it imports.
    rt.block_on(User::new(clusters, 2, ns));
    until(20, "imported into the new namespace", || rt.block_on(import(&c2, ns, "web")).is_some());
}

/// Applies cluster `i`'s `cluster.clusterset.k8s.io` ClusterProperty.
async fn set_cluster_id(clusters: &TestClusters, i: usize, value: &str) {
    let ar = clusterset_dns::k8s::mcs::cluster_property_resource();
    let api: Api<DynamicObject> = Api::all_with(client(clusters, i).await, &ar);
    let body = json!({"apiVersion": "about.k8s.io/v1alpha1", "kind": "ClusterProperty",
                      "metadata": {"name": "cluster.clusterset.k8s.io"}, "spec": {"value": value}});
    api.patch(
        "cluster.clusterset.k8s.io",
        &kube::api::PatchParams::apply("test"),
        &kube::api::Patch::Apply(&body),
    )
    .await
    .expect("apply ClusterProperty");
}

/// What member `c` says of service `name`'s sources: the import status's
/// clusters, and the `source-cluster` label of each MCS slice of ours.
async fn sources(c: &kube::Client, ns: &str, name: &str) -> (Vec<String>, Vec<String>) {
    let status = import(c, ns, name)
        .await
        .and_then(|o| o.pointer("/status/clusters").and_then(Value::as_array).cloned())
        .unwrap_or_default()
        .iter()
        .map(|c| c["cluster"].as_str().unwrap_or("").to_owned())
        .collect();
    let slices: Api<EndpointSlice> = Api::namespaced(c.clone(), ns);
    let mut labels: Vec<String> = slices
        .list_metadata(
            &ListParams::default().labels(&format!("{OURS},multicluster.kubernetes.io/service-name={name}")),
        )
        .await
        .expect("list slices")
        .items
        .iter()
        .map(|s| {
            let l =
                s.metadata.labels.as_ref().and_then(|l| l.get("multicluster.kubernetes.io/source-cluster"));
            l.cloned().unwrap_or_default()
        })
        .collect();
    labels.sort();
    (status, labels)
}

#[test]
fn a_cluster_property_created_or_changed_after_start_rekeys_the_members_exports() {
    // Its own clusters: a ClusterProperty is cluster-wide.
    let clusters = TestClusters::start(2);
    let rt = runtime();
    let ns = "sync-late-id";
    let u = users(&rt, &clusters, ns);
    rt.block_on(async {
        u[0].service("web", json!({})).await;
        u[0].endpoints("web-x", "web", json!([{"addresses": ["10.0.0.1"]}])).await;
        u[0].export("web").await;
    });
    let c: Vec<kube::Client> =
        rt.block_on(async { vec![client(&clusters, 0).await, client(&clusters, 1).await] });
    let sync = syncing(&clusters, &[ns], &[]);
    let named = |id: &str| (vec![id.to_owned()], vec![id.to_owned()]);
    // No ClusterProperty: cluster-1 is known by its member name.
    for ci in &c {
        until(30, "imported under the member name", || {
            rt.block_on(sources(ci, ns, "web")) == named("cluster-1")
        });
    }
    // Created after start: followed within the recheck period (10 s), and
    // nothing is left under the old id, in either member.
    rt.block_on(set_cluster_id(&clusters, 0, "east"));
    for ci in &c {
        until(60, "re-keyed to the new ClusterProperty", || {
            rt.block_on(sources(ci, ns, "web")) == named("east")
        });
    }
    // Changed: the same again.
    rt.block_on(set_cluster_id(&clusters, 0, "east-2"));
    for ci in &c {
        until(60, "re-keyed to the changed ClusterProperty", || {
            rt.block_on(sources(ci, ns, "web")) == named("east-2")
        });
    }
    assert!(
        rt.block_on(conditions(&c[0], ns, "web")).iter().any(|c| c.starts_with("Ready=True")),
        "the export is Ready under its new id:\n{}",
        sync.log()
    );
    assert!(sync.log().contains("cluster id changed"), "{}", sync.log());
}

/// A Service's own EndpointSlice of one address family, as the
/// EndpointSlice controller writes it.
async fn family_slice(c: &kube::Client, ns: &str, service: &str, family: &str, address: &str) {
    let api: Api<EndpointSlice> = Api::namespaced(c.clone(), ns);
    let name = format!("{service}-{}", family.to_ascii_lowercase());
    let body = json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": ns,
                     "labels": {"kubernetes.io/service-name": service,
                                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}},
        "addressType": family, "ports": [{"name": "http", "protocol": "TCP", "port": 8080}],
        "endpoints": [{"addresses": [address], "conditions": {"ready": true}}]});
    api.patch(&name, &kube::api::PatchParams::apply("test").force(), &kube::api::Patch::Apply(&body))
        .await
        .expect("apply EndpointSlice");
}

/// The import's `spec.ipFamilies` and `spec.ips`, and the VIP Service's
/// `spec.ipFamilies`, in member `c`.
async fn families_of(c: &kube::Client, ns: &str, name: &str) -> (Vec<String>, Vec<String>, Vec<String>) {
    let strings = |v: Option<&Value>| -> Vec<String> {
        v.and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|s| s.as_str().map(str::to_owned))
            .collect()
    };
    let Some(i) = import(c, ns, name).await else { return Default::default() };
    let vips = Api::<Service>::namespaced(c.clone(), ns)
        .list(&ListParams::default().labels(OURS))
        .await
        .expect("list VIP Services")
        .items;
    let vip = vips.first().and_then(|s| s.spec.as_ref()?.ip_families.clone()).unwrap_or_default();
    (strings(i.pointer("/spec/ipFamilies")), strings(i.pointer("/spec/ips")), vip)
}

#[test]
fn exports_of_different_ip_families_conflict_and_the_oldest_family_is_imported() {
    // Its own clusters: dual-stack service ranges (IPv4 10.(110+I).0.0/16,
    // IPv6 fd00:0:0:I::/108), so each member can give a VIP of either family.
    let clusters =
        TestClusters::start_env(2, &[("CLUSTERS_SERVICE_CIDR", "10.11{I}.0.0/16,fd00:0:0:{I}::/108")]);
    let rt = runtime();
    let ns = "sync-families";
    let u = users(&rt, &clusters, ns);
    let c: Vec<kube::Client> =
        rt.block_on(async { vec![client(&clusters, 0).await, client(&clusters, 1).await] });
    // cluster-1 exports first, IPv4 only; cluster-2 a second later, IPv6 only.
    let single = |family: &str| json!({"ipFamilyPolicy": "SingleStack", "ipFamilies": [family]});
    rt.block_on(async {
        u[0].service("web", single("IPv4")).await;
        family_slice(&c[0], ns, "web", "IPv4", "10.1.0.1").await;
        u[0].export("web").await;
    });
    past_second_of(&created(&rt, &clusters, 0, ns, "web"));
    rt.block_on(async {
        u[1].service("web", single("IPv6")).await;
        family_slice(&c[1], ns, "web", "IPv6", "fd00:2::1").await;
        u[1].export("web").await;
    });
    let sync = syncing(&clusters, &[ns], &[]);
    let conflict = "Conflict=True IPFamilyConflict: Conflicting ipFamilies. Using \"IPv4\" from oldest service \
                    export in \"cluster-1\". 1/2 clusters disagree.";
    for (i, ci) in c.iter().enumerate() {
        until(60, &format!("IPFamilyConflict on {}'s export", clusters.name(i)), || {
            rt.block_on(conditions(ci, ns, "web")).iter().any(|c| c == conflict)
        });
    }
    // Every member imports the oldest export's family: an IPv4 VIP only.
    for (i, ci) in c.iter().enumerate() {
        until(30, &format!("an IPv4 import in {}", clusters.name(i)), || {
            let (families, ips, vip) = rt.block_on(families_of(ci, ns, "web"));
            families == ["IPv4"]
                && vip == ["IPv4"]
                && ips.len() == 1
                && ips[0].starts_with(&format!("10.11{}.", i + 1))
        });
    }
    // The disagreeing export is still valid: both exports are Valid.
    for ci in &c {
        let conds = rt.block_on(conditions(ci, ns, "web"));
        assert!(conds.iter().any(|c| c.starts_with("Valid=True")), "{conds:?}");
    }
    // The oldest export goes: cluster-2's family wins, the conflict clears,
    // and each member's VIP becomes IPv6 (a Service's primary family cannot
    // change in place).
    rt.block_on(u[0].unexport("web"));
    until(60, "the conflict cleared", || {
        rt.block_on(conditions(&c[1], ns, "web")).iter().any(|c| c.starts_with("Conflict=False NoConflicts"))
    });
    for (i, ci) in c.iter().enumerate() {
        until(60, &format!("an IPv6 import in {}", clusters.name(i)), || {
            let (families, ips, vip) = rt.block_on(families_of(ci, ns, "web"));
            families == ["IPv6"]
                && vip == ["IPv6"]
                && ips.len() == 1
                && ips[0].starts_with(&format!("fd00:0:0:{}:", i + 1))
        });
    }
    drop(sync);
}

/// Our objects of kind `K` for `service` in namespace `ns`.
async fn ours_for<K>(c: &kube::Client, ns: &str, service: &str) -> Vec<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let labels = format!("{OURS},multicluster.kubernetes.io/service-name={service}");
    Api::<K>::namespaced(c.clone(), ns)
        .list(&ListParams::default().labels(&labels))
        .await
        .expect("list")
        .items
}

/// Two pairs of names the controller's 32-bit digests give twice, found
/// offline: two source slices of one service, and two services whose names
/// share their first 40 characters (what object names keep of them).
const TWIN_SOURCES: (&str, &str) = ("web-h6kvr", "web-efi2a");
const TWIN_SERVICES: (&str, &str) =
    ("payments-settlement-reconciliation-worker-6deaa", "payments-settlement-reconciliation-worker-81608");

#[test]
fn names_whose_digests_collide_get_objects_of_their_own() {
    use clusterset_dns::controller::desired::{Naming, vip_name};
    use clusterset_dns::model::{DnsLabel, ServiceKey};
    let clusters = shared();
    let rt = runtime();
    let ns = "sync-twins";
    let key = |name: &str| ServiceKey {
        namespace: DnsLabel::parse(ns).unwrap(),
        name: DnsLabel::parse(name).unwrap(),
    };
    let (elder, younger) = TWIN_SERVICES;
    assert_eq!(
        vip_name(&key(elder), Naming::Short),
        vip_name(&key(younger), Naming::Short),
        "the pair collides"
    );
    let u = rt.block_on(User::new(clusters, 0, ns));
    for i in 1..clusters.len() {
        rt.block_on(User::new(clusters, i, ns));
    }
    let c1 = rt.block_on(client(clusters, 1));
    let sync = syncing(clusters, &[ns], &[]);
    // One service, two source slices whose mirrors would share a name.
    let (x, y) = TWIN_SOURCES;
    rt.block_on(async {
        u.service("web", json!({})).await;
        u.endpoints(x, "web", json!([{"addresses": ["10.7.0.1"]}])).await;
        u.endpoints(y, "web", json!([{"addresses": ["10.7.0.2"]}])).await;
        u.export("web").await;
    });
    let mirrored = |service: &str| {
        rt.block_on(async {
            let mut v: Vec<(String, Vec<String>)> = ours_for::<EndpointSlice>(&c1, ns, service)
                .await
                .into_iter()
                .map(|s| {
                    let name = s.metadata.name.unwrap_or_default();
                    (name, s.endpoints.into_iter().flat_map(|e| e.addresses).collect())
                })
                .collect();
            v.sort();
            v
        })
    };
    until(30, "both sources mirrored, each to a slice of its own", || {
        let m = mirrored("web");
        let mut addrs: Vec<&String> = m.iter().flat_map(|(_, a)| a).collect();
        addrs.sort();
        m.len() == 2 && addrs == ["10.7.0.1", "10.7.0.2"]
    });
    let vips = |service: &str| {
        rt.block_on(async {
            ours_for::<Service>(&c1, ns, service)
                .await
                .into_iter()
                .map(|s| {
                    (
                        s.metadata.name.unwrap_or_default(),
                        s.spec.and_then(|s| s.cluster_ip).unwrap_or_default(),
                    )
                })
                .collect::<Vec<_>>()
        })
    };
    // Two services whose VIP Services would share a name: the elder export
    // keeps the usual name, the younger takes a long one, and each import
    // has a VIP of its own that routes to its own endpoints.
    rt.block_on(async {
        u.service(elder, json!({})).await;
        u.endpoints(&format!("{elder}-a"), elder, json!([{"addresses": ["10.7.1.1"]}])).await;
        u.export(elder).await;
    });
    until(30, "the elder's VIP", || vips(elder).len() == 1);
    // A later second: the younger export's creationTimestamp is later.
    past_second_of(&created(&rt, clusters, 0, ns, elder));
    rt.block_on(async {
        u.service(younger, json!({})).await;
        u.endpoints(&format!("{younger}-a"), younger, json!([{"addresses": ["10.7.1.2"]}])).await;
        u.export(younger).await;
    });
    until(30, "the younger's VIP", || vips(younger).len() == 1);
    let (e, y) = (vips(elder), vips(younger));
    assert_eq!(e[0].0, vip_name(&key(elder), Naming::Short), "{e:?}");
    assert_eq!(y[0].0, vip_name(&key(younger), Naming::Long), "{y:?}");
    assert_ne!(e[0].1, y[0].1, "one VIP each");
    let ips = |name: &str| {
        rt.block_on(import(&c1, ns, name))
            .and_then(|i| i.pointer("/spec/ips/0").and_then(Value::as_str).map(str::to_owned))
    };
    until(30, "each import carries its own VIP", || {
        ips(elder).as_deref() == Some(&e[0].1) && ips(younger).as_deref() == Some(&y[0].1)
    });
    for (service, addr) in [(elder, "10.7.1.1"), (younger, "10.7.1.2")] {
        let m = mirrored(service);
        assert_eq!(m.len(), 1, "{service}: {m:?}");
        assert_eq!(m[0].1, [addr], "{service}: {m:?}");
    }
    // Names stay put: the elder's VIP is not taken over later, by the
    // reconciles that the writes above bring back through the watches
    // (waited for: the controller idle, twice in a row).
    sync.settle(0.0, 1.0, "the writes' own events reconciled");
    assert_eq!(vips(elder), e);
    assert_eq!(vips(younger), y);
}
