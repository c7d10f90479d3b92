//! The controller's event loop. Member watches feed a [`FleetState`]; each
//! event names the services it touched, and only those are reconciled.
//! Reconciles run continuously, up to [`CONCURRENCY`] at once, from a
//! [`WorkQueue`]: the loop keeps reading events, firing retries and checking
//! members while they run, and a service touched while it runs runs again
//! when it ends. Startup work (every exported service, and objects of ours
//! found live) waits in the queue's backlog, which live changes always
//! overtake.
//!
//! Members are checked every second: a member whose watches fail or whose
//! API server stops answering a probe (a partition, a frozen process) is
//! marked unreachable after `UNREACHABLE_AFTER`; its writes under way end
//! at once and no more are sent until it answers again.
//!
//! Every replica runs the watches; it reconciles only the services of the
//! shards it leads ([`Shards`]), and a shard it takes is first read whole
//! from every member, so taking it over changes nothing that is as wanted.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::{info, warn};

use super::adopt::adopt;
use super::api::{ApiError, CALL_DEADLINE, Kind, KubeMember, SharedApi};
use super::desired::Stems;
use super::own::{self, OwnChange, OwnEvent, Seen};
use super::queue::WorkQueue;
use super::reconcile::{Env, Input, KeyState, MemberEnv, MemberInput, ObjectRef, now_rfc3339, reconcile};
use super::shard::Shards;
use super::stats::SyncStats;
use crate::fleet::member::{self, Member};
use crate::fleet::state::FleetState;
use crate::k8s::fence::WriteFence;
use crate::k8s::mcs::{discover_mcs, mcs_resource};
use crate::k8s::watch::{Lists, Reporter, WatchHealth, scopes};
use crate::model::{ClusterId, ServiceKey};

pub use super::api::ErrorReason;

/// Services reconciled at once (each writes to its members, every member in
/// its own lane). The members' API servers, not the controller, set the pace.
pub const CONCURRENCY: usize = 64;

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
    /// How often every member's objects of ours are read whole again and
    /// every service reconciled against them (`--resync-interval`): what no
    /// event announces (an edit while a watch was down and its relist
    /// raced our write) is repaired by then.
    pub resync: Duration,
}

/// How long API discovery of a member is waited for at a time.
const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(3);
/// How long the first lists of every member are waited for.
const FIRST_SYNC_TIMEOUT: Duration = Duration::from_secs(10);
/// A member is considered unreachable (skipped, and marked on imports) once
/// its watches or its probe have failed for this long.
const UNREACHABLE_AFTER: f64 = 5.0;
/// How often members' reachability is checked, and each member probed.
const TICK: Duration = Duration::from_secs(1);
/// How long a probe of a member's API server waits for its answer.
const PROBE_DEADLINE: Duration = Duration::from_secs(2);

/// The MCS API versions a member serves.
#[derive(Clone)]
struct MemberApis {
    import: kube::api::ApiResource,
    export: kube::api::ApiResource,
}

/// An own-watch event about a service being reconciled: handled when the
/// reconcile ends, against the versions its writes recorded (else the
/// events of its own writes would look like someone else's).
enum Deferred {
    Seen {
        member: usize,
        seen: Seen,
        deleted: bool,
    },
    Listed {
        member: usize,
        kind: Kind,
        scope: Option<String>,
        listed: Arc<BTreeSet<(String, String)>>,
        began: std::time::Instant,
    },
}

/// What ends in the loop's set of running work.
enum Done {
    /// A service reconciled.
    Reconciled(ServiceKey, Box<KeyState>, Result<(), ApiError>),
    /// A member's objects read whole ([`adopt`]) at `began`; with `all`,
    /// every service is reconciled afterwards (a member just discovered).
    /// `gained`: the shards just taken that the read was for.
    Adopted {
        member: usize,
        found: HashMap<ServiceKey, KeyState>,
        listed: Vec<Kind>,
        began: std::time::Instant,
        all: bool,
        gained: Vec<usize>,
    },
}

/// Whether this replica writes a shard's services.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lead {
    /// Another replica does (or none).
    No,
    /// Just taken: its objects are being read from this many members;
    /// nothing of it is written until they are (so a shard that moves with
    /// nothing changed costs no write).
    Adopting(usize),
    /// Led: its services are reconciled.
    Yes,
}

