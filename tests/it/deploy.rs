//! `deploy/`: every kustomization renders with `kubectl kustomize` and a real
//! kube-apiserver (`tests/harness/clusters.rs`) accepts the result (`kubectl apply
//! --dry-run=server`, client-side and server-side apply: schema, strict
//! field validation, admission); the base holds what running clusterset-dns
//! needs (replicas, disruption budget, spread, probes, security context,
//! resources, Service ports, the RBAC of `deploy/serve/rbac.yaml`), its pod
//! passes the `restricted` Pod Security Standard as enforced by the API
//! server, and the image is set with kustomize `images:`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde::Deserialize;
use serde_json::{Value, json};

use crate::harness::clusters::shared;

const BIN: &str = env!("CARGO_BIN_EXE_clusterset-dns");
const NS: &str = "clusterset-dns";
const NAME: &str = "clusterset-dns";

pub fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy")
}

/// The names kustomize recognizes for a kustomization file.
const KUSTOMIZATION_FILES: [&str; 3] = ["kustomization.yaml", "kustomization.yml", "Kustomization"];

fn is_kustomization(dir: &Path) -> bool {
    KUSTOMIZATION_FILES.iter().any(|f| dir.join(f).is_file())
}

/// Every directory under `deploy/` that holds a kustomization, sorted.
fn kustomizations() -> Vec<PathBuf> {
    fn walk(dir: &Path, found: &mut Vec<PathBuf>) {
        if is_kustomization(dir) {
            found.push(dir.to_owned());
        }
        let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                walk(&path, found);
            }
        }
    }
    let mut found = Vec::new();
    walk(&deploy_dir(), &mut found);
    found.sort();
    found
}

fn relative(dir: &Path) -> String {
    dir.strip_prefix(deploy_dir()).map_or_else(|_| dir.display().to_string(), |p| p.display().to_string())
}

/// Runs kubectl against `kubeconfig` (so the gcloud dispatcher picks the
/// client matching that API server), with `stdin` as its input.
pub fn kubectl(kubeconfig: &Path, args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run kubectl (needed by the deploy tests): {e}"));
    let mut input = child.stdin.take().expect("piped stdin");
    input.write_all(stdin.as_bytes()).expect("write kubectl's stdin");
    drop(input);
    child.wait_with_output().expect("wait for kubectl")
}

/// `kubectl args` must succeed; returns its stdout and stderr.
pub fn kubectl_ok(kubeconfig: &Path, args: &[&str], stdin: &str) -> (String, String) {
    let out = kubectl(kubeconfig, args, stdin);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "kubectl {}: {}\n{stdout}\n{stderr}", args.join(" "), out.status);
    (stdout, stderr)
}

pub fn render(kubeconfig: &Path, dir: &Path) -> String {
    kubectl_ok(kubeconfig, &["kustomize", &dir.to_string_lossy()], "").0
}

/// The documents of a multi-document YAML text.
pub fn objects(yaml: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(yaml)
        .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("rendered YAML: {e}\n{yaml}")))
        .filter(|v| !v.is_null())
        .collect()
}

pub fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} among {:?}", summary(objects)))
}

pub fn summary(objects: &[Value]) -> Vec<String> {
    objects
        .iter()
        .map(|o| format!("{}/{}", o["kind"].as_str().unwrap_or("?"), o["metadata"]["name"]))
        .collect()
}

/// Warnings kubectl printed, except the one about objects first created by
/// server-side apply (the harness applies `deploy/serve/rbac.yaml` that way).
pub fn warnings(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.contains("Warning:") && !l.contains("kubectl.kubernetes.io/last-applied-configuration"))
        .collect()
}

/// Client-side and server-side apply of `yaml`, dry run on the server: the
/// API server validates (strictly: unknown fields fail), defaults and admits
/// every object, and stores nothing.
pub fn apply_dry_run(kubeconfig: &Path, what: &str, yaml: &str) {
    for mode in [
        &["apply", "--dry-run=server", "-f", "-"][..],
        &["apply", "--server-side", "--dry-run=server", "-f", "-"],
    ] {
        let (stdout, stderr) = kubectl_ok(kubeconfig, mode, yaml);
        assert!(warnings(&stderr).is_empty(), "kubectl {} of {what} warned:\n{stderr}", mode.join(" "));
        assert_eq!(
            stdout.lines().filter(|l| l.ends_with("(server dry run)")).count(),
            objects(yaml).len(),
            "kubectl {} of {what}: not every object was applied:\n{stdout}{stderr}",
            mode.join(" ")
        );
    }
}

