//! The controller's event loop. Member watches feed a [`FleetState`]; each
//! event names the services it touched, and only those are reconciled.
//! Reconciles run continuously, up to `--concurrent-syncs` at once, from a
//! [`WorkQueue`]: the loop keeps reading events, firing retries and checking
//! members while they run, and a service touched while it runs runs again
//! when it ends. Startup work (every exported service, and objects of ours
//! found live) waits in the queue's backlog, which live changes always
//! overtake.
//!
//! Nothing the loop does waits on a member: every watch, probe and API
//! discovery is a task of a [`TaskSet`] owned by the loop's future
//! (restarted when it ends or panics, counted, and gone when the loop is
//! dropped), and sends its news on a channel. Members are checked every
//! second: a member whose watches fail or whose API server stops
//! answering a probe (a partition, a frozen process) is marked unreachable
//! after `UNREACHABLE_AFTER`; its writes under way end at once and no more
//! are sent until it answers again. A member's writes, and its watches of
//! our ServiceImports, wait for its MCS versions; when discovery learns
//! them (or learns new ones) those watches start again with them.
//!
//! Every replica runs the watches; it reconciles only the services of the
//! shards it leads ([`Shards`]), and a shard it takes is first read whole
//! from every member, so taking it over changes nothing that is as wanted.
//! Each take of a shard is numbered: a read begun for an earlier take, or
//! before it, counts for nothing in a later one.
//!
//! The members are [`MemberLink`]s: the loop runs in process on a paused
//! clock in its tests, with fake members whose events the test sends.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tracing::{Instrument, info, warn};

use super::api::{ApiError, Kind, SharedApi};
use super::desired::has_elder;
use super::link::{MemberApis, MemberLink, undiscovered};
use super::own::{OwnEvent, OwnObject};
use super::queue::{Reason, WorkQueue};
use super::reconcile::{Env, Input, KeyState, MemberEnv, MemberInput, WrittenObject, reconcile};
use super::shard::Shards;
use super::stats::SyncStats;
use crate::fault::Failures;
use crate::fleet::member;
use crate::fleet::state::{FleetState, MemberEvent};
use crate::k8s::fence::WriteFence;
use crate::k8s::watch::scopes;
use crate::model::{ClusterId, ServiceKey};
use crate::supervise::{TaskId, TaskSet};

pub use super::api::ErrorReason;

mod members;
mod repair;
#[cfg(test)]
mod tests;

/// Services reconciled at once by default (`--concurrent-syncs`; each writes
/// to its members, every member in its own lane). The members' API servers,
/// not the controller, set the pace.
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
    /// Services reconciled at once (`--concurrent-syncs`).
    pub concurrency: usize,
}

/// How long the first lists of every member are waited for.
const FIRST_SYNC_TIMEOUT: Duration = Duration::from_secs(10);
/// A member is considered unreachable (skipped, and marked on imports) once
/// its watches or its probe have failed for this long.
const UNREACHABLE_AFTER: f64 = 5.0;
/// How often members' reachability is checked.
const TICK: Duration = Duration::from_secs(1);

/// An own-watch event about a service being reconciled: handled when the
/// reconcile ends, against the versions its writes recorded (else the
/// events of its own writes would look like someone else's).
enum Deferred {
    Changed {
        member: usize,
        seen: OwnObject,
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
    /// A member's objects read whole ([`super::adopt::adopt`]) at `began`;
    /// with `all`, every service is reconciled afterwards (a member just
    /// discovered). `gained`: the takes of shards the read was for.
    Adopted {
        member: usize,
        found: HashMap<ServiceKey, KeyState>,
        listed: Vec<Kind>,
        began: std::time::Instant,
        all: bool,
        gained: Vec<Take>,
    },
}

/// One take of a shard: the shard, and which of its takes (a shard lost and
/// taken again is a new take).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Take {
    shard: usize,
    number: u64,
}

