//! Centralized mode against three real clusters: `serve --cluster` watches
//! every member's ServiceExports, Services and EndpointSlices (as the
//! least-privilege identity of `deploy/centralized/rbac.yaml`) and answers
//! for the whole fleet with no ServiceImport anywhere. Also the writer the
//! sync tests use to play a user: Services, their own EndpointSlices (the
//! test clusters run no controller-manager) and ServiceExports.

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};

use crate::harness::clusters::{Component, TestClusters, shared};
use crate::harness::eventually;
use crate::harness::served::Served;
use crate::watch::{Kube, runtime, short, status as rcode};

const MANAGER: &str = "clusterset-dns-tests";

pub(crate) fn export_resource() -> ApiResource {
    clusterset_dns::k8s::mcs::mcs_resource("v1alpha1", "ServiceExport", "serviceexports")
}

/// A user of one member cluster, in one namespace.
pub(crate) struct User {
    client: kube::Client,
    pub(crate) ns: String,
}

impl User {
    pub(crate) async fn new(clusters: &TestClusters, i: usize, ns: &str) -> Self {
        let client = clusters.client(i).await;
        Kube::new(client.clone(), ns).await; // creates the namespace
        Self { client, ns: ns.to_owned() }
    }

    /// A Service; `spec` is merged over `ports: [http 80]`. Returns its ClusterIP.
    pub(crate) async fn service(&self, name: &str, spec: Value) -> Option<String> {
        self.annotated_service(name, spec, json!({})).await
    }

    /// A Service with annotations (applying without one removes it).
    pub(crate) async fn annotated_service(
        &self,
        name: &str,
        spec: Value,
        annotations: Value,
    ) -> Option<String> {
        let api: Api<Service> = Api::namespaced(self.client.clone(), &self.ns);
        let mut full = json!({"ports": [{"name": "http", "protocol": "TCP", "port": 80}]});
        for (k, v) in spec.as_object().into_iter().flatten() {
            full[k] = v.clone();
        }
        let body = json!({"apiVersion": "v1", "kind": "Service",
                          "metadata": {"name": name, "namespace": self.ns, "annotations": annotations},
                          "spec": full});
        let svc = api
            .patch(name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&body))
            .await
            .expect("apply Service");
        svc.spec.and_then(|s| s.cluster_ip).filter(|ip| ip != "None")
    }

    pub(crate) async fn delete_service(&self, name: &str) {
        let api: Api<Service> = Api::namespaced(self.client.clone(), &self.ns);
        api.delete(name, &DeleteParams::default()).await.expect("delete Service");
    }

    /// The Service's own EndpointSlice, as the EndpointSlice controller
    /// would write it: `endpoints` as in the API.
    pub(crate) async fn endpoints(&self, slice: &str, service: &str, endpoints: Value) {
        let ports = json!([{"name": "http", "protocol": "TCP", "port": 8080}]);
        self.endpoints_on(slice, service, ports, endpoints).await;
    }

    /// [`Self::endpoints`] with the slice's `ports` as in the API.
    pub(crate) async fn endpoints_on(&self, slice: &str, service: &str, ports: Value, endpoints: Value) {
        self.slice(slice, service, ports, endpoints, json!({})).await;
    }

    /// [`Self::endpoints`] changed at `at` (RFC 3339), which the slice's
    /// `endpoints.kubernetes.io/last-change-trigger-time` says, as
    /// kube-controller-manager writes it.
    pub(crate) async fn endpoints_at(&self, slice: &str, service: &str, endpoints: Value, at: &str) {
        let ports = json!([{"name": "http", "protocol": "TCP", "port": 8080}]);
        let annotations = json!({"endpoints.kubernetes.io/last-change-trigger-time": at});
        self.slice(slice, service, ports, endpoints, annotations).await;
    }

    async fn slice(&self, slice: &str, service: &str, ports: Value, endpoints: Value, annotations: Value) {
        let api: Api<EndpointSlice> = Api::namespaced(self.client.clone(), &self.ns);
        let body = json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": slice, "namespace": self.ns, "annotations": annotations,
                         "labels": {"kubernetes.io/service-name": service,
                                    "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}},
            "addressType": "IPv4", "ports": ports,
            "endpoints": endpoints});
        api.patch(slice, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&body))
            .await
            .expect("apply EndpointSlice");
    }

    pub(crate) async fn export(&self, name: &str) {
        self.annotated_export(name, json!({})).await;
    }

    /// Service `name` with one endpoint at `address` (its slice `NAME-a`),
    /// exported.
    pub(crate) async fn exported_service(&self, name: &str, address: &str) {
        self.service(name, json!({})).await;
        self.endpoints(&format!("{name}-a"), name, json!([{"addresses": [address]}])).await;
        self.export(name).await;
    }

    /// A ServiceExport with annotations (applying without one removes it).
    pub(crate) async fn annotated_export(&self, name: &str, annotations: Value) {
        let ar = export_resource();
        let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), &self.ns, &ar);
        let body = json!({"apiVersion": ar.api_version, "kind": "ServiceExport",
                          "metadata": {"name": name, "namespace": self.ns, "annotations": annotations}});
        api.patch(name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&body))
            .await
            .expect("apply ServiceExport");
    }

    /// A ServiceExport with a `spec` (exportedLabels, exportedAnnotations).
    pub(crate) async fn export_with(&self, name: &str, spec: Value) {
        let ar = export_resource();
        let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), &self.ns, &ar);
        let body = json!({"apiVersion": ar.api_version, "kind": "ServiceExport",
                          "metadata": {"name": name, "namespace": self.ns}, "spec": spec});
        api.patch(name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&body))
            .await
            .expect("apply ServiceExport");
    }

    pub(crate) async fn unexport(&self, name: &str) {
        let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), &self.ns, &export_resource());
        api.delete(name, &DeleteParams::default()).await.expect("delete ServiceExport");
    }
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