#[test]
fn every_kustomization_renders_and_the_api_server_accepts_it() {
    let clusters = shared();
    let kubeconfig = clusters.kubeconfig(0);
    let dirs = kustomizations();
    let names: Vec<String> = dirs.iter().map(|d| relative(d)).collect();
    for expected in ["base", "serve", "examples/hpa", "agent", "overlays/sync", "overlays/agent"] {
        assert!(names.iter().any(|n| n == expected), "deploy/{expected} is not a kustomization: {names:?}");
    }
    for dir in &dirs {
        let yaml = render(&kubeconfig, dir);
        assert!(!objects(&yaml).is_empty(), "deploy/{} renders nothing", relative(dir));
        apply_dry_run(&kubeconfig, &format!("deploy/{}", relative(dir)), &yaml);
    }
    // Overlays and examples not ready to ship say so in a README instead.
    for group in ["overlays", "examples"] {
        let entries = std::fs::read_dir(deploy_dir().join(group)).expect("read deploy/ subdirectory");
        for entry in entries {
            let dir = entry.expect("directory entry").path();
            if dir.is_dir() {
                assert!(
                    is_kustomization(&dir) || dir.join("README.md").is_file(),
                    "{}: neither a kustomization nor a README.md",
                    dir.display()
                );
            }
        }
    }
}

/// `kubectl apply -f deploy/serve/` (README, deploy/README.md) applies
/// rbac.yaml alone: the directory's `Kustomization` file, which deploy/base
/// needs, is not read as a manifest. `-k` gives the same objects.
#[test]
fn deploy_serve_applies_as_a_directory_and_as_a_kustomization() {
    let kubeconfig = shared().kubeconfig(0);
    let serve = deploy_dir().join("serve");
    let (stdout, stderr) =
        kubectl_ok(&kubeconfig, &["apply", "--dry-run=server", "-f", &serve.to_string_lossy()], "");
    assert!(warnings(&stderr).is_empty(), "kubectl apply -f deploy/serve/ warned:\n{stderr}");
    let rbac = std::fs::read_to_string(serve.join("rbac.yaml")).expect("read deploy/serve/rbac.yaml");
    let from_file = objects(&rbac);
    assert_eq!(stdout.lines().count(), from_file.len(), "kubectl apply -f deploy/serve/:\n{stdout}");
    assert_eq!(objects(&render(&kubeconfig, &serve)), from_file, "kubectl kustomize deploy/serve");
}

/// The pod of the base's Deployment and its container.
fn pod_spec(objects: &[Value]) -> (&Value, &Value) {
    let spec = &find(objects, "Deployment", NAME)["spec"]["template"]["spec"];
    let containers = spec["containers"].as_array().expect("containers");
    assert_eq!(containers.len(), 1, "one container: {containers:?}");
    (spec, &containers[0])
}