/// Whether this replica writes a shard's services.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lead {
    /// Another replica does (or none).
    No,
    /// Just taken (`take`): its objects are being read from `reads`
    /// members; nothing of it is written until they are (so a shard that
    /// moves with nothing changed costs no write).
    Adopting { reads: usize, take: u64 },
    /// Led: its services are reconciled.
    Yes,
}

/// News from the loop's tasks besides the watches' events.
enum News {
    /// Member `i` serves these MCS versions (first learned, or changed).
    Discovered(usize, MemberApis),
}

/// The controller.
pub struct Syncer {
    members: Vec<Arc<dyn MemberLink>>,
    apis: Vec<MemberApis>,
    /// Per member: its write API with its versions.
    member_apis: Vec<SharedApi>,
    /// What reconciles share, per shard (its fence); replaced when a
    /// member is discovered.
    envs: Vec<Arc<Env>>,
    /// The shards, and which this replica leads.
    shards: Arc<Shards>,
    led: watch::Receiver<Vec<bool>>,
    lead: Vec<Lead>,
    /// Per shard: the number of its latest take, and when that began (a read
    /// begun before it knows nothing of it).
    takes: Vec<(u64, Option<std::time::Instant>)>,
    /// Per member: true while it is marked unreachable (ends its calls).
    down: Vec<watch::Sender<bool>>,
    state: FleetState,
    /// What the controller knows of its own objects, per service not being
    /// reconciled now (a running reconcile owns its service's).
    keys: HashMap<ServiceKey, KeyState>,
    /// Found live while their service was being reconciled, and why they
    /// were read.
    adopted: HashMap<ServiceKey, (KeyState, Reason)>,
    /// Own-watch events about services being reconciled.
    deferred: HashMap<ServiceKey, Vec<Deferred>>,
    queue: WorkQueue,
    behaviour: SyncBehaviour,
    /// Members currently unreachable, and since when (RFC 3339).
    unreachable: Vec<Option<String>>,
    /// Members whose MCS API versions are known.
    discovered: Vec<bool>,
    /// Members whose objects of ours have been read once since they were
    /// discovered: only then are they written (what they hold is compared
    /// first, so a restart writes nothing unchanged).
    read: Vec<bool>,
    /// Members whose endpoints are removed (`MemberLost::Remove`).
    removed: Vec<bool>,
    /// Cluster ids that more than one member has, with what to tell users.
    duplicates: HashMap<ClusterId, String>,
    /// Members whose Namespaces have been listed once.
    namespaces_listed: Vec<bool>,
    /// Per member: the tasks watching our ServiceImports (of the versions
    /// discovery found), ended when it finds others.
    import_watches: Vec<Vec<TaskId>>,
    /// The health of every watch, probe and discovery, for `/metrics`.
    watches: Vec<Arc<crate::k8s::watch::WatchHealth>>,
    tasks: TaskSet,
    stats: Arc<SyncStats>,
}

/// The loop's channels: what the tasks send, kept by the loop.
struct Inbox {
    events: mpsc::Receiver<MemberEvent>,
    own: mpsc::Receiver<OwnEvent>,
    own_tx: mpsc::Sender<OwnEvent>,
    news: mpsc::Receiver<News>,
}

impl Syncer {
    /// A controller for these members. It reconciles the services of the
    /// shards it leads, and writes each only while its shard's fence is
    /// open; the tasks it runs count their panics into `failures`.
    pub fn new(
        members: Vec<Arc<dyn MemberLink>>,
        behaviour: SyncBehaviour,
        stats: Arc<SyncStats>,
        shards: Arc<Shards>,
        failures: Arc<Failures>,
    ) -> Self {
        let duplicates = member::duplicate_ids(members.iter().map(|m| (m.name(), m.cluster())));
        let scopes = scopes(&behaviour.namespaces).len();
        let state = FleetState::new(members.iter().map(|m| m.cluster().clone()).collect(), scopes);
        let n = members.len();
        let down: Vec<watch::Sender<bool>> = (0..n).map(|_| watch::channel(false).0).collect();
        // Until a member's API versions are known it is not written to.
        let apis = vec![undiscovered(); n];
        let member_apis: Vec<SharedApi> = members
            .iter()
            .zip(&down)
            .map(|(m, down)| m.api(&undiscovered(), down.subscribe(), None))
            .collect();
        let envs = build_env(&members, &apis, &member_apis, &behaviour, &stats, &shards);
        let count = shards.count() as usize;
        Self {
            members,
            apis,
            member_apis,
            envs,
            led: shards.led(),
            shards,
            lead: vec![Lead::No; count],
            takes: vec![(0, None); count],
            down,
            state,
            keys: HashMap::new(),
            adopted: HashMap::new(),
            deferred: HashMap::new(),
            queue: WorkQueue::default(),
            unreachable: vec![None; n],
            discovered: vec![false; n],
            read: vec![false; n],
            removed: vec![false; n],
            duplicates,
            namespaces_listed: vec![false; n],
            import_watches: vec![Vec::new(); n],
            watches: Vec::new(),
            tasks: TaskSet::new(failures),
            behaviour,
            stats,
        }
    }

