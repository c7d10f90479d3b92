//! `charts/clusterset-dns/`: `helm lint` passes for every shape; `helm
//! template` of every shape and of the notable values renders objects that a
//! real kube-apiserver accepts (`kubectl apply --dry-run=server`, client- and
//! server-side) in a namespace enforcing (and warning on) the `restricted` Pod
//! Security Standard; values that make no sense fail at `helm template` with a
//! message naming the value; every flag of `serve`, `sync` and `agent` is a
//! documented value that reaches the container's arguments; `helm install --dry-run`
//! prints the `dig` line to try; and the chart renders the same objects as
//! the kustomizations and manifests of `deploy/`, so the two never drift.
//!
//! helm is built from the Go module proxy by `scripts/k8s-bins.sh helm`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use serde_json::{Value, json};

use super::deploy::{apply_dry_run, deploy_dir, find, kubectl, kubectl_ok, objects, render, warnings};
use crate::harness::clusters::shared;

const BIN: &str = env!("CARGO_BIN_EXE_clusterset-dns");
/// The namespace the dry runs go to: PodSecurity `restricted`, enforced and warned.
const NS: &str = "chart-restricted";

fn chart_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/clusterset-dns")
}

/// helm, built (once, cached) by `scripts/k8s-bins.sh`.
fn helm_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/k8s-bins.sh");
        let out = Command::new(&script).arg("helm").output().expect("run scripts/k8s-bins.sh");
        assert!(
            out.status.success(),
            "scripts/k8s-bins.sh helm failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        let dir = stdout.lines().last().expect("k8s-bins.sh prints the bin directory").trim();
        let bin = Path::new(dir).join("helm");
        assert!(bin.is_file(), "{} missing", bin.display());
        bin
    })
}

/// Runs helm with its own (empty) configuration directories, so that no
/// repository or plugin of the machine's user takes part.
fn helm(args: &[&str]) -> Output {
    let home = std::env::temp_dir().join("clusterset-dns-helm-home");
    Command::new(helm_bin())
        .args(args)
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_DATA_HOME", home.join("data"))
        .output()
        .expect("run helm")
}

fn set_args(values: &[&str]) -> Vec<String> {
    values.iter().flat_map(|v| ["--set".to_owned(), (*v).to_owned()]).collect()
}

/// `helm template RELEASE charts/clusterset-dns -n NAMESPACE --set …`: the output or the error.
fn template(release: &str, namespace: &str, values: &[&str]) -> Result<String, String> {
    let chart = chart_dir();
    let mut args = vec!["template", release, chart.to_str().expect("UTF-8 path"), "--namespace", namespace];
    let sets = set_args(values);
    args.extend(sets.iter().map(String::as_str));
    let out = helm(&args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if out.status.success() {
        assert!(stderr.trim().is_empty(), "helm template {values:?} printed:\n{stderr}");
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(stderr)
    }
}

fn template_ok(release: &str, namespace: &str, values: &[&str]) -> String {
    template(release, namespace, values).unwrap_or_else(|e| panic!("helm template {values:?}: {e}"))
}

/// The container arguments of the chart's one Deployment.
fn args(objects: &[Value]) -> Vec<String> {
    let deployments: Vec<&Value> = objects.iter().filter(|o| o["kind"] == "Deployment").collect();
    assert_eq!(deployments.len(), 1, "one Deployment");
    deployments[0]["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("string argument").to_owned())
        .collect()
}

#[test]
fn helm_lint_passes_for_every_shape() {
    let chart = chart_dir();
    for shape in ["serve", "sync", "centralized", "agent"] {
        // The agent needs its member's name.
        let set = format!("shape={shape},agent.member=cluster-a");
        let out = helm(&["lint", "--strict", chart.to_str().expect("UTF-8 path"), "--set", &set]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("1 chart(s) linted, 0 chart(s) failed"),
            "helm lint --strict --set {set}:\n{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            !stdout.contains("[WARNING]") && !stdout.contains("[ERROR]"),
            "helm lint --set {set}:\n{stdout}"
        );
    }
}

/// A stand-in for the Prometheus Operator's ServiceMonitor CRD (group,
/// version, kind and scope as the operator's, any content), so that the API
/// server can take the chart's ServiceMonitor in a dry run.
fn install_service_monitor_crd(kubeconfig: &Path) {
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "servicemonitors.monitoring.coreos.com"},
        "spec": {"group": "monitoring.coreos.com", "scope": "Namespaced",
                 "names": {"plural": "servicemonitors", "singular": "servicemonitor",
                           "kind": "ServiceMonitor", "listKind": "ServiceMonitorList"},
                 "versions": [{"name": "v1", "served": true, "storage": true,
                               "schema": {"openAPIV3Schema": {"type": "object",
                                          "x-kubernetes-preserve-unknown-fields": true}}}]}});
    kubectl_ok(kubeconfig, &["apply", "--server-side", "-f", "-"], &crd.to_string());
    kubectl_ok(
        kubeconfig,
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/servicemonitors.monitoring.coreos.com",
        ],
        "",
    );
}

