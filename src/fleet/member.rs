//! Member clusters: connecting to each, learning its cluster id, and
//! watching its ServiceExports, Services and EndpointSlices into
//! [`MemberEvent`]s.
//!
//! Like the ServiceImport source, every watch restarts with a complete list
//! after any error (so deletions during an outage are seen) and reports its
//! staleness in [`WatchHealth`].

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DynamicObject};
use kube::runtime::watcher;
use kube::{Client, Resource};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tracing::{info, warn};

use super::objects;
use super::state::{Change, Delta, ExportInfo, MemberEvent, ServiceInfo};
use crate::k8s::client::{self, ClientError, Connection};
use crate::k8s::mcs::{CLUSTER_ID_PROPERTY, LABEL_K8S_SERVICE_NAME, cluster_property, discover_mcs};
use crate::k8s::throttle::{Limits, ThrottleStats};
use crate::k8s::watch::{self, Lists, Reporter, Translate, WatchHealth, WatchTask, scopes};
use crate::model::{ClusterId, ServiceKey, SliceKey};

/// A member as configured: `--cluster NAME=KUBECONFIG`.
#[derive(Debug, Clone)]
pub struct MemberConfig {
    /// The member's name; its cluster id unless its ClusterProperty says otherwise.
    pub name: String,
    /// How to reach its API server.
    pub connection: Connection,
}

/// A connected member.
#[derive(Clone)]
pub struct Member {
    /// The configured name.
    pub name: String,
    /// Its cluster id.
    pub cluster: ClusterId,
    /// Its API client.
    pub client: Client,
    /// Health of its watches (exports, services, slices; per scope).
    pub health: Vec<Arc<WatchHealth>>,
    /// Health of a probe of its API server, for whoever runs one (`sync`):
    /// a watch on a frozen or partitioned API server fails nothing, it
    /// only stops hearing.
    pub probe: Arc<WatchHealth>,
    /// What the client-side rate limit did to its requests (zero without one).
    pub throttle: Arc<ThrottleStats>,
    /// The fleet manager's word on its control plane: failing while its
    /// ClusterProfile says `ControlPlaneHealthy` False (always healthy for
    /// a `--cluster` member). Counted in [`Member::stale_seconds`] like a
    /// failed probe, so such a member is unreachable to the controller
    /// without a restart, whatever our own probe hears.
    pub inventory: Arc<WatchHealth>,
}

impl Member {
    /// Seconds since the member's API last answered: the largest staleness
    /// of its watches and its probe (0 while all are current).
    pub fn stale_seconds(&self) -> f64 {
        let own = self.probe.stale_seconds().max(self.inventory.stale_seconds());
        self.health.iter().map(|h| h.stale_seconds()).fold(own, f64::max)
    }
}

/// How long to wait for a member's ClusterProperty at start.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Connects to every member (learning cluster ids), for watches in
/// `namespaces` (all when empty); with `limits`, each member's client has
/// its own rate limit.
pub async fn connect_all(
    members: &[MemberConfig],
    agent: &str,
    namespaces: &[String],
    limits: Option<Limits>,
) -> Result<Vec<Member>, ClientError> {
    let mut connected = Vec::with_capacity(members.len());
    for m in members {
        connected.push(connect(m, agent, CONNECT_TIMEOUT, namespaces, limits).await?);
    }
    Ok(connected)
}

