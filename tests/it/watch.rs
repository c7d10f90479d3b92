//! The Kubernetes watch source against real kube-apiservers and etcd
//! (`tests/harness/clusters.rs`): answers follow the API, the server is not ready and says
//! SERVFAIL until the first list, outages of the API server, of etcd and of
//! the network keep the last answers and converge afterwards, and bad
//! objects are skipped by name. The server runs as the real binary under
//! the least-privilege identity of `deploy/serve/rbac.yaml`.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};

use crate::harness::clusters::{Component, TestClusters, shared};
use crate::harness::eventually;
use crate::harness::served::Served;

const MANAGER: &str = "clusterset-dns-tests";

pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime")
}

pub(crate) fn import_resource(version: &str) -> ApiResource {
    clusterset_dns::k8s::mcs::mcs_resource(version, "ServiceImport", "serviceimports")
}

/// Writes objects as a user would, with server-side apply, in one namespace
/// (also used by the CoreDNS end-to-end tests).
pub(crate) struct Kube {
    client: kube::Client,
    ns: String,
}

impl Kube {
    pub(crate) async fn new(client: kube::Client, ns: &str) -> Self {
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let body = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
        namespaces.patch(ns, &PatchParams::apply(MANAGER), &Patch::Apply(&body)).await.expect("namespace");
        Self { client, ns: ns.to_owned() }
    }

    pub(crate) async fn import(&self, name: &str, spec: Value) {
        self.import_as("v1beta1", name, spec).await;
    }

    pub(crate) async fn import_as(&self, version: &str, name: &str, spec: Value) {
        let ar = import_resource(version);
        let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), &self.ns, &ar);
        let body = json!({"apiVersion": ar.api_version, "kind": "ServiceImport",
                          "metadata": {"name": name, "namespace": self.ns}, "spec": spec});
        api.patch(name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&body))
            .await
            .expect("apply ServiceImport");
    }

    pub(crate) async fn delete_import(&self, name: &str) {
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &self.ns, &import_resource("v1beta1"));
        api.delete(name, &DeleteParams::default()).await.expect("delete ServiceImport");
    }

    /// An MCS EndpointSlice; `labels` overrides the MCS labels when given.
    pub(crate) async fn slice(
        &self,
        name: &str,
        service: &str,
        cluster: &str,
        endpoints: Value,
        labels: Option<Value>,
    ) {
        let api: Api<EndpointSlice> = Api::namespaced(self.client.clone(), &self.ns);
        let labels = labels.unwrap_or_else(|| {
            json!({"multicluster.kubernetes.io/service-name": service,
                   "multicluster.kubernetes.io/source-cluster": cluster})
        });
        let body = json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": name, "namespace": self.ns, "labels": labels},
            "addressType": "IPv4", "ports": [{"name": "http", "protocol": "TCP", "port": 8080}],
            "endpoints": endpoints});
        api.patch(name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&body))
            .await
            .expect("apply EndpointSlice");
    }

    pub(crate) async fn delete_slice(&self, name: &str) {
        let api: Api<EndpointSlice> = Api::namespaced(self.client.clone(), &self.ns);
        api.delete(name, &DeleteParams::default()).await.expect("delete EndpointSlice");
    }
}

pub(crate) fn vip(ips: &[&str]) -> Value {
    json!({"type": "ClusterSetIP", "ips": ips, "ports": [{"name": "http", "protocol": "TCP", "port": 80}]})
}

pub(crate) fn headless() -> Value {
    json!({"type": "Headless", "ports": [{"name": "http", "protocol": "TCP", "port": 8080}]})
}

/// Sorted `dig +short` lines.
pub(crate) fn short(s: &Served, name: &str, t: &str) -> Vec<String> {
    let mut v: Vec<String> = s.dig(&[name, t, "+short"]).lines().map(str::to_owned).collect();
    v.sort();
    v
}

