//! EndpointSlices read as Kubernetes protobuf (`--kube-encoding auto`, the
//! default) against the same slices read as JSON, on a real kube-apiserver
//! that encodes both: `tests/data/protobuf/fleet.yaml` holds every field
//! the conversion reads, with and without values, fields it skips, and
//! slices it must refuse or ignore.
//!
//! - The API server's own protobuf and JSON lists of those slices convert
//!   to the same values, slice by slice (errors included, word for word).
//! - A server reading protobuf and one reading JSON give the same bytes to
//!   every question about them, after the list and after changes arrive
//!   as watch events.
//! - Behind a proxy that asks the API server for JSON only, the server
//!   reads the JSON answers, counts them and says so once.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use clusterset_dns::k8s::convert;
use clusterset_dns::k8s::protobuf::SliceView;
use clusterset_dns::k8s::protobuf::decode;
use hickory_proto::rr::RData;
use http::header::{ACCEPT, CONTENT_TYPE};
use http_body_util::BodyExt;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::ObjectList;

use crate::deploy::kubectl_ok;
use crate::harness::clusters::TestClusters;
use crate::harness::eventually;
use crate::harness::served::Served;
use crate::support::{q, udp_raw};
use crate::watch::runtime;

const NS: &str = "pb-diff";
const FLEET: &str = include_str!("../data/protobuf/fleet.yaml");
const SLICES: &str = "/apis/discovery.k8s.io/v1/namespaces/pb-diff/endpointslices";
/// Ready endpoints of `db` in every cluster: what both must answer.
const DB_READY: [&str; 5] = ["10.91.0.1", "10.91.0.3", "10.91.0.4", "10.92.0.1", "10.92.0.2"];

/// One cluster with the fleet applied (WatchList on: streaming lists).
fn cluster() -> TestClusters {
    let clusters =
        TestClusters::start_env(1, &[("CLUSTERS_APISERVER_ARGS", "--feature-gates=WatchList=true")]);
    kubectl_ok(&clusters.kubeconfig(0), &["create", "namespace", NS], "");
    kubectl_ok(&clusters.kubeconfig(0), &["apply", "-f", "-"], FLEET);
    clusters
}

fn serve(kubeconfig: &Path, extra: &[&str]) -> Served {
    let mut args = vec!["--kubeconfig", kubeconfig.to_str().expect("path"), "--answer-policy", "all"];
    args.extend_from_slice(extra);
    let s = Served::start(&args);
    s.wait_ready(Duration::from_secs(30));
    s
}

fn fqdn(name: &str) -> String {
    format!("{name}.{NS}.svc.clusterset.local.")
}

/// Every question about the fleet: each name in each type, reverse names.
fn questions() -> Vec<(String, &'static str)> {
    let mut names: Vec<String> = [
        "web",
        "db",
        "cache",
        "empty",
        "absent",
        "db-0.cluster-a.db",
        "db-1.cluster-a.db",
        "db-0.cluster-b.db",
        "db-9.cluster-d.db",
        "cache-0.cluster-a.cache",
        "cache-1.cluster-a.cache",
        "_pg._tcp.db",
        "_any._tcp.db",
        "_memcache._udp.cache",
        "_sctp._sctp.cache",
        "_http._tcp.web",
        "_dns._udp.web",
        "cluster-a.db",
        "new-0.cluster-e.db",
    ]
    .iter()
    .map(|n| fqdn(n))
    .collect();
    for ip in ["10.91.0.1", "10.91.0.2", "10.91.0.3", "10.92.0.1", "10.96.0.1", "10.94.0.1", "10.97.0.1"] {
        let octets: Vec<&str> = ip.split('.').rev().collect();
        names.push(format!("{}.in-addr.arpa.", octets.join(".")));
    }
    names.push("1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.1.9.0.0.0.0.d.f.ip6.arpa.".to_owned());
    let mut all = Vec::new();
    for name in names {
        for rtype in ["A", "AAAA", "SRV", "TXT", "PTR"] {
            all.push((name.clone(), rtype));
        }
    }
    all
}

/// The questions whose answers differ between the two servers, with both
/// answers, byte for byte.
fn differences(a: SocketAddr, b: SocketAddr) -> Vec<String> {
    questions()
        .into_iter()
        .filter_map(|(name, rtype)| {
            let query = q(&name, rtype).bytes();
            let (x, y) = (udp_raw(a, &query), udp_raw(b, &query));
            let same = match (&x, &y) {
                (Some(x), Some(y)) => same_but_serial(x, y),
                _ => false,
            };
            (!same).then(|| format!("{name} {rtype}:\n  json     {x:02x?}\n  protobuf {y:02x?}"))
        })
        .collect()
}