/// The namespace the rendered objects are applied to, enforcing the
/// `restricted` standard on pods and warning about workloads whose pod
/// template breaks it.
fn restricted_namespace(kubeconfig: &Path) {
    let namespace = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS, "labels": {
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": "latest",
        "pod-security.kubernetes.io/warn": "restricted",
        "pod-security.kubernetes.io/warn-version": "latest"}}});
    kubectl_ok(kubeconfig, &["apply", "--server-side", "-f", "-"], &namespace.to_string());
}

#[test]
fn every_shape_renders_and_the_api_server_admits_it_under_restricted() {
    let kubeconfig = shared().kubeconfig(0);
    restricted_namespace(&kubeconfig);
    install_service_monitor_crd(&kubeconfig);
    let cases: &[&[&str]] = &[
        &[],
        &["autoscaling.enabled=true", "serviceMonitor.enabled=true", "cookieSecret.secretName=dns-cookie"],
        &["serve.listen={0.0.0.0:53,[::]:53}", "serve.probe=true", "serve.answerPolicy=local-first"],
        &["crds.install=true"],
        &["workload.enabled=false"],
        &["shape=sync"],
        &["shape=sync", "serviceMonitor.enabled=true", "sync.onMemberLost=remove", "logFormat=json"],
        &["shape=sync", "replicas=1", "sync.noLeaderElection=true", "rbac.member=false"],
        &["shape=sync", "workload.enabled=false"],
        &["shape=centralized"],
        &["shape=centralized", "rbac.member=false", "autoscaling.enabled=true"],
        &["shape=centralized", "workload.enabled=false"],
        &["shape=agent", "agent.member=cluster-a"],
        &[
            "shape=agent",
            "agent.member=cluster-a",
            "serviceMonitor.enabled=true",
            "agent.onMemberLost=remove",
            "agent.hubKubeconfigSecret=hub-a",
        ],
        &["shape=agent", "agent.member=cluster-a", "replicas=1", "agent.noLeaderElection=true"],
        &["shape=agent", "workload.enabled=false"],
    ];
    for values in cases {
        let yaml = template_ok("dns", NS, values);
        let objects = objects(&yaml);
        assert!(!objects.is_empty(), "{values:?} renders nothing");
        for o in &objects {
            let ns = &o["metadata"]["namespace"];
            assert!(ns.is_null() || ns == NS, "{values:?}: {} in namespace {ns}", o["kind"]);
        }
        apply_dry_run(&kubeconfig, &format!("helm template --set {values:?}"), &yaml);
        // The pod itself, as the ReplicaSet would create it: PodSecurity enforces.
        if let Some(d) = objects.iter().find(|o| o["kind"] == "Deployment") {
            let pod = json!({"apiVersion": "v1", "kind": "Pod",
                             "metadata": {"name": "chart-pod", "namespace": NS},
                             "spec": d["spec"]["template"]["spec"]});
            let (_, stderr) =
                kubectl_ok(&kubeconfig, &["create", "--dry-run=server", "-f", "-"], &pod.to_string());
            assert!(warnings(&stderr).is_empty(), "{values:?}: {stderr}");
            // Every flag given exists (the real binary's help).
            let args = args(&objects);
            let help =
                Command::new(BIN).args([&args[0], "--help"]).output().expect("run clusterset-dns --help");
            let help = String::from_utf8_lossy(&help.stdout);
            for flag in args.iter().filter(|a| a.starts_with("--")) {
                let listed = help.lines().any(|l| {
                    l.trim_start()
                        .strip_prefix(flag.as_str())
                        .is_some_and(|r| r.is_empty() || r.starts_with(' '))
                });
                assert!(listed, "clusterset-dns {} has no {flag}", args[0]);
            }
        }
    }
}