pub(crate) fn status(s: &Served, name: &str) -> String {
    let out = s.dig(&[name, "A"]);
    out.split("status: ").nth(1).and_then(|r| r.split(',').next()).unwrap_or("no answer").to_owned()
}

pub(crate) fn serve(kubeconfig: &Path, ns: &str) -> Served {
    Served::start(&["--kubeconfig", kubeconfig.to_str().expect("path"), "--namespace", ns])
}

pub(crate) fn wait_ready(s: &Served) {
    s.wait_ready(Duration::from_secs(20));
}

#[test]
fn answers_follow_creates_updates_and_deletes_under_least_privilege() {
    let clusters = shared();
    let rt = runtime();
    let ns = "watch-crud";
    let k = rt.block_on(async { Kube::new(clusters.client(0).await, ns).await });
    rt.block_on(async {
        k.import("web", vip(&["10.77.0.1"])).await;
        k.import("db", headless()).await;
        k.slice(
            "db-a",
            "db",
            "cluster-a",
            json!([
            {"addresses": ["10.78.0.1"], "hostname": "db-0"},
            {"addresses": ["10.78.0.2"], "hostname": "db-1", "conditions": {"ready": true}}]),
            None,
        )
        .await;
    });
    // The server's identity may only list and watch (deploy/serve/rbac.yaml).
    let s = serve(&clusters.serve_kubeconfig(0), ns);
    wait_ready(&s);
    let web = format!("web.{ns}.svc.clusterset.local");
    let db = format!("db.{ns}.svc.clusterset.local");
    assert_eq!(short(&s, &web, "A"), ["10.77.0.1"]);
    assert_eq!(short(&s, &db, "A"), ["10.78.0.1", "10.78.0.2"]);
    assert_eq!(short(&s, &format!("db-1.cluster-a.{db}"), "A"), ["10.78.0.2"]);

    rt.block_on(k.import("web", vip(&["10.77.0.2"])));
    let took = eventually("VIP change served", || short(&s, &web, "A") == ["10.77.0.2"]);
    eprintln!("VIP change served after {took:?}");
    rt.block_on(k.slice(
        "db-a",
        "db",
        "cluster-a",
        json!([
        {"addresses": ["10.78.0.1"], "hostname": "db-0"},
        {"addresses": ["10.78.0.2"], "hostname": "db-1", "conditions": {"ready": false}}]),
        None,
    ));
    eventually("not-ready endpoint dropped", || short(&s, &db, "A") == ["10.78.0.1"]);
    rt.block_on(k.delete_slice("db-a"));
    eventually("headless without endpoints is NXDOMAIN", || status(&s, &db) == "NXDOMAIN");
    rt.block_on(k.delete_import("web"));
    eventually("deleted import is NXDOMAIN", || status(&s, &web) == "NXDOMAIN");
    // A ServiceImport written as v1alpha1 is served too.
    rt.block_on(k.import_as("v1alpha1", "legacy", vip(&["10.77.0.9"])));
    eventually("v1alpha1 import served", || {
        short(&s, &format!("legacy.{ns}.svc.clusterset.local"), "A") == ["10.77.0.9"]
    });
}