/// Whether two answers are the same bytes, but for the zone's SOA serial:
/// it counts each server's own publishes, so two servers that read the
/// same objects in different batches (a list in parts, or one piece) may
/// number the same data differently. Only the 4 bytes of that serial may
/// differ, where each answer holds it.
fn same_but_serial(x: &[u8], y: &[u8]) -> bool {
    if x == y {
        return true;
    }
    let serial_at = |bytes: &[u8]| {
        let m = crate::support::decode(bytes);
        let serial = m.authorities.iter().find_map(|r| match &r.data {
            RData::SOA(soa) => Some(soa.serial),
            _ => None,
        })?;
        let wanted = serial.to_be_bytes();
        bytes.windows(4).rposition(|w| w == wanted)
    };
    match (serial_at(x), serial_at(y)) {
        (Some(i), Some(j)) if i == j && x.len() == y.len() => {
            (0..x.len()).all(|k| x[k] == y[k] || (i..i + 4).contains(&k))
        }
        _ => false,
    }
}

fn short(s: &Served, name: &str) -> Vec<String> {
    let mut ips: Vec<String> = s.dig(&["+short", &fqdn(name), "A"]).lines().map(str::to_owned).collect();
    ips.sort();
    ips
}

#[test]
fn every_slice_converts_the_same_from_the_api_servers_protobuf_as_from_its_json() {
    let clusters = cluster();
    let rt = runtime();
    let (protobuf, json) = rt.block_on(async {
        let client = clusters.client(0).await;
        let get = |accept: &'static str| {
            let client = client.clone();
            async move {
                let mut request =
                    http::Request::get(SLICES).body(kube::client::Body::empty()).expect("request");
                request.headers_mut().insert(ACCEPT, http::HeaderValue::from_static(accept));
                let response = client.send(request).await.expect("list");
                assert!(response.status().is_success(), "{}", response.status());
                let kind = response.headers()[CONTENT_TYPE].to_str().expect("content type").to_owned();
                (kind, response.into_body().collect().await.expect("body").to_bytes())
            }
        };
        (get("application/vnd.kubernetes.protobuf").await, get("application/json").await)
    });
    assert_eq!(protobuf.0, "application/vnd.kubernetes.protobuf");
    let raw = decode::envelope_of(&protobuf.1, "EndpointSliceList").expect("envelope");
    let list = decode::list(raw).expect("list");
    let from_json: ObjectList<EndpointSlice> = serde_json::from_slice(&json.1).expect("JSON list");
    assert_eq!(list.items.len(), 8, "the fixture's slices");
    assert_eq!(list.items.len(), from_json.items.len());
    let mut outcomes = Vec::new();
    for (item, j) in list.items.iter().zip(&from_json.items) {
        let view = SliceView::parse(item).expect("a slice the API server encoded");
        let (p, j) =
            (format!("{:?}", convert::endpoint_slice(&view)), format!("{:?}", convert::endpoint_slice(j)));
        assert_eq!(p, j, "slice {:?}", j);
        outcomes.push(p);
    }
    // Not vacuous: usable slices, the FQDN one, and both refusals.
    let count = |prefix: &str| outcomes.iter().filter(|o| o.starts_with(prefix)).count();
    assert_eq!((count("Ok(Endpoints("), count("Ok(Fqdn)"), count("Err(")), (5, 1, 2), "{outcomes:#?}");
}