    /// Seconds since member `i` last answered: its watches or its probe.
    fn stale(&self, i: usize) -> f64 {
        self.members[i].stale_seconds()
    }

    /// Runs until dropped (the tasks it runs go with it).
    pub async fn run(mut self) {
        let mut inbox = self.start_tasks();
        self.first_lists(&mut inbox).await;
        // Who is unreachable is known before the first write, so that a
        // restart writes what its predecessor left, not a guess.
        self.check_members();
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
            let wake = next_tick.min(next_resync);
            tokio::select! {
                Some(e) = inbox.events.recv() => {
                    let mut touched = BTreeSet::new();
                    self.state.apply(e, &mut touched);
                    for key in touched {
                        self.queue.touch(key, Reason::Event);
                    }
                }
                Some(e) = inbox.own.recv() => self.own_event(e),
                Some(news) = inbox.news.recv() => self.news(news, &inbox.own_tx, &mut running, &scopes),
                Some(done) = running.next(), if !running.is_empty() => self.finished(done),
                Ok(()) = self.led.changed() => self.follow_shards(&mut running, &scopes),
                () = self.tasks.restart_next() => {}
                () = self.queue.due() => {}
                () = tokio::time::sleep_until(wake) => {}
            }
            let now = Instant::now();
            if now >= next_tick {
                self.check_members();
                if !complete && self.state.synced_except(&self.removed) {
                    info!("every member listed: reconciling everything, deletions included");
                    complete = true;
                    self.queue_all(Reason::Start);
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

    /// First: every member's complete lists, so nothing is deleted for
    /// lack of knowledge, and its MCS versions, so the first take of the
    /// shards reads it and nothing names it as not reached. A member still
    /// silent after FIRST_SYNC_TIMEOUT does not hold the others up: until
    /// it lists, nothing is deleted anywhere (see `reconcile`), and until it
    /// is discovered and read, it is not written.
    async fn first_lists(&mut self, inbox: &mut Inbox) {
        let deadline = Instant::now() + FIRST_SYNC_TIMEOUT;
        let mut touched = BTreeSet::new();
        loop {
            self.mark_removed();
            let discovered = self.discovered.iter().zip(&self.removed).all(|(d, r)| *d || *r);
            let known = self.members.iter().all(|m| m.known());
            if self.state.synced_except(&self.removed) && discovered && known {
                break;
            }
            if Instant::now() >= deadline {
                let silent: Vec<&str> = self
                    .members
                    .iter()
                    .zip(self.state.members())
                    .filter(|(_, s)| !s.synced())
                    .map(|(m, _)| m.name())
                    .collect();
                let undiscovered: Vec<&str> = self
                    .members
                    .iter()
                    .zip(&self.discovered)
                    .filter(|(_, d)| !**d)
                    .map(|(m, _)| m.name())
                    .collect();
                let unknown: Vec<&str> =
                    self.members.iter().filter(|m| !m.known()).map(|m| m.name()).collect();
                warn!(members = ?silent, undiscovered = ?undiscovered, liveness_unknown = ?unknown, "members not listed, or their MCS API not discovered, or their liveness not heard, within {FIRST_SYNC_TIMEOUT:?}: syncing the others, deleting nothing until they list, writing each once discovered");
                break;
            }
            let wake = (Instant::now() + TICK).min(deadline);
            tokio::select! {
                Some(e) = inbox.events.recv() => self.state.apply(e, &mut touched),
                Some(news) = inbox.news.recv() => {
                    self.learn(news, &inbox.own_tx);
                }
                () = self.tasks.restart_next() => {}
                () = tokio::time::sleep_until(wake) => {}
            }
        }
        for key in touched {
            self.queue.backlog(key, Reason::Start);
        }
    }

    /// True when this replica reconciles `key` now: it leads its shard,
    /// and has read what the members hold of it.
    fn leads(&self, key: &ServiceKey) -> bool {
        self.lead[self.shards.of(key)] == Lead::Yes
    }

    /// Takes in a change of the shards led: a shard lost is forgotten (its
    /// fence is closed already), a shard gained is a new take, read from
    /// every member before its services are reconciled.
    fn follow_shards(
        &mut self,
        running: &mut FuturesUnordered<BoxFuture<'static, Done>>,
        scopes: &[Option<String>],
    ) {
        let led = self.led.borrow_and_update().clone();
        let mut gained = Vec::new();
        for (i, now) in led.into_iter().enumerate() {
            match (now, self.lead[i]) {
                (true, Lead::No) => {
                    let number = self.takes[i].0 + 1;
                    self.takes[i] = (number, Some(std::time::Instant::now()));
                    gained.push(Take { shard: i, number });
                }
                (false, Lead::Adopting { .. } | Lead::Yes) => {
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
        let shards: Vec<usize> = gained.iter().map(|t| t.shard).collect();
        info!(shards = ?shards, members = reads, "shards taken: reading what the members hold of them");
        for t in gained {
            self.lead[t.shard] = Lead::Adopting { reads, take: t.number };
            if reads == 0 {
                self.shard_ready(t.shard);
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
            self.queue.backlog(key, Reason::Takeover);
        }
    }

    /// Tops the running reconciles up to the concurrency from the queue.
    fn start(&mut self, running: &mut FuturesUnordered<BoxFuture<'static, Done>>) {
        if running.len() >= self.behaviour.concurrency {
            return;
        }
        while running.len() < self.behaviour.concurrency {
            let Some((key, reason)) = self.queue.pop() else { break };
            if !self.leads(&key) {
                // Another replica's, or being read: queued again if taken.
                self.queue.done(&key);
                continue;
            }
            let ks = self.keys.remove(&key).unwrap_or_default();
            let input = self.input(&key);
            let shard = self.shards.of(&key);
            let env = self.envs[shard].clone();
            self.stats.reconciled(reason);
            // The reconcile's span: its writes, each member's, are in it
            // (`reconcile` records how many members were written and how it
            // ended), and so are its log lines.
            let span = tracing::info_span!(
                "reconcile",
                service = %key,
                shard,
                reason = reason.as_str(),
                members_written = tracing::field::Empty,
                writes = tracing::field::Empty,
                outcome = tracing::field::Empty,
            );
            running.push(Box::pin(
                async move {
                    let (ks, result) = reconcile(ks, input, env).await;
                    Done::Reconciled(key, Box::new(ks), result)
                }
                .instrument(span),
            ));
        }
    }

    /// What a reconcile of `key` reads of the fleet, taken now.
    fn input(&self, key: &ServiceKey) -> Input {
        let n = self.members.len();
        let mut exports: Vec<_> = self
            .state
            .exports(key)
            .into_iter()
            .filter(|e| !(0..n).any(|i| self.removed[i] && *self.members[i].cluster() == e.cluster))
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
                    writable: !self.members[i].remote()
                        && self.unreachable[i].is_none()
                        && self.discovered[i]
                        && self.read[i],
                    remote: self.members[i].remote(),
                    removed: self.removed[i],
                    unreachable_since: self.unreachable[i].clone(),
                    service: self.state.service_of(i, key).cloned(),
                    export: self.state.export_of(i, key),
                })
                .collect(),
            sources,
            synced: self.state.synced_except(&self.removed),
            has_elder: has_elder(&self.state, key),
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
                        let (wait, n) = self.queue.failed(&key, asked);
                        warn!(service = %key, reason = reason.as_str(), failures = n, error = %e, "sync failed, retrying in {wait:?}");
                    }
                }
                if self.lead[self.shards.of(&key)] == Lead::No {
                    // Its shard was lost meanwhile: another replica's now.
                    self.adopted.remove(&key);
                    self.deferred.remove(&key);
                    return;
                }
                if let Some((found, reason)) = self.adopted.remove(&key) {
                    ks.adopt(found);
                    self.queue.backlog(key.clone(), reason);
                }
                for d in self.deferred.remove(&key).unwrap_or_default() {
                    let repair = match d {
                        Deferred::Changed { member, seen, deleted } => {
                            self.repair_in(&mut ks, member, &seen, deleted)
                        }
                        Deferred::Listed { member, kind, scope, listed, began } => {
                            self.gone_in(&mut ks, member, (kind, scope.as_deref()), &listed, began)
                        }
                    };
                    if repair {
                        self.queue.touch(key.clone(), Reason::Drift);
                    }
                }
                if !ks.is_empty() {
                    self.keys.insert(key, ks);
                }
            }
            Done::Adopted { member, found, listed, began, all, gained } => {
                self.read[member] = true;
                let seen: BTreeSet<WrittenObject> =
                    found.values().flat_map(|ks| ks.owned.iter().cloned()).collect();
                let why = match (gained.is_empty(), all) {
                    (false, _) => Reason::Takeover,
                    (true, true) => Reason::Member,
                    (true, false) => Reason::Resync,
                };
                self.adopted(found, all, began, why);
                for t in gained {
                    // Only a read for this very take counts: one for an
                    // earlier take of a shard lost and taken again does not.
                    match self.lead[t.shard] {
                        Lead::Adopting { reads, take } if take == t.number && reads <= 1 => {
                            self.shard_ready(t.shard);
                        }
                        Lead::Adopting { reads, take } if take == t.number => {
                            self.lead[t.shard] = Lead::Adopting { reads: reads - 1, take };
                        }
                        _ => {}
                    }
                }
                // Ours, not found by a list that began after our last write:
                // deleted while no event said so.
                let listed: BTreeSet<Kind> = listed.into_iter().collect();
                let mut touched = Vec::new();
                for (key, ks) in &mut self.keys {
                    let gone: Vec<WrittenObject> = ks
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
                        info!(member = %self.members[member].name(), kind = %r.kind, object = %r.path(), "ours, and gone: writing it again");
                        self.stats.drift(r.kind);
                        ks.invalidate(&r);
                        touched.push(key.clone());
                    }
                }
                for key in touched {
                    self.queue.backlog(key, Reason::Drift);
                }
            }
        }
    }
}

/// What reconciles share, per shard: the members (with the write API of the
/// versions each serves) and the shard's fence.
fn build_env(
    members: &[Arc<dyn MemberLink>],
    apis: &[MemberApis],
    member_apis: &[SharedApi],
    behaviour: &SyncBehaviour,
    stats: &Arc<SyncStats>,
    shards: &Shards,
) -> Vec<Arc<Env>> {
    let members: Arc<[MemberEnv]> = members
        .iter()
        .zip(apis)
        .zip(member_apis)
        .map(|((m, a), api)| MemberEnv {
            name: m.name().to_owned(),
            cluster: m.cluster().clone(),
            api: api.clone(),
            import_version: a.import.api_version.clone(),
            export_version: a.export.api_version.clone(),
        })
        .collect();
    (0..shards.count() as usize)
        .map(|i| {
            Arc::new(Env {
                members: members.clone(),
                auto_export_prefixes: behaviour.auto_export_prefixes.clone(),
                stats: stats.clone(),
                fence: WriteFence::new(shards.fence(i).clone(), u32::try_from(i).unwrap_or(u32::MAX)),
            })
        })
        .collect()
}