/// Connects to a member and learns its cluster id: the value of its
/// `cluster.clusterset.k8s.io` ClusterProperty when it has one, else the
/// configured name. A member that does not answer within `timeout` keeps its
/// configured name (it is watched, and retried, all the same; `sync` reads
/// the id again with [`follow_ids`]).
pub async fn connect(
    cfg: &MemberConfig,
    agent: &str,
    timeout: Duration,
    namespaces: &[String],
    limits: Option<Limits>,
) -> Result<Member, ClientError> {
    let throttle = Arc::new(ThrottleStats::default());
    let name = format!("member {}", cfg.name);
    let client = client::connect_limited(&cfg.connection, agent, limits, &name, throttle.clone()).await?;
    let named = ClusterId::parse(&cfg.name).map_err(|e| ClientError::Kubeconfig {
        path: format!("--cluster {}", cfg.name).into(),
        source: format!("member name: {e}").into(),
    })?;
    let cluster = match read_id(&client, &named, timeout).await {
        Ok(IdRead { id, note }) => {
            if let Some(note) = note {
                warn!(member = %cfg.name, "{note}");
            }
            id
        }
        Err(why) => {
            warn!(member = %cfg.name, "{why}; using the member name as cluster id");
            named
        }
    };
    info!(member = %cfg.name, cluster = %cluster, "member");
    let mut health = Vec::new();
    for scope in scopes(namespaces) {
        let within = scope.map_or_else(String::new, |ns| format!(" in {ns}"));
        for what in ["ServiceExports", "Services", "EndpointSlices"] {
            health.push(Arc::new(WatchHealth::new(format!("{what}{within} of member {}", cfg.name))));
        }
    }
    let probe = Arc::new(WatchHealth::new(format!("API probe of member {}", cfg.name)));
    let inventory =
        Arc::new(WatchHealth::new(format!("ClusterProfile ControlPlaneHealthy of member {}", cfg.name)));
    Ok(Member { name: cfg.name.clone(), cluster, client, health, probe, throttle, inventory })
}

/// A member's cluster id as its API says it now.
struct IdRead {
    id: ClusterId,
    /// Why the name stands in for a ClusterProperty that has a value.
    note: Option<String>,
}

/// Reads member's ClusterProperty: its value, or `named` when it has none
/// (or one whose value is not a cluster id); `Err` when the API did not
/// answer, which decides nothing.
async fn read_id(client: &Client, named: &ClusterId, timeout: Duration) -> Result<IdRead, String> {
    match tokio::time::timeout(timeout, cluster_property(client)).await {
        Ok(Ok(Some(value))) => match ClusterId::parse(&value) {
            Ok(id) => Ok(IdRead { id, note: None }),
            Err(e) => Ok(IdRead {
                id: named.clone(),
                note: Some(format!(
                    "ClusterProperty {CLUSTER_ID_PROPERTY} {value:?} is not a cluster id ({e}); using the member name"
                )),
            }),
        },
        Ok(Ok(None)) => Ok(IdRead { id: named.clone(), note: None }),
        Ok(Err(e)) => Err(format!("cannot read ClusterProperty {CLUSTER_ID_PROPERTY}: {e}")),
        Err(_) => Err(format!("API server did not answer within {timeout:?}")),
    }
}

/// How often [`follow_ids`] reads every member's ClusterProperty. A get of
/// one object per member: 10 a second for a 100-cluster fleet, inside the
/// members' rate limits. Not a watch: the sync identity may only `get` that
/// one ClusterProperty by name (`deploy/sync/rbac.yaml`), and a watch would
/// fail for as long as a member has no ClusterProperty CRD.
pub const ID_RECHECK: Duration = Duration::from_secs(10);

/// Reads every member's cluster id again every [`ID_RECHECK`] and sends the
/// whole list on `out` whenever one changed: a ClusterProperty created,
/// changed or deleted after start, or first read after a member that did not
/// answer at start. A member that does not answer keeps its id. Never
/// returns (unless `out` has no receiver left).
pub async fn follow_ids(members: Vec<Member>, out: tokio::sync::watch::Sender<Vec<ClusterId>>) {
    let mut ids: Vec<ClusterId> = members.iter().map(|m| m.cluster.clone()).collect();
    // Valid: `connect` refused members whose names are not cluster ids.
    let names: Vec<ClusterId> =
        members.iter().map(|m| ClusterId::parse(&m.name).unwrap_or_else(|_| m.cluster.clone())).collect();
    loop {
        tokio::time::sleep(ID_RECHECK).await;
        let reads = members.iter().zip(&names).map(|(m, named)| read_id(&m.client, named, ID_RECHECK));
        let mut changed = false;
        for ((m, read), id) in members.iter().zip(futures::future::join_all(reads).await).zip(&mut ids) {
            let Ok(IdRead { id: now, note }) = read else { continue };
            if now != *id {
                info!(member = %m.name, from = %id, to = %now, note = note.unwrap_or_default(), "cluster id changed: re-keying the member's exports");
                *id = now;
                changed = true;
            }
        }
        if changed && out.send(ids.clone()).is_err() {
            return;
        }
    }
}