/// The controller.
pub struct Syncer {
    members: Vec<Member>,
    apis: Vec<MemberApis>,
    /// What reconciles share, per shard (its fence); replaced when a
    /// member is discovered.
    envs: Vec<Arc<Env>>,
    /// The shards, and which this replica leads.
    shards: Arc<Shards>,
    led: watch::Receiver<Vec<bool>>,
    lead: Vec<Lead>,
    /// Per member: true while it is marked unreachable (ends its calls).
    down: Vec<watch::Sender<bool>>,
    state: FleetState,
    /// What the controller knows of its own objects, per service not being
    /// reconciled now (a running reconcile owns its service's).
    keys: HashMap<ServiceKey, KeyState>,
    /// Found live while their service was being reconciled.
    adopted: HashMap<ServiceKey, KeyState>,
    /// Own-watch events about services being reconciled.
    deferred: HashMap<ServiceKey, Vec<Deferred>>,
    queue: WorkQueue,
    behaviour: SyncBehaviour,
    /// Members currently unreachable, and since when (RFC 3339).
    unreachable: Vec<Option<String>>,
    /// Members whose MCS API versions are known (writes wait for it).
    discovered: Vec<bool>,
    /// Members whose endpoints are removed (`MemberLost::Remove`).
    removed: Vec<bool>,
    /// Cluster ids that more than one member has, with what to tell users.
    duplicates: HashMap<ClusterId, String>,
    /// Members whose Namespaces have been listed once.
    namespaces_listed: Vec<bool>,
    stats: Arc<SyncStats>,
}

impl Syncer {
    /// A controller for these members (API versions discovered now). It
    /// reconciles the services of the shards it leads, and writes each only
    /// while its shard's fence is open.
    pub async fn new(
        members: Vec<Member>,
        behaviour: SyncBehaviour,
        stats: Arc<SyncStats>,
        shards: Arc<Shards>,
    ) -> Self {
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
        let duplicates = member::duplicate_ids(&members);
        let scopes = scopes(&behaviour.namespaces).len();
        let state = FleetState::new(members.iter().map(|m| m.cluster.clone()).collect(), scopes);
        let n = members.len();
        let down: Vec<watch::Sender<bool>> = (0..n).map(|_| watch::channel(false).0).collect();
        let envs = build_env(&members, &apis, &down, &behaviour, &stats, &shards);
        let lead = vec![Lead::No; shards.count() as usize];
        Self {
            members,
            apis,
            envs,
            led: shards.led(),
            shards,
            lead,
            down,
            state,
            keys: HashMap::new(),
            adopted: HashMap::new(),
            deferred: HashMap::new(),
            queue: WorkQueue::default(),
            unreachable: vec![None; n],
            discovered,
            removed: vec![false; n],
            duplicates,
            namespaces_listed: vec![false; n],
            behaviour,
            stats,
        }
    }

    /// Seconds since member `i` last answered: its watches or its probe.
    fn stale(&self, i: usize) -> f64 {
        self.members[i].stale_seconds()
    }