/// As a control for the test above: a pod the chart would never render is
/// refused in that namespace, and a Deployment of it draws a warning.
#[test]
fn the_restricted_namespace_refuses_a_pod_with_more_capabilities() {
    let kubeconfig = shared().kubeconfig(0);
    restricted_namespace(&kubeconfig);
    let objects = objects(&template_ok("dns", NS, &[]));
    let mut deployment = find(&objects, "Deployment", "dns-clusterset-dns").clone();
    deployment["spec"]["template"]["spec"]["containers"][0]["securityContext"]["capabilities"]["add"] =
        json!(["NET_BIND_SERVICE", "NET_RAW"]);
    let (_, stderr) =
        kubectl_ok(&kubeconfig, &["apply", "--dry-run=server", "-f", "-"], &deployment.to_string());
    assert!(stderr.contains("would violate PodSecurity"), "no PodSecurity warning: {stderr}");
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "chart-pod", "namespace": NS},
                     "spec": deployment["spec"]["template"]["spec"]});
    let out = kubectl(&kubeconfig, &["create", "--dry-run=server", "-f", "-"], &pod.to_string());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("violates PodSecurity"),
        "NET_RAW was admitted: {stderr}"
    );
}

#[test]
fn values_that_make_no_sense_fail_naming_the_value() {
    let cases: &[(&[&str], &[&str])] = &[
        (&["replicas=0"], &["replicas: 0", "podDisruptionBudget"]),
        (&["replicas=1"], &["replicas: 1", "podDisruptionBudget"]),
        (&["serve.answerPolicy=nearest"], &["/serve/answerPolicy"]),
        (&["shape=everywhere"], &["/shape"]),
        (&["shape=sync", "sync.onMemberLost=forget"], &["/sync/onMemberLost"]),
        (&["shape=sync", "autoscaling.enabled=true"], &["autoscaling.enabled"]),
        (&["shape=sync", "sync.noLeaderElection=true"], &["sync.noLeaderElection", "replicas: 2"]),
        (
            &["shape=sync", "replicas=1", "sync.noLeaderElection=true", "sync.shards=4"],
            &["sync.shards: 4", "noLeaderElection"],
        ),
        (&["shape=sync", "sync.shards=65"], &["/sync/shards"]),
        (&["serve.lameduck=30"], &["serve.lameduck: 30", "terminationGracePeriodSeconds: 30"]),
        (&["serve.listen={53}"], &["/serve/listen/0"]),
        (&["serve.ttl=-1"], &["/serve/ttl"]),
        // The binary's own ranges and names, refused before a pod would be.
        (&["serve.rrlSlip=11"], &["/serve/rrlSlip"]),
        (&["serve.tcpIoTimeout=61"], &["/serve/tcpIoTimeout"]),
        (&["serve.clusterDeadAfter=0"], &["/serve/clusterDeadAfter"]),
        (&["serve.interop=istio"], &["/serve/interop"]),
        (&["shape=sync", "sync.leaseDuration=4"], &["/sync/leaseDuration"]),
        (&["serve.zoen=example.org"], &["zoen"]),
        (&["logFormat=xml"], &["/logFormat"]),
        (&["shape=agent"], &["agent.member", "hub enrol"]),
        (&["shape=agent", "agent.member=Cluster_A"], &["/agent/member"]),
        (&["shape=agent", "agent.member=a", "autoscaling.enabled=true"], &["autoscaling.enabled"]),
        (
            &["shape=agent", "agent.member=a", "agent.noLeaderElection=true"],
            &["agent.noLeaderElection", "replicas: 2"],
        ),
        // An agent writes one member: its replicas share one Lease.
        (&["shape=agent", "agent.member=a", "agent.shards=2"], &["shards"]),
    ];
    for (values, names) in cases {
        let Err(err) = template("dns", NS, values) else { panic!("{values:?} rendered") };
        for name in *names {
            assert!(err.contains(name), "helm template {values:?} failed without naming {name}:\n{err}");
        }
    }
    // And the sensible neighbours of those render.
    for values in [
        &["replicas=0", "podDisruptionBudget.enabled=false"][..],
        &["shape=sync", "replicas=1"],
        &["shape=sync", "replicas=3", "sync.shards=4"],
        &["serve.interop=karmada\\,kosmos", "serve.tcpIoTimeout=60", "serve.rrlSlip=10"],
        &["shape=agent", "workload.enabled=false"],
        &["shape=agent", "agent.member=a", "replicas=1", "agent.noLeaderElection=true"],
    ] {
        template_ok("dns", NS, values);
    }
}

