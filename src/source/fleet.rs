//! Centralized mode: one store source fed by every member's ServiceExports,
//! Services and EndpointSlices directly, with no ServiceImport anywhere.
//!
//! Each change recomputes only the services it touched: the KEP merge of
//! their exports gives the import, and the exporting clusters' own
//! EndpointSlices give the endpoints. A ClusterSetIP service has no
//! clusterset VIP without the sync controller, so its A/AAAA answers are the
//! exporting clusters' ClusterIPs (oldest export first), as Submariner
//! Lighthouse answers on networks where ClusterIPs are routable fleet-wide.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use tokio::sync::mpsc;
use tracing::{info, warn};

use super::SourceId;
use super::objects::Object;
use crate::fleet::member::{self, Member, MemberConfig};
use crate::fleet::merge::merge;
use crate::fleet::state::{FleetState, MemberEvent};
use crate::model::{ImportType, Port, ServiceImport, ServiceKey};
use crate::source::kube::ClientError;
use crate::store::{ObjectId, Update};

/// How long a member may take to answer its first lists before the store is
/// declared ready without it (its objects arrive when it does).
pub const FIRST_SYNC_TIMEOUT: Duration = Duration::from_secs(30);
/// How long to wait for a member's ClusterProperty at start.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Connects to every member (learning cluster ids), for watches in
/// `namespaces` (all when empty).
pub async fn connect(members: &[MemberConfig], namespaces: &[String]) -> Result<Vec<Member>, ClientError> {
    let mut connected = Vec::with_capacity(members.len());
    for m in members {
        connected.push(member::connect(m, CONNECT_TIMEOUT, namespaces).await?);
    }
    Ok(connected)
}

/// Runs the fleet source: watches every member and sends the merged view to
/// the store as `source`.
pub async fn run(members: Vec<Member>, source: SourceId, updates: mpsc::Sender<Update>) {
    let (tx, mut rx) = mpsc::channel::<MemberEvent>(1024);
    for (i, m) in members.iter().enumerate() {
        member::spawn_watches(i, m, &[], tx.clone());
    }
    drop(tx);
    let mut state = FleetState::new(members.iter().map(|m| m.cluster.clone()).collect(), 1);
    let mut sent: HashMap<ServiceKey, BTreeSet<ObjectId>> = HashMap::new();
    let mut dirty = BTreeSet::new();
    let deadline = tokio::time::Instant::now() + FIRST_SYNC_TIMEOUT;
    let mut first_sent = false;
    loop {
        let event = if first_sent {
            rx.recv().await
        } else {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(e) => e,
                Err(_) => {
                    let late: Vec<&str> = members
                        .iter()
                        .zip(state.members())
                        .filter(|(_, s)| !s.synced())
                        .map(|(m, _)| m.name.as_str())
                        .collect();
                    warn!(members = ?late, "members not listed within {FIRST_SYNC_TIMEOUT:?}; serving without them for now");
                    None
                }
            }
        };
        if let Some(event) = event {
            state.apply(event, &mut dirty);
            // Take everything already queued, so a burst costs one recompute.
            while let Ok(event) = rx.try_recv() {
                state.apply(event, &mut dirty);
            }
        } else if first_sent {
            return; // every watch ended: shutting down
        }
        if !first_sent {
            if !state.synced() && tokio::time::Instant::now() < deadline {
                continue;
            }
            let mut objects = Vec::new();
            for key in std::mem::take(&mut dirty) {
                let objs = service_objects(&state, &key);
                sent.insert(key, objs.iter().map(Object::id).collect());
                objects.extend(objs);
            }
            info!(services = sent.len(), "fleet listed");
            sent.retain(|_, ids| !ids.is_empty());
            if updates.send(Update::Replace { source, objects }).await.is_err() {
                return;
            }
            first_sent = true;
            continue;
        }
        for key in std::mem::take(&mut dirty) {
            let objs = service_objects(&state, &key);
            let ids: BTreeSet<ObjectId> = objs.iter().map(Object::id).collect();
            let old = sent.remove(&key).unwrap_or_default();
            for id in old.difference(&ids) {
                if updates.send(Update::Remove { source, id: id.clone() }).await.is_err() {
                    return;
                }
            }
            for object in objs {
                if updates.send(Update::Upsert { source, object }).await.is_err() {
                    return;
                }
            }
            if !ids.is_empty() {
                sent.insert(key, ids);
            }
        }
    }
}

/// The import and endpoint sets DNS serves for `key`, from every member's
/// exports; none while no export is valid.
fn service_objects(state: &FleetState, key: &ServiceKey) -> Vec<Object> {
    let exports = state.exports(key);
    let merged = merge(&exports);
    let Some(spec) = merged.spec else { return Vec::new() };
    let mut ips = Vec::new();
    if spec.kind == ImportType::ClusterSetIp {
        for cluster in &merged.clusters {
            let export = exports.iter().find(|e| &e.cluster == cluster);
            if let Some(crate::fleet::export::Exported::Service(s)) = export.map(|e| &e.service) {
                ips.extend(s.cluster_ips.iter().copied());
            }
        }
    }
    let ports = spec
        .ports
        .iter()
        .map(|p| Port { name: p.name.clone(), protocol: p.protocol, port: p.port })
        .collect();
    // trafficDistribution is merged like every global property; the
    // `clusterset-dns.io/…` annotations live on ServiceImports, which
    // centralized mode does not have.
    let prefer_close = matches!(spec.traffic_distribution.as_deref(), Some("PreferClose" | "PreferSameZone"));
    let answers = crate::model::AnswerOverrides { prefer_close, ..Default::default() };
    let import = ServiceImport { key: key.clone(), kind: spec.kind, ips, ports, answers };
    let mut objects = vec![Object::Import(import)];
    objects.extend(state.endpoint_sets(key, &merged.clusters).into_iter().map(Object::Slice));
    objects
}
