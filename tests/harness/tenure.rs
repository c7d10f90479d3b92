//! `sync --shards` replicas under a seeded schedule of faults on real
//! clusters, checked from the API servers' own audit logs (Jepsen's way:
//! faults on a schedule, every operation checked against a history, not a
//! few hand-picked moments).
//!
//! [`run`] starts the replicas, changes exports in random members while
//! injecting one fault at a time: a replica frozen (SIGSTOP) past its Lease
//! and resumed, a replica killed and restarted, a member's kube-apiserver
//! frozen or restarted, the Leases' cluster frozen. [`check`] then reads
//! every cluster's audit log: each Lease write that succeeded says who held
//! which shard from when; each write of a replica says, in the Audit-ID its
//! client stamps (`fence-<shard>-<unix µs>-<n>`, `k8s::fence`), which
//! shard's fence it passed and when. A write whose fence passed after
//! another replica took that shard's Lease is a **fence failure**; one that
//! passed while the Lease was its replica's but reached its API server
//! after another's takeover (sent just before its replica, or its API
//! server, was frozen) was **in flight**, the one exception a Kubernetes
//! API allows (it has no fencing token to refuse it). [`converged`] says
//! whether every member holds exactly what the exports want. The clocks
//! compared are one machine's.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::{Value, json};

use super::clusters::{Component, TestClusters};
use super::process::Frozen;
use super::syncing::Syncing;

/// What the API servers audit: writes of the objects `sync` writes
/// (Metadata: who, what, when, the Audit-ID) and of Leases (Request: the
/// holder written).
pub const AUDIT_POLICY: &str = r#"apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Request
    verbs: [create, update, patch, delete]
    resources:
      - group: coordination.k8s.io
        resources: [leases]
  - level: Metadata
    verbs: [create, update, patch, delete]
    resources:
      - group: ""
        resources: [services]
      - group: discovery.k8s.io
        resources: [endpointslices]
      - group: multicluster.x-k8s.io
        resources: [serviceimports, serviceimports/status, serviceexports, serviceexports/status]
  - level: None
"#;

/// The `CLUSTERS_APISERVER_ARGS` that make every API server write its
/// audit log to its log, with [`AUDIT_POLICY`] written into `dir`.
pub fn audit_args(dir: &Path) -> String {
    let policy = dir.join("tenure-audit-policy.yaml");
    std::fs::write(&policy, AUDIT_POLICY).expect("write the audit policy");
    format!("--audit-policy-file={} --audit-log-path=-", policy.display())
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Seeds the faults and the changes: the same seed, the same schedule.
    pub seed: u64,
    /// How long faults are injected.
    pub run_for: Duration,
    /// `sync` replicas.
    pub replicas: usize,
    /// `--shards`.
    pub shards: u32,
    /// `--lease-duration`, seconds.
    pub lease: u64,
    /// Service names the changes pick from.
    pub services: usize,
    /// The namespace of the exports (and the Lease's name).
    pub namespace: String,
}

impl Plan {
    /// The Lease of shard `i`.
    pub fn lease_name(&self, i: u32) -> String {
        let name = format!("tenure-{}", self.namespace);
        if self.shards <= 1 { name } else { format!("{name}-{i}") }
    }
}

/// A fault as injected, for the report (and a replay by seed).
#[derive(Debug, Clone)]
pub struct Injected {
    /// Seconds from the start.
    pub at: f64,
    /// How long it lasted, seconds.
    pub lasted: f64,
    /// What it was.
    pub what: String,
}

/// What a run did.
pub struct Ran {
    /// The faults, in order.
    pub faults: Vec<Injected>,
    /// Changes of exports made.
    pub changes: usize,
    /// When the last fault ended.
    pub quiet_since: Instant,
    /// The replicas, still running.
    pub replicas: Vec<Syncing>,
}

/// Members a change must not be sent to now (frozen or restarting).
type Away = Arc<Mutex<BTreeSet<usize>>>;

fn replica(clusters: &TestClusters, plan: &Plan, r: usize) -> Syncing {
    let (lease, shards, duration, id) = (
        format!("tenure-{}", plan.namespace),
        plan.shards.to_string(),
        plan.lease.to_string(),
        format!("replica-{r}"),
    );
    let args = [
        "--namespace",
        &plan.namespace,
        "--lease-name",
        &lease,
        "--shards",
        &shards,
        "--lease-duration",
        &duration,
        "--identity",
        &id,
    ];
    Syncing::start(clusters, &args, &[])
}

