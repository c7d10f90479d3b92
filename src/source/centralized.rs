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
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::fleet::member::{self, Member};
use crate::fleet::merge::merge;
use crate::fleet::state::{FleetState, MemberEvent};
use crate::k8s::watch::Lists;
use crate::model::{ClusterId, ImportType, Port, ServiceImport, ServiceKey};
use crate::store::{Object, ObjectId, Relists, SourceId, Update};

/// How long a member may take to answer its first lists before the store is
/// declared ready without it (its objects arrive when it does).
pub const FIRST_SYNC_TIMEOUT: Duration = Duration::from_secs(30);
/// Where the fleet source sends: its store source, the store's queue, and
/// where the store asks it to list again.
pub struct To {
    /// The store source.
    pub source: SourceId,
    /// The store's queue.
    pub updates: mpsc::Sender<Update>,
    /// Where the store's memory budget asks for a complete state again.
    pub relists: Relists,
}

/// Why a listing of the fleet ended without shutting down.
enum Again {
    /// A member's cluster id changed: the new ids.
    Ids(Vec<ClusterId>),
    /// The store asked for the fleet's complete state again.
    Asked,
}

/// Runs the fleet source: watches every member and sends the merged view to
/// the store as `to.source`. Each member's cluster id is read again every
/// [`member::ID_RECHECK`] (a ClusterProperty created after start, or first
/// read after a member that did not answer at start); when one changes,
/// the fleet is listed again under the new ids and replaces what was sent,
/// and `liveness` follows the new id. When the store asks (`to.relists`:
/// it refused some of what was sent, and fits again), the fleet is listed
/// again the same way.
pub async fn run(members: Vec<Member>, lists: Lists, to: To, liveness: Arc<Liveness>) {
    let (ids_tx, mut ids) = tokio::sync::watch::channel(members.iter().map(|m| m.cluster.clone()).collect());
    // Dropped (aborted) with this source.
    let mut follow = tokio::task::JoinSet::new();
    follow.spawn(member::follow_ids(members.clone(), ids_tx));
    let mut members = members;
    // Each member's API server allows streaming lists or not by itself.
    let lists: Vec<Lists> = members.iter().map(|_| lists.for_another_server()).collect();
    let updates = &to.updates;
    while let Some(again) = fleet(&members, &lists, &to, &mut ids).await {
        let now = match again {
            Again::Ids(now) => now,
            Again::Asked => {
                info!("listing the fleet again, as the store asked");
                continue;
            }
        };
        for (i, (m, id)) in members.iter_mut().zip(now).enumerate() {
            if m.cluster == id {
                continue;
            }
            if let Some((current, alive)) = liveness.clusters.get(i) {
                current.store(Arc::new(id.clone()));
                // A verdict of not alive moves to the new id.
                if !alive.load(Ordering::Relaxed) {
                    for (cluster, alive) in [(m.cluster.clone(), true), (id.clone(), false)] {
                        if updates.send(Update::ClusterLiveness { cluster, alive }).await.is_err() {
                            return;
                        }
                    }
                }
            }
            m.cluster = id;
        }
        info!("a member's cluster id changed: listing the fleet again under the new ids");
    }
    // Ended: shutting down, or the id follower died. Either way this source
    // returns, and the supervisor logs and restarts it (follower included);
    // a follower's panic, when its result is in already, is passed on for
    // the supervisor to count. It never dies unseen beside a source left
    // running on stale ids.
    if let Some(Err(e)) = follow.try_join_next()
        && e.is_panic()
    {
        std::panic::resume_unwind(e.into_panic());
    }
}

/// The fleet's first complete state: the objects of every service in
/// `dirty`, each service's object ids remembered in `sent`.
fn first_list(
    state: &FleetState,
    dirty: BTreeSet<ServiceKey>,
    sent: &mut HashMap<ServiceKey, BTreeSet<ObjectId>>,
) -> Vec<Object> {
    let mut objects = Vec::new();
    for key in dirty {
        let objs = service_objects(state, &key);
        sent.insert(key, objs.iter().map(Object::id).collect());
        objects.extend(objs);
    }
    info!(services = sent.len(), "fleet listed");
    sent.retain(|_, ids| !ids.is_empty());
    objects
}