#[test]
fn malformed_objects_are_skipped_by_name_and_the_watch_keeps_running() {
    let clusters = shared();
    let rt = runtime();
    let ns = "watch-bad";
    let k = rt.block_on(async { Kube::new(clusters.client(1).await, ns).await });
    rt.block_on(async {
        k.import("bad-ip", vip(&["10.0.0.999"])).await;
        k.import("good", headless()).await;
        k.slice("good-a", "good", "cluster-a", json!([{"addresses": ["10.79.0.1"]}]), None).await;
        // No source-cluster label: not an MCS EndpointSlice we can name.
        let labels = json!({"multicluster.kubernetes.io/service-name": "good"});
        k.slice("good-unlabelled", "good", "", json!([{"addresses": ["10.79.0.2"]}]), Some(labels)).await;
    });
    let s = serve(&clusters.serve_kubeconfig(1), ns);
    wait_ready(&s);
    assert!(s.wait_log(&format!("ServiceImport {ns}/bad-ip: spec.ips[0]")), "{}", s.log());
    assert!(
        s.wait_log(&format!(
            "EndpointSlice {ns}/good-unlabelled: metadata.labels[multicluster.kubernetes.io/source-cluster]"
        )),
        "{}",
        s.log()
    );
    assert_eq!(short(&s, &format!("good.{ns}.svc.clusterset.local"), "A"), ["10.79.0.1"]);
    assert_eq!(status(&s, &format!("bad-ip.{ns}.svc.clusterset.local")), "NXDOMAIN");
    // The watch is still running.
    rt.block_on(k.import("later", vip(&["10.79.1.1"])));
    eventually("later import served", || {
        short(&s, &format!("later.{ns}.svc.clusterset.local"), "A") == ["10.79.1.1"]
    });
}

#[test]
fn unready_until_first_list_then_survives_apiserver_and_etcd_restarts() {
    let clusters = TestClusters::start(1);
    let rt = runtime();
    let ns = "watch-restart";
    let k = rt.block_on(async { Kube::new(clusters.client(0).await, ns).await });
    rt.block_on(k.import("web", vip(&["10.80.0.1"])));
    let web = format!("web.{ns}.svc.clusterset.local");

    // Before the first list: not ready, and "not found" is SERVFAIL.
    clusters.stop(0, Component::ApiServer);
    let s = serve(&clusters.serve_kubeconfig(0), ns);
    assert_eq!(s.get("/ready").0, 503);
    assert_eq!(s.get("/health").0, 200);
    assert_eq!(status(&s, &web), "SERVFAIL");
    assert_eq!(short(&s, "dns-version.clusterset.local", "TXT"), ["\"1.0.0\""]);
    clusters.start_component(0, Component::ApiServer);
    wait_ready(&s);
    assert_eq!(short(&s, &web, "A"), ["10.80.0.1"]);
    assert_eq!(status(&s, &format!("nope.{ns}.svc.clusterset.local")), "NXDOMAIN");

    // API server down: the last answers stay, the staleness shows.
    clusters.stop(0, Component::ApiServer);
    eventually("staleness reported", || {
        metric(&s, "clusterset_dns_watch_stale_seconds").is_some_and(|v| v > 0.0)
    });
    assert_eq!(short(&s, &web, "A"), ["10.80.0.1"]);
    assert_eq!(s.get("/ready").0, 200, "still ready: serving last known data");
    clusters.start_component(0, Component::ApiServer);
    rt.block_on(k.import("web", vip(&["10.80.0.2"])));
    eventually("change after API server restart", || short(&s, &web, "A") == ["10.80.0.2"]);
    eventually("staleness cleared", || metric(&s, "clusterset_dns_watch_stale_seconds") == Some(0.0));

    // etcd down: same.
    clusters.stop(0, Component::Etcd);
    // The outage in effect: the API server's own check of etcd fails.
    eventually("the API server finds etcd down", || {
        !crate::deploy::kubectl(&clusters.kubeconfig(0), &["get", "--raw", "/readyz/etcd"], "")
            .status
            .success()
    });
    assert_eq!(short(&s, &web, "A"), ["10.80.0.2"]);
    clusters.start_component(0, Component::Etcd);
    rt.block_on(k.import("api", vip(&["10.80.0.3"])));
    eventually("change after etcd restart", || {
        short(&s, &format!("api.{ns}.svc.clusterset.local"), "A") == ["10.80.0.3"]
    });
    assert!(s.log().contains("watch failing; serving the last known data"), "{}", s.log());
    assert!(s.log().contains("watch recovered"), "{}", s.log());
}