/// The flags of `clusterset-dns SUBCOMMAND --help`, with their placeholder
/// (empty for switches).
fn flags(subcommand: &str) -> Vec<(String, String)> {
    let out = Command::new(BIN).args([subcommand, "--help"]).output().expect("run clusterset-dns --help");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let l = l.trim_start().strip_prefix("--")?;
            let (flag, rest) = l.split_once(' ').unwrap_or((l, ""));
            let placeholder = rest.strip_prefix('<').and_then(|r| r.split_once('>')).map(|(p, _)| p);
            Some((flag.to_owned(), placeholder.unwrap_or_default().to_owned()))
        })
        .filter(|(flag, _)| flag != "help")
        .collect()
}

/// `--foo-bar` is value `fooBar`.
fn camel(flag: &str) -> String {
    let mut out = String::new();
    let mut upper = false;
    for c in flag.chars() {
        match c {
            '-' => upper = true,
            c if upper => {
                out.extend(c.to_uppercase());
                upper = false;
            }
            c => out.push(c),
        }
    }
    out
}

/// A value of the right kind for a flag, as `--set` takes it, and the argument expected.
fn sample(flag: &str, placeholder: &str) -> (String, Option<String>) {
    let text = |v: &str| (v.to_owned(), Some(v.to_owned()));
    match (flag, placeholder) {
        (_, "") => ("true".to_owned(), None),
        ("max-udp-payload", _) => text("1400"),
        // With the sample --no-leader-election, more shards are refused.
        ("shards", _) => text("1"),
        ("rrl-slip", _) => text("3"),
        // `--set` splits at commas unless escaped.
        ("interop", _) => (r"karmada\,kosmos".to_owned(), Some("karmada,kosmos".to_owned())),
        ("listen", _) => ("{0.0.0.0:8053}".to_owned(), Some("0.0.0.0:8053".to_owned())),
        (_, "SECONDS" | "N" | "BYTES" | "PER_SECOND" | "BITS" | "K" | "M" | "QPS") => text("24"),
        (_, "BOOL") => text("false"),
        (_, "SIZE") => text("512Mi"),
        (_, "CIDR") => ("{10.1.0.0/16}".to_owned(), Some("10.1.0.0/16".to_owned())),
        (_, "IP") => ("{10.1.0.1}".to_owned(), Some("10.1.0.1".to_owned())),
        (_, "ADDR:PORT") => text("0.0.0.0:8053"),
        (_, "POLICY") => text("weighted"),
        (_, "SCOPE") => text("region"),
        ("on-member-lost", _) => text("remove"),
        ("on-memory-limit", _) => text("exit"),
        ("kube-encoding", _) => text("json"),
        ("list-mode", _) => text("stream"),
        ("otlp-endpoint", _) => text("http://otel-collector.monitoring:4318/v1/traces"),
        (_, "CIDR=NAME[/ZONE]") => ("{10.1.0.0/16=east}".to_owned(), Some("10.1.0.0/16=east".to_owned())),
        (_, "CLUSTER=REGION") => ("{east=eu}".to_owned(), Some("east=eu".to_owned())),
        ("namespace" | "auto-export-namespace-prefix", _) => {
            ("{team-a}".to_owned(), Some("team-a".to_owned()))
        }
        _ => text("sample-value"),
    }
}

