//! The controller's event loop. Member watches feed a [`FleetState`]; each
//! event names the services it touched, and only those are reconciled.
//! Startup work (every exported service, and objects of ours left by a
//! previous run) waits in a backlog that live changes always overtake, so a
//! restart never delays a change behind a full reconcile.
//!
//! Every write is a server-side apply of a body computed from the current
//! state ([`super::desired`]): idempotent, so a crash at any point is
//! repaired by the next run. A body equal to the last one applied is not
//! sent again.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::desired::{self, Consumers, FIELD_MANAGER, LABEL_APP_MANAGED_BY};
use super::own::{self, OwnChange, OwnEvent, Seen, Written};
use crate::fleet::member::{self, Member};
use crate::fleet::merge::{Condition, Status, condition, merge};
use crate::fleet::objects::ANNOTATION_CONSUMER_CLUSTERS;
use crate::fleet::state::{FleetState, MemberEvent};
use crate::k8s::mcs::{LABEL_SERVICE_NAME, discover_mcs, mcs_resource};
use crate::k8s::watch::{Lists, Reporter, WatchHealth, scopes};
use crate::model::{AddressFamily, ImportType, ServiceKey};

/// Services reconciled at once (each writes to its members in turn). The
/// members' API servers, not the controller, set the pace.
const BATCH: usize = 64;
/// Wait before the first retry of a service whose reconcile failed; each
/// further failure in a row doubles it, up to [`RETRY_MAX`].
const RETRY: Duration = Duration::from_secs(1);
/// The longest wait between retries of one service.
const RETRY_MAX: Duration = Duration::from_secs(300);

/// Why a reconcile failed, for `clusterset_dns_sync_errors_total{reason}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorReason {
    /// 429: the API server throttled us (kube's client already retried).
    Throttled,
    /// 403: our identity may not do it.
    Forbidden,
    /// 409: a conflicting write.
    Conflict,
    /// 422 or 400: the API server refused the body.
    Invalid,
    /// Any other status from the API server (5xx included).
    Server,
    /// No answer: connection, TLS or timeout.
    Unreachable,
}

impl ErrorReason {
    /// Every reason, in metric order.
    pub const ALL: [Self; 6] =
        [Self::Throttled, Self::Forbidden, Self::Conflict, Self::Invalid, Self::Server, Self::Unreachable];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Throttled => "throttled",
            Self::Forbidden => "forbidden",
            Self::Conflict => "conflict",
            Self::Invalid => "invalid",
            Self::Server => "server",
            Self::Unreachable => "unreachable",
        }
    }

    /// The reason of an API error.
    pub fn of(e: &kube::Error) -> Self {
        match e {
            kube::Error::Api(s) => match s.code {
                429 => Self::Throttled,
                403 => Self::Forbidden,
                409 => Self::Conflict,
                400 | 422 => Self::Invalid,
                _ => Self::Server,
            },
            _ => Self::Unreachable,
        }
    }
}

/// The wait before retry number `failures` (1 = the first) of `key`:
/// exponential, capped, and spread by up to a fifth so that services
/// failing together (a member's API gone) do not retry in lockstep.
fn backoff(key: &ServiceKey, failures: u32) -> Duration {
    let base = RETRY.saturating_mul(1 << failures.saturating_sub(1).min(16)).min(RETRY_MAX);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let spread = desired::digest_of(&Value::String(format!("{key}{}", now.subsec_nanos())));
    let fifth = u32::from_str_radix(&spread[..4], 16).unwrap_or(0) % 200;
    base + base * fifth / 1000
}

/// What to do about a member whose API stays unreachable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberLost {
    /// Keep its endpoints everywhere, marked on the imports (the default:
    /// a partition must not take working endpoints away).
    Keep,
    /// Remove its endpoints everywhere once it has been unreachable for the
    /// window (a powered-off cluster stops receiving traffic).
    Remove,
}

/// How the controller behaves, besides whom it syncs.
#[derive(Debug, Clone)]
pub struct SyncBehaviour {
    /// What to do about an unreachable member.
    pub on_member_lost: MemberLost,
    /// How long a member must be unreachable before `Remove` applies.
    pub lost_after: Duration,
    /// Services in namespaces starting with one of these are exported
    /// automatically.
    pub auto_export_prefixes: Vec<String>,
    /// Namespaces synced; all when empty.
    pub namespaces: Vec<String>,
}

/// How long API discovery of a member is waited for at a time.
const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(3);
/// How long the first lists of every member are waited for.
const FIRST_SYNC_TIMEOUT: Duration = Duration::from_secs(10);
/// A member is considered unreachable (skipped, and marked on imports) once
/// its watches have failed for this long.
const UNREACHABLE_AFTER: f64 = 5.0;
/// How often members' reachability is checked.
const TICK: Duration = Duration::from_secs(1);

/// API requests the controller made, for the benchmark and `/metrics`.
#[derive(Debug, Default)]
pub struct SyncStats {
    /// Writes (apply, delete).
    pub writes: AtomicU64,
    /// Reads (list).
    pub reads: AtomicU64,
    /// Writes skipped because the body equalled the last one applied.
    pub unchanged: AtomicU64,
    /// Services reconciled.
    pub reconciles: AtomicU64,
    /// Services whose exports conflict now (a Conflict condition is True).
    pub conflicts: AtomicU64,
    /// Failed reconciles, by [`ErrorReason`] (in [`ErrorReason::ALL`] order).
    pub errors: [AtomicU64; 6],
}

/// One object of ours found at start.
struct Found {
    kind: &'static str,
    meta: kube::api::ObjectMeta,
    /// A VIP Service's addresses.
    cluster_ips: Option<Vec<String>>,
    /// A ServiceImport's status.
    status: Option<Value>,
}

/// Which object of which member.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct ObjectRef {
    member: usize,
    kind: &'static str,
    namespace: String,
    name: String,
}

struct MemberApis {
    import: ApiResource,
    export: ApiResource,
}

/// The controller.
pub struct Syncer {
    members: Vec<Member>,
    apis: Vec<MemberApis>,
    state: FleetState,
    /// What the controller knows of its own objects, per service.
    keys: HashMap<ServiceKey, KeyState>,
    behaviour: SyncBehaviour,
    /// Members currently unreachable, and since when (RFC 3339).
    unreachable: Vec<Option<String>>,
    /// Members whose MCS API versions are known (writes wait for it).
    discovered: Vec<bool>,
    /// Members whose endpoints are removed (`MemberLost::Remove`).
    removed: Vec<bool>,
    /// Cluster ids that more than one member has, with what to tell users.
    duplicates: HashMap<crate::model::ClusterId, String>,
    /// Members whose Namespaces have been listed once.
    namespaces_listed: Vec<bool>,
    stats: Arc<SyncStats>,
}

