//! `clusterset-dns setup-dns` (the real binary) against a real API server
//! of its own (it edits `kube-system`, which the shared clusters' tests
//! must not see): each DNS layout as the distributions ship it
//! (tests/data/setup-dns/), the change written once and only once, taken
//! out again exactly, unknown layouts left alone; and the kubeadm Corefile
//! it patched run by a real CoreDNS that must then forward the clusterset
//! zone to a real clusterset-dns (the proof query through it).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;

use crate::coredns::{coredns_bin, free_port, spawn_coredns};
use crate::harness::BIN;
use crate::harness::clusters::TestClusters;
use crate::harness::served::Served;
use crate::watch::runtime;

fn fixture(name: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/setup-dns").join(name))
        .expect("read fixture")
}

/// `setup-dns` with `args`: (exit code, stdout).
fn setup(clusters: &TestClusters, args: &[&str]) -> (i32, String) {
    let out = Command::new(BIN)
        .arg("setup-dns")
        .arg("--kubeconfig")
        .arg(clusters.kubeconfig(0))
        .args(args)
        .output()
        .expect("run clusterset-dns setup-dns");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!(
        "setup-dns {args:?} → {:?}\n{stdout}{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), stdout)
}

struct KubeSystem {
    cms: Api<ConfigMap>,
    deployments: Api<Deployment>,
}

impl KubeSystem {
    async fn put(&self, name: &str, data: serde_json::Value) {
        let body = json!({"apiVersion": "v1", "kind": "ConfigMap",
                          "metadata": {"name": name, "namespace": "kube-system"}, "data": data});
        self.cms
            .patch(name, &PatchParams::apply("tests").force(), &Patch::Apply(&body))
            .await
            .expect("apply");
    }

    async fn get(&self, name: &str, key: &str) -> Option<String> {
        self.cms.get_opt(name).await.expect("get")?.data?.get(key).cloned()
    }

    async fn delete_all(&self) {
        for name in ["coredns", "coredns-custom", "kube-dns", "node-local-dns", "rke2-coredns-rke2-coredns"] {
            let _ = self.cms.delete(name, &DeleteParams::default()).await;
        }
        let _ = self.deployments.delete("kube-dns", &DeleteParams::default()).await;
    }
}

#[test]
fn every_layout_gets_its_change_once_and_loses_it_exactly_and_coredns_then_forwards_to_us() {
    let clusters = TestClusters::start(1);
    let rt = runtime();
    let k = rt.block_on(async {
        let client = clusters.client(0).await;
        KubeSystem {
            cms: Api::namespaced(client.clone(), "kube-system"),
            deployments: Api::namespaced(client, "kube-system"),
        }
    });
    let ours = Served::start(&[]);
    let server = ours.addr.to_string();
    let no_verify = ["--server", server.as_str(), "--no-verify"];

    // Nothing recognisable: nothing written, the block to add by hand shown.
    let (code, out) = setup(&clusters, &no_verify);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("nothing was changed") && out.contains(&format!("forward . {server}")), "{out}");
    assert!(rt.block_on(k.get("coredns-custom", "clusterset.server")).is_none());

    // kubeadm: a marked block; again: no change; --remove: byte for byte back.
    let kubeadm = fixture("kubeadm.Corefile");
    rt.block_on(k.put("coredns", json!({"Corefile": kubeadm})));
    let (code, out) = setup(&clusters, &["--server", &server, "--dry-run"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("+clusterset.local:53 {") && out.contains("dry run"), "{out}");
    assert_eq!(rt.block_on(k.get("coredns", "Corefile")).as_deref(), Some(kubeadm.as_str()), "dry run wrote");
    let (code, out) = setup(&clusters, &no_verify);
    assert_eq!(code, 0, "{out}");
    let patched = rt.block_on(k.get("coredns", "Corefile")).expect("Corefile");
    assert!(patched.starts_with(&kubeadm) && patched.contains(&format!("forward . {server}")), "{patched}");
    let (code, out) = setup(&clusters, &no_verify);
    assert!(code == 0 && out.contains("no change"), "{out}");
    assert_eq!(rt.block_on(k.get("coredns", "Corefile")), Some(patched.clone()));

    // The patched Corefile, run by CoreDNS (on loopback, against this API
    // server), forwards the zone to clusterset-dns: setup-dns proves it.
    let conf = runnable(&patched, &clusters.kubeconfig(0));
    let port = free_port();
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut coredns, log) =
        spawn_coredns(coredns_bin(), dir.path(), &conf.replace("{PORT}", &port.to_string()));
    let deadline = Instant::now() + Duration::from_secs(30);
    while !log.lock().expect("log").contains(&format!(":{port} on 127.0.0.1")) {
        assert!(Instant::now() < deadline, "CoreDNS did not start:\n{}\n{conf}", log.lock().expect("log"));
        std::thread::sleep(Duration::from_millis(50));
    }
    let at = format!("127.0.0.1:{port}");
    let (code, out) = setup(&clusters, &["--server", &server, "--verify", &at, "--verify-timeout", "30"]);
    let _ = coredns.kill();
    let _ = coredns.wait();
    assert_eq!(code, 0, "{out}\n{}", log.lock().expect("log"));
    assert!(out.contains("proven: dns-version.clusterset.local. TXT \"1.0.0\""), "{out}");
    // Not forwarding: the proof fails and says why (here: nobody answers).
    let silent = format!("127.0.0.1:{}", free_port());
    let (code, out) = setup(&clusters, &["--server", &server, "--verify", &silent, "--verify-timeout", "2"]);
    assert!(code == 1 && out.contains("not proven"), "{out}");

    // NodeLocal DNSCache: a block there too, with its bind line.
    rt.block_on(k.put("node-local-dns", json!({"Corefile": fixture("node-local-dns.Corefile")})));
    let (code, out) = setup(&clusters, &no_verify);
    assert_eq!(code, 0, "{out}");
    let local = rt.block_on(k.get("node-local-dns", "Corefile")).expect("Corefile");
    assert!(local.contains("clusterset.local:53 {\n    bind 169.254.20.10 10.96.0.10\n"), "{local}");
    let (code, out) = setup(&clusters, &["--server", &server, "--remove"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(rt.block_on(k.get("coredns", "Corefile")), Some(kubeadm.clone()), "removed exactly");
    assert_eq!(rt.block_on(k.get("node-local-dns", "Corefile")), Some(fixture("node-local-dns.Corefile")));

    // k3s (and AKS): a key of coredns-custom, created; the Corefile untouched.
    rt.block_on(k.delete_all());
    rt.block_on(k.put("coredns", json!({"Corefile": fixture("k3s.Corefile")})));
    let (code, out) = setup(&clusters, &no_verify);
    assert!(code == 0 && out.contains("coredns-custom"), "{out}");
    let custom = rt.block_on(k.get("coredns-custom", "clusterset.server")).expect("key written");
    assert!(custom.starts_with("clusterset.local:53 {"), "{custom}");
    assert_eq!(rt.block_on(k.get("coredns", "Corefile")), Some(fixture("k3s.Corefile")));
    let (code, _) = setup(&clusters, &["--server", &server, "--remove"]);
    assert_eq!(code, 0);
    assert!(rt.block_on(k.get("coredns-custom", "clusterset.server")).is_none());

    // GKE kube-dns: stubDomains, the others kept.
    rt.block_on(k.delete_all());
    rt.block_on(async {
        let d = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "kube-dns", "namespace": "kube-system"},
            "spec": {"selector": {"matchLabels": {"k8s-app": "kube-dns"}},
                     "template": {"metadata": {"labels": {"k8s-app": "kube-dns"}},
                                  "spec": {"containers": [{"name": "kubedns", "image": "registry.k8s.io/dns/k8s-dns-kube-dns:1.23.0"}]}}}});
        k.deployments.patch("kube-dns", &PatchParams::apply("tests").force(), &Patch::Apply(&d)).await.expect("deployment");
        k.put("kube-dns", json!({"stubDomains": r#"{"acme.local": ["1.2.3.4"]}"#})).await;
    });
    let (code, out) = setup(&clusters, &no_verify);
    assert!(code == 0 && out.contains("kube-dns stubDomains"), "{out}");
    let stub: serde_json::Value =
        serde_json::from_str(&rt.block_on(k.get("kube-dns", "stubDomains")).expect("stubDomains"))
            .expect("json");
    assert_eq!(stub, json!({"acme.local": ["1.2.3.4"], "clusterset.local": [server]}));

    // OpenShift: the DNS operator's servers (its CRD as a minimal stand-in
    // for the operator's, which owns the Corefile), other entries kept.
    rt.block_on(k.delete_all());
    rt.block_on(async {
        let client = clusters.client(0).await;
        let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
            Api::all(client.clone());
        let crd = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "dnses.operator.openshift.io"},
            "spec": {"group": "operator.openshift.io", "scope": "Cluster",
                     "names": {"plural": "dnses", "singular": "dns", "kind": "DNS", "listKind": "DNSList"},
                     "versions": [{"name": "v1", "served": true, "storage": true,
                                   "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}});
        crds.patch("dnses.operator.openshift.io", &PatchParams::apply("tests").force(), &Patch::Apply(&crd))
            .await
            .expect("CRD");
        let ar = kube::api::ApiResource {
            group: "operator.openshift.io".into(),
            version: "v1".into(),
            api_version: "operator.openshift.io/v1".into(),
            kind: "DNS".into(),
            plural: "dnses".into(),
        };
        let dns: Api<kube::api::DynamicObject> = Api::all_with(client, &ar);
        let body = json!({"apiVersion": "operator.openshift.io/v1", "kind": "DNS", "metadata": {"name": "default"},
            "spec": {"servers": [{"name": "corp", "zones": ["corp.example"], "forwardPlugin": {"upstreams": ["192.0.2.1"]}}]}});
        // The CRD serves once established: retry the create briefly.
        let deadline = Instant::now() + Duration::from_secs(20);
        while let Err(e) = dns.patch("default", &PatchParams::apply("tests").force(), &Patch::Apply(&body)).await {
            assert!(Instant::now() < deadline, "DNS default: {e}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let (code, out) = setup(&clusters, &no_verify);
        assert!(code == 0 && out.contains("OpenShift DNS operator"), "{out}");
        let o = dns.get("default").await.expect("DNS default");
        let servers = o.data["spec"]["servers"].as_array().cloned().unwrap_or_default();
        assert_eq!(servers.len(), 2, "{servers:?}");
        assert_eq!(servers[0]["name"], "corp", "other servers kept");
        assert_eq!(servers[1]["forwardPlugin"]["upstreams"][0], server.as_str());
        assert_eq!(servers[1]["zones"][0], "clusterset.local");
        let (code, out) = setup(&clusters, &["--server", &server, "--remove"]);
        assert_eq!(code, 0, "{out}");
        let o = dns.get("default").await.expect("DNS default");
        assert_eq!(o.data["spec"]["servers"].as_array().map(Vec::len), Some(1), "{o:?}");
        crds.delete("dnses.operator.openshift.io", &DeleteParams::default()).await.expect("delete CRD");
    });

    // RKE2: Helm owns its ConfigMap: nothing written, the chart values shown.
    rt.block_on(k.delete_all());
    rt.block_on(k.put("rke2-coredns-rke2-coredns", json!({"Corefile": fixture("kubeadm.Corefile")})));
    let (code, out) = setup(&clusters, &no_verify);
    assert!(code == 2 && out.contains("HelmChartConfig") && out.contains("nothing was changed"), "{out}");
    assert_eq!(
        rt.block_on(k.get("rke2-coredns-rke2-coredns", "Corefile")),
        Some(fixture("kubeadm.Corefile"))
    );
    rt.block_on(k.delete_all());
}

/// The kubeadm Corefile as a cluster runs it, made runnable on loopback:
/// every server block on `{PORT}` bound to 127.0.0.1, the kubernetes plugin
/// pointed at `kubeconfig`, the HTTP plugins on free loopback ports, and
/// `loop` left out (it probes the host's resolver, which is not ours to
/// depend on). The block setup-dns added is kept as written.
fn runnable(corefile: &str, kubeconfig: &Path) -> String {
    let mut out = String::new();
    for line in corefile.lines() {
        let t = line.trim();
        if !line.starts_with(' ') && t.ends_with('{') && t.contains(":53") {
            out.push_str(&line.replace(":53", ":{PORT}"));
            out.push_str("\n    bind 127.0.0.1\n");
            continue;
        }
        match t {
            "loop" => continue,
            "ready" => out.push_str(&format!("    ready 127.0.0.1:{}\n", free_port())),
            "health {" => out.push_str(&format!("    health 127.0.0.1:{} {{\n", free_port())),
            "prometheus :9153" => out.push_str("    prometheus 127.0.0.1:0\n"),
            _ if t.starts_with("kubernetes ") => {
                out.push_str(line);
                out.push_str(&format!("\n       kubeconfig {}\n", kubeconfig.display()));
            }
            _ => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}