/// Runs `plan` on `clusters` (started with [`audit_args`]): its replicas,
/// a change of an export about every second, and one fault at a time,
/// each followed by a quiet spell of a lease duration or more. Prints each
/// fault as it starts.
pub fn run(clusters: &TestClusters, plan: &Plan) -> Ran {
    let mut rng = fastrand::Rng::with_seed(plan.seed);
    let mut replicas: Vec<Syncing> = (0..plan.replicas).map(|r| replica(clusters, plan, r)).collect();
    let away: Away = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let changer = {
        let (away, stop, plan) = (away.clone(), stop.clone(), plan.clone());
        let kubeconfigs: Vec<_> = (0..clusters.len()).map(|i| clusters.kubeconfig(i)).collect();
        let seed = rng.u64(..);
        std::thread::spawn(move || changes(&kubeconfigs, &plan, seed, &away, &stop))
    };
    let start = Instant::now();
    let lease = Duration::from_secs(plan.lease);
    let mut faults = Vec::new();
    // The first fault once every replica is up and the shards are led.
    std::thread::sleep(lease * 2);
    while start.elapsed() < plan.run_for {
        let at = start.elapsed().as_secs_f64();
        let began = Instant::now();
        // A replica fault hits one that leads a shard, when one does: a
        // replica leading nothing moves no shard when it stops.
        let leading: Vec<usize> = (0..replicas.len())
            .filter(|&r| replicas[r].metric("clusterset_dns_sync_leader") == Some(1.0))
            .collect();
        let victim = |rng: &mut fastrand::Rng| {
            if leading.is_empty() {
                rng.usize(0..plan.replicas)
            } else {
                leading[rng.usize(0..leading.len())]
            }
        };
        let what = match rng.u32(0..5) {
            0 => {
                let r = victim(&mut rng);
                let d = lease + Duration::from_millis(rng.u64(500..=plan.lease * 1500));
                eprintln!("[tenure] {at:.0} s: replica-{r} frozen for {:.1} s", d.as_secs_f64());
                replicas[r].signal("STOP");
                std::thread::sleep(d);
                replicas[r].signal("CONT");
                format!("replica-{r} frozen {:.1} s", d.as_secs_f64())
            }
            1 => {
                let r = victim(&mut rng);
                let d = Duration::from_millis(rng.u64(0..=plan.lease * 1000));
                eprintln!("[tenure] {at:.0} s: replica-{r} killed, restarted after {:.1} s", d.as_secs_f64());
                replicas[r].kill();
                std::thread::sleep(d);
                replicas[r] = replica(clusters, plan, r);
                format!("replica-{r} killed, restarted after {:.1} s", d.as_secs_f64())
            }
            2 => {
                let m = rng.usize(0..clusters.len());
                let d = Duration::from_millis(rng.u64(2000..=plan.lease * 2000));
                eprintln!(
                    "[tenure] {at:.0} s: {} API server frozen for {:.1} s",
                    clusters.name(m),
                    d.as_secs_f64()
                );
                away.lock().expect("away").insert(m);
                let frozen = Frozen::new(clusters.pids(m).0);
                std::thread::sleep(d);
                drop(frozen);
                away.lock().expect("away").remove(&m);
                let lease_cluster = if m == 0 { " (the Leases' cluster)" } else { "" };
                format!("{} API server frozen {:.1} s{lease_cluster}", clusters.name(m), d.as_secs_f64())
            }
            3 => {
                let m = rng.usize(0..clusters.len());
                eprintln!("[tenure] {at:.0} s: {} API server restarted", clusters.name(m));
                away.lock().expect("away").insert(m);
                clusters.stop(m, Component::ApiServer);
                clusters.start_component(m, Component::ApiServer);
                away.lock().expect("away").remove(&m);
                format!("{} API server restarted", clusters.name(m))
            }
            _ => {
                // The Leases' cluster (the first member's) frozen past the
                // Lease: every fence closes; nobody writes until it thaws.
                let d = lease + Duration::from_millis(rng.u64(500..=plan.lease * 1000));
                eprintln!("[tenure] {at:.0} s: the Leases' cluster frozen for {:.1} s", d.as_secs_f64());
                away.lock().expect("away").insert(0);
                let frozen = Frozen::new(clusters.pids(0).0);
                std::thread::sleep(d);
                drop(frozen);
                away.lock().expect("away").remove(&0);
                format!("the Leases' cluster ({}) frozen {:.1} s", clusters.name(0), d.as_secs_f64())
            }
        };
        faults.push(Injected { at, lasted: began.elapsed().as_secs_f64(), what });
        std::thread::sleep(lease + Duration::from_millis(rng.u64(0..=plan.lease * 1000)));
    }
    let quiet_since = Instant::now();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let changes = changer.join().expect("the changes' thread");
    Ran { faults, changes, quiet_since, replicas }
}

