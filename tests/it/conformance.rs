//! The DNS checks of the mcs-api conformance suite (kubernetes-sigs/mcs-api,
//! `conformance/`), translated to our fixtures. As in the suite, what to
//! expect is derived from the API objects (the ServiceImport's IPs and ports,
//! the EndpointSlices' ready endpoints), never written down twice.
//! `tests/data/conformance/CHECKS.md` maps each check to its source lines.

use std::collections::BTreeSet;
use std::net::IpAddr;

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RData;
use serde::Deserialize;
use serde_yaml_ng::Value;

use crate::support::{TestServer, q};

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/conformance");
const NS: &str = "conformance";

struct Fixtures {
    docs: Vec<Value>,
    server: TestServer,
}

fn fixtures() -> Fixtures {
    let mut files = Vec::new();
    let mut docs = Vec::new();
    for entry in std::fs::read_dir(DIR).expect("fixtures") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let text = std::fs::read_to_string(&path).expect("read");
            for doc in serde_yaml_ng::Deserializer::from_str(&text) {
                docs.push(Value::deserialize(doc).expect("yaml"));
            }
            files.push((path.file_name().expect("name").to_string_lossy().into_owned(), text));
        }
    }
    let refs: Vec<(&str, &str)> = files.iter().map(|(n, t)| (n.as_str(), t.as_str())).collect();
    Fixtures { docs, server: TestServer::start(&refs, &[]) }
}

fn s(v: &Value) -> &str {
    v.as_str().unwrap_or_default()
}

impl Fixtures {
    fn import(&self, name: &str) -> &Value {
        self.docs
            .iter()
            .find(|d| s(&d["kind"]) == "ServiceImport" && s(&d["metadata"]["name"]) == name)
            .unwrap_or_else(|| panic!("no ServiceImport {name}"))
    }

    /// Ready endpoints of the service: (cluster, hostname, addresses).
    fn ready_endpoints(&self, service: &str) -> Vec<(String, Option<String>, Vec<IpAddr>)> {
        let mut out = Vec::new();
        for d in self.docs.iter().filter(|d| {
            s(&d["kind"]) == "EndpointSlice"
                && s(&d["metadata"]["labels"]["multicluster.kubernetes.io/service-name"]) == service
        }) {
            let cluster = s(&d["metadata"]["labels"]["multicluster.kubernetes.io/source-cluster"]).to_owned();
            for ep in d["endpoints"].as_sequence().into_iter().flatten() {
                if ep["conditions"]["ready"].as_bool() == Some(false) {
                    continue;
                }
                let addrs = ep["addresses"]
                    .as_sequence()
                    .into_iter()
                    .flatten()
                    .map(|a| s(a).parse().expect("address"))
                    .collect();
                out.push((cluster.clone(), ep["hostname"].as_str().map(str::to_owned), addrs));
            }
        }
        out
    }

    fn addresses(&self, name: &str) -> BTreeSet<IpAddr> {
        let mut got = BTreeSet::new();
        for t in ["A", "AAAA"] {
            for r in q(name, t).udp(self.server.addr).answers {
                match r.data {
                    RData::A(a) => got.insert(IpAddr::V4(a.0)),
                    RData::AAAA(a) => got.insert(IpAddr::V6(a.0)),
                    _ => false,
                };
            }
        }
        got
    }
}

/// The (port, target) of every SRV record in the answer.
fn srv_records(m: &hickory_proto::op::Message) -> Vec<(u16, String)> {
    m.answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::SRV(srv) => Some((srv.port, srv.target.to_string())),
            _ => None,
        })
        .collect()
}

fn fqdn(service: &str) -> String {
    format!("{service}.{NS}.svc.clusterset.local.")
}

/// clusterip_service_dns.go:36 — "A DNS lookup of the
/// <service>.<ns>.svc.clusterset.local domain for a ClusterIP service should
/// resolve to the clusterset IP".
#[test]
fn clusterip_lookup_resolves_to_the_clusterset_ip() {
    let f = fixtures();
    for service in ["hello", "hello-ds"] {
        let ips: BTreeSet<IpAddr> = f.import(service)["spec"]["ips"]
            .as_sequence()
            .expect("spec.ips")
            .iter()
            .map(|ip| s(ip).parse().expect("ip"))
            .collect();
        assert!(!ips.is_empty());
        assert_eq!(f.addresses(&fqdn(service)), ips, "{service}");
    }
}