/// Every flag of `serve`, `sync` and `agent` is a value under `serve:` /
/// `sync:` / `agent:` in values.yaml, with a comment naming the flag just above it, unless the
/// chart sets it from the shape; and a value given reaches the arguments.
#[test]
fn every_flag_is_a_documented_value() {
    let text = std::fs::read_to_string(chart_dir().join("values.yaml")).expect("read values.yaml");
    let lines: Vec<&str> = text.lines().collect();
    let set_by_chart: BTreeMap<&str, &[&str]> = BTreeMap::from([
        // Shapes: --in-cluster (serve), --members (centralized), from the Secret
        // of members: (cookieSecret: for --cookie-secret, through its variable).
        // --log-format: every shape's, the top-level logFormat (tested below).
        (
            "serve",
            &[
                "objects",
                "kubeconfig",
                "kube-context",
                "in-cluster",
                "cluster",
                "members",
                "cookie-secret",
                "log-format",
            ][..],
        ),
        ("sync", &["cluster", "members", "identity", "log-format"]),
        // The agent reaches its own cluster in cluster and elects there, on
        // one Lease (--shards above 1 is refused); the hub kubeconfig is the
        // mounted Secret of agent.hubKubeconfigSecret.
        ("agent", &["kubeconfig", "hub-kubeconfig", "identity", "log-format", "lease-kubeconfig", "shards"]),
    ]);
    for (subcommand, shape) in [("serve", "serve"), ("sync", "sync"), ("agent", "agent")] {
        let section =
            lines.iter().position(|l| *l == format!("{subcommand}:")).expect("section in values.yaml");
        let end = lines[section + 1..]
            .iter()
            .position(|l| !l.is_empty() && !l.starts_with(' '))
            .map_or(lines.len(), |i| section + 1 + i);
        let flags = flags(subcommand);
        assert!(flags.len() > 8, "{subcommand} --help lists {flags:?}");
        let mut sets = vec![
            format!("shape={shape}"),
            "replicas=1".to_owned(),
            "podDisruptionBudget.enabled=false".to_owned(),
        ];
        let mut expected = Vec::new();
        for (flag, placeholder) in &flags {
            if set_by_chart[subcommand].contains(&flag.as_str()) {
                continue;
            }
            let key = camel(flag);
            let at = (section + 1..end)
                .find(|&i| lines[i].trim_start().starts_with(&format!("{key}:")))
                .unwrap_or_else(|| panic!("values.yaml: {subcommand}.{key} (--{flag}) missing"));
            let comment: Vec<&str> =
                lines[..at].iter().rev().take_while(|l| l.trim_start().starts_with('#')).copied().collect();
            assert!(
                comment.iter().any(|l| l.contains(&format!("--{flag}:"))),
                "values.yaml: {subcommand}.{key} is not documented by a comment naming --{flag}"
            );
            let (value, arg) = sample(flag, placeholder);
            sets.push(format!("{subcommand}.{key}={value}"));
            expected.push((format!("--{flag}"), arg));
        }
        let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
        let args = args(&objects(&template_ok("dns", NS, &sets)));
        for (flag, arg) in expected {
            let found = args.windows(2).any(|w| w[0] == flag && arg.as_ref().is_none_or(|a| &w[1] == a))
                || (arg.is_none() && args.last() == Some(&flag));
            assert!(found, "{subcommand}: {flag} {arg:?} not in the arguments {args:?}");
        }
    }
}