/// The controller's memory of one service: disjoint from every other
/// service's, so services are reconciled concurrently, each with its own.
#[derive(Debug, Default)]
struct KeyState {
    /// The digest of the last body applied per object ([`desired::digest_of`]),
    /// also written on the object itself ([`desired::ANNOTATION_APPLIED`]) so
    /// a new leader knows it without writing.
    applied: HashMap<ObjectRef, String>,
    /// The ClusterIPs of each VIP Service written.
    vips: HashMap<ObjectRef, Vec<String>>,
    /// Objects of ours that exist, and those a reconcile wanted whose write
    /// failed (retried with the service; `written` has no version of them).
    owned: BTreeSet<ObjectRef>,
    /// lastTransitionTime per (member, condition type), with its status.
    transitions: HashMap<(usize, &'static str), (Status, String)>,
    /// Counted in [`SyncStats::conflicts`].
    conflicted: bool,
    /// The uid of each member's export whose conditions `transitions` and
    /// `applied` hold.
    export_uids: HashMap<usize, Option<String>>,
    /// The resourceVersions our writes gave our objects: a watch event with
    /// another is someone else's change.
    written: Written<ObjectRef>,
}

impl KeyState {
    /// Forgets what was applied to `r` (and its status), so it is written again.
    fn invalidate(&mut self, r: &ObjectRef) {
        self.applied.remove(r);
        self.applied.remove(&ObjectRef { kind: "ServiceImport/status", ..r.clone() });
        self.vips.remove(r);
        self.written.forget(r);
    }

    /// How this service's objects are named: as its VIP Service already
    /// is (a name never moves while the service is exported, whatever is
    /// exported beside it); otherwise short, unless an elder shares its
    /// stem ([`Stems::has_elder`]).
    fn naming(&self, cx: &Ctx<'_>, key: &ServiceKey) -> desired::Naming {
        for naming in [desired::Naming::Long, desired::Naming::Short] {
            let vip = desired::vip_name(key, naming);
            if self.owned.iter().any(|r| r.kind == "Service" && r.name == vip) {
                return naming;
            }
        }
        if cx.stems.has_elder(cx.state, key) { desired::Naming::Long } else { desired::Naming::Short }
    }

    fn is_empty(&self) -> bool {
        self.applied.is_empty() && self.owned.is_empty() && self.transitions.is_empty() && !self.conflicted
    }
}

/// Our objects of `kind` in member `m` and `scope` (`None`: every
/// namespace) that a list asked for at `began` does not hold: deleted
/// while the watch was down. Only an object whose last write was recorded
/// before `began` can be gone. One written since may be newer than the
/// list, however late the list arrives (a batch of writes throttled by
/// the API server can take longer), and taking it for gone would write it
/// again, and again see the events of the first write as someone else's.
/// One with no write recorded was never written (its write failed and is
/// retried) or is being written again: nothing to repair.
fn gone(
    keys: &HashMap<ServiceKey, KeyState>,
    m: usize,
    (kind, scope): (&str, Option<&str>),
    items: &[Seen],
    began: std::time::Instant,
) -> Vec<(ServiceKey, ObjectRef)> {
    let listed: BTreeSet<(&str, &str)> =
        items.iter().map(|s| (s.namespace.as_str(), s.name.as_str())).collect();
    let mut gone = Vec::new();
    for (key, ks) in keys {
        for r in &ks.owned {
            if r.member == m
                && r.kind == kind
                && scope.is_none_or(|ns| ns == r.namespace)
                && !listed.contains(&(r.namespace.as_str(), r.name.as_str()))
                && ks.written.before(r, began)
            {
                gone.push((key.clone(), r.clone()));
            }
        }
    }
    gone
}

/// What a reconcile reads and never changes; shared by the services of a
/// batch.
struct Ctx<'a> {
    stems: &'a Stems,
    members: &'a [Member],
    apis: &'a [MemberApis],
    state: &'a FleetState,
    behaviour: &'a SyncBehaviour,
    unreachable: &'a [Option<String>],
    removed: &'a [bool],
    discovered: &'a [bool],
    duplicates: &'a HashMap<crate::model::ClusterId, String>,
    stats: &'a SyncStats,
}

/// The exported services whose names are longer than their objects' names
/// can hold ([`desired::stem`]), by namespace and stem, each with its
/// oldest export's time: what decides a service's [`desired::Naming`].
/// Built before each batch, from the fleet's exports.
struct Stems(HashMap<(String, String), Vec<(ServiceKey, i64)>>);

impl Stems {
    fn of(state: &FleetState) -> Self {
        let mut stems: HashMap<(String, String), Vec<(ServiceKey, i64)>> = HashMap::new();
        for (key, at) in state.exported_longer_than(desired::STEM_LEN) {
            let stem = desired::stem(key.name.as_str()).to_owned();
            stems.entry((key.namespace.to_string(), stem)).or_default().push((key, at));
        }
        Self(stems)
    }

    /// True when another exported service of `key`'s namespace has its
    /// stem and an older export (the service name breaking ties): `key`'s
    /// objects then take long names, since that service may have the short
    /// ones.
    fn has_elder(&self, state: &FleetState, key: &ServiceKey) -> bool {
        let stem = desired::stem(key.name.as_str());
        let Some(long) = self.0.get(&(key.namespace.to_string(), stem.to_owned())) else {
            return false;
        };
        // The service whose name is the stem itself shares it too.
        let named_stem = crate::model::DnsLabel::parse(stem)
            .ok()
            .map(|name| ServiceKey { namespace: key.namespace.clone(), name })
            .and_then(|k| Some((state.oldest_export(&k)?, k)));
        let mine = (state.oldest_export(key).unwrap_or(i64::MAX), key.name.as_str());
        long.iter()
            .map(|(k, at)| (*at, k))
            .chain(named_stem.as_ref().map(|(at, k)| (*at, k)))
            .any(|(at, k)| k != key && (at, k.name.as_str()) < mine)
    }
}

impl Ctx<'_> {
    /// True while member `i` can be written to: reachable, versions known.
    fn writable(&self, i: usize) -> bool {
        self.unreachable[i].is_none() && self.discovered[i]
    }
}

impl Syncer {
    /// A controller for these members (API versions discovered now).
    pub async fn new(members: Vec<Member>, behaviour: SyncBehaviour, stats: Arc<SyncStats>) -> Self {
        // Until a member's API versions are known it is not written to; a
        // member down at start must not hold the others up.
        let mut apis = Vec::new();
        let mut discovered = Vec::new();
        for m in &members {
            let found = tokio::time::timeout(DISCOVERY_TIMEOUT, discover(m)).await;
            discovered.push(found.is_ok());
            apis.push(found.unwrap_or_else(|_| {
                warn!(member = %m.name, "API discovery did not answer within {DISCOVERY_TIMEOUT:?}; retrying while syncing the others");
                fallback_apis()
            }));
        }
        let duplicates = duplicate_ids(&members);
        let scopes = scopes(&behaviour.namespaces).len();
        let state = FleetState::new(members.iter().map(|m| m.cluster.clone()).collect(), scopes);
        let n = members.len();
        Self {
            members,
            apis,
            state,
            keys: HashMap::new(),
            unreachable: vec![None; n],
            discovered,
            removed: vec![false; n],
            duplicates,
            namespaces_listed: vec![false; n],
            behaviour,
            stats,
        }
    }