    /// Runs until the watches end.
    pub async fn run(mut self) {
        let (tx, mut rx) = mpsc::channel::<crate::fleet::state::MemberEvent>(1024);
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
            tasks.spawn(probe(m.client.clone(), Reporter::new(m.probe.clone())));
        }
        drop(tx);
        drop(own_tx);
        // First: every member's complete lists, so nothing is deleted for
        // lack of knowledge. A member still silent after FIRST_SYNC_TIMEOUT
        // does not hold the others up: until it lists, nothing is deleted
        // anywhere (see `reconcile`).
        let deadline = Instant::now() + FIRST_SYNC_TIMEOUT;
        let mut touched = BTreeSet::new();
        loop {
            self.mark_removed();
            if self.state.synced_except(&self.removed) {
                break;
            }
            let wake = (Instant::now() + TICK).min(deadline);
            match tokio::time::timeout_at(wake, rx.recv()).await {
                Ok(Some(e)) => self.state.apply(e, &mut touched),
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
        for key in touched {
            self.queue.backlog(key);
        }
        let mut complete = self.state.synced_except(&self.removed);
        let scopes = scopes(&self.behaviour.namespaces);
        let mut running: FuturesUnordered<BoxFuture<'static, Done>> = FuturesUnordered::new();
        // What is there now in the shards led, read whole from every member
        // at once (a member that does not answer holds the others up for one
        // call deadline at most), before anything of them is written.
        self.follow_shards(&mut running, &scopes);
        info!(services = self.queue.depth(), "sync: members listed; reconciling the shards led");
        let mut next_tick = Instant::now() + TICK;
        let mut next_resync = Instant::now() + self.behaviour.resync;
        loop {
            self.start(&mut running);
            self.stats.queue_depth.store(self.queue.depth() as u64, Ordering::Relaxed);
            let wake = self.queue.next_retry().map_or(next_tick, |t| t.min(next_tick)).min(next_resync);
            tokio::select! {
                e = rx.recv() => match e {
                    Some(e) => {
                        let mut touched = BTreeSet::new();
                        self.state.apply(e, &mut touched);
                        for key in touched {
                            self.queue.touch(key);
                        }
                    }
                    None => return, // every watch ended: shutting down
                },
                Some(e) = own_rx.recv() => self.own_event(e),
                Some(done) = running.next(), if !running.is_empty() => self.finished(done),
                Ok(()) = self.led.changed() => self.follow_shards(&mut running, &scopes),
                () = tokio::time::sleep_until(wake) => {}
            }
            let now = Instant::now();
            self.queue.due(now);
            if now >= next_tick {
                self.check_members(&mut running, &scopes).await;
                if !complete && self.state.synced_except(&self.removed) {
                    info!("every member listed: reconciling everything, deletions included");
                    complete = true;
                    self.queue_all();
                }
                next_tick = now + TICK;
            }
            if now >= next_resync {
                info!("resync: reading every member's objects of ours again");
                self.read_members(&mut running, &scopes, None, &[]);
                next_resync = now + self.behaviour.resync;
            }
        }
    }

    /// True when this replica reconciles `key` now: it leads its shard,
    /// and has read what the members hold of it.
    fn leads(&self, key: &ServiceKey) -> bool {
        self.lead[self.shards.of(key)] == Lead::Yes
    }

    /// Takes in a change of the shards led: a shard lost is forgotten (its
    /// fence is closed already), a shard gained is read from every member
    /// before its services are reconciled.
    fn follow_shards(
        &mut self,
        running: &mut FuturesUnordered<BoxFuture<'static, Done>>,
        scopes: &[Option<String>],
    ) {
        let led = self.led.borrow_and_update().clone();
        let mut gained = Vec::new();
        for (i, now) in led.into_iter().enumerate() {
            match (now, self.lead[i]) {
                (true, Lead::No) => gained.push(i),
                (false, Lead::Adopting(_) | Lead::Yes) => {
                    info!(shard = i, "shard lost: its services are left to whichever replica leads it");
                    self.lead[i] = Lead::No;
                    let shards = self.shards.clone();
                    let kept = |k: &ServiceKey| shards.of(k) != i;
                    self.keys.retain(|k, _| kept(k));
                    self.adopted.retain(|k, _| kept(k));
                    self.deferred.retain(|k, _| kept(k));
                }
                _ => {}
            }
        }
        if gained.is_empty() {
            return;
        }
        let reads = self.read_members(running, scopes, None, &gained);
        info!(shards = ?gained, members = reads, "shards taken: reading what the members hold of them");
        for &i in &gained {
            self.lead[i] = Lead::Adopting(reads);
            if reads == 0 {
                self.shard_ready(i);
            }
        }
    }

    /// Shard `i`'s objects have been read from every member: its services
    /// are reconciled from now on.
    fn shard_ready(&mut self, i: usize) {
        self.lead[i] = Lead::Yes;
        let keys: Vec<ServiceKey> = self
            .state
            .keys()
            .into_iter()
            .chain(self.keys.keys().cloned())
            .filter(|k| self.shards.of(k) == i)
            .collect();
        info!(shard = i, services = keys.len(), "leading the shard: reconciling its services");
        for key in keys {
            self.queue.backlog(key);
        }
    }

    /// Tops the running reconciles up to [`CONCURRENCY`] from the queue.
    fn start(&mut self, running: &mut FuturesUnordered<BoxFuture<'static, Done>>) {
        if running.len() >= CONCURRENCY {
            return;
        }
        let stems = Stems::of(&self.state);
        while running.len() < CONCURRENCY {
            let Some(key) = self.queue.pop() else { break };
            if !self.leads(&key) {
                // Another replica's, or being read: queued again if taken.
                self.queue.done(&key);
                continue;
            }
            let ks = self.keys.remove(&key).unwrap_or_default();
            let input = self.input(&key, &stems);
            let env = self.envs[self.shards.of(&key)].clone();
            running.push(Box::pin(async move {
                let (ks, result) = reconcile(ks, input, env).await;
                Done::Reconciled(key, Box::new(ks), result)
            }));
        }
    }

    /// What a reconcile of `key` reads of the fleet, taken now.
    fn input(&self, key: &ServiceKey, stems: &Stems) -> Input {
        let n = self.members.len();
        let mut exports: Vec<_> = self
            .state
            .exports(key)
            .into_iter()
            .filter(|e| !(0..n).any(|i| self.removed[i] && self.members[i].cluster == e.cluster))
            .collect();
        // Two members with one cluster id: neither's export counts, so their
        // endpoints never mix under one id.
        for e in &mut exports {
            if let Some(why) = self.duplicates.get(&e.cluster) {
                e.service = crate::fleet::export::Exported::DuplicateCluster(why.clone());
            }
        }
        let sources =
            exports.iter().map(|e| (e.cluster.clone(), self.state.source_slices(&e.cluster, key))).collect();
        Input {
            key: key.clone(),
            exports,
            members: (0..n)
                .map(|i| MemberInput {
                    writable: self.unreachable[i].is_none() && self.discovered[i],
                    removed: self.removed[i],
                    unreachable_since: self.unreachable[i].clone(),
                    service: self.state.service_of(i, key).cloned(),
                    export: self.state.export_of(i, key),
                })
                .collect(),
            sources,
            synced: self.state.synced_except(&self.removed),
            has_elder: stems.has_elder(&self.state, key),
        }
    }

    /// A reconcile or a read of a member ended.
    fn finished(&mut self, done: Done) {
        match done {
            Done::Reconciled(key, ks, result) => {
                let mut ks = *ks;
                match result {
                    Ok(()) => self.queue.done(&key),
                    Err(e) => {
                        let reason = e.reason();
                        self.stats.error(reason);
                        let asked = Duration::from_secs(e.retry_after().into());
                        let (wait, n) = self.queue.failed(&key, asked, Instant::now());
                        warn!(service = %key, reason = reason.as_str(), failures = n, error = %e, "sync failed, retrying in {wait:?}");
                    }
                }
                if self.lead[self.shards.of(&key)] == Lead::No {
                    // Its shard was lost meanwhile: another replica's now.
                    self.adopted.remove(&key);
                    self.deferred.remove(&key);
                    return;
                }
                if let Some(found) = self.adopted.remove(&key) {
                    ks.adopt(found);
                    self.queue.backlog(key.clone());
                }
                for d in self.deferred.remove(&key).unwrap_or_default() {
                    let repair = match d {
                        Deferred::Seen { member, seen, deleted } => {
                            self.repair_in(&mut ks, member, &seen, deleted)
                        }
                        Deferred::Listed { member, kind, scope, listed, began } => {
                            self.gone_in(&mut ks, member, (kind, scope.as_deref()), &listed, began)
                        }
                    };
                    if repair {
                        self.queue.touch(key.clone());
                    }
                }
                if !ks.is_empty() {
                    self.keys.insert(key, ks);
                }
            }
            Done::Adopted { member, found, listed, began, all, gained } => {
                let seen: BTreeSet<ObjectRef> =
                    found.values().flat_map(|ks| ks.owned.iter().cloned()).collect();
                self.adopted(found, all);
                for i in gained {
                    if let Lead::Adopting(n) = self.lead[i] {
                        if n <= 1 {
                            self.shard_ready(i);
                        } else {
                            self.lead[i] = Lead::Adopting(n - 1);
                        }
                    }
                }
                // Ours, not found by a list that began after our last write:
                // deleted while no event said so.
                let listed: BTreeSet<Kind> = listed.into_iter().collect();
                let mut touched = Vec::new();
                for (key, ks) in &mut self.keys {
                    let gone: Vec<ObjectRef> = ks
                        .owned
                        .iter()
                        .filter(|r| {
                            r.member == member
                                && listed.contains(&r.kind)
                                && !seen.contains(*r)
                                && ks.written.before(r, began)
                        })
                        .cloned()
                        .collect();
                    for r in gone {
                        info!(member = %self.members[member].name, kind = %r.kind, object = %r.path(), "ours, and gone: writing it again");
                        self.stats.drift(r.kind);
                        ks.invalidate(&r);
                        touched.push(key.clone());
                    }
                }
                for key in touched {
                    self.queue.backlog(key);
                }
            }
        }
    }

    /// Takes in what [`adopt`] found in member `m`.
    fn adopted(&mut self, found: HashMap<ServiceKey, KeyState>, all: bool) {
        let lists = 4 * scopes(&self.behaviour.namespaces).len();
        self.stats.reads.fetch_add(lists as u64, Ordering::Relaxed);
        for (key, found) in found {
            if self.lead[self.shards.of(&key)] == Lead::No {
                continue;
            }
            if self.queue.is_running(&key) {
                self.adopted.entry(key.clone()).or_default().adopt(found);
            } else {
                self.keys.entry(key.clone()).or_default().adopt(found);
            }
            self.queue.backlog(key);
        }
        if all {
            self.queue_all();
        }
    }

    /// Reads every writable member's objects of ours again (`only`: one
    /// member; `gained`: for shards just taken), in the running set: a
    /// member that does not answer holds up nothing. Returns how many reads
    /// were started.
    fn read_members(
        &mut self,
        running: &mut FuturesUnordered<BoxFuture<'static, Done>>,
        scopes: &[Option<String>],
        only: Option<usize>,
        gained: &[usize],
    ) -> usize {
        let mut started = 0;
        for i in 0..self.members.len() {
            if only.is_some_and(|o| o != i) || !self.discovered[i] || self.unreachable[i].is_some() {
                continue;
            }
            let (api, cluster, scopes) =
                (self.envs[0].members[i].api.clone(), self.members[i].cluster.clone(), scopes.to_vec());
            let name = self.members[i].name.clone();
            let all = only.is_some();
            let gained = gained.to_vec();
            started += 1;
            running.push(Box::pin(async move {
                let began = std::time::Instant::now();
                let (found, failed) = adopt(api.as_ref(), i, &cluster, &scopes).await;
                for (kind, e) in &failed {
                    warn!(member = %name, kind = %kind, error = %e, "cannot list our objects: not adopted, written again if wanted");
                }
                let listed = [Kind::ServiceImport, Kind::Service, Kind::EndpointSlice]
                    .into_iter()
                    .filter(|k| !failed.iter().any(|(f, _)| f == k))
                    .collect();
                Done::Adopted { member: i, found, listed, began, all, gained }
            }));
        }
        started
    }

    /// Someone else's change to one of our objects: what we recorded as
    /// applied no longer holds, so the service is reconciled and the object
    /// written again.
    fn own_event(&mut self, e: OwnEvent) {
        let m = e.member;
        match e.change {
            // A namespace created (or changed) in a member: its services may
            // now be imported there (namespace sameness). The first list is
            // the start, which reconciles everything anyway.
            OwnChange::Namespace(ns) => self.queue_namespace(&ns),
            OwnChange::Namespaces(all) => {
                if std::mem::replace(&mut self.namespaces_listed[m], true) {
                    for ns in all {
                        self.queue_namespace(&ns);
                    }
                }
            }
            OwnChange::Applied(seen) => self.repair(m, seen, false),
            OwnChange::Deleted(seen) => self.repair(m, seen, true),
            OwnChange::Listed(kind, scope, items, began) => {
                let listed: Arc<BTreeSet<(String, String)>> =
                    Arc::new(items.iter().map(|s| (s.namespace.clone(), s.name.clone())).collect());
                for seen in items {
                    self.repair(m, seen, false);
                }
                let mut touched = Vec::new();
                let mut keys = std::mem::take(&mut self.keys);
                for (key, ks) in &mut keys {
                    if self.gone_in(ks, m, (kind, scope.as_deref()), &listed, began) {
                        touched.push(key.clone());
                    }
                }
                self.keys = keys;
                for key in touched {
                    self.queue.touch(key);
                }
                // Services being reconciled check the list when they end.
                for key in self.queue.running() {
                    self.deferred.entry(key).or_default().push(Deferred::Listed {
                        member: m,
                        kind,
                        scope: scope.clone(),
                        listed: listed.clone(),
                        began,
                    });
                }
            }
        }
    }

    /// Queues every service of namespace `ns` some member exports.
    fn queue_namespace(&mut self, ns: &str) {
        let keys: Vec<ServiceKey> = self
            .state
            .keys()
            .into_iter()
            .filter(|k| k.namespace.as_str() == ns && !self.state.exports(k).is_empty())
            .collect();
        for key in keys {
            self.queue.touch(key);
        }
    }

    /// Queues the service of `seen` for another write of it, unless the
    /// event is of our own write or of an object we no longer want.
    fn repair(&mut self, m: usize, seen: Seen, deleted: bool) {
        let meta = kube::api::ObjectMeta {
            namespace: Some(seen.namespace.clone()),
            name: Some(seen.service.clone()),
            ..Default::default()
        };
        let Ok(key) = crate::fleet::objects::key_of(&self.members[m].cluster, seen.kind.as_str(), &meta)
        else {
            return;
        };
        if self.queue.is_running(&key) {
            self.deferred.entry(key).or_default().push(Deferred::Seen { member: m, seen, deleted });
            return;
        }
        let Some(mut ks) = self.keys.remove(&key) else { return };
        if self.repair_in(&mut ks, m, &seen, deleted) {
            self.queue.touch(key.clone());
        }
        self.keys.insert(key, ks);
    }

    /// [`Self::repair`] on the service's state; true when it needs a write.
    fn repair_in(&self, ks: &mut KeyState, m: usize, seen: &Seen, deleted: bool) -> bool {
        let r = ObjectRef {
            member: m,
            kind: seen.kind,
            namespace: seen.namespace.clone(),
            name: seen.name.clone(),
        };
        if !ks.owned.contains(&r) || (!deleted && ks.written.ours(&r, &seen.version)) {
            return false;
        }
        ks.invalidate(&r);
        self.stats.drift(r.kind);
        let what = if deleted { "deleted" } else { "changed" };
        info!(member = %self.members[m].name, kind = %r.kind, object = %r.path(), "ours, {what} by someone else: writing it again");
        true
    }

    /// Our objects of `kind` in member `m` and `scope` (`None`: every
    /// namespace) that a list asked for at `began` does not hold: deleted
    /// while the watch was down. Only an object whose last write was recorded
    /// before `began` can be gone. One written since may be newer than the
    /// list, however late the list arrives (a batch of writes throttled by
    /// the API server can take longer), and taking it for gone would write it
    /// again, and again see the events of the first write as someone else's.
    /// One with no write recorded was never written (its write failed and is
    /// retried) or is being written again: nothing to repair. True when one
    /// is gone (and forgotten, to be written again).
    fn gone_in(
        &self,
        ks: &mut KeyState,
        m: usize,
        (kind, scope): (Kind, Option<&str>),
        listed: &BTreeSet<(String, String)>,
        began: std::time::Instant,
    ) -> bool {
        let gone: Vec<ObjectRef> = ks.gone(m, (kind, scope), listed, began);
        for r in &gone {
            info!(member = %self.members[m].name, kind = %r.kind, object = %r.path(), "ours, and gone: writing it again");
            self.stats.drift(r.kind);
            ks.invalidate(r);
        }
        !gone.is_empty()
    }

    /// Notices members becoming unreachable or reachable again, and queues
    /// every service they take part in.
    async fn check_members(
        &mut self,
        running: &mut FuturesUnordered<BoxFuture<'static, Done>>,
        scopes: &[Option<String>],
    ) {
        for i in 0..self.members.len() {
            if !self.discovered[i]
                && self.stale(i) == 0.0
                && let Ok(apis) = tokio::time::timeout(DISCOVERY_TIMEOUT, discover(&self.members[i])).await
            {
                info!(member = %self.members[i].name, "API discovered: reconciling everything");
                self.apis[i] = apis;
                self.discovered[i] = true;
                self.envs = build_env(
                    &self.members,
                    &self.apis,
                    &self.down,
                    &self.behaviour,
                    &self.stats,
                    &self.shards,
                );
                self.read_members(running, scopes, Some(i), &[]);
            }
        }
        for i in 0..self.members.len() {
            let stale = self.stale(i);
            let unreachable = stale >= UNREACHABLE_AFTER;
            let name = &self.members[i].name;
            match (unreachable, self.unreachable[i].is_some()) {
                (true, false) => {
                    warn!(member = %name, stale_seconds = stale, "member unreachable: its endpoints are kept and marked; writes to it wait");
                    self.unreachable[i] = Some(now_rfc3339());
                    self.down[i].send_replace(true);
                }
                (false, true) => {
                    info!(member = %name, "member reachable again: reconciling everything it takes part in");
                    self.unreachable[i] = None;
                    self.down[i].send_replace(false);
                }
                _ => continue,
            }
            // Writes to it were skipped, or its endpoints are marked: every
            // service may need a write.
            self.queue_all();
        }
        self.mark_removed();
    }

    /// Queues every service a member has objects of, and every service the
    /// controller has objects for.
    fn queue_all(&mut self) {
        let keys: Vec<ServiceKey> = self.state.keys().into_iter().chain(self.keys.keys().cloned()).collect();
        for key in keys {
            self.queue.touch(key);
        }
    }

    /// Applies `--on-member-lost=remove`: members unreachable for the window
    /// stop counting; their services are queued when that changes.
    fn mark_removed(&mut self) {
        for i in 0..self.members.len() {
            let removed = self.behaviour.on_member_lost == MemberLost::Remove
                && self.stale(i) >= self.behaviour.lost_after.as_secs_f64();
            if removed != self.removed[i] {
                if removed {
                    warn!(member = %self.members[i].name, "member lost for {:?}: removing its endpoints everywhere (--on-member-lost=remove)", self.behaviour.lost_after);
                } else {
                    info!(member = %self.members[i].name, "lost member is back: its endpoints return");
                }
                self.removed[i] = removed;
                for key in self.state.exported_by(i) {
                    self.queue.touch(key);
                }
            }
        }
    }
}

/// Probes a member's API server every [`TICK`]: a watch on a frozen or
/// partitioned API server fails no request, it only stops hearing; the probe
/// does, within [`PROBE_DEADLINE`].
async fn probe(client: kube::Client, mut reporter: Reporter) {
    loop {
        match tokio::time::timeout(PROBE_DEADLINE, client.apiserver_version()).await {
            Ok(Ok(_)) => reporter.ok(),
            Ok(Err(e)) => reporter.failed(&e.to_string()),
            Err(_) => reporter.failed(&format!("no answer within {PROBE_DEADLINE:?}")),
        }
        tokio::time::sleep(TICK).await;
    }
}

fn build_env(
    members: &[Member],
    apis: &[MemberApis],
    down: &[watch::Sender<bool>],
    behaviour: &SyncBehaviour,
    stats: &Arc<SyncStats>,
    shards: &Shards,
) -> Vec<Arc<Env>> {
    let members: Arc<[MemberEnv]> = members
        .iter()
        .zip(apis)
        .zip(down)
        .map(|((m, a), down)| {
            let api: SharedApi = Arc::new(KubeMember::new(
                m.name.clone(),
                m.client.clone(),
                (a.import.clone(), a.export.clone()),
                CALL_DEADLINE,
                down.subscribe(),
                Some(stats.write_seconds.with_label_values(&[m.name.as_str()])),
            ));
            MemberEnv {
                name: m.name.clone(),
                cluster: m.cluster.clone(),
                api,
                import_version: a.import.api_version.clone(),
                export_version: a.export.api_version.clone(),
            }
        })
        .collect();
    (0..shards.count() as usize)
        .map(|i| {
            Arc::new(Env {
                members: members.clone(),
                auto_export_prefixes: behaviour.auto_export_prefixes.clone(),
                stats: stats.clone(),
                fence: WriteFence::new(shards.fence(i).clone(), i as u32),
            })
        })
        .collect()
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