#[test]
fn json_and_protobuf_servers_give_the_same_bytes_for_every_question() {
    let clusters = cluster();
    let kubeconfig = clusters.serve_kubeconfig(0);
    let json = serve(&kubeconfig, &["--kube-encoding", "json"]);
    let protobuf = serve(&kubeconfig, &[]);
    assert!(protobuf.log().contains("reading EndpointSlices as Kubernetes protobuf"), "{}", protobuf.log());
    assert!(!json.log().contains("protobuf"), "{}", json.log());
    for s in [&json, &protobuf] {
        assert_eq!(short(s, "db"), DB_READY, "{}", s.log());
        // The refused slices are named, in either encoding.
        for name in ["pb-diff/db-bad-cluster", "pb-diff/db-no-cluster"] {
            assert!(s.log().contains(name), "{name} not named:\n{}", s.log());
        }
    }
    let found = differences(json.addr, protobuf.addr);
    assert!(
        found.is_empty(),
        "{} of {} answers differ:\n{}",
        found.len(),
        questions().len(),
        found.join("\n")
    );

    // Changes arrive as watch events: an endpoint added, a slice deleted,
    // a slice created, an endpoint made not ready.
    let admin = clusters.kubeconfig(0);
    let cache_before = short(&json, "cache");
    let patch = r#"[{"op":"add","path":"/endpoints/-","value":{"addresses":["10.97.0.1"],"hostname":"db-7","zone":"zone-b"}}]"#;
    kubectl_ok(&admin, &["-n", NS, "patch", "endpointslice", "db-b", "--type=json", "-p", patch], "");
    kubectl_ok(&admin, &["-n", NS, "delete", "endpointslice", "db-a-v6"], "");
    let not_ready = r#"[{"op":"replace","path":"/endpoints/0/conditions/ready","value":false}]"#;
    kubectl_ok(&admin, &["-n", NS, "patch", "endpointslice", "cache-a", "--type=json", "-p", not_ready], "");
    let new = "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: db-e\n  namespace: pb-diff\n  \
               labels:\n    multicluster.kubernetes.io/service-name: db\n    multicluster.kubernetes.io/source-cluster: \
               cluster-e\naddressType: IPv4\nendpoints:\n- addresses: [10.98.0.1]\n  hostname: new-0\n";
    kubectl_ok(&admin, &["apply", "-f", "-"], new);
    let mut want: Vec<&str> = DB_READY.to_vec();
    want.extend(["10.97.0.1", "10.98.0.1"]);
    want.sort();
    for s in [&json, &protobuf] {
        eventually("the changes are served", || {
            short(s, "db") == want
                && short(s, "cache") != cache_before
                && s.dig(&["+short", &fqdn("db-0.cluster-a.db"), "AAAA"]).is_empty()
        });
    }
    // Each change is a watch event of its own, and the two servers follow
    // their own watches: one may be an event behind for a moment, so the
    // comparison is retried for up to 10 s before differences count.
    let mut found = differences(json.addr, protobuf.addr);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !found.is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        found = differences(json.addr, protobuf.addr);
    }
    assert!(found.is_empty(), "after changes, {} answers differ:\n{}", found.len(), found.join("\n"));
}

/// `scripts/json-proxy.py` in front of an API server; stopped on drop.
struct JsonProxy {
    child: Child,
    port: u16,
}

impl JsonProxy {
    fn start(kubeconfig: &Path) -> Self {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/json-proxy.py");
        let mut child = Command::new("python3")
            .arg(script)
            .arg(kubeconfig)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 scripts/json-proxy.py");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("proxy output");
        let port = line.trim().strip_prefix("LISTENING ").and_then(|p| p.parse().ok());
        let port = port.unwrap_or_else(|| panic!("json-proxy.py said {line:?}"));
        Self { child, port }
    }

    /// A copy of `kubeconfig` that reaches its API server through the proxy.
    fn kubeconfig(&self, kubeconfig: &Path) -> PathBuf {
        let text = std::fs::read_to_string(kubeconfig).expect("kubeconfig");
        let text: String = text
            .lines()
            .filter(|l| !l.trim_start().starts_with("certificate-authority-data:"))
            .map(|l| {
                if l.trim_start().starts_with("server:") {
                    format!("    server: http://127.0.0.1:{}\n", self.port)
                } else {
                    format!("{l}\n")
                }
            })
            .collect();
        let path = kubeconfig.with_file_name(format!("json-proxy-{}.kubeconfig", self.port));
        std::fs::write(&path, text).expect("write kubeconfig");
        path
    }
}

impl Drop for JsonProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn behind_a_proxy_that_asks_for_json_the_answers_are_read_as_json_and_counted() {
    let clusters = cluster();
    let proxy = JsonProxy::start(&clusters.serve_kubeconfig(0));
    let s = serve(&proxy.kubeconfig(&clusters.serve_kubeconfig(0)), &[]);
    assert_eq!(short(&s, "db"), DB_READY, "{}", s.log());
    let admin = clusters.kubeconfig(0);
    kubectl_ok(&admin, &["-n", NS, "delete", "endpointslice", "db-b"], "");
    eventually("a deletion read from a JSON watch", || short(&s, "db") == DB_READY[..3]);
    let (_, metrics) = s.get("/metrics");
    let counted = metrics
        .lines()
        .find(|l| {
            l.starts_with(
                "clusterset_dns_watch_json_answers_total{watch=\"EndpointSlices (all namespaces)\"}",
            )
        })
        .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok());
    assert!(counted.is_some_and(|n| n >= 1), "{metrics}");
    let warned =
        s.log().lines().filter(|l| l.contains("answered a request for protobuf EndpointSlices")).count();
    assert_eq!(warned, 1, "{}", s.log());
    assert!(!s.log().contains("reading EndpointSlices as Kubernetes protobuf"), "{}", s.log());
}