/// `logFormat` is every shape's `--log-format`, a value `--help` lists;
/// unset, the binary's default (text) is left alone.
#[test]
fn log_format_reaches_every_shape() {
    for shape in ["serve", "sync", "centralized", "agent"] {
        let shape_value = format!("shape={shape},agent.member=cluster-a");
        let json = args(&objects(&template_ok("dns", NS, &[&shape_value, "logFormat=json"])));
        assert!(json.windows(2).any(|w| w[0] == "--log-format" && w[1] == "json"), "{shape}: {json:?}");
        let help = Command::new(BIN).args([&json[0], "--help"]).output().expect("run clusterset-dns --help");
        assert!(String::from_utf8_lossy(&help.stdout).contains("- json"), "{shape}: json is not listed");
        let unset = args(&objects(&template_ok("dns", NS, &[&shape_value])));
        assert!(!unset.iter().any(|a| a == "--log-format"), "{shape}: {unset:?}");
    }
}

/// Seconds may be fractions: from a values file (as users write them; YAML
/// numbers arrive in templates as floats) they reach the flags as written,
/// whole numbers without a decimal point; 0 is refused naming the value.
#[test]
fn fractional_seconds_reach_the_flags_as_written() {
    let dir = tempfile::tempdir().expect("temp dir");
    let render = |yaml: &str| {
        let file = dir.path().join("values.yaml");
        std::fs::write(&file, yaml).expect("write values");
        let chart = chart_dir();
        let (chart, file) = (chart.to_str().expect("UTF-8"), file.to_str().expect("UTF-8"));
        helm(&["template", "dns", chart, "--namespace", NS, "-f", file])
    };
    let out = render(
        "shape: serve\nserve: {probeRecheck: 0.25, probeInterval: 1.5, probeTimeout: 2, tcpIoTimeout: 0.5}\n",
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let args = args(&objects(&String::from_utf8_lossy(&out.stdout)));
    for (flag, value) in [
        ("--probe-recheck", "0.25"),
        ("--probe-interval", "1.5"),
        ("--probe-timeout", "2"),
        ("--tcp-io-timeout", "0.5"),
    ] {
        assert!(args.windows(2).any(|w| w[0] == flag && w[1] == value), "{flag} {value} not in {args:?}");
    }
    let out = render("shape: serve\nserve: {probeRecheck: 0}\n");
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && e.contains("probeRecheck"), "0 s: {e}");
}

/// `helm install --dry-run=server` against a real API server prints the
/// notes: for serve, the `dig` line to try, with the Service's name and the zone.
#[test]
fn the_notes_print_the_dig_line() {
    let kubeconfig = shared().kubeconfig(0);
    restricted_namespace(&kubeconfig);
    let chart = chart_dir();
    let kubeconfig = kubeconfig.to_str().expect("UTF-8 path").to_owned();
    for (values, wanted) in [
        (&["serve.zone=fleet.example"][..], &["dig @", "dns-clusterset-dns", "svc.fleet.example"][..]),
        (&["shape=centralized"], &["dig @", "load balancer"]),
        (&["shape=sync"], &["create secret generic dns-clusterset-dns-sync-members", "get lease"]),
        (
            &["shape=agent", "agent.member=cluster-a"],
            &[
                "hub enrol cluster-a",
                "create secret generic dns-clusterset-dns-agent-hub",
                "--from-file=kubeconfig=cluster-a.hub.kubeconfig",
                "get lease",
            ],
        ),
    ] {
        let mut args = vec![
            "install",
            "dns",
            chart.to_str().expect("UTF-8 path"),
            "--dry-run=server",
            "--namespace",
            NS,
        ];
        args.extend(["--kubeconfig", &kubeconfig]);
        let sets = set_args(values);
        args.extend(sets.iter().map(String::as_str));
        let out = helm(&args);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "helm {args:?}: {stdout}{}", String::from_utf8_lossy(&out.stderr));
        let notes =
            stdout.split_once("NOTES:").map(|(_, n)| n).unwrap_or_else(|| panic!("no NOTES:\n{stdout}"));
        for w in wanted {
            assert!(notes.contains(w), "{values:?}: the notes lack {w:?}:\n{notes}");
        }
    }
}