/// Sends the store what changed of service `key`: the removal of each
/// object sent before that it no longer has, then its objects. `None`:
/// the store is gone.
async fn send_changes(
    state: &FleetState,
    key: ServiceKey,
    sent: &mut HashMap<ServiceKey, BTreeSet<ObjectId>>,
    to: &To,
) -> Option<()> {
    let source = to.source;
    let objs = service_objects(state, &key);
    let ids: BTreeSet<ObjectId> = objs.iter().map(Object::id).collect();
    let old = sent.remove(&key).unwrap_or_default();
    for id in old.difference(&ids) {
        to.updates.send(Update::Remove { source, id: id.clone() }).await.ok()?;
    }
    for object in objs {
        to.updates.send(Update::Upsert { source, object }).await.ok()?;
    }
    if !ids.is_empty() {
        sent.insert(key, ids);
    }
    Some(())
}

/// Watches every member and sends the merged view until the watches end
/// (`None`: shutting down), a member's cluster id changes or the store
/// asks for the fleet again (`Some`).
async fn fleet(
    members: &[Member],
    lists: &[Lists],
    to: &To,
    ids: &mut tokio::sync::watch::Receiver<Vec<ClusterId>>,
) -> Option<Again> {
    let (source, updates) = (to.source, &to.updates);
    // This listing answers every ask made before it.
    to.relists.take(|s| s == source);
    let mut asked = std::pin::pin!(to.relists.asked(|s| s == source));
    let (tx, mut rx) = mpsc::channel::<MemberEvent>(1024);
    // The watches live as long as this listing.
    let mut watches = tokio::task::JoinSet::new();
    for (i, (m, lists)) in members.iter().zip(lists).enumerate() {
        member::spawn_watches(&mut watches, i, m, &[], lists, tx.clone());
    }
    drop(tx);
    let mut state = FleetState::new(members.iter().map(|m| m.cluster.clone()).collect(), 1);
    let mut sent: HashMap<ServiceKey, BTreeSet<ObjectId>> = HashMap::new();
    let mut dirty = BTreeSet::new();
    let deadline = tokio::time::Instant::now() + FIRST_SYNC_TIMEOUT;
    let mut first_sent = false;
    loop {
        let next = async {
            if first_sent {
                return rx.recv().await;
            }
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(e) => e,
                Err(_) => {
                    let late = members.iter().zip(state.members()).filter(|(_, s)| !s.synced());
                    let late: Vec<&str> = late.map(|(m, _)| m.name.as_str()).collect();
                    warn!(members = ?late, "members not listed within {FIRST_SYNC_TIMEOUT:?}; serving without them for now");
                    None
                }
            }
        };
        let event = tokio::select! {
            e = next => e,
            changed = ids.changed() => match changed {
                Ok(()) => return Some(Again::Ids(ids.borrow_and_update().clone())),
                // The id follower is gone: end, so that `run` reports it.
                Err(_) => return None,
            },
            _ = &mut asked => return Some(Again::Asked),
        };
        if let Some(event) = event {
            state.apply(event, &mut dirty);
            // Take everything already queued, so a burst costs one recompute.
            while let Ok(event) = rx.try_recv() {
                state.apply(event, &mut dirty);
            }
        } else if first_sent {
            return None; // every watch ended: shutting down
        }
        if !first_sent {
            if !state.synced() && tokio::time::Instant::now() < deadline {
                continue;
            }
            let objects = first_list(&state, std::mem::take(&mut dirty), &mut sent);
            updates.send(Update::Replace { source, objects }).await.ok()?;
            first_sent = true;
            continue;
        }
        for key in std::mem::take(&mut dirty) {
            send_changes(&state, key, &mut sent, to).await?;
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
    // The oldest export's `clusterset-dns.io/…` annotations configure the
    // answers, as they would on a ServiceImport; trafficDistribution is
    // merged like every global property.
    let annotations = spec.annotations.iter().map(|(k, v)| (k.as_str(), v.as_str()));
    let (mut answers, problems) = crate::model::AnswerOverrides::from_annotations(annotations);
    for p in problems {
        warn!(service = %key, "ServiceExport {key}: {p}; using the default");
    }
    answers.prefer_close |=
        matches!(spec.traffic_distribution.as_deref(), Some("PreferClose" | "PreferSameZone"));
    answers.consumers = consumers(key, &spec.annotations);
    let import =
        ServiceImport { key: key.clone(), kind: spec.kind, ips: ips.into(), ports, answers: answers.into() };
    let mut objects = vec![Object::Import(import)];
    objects.extend(state.endpoint_sets(key, &merged.clusters).into_iter().map(Object::Slice));
    objects
}

/// The consumer clusters of the oldest export (`None`: every client sees
/// the service). Centralized serve answers every cluster from one place,
/// so the list the sync controller uses to choose where it imports
/// decides here who the service exists for. A list that does not parse
/// counts as naming no cluster, failing closed like sync does.
fn consumers(
    key: &ServiceKey,
    annotations: &std::collections::BTreeMap<String, String>,
) -> Option<Vec<ClusterId>> {
    let value = annotations.get(crate::fleet::objects::ANNOTATION_CONSUMER_CLUSTERS)?;
    match crate::model::parse_clusters(value) {
        Ok(list) => Some(list),
        Err(e) => {
            warn!(service = %key, "ServiceExport {key}: annotation {}: {e}; answered to no client until fixed",
                  crate::fleet::objects::ANNOTATION_CONSUMER_CLUSTERS);
            Some(Vec::new())
        }
    }
}

/// How often each member's liveness is looked at (and its API asked).
const LIVENESS_TICK: Duration = Duration::from_secs(1);
/// Longest wait for a member's API to answer the liveness request.
const LIVENESS_PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// The liveness of every member, shared with `/metrics`.
#[derive(Debug)]
pub struct Liveness {
    /// Per member: its cluster id (it may change: [`run`]) and whether it is
    /// alive now.
    pub clusters: Vec<(ArcSwap<ClusterId>, AtomicBool)>,
}

impl Liveness {
    /// Every member alive (the state before any verdict).
    pub fn new(members: &[Member]) -> Arc<Self> {
        Arc::new(Self {
            clusters: members
                .iter()
                .map(|m| (ArcSwap::from_pointee(m.cluster.clone()), AtomicBool::new(true)))
                .collect(),
        })
    }

    /// Member `index`'s cluster id now.
    fn cluster(&self, index: usize) -> Option<Arc<ClusterId>> {
        self.clusters.get(index).map(|(c, _)| c.load_full())
    }
}

/// Watches every member's liveness and tells the store: a member whose
/// watches have failed, or whose API has not answered, for `dead_after` is
/// not alive (`Update::ClusterLiveness`), so its endpoints are demoted in
/// every answer (kept, not deleted: a partition heals without a relist
/// costing answers). It is alive again once its API answers and every one
/// of its watches has relisted.
pub async fn liveness(
    members: Vec<Member>,
    dead_after: Duration,
    state: Arc<Liveness>,
    updates: mpsc::Sender<Update>,
) {
    let mut tasks = tokio::task::JoinSet::new();
    for (i, m) in members.into_iter().enumerate() {
        tasks.spawn(member_liveness(m, i, dead_after, state.clone(), updates.clone()));
    }
    while tasks.join_next().await.is_some() {}
}

async fn member_liveness(
    member: Member,
    index: usize,
    dead_after: Duration,
    state: Arc<Liveness>,
    updates: mpsc::Sender<Update>,
) {
    let mut alive = true;
    // When the API last stopped answering: a powered-off cluster sends no
    // reset, so an established watch may take minutes to notice; asking the
    // API with a timeout notices within seconds.
    let mut failing_since: Option<tokio::time::Instant> = None;
    let mut tick = tokio::time::interval(LIVENESS_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let answered =
            match tokio::time::timeout(LIVENESS_PROBE_TIMEOUT, member.client.apiserver_version()).await {
                // Any HTTP answer (even 401/403) proves the API is there.
                Ok(Ok(_)) | Ok(Err(kube::Error::Api(_))) => true,
                Ok(Err(_)) | Err(_) => false,
            };
        let now = tokio::time::Instant::now();
        failing_since = if answered { None } else { Some(failing_since.unwrap_or(now)) };
        let api_down = failing_since.map_or(0.0, |t| now.duration_since(t).as_secs_f64());
        let stale = member.stale_seconds().max(api_down);
        let verdict = if alive { stale < dead_after.as_secs_f64() } else { stale == 0.0 };
        if verdict == alive {
            continue;
        }
        alive = verdict;
        let cluster = state.cluster(index).map_or_else(|| member.cluster.clone(), |c| (*c).clone());
        if alive {
            info!(member = %member.name, %cluster, "member alive again: its endpoints are answered");
        } else {
            warn!(member = %member.name, %cluster, stale_seconds = stale,
                  "member not answering for {dead_after:?}: its endpoints are demoted in every answer");
        }
        if let Some((_, flag)) = state.clusters.get(index) {
            flag.store(alive, Ordering::Relaxed);
        }
        if updates.send(Update::ClusterLiveness { cluster, alive }).await.is_err() {
            return;
        }
    }
}
