//! The fleet the benches write into a cluster: `namespaces × per_namespace`
//! ServiceImports (ClusterSetIP, every `headless_every`-th headless) with an
//! EndpointSlice per cluster of the clusterset, created with bounded
//! concurrency and timed.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clusterset_dns::k8s::mcs::mcs_resource;
use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use serde_json::{Value, json};

use super::report::{rate, secs};

/// API writes in flight while creating objects.
pub const CREATE_CONCURRENCY: usize = 32;
/// Any single API call.
pub const API_TIMEOUT: Duration = Duration::from_secs(30);
/// The clusters of a fleet, as the `source-cluster` label names them.
pub const CLUSTER_IDS: [&str; 3] = ["cluster-a", "cluster-b", "cluster-c"];
/// Endpoints per EndpointSlice.
pub const ENDPOINTS: usize = 4;

/// `namespaces × per_namespace` services, `<prefix>-<n>/svc-<i>`, 3 slices
/// of 4 endpoints each (one per cluster); every `headless_every`-th headless.
pub struct Fleet {
    pub prefix: &'static str,
    pub namespaces: usize,
    pub per_namespace: usize,
    pub headless_every: usize,
}

impl Fleet {
    pub fn services(&self) -> usize {
        self.namespaces * self.per_namespace
    }

    pub fn namespace(&self, n: usize) -> String {
        format!("{}-{n}", self.prefix)
    }

    /// Service `j` (0..services()) as (namespace index, service index).
    pub fn service(&self, j: usize) -> (usize, usize) {
        (j % self.namespaces, j / self.namespaces)
    }

    pub fn fqdn(&self, n: usize, i: usize) -> String {
        format!("svc-{i}.{}.svc.clusterset.local.", self.namespace(n))
    }

    pub fn headless(&self, i: usize) -> bool {
        self.headless_every > 0 && i.is_multiple_of(self.headless_every)
    }

    pub fn vip(n: usize, i: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, n as u8, (i >> 8) as u8, (i & 255) as u8)
    }

    pub fn endpoint_ip(&self, c: usize, n: usize, i: usize, e: usize) -> Ipv4Addr {
        let idx = (n * self.per_namespace + i) * ENDPOINTS + e;
        Ipv4Addr::new(10, 200 + c as u8, (idx >> 8) as u8, (idx & 255) as u8)
    }

    /// What `svc-<i>.<ns>` answers for A once everything is served.
    pub fn expected(&self, n: usize, i: usize) -> BTreeSet<Ipv4Addr> {
        if self.headless(i) {
            (0..CLUSTER_IDS.len())
                .flat_map(|c| (0..ENDPOINTS).map(move |e| (c, e)))
                .map(|(c, e)| self.endpoint_ip(c, n, i, e))
                .collect()
        } else {
            [Self::vip(n, i)].into()
        }
    }

    pub fn import(&self, n: usize, i: usize) -> Value {
        let spec = if self.headless(i) {
            json!({"type": "Headless", "ports": [{"name": "http", "protocol": "TCP", "port": 8080}]})
        } else {
            json!({"type": "ClusterSetIP", "ips": [Self::vip(n, i).to_string()],
                   "ports": [{"name": "http", "protocol": "TCP", "port": 80}]})
        };
        json!({"apiVersion": "multicluster.x-k8s.io/v1beta1", "kind": "ServiceImport",
               "metadata": {"name": format!("svc-{i}"), "namespace": self.namespace(n)}, "spec": spec})
    }

    pub fn slice_name(i: usize, c: usize) -> String {
        format!("svc-{i}-{}", &CLUSTER_IDS[c][8..])
    }

    /// Endpoint `e` of a slice gets `override_first` instead of its address when given.
    pub fn endpoints(&self, c: usize, n: usize, i: usize, override_first: Option<Ipv4Addr>) -> Value {
        let endpoints: Vec<Value> = (0..ENDPOINTS)
            .map(|e| {
                let ip = match override_first {
                    Some(ip) if e == 0 => ip,
                    _ => self.endpoint_ip(c, n, i, e),
                };
                json!({"addresses": [ip.to_string()], "hostname": format!("pod-{e}"),
                       "conditions": {"ready": true}})
            })
            .collect();
        Value::Array(endpoints)
    }

    pub fn slice(&self, c: usize, n: usize, i: usize) -> Value {
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
               "metadata": {"name": Self::slice_name(i, c), "namespace": self.namespace(n),
                            "labels": {"multicluster.kubernetes.io/service-name": format!("svc-{i}"),
                                       "multicluster.kubernetes.io/source-cluster": CLUSTER_IDS[c]}},
               "addressType": "IPv4", "ports": [{"name": "http", "protocol": "TCP", "port": 8080}],
               "endpoints": self.endpoints(c, n, i, None)})
    }
}