#[test]
fn centralized_serve_answers_for_the_fleet_from_exports_alone() {
    let clusters = shared();
    let rt = runtime();
    let ns = "central";
    let users: Vec<User> = rt.block_on(async {
        let mut v = Vec::new();
        for i in 0..3 {
            v.push(User::new(clusters, i, ns).await);
        }
        v
    });
    let (a, b, c) = (&users[0], &users[1], &users[2]);
    // Exported before the server starts: the first list carries it.
    let ip_a = rt.block_on(async {
        let ip = a.service("web", json!({})).await.expect("cluster IP");
        a.export("web").await;
        ip
    });
    let members: Vec<String> = (0..3)
        .map(|i| format!("{}={}", clusters.name(i), clusters.role_kubeconfig(i, "centralized").display()))
        .collect();
    let mut args = Vec::new();
    for m in &members {
        args.extend(["--cluster", m.as_str()]);
    }
    let s = Served::start(&args);
    eventually("ready", || s.get("/ready").0 == 200);
    let web = format!("web.{ns}.svc.clusterset.local");
    assert_eq!(short(&s, &web, "A"), std::slice::from_ref(&ip_a));

    // Exported in a second cluster later: both clusters' ClusterIPs.
    let ip_c = rt.block_on(async {
        let ip = c.service("web", json!({})).await.expect("cluster IP");
        c.export("web").await;
        ip
    });
    eventually("web in A and C", || short(&s, &web, "A") == sorted(vec![ip_a.clone(), ip_c.clone()]));
    assert_eq!(short(&s, &format!("_http._tcp.{web}"), "SRV"), [format!("0 100 80 {web}.")]);

    // Headless across two clusters, with hostnames.
    rt.block_on(async {
        for (u, ip) in [(a, "10.1.0.1"), (b, "10.2.0.1")] {
            u.service("db", json!({"clusterIP": "None"})).await;
            u.endpoints("db-x", "db", json!([{"addresses": [ip], "hostname": "db-0"},
                                               {"addresses": [ip.replace(".1", ".9")], "conditions": {"ready": false}}]))
                .await;
            u.export("db").await;
        }
    });
    let db = format!("db.{ns}.svc.clusterset.local");
    eventually("db in A and B", || short(&s, &db, "A") == ["10.1.0.1", "10.2.0.1"]);
    assert_eq!(short(&s, &format!("db-0.{}.{db}", clusters.name(1)), "A"), ["10.2.0.1"]);

    // An ExternalName export is not valid: no name.
    rt.block_on(async {
        b.service("ext", json!({"type": "ExternalName", "externalName": "example.com", "ports": []})).await;
        b.export("ext").await;
    });
    // A valid export from the same cluster, made after it: once it is
    // answered, the server has taken in the ExternalName Service and its
    // export (each of the member's watches delivers in order).
    let ip_sentinel = rt.block_on(async {
        let ip = b.service("sentinel", json!({})).await.expect("cluster IP");
        b.export("sentinel").await;
        ip
    });
    let sentinel = format!("sentinel.{ns}.svc.clusterset.local");
    eventually("the later export answered", || short(&s, &sentinel, "A") == [ip_sentinel.clone()]);
    assert_eq!(rcode(&s, &format!("ext.{ns}.svc.clusterset.local")), "NXDOMAIN");

    // Endpoints follow the source slices.
    rt.block_on(a.endpoints("db-x", "db", json!([{"addresses": ["10.1.0.2"], "hostname": "db-0"}])));
    eventually("db endpoint moved", || short(&s, &db, "A") == ["10.1.0.2", "10.2.0.1"]);

    // Unexport in A; delete the Service in C: web goes.
    rt.block_on(a.unexport("web"));
    eventually("web only in C", || short(&s, &web, "A") == [ip_c.clone()]);
    rt.block_on(c.delete_service("web"));
    eventually("web gone", || rcode(&s, &web) == "NXDOMAIN");
    assert!(s.log().contains("cluster=cluster-1"), "members are logged with their ids:\n{}", s.log());
}