/// The user's side: about every second, one of create, change (an
/// endpoint's address) or delete of an export of a random service in a
/// random member that is not away, each call bounded (a member that froze
/// meanwhile fails it). Returns the changes made.
fn changes(
    kubeconfigs: &[std::path::PathBuf],
    plan: &Plan,
    seed: u64,
    away: &Away,
    stop: &std::sync::atomic::AtomicBool,
) -> usize {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let mut clients = Vec::new();
        for k in kubeconfigs {
            clients.push(client(k).await);
        }
        for c in &clients {
            let ns: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(c.clone());
            let body = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": plan.namespace}});
            ns.patch(&plan.namespace, &PatchParams::apply("tenure").force(), &Patch::Apply(&body))
                .await
                .expect("create the namespace");
        }
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut made = 0;
        let mut generation = 0u32;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(rng.u64(500..1500))).await;
            let m = rng.usize(0..clients.len());
            if away.lock().expect("away").contains(&m) {
                continue;
            }
            let svc = format!("svc-{}", rng.usize(0..plan.services));
            generation += 1;
            let done = tokio::time::timeout(Duration::from_secs(5), async {
                if rng.u32(0..4) == 0 {
                    unexport(&clients[m], &plan.namespace, &svc).await
                } else {
                    let address =
                        format!("10.{}.{}.{}", 100 + m, generation % 250, 1 + generation / 250 % 250);
                    export(&clients[m], &plan.namespace, &svc, &address).await
                }
            })
            .await;
            if matches!(done, Ok(Ok(()))) {
                made += 1;
            }
        }
        made
    })
}

async fn client(kubeconfig: &Path) -> kube::Client {
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(kubeconfig).expect("kubeconfig"),
        &Default::default(),
    )
    .await
    .expect("config");
    kube::Client::try_from(config).expect("client")
}

fn export_resource() -> ApiResource {
    clusterset_dns::k8s::mcs::mcs_resource("v1alpha1", "ServiceExport", "serviceexports")
}