/// Label keys Helm adds that kustomize does not (release and chart bookkeeping).
const HELM_LABELS: [&str; 4] = [
    "app.kubernetes.io/instance",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/version",
    "helm.sh/chart",
];

fn without_helm_labels(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !HELM_LABELS.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), without_helm_labels(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(without_helm_labels).collect()),
        v => v.clone(),
    }
}

fn by_name(objects: &[Value]) -> BTreeMap<(String, String), Value> {
    objects
        .iter()
        .filter(|o| o["kind"] != "Namespace")
        .map(|o| {
            let kind = o["kind"].as_str().expect("kind").to_owned();
            let name = o["metadata"]["name"].as_str().expect("name").to_owned();
            ((kind, name), without_helm_labels(o))
        })
        .collect()
}

/// One source of truth: every kustomization and manifest of `deploy/` is
/// what the chart renders for the same shape (release `clusterset-dns` in
/// namespace `clusterset-dns`, the image tag `latest` of the kustomize
/// placeholder), object by object and field by field, except the labels
/// Helm adds and the Namespace, which Helm leaves to `--create-namespace`.
#[test]
fn the_chart_and_deploy_render_the_same_objects() {
    let kubeconfig = shared().kubeconfig(0);
    let file = |path: &str| std::fs::read_to_string(deploy_dir().join(path)).expect("read deploy/ file");
    let cases: [(&str, String, &[&str]); 9] = [
        ("deploy/base", render(&kubeconfig, &deploy_dir().join("base")), &[]),
        (
            "deploy/examples/hpa",
            render(&kubeconfig, &deploy_dir().join("examples/hpa")),
            &["autoscaling.enabled=true"],
        ),
        ("deploy/overlays/sync", render(&kubeconfig, &deploy_dir().join("overlays/sync")), &["shape=sync"]),
        (
            "deploy/overlays/centralized",
            render(&kubeconfig, &deploy_dir().join("overlays/centralized")),
            &["shape=centralized", "rbac.member=false"],
        ),
        ("deploy/serve/rbac.yaml", file("serve/rbac.yaml"), &["workload.enabled=false"]),
        ("deploy/sync/rbac.yaml", file("sync/rbac.yaml"), &["shape=sync", "workload.enabled=false"]),
        (
            "deploy/overlays/agent",
            render(&kubeconfig, &deploy_dir().join("overlays/agent")),
            &["shape=agent", "agent.member=cluster-a"],
        ),
        ("deploy/agent/rbac.yaml", file("agent/rbac.yaml"), &["shape=agent", "workload.enabled=false"]),
        (
            "deploy/centralized/rbac.yaml",
            file("centralized/rbac.yaml"),
            &["shape=centralized", "workload.enabled=false"],
        ),
    ];
    for (what, kustomized, values) in cases {
        let mut values = values.to_vec();
        values.push("image.tag=latest");
        let chart = by_name(&objects(&template_ok("clusterset-dns", "clusterset-dns", &values)));
        let deploy = by_name(&objects(&kustomized));
        assert_eq!(
            deploy.keys().collect::<Vec<_>>(),
            chart.keys().collect::<Vec<_>>(),
            "{what} and the chart with {values:?} hold different objects"
        );
        for (key, object) in &deploy {
            assert_eq!(object, &chart[key], "{what}: {key:?} differs from the chart's with {values:?}");
        }
    }
    // The CRDs: the chart's copies are deploy/crds/ byte for byte, rendered
    // with the annotation that keeps them on uninstall.
    let rendered = objects(&template_ok("clusterset-dns", "clusterset-dns", &["crds.install=true"]));
    let mut names = Vec::new();
    for entry in std::fs::read_dir(deploy_dir().join("crds")).expect("read deploy/crds") {
        let path = entry.expect("entry").path();
        let name = path.file_name().expect("file name").to_string_lossy().into_owned();
        let copy = chart_dir().join("files/crds").join(&name);
        let ours = std::fs::read_to_string(&path).expect("read CRD");
        assert_eq!(
            std::fs::read_to_string(&copy).unwrap_or_default(),
            ours,
            "charts/clusterset-dns/files/crds/{name} is not deploy/crds/{name}: cp deploy/crds/*.yaml charts/clusterset-dns/files/crds/"
        );
        let crd = &objects(&ours)[0];
        let mut expected = crd.clone();
        expected["metadata"]["annotations"]["helm.sh/resource-policy"] = json!("keep");
        let name = crd["metadata"]["name"].as_str().expect("CRD name");
        assert_eq!(find(&rendered, "CustomResourceDefinition", name), &expected, "{name}");
        names.push(name.to_owned());
    }
    let copies = std::fs::read_dir(chart_dir().join("files/crds")).expect("read files/crds").count();
    assert_eq!(copies, names.len(), "charts/clusterset-dns/files/crds/ holds files deploy/crds/ does not");
    assert_eq!(rendered.iter().filter(|o| o["kind"] == "CustomResourceDefinition").count(), names.len());
}