/// Issue 31: centralized answers per asking cluster. `db` (headless, in
/// cluster-1) is exported for `clusterset-dns.io/consumer-clusters:
/// cluster-2`; `open` (in cluster-1) for everyone. Two client clusters by
/// EDNS Client Subnet: cluster-1's (198.51.100.0/24) and cluster-2's
/// (203.0.113.0/24), believed from 127.0.0.1 only (`--trust-ecs-from`);
/// loopback belongs to none, so 127.0.0.2 claiming cluster-2's subnet is
/// an unknown client (issue 40).
#[test]
fn centralized_answers_a_restricted_service_only_to_its_consumer_clusters() {
    let clusters = shared();
    let rt = runtime();
    let ns = "consumers";
    let a = rt.block_on(async {
        for i in 1..3 {
            User::new(clusters, i, ns).await;
        }
        User::new(clusters, 0, ns).await
    });
    let only = |list: &str| json!({"clusterset-dns.io/consumer-clusters": list});
    rt.block_on(async {
        for svc in ["db", "open"] {
            a.service(svc, json!({"clusterIP": "None"})).await;
            let ip = if svc == "db" { "10.1.0.1" } else { "10.1.0.2" };
            a.endpoints(&format!("{svc}-x"), svc, json!([{"addresses": [ip], "hostname": "db-0"}])).await;
        }
        a.annotated_export("db", only(clusters.name(1))).await;
        a.export("open").await;
    });
    let mut args = Vec::new();
    let members: Vec<String> = (0..3)
        .map(|i| format!("{}={}", clusters.name(i), clusters.role_kubeconfig(i, "centralized").display()))
        .collect();
    for m in &members {
        args.extend(["--cluster", m.as_str()]);
    }
    let nets =
        [format!("198.51.100.0/24={}", clusters.name(0)), format!("203.0.113.0/24={}", clusters.name(1))];
    for n in &nets {
        args.extend(["--client-cluster", n.as_str()]);
    }
    args.extend(["--trust-ecs-from", "127.0.0.1"]);
    let s = Served::start(&args);
    eventually("ready", || s.get("/ready").0 == 200);
    let (one, two) = ("+subnet=198.51.100.0/24", "+subnet=203.0.113.0/24");
    let status = |name: &str, t: &str, from: &[&str]| {
        let mut a = vec![name, t];
        a.extend_from_slice(from);
        let out = s.dig(&a);
        out.split("status: ").nth(1).and_then(|r| r.split(',').next()).unwrap_or("no answer").to_owned()
    };
    let answer = |name: &str, t: &str, from: &[&str]| {
        let mut a = vec![name, t, "+short"];
        a.extend_from_slice(from);
        s.dig(&a).lines().map(str::to_owned).collect::<Vec<_>>()
    };
    let db = format!("db.{ns}.svc.clusterset.local");
    eventually("db for cluster-2", || answer(&db, "A", &[two]) == ["10.1.0.1"]);
    let names = [
        (db.clone(), "A"),
        (format!("_http._tcp.{db}"), "SRV"),
        (format!("db-0.{}.{db}", clusters.name(0)), "A"),
    ];
    for (name, t) in &names {
        assert!(!answer(name, t, &[two]).is_empty(), "{name} {t} for cluster-2");
        // cluster-1 (the exporter, not listed) and an unknown client: as a
        // member without the import.
        assert_eq!(status(name, t, &[one]), "NXDOMAIN", "{name} {t} for cluster-1");
        assert_eq!(status(name, t, &[]), "NXDOMAIN", "{name} {t} for an unknown client");
        // cluster-2's subnet claimed by a sender that is not the trusted resolver.
        assert_eq!(status(name, t, &["-b", "127.0.0.2", two]), "NXDOMAIN", "{name} {t} spoofed");
    }
    assert_eq!(answer(&format!("open.{ns}.svc.clusterset.local"), "A", &[one]), ["10.1.0.2"]);
    // Its reverse name is not told to others; a transfer (loopback: an
    // unknown client) leaves it out, the open service in.
    assert_eq!(status("1.0.1.10.in-addr.arpa", "PTR", &[one]), "REFUSED");
    let axfr = s.dig(&["clusterset.local", "AXFR"]);
    assert!(!axfr.contains(&db) && axfr.contains(&format!("open.{ns}.svc")), "{axfr}");
    // The list changed: cluster-1 is a consumer too.
    rt.block_on(a.annotated_export("db", only(&format!("{},{}", clusters.name(0), clusters.name(1)))));
    eventually("db for cluster-1", || answer(&db, "A", &[one]) == ["10.1.0.1"]);
    assert_eq!(status(&db, "A", &[]), "NXDOMAIN", "still not for an unknown client");
    // explain tells an operator why.
    let out = s.dig(&["CH", "TXT", &db, "+short", "+tcp"]);
    assert!(out.contains("consumers: cluster-1, cluster-2 (the client is not one"), "{out}");
}