/// The largest value of a metric family (any labels), if exported.
fn metric(s: &Served, name: &str) -> Option<f64> {
    let (_, body) = s.get("/metrics");
    body.lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .reduce(f64::max)
}

#[test]
fn a_partition_keeps_answers_and_objects_deleted_meanwhile_disappear() {
    let clusters = shared();
    let rt = runtime();
    let ns = "watch-partition";
    let k = rt.block_on(async { Kube::new(clusters.client(2).await, ns).await });
    rt.block_on(async {
        k.import("a", vip(&["10.81.0.1"])).await;
        k.import("b", vip(&["10.81.0.2"])).await;
    });
    let proxy = Proxy::start(clusters.server(2));
    let kubeconfig = proxy.kubeconfig(&clusters.serve_kubeconfig(2), &clusters.server(2));
    let s = serve(&kubeconfig, ns);
    wait_ready(&s);
    let (a, b) = (format!("a.{ns}.svc.clusterset.local"), format!("b.{ns}.svc.clusterset.local"));
    assert_eq!(short(&s, &b, "A"), ["10.81.0.2"]);

    proxy.cut();
    rt.block_on(async {
        k.delete_import("b").await;
        k.import("a", vip(&["10.81.0.9"])).await;
    });
    eventually("staleness reported", || {
        metric(&s, "clusterset_dns_watch_stale_seconds").is_some_and(|v| v > 0.0)
    });
    assert_eq!(short(&s, &b, "A"), ["10.81.0.2"], "last known data while partitioned");
    proxy.restore();
    eventually("deleted while partitioned disappears", || status(&s, &b) == "NXDOMAIN");
    eventually("changed while partitioned converges", || short(&s, &a, "A") == ["10.81.0.9"]);
}

/// A TCP forwarder to an API server that a test can cut (every connection
/// closed, new ones refused) and restore: a network partition between the
/// DNS server and its API server while the cluster itself keeps working.
struct Proxy {
    addr: SocketAddr,
    cut: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    fn start(server: String) -> Self {
        let target: SocketAddr = server.trim_start_matches("https://").parse().expect("server address");
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        let addr = listener.local_addr().expect("proxy address");
        let cut = Arc::new(AtomicBool::new(false));
        let open: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (c, o) = (cut.clone(), open.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().map_while(Result::ok) {
                if c.load(Ordering::SeqCst) {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(upstream) = TcpStream::connect(target) else { continue };
                for s in [&client, &upstream] {
                    if let Ok(s) = s.try_clone() {
                        o.lock().expect("lock").push(s);
                    }
                }
                for (mut from, mut to) in [
                    (client.try_clone().expect("clone"), upstream.try_clone().expect("clone")),
                    (upstream, client),
                ] {
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 16384];
                        while let Ok(n) = from.read(&mut buf) {
                            if n == 0 || to.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                        let _ = to.shutdown(Shutdown::Both);
                    });
                }
            }
        });
        Self { addr, cut, open }
    }

    /// A copy of `kubeconfig` that reaches `server` through the proxy.
    fn kubeconfig(&self, kubeconfig: &Path, server: &str) -> PathBuf {
        let text = std::fs::read_to_string(kubeconfig).expect("kubeconfig");
        let path = kubeconfig.with_file_name(format!("proxied-{}.kubeconfig", self.addr.port()));
        std::fs::write(&path, text.replace(server, &format!("https://{}", self.addr)))
            .expect("write kubeconfig");
        path
    }

    fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        for s in self.open.lock().expect("lock").drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    fn restore(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

/// Applies every document of a fixture of `tests/data/interop/` into `ns`
/// as the fleet manager would have written it; Services get their cluster
/// IP from this API server (the fixture's are another cluster's). Returns
/// the allocated cluster IP of each Service, by name.
async fn apply_fixture(
    client: kube::Client,
    ns: &str,
    text: &str,
) -> std::collections::BTreeMap<String, String> {
    use k8s_openapi::api::core::v1::Service;
    use serde::Deserialize;
    Kube::new(client.clone(), ns).await;
    let mut ips = std::collections::BTreeMap::new();
    // The MultiClusterService's namespace is the Service's own.
    let text = text.replace(
        "multiclusterservice.karmada.io/namespace: shop",
        &format!("multiclusterservice.karmada.io/namespace: {ns}"),
    );
    for doc in serde_yaml_ng::Deserializer::from_str(&text) {
        let mut v: Value = Value::deserialize(doc).expect("fixture document");
        v["metadata"]["namespace"] = json!(ns);
        let name = v["metadata"]["name"].as_str().expect("name").to_owned();
        let ar = match v["kind"].as_str().expect("kind") {
            "ServiceImport" => {
                import_resource(v["apiVersion"].as_str().expect("version").rsplit('/').next().expect("v"))
            }
            "Service" => {
                if v["spec"]["clusterIP"] != json!("None") {
                    let spec = v["spec"].as_object_mut().expect("spec");
                    spec.remove("clusterIP");
                    spec.remove("clusterIPs");
                }
                ApiResource::erase::<Service>(&())
            }
            "EndpointSlice" => ApiResource::erase::<EndpointSlice>(&()),
            other => panic!("unexpected kind {other} in fixture"),
        };
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &ar);
        let applied = api
            .patch(&name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&v))
            .await
            .unwrap_or_else(|e| panic!("apply {name}: {e}"));
        if let Some(ip) = applied.data["spec"]["clusterIP"].as_str() {
            ips.insert(name, ip.to_owned());
        }
    }
    ips
}