    /// Runs until the watches end.
    pub async fn run(mut self) {
        let (tx, mut rx) = mpsc::channel::<MemberEvent>(1024);
        let (own_tx, mut own_rx) = mpsc::channel::<OwnEvent>(1024);
        // Every watch is a task of this set: when this future is dropped (the
        // Lease lost), they all stop with it, none keeps running beside the
        // next leader's.
        let mut tasks = JoinSet::new();
        for (i, m) in self.members.iter().enumerate() {
            // kube's default lists (paged, 500); `--list-mode` is serve's.
            let lists = Lists::default();
            member::spawn_watches(&mut tasks, i, m, &self.behaviour.namespaces, &lists, tx.clone());
            own::spawn(&mut tasks, i, m, &self.apis[i].import, &self.behaviour.namespaces, own_tx.clone());
        }
        drop(tx);
        drop(own_tx);
        let mut backlog: BTreeSet<ServiceKey> = BTreeSet::new();
        let mut live: BTreeSet<ServiceKey> = BTreeSet::new();
        let mut retry: BTreeMap<ServiceKey, Instant> = BTreeMap::new();
        // Failures in a row per service, for its backoff.
        let mut failures: HashMap<ServiceKey, u32> = HashMap::new();
        // First: every member's complete lists, so nothing is deleted for
        // lack of knowledge. A member still silent after FIRST_SYNC_TIMEOUT
        // does not hold the others up: until it lists, nothing is deleted
        // anywhere (see `reconcile`).
        let deadline = Instant::now() + FIRST_SYNC_TIMEOUT;
        loop {
            self.mark_removed(&mut backlog);
            if self.state.synced_except(&self.removed) {
                break;
            }
            let wake = (Instant::now() + TICK).min(deadline);
            match tokio::time::timeout_at(wake, rx.recv()).await {
                Ok(Some(e)) => self.state.apply(e, &mut backlog),
                Ok(None) => return,
                Err(_) if Instant::now() < deadline => {}
                Err(_) => {
                    let silent: Vec<&str> = self
                        .members
                        .iter()
                        .zip(self.state.members())
                        .filter(|(_, s)| !s.synced())
                        .map(|(m, _)| m.name.as_str())
                        .collect();
                    warn!(members = ?silent, "members not listed within {FIRST_SYNC_TIMEOUT:?}: syncing the others, deleting nothing until they list");
                    break;
                }
            }
        }
        let mut complete = self.state.synced_except(&self.removed);
        self.adopt(None, &mut backlog).await;
        info!(services = backlog.len(), "sync: members listed; reconciling");
        let mut next_tick = Instant::now() + TICK;
        loop {
            if Instant::now() >= next_tick {
                self.check_members(&mut live).await;
                if !complete && self.state.synced_except(&self.removed) {
                    info!("every member listed: reconciling everything, deletions included");
                    complete = true;
                    self.queue_all(&mut live);
                }
                next_tick = Instant::now() + TICK;
            }
            while let Ok(e) = rx.try_recv() {
                self.state.apply(e, &mut live);
            }
            while let Ok(e) = own_rx.try_recv() {
                self.own_event(e, &mut live);
            }
            let now = Instant::now();
            let due: Vec<ServiceKey> =
                retry.iter().filter(|(_, t)| **t <= now).map(|(k, _)| k.clone()).collect();
            for k in due {
                retry.remove(&k);
                live.insert(k);
            }
            // Live changes first, then the startup backlog; a batch of
            // services is reconciled concurrently.
            let mut batch = Vec::new();
            while batch.len() < BATCH {
                let Some(key) = live.pop_first().or_else(|| backlog.pop_first()) else { break };
                backlog.remove(&key);
                let ks = self.keys.remove(&key).unwrap_or_default();
                batch.push((key, ks));
            }
            if batch.is_empty() {
                let wake = retry.values().min().copied().map_or(next_tick, |t| t.min(next_tick));
                // A retry or a member check may be due before anything arrives.
                tokio::select! {
                    e = rx.recv() => match e {
                        Some(e) => self.state.apply(e, &mut live),
                        None => return, // every watch ended: shutting down
                    },
                    Some(e) = own_rx.recv() => self.own_event(e, &mut live),
                    () = tokio::time::sleep_until(wake) => {}
                }
                continue;
            }
            let stems = Stems::of(&self.state);
            let cx = Ctx {
                stems: &stems,
                members: &self.members,
                apis: &self.apis,
                state: &self.state,
                behaviour: &self.behaviour,
                unreachable: &self.unreachable,
                removed: &self.removed,
                discovered: &self.discovered,
                duplicates: &self.duplicates,
                stats: &self.stats,
            };
            let done: Vec<(ServiceKey, KeyState, Result<(), kube::Error>)> = stream::iter(batch)
                .map(|(key, mut ks)| {
                    let cx = &cx;
                    async move {
                        let result = ks.reconcile(cx, &key).await;
                        (key, ks, result)
                    }
                })
                .buffer_unordered(BATCH)
                .collect()
                .await;
            for (key, ks, result) in done {
                match result {
                    Ok(()) => {
                        failures.remove(&key);
                    }
                    Err(e) => {
                        let reason = ErrorReason::of(&e);
                        let i = ErrorReason::ALL.iter().position(|r| *r == reason).unwrap_or(0);
                        self.stats.errors[i].fetch_add(1, Ordering::Relaxed);
                        let n = failures.entry(key.clone()).or_insert(0);
                        *n += 1;
                        // The API server's own Retry-After, when it gave one, is
                        // the least we wait.
                        let asked = match &e {
                            kube::Error::Api(s) => s.details.as_ref().map_or(0, |d| d.retry_after_seconds),
                            _ => 0,
                        };
                        let wait = backoff(&key, *n).max(Duration::from_secs(asked.into()));
                        warn!(service = %key, reason = reason.as_str(), failures = *n, "sync failed, retrying in {wait:?}: {e}");
                        retry.insert(key.clone(), Instant::now() + wait);
                    }
                }
                if !ks.is_empty() {
                    self.keys.insert(key, ks);
                }
            }
        }
    }