/// `setupDns.watch.enabled`: a one-replica `setup-dns --watch` Deployment
/// whose flags exist, admitted under restricted, with a Role in
/// kube-system that writes only in reapply mode and only the ConfigMaps
/// it wires, by name.
#[test]
fn setup_dns_watch_is_a_small_deployment_with_only_the_rbac_it_needs() {
    let kubeconfig = shared().kubeconfig(0);
    restricted_namespace(&kubeconfig);
    for (mode, writes) in [("reapply", true), ("report", false)] {
        let mode_value = format!("setupDns.watch.mode={mode}");
        let yaml = template_ok(
            "dns",
            NS,
            &["setupDns.watch.enabled=true", &mode_value, "setupDns.watch.interval=5"],
        );
        let objects = objects(&yaml);
        let d = objects
            .iter()
            .find(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == "dns-clusterset-dns-setup-dns")
            .expect("the setup-dns Deployment");
        assert_eq!(d["spec"]["replicas"], 1);
        let args: Vec<String> = d["spec"]["template"]["spec"]["containers"][0]["args"]
            .as_array()
            .expect("args")
            .iter()
            .map(|a| a.as_str().unwrap_or_default().to_owned())
            .collect();
        assert_eq!(args[0], "setup-dns");
        assert!(args.contains(&format!("--watch={mode}")) && args.contains(&"5".to_owned()), "{args:?}");
        let help = Command::new(BIN).args(["setup-dns", "--help"]).output().expect("setup-dns --help");
        let help = String::from_utf8_lossy(&help.stdout);
        for flag in args.iter().filter(|a| a.starts_with("--")) {
            let flag = flag.split('=').next().unwrap_or_default();
            let listed = help.lines().any(|l| {
                l.trim_start().strip_prefix(flag).is_some_and(|r| r.is_empty() || r.starts_with([' ', '[']))
            });
            assert!(listed, "clusterset-dns setup-dns has no {flag}");
        }
        let role = objects
            .iter()
            .find(|o| o["kind"] == "Role" && o["metadata"]["namespace"] == "kube-system")
            .expect("the kube-system Role");
        let rules = role["rules"].as_array().expect("rules");
        let cm_write = rules.iter().any(|r| {
            r["resources"][0] == "configmaps"
                && r["verbs"].as_array().is_some_and(|v| v.iter().any(|v| v == "patch" || v == "create"))
        });
        assert_eq!(cm_write, writes, "{mode}: {rules:?}");
        for r in
            rules.iter().filter(|r| r["verbs"].as_array().is_some_and(|v| v.iter().any(|v| v == "patch")))
        {
            if r["resources"][0] == "configmaps" {
                assert!(r["resourceNames"].is_array(), "ConfigMap updates by name only: {r}");
            }
        }
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
                         "metadata": {"name": "setup-dns-pod", "namespace": NS},
                         "spec": d["spec"]["template"]["spec"]});
        let (_, stderr) =
            kubectl_ok(&kubeconfig, &["create", "--dry-run=server", "-f", "-"], &pod.to_string());
        assert!(warnings(&stderr).is_empty(), "{mode}: {stderr}");
    }
}