/// Starts the three watches of member `index` in every scope (see
/// [`scopes`]) in `tasks` (they end with whoever owns the set), listing as
/// `lists` says, sending to `events`. The member's health list has three
/// entries per scope, in that order.
pub fn spawn_watches(
    tasks: &mut JoinSet<()>,
    index: usize,
    member: &Member,
    namespaces: &[String],
    lists: &Lists,
    events: mpsc::Sender<MemberEvent>,
) {
    for w in watch_tasks(index, member, namespaces, lists, events) {
        tasks.spawn((w.run)());
    }
}

/// The three watches of member `index` in every scope, as tasks for an
/// owner that restarts them ([`spawn_watches`] runs each once).
pub fn watch_tasks(
    index: usize,
    member: &Member,
    namespaces: &[String],
    lists: &Lists,
    events: mpsc::Sender<MemberEvent>,
) -> Vec<WatchTask> {
    let mut out = Vec::new();
    for (s, scope) in scopes(namespaces).into_iter().enumerate() {
        let health =
            |k: usize| member.health.get(s * 3 + k).cloned().unwrap_or_else(|| member.health[k].clone());
        let (exports, client, events_, h) = (
            ToFleet::new(index, member, &scope, export_entry, Change::Exports),
            member.client.clone(),
            events.clone(),
            health(0),
        );
        let lists_ = lists.clone();
        out.push(WatchTask::new(h.clone(), move || {
            let (exports, client, events, lists, h) =
                (exports.clone(), client.clone(), events_.clone(), lists_.clone(), h.clone());
            async move {
                let mut reporter = Reporter::new(h);
                let resource = discover_mcs(&client, "ServiceExport", "serviceexports", &mut reporter).await;
                let api: Api<DynamicObject> = watch::scoped_with(client, exports.scope.as_deref(), &resource);
                watch::relist(api, watcher::Config::default(), &lists, reporter, exports, events).await;
            }
        }));
        let (services, client, events_, h) = (
            ToFleet::new(index, member, &scope, service_entry, Change::Services),
            member.client.clone(),
            events.clone(),
            health(1),
        );
        let lists_ = lists.clone();
        out.push(WatchTask::new(h.clone(), move || {
            let (services, client, events, lists, h) =
                (services.clone(), client.clone(), events_.clone(), lists_.clone(), h.clone());
            async move {
                let api: Api<Service> = watch::scoped(client, services.scope.as_deref());
                watch::relist(api, watcher::Config::default(), &lists, Reporter::new(h), services, events)
                    .await;
            }
        }));
        let (slices, client, events_, h) = (
            ToFleet::new(index, member, &scope, slice_entry, Change::Slices),
            member.client.clone(),
            events.clone(),
            health(2),
        );
        let lists_ = lists.clone();
        out.push(WatchTask::new(h.clone(), move || {
            let (slices, client, events, lists, h) =
                (slices.clone(), client.clone(), events_.clone(), lists_.clone(), h.clone());
            async move {
                let cfg = watcher::Config::default().labels(LABEL_K8S_SERVICE_NAME);
                let api: Api<EndpointSlice> = watch::scoped(client, slices.scope.as_deref());
                watch::relist(api, cfg, &lists, Reporter::new(h), slices, events).await;
            }
        }));
    }
    out
}