/// The least-privilege identity of `serve --interop` in shared cluster `i`:
/// a ServiceAccount with exactly serve's ClusterRole (deploy/serve) and the
/// ClusterRole of deploy/interop, so a rule missing from either fails the
/// test. Its own account, so serve's identity in other tests keeps serve's
/// rules only. Returns its kubeconfig.
fn interop_kubeconfig(clusters: &TestClusters, i: usize) -> PathBuf {
    let rbac =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/interop/rbac.yaml"))
            .expect("read deploy/interop/rbac.yaml");
    let role = rbac
        .split("\n---")
        .find(|doc| doc.contains("kind: ClusterRole\n"))
        .expect("deploy/interop/rbac.yaml has a ClusterRole");
    let bind = |name: &str, role: &str| {
        format!(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: {name}\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: ClusterRole\n  name: {role}\nsubjects:\n- kind: ServiceAccount\n  name: clusterset-dns-interop\n  namespace: clusterset-dns\n"
        )
    };
    let docs = [
        role.trim().to_owned(),
        "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: clusterset-dns-interop\n  namespace: clusterset-dns\n".into(),
        bind("clusterset-dns-interop-serve", "clusterset-dns-serve"),
        bind("clusterset-dns-interop", "clusterset-dns-serve-interop"),
    ]
    .join("\n---\n");
    let admin = clusters.kubeconfig(i);
    let kubectl = |args: &[&str], stdin: &str| {
        let mut child = std::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&admin)
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("kubectl");
        child.stdin.take().expect("stdin").write_all(stdin.as_bytes()).expect("write stdin");
        let out = child.wait_with_output().expect("kubectl ran");
        assert!(out.status.success(), "kubectl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    kubectl(&["apply", "--server-side", "--field-manager=tests", "-f", "-"], &docs);
    let token =
        kubectl(&["create", "token", "clusterset-dns-interop", "-n", "clusterset-dns", "--duration=2h"], "");
    // serve's kubeconfig (server, CA), with this account's token.
    let serve = std::fs::read_to_string(clusters.serve_kubeconfig(i)).expect("read serve kubeconfig");
    let text: String = serve
        .lines()
        .map(|l| match l.split_once("token: ") {
            Some((indent, _)) => format!("{indent}token: {token}\n"),
            None => format!("{l}\n"),
        })
        .collect();
    let path = clusters.dir().join(format!("interop-{i}.kubeconfig"));
    std::fs::write(&path, text).expect("write interop kubeconfig");
    path
}

/// Applies the fixture `yaml` into `ns` of shared cluster `i` and serves
/// that namespace with `--interop shapes` as its least-privilege identity;
/// returns the server, once ready, and the fixture's allocated ClusterIPs.
fn serve_interop(
    rt: &tokio::runtime::Runtime,
    clusters: &TestClusters,
    i: usize,
    ns: &str,
    yaml: &str,
    shapes: &str,
) -> (Served, std::collections::BTreeMap<String, String>) {
    let ips = rt.block_on(async { apply_fixture(clusters.client(i).await, ns, yaml).await });
    let kubeconfig = interop_kubeconfig(clusters, i);
    let args = ["--kubeconfig", kubeconfig.to_str().expect("path"), "--namespace", ns, "--interop", shapes];
    let s = Served::start(&args);
    wait_ready(&s);
    (s, ips)
}

/// Karmada's member-cluster objects (tests/data/interop/karmada.yaml) on a
/// real API server: the derived Service's cluster IP for the import without
/// `ips`, the collected slices for the headless import and its hostnames,
/// the CrossCluster Service; the same answers as the files (interop.rs).
#[test]
fn karmada_member_objects_are_answered_from_the_api() {
    let clusters = shared();
    let rt = runtime();
    let ns = "interop-karmada";
    let (s, ips) = serve_interop(&rt, clusters, 0, ns, crate::interop::KARMADA, "karmada");
    let name = |svc: &str| format!("{svc}.{ns}.svc.clusterset.local");
    eventually("derived Service's cluster IP served", || {
        short(&s, &name("web"), "A") == [ips["derived-web"].clone()]
    });
    assert_eq!(short(&s, &name("db"), "A"), ["10.244.1.31", "10.244.1.32"]);
    assert_eq!(short(&s, &format!("db-1.member1.{}", name("db")), "A"), ["10.244.1.32"]);
    assert_eq!(short(&s, &name("cache"), "A"), [ips["cache"].clone()]);
    // The conflict rule: the import's own ips win over the derived Service.
    let k = rt.block_on(async { Kube::new(clusters.client(0).await, ns).await });
    rt.block_on(k.import_as("v1alpha1", "web", vip(&["10.77.5.5"])));
    eventually("import ips win", || short(&s, &name("web"), "A") == ["10.77.5.5"]);
}

/// Kosmos's leaf-cluster objects (tests/data/interop/kosmos.yaml) on a real
/// API server: the same-name Service's cluster IP, the copied slices for
/// the headless Service with the disconnected address demoted, and a change
/// of `kosmos.io/disconnected-address` followed live.
#[test]
fn kosmos_leaf_objects_are_answered_from_the_api() {
    let clusters = shared();
    let rt = runtime();
    let ns = "interop-kosmos";
    let (s, ips) = serve_interop(&rt, clusters, 1, ns, crate::interop::KOSMOS, "kosmos");
    let name = |svc: &str| format!("{svc}.{ns}.svc.clusterset.local");
    eventually("same-name Service's cluster IP served", || {
        short(&s, &name("web"), "A") == [ips["web"].clone()]
    });
    assert_eq!(short(&s, &name("db"), "A"), ["10.233.64.31"]);
    // The probe now finds the other Pod unreachable instead.
    rt.block_on(async {
        let api: Api<DynamicObject> =
            Api::namespaced_with(clusters.client(1).await, ns, &import_resource("v1alpha1"));
        let patch = json!({"metadata": {"annotations": {"kosmos.io/disconnected-address": "10.233.64.31"}}});
        api.patch("db", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("annotate");
    });
    eventually("disconnected address followed", || short(&s, &name("db"), "A") == ["10.233.65.32"]);
}