#[test]
fn a_members_cluster_property_names_it() {
    // Its own cluster: a ClusterProperty is cluster-wide.
    let clusters = TestClusters::start(1);
    let rt = runtime();
    let ns = "named";
    let user = rt.block_on(async {
        let client = clusters.client(0).await;
        let ar = clusterset_dns::k8s::mcs::cluster_property_resource();
        let api: Api<DynamicObject> = Api::all_with(client, &ar);
        let body = json!({"apiVersion": "about.k8s.io/v1alpha1", "kind": "ClusterProperty",
                          "metadata": {"name": "cluster.clusterset.k8s.io"}, "spec": {"value": "East.EU"}});
        api.patch("cluster.clusterset.k8s.io", &PatchParams::apply(MANAGER), &Patch::Apply(&body))
            .await
            .expect("apply ClusterProperty");
        let user = User::new(&clusters, 0, ns).await;
        user.service("db", json!({"clusterIP": "None"})).await;
        user.endpoints("db-x", "db", json!([{"addresses": ["10.5.0.1"], "hostname": "db-0"}])).await;
        user.export("db").await;
        user
    });
    let member = format!("member={}", clusters.role_kubeconfig(0, "centralized").display());
    let s = Served::start(&["--cluster", &member]);
    eventually("ready", || s.get("/ready").0 == 200);
    // The id from the property (folded to lower case), not the member name.
    eventually("named by its ClusterProperty", || {
        short(&s, &format!("db-0.east.eu.db.{ns}.svc.clusterset.local"), "A") == ["10.5.0.1"]
    });
    assert_eq!(rcode(&s, &format!("db-0.member.db.{ns}.svc.clusterset.local")), "NXDOMAIN");
    // The property changes (KEP-2149 wants it stable, but a fleet may set
    // it after the member joined): the member is listed again under the new
    // id, read within ID_RECHECK (10 s), and its liveness follows.
    rt.block_on(async {
        let api: Api<DynamicObject> =
            Api::all_with(clusters.client(0).await, &clusterset_dns::k8s::mcs::cluster_property_resource());
        let body = json!({"apiVersion": "about.k8s.io/v1alpha1", "kind": "ClusterProperty",
                          "metadata": {"name": "cluster.clusterset.k8s.io"}, "spec": {"value": "west"}});
        api.patch("cluster.clusterset.k8s.io", &PatchParams::apply(MANAGER), &Patch::Apply(&body))
            .await
            .expect("apply ClusterProperty");
    });
    within("renamed by its ClusterProperty", std::time::Duration::from_secs(60), || {
        short(&s, &format!("db-0.west.db.{ns}.svc.clusterset.local"), "A") == ["10.5.0.1"]
    });
    assert_eq!(rcode(&s, &format!("db-0.east.eu.db.{ns}.svc.clusterset.local")), "NXDOMAIN");
    assert_eq!(
        metric(&s, "clusterset_dns_cluster_alive{cluster=\"west\"}"),
        Some(1.0),
        "liveness under the new id"
    );
    drop(user);
}