    /// Someone else's change to one of our objects: what we recorded as
    /// applied no longer holds, so the service is reconciled and the object
    /// written again.
    fn own_event(&mut self, e: OwnEvent, live: &mut BTreeSet<ServiceKey>) {
        let m = e.member;
        match e.change {
            // A namespace created (or changed) in a member: its services may
            // now be imported there (namespace sameness). The first list is
            // the start, which reconciles everything anyway.
            OwnChange::Namespace(ns) => self.queue_namespace(&ns, live),
            OwnChange::Namespaces(all) => {
                if std::mem::replace(&mut self.namespaces_listed[m], true) {
                    for ns in all {
                        self.queue_namespace(&ns, live);
                    }
                }
            }
            OwnChange::Applied(seen) => self.repair(m, &seen, false, live),
            OwnChange::Deleted(seen) => self.repair(m, &seen, true, live),
            OwnChange::Listed(kind, scope, items, began) => {
                for seen in &items {
                    self.repair(m, seen, false, live);
                }
                for (key, r) in gone(&self.keys, m, (kind, scope.as_deref()), &items, began) {
                    if let Some(ks) = self.keys.get_mut(&key) {
                        ks.invalidate(&r);
                        info!(member = %self.members[m].name, kind = r.kind, object = %format!("{}/{}", r.namespace, r.name), "ours, and gone: writing it again");
                        live.insert(key);
                    }
                }
            }
        }
    }

    /// Queues every service of namespace `ns` some member exports.
    fn queue_namespace(&self, ns: &str, live: &mut BTreeSet<ServiceKey>) {
        live.extend(
            self.state
                .keys()
                .into_iter()
                .filter(|k| k.namespace.as_str() == ns && !self.state.exports(k).is_empty()),
        );
    }

    /// Queues the service of `seen` for another write of it, unless the
    /// event is of our own write or of an object we no longer want.
    fn repair(&mut self, m: usize, seen: &Seen, deleted: bool, live: &mut BTreeSet<ServiceKey>) {
        let meta = kube::api::ObjectMeta {
            namespace: Some(seen.namespace.clone()),
            name: Some(seen.service.clone()),
            ..Default::default()
        };
        let Ok(key) = crate::fleet::objects::key_of(&self.members[m].cluster, seen.kind, &meta) else {
            return;
        };
        let Some(ks) = self.keys.get_mut(&key) else { return };
        let r = ObjectRef {
            member: m,
            kind: seen.kind,
            namespace: seen.namespace.clone(),
            name: seen.name.clone(),
        };
        if !ks.owned.contains(&r) || (!deleted && ks.written.ours(&r, &seen.version)) {
            return;
        }
        ks.invalidate(&r);
        let what = if deleted { "deleted" } else { "changed" };
        info!(member = %self.members[m].name, kind = r.kind, object = %format!("{}/{}", r.namespace, r.name), "ours, {what} by someone else: writing it again");
        live.insert(key);
    }

    /// Notices members becoming unreachable or reachable again, and queues
    /// every service they take part in.
    async fn check_members(&mut self, live: &mut BTreeSet<ServiceKey>) {
        for i in 0..self.members.len() {
            if !self.discovered[i]
                && self.members[i].stale_seconds() == 0.0
                && let Ok(apis) = tokio::time::timeout(DISCOVERY_TIMEOUT, discover(&self.members[i])).await
            {
                info!(member = %self.members[i].name, "API discovered: reconciling everything");
                self.apis[i] = apis;
                self.discovered[i] = true;
                self.adopt(Some(i), live).await;
                self.queue_all(live);
            }
        }
        for i in 0..self.members.len() {
            let stale = self.members[i].stale_seconds();
            let unreachable = stale >= UNREACHABLE_AFTER;
            let name = &self.members[i].name;
            match (unreachable, self.unreachable[i].is_some()) {
                (true, false) => {
                    warn!(member = %name, stale_seconds = stale, "member unreachable: its endpoints are kept and marked; writes to it wait");
                    self.unreachable[i] = Some(now_rfc3339());
                }
                (false, true) => {
                    info!(member = %name, "member reachable again: reconciling everything it takes part in");
                    self.unreachable[i] = None;
                }
                _ => continue,
            }
            // Writes to it were skipped, or its endpoints are marked: every
            // service may need a write.
            self.queue_all(live);
        }
        self.mark_removed(live);
    }

    /// Queues every service a member has objects of, and every service the
    /// controller has objects for.
    fn queue_all(&self, live: &mut BTreeSet<ServiceKey>) {
        live.extend(self.state.keys());
        live.extend(self.keys.keys().cloned());
    }

    /// Applies `--on-member-lost=remove`: members unreachable for the window
    /// stop counting; their services are queued when that changes.
    fn mark_removed(&mut self, live: &mut BTreeSet<ServiceKey>) {
        for i in 0..self.members.len() {
            let removed = self.behaviour.on_member_lost == MemberLost::Remove
                && self.members[i].stale_seconds() >= self.behaviour.lost_after.as_secs_f64();
            if removed != self.removed[i] {
                if removed {
                    warn!(member = %self.members[i].name, "member lost for {:?}: removing its endpoints everywhere (--on-member-lost=remove)", self.behaviour.lost_after);
                } else {
                    info!(member = %self.members[i].name, "lost member is back: its endpoints return");
                }
                self.removed[i] = removed;
                live.extend(self.state.exported_by(i));
            }
        }
    }