/// clusterip_service_dns.go:61 — SRV on the bare service name returns one
/// record per distinct (port, target): the suite's `tcp` 42/TCP and `udp`
/// 42/UDP ports collapse into one.
#[test]
fn clusterip_srv_on_the_bare_name_returns_valid_records() {
    let f = fixtures();
    for service in ["hello", "hello-ds"] {
        let port = f.import(service)["spec"]["ports"][0]["port"].as_u64().expect("port") as u16;
        let m = q(&fqdn(service), "SRV").udp(f.server.addr);
        let srv = srv_records(&m);
        assert_eq!(srv, [(port, fqdn(service))], "{service}");
        assert!(m.authorities.is_empty(), "nothing in authority: nslookup would count it");
    }
}

/// headless_service_dns.go:49 — A/AAAA on a headless service name answer
/// exactly the ready endpoints' addresses (compared as sorted lists).
#[test]
fn headless_lookup_resolves_to_exactly_the_ready_endpoints() {
    let f = fixtures();
    for service in ["hello-headless", "hello-headless-ds", "hello-ss", "hello-ss-ds"] {
        let want: BTreeSet<IpAddr> = f.ready_endpoints(service).into_iter().flat_map(|(_, _, a)| a).collect();
        assert!(!want.is_empty(), "{service}: fixture has ready endpoints");
        assert_eq!(f.addresses(&fqdn(service)), want, "{service}");
    }
}

/// headless_service_dns.go:82 — each StatefulSet pod resolves as
/// `<hostname>.<clusterid>.<service>.<ns>.svc.clusterset.local` to exactly
/// its own addresses.
#[test]
fn statefulset_hostnames_resolve_to_their_endpoint() {
    let f = fixtures();
    for service in ["hello-ss", "hello-ss-ds"] {
        let eps = f.ready_endpoints(service);
        let hosts: BTreeSet<(String, String)> =
            eps.iter().filter_map(|(c, h, _)| Some((c.clone(), h.clone()?))).collect();
        assert!(hosts.len() >= 2, "{service}");
        for (cluster, host) in hosts {
            let want: BTreeSet<IpAddr> = eps
                .iter()
                .filter(|(c, h, _)| *c == cluster && h.as_deref() == Some(&host))
                .flat_map(|(_, _, a)| a.iter().copied())
                .collect();
            let name = format!("{host}.{cluster}.{service}.{NS}.svc.clusterset.local.");
            assert_eq!(f.addresses(&name), want, "{name}");
        }
    }
}

/// headless_service_dns.go:125 — SRV on a headless service name: one record
/// per endpoint address, each target starting with the endpoint's hostname
/// (or its address with `.`/`:` replaced by `-`), port from the service.
#[test]
fn headless_srv_on_the_bare_name_returns_valid_records() {
    let f = fixtures();
    for service in ["hello-headless", "hello-headless-ds", "hello-ss", "hello-ss-ds"] {
        let port = f.import(service)["spec"]["ports"][0]["port"].as_u64().expect("port") as u16;
        let srv = srv_records(&q(&fqdn(service), "SRV").udp(f.server.addr));
        let eps = f.ready_endpoints(service);
        let mut names: BTreeSet<String> = BTreeSet::new();
        for (_, host, addrs) in &eps {
            match host {
                Some(h) => {
                    names.insert(h.clone());
                }
                None => names.extend(addrs.iter().map(|a| a.to_string().replace(['.', ':'], "-"))),
            }
        }
        assert_eq!(srv.len(), names.len(), "{service}: {srv:?}");
        for name in &names {
            let rec = srv.iter().find(|(_, t)| t.starts_with(&format!("{name}.")));
            let rec = rec.unwrap_or_else(|| panic!("{service}: no record for {name} in {srv:?}"));
            assert_eq!(rec.0, port, "{service}: {name}");
        }
    }
}

/// connectivity.go:36 (Required) — a service that is not exported has no
/// clusterset name.
#[test]
fn a_service_that_is_not_exported_does_not_resolve() {
    let f = fixtures();
    let m = q(&fqdn("not-exported"), "A").udp(f.server.addr);
    assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
}

/// The suite reads answers with BIND's `nslookup`; run it too, and count SRV
/// records the way the suite's regex does (every output line with `=`).
#[test]
fn nslookup_counts_the_srv_records_the_suite_expects() {
    let f = fixtures();
    let out = std::process::Command::new("nslookup")
        .args([&format!("-port={}", f.server.addr.port()), "-type=SRV", &fqdn("hello"), "127.0.0.1"])
        .output()
        .expect("nslookup (bind9-dnsutils)");
    let text = String::from_utf8_lossy(&out.stdout);
    let records: Vec<&str> = text.lines().filter(|l| l.contains('=')).collect();
    assert_eq!(records.len(), 1, "{text}");
    assert!(records[0].ends_with(&format!("42 {}", fqdn("hello"))), "{text}");
}