/// One object of member `index` changed (`deleted`: gone), as its watch
/// reports it: the same conversion, for a reader of the member's objects
/// that are not watched directly (hub mode's records).
pub enum Object<'a> {
    /// A ServiceExport.
    Export(&'a DynamicObject),
    /// A Service.
    Service(&'a Service),
    /// One of a Service's own EndpointSlices.
    Slice(&'a EndpointSlice),
}

/// The event of `object` of member `index` applied or `deleted`.
pub fn event(index: usize, cluster: &ClusterId, object: Object<'_>, deleted: bool) -> Option<MemberEvent> {
    fn delta<K: Resource, V>(
        cluster: &ClusterId,
        k: &K,
        entry: fn(&ClusterId, &K) -> Option<Entry<V>>,
        deleted: bool,
    ) -> Option<Delta<V>> {
        if deleted {
            return Some(Delta::Deleted(object_id(k)?));
        }
        Some(match entry(cluster, k) {
            Some((id, key, v)) => Delta::Applied(id, key, v),
            None => Delta::Deleted(object_id(k)?),
        })
    }
    let change = match object {
        Object::Export(o) => Change::Exports(delta(cluster, o, export_entry, deleted)?),
        Object::Service(o) => Change::Services(delta(cluster, o, service_entry, deleted)?),
        Object::Slice(o) => Change::Slices(delta(cluster, o, slice_entry, deleted)?),
    };
    Some(MemberEvent { member: index, change })
}

/// A member's complete lists of exports, Services and their slices as its
/// watches report them (the same conversion), for a controller run in
/// process on objects of a test's.
pub fn listed(
    index: usize,
    cluster: &ClusterId,
    exports: &[DynamicObject],
    services: &[Service],
    slices: &[EndpointSlice],
) -> [MemberEvent; 3] {
    listed_in(index, cluster, None, (exports, services, slices))
}

/// [`listed`] for one scope (`None`: every namespace).
pub fn listed_in(
    index: usize,
    cluster: &ClusterId,
    scope: Option<String>,
    (exports, services, slices): (&[DynamicObject], &[Service], &[EndpointSlice]),
) -> [MemberEvent; 3] {
    fn all<K, V>(
        cluster: &ClusterId,
        objects: &[K],
        entry: fn(&ClusterId, &K) -> Option<Entry<V>>,
    ) -> Vec<Entry<V>> {
        objects.iter().filter_map(|o| entry(cluster, o)).collect()
    }
    [
        MemberEvent {
            member: index,
            change: Change::Exports(Delta::Listed(scope.clone(), all(cluster, exports, export_entry))),
        },
        MemberEvent {
            member: index,
            change: Change::Services(Delta::Listed(scope.clone(), all(cluster, services, service_entry))),
        },
        MemberEvent {
            member: index,
            change: Change::Slices(Delta::Listed(scope, all(cluster, slices, slice_entry))),
        },
    ]
}

type Entry<V> = (SliceKey, ServiceKey, V);

fn object_id<K: Resource>(k: &K) -> Option<SliceKey> {
    let m = k.meta();
    Some(SliceKey { namespace: m.namespace.clone()?, name: m.name.clone()? })
}

fn export_entry(cluster: &ClusterId, o: &DynamicObject) -> Option<Entry<ExportInfo>> {
    let key = objects::key_of(cluster, "ServiceExport", &o.metadata)
        .map_err(|e| warn!("skipping object: {e}"))
        .ok()?;
    let info = ExportInfo {
        exported_at: objects::exported_at(&o.metadata),
        ours: objects::is_ours(&o.metadata),
        annotations: objects::our_annotations(&o.metadata),
        metadata: objects::exported_metadata(cluster, o),
        uid: o.metadata.uid.clone(),
    };
    Some((object_id(o)?, key, info))
}

fn service_entry(cluster: &ClusterId, s: &Service) -> Option<Entry<ServiceInfo>> {
    // Services whose names are not DNS labels can never be exported; they
    // are not worth a warning each.
    let key = objects::key_of(cluster, "Service", &s.metadata).ok()?;
    // Our own VIP Services are not services of the fleet: indexed, they would
    // be auto-exported in a prefixed namespace, whose import makes a new VIP
    // Service, which is exported in turn, without end.
    if objects::is_ours(&s.metadata) {
        return None;
    }
    let info = ServiceInfo {
        exported: objects::exported(cluster, s),
        auto_export: objects::asks_export(&s.metadata),
        consumers: objects::consumers(&s.metadata),
    };
    Some((object_id(s)?, key, info))
}

fn slice_entry(_: &ClusterId, s: &EndpointSlice) -> Option<Entry<Arc<EndpointSlice>>> {
    let key = objects::slice_service(s)?;
    Some((object_id(s)?, key, Arc::new(s.clone())))
}

/// One watch of one member in one scope, as [`MemberEvent`]s of one kind.
struct ToFleet<K, V> {
    index: usize,
    cluster: ClusterId,
    scope: Option<String>,
    entry: fn(&ClusterId, &K) -> Option<Entry<V>>,
    wrap: fn(Delta<V>) -> Change,
}

impl<K: Resource, V: Send> Translate<K> for ToFleet<K, V> {
    type Item = Entry<V>;
    type Message = MemberEvent;

    fn item(&self, k: &K) -> Option<Entry<V>> {
        (self.entry)(&self.cluster, k)
    }

    fn listed(&self, entries: Vec<Entry<V>>, _: std::time::Instant) -> MemberEvent {
        self.event(Delta::Listed(self.scope.clone(), entries))
    }

    fn applied(&self, k: &K) -> Option<MemberEvent> {
        let delta = match (self.entry)(&self.cluster, k) {
            Some((id, key, v)) => Delta::Applied(id, key, v),
            // No longer relevant (a slice lost its service label).
            None => Delta::Deleted(object_id(k)?),
        };
        Some(self.event(delta))
    }

    fn deleted(&self, k: &K) -> Option<MemberEvent> {
        Some(self.event(Delta::Deleted(object_id(k)?)))
    }
}

impl<K, V> Clone for ToFleet<K, V> {
    fn clone(&self) -> Self {
        Self {
            index: self.index,
            cluster: self.cluster.clone(),
            scope: self.scope.clone(),
            entry: self.entry,
            wrap: self.wrap,
        }
    }
}

impl<K, V> ToFleet<K, V> {
    fn new(
        index: usize,
        member: &Member,
        scope: &Option<String>,
        entry: fn(&ClusterId, &K) -> Option<Entry<V>>,
        wrap: fn(Delta<V>) -> Change,
    ) -> Self {
        Self { index, cluster: member.cluster.clone(), scope: scope.clone(), entry, wrap }
    }

    fn event(&self, delta: Delta<V>) -> MemberEvent {
        MemberEvent { member: self.index, change: (self.wrap)(delta) }
    }
}

/// Cluster ids more than one member has, each with a message naming them.
pub fn duplicate_ids<'a>(
    members: impl IntoIterator<Item = (&'a str, &'a ClusterId)>,
) -> std::collections::HashMap<ClusterId, String> {
    let mut by_id: std::collections::BTreeMap<&ClusterId, Vec<&str>> = std::collections::BTreeMap::new();
    for (name, cluster) in members {
        by_id.entry(cluster).or_default().push(name);
    }
    by_id
        .into_iter()
        .filter(|(_, names)| names.len() > 1)
        .map(|(id, names)| {
            let why = format!(
                "Members {} all have cluster id {id} (ClusterProperty cluster.clusterset.k8s.io, or the member name): their endpoints cannot be told apart, so none of their exports count. Give each a unique id.",
                names.join(", ")
            );
            tracing::error!("{why}");
            (id.clone(), why)
        })
        .collect()
}