    /// Finds objects of ours in every member (left by an earlier run, maybe
    /// for services no longer exported) and queues their services.
    async fn adopt(&mut self, only: Option<usize>, backlog: &mut BTreeSet<ServiceKey>) {
        let lp = ListParams::default().labels(&format!("{LABEL_APP_MANAGED_BY}={FIELD_MANAGER}"));
        for (i, m) in self.members.iter().enumerate() {
            if only.is_some_and(|o| o != i) || !self.discovered[i] {
                continue;
            }
            let mut found: Vec<Found> = Vec::new();
            let mut exports: Vec<DynamicObject> = Vec::new();
            for scope in scopes(&self.behaviour.namespaces) {
                let (imports, services, slices, export_api): (
                    Api<DynamicObject>,
                    Api<Service>,
                    Api<EndpointSlice>,
                    Api<DynamicObject>,
                ) = match &scope {
                    Some(ns) => (
                        Api::namespaced_with(m.client.clone(), ns, &self.apis[i].import),
                        Api::namespaced(m.client.clone(), ns),
                        Api::namespaced(m.client.clone(), ns),
                        Api::namespaced_with(m.client.clone(), ns, &self.apis[i].export),
                    ),
                    None => (
                        Api::all_with(m.client.clone(), &self.apis[i].import),
                        Api::all(m.client.clone()),
                        Api::all(m.client.clone()),
                        Api::all_with(m.client.clone(), &self.apis[i].export),
                    ),
                };
                self.stats.reads.fetch_add(4, Ordering::Relaxed);
                // Whole imports and Services: their status and cluster IPs
                // are part of what was written; slices only by their digest.
                match imports.list(&lp).await {
                    Ok(l) => found.extend(l.items.into_iter().map(|o| Found {
                        kind: "ServiceImport",
                        status: o.data.get("status").cloned(),
                        meta: o.metadata,
                        cluster_ips: None,
                    })),
                    Err(e) => warn!(member = %m.name, "cannot list our ServiceImports: {e}"),
                }
                match services.list(&lp).await {
                    Ok(l) => found.extend(l.items.into_iter().map(|o| Found {
                        kind: "Service",
                        cluster_ips: o.spec.and_then(|s| s.cluster_ips),
                        meta: o.metadata,
                        status: None,
                    })),
                    Err(e) => warn!(member = %m.name, "cannot list our Services: {e}"),
                }
                match slices.list_metadata(&lp).await {
                    Ok(l) => found.extend(l.items.into_iter().map(|o| Found {
                        kind: "EndpointSlice",
                        meta: o.metadata,
                        cluster_ips: None,
                        status: None,
                    })),
                    Err(e) => warn!(member = %m.name, "cannot list our EndpointSlices: {e}"),
                }
                match export_api.list(&ListParams::default()).await {
                    Ok(l) => exports.extend(l.items),
                    Err(e) => warn!(member = %m.name, "cannot list ServiceExports: {e}"),
                }
            }
            for f in found {
                let Found { kind, meta, cluster_ips, status } = f;
                let service = meta.labels.as_ref().and_then(|l| l.get(LABEL_SERVICE_NAME)).cloned();
                let digest =
                    meta.annotations.as_ref().and_then(|a| a.get(desired::ANNOTATION_APPLIED)).cloned();
                let version = meta.resource_version.clone();
                let (Some(ns), Some(name), Some(service)) = (meta.namespace, meta.name, service) else {
                    continue;
                };
                let Ok(key) = crate::fleet::objects::key_of(
                    &m.cluster,
                    kind,
                    &kube::api::ObjectMeta {
                        namespace: Some(ns.clone()),
                        name: Some(service),
                        ..Default::default()
                    },
                ) else {
                    continue;
                };
                let r = ObjectRef { member: i, kind, namespace: ns, name };
                let ks = self.keys.entry(key.clone()).or_default();
                // What an earlier leader applied, as it recorded it: equal
                // bodies are not written again.
                if let Some(d) = digest {
                    ks.applied.insert(r.clone(), d);
                }
                if let Some(ips) = cluster_ips {
                    ks.vips.insert(r.clone(), ips);
                }
                if let Some(st) = status {
                    ks.applied.insert(
                        ObjectRef { kind: "ServiceImport/status", ..r.clone() },
                        desired::digest_of(&st),
                    );
                }
                // This version is as we left it: its watch event is not a change.
                ks.written.record(r.clone(), version.as_deref());
                ks.owned.insert(r);
                backlog.insert(key);
            }
            // The exports' conditions as written: their transition times are
            // kept, and equal conditions are not written again.
            for o in exports {
                let Ok(key) = crate::fleet::objects::key_of(&m.cluster, "ServiceExport", &o.metadata) else {
                    continue;
                };
                let Some(st) = o.data.get("status").filter(|s| s.get("conditions").is_some()) else {
                    continue;
                };
                let ks = self.keys.entry(key.clone()).or_default();
                for c in st["conditions"].as_array().into_iter().flatten() {
                    let kind = match c["type"].as_str() {
                        Some(condition::VALID) => condition::VALID,
                        Some(condition::READY) => condition::READY,
                        Some(condition::CONFLICT) => condition::CONFLICT,
                        _ => continue,
                    };
                    let status = match c["status"].as_str() {
                        Some("True") => Status::True,
                        Some("False") => Status::False,
                        _ => Status::Unknown,
                    };
                    let since = c["lastTransitionTime"].as_str().unwrap_or_default().to_owned();
                    ks.transitions.insert((i, kind), (status, since));
                }
                ks.applied.insert(
                    object(i, "ServiceExport/status", &key, key.name.to_string()),
                    desired::digest_of(st),
                );
                ks.export_uids.insert(i, o.metadata.uid.clone());
            }
        }
    }
}