/// Polls `f` every 100 ms for at most `limit`; returns how long it took.
fn within(what: &str, limit: std::time::Duration, mut f: impl FnMut() -> bool) -> std::time::Duration {
    let start = std::time::Instant::now();
    while start.elapsed() < limit {
        if f() {
            return start.elapsed();
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    panic!("{what}: not within {limit:?}");
}

/// The value of one metric line (`name{labels}`) in a scrape.
pub(crate) fn metric(s: &Served, line: &str) -> Option<f64> {
    crate::harness::http::metric_value(&s.get("/metrics").1, line)
}

#[test]
fn a_member_whose_api_stops_is_demoted_within_30_s_and_returns_when_it_answers() {
    let clusters = TestClusters::start(2);
    let rt = runtime();
    let ns = "liveness";
    let users: Vec<User> = rt.block_on(async {
        let mut v = Vec::new();
        for i in 0..2 {
            v.push(User::new(&clusters, i, ns).await);
        }
        v
    });
    rt.block_on(async {
        for (u, ip) in [(&users[0], "10.1.0.1"), (&users[1], "10.2.0.1")] {
            u.service("db", json!({"clusterIP": "None"})).await;
            u.endpoints("db-x", "db", json!([{"addresses": [ip], "hostname": "db-0"}])).await;
            u.export("db").await;
        }
    });
    let members: Vec<String> = (0..2)
        .map(|i| format!("{}={}", clusters.name(i), clusters.role_kubeconfig(i, "centralized").display()))
        .collect();
    // The default --cluster-dead-after (15 s).
    let s = Served::start(&["--cluster", &members[0], "--cluster", &members[1]]);
    eventually("ready", || s.get("/ready").0 == 200);
    let db = format!("db.{ns}.svc.clusterset.local");
    let b_host = format!("db-0.{}.{db}", clusters.name(1));
    eventually("db in both clusters", || short(&s, &db, "A") == ["10.1.0.1", "10.2.0.1"]);
    let alive_b = format!("clusterset_dns_cluster_alive{{cluster=\"{}\"}}", clusters.name(1));
    assert_eq!(metric(&s, &alive_b), Some(1.0));

    clusters.stop(1, Component::ApiServer);
    let took = within("B's endpoint demoted", std::time::Duration::from_secs(30), || {
        short(&s, &db, "A") == ["10.1.0.1"]
    });
    eprintln!("cluster-2 demoted {took:?} after its API server stopped");
    // Demoted, not deleted: its per-endpoint name still answers, and
    // the store still holds it (marked unhealthy).
    assert_eq!(short(&s, &b_host, "A"), ["10.2.0.1"]);
    assert_eq!(metric(&s, &alive_b), Some(0.0));
    // Per service on /debug/metrics (the test asks from loopback, which
    // --allow-debug lets in by default).
    let unhealthy = format!(
        "clusterset_dns_endpoints{{cluster=\"{}\",service=\"{ns}/db\",state=\"unhealthy\"}}",
        clusters.name(1)
    );
    let per_service = s.get("/debug/metrics").1;
    assert_eq!(crate::harness::http::metric_value(&per_service, &unhealthy), Some(1.0), "{per_service}");
    assert!(s.log().contains("member not answering"), "{}", s.log());

    clusters.start_component(1, Component::ApiServer);
    // Back once its API answers and every watch has relisted (watch
    // backoff reaches 30 s during a long outage).
    let back = within("B's endpoint back", std::time::Duration::from_secs(60), || {
        short(&s, &db, "A") == ["10.1.0.1", "10.2.0.1"]
    });
    eprintln!("cluster-2 answered again {back:?} after its API server started");
    assert_eq!(metric(&s, &alive_b), Some(1.0));
}