#[test]
fn the_base_holds_what_running_clusterset_dns_needs() {
    let kubeconfig = shared().kubeconfig(0);
    let objects = objects(&render(&kubeconfig, &deploy_dir().join("base")));

    // The identity and read-only permissions are deploy/serve/rbac.yaml's, unchanged.
    let rbac = std::fs::read_to_string(deploy_dir().join("serve/rbac.yaml")).expect("read rbac.yaml");
    for object in self::objects(&rbac) {
        let (kind, name) =
            (object["kind"].as_str().expect("kind"), object["metadata"]["name"].as_str().expect("name"));
        assert_eq!(find(&objects, kind, name), &object, "{kind} {name} differs from deploy/serve/rbac.yaml");
    }

    let deployment = find(&objects, "Deployment", NAME);
    assert_eq!(deployment["metadata"]["namespace"], NS);
    let replicas = deployment["spec"]["replicas"].as_u64().expect("spec.replicas");
    assert!(replicas >= 2, "replicas: {replicas}");
    let selector = &deployment["spec"]["selector"]["matchLabels"];
    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    for (k, v) in selector.as_object().expect("matchLabels") {
        assert_eq!(&labels[k], v, "the pod template lacks selector label {k}");
    }
    let (pod, container) = pod_spec(&objects);
    assert_eq!(pod["serviceAccountName"], NAME);

    assert_eq!(container["image"], "clusterset-dns:latest");
    let args: Vec<&str> =
        container["args"].as_array().expect("args").iter().filter_map(Value::as_str).collect();
    assert_eq!(args, ["serve", "--in-cluster", "--listen", "0.0.0.0:53", "--http-listen", "0.0.0.0:9153"]);
    // Every flag given exists (the real binary's help).
    let help = Command::new(BIN).args(["serve", "--help"]).output().expect("run clusterset-dns serve --help");
    let help = String::from_utf8_lossy(&help.stdout);
    for flag in args.iter().filter(|a| a.starts_with("--")) {
        assert!(help.contains(flag), "clusterset-dns serve has no {flag}:\n{help}");
    }

    // A terminating pod answers for --lameduck seconds: the grace period is longer.
    let lameduck = args
        .iter()
        .enumerate()
        .find_map(|(i, a)| match a.strip_prefix("--lameduck") {
            Some("") => args.get(i + 1).copied(),
            Some(v) => v.strip_prefix('='),
            None => None,
        })
        .map_or(5, |v| v.parse::<u64>().expect("--lameduck SECONDS"));
    let grace = pod["terminationGracePeriodSeconds"].as_u64().unwrap_or(30);
    assert!(grace > lameduck, "terminationGracePeriodSeconds {grace} <= --lameduck {lameduck}");

    // Ports: 53 over UDP and TCP, 9153 for the probes and /metrics.
    let ports = container["ports"].as_array().expect("container ports");
    let container_port = |name: &Value| -> (u64, String) {
        let port = ports
            .iter()
            .find(|p| &p["name"] == name || &p["containerPort"] == name)
            .unwrap_or_else(|| panic!("no container port {name} in {ports:?}"));
        (
            port["containerPort"].as_u64().expect("containerPort"),
            port["protocol"].as_str().unwrap_or("TCP").to_owned(),
        )
    };
    for (probe, path) in [("livenessProbe", "/health"), ("readinessProbe", "/ready")] {
        let get = &container[probe]["httpGet"];
        assert_eq!(get["path"], path, "{probe}");
        assert_eq!(container_port(&get["port"]), (9153, "TCP".to_owned()), "{probe} port");
    }

    // Security context (the restricted Pod Security Standard, checked by the
    // API server in the next test, plus a read-only root file system).
    let pod_sc = &pod["securityContext"];
    let sc = &container["securityContext"];
    assert_eq!(pod_sc["runAsNonRoot"], true);
    assert_eq!(sc["runAsNonRoot"], true);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["capabilities"], json!({"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}));
    assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault");
    assert_eq!(pod_sc["seccompProfile"]["type"], "RuntimeDefault");

    let resources = &container["resources"];
    for field in ["/requests/cpu", "/requests/memory", "/limits/memory"] {
        assert!(resources.pointer(field).is_some_and(Value::is_string), "resources{field}: {resources}");
    }

    // Spread over nodes (required) and zones (preferred).
    let spread = pod["topologySpreadConstraints"].as_array().expect("topologySpreadConstraints");
    let constraint = |key: &str| {
        spread
            .iter()
            .find(|c| c["topologyKey"] == key)
            .unwrap_or_else(|| panic!("no topologySpreadConstraint on {key}: {spread:?}"))
    };
    assert_eq!(constraint("kubernetes.io/hostname")["whenUnsatisfiable"], "DoNotSchedule");
    assert_eq!(constraint("topology.kubernetes.io/zone")["whenUnsatisfiable"], "ScheduleAnyway");
    for c in spread {
        assert_eq!(&c["labelSelector"]["matchLabels"], selector, "{c}");
    }

    let pdb = find(&objects, "PodDisruptionBudget", NAME);
    assert_eq!(pdb["metadata"]["namespace"], NS);
    assert_eq!(pdb["spec"]["minAvailable"], 1);
    assert_eq!(&pdb["spec"]["selector"]["matchLabels"], selector);

    let service = find(&objects, "Service", NAME);
    assert_eq!(service["metadata"]["namespace"], NS);
    assert_eq!(service["spec"]["type"], "ClusterIP");
    assert_eq!(&service["spec"]["selector"], selector);
    let service_ports: Vec<(u64, String, String)> = service["spec"]["ports"]
        .as_array()
        .expect("Service ports")
        .iter()
        .map(|p| {
            let protocol = p["protocol"].as_str().unwrap_or("TCP").to_owned();
            // The target is a container port with the same protocol.
            let target = if p["targetPort"].is_null() { &p["port"] } else { &p["targetPort"] };
            let (target_port, target_protocol) = container_port(target);
            assert_eq!(target_protocol, protocol, "Service port {p}: target {target_port}");
            let port = p["port"].as_u64().expect("port");
            (port, protocol, p["name"].as_str().unwrap_or_default().to_owned())
        })
        .collect();
    for (port, protocol) in [(53, "UDP"), (53, "TCP"), (9153, "TCP")] {
        assert!(
            service_ports.iter().any(|(p, proto, _)| *p == port && proto == protocol),
            "Service lacks {port}/{protocol}: {service_ports:?}"
        );
    }
    assert!(service_ports.contains(&(9153, "TCP".to_owned(), "metrics".to_owned())), "{service_ports:?}");
}

/// The API server's PodSecurity admission, enforcing `restricted` on a fresh
/// namespace, admits the base's pod (and, as a control, rejects it with one
/// more capability).
#[test]
fn the_pod_passes_the_restricted_pod_security_standard() {
    let kubeconfig = shared().kubeconfig(0);
    let ns = "deploy-restricted";
    let namespace = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": {
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": "latest"}}});
    kubectl_ok(&kubeconfig, &["apply", "--server-side", "-f", "-"], &namespace.to_string());

    let objects = objects(&render(&kubeconfig, &deploy_dir().join("base")));
    let (spec, _) = pod_spec(&objects);
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
                     "metadata": {"name": "clusterset-dns", "namespace": ns}, "spec": spec});
    let (_, stderr) = kubectl_ok(&kubeconfig, &["create", "--dry-run=server", "-f", "-"], &pod.to_string());
    assert!(warnings(&stderr).is_empty(), "{stderr}");

    let mut bad = pod;
    bad["spec"]["containers"][0]["securityContext"]["capabilities"]["add"] =
        json!(["NET_BIND_SERVICE", "NET_RAW"]);
    let out = kubectl(&kubeconfig, &["create", "--dry-run=server", "-f", "-"], &bad.to_string());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("violates PodSecurity"),
        "NET_RAW was admitted: {stderr}"
    );
}