impl KeyState {
    /// Creates or removes the ServiceExport of `key` in member `i` for
    /// Services that ask to be exported (annotation or namespace prefix).
    /// Only exports the controller created are ever removed.
    async fn auto_export(&mut self, cx: &Ctx<'_>, i: usize, key: &ServiceKey) -> Result<(), kube::Error> {
        let prefixed =
            cx.behaviour.auto_export_prefixes.iter().any(|p| key.namespace.as_str().starts_with(p.as_str()));
        let service = cx.state.service_of(i, key);
        let wants = service.is_some_and(|s| s.auto_export || prefixed);
        let consumers = service.and_then(|s| s.consumers.as_deref());
        let has = cx.state.export_of(i, key);
        let ar = cx.apis[i].export.clone();
        let api: Api<DynamicObject> =
            Api::namespaced_with(cx.members[i].client.clone(), key.namespace.as_str(), &ar);
        // An export of ours follows the Service's consumer clusters.
        let stale = |e: &crate::fleet::state::ExportInfo| {
            e.ours && e.annotations.get(ANNOTATION_CONSUMER_CLUSTERS).map(String::as_str) != consumers
        };
        let apply = match (wants, &has) {
            (true, None) => Some("auto-exported"),
            (true, Some(e)) if stale(e) => Some("auto-export: consumer clusters updated"),
            _ => None,
        };
        if let Some(done) = apply {
            cx.stats.writes.fetch_add(1, Ordering::Relaxed);
            api.patch(
                key.name.as_str(),
                &PatchParams::apply(FIELD_MANAGER),
                &Patch::Apply(&desired::export(&ar.api_version, key, consumers)),
            )
            .await?;
            info!(member = %cx.members[i].name, service = %key, consumers = ?consumers, "{done}");
            return Ok(());
        }
        if let (false, Some(e)) = (wants, has)
            && e.ours
        {
            cx.stats.writes.fetch_add(1, Ordering::Relaxed);
            match api.delete(key.name.as_str(), &DeleteParams::default()).await {
                Ok(_) => info!(member = %cx.members[i].name, service = %key, "auto-export removed"),
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Brings every member in line with the exports of `key`.
    async fn reconcile(&mut self, cx: &Ctx<'_>, key: &ServiceKey) -> Result<(), kube::Error> {
        cx.stats.reconciles.fetch_add(1, Ordering::Relaxed);
        let mut failed: Option<kube::Error> = None;
        for i in 0..cx.members.len() {
            if cx.writable(i)
                && let Err(e) = self.auto_export(cx, i, key).await
            {
                warn!(member = %cx.members[i].name, service = %key, "cannot auto-export: {e}");
                failed = Some(e);
            }
        }
        let removed: Vec<&crate::model::ClusterId> =
            (0..cx.members.len()).filter(|i| cx.removed[*i]).map(|i| &cx.members[i].cluster).collect();
        let mut exports: Vec<_> =
            cx.state.exports(key).into_iter().filter(|e| !removed.contains(&&e.cluster)).collect();
        // Two members with one cluster id: neither's export counts, so their
        // endpoints never mix under one id.
        for e in &mut exports {
            if let Some(why) = cx.duplicates.get(&e.cluster) {
                e.service = crate::fleet::export::Exported::DuplicateCluster(why.clone());
            }
        }
        let merged = merge(&exports);
        let consumers = merged.spec.as_ref().map_or(Consumers::All, |s| Consumers::of(&s.annotations));
        if let Consumers::Invalid(e) = &consumers {
            warn!(service = %key, "{e}: imported nowhere until the export's annotation is fixed");
        }
        let conflicted = merged.conditions.iter().any(|(_, conds)| {
            conds.iter().any(|c| c.kind == condition::CONFLICT && c.status == Status::True)
        });
        if conflicted != self.conflicted {
            self.conflicted = conflicted;
            if conflicted {
                cx.stats.conflicts.fetch_add(1, Ordering::Relaxed);
            } else {
                cx.stats.conflicts.fetch_sub(1, Ordering::Relaxed);
            }
        }
        let unreachable: Vec<(crate::model::ClusterId, String)> = (0..cx.members.len())
            .filter_map(|i| Some((cx.members[i].cluster.clone(), cx.unreachable[i].clone()?)))
            .filter(|(c, _)| merged.clusters.contains(c))
            .collect();
        let mut want: BTreeSet<ObjectRef> = BTreeSet::new();
        // What we own in unreachable members stays until they answer again.
        want.extend(self.owned.iter().filter(|r| !cx.writable(r.member)).cloned());
        // Members that should import but cannot be written now: Ready says so.
        let not_reached: Vec<&str> = (0..cx.members.len())
            .filter(|i| !cx.writable(*i) && !cx.removed[*i] && consumers.includes(&cx.members[*i].cluster))
            .map(|i| cx.members[i].name.as_str())
            .collect();
        if let Some(spec) = &merged.spec {
            // Which of each exporting cluster's ports it serves behind the
            // VIP, and what its unnamed port is called there.
            let vip_ports = desired::VipPorts::new(&spec.ports);
            let cluster_ports: HashMap<&crate::model::ClusterId, desired::ClusterPorts> = exports
                .iter()
                .filter_map(|e| match &e.service {
                    crate::fleet::export::Exported::Service(s) => {
                        Some((&e.cluster, vip_ports.of_cluster(&s.ports)))
                    }
                    _ => None,
                })
                .collect();
            let naming = self.naming(cx, key);
            for i in 0..cx.members.len() {
                // Members outside the consumer clusters import nothing:
                // what we own there is not wanted, so it is deleted below.
                if !cx.writable(i) || !consumers.includes(&cx.members[i].cluster) {
                    continue;
                }
                match self
                    .member_objects(
                        cx,
                        i,
                        key,
                        spec,
                        &merged.clusters,
                        &unreachable,
                        &cluster_ports,
                        naming,
                        &mut want,
                    )
                    .await
                {
                    Ok(()) => {}
                    // No such namespace in this member: namespace sameness
                    // means the service is not imported there.
                    Err(kube::Error::Api(s)) if s.code == 404 => {
                        debug!(member = %cx.members[i].name, service = %key, "namespace absent; not imported");
                    }
                    Err(e) => {
                        warn!(member = %cx.members[i].name, service = %key, "cannot write: {e}");
                        failed = Some(e);
                    }
                }
            }
        }
        // Whatever we own for this service and no longer want goes, once
        // every member has listed (before, "not wanted" may mean "not known").
        // A member removed after --member-lost-after no longer counts.
        if !cx.state.synced_except(cx.removed) {
            want.extend(self.owned.iter().cloned());
        }
        let owned = std::mem::take(&mut self.owned);
        let written_everywhere = failed.is_none();
        let mut kept = BTreeSet::new();
        for r in owned.difference(&want) {
            if let Err(e) = self.delete(cx, r).await {
                kept.insert(r.clone());
                failed = Some(e);
            }
        }
        kept.extend(want);
        self.owned = kept;
        let ready =
            merged.spec.is_some() && written_everywhere && !matches!(consumers, Consumers::Invalid(_));
        if let Err(e) = self.conditions(cx, key, &merged.conditions, ready, &consumers, &not_reached).await {
            failed = Some(e);
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// The import, VIP and slices of `key` in member `i`.
    #[allow(clippy::too_many_arguments)]
    async fn member_objects(
        &mut self,
        cx: &Ctx<'_>,
        i: usize,
        key: &ServiceKey,
        spec: &crate::fleet::merge::ImportSpec,
        clusters: &[crate::model::ClusterId],
        unreachable: &[(crate::model::ClusterId, String)],
        cluster_ports: &HashMap<&crate::model::ClusterId, desired::ClusterPorts>,
        naming: desired::Naming,
        want: &mut BTreeSet<ObjectRef>,
    ) -> Result<(), kube::Error> {
        let ns = key.namespace.as_str();
        let vip_name = (spec.kind == ImportType::ClusterSetIp).then(|| desired::vip_name(key, naming));
        let mut ips: Vec<String> = Vec::new();
        if let Some(vip_name) = &vip_name {
            let body = desired::vip_service(key, vip_name, spec);
            let r = object(i, "Service", key, vip_name.clone());
            want.insert(r.clone());
            let api: Api<Service> = Api::namespaced(cx.members[i].client.clone(), ns);
            // A Service's primary IP family cannot change in place (the API
            // server refuses it, 422, for ever): when the import's changes
            // (another export became the oldest), the VIP is replaced. Known
            // from the addresses it was given; if they are not known, from
            // the refusal.
            let had_v4 =
                self.vips.get(&r).and_then(|ips| ips.first()?.parse::<IpAddr>().ok()).map(|a| a.is_ipv4());
            let wants_v4 = spec.ip_families.first().map(|f| *f == AddressFamily::V4);
            if let (Some(had), Some(wants)) = (had_v4, wants_v4)
                && had != wants
            {
                info!(member = %cx.members[i].name, service = %key, "the import's IP family changed: replacing its VIP Service");
                self.delete(cx, &r).await?;
            }
            let written = match self.apply(cx, &r, &api, &body).await {
                Err(kube::Error::Api(s)) if s.code == 422 && primary_family_refused(&s) => {
                    info!(member = %cx.members[i].name, service = %key, "VIP Service of another IP family: replacing it");
                    self.delete(cx, &r).await?;
                    self.apply(cx, &r, &api, &body).await?
                }
                other => other?,
            };
            if let Some(svc) = written {
                let allocated = svc.spec.and_then(|s| s.cluster_ips).unwrap_or_default();
                self.vips.insert(r.clone(), allocated);
            }
            // Applied unchanged earlier in this run: its addresses are known.
            ips = self.vips.get(&r).cloned().unwrap_or_default();
        }
        let sources: Vec<_> = clusters
            .iter()
            .flat_map(|c| cx.state.source_slices(c, key).into_iter().map(move |(name, s)| (c, name, s)))
            .collect();
        let names = desired::slice_names(
            key,
            naming,
            &sources.iter().map(|(c, name, _)| (*c, name.as_str())).collect::<Vec<_>>(),
        );
        for ((cluster, _, source), name) in sources.iter().zip(names) {
            let body =
                desired::slice(key, &name, cluster, source, vip_name.as_deref(), cluster_ports.get(cluster));
            let r = object(i, "EndpointSlice", key, name);
            want.insert(r.clone());
            let api: Api<EndpointSlice> = Api::namespaced(cx.members[i].client.clone(), ns);
            self.apply(cx, &r, &api, &body).await?;
        }
        let ar = cx.apis[i].import.clone();
        let api: Api<DynamicObject> = Api::namespaced_with(cx.members[i].client.clone(), ns, &ar);
        let r = object(i, "ServiceImport", key, key.name.to_string());
        want.insert(r.clone());
        let down: Vec<crate::model::ClusterId> = unreachable.iter().map(|(c, _)| c.clone()).collect();
        self.apply(cx, &r, &api, &desired::import(&ar.api_version, key, spec, &ips, &down)).await?;
        let status = desired::import_status(&ar.api_version, key, clusters, unreachable);
        let sr = ObjectRef { kind: "ServiceImport/status", ..r };
        let digest = desired::digest_of(&status["status"]);
        if self.applied.get(&sr) != Some(&digest) {
            cx.stats.writes.fetch_add(1, Ordering::Relaxed);
            let obj = api
                .patch_status(&sr.name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&status))
                .await?;
            // The status write gives the import a new version too.
            self.written.record(
                ObjectRef { kind: "ServiceImport", ..sr.clone() },
                obj.metadata.resource_version.as_deref(),
            );
            self.applied.insert(sr, digest);
        }
        Ok(())
    }

    /// Server-side applies `body` unless it equals the last body applied.
    /// Returns the object when it was written.
    async fn apply<K>(
        &mut self,
        cx: &Ctx<'_>,
        r: &ObjectRef,
        api: &Api<K>,
        body: &Value,
    ) -> Result<Option<K>, kube::Error>
    where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        let digest = desired::digest_of(body);
        if self.applied.get(r) == Some(&digest) {
            cx.stats.unchanged.fetch_add(1, Ordering::Relaxed);
            return Ok(None);
        }
        let mut body = body.clone();
        body["metadata"]["annotations"][desired::ANNOTATION_APPLIED] = Value::String(digest.clone());
        cx.stats.writes.fetch_add(1, Ordering::Relaxed);
        let obj =
            api.patch(&r.name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&body)).await?;
        self.written.record(r.clone(), obj.meta().resource_version.as_deref());
        self.applied.insert(r.clone(), digest);
        Ok(Some(obj))
    }

    async fn delete(&mut self, cx: &Ctx<'_>, r: &ObjectRef) -> Result<(), kube::Error> {
        let client = cx.members[r.member].client.clone();
        cx.stats.writes.fetch_add(1, Ordering::Relaxed);
        let dp = DeleteParams::default();
        let result = match r.kind {
            "Service" => {
                Api::<Service>::namespaced(client, &r.namespace).delete(&r.name, &dp).await.map(|_| ())
            }
            "EndpointSlice" => {
                Api::<EndpointSlice>::namespaced(client, &r.namespace).delete(&r.name, &dp).await.map(|_| ())
            }
            _ => Api::<DynamicObject>::namespaced_with(client, &r.namespace, &cx.apis[r.member].import)
                .delete(&r.name, &dp)
                .await
                .map(|_| ()),
        };
        self.invalidate(r);
        match result {
            Ok(()) => {
                info!(member = %cx.members[r.member].name, kind = r.kind, object = %format!("{}/{}", r.namespace, r.name), "deleted");
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Writes Valid, Ready and Conflict on every export of `key`.
    async fn conditions(
        &mut self,
        cx: &Ctx<'_>,
        key: &ServiceKey,
        conditions: &[(crate::model::ClusterId, Vec<Condition>)],
        ready: bool,
        consumers: &Consumers,
        not_reached: &[&str],
    ) -> Result<(), kube::Error> {
        let members: Vec<&crate::model::ClusterId> = cx.members.iter().map(|m| &m.cluster).collect();
        let mut imported = consumers.describe(&members);
        if !not_reached.is_empty() {
            // "Imported into every member cluster …, except cluster-3: …"
            if imported.ends_with('.') {
                imported.pop();
            }
            imported.push_str(&format!(
                ", except {}: unreachable; written when it answers again.",
                not_reached.join(", ")
            ));
        }
        // One member refusing a status write must not cost the others
        // theirs: the first error is returned once every member had its turn.
        let mut failed = None;
        // Members sharing a cluster id share its entry: each gets it once.
        let mut done: BTreeSet<usize> = BTreeSet::new();
        let targets = conditions.iter().flat_map(|(cluster, conds)| {
            (0..cx.members.len()).filter(move |i| &cx.members[*i].cluster == cluster).map(move |i| (i, conds))
        });
        for (i, conds) in targets {
            if !cx.writable(i) || !done.insert(i) {
                continue;
            }
            // Only members that export it (a shared cluster id's entry covers
            // the others too).
            let Some(export) = cx.state.export_of(i, key) else { continue };
            // A deleted and re-created export is a new object: its conditions
            // start afresh (times included) and must be written even when the
            // body equals the one its predecessor got.
            let uid = export.uid;
            if self.export_uids.get(&i) != Some(&uid) {
                self.transitions.retain(|(m, _), _| *m != i);
                self.applied.remove(&object(i, "ServiceExport/status", key, key.name.to_string()));
                self.export_uids.insert(i, uid);
            }
            let mut all = conds.clone();
            let valid = conds.iter().any(|c| c.kind == condition::VALID && c.status == Status::True);
            all.push(if valid && ready {
                Condition {
                    kind: condition::READY,
                    status: Status::True,
                    reason: "Exported".into(),
                    message: imported.clone(),
                }
            } else {
                let (reason, message) = match (valid, consumers) {
                    (false, _) => ("Failed", "The export is not valid.".to_owned()),
                    (true, Consumers::Invalid(_)) => ("InvalidConsumerClusters", imported.clone()),
                    (true, _) => ("Pending", "Not yet written to every member cluster.".to_owned()),
                };
                Condition { kind: condition::READY, status: Status::False, reason: reason.into(), message }
            });
            let now = now_rfc3339();
            let timed: Vec<(Condition, String)> = all
                .into_iter()
                .map(|c| {
                    let slot = self.transitions.entry((i, c.kind)).or_insert((c.status, now.clone()));
                    if slot.0 != c.status {
                        *slot = (c.status, now.clone());
                    }
                    let t = slot.1.clone();
                    (c, t)
                })
                .collect();
            let ar = cx.apis[i].export.clone();
            let body = desired::export_status(&ar.api_version, key, &timed);
            let r = object(i, "ServiceExport/status", key, key.name.to_string());
            let text = desired::digest_of(&body["status"]);
            if self.applied.get(&r) == Some(&text) {
                continue;
            }
            let api: Api<DynamicObject> =
                Api::namespaced_with(cx.members[i].client.clone(), key.namespace.as_str(), &ar);
            cx.stats.writes.fetch_add(1, Ordering::Relaxed);
            match api
                .patch_status(&r.name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&body))
                .await
            {
                Ok(_) => {
                    self.applied.insert(r, text);
                }
                // The export went meanwhile.
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => {
                    warn!(member = %cx.members[i].name, service = %key, "cannot write the export's conditions: {e}");
                    failed = Some(e);
                }
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// Cluster ids more than one member has, each with a message naming them.
fn duplicate_ids(members: &[Member]) -> HashMap<crate::model::ClusterId, String> {
    let mut by_id: BTreeMap<&crate::model::ClusterId, Vec<&str>> = BTreeMap::new();
    for m in members {
        by_id.entry(&m.cluster).or_default().push(m.name.as_str());
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

/// Whether a refused Service write was refused for its primary IP family:
/// the existing ClusterIP is of another family than `ipFamilies[0]`.
fn primary_family_refused(s: &kube::core::Status) -> bool {
    s.details.as_ref().is_some_and(|d| d.causes.iter().any(|c| c.field == "spec.clusterIPs[0]"))
}

fn object(member: usize, kind: &'static str, key: &ServiceKey, name: String) -> ObjectRef {
    ObjectRef { member, kind, namespace: key.namespace.to_string(), name }
}

async fn discover(m: &Member) -> MemberApis {
    let health = Arc::new(WatchHealth::new(format!("API discovery of member {}", m.name)));
    let mut reporter = Reporter::new(health);
    let import = discover_mcs(&m.client, "ServiceImport", "serviceimports", &mut reporter).await;
    let export = discover_mcs(&m.client, "ServiceExport", "serviceexports", &mut reporter).await;
    MemberApis { import, export }
}

/// Placeholder versions for a member not discovered yet (never written to).
fn fallback_apis() -> MemberApis {
    MemberApis {
        import: mcs_resource("v1beta1", "ServiceImport", "serviceimports"),
        export: mcs_resource("v1beta1", "ServiceExport", "serviceexports"),
    }
}

fn now_rfc3339() -> String {
    k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::DnsLabel;

    #[test]
    fn only_an_object_written_before_a_list_began_can_be_gone() {
        let key =
            ServiceKey { namespace: DnsLabel::parse("shop").unwrap(), name: DnsLabel::parse("web").unwrap() };
        let import = object(1, "ServiceImport", &key, "web".into());
        let slice = object(1, "EndpointSlice", &key, "web-abc".into());
        // Wanted, but its write failed: owned, never written.
        let vip = object(1, "Service", &key, "web-clusterset".into());
        let mut ks = KeyState::default();
        ks.owned.extend([import.clone(), slice.clone(), vip]);
        ks.written.record(import.clone(), Some("5"));
        std::thread::sleep(Duration::from_millis(2));
        let listed_at = std::time::Instant::now();
        // The slice is written while the list is under way.
        std::thread::sleep(Duration::from_millis(2));
        ks.written.record(slice.clone(), Some("6"));
        let keys = HashMap::from([(key.clone(), ks)]);
        let seen = |r: &ObjectRef| Seen {
            kind: r.kind,
            namespace: r.namespace.clone(),
            name: r.name.clone(),
            service: "web".into(),
            version: "5".into(),
        };
        // Neither listed: the import, written before the list, is gone; the
        // slice may be newer than the list.
        assert_eq!(
            gone(&keys, 1, ("ServiceImport", None), &[], listed_at),
            vec![(key.clone(), import.clone())]
        );
        assert_eq!(gone(&keys, 1, ("EndpointSlice", Some("shop")), &[], listed_at), vec![]);
        // A later list without the slice: gone.
        std::thread::sleep(Duration::from_millis(2));
        let later = std::time::Instant::now();
        assert_eq!(gone(&keys, 1, ("EndpointSlice", None), &[], later), vec![(key.clone(), slice)]);
        // Never written, listed, of another member, or of another
        // namespace: not gone.
        assert_eq!(gone(&keys, 1, ("Service", None), &[], later), vec![]);
        assert_eq!(gone(&keys, 1, ("ServiceImport", None), &[seen(&import)], listed_at), vec![]);
        assert_eq!(gone(&keys, 0, ("ServiceImport", None), &[], listed_at), vec![]);
        assert_eq!(gone(&keys, 1, ("ServiceImport", Some("other")), &[], listed_at), vec![]);
    }

    #[test]
    fn retries_back_off_exponentially_with_a_spread_and_a_cap() {
        let key =
            ServiceKey { namespace: DnsLabel::parse("shop").unwrap(), name: DnsLabel::parse("web").unwrap() };
        for (failures, base) in [(1, 1), (2, 2), (3, 4), (6, 32), (9, 256), (10, 300), (40, 300)] {
            let wait = backoff(&key, failures);
            let base = Duration::from_secs(base);
            assert!(wait >= base && wait <= base + base / 5, "failure {failures}: {wait:?} for {base:?}");
        }
    }

    #[test]
    fn a_refused_primary_family_is_told_from_other_invalid_services() {
        // As the API server sends it.
        let refused = |field: &str| -> kube::core::Status {
            serde_json::from_value(serde_json::json!({"status": "Failure", "code": 422, "reason": "Invalid",
                "message": "Service is invalid", "details": {"name": "web", "kind": "Service",
                "causes": [{"reason": "FieldValueInvalid", "message": "Invalid value", "field": field}]}}))
            .unwrap()
        };
        assert!(primary_family_refused(&refused("spec.clusterIPs[0]")));
        assert!(!primary_family_refused(&refused("spec.ports[0].port")));
        assert!(!primary_family_refused(&kube::core::Status::failure("invalid", "Invalid").with_code(422)));
    }

    #[test]
    fn errors_are_told_apart_by_what_the_api_server_said() {
        let api =
            |code| kube::Error::Api(kube::core::Status::failure("refused", "Test").with_code(code).boxed());
        assert_eq!(ErrorReason::of(&api(429)), ErrorReason::Throttled);
        assert_eq!(ErrorReason::of(&api(403)), ErrorReason::Forbidden);
        assert_eq!(ErrorReason::of(&api(422)), ErrorReason::Invalid);
        assert_eq!(ErrorReason::of(&api(503)), ErrorReason::Server);
    }
}
