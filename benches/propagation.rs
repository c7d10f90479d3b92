//! Propagation of a ServiceImport change through the Kubernetes watch
//! source, against a real kube-apiserver and etcd (`scripts/clusters.sh`)
//! and the real release binary: 1,000 ClusterSetIP ServiceImports in 10
//! namespaces (3 EndpointSlices each); 200 changes of one import's
//! `spec.ips`, each timed from the moment the API write returns to the
//! moment the server answers the new VIP (raw UDP queries every 1 ms).
//!
//! `cargo bench --bench propagation`; see `common` for how bench targets run.

#![allow(clippy::print_stdout)]

#[path = "../tests/harness/mod.rs"]
mod harness;

mod common;

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::Name;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::json;

use common::dns::{Dns, POLL_EVERY};
use common::objects::{Fleet, import_resource, timed_call};
use common::report::row;
use common::{SERVED_FLEET, ServedFleet, main_of};
use harness::served::Served;

/// Changes timed.
const CHANGES: usize = 200;
/// How long one change may take to be served before it counts as lost.
const PROPAGATION_TIMEOUT: Duration = Duration::from_secs(5);

fn main() {
    main_of("propagation", |rt| {
        ServedFleet::run(rt, SERVED_FLEET, |f| propagation(rt, &f.client, &f.server, &f.fleet))
    });
}

fn propagation(
    rt: &tokio::runtime::Runtime,
    client: &kube::Client,
    server: &Served,
    fleet: &Fleet,
) -> Result<()> {
    println!("\n## propagation: ServiceImport spec.ips change → new VIP answered");
    let mut dns = Dns::new(server.addr)?;
    let mut from_return = Vec::new();
    let mut from_start = Vec::new();
    let mut api = Vec::new();
    let mut lost = 0usize;
    let resource = import_resource();
    for k in 0..CHANGES {
        // Spread over services and namespaces; never the same service twice in a row.
        let (n, i) = fleet.service((k * 337) % fleet.services());
        let ip = Ipv4Addr::new(10, 250, (k >> 8) as u8, (k & 255) as u8);
        let want: BTreeSet<Ipv4Addr> = [ip].into();
        let name = Name::from_ascii(fleet.fqdn(n, i))?;
        let imports: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), &fleet.namespace(n), &resource);
        let patch = json!({"spec": {"ips": [ip.to_string()]}});
        let start = Instant::now();
        rt.block_on(timed_call(imports.patch(
            &format!("svc-{i}"),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )))
        .with_context(|| format!("patch {}/svc-{i}", fleet.namespace(n)))?;
        let returned = Instant::now();
        match dns.poll_until(&name, returned, PROPAGATION_TIMEOUT, |a| {
            a.rcode == ResponseCode::NoError && a.ips == want
        }) {
            Some(seen) => {
                from_return.push(seen.duration_since(returned));
                from_start.push(seen.duration_since(start));
                api.push(returned.duration_since(start));
            }
            None => {
                lost += 1;
                eprintln!("[bench] change {k} ({}/svc-{i} → {ip}) not served within 5 s", fleet.namespace(n));
                if lost >= 10 {
                    bail!("10 changes not served within 5 s; server log:\n{}", server.log());
                }
            }
        }
    }
    println!(
        "\n{CHANGES} changes, one at a time, each a JSON merge patch of one import's spec.ips \
         (service k·337 mod 1000); DNS polled over UDP every {} ms:\n",
        POLL_EVERY.as_millis()
    );
    println!("| measured | n | p50 | p90 | p99 | max | goal |");
    println!("|---|---|---|---|---|---|---|");
    row("write returned → new VIP answered", &mut from_return, "p99 ≤ 100 ms");
    row("write issued → new VIP answered", &mut from_start, "");
    row("API write (patch) round trip", &mut api, "");
    println!("\nnot served within {} s: {lost}", PROPAGATION_TIMEOUT.as_secs());
    Ok(())
}