/// A Service on port 80, one slice with one ready endpoint at `address`,
/// and its ServiceExport.
async fn export(c: &kube::Client, ns: &str, svc: &str, address: &str) -> Result<(), kube::Error> {
    let pp = PatchParams::apply("tenure").force();
    let services: Api<Service> = Api::namespaced(c.clone(), ns);
    let body = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": svc, "namespace": ns},
                      "spec": {"ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}});
    services.patch(svc, &pp, &Patch::Apply(&body)).await?;
    let slices: Api<EndpointSlice> = Api::namespaced(c.clone(), ns);
    let slice = format!("{svc}-src");
    let body = json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                      "metadata": {"name": slice, "namespace": ns,
                                   "labels": {"kubernetes.io/service-name": svc,
                                              "endpointslice.kubernetes.io/managed-by": "tenure"}},
                      "addressType": "IPv4",
                      "endpoints": [{"addresses": [address], "conditions": {"ready": true}}],
                      "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]});
    slices.patch(&slice, &pp, &Patch::Apply(&body)).await?;
    let exports: Api<DynamicObject> = Api::namespaced_with(c.clone(), ns, &export_resource());
    let ar = export_resource();
    let body = json!({"apiVersion": ar.api_version, "kind": "ServiceExport", "metadata": {"name": svc, "namespace": ns}});
    exports.patch(svc, &pp, &Patch::Apply(&body)).await?;
    Ok(())
}

async fn unexport(c: &kube::Client, ns: &str, svc: &str) -> Result<(), kube::Error> {
    let exports: Api<DynamicObject> = Api::namespaced_with(c.clone(), ns, &export_resource());
    match exports.delete(svc, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Every member holds exactly what the exports want: a ServiceImport of
/// ours for each exported service, none other, and MCS slices of ours
/// whose ready addresses are the union of the exporting members' own
/// slices. `Err` says the first difference found.
pub async fn converged(clusters: &TestClusters, ns: &str) -> Result<(), String> {
    let mut clients = Vec::new();
    for i in 0..clusters.len() {
        clients.push(clusters.client(i).await);
    }
    let ours = ListParams::default().labels("app.kubernetes.io/managed-by=clusterset-dns-sync");
    let fail = |e: kube::Error| e.to_string();
    // What the exports want: per service, the addresses of its exporters.
    let mut wanted: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for c in &clients {
        let exports: Api<DynamicObject> = Api::namespaced_with(c.clone(), ns, &export_resource());
        let services: Api<Service> = Api::namespaced(c.clone(), ns);
        let slices: Api<EndpointSlice> = Api::namespaced(c.clone(), ns);
        let with_service: BTreeSet<String> = services
            .list(&ListParams::default())
            .await
            .map_err(fail)?
            .items
            .into_iter()
            .filter_map(|s| s.metadata.name)
            .collect();
        let sources = slices
            .list(&ListParams::default().labels("endpointslice.kubernetes.io/managed-by=tenure"))
            .await
            .map_err(fail)?;
        for e in exports.list(&ListParams::default()).await.map_err(fail)?.items {
            let Some(name) = e.metadata.name else { continue };
            if !with_service.contains(&name) {
                continue;
            }
            let entry = wanted.entry(name.clone()).or_default();
            for s in sources.items.iter().filter(|s| {
                s.metadata.labels.as_ref().and_then(|l| l.get("kubernetes.io/service-name")) == Some(&name)
            }) {
                entry.extend(ready(s));
            }
        }
    }
    let imports = clusterset_dns::k8s::mcs::mcs_resource("v1beta1", "ServiceImport", "serviceimports");
    for (i, c) in clients.iter().enumerate() {
        let api: Api<DynamicObject> = Api::namespaced_with(c.clone(), ns, &imports);
        let held: BTreeSet<String> =
            api.list(&ours).await.map_err(fail)?.items.into_iter().filter_map(|o| o.metadata.name).collect();
        let want: BTreeSet<String> = wanted.keys().cloned().collect();
        if held != want {
            return Err(format!("{}: ServiceImports {held:?}, the exports want {want:?}", clusters.name(i)));
        }
        let slices: Api<EndpointSlice> = Api::namespaced(c.clone(), ns);
        let mut got: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for s in slices.list(&ours).await.map_err(fail)?.items {
            let svc = s
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("multicluster.kubernetes.io/service-name"))
                .cloned()
                .unwrap_or_default();
            got.entry(svc).or_default().extend(ready(&s));
        }
        got.retain(|_, a| !a.is_empty());
        let mut want = wanted.clone();
        want.retain(|_, a| !a.is_empty());
        if got != want {
            return Err(format!(
                "{}: MCS slices' addresses {got:?}, the exports want {want:?}",
                clusters.name(i)
            ));
        }
    }
    Ok(())
}

fn ready(s: &EndpointSlice) -> impl Iterator<Item = String> + '_ {
    s.endpoints
        .iter()
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) != Some(false))
        .flat_map(|e| e.addresses.iter().cloned())
}

/// What the audit logs say.
#[derive(Debug, Default)]
pub struct Verdict {
    /// Writes by a replica that carried a fence's Audit-ID, checked.
    pub checked: usize,
    /// Of them, refused by the API server (4xx, 5xx).
    pub refused: usize,
    /// Successful Lease writes read (takes, renewals, releases).
    pub lease_writes: usize,
    /// A Lease taken by a replica from another (or from none after a
    /// release).
    pub takeovers: usize,
    /// Fence failures: the fence passed after another replica took the
    /// shard's Lease. Must be none.
    pub after_takeover: Vec<String>,
    /// Passed while the Lease was the replica's, received after another's
    /// takeover: in flight at a freeze.
    pub in_flight: Vec<String>,
    /// Writes by a replica without a fence's Audit-ID. Must be none.
    pub unattributed: Vec<String>,
}

/// One audit event, as far as the checker reads it.
struct Event {
    verb: String,
    resource: String,
    namespace: String,
    name: String,
    code: u16,
    agent: String,
    audit_id: String,
    received_us: i64,
    holder: Option<String>,
    cluster: String,
}