pub fn import_resource() -> ApiResource {
    mcs_resource("v1beta1", "ServiceImport", "serviceimports")
}

pub fn slice_resource() -> ApiResource {
    ApiResource::erase::<EndpointSlice>(&())
}

/// Creates the namespaces, then the imports, then the slices, each with
/// `CREATE_CONCURRENCY` writes in flight; prints the times.
pub async fn create_fleet(client: &kube::Client, fleet: &Fleet) -> Result<()> {
    let started = Instant::now();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for n in 0..fleet.namespaces {
        let body = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": fleet.namespace(n)}});
        let ns: Namespace = serde_json::from_value(body)?;
        timed_call(namespaces.create(&PostParams::default(), &ns)).await.context("create namespace")?;
    }
    let ns_time = started.elapsed();
    let services = fleet.services();
    let imports: Vec<(String, Value)> = (0..services)
        .map(|j| fleet.service(j))
        .map(|(n, i)| (fleet.namespace(n), fleet.import(n, i)))
        .collect();
    let slices: Vec<(String, Value)> = (0..services)
        .map(|j| fleet.service(j))
        .flat_map(|(n, i)| (0..CLUSTER_IDS.len()).map(move |c| (n, i, c)))
        .map(|(n, i, c)| (fleet.namespace(n), fleet.slice(c, n, i)))
        .collect();
    let import_time = create_all(client, &import_resource(), imports, "ServiceImports").await?;
    let slice_time = create_all(client, &slice_resource(), slices, "EndpointSlices").await?;
    let total = started.elapsed();
    println!("\ncreation ({CREATE_CONCURRENCY} writes in flight, POST, admin client):\n");
    println!("| objects | count | time | objects/s |");
    println!("|---|---|---|---|");
    println!(
        "| Namespaces (sequential) | {} | {:.1} s | {:.0} |",
        fleet.namespaces,
        secs(ns_time),
        rate(fleet.namespaces, ns_time)
    );
    println!(
        "| ServiceImports | {services} | {:.1} s | {:.0} |",
        secs(import_time),
        rate(services, import_time)
    );
    let n_slices = services * CLUSTER_IDS.len();
    println!(
        "| EndpointSlices | {n_slices} | {:.1} s | {:.0} |",
        secs(slice_time),
        rate(n_slices, slice_time)
    );
    println!(
        "| all | {} | {:.1} s | {:.0} |",
        fleet.namespaces + services + n_slices,
        secs(total),
        rate(fleet.namespaces + services + n_slices, total)
    );
    Ok(())
}

/// POSTs every object with bounded concurrency; an object that fails is
/// retried (3 attempts) and then fails the bench.
pub async fn create_all(
    client: &kube::Client,
    resource: &ApiResource,
    objects: Vec<(String, Value)>,
    what: &str,
) -> Result<Duration> {
    let started = Instant::now();
    let total = objects.len();
    let mut done = 0usize;
    let mut retries = 0usize;
    let mut results = stream::iter(objects)
        .map(|(ns, body)| {
            let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, resource);
            async move {
                let object: DynamicObject = serde_json::from_value(body)?;
                let mut attempt = 0;
                loop {
                    attempt += 1;
                    match timed_call(api.create(&PostParams::default(), &object)).await {
                        Ok(_) => return Ok::<usize, anyhow::Error>(attempt - 1),
                        Err(e) if attempt < 3 => {
                            eprintln!("create {ns}/{:?}: {e:#}; retrying", object.metadata.name);
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                        Err(e) => return Err(e.context(format!("create {ns}/{:?}", object.metadata.name))),
                    }
                }
            }
        })
        .buffer_unordered(CREATE_CONCURRENCY);
    while let Some(result) = results.next().await {
        retries += result?;
        done += 1;
        if done.is_multiple_of(5000) {
            eprintln!("[bench] {what}: {done}/{total} created in {:.1} s", secs(started.elapsed()));
        }
    }
    if retries > 0 {
        println!("{what}: {retries} create retries");
    }
    Ok(started.elapsed())
}

pub async fn timed_call<T>(call: impl Future<Output = Result<T, kube::Error>>) -> Result<T> {
    match tokio::time::timeout(API_TIMEOUT, call).await {
        Ok(result) => Ok(result?),
        Err(_) => bail!("no answer from the API server within {} s", API_TIMEOUT.as_secs()),
    }
}