/// `images:` in a kustomization that uses deploy/base (here from another
/// directory, as a user's overlay would) replaces the placeholder image.
#[test]
fn the_image_is_set_with_kustomize_images() {
    let kubeconfig = shared().kubeconfig(0);
    let overlay = tempfile::tempdir().expect("temporary directory");
    // Kustomize takes no absolute paths: deploy/base is reached with `..`,
    // from canonical paths so that no symbolic link bends the way.
    let dir = overlay.path().canonicalize().expect("canonical temporary directory");
    let up = "../".repeat(dir.components().count() - 1);
    let base = deploy_dir().join("base").canonicalize().expect("canonical deploy/base");
    let base = base.strip_prefix("/").expect("canonical paths are absolute");
    let kustomization = format!(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - {up}{}\n\
         images:\n  - name: clusterset-dns\n    newName: registry.example.com/dns/clusterset-dns\n    newTag: v1.2.3\n",
        base.display()
    );
    std::fs::write(dir.join("kustomization.yaml"), kustomization).expect("write kustomization.yaml");
    let yaml = render(&kubeconfig, &dir);
    let objects = objects(&yaml);
    let (_, container) = pod_spec(&objects);
    assert_eq!(container["image"], "registry.example.com/dns/clusterset-dns:v1.2.3");
    apply_dry_run(&kubeconfig, "an overlay of deploy/base", &yaml);
}

/// The HPA example scales the base's Deployment on CPU, never below two
/// replicas, and leaves `spec.replicas` to the autoscaler.
#[test]
fn the_hpa_example_scales_the_deployment_on_cpu() {
    let kubeconfig = shared().kubeconfig(0);
    let objects = objects(&render(&kubeconfig, &deploy_dir().join("examples/hpa")));
    let hpa = find(&objects, "HorizontalPodAutoscaler", NAME);
    assert_eq!(hpa["apiVersion"], "autoscaling/v2");
    assert_eq!(hpa["metadata"]["namespace"], NS);
    assert_eq!(
        hpa["spec"]["scaleTargetRef"],
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "name": NAME})
    );
    assert!(hpa["spec"]["minReplicas"].as_u64().is_some_and(|n| n >= 2), "{hpa}");
    let metrics = hpa["spec"]["metrics"].as_array().expect("metrics");
    assert!(metrics.iter().any(|m| m["resource"]["name"] == "cpu"), "{metrics:?}");
    let deployment = find(&objects, "Deployment", NAME);
    assert!(deployment["spec"].get("replicas").is_none(), "spec.replicas is set: {}", deployment["spec"]);
    // The CPU request that utilization is measured against.
    let (_, container) = pod_spec(&objects);
    assert!(container["resources"]["requests"]["cpu"].is_string());
}