fn events(clusters: &TestClusters) -> Vec<Event> {
    let mut out = Vec::new();
    for i in 0..clusters.len() {
        let log = std::fs::read_to_string(clusters.apiserver_log(i)).expect("apiserver log");
        for line in log.lines().filter(|l| l.starts_with('{') && l.contains("audit.k8s.io")) {
            let Ok(e) = serde_json::from_str::<Value>(line) else { continue };
            let s = |p: &str| e.pointer(p).and_then(Value::as_str).unwrap_or("").to_owned();
            if s("/stage") != "ResponseComplete" {
                continue;
            }
            let received =
                s("/requestReceivedTimestamp").parse::<Timestamp>().map_or(0, |t| t.as_microsecond());
            let mut resource = s("/objectRef/resource");
            if !s("/objectRef/subresource").is_empty() {
                resource = format!("{resource}/{}", s("/objectRef/subresource"));
            }
            out.push(Event {
                verb: s("/verb"),
                resource,
                namespace: s("/objectRef/namespace"),
                name: s("/objectRef/name"),
                code: e
                    .pointer("/responseStatus/code")
                    .and_then(Value::as_u64)
                    .and_then(|c| u16::try_from(c).ok())
                    .unwrap_or(0),
                agent: s("/userAgent"),
                audit_id: s("/auditID"),
                received_us: received,
                holder: e
                    .pointer("/requestObject/spec/holderIdentity")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
                cluster: clusters.name(i).to_owned(),
            });
        }
    }
    out
}

/// Checks every write `sync` replicas made in `plan`'s namespace against
/// who held its shard's Lease, from the audit logs of every cluster.
pub fn check(clusters: &TestClusters, plan: &Plan) -> Verdict {
    let all = events(clusters);
    let mut v = Verdict::default();
    // Per shard: (received µs, holder after), successful Lease writes in order.
    let mut held: Vec<Vec<(i64, Option<String>)>> = vec![Vec::new(); plan.shards as usize];
    for e in all.iter().filter(|e| {
        e.resource == "leases" && (e.verb == "update" || e.verb == "create") && (200..300).contains(&e.code)
    }) {
        let Some(shard) = (0..plan.shards).find(|i| plan.lease_name(*i) == e.name) else { continue };
        held[shard as usize].push((e.received_us, e.holder.clone().filter(|h| !h.is_empty())));
        v.lease_writes += 1;
    }
    for timeline in &mut held {
        timeline.sort_by_key(|(t, _)| *t);
        v.takeovers += timeline.windows(2).filter(|w| w[1].1.is_some() && w[0].1 != w[1].1).count();
    }
    let holder_at = |shard: usize, t: i64| -> Option<&str> {
        let timeline = &held[shard];
        let n = timeline.partition_point(|(at, _)| *at <= t);
        n.checked_sub(1).and_then(|k| timeline[k].1.as_deref())
    };
    let written = [
        "services",
        "endpointslices",
        "serviceimports",
        "serviceimports/status",
        "serviceexports",
        "serviceexports/status",
    ];
    for e in all.iter().filter(|e| e.namespace == plan.namespace && written.contains(&e.resource.as_str())) {
        let Some(who) = e.agent.split(" sync/").nth(1) else { continue };
        let what = format!(
            "{} {} {} {}/{} by {who} ({})",
            e.cluster, e.verb, e.resource, e.namespace, e.name, e.audit_id
        );
        let Some((shard, checked_us)) = fence_of(&e.audit_id) else {
            v.unattributed.push(what);
            continue;
        };
        v.checked += 1;
        if e.code >= 400 {
            v.refused += 1;
        }
        if shard >= plan.shards as usize {
            v.unattributed.push(what);
        } else if holder_at(shard, checked_us) != Some(who) {
            let holder = holder_at(shard, checked_us).unwrap_or("nobody");
            v.after_takeover.push(format!("{what}: its fence passed while {holder} held shard {shard}"));
        } else if holder_at(shard, e.received_us) != Some(who) {
            let holder = holder_at(shard, e.received_us).unwrap_or("nobody");
            let late = (e.received_us - checked_us) as f64 / 1e6;
            v.in_flight.push(format!(
                "{what}: received {late:.3} s after its fence passed, while {holder} held shard {shard}"
            ));
        }
    }
    v
}

/// The shard and the time (unix µs) of a fence's Audit-ID
/// (`fence-<shard>-<µs>-<n>`).
fn fence_of(id: &str) -> Option<(usize, i64)> {
    let mut parts = id.strip_prefix("fence-")?.split('-');
    let shard = parts.next()?.parse().ok()?;
    let at = parts.next()?.parse().ok()?;
    Some((shard, at))
}

/// Waits (up to `limit`) until [`converged`]; how long it took, or the last
/// difference.
pub fn converge(
    clusters: &TestClusters,
    ns: &str,
    limit: Duration,
    rt: &tokio::runtime::Runtime,
) -> Result<Duration, String> {
    let start = Instant::now();
    loop {
        match rt.block_on(converged(clusters, ns)) {
            Ok(()) => return Ok(start.elapsed()),
            Err(e) if start.elapsed() >= limit => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(500)),
        }
    }
}
