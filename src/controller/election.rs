//! Which replica leads which shard, on coordination.k8s.io Leases.
//!
//! Shard `i` of `N` has the Lease `<name>-i` (`<name>` itself when `N` is
//! 1, today's single Lease); every replica also keeps a Lease of its own,
//! `<name>-replica-<hash of its identity>`, that says it is alive. All are
//! labelled with the group (`clusterset-dns.io/lease-group: <name>`) and
//! carry the replica's `--shards` in an annotation, so one list per check
//! shows the whole election, whatever `N`.
//!
//! Every check (a fifth of the lease duration, 1-3 s) a replica: counts the
//! live replicas `R` and takes `ceil(N / R)` as its fair share; gives up
//! shards above its share (another replica is waiting); renews the shards
//! it leads; takes unheld or expired shards while under its share. A Lease
//! is expired when this replica has seen it unchanged for its duration on
//! its own clock, as client-go's leader election judges it: clocks of
//! different machines are never compared. Writes carry the resourceVersion
//! read, so of two replicas taking one shard exactly one succeeds.
//!
//! A shard's fence ([`super::fence`]) is held open until the wall-clock
//! time of its last renewal's request plus the duration less a margin: a
//! replica frozen, or cut off from the Leases' cluster, stops writing that
//! shard before another may take it, and nothing else stops. Not
//! kube-lease-manager (used before): it elects one Lease per manager with
//! no way to give one up for a fair share, and its renewal waited on a
//! frozen API server with no deadline.

use std::collections::HashMap;
use std::hash::Hasher;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use futures::future::BoxFuture;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams, Preconditions};
use siphasher::sip::SipHasher13;
use tracing::{debug, info, warn};

use super::shard::Shards;

/// The label every Lease of one election carries, valued with its name.
pub const LABEL_GROUP: &str = "clusterset-dns.io/lease-group";
/// The label telling a shard's Lease (`shard`) from a replica's (`replica`).
pub const LABEL_ROLE: &str = "clusterset-dns.io/lease-role";
/// The annotation holding the `--shards` of the replica that wrote it.
pub const ANNOTATION_SHARDS: &str = "clusterset-dns.io/shards";

/// Where and how replicas elect.
#[derive(Debug, Clone)]
pub struct ElectionConfig {
    /// The Leases' namespace.
    pub namespace: String,
    /// The Lease name (and the group's).
    pub name: String,
    /// This replica's identity.
    pub identity: String,
    /// How many shards.
    pub shards: u32,
    /// How long a Lease holds without renewal.
    pub duration: Duration,
}

impl ElectionConfig {
    /// Shard `i`'s Lease.
    pub fn shard_lease(&self, i: usize) -> String {
        if self.shards <= 1 { self.name.clone() } else { format!("{}-{i}", self.name) }
    }

    /// This replica's own Lease: the identity hashed, since an identity
    /// (a host name and pid, anything a user gives) need not be a valid
    /// object name.
    pub fn replica_lease(&self) -> String {
        let mut h = SipHasher13::new_with_keys(0, 0);
        h.write(self.identity.as_bytes());
        format!("{}-replica-{:010x}", self.name, h.finish() & 0xff_ffff_ffff)
    }

    /// The time between checks: a fifth of the duration, 1-3 s.
    pub fn period(&self) -> Duration {
        (self.duration / 5).clamp(Duration::from_secs(1), Duration::from_secs(3))
    }

    /// How long one call may take: a renewal that hangs must not hold the
    /// others past the point where the fence closes.
    fn call_deadline(&self) -> Duration {
        (self.duration / 3).clamp(Duration::from_secs(1), Duration::from_secs(5))
    }

    /// A led shard is renewed once its last renewal is this old.
    fn renew_after(&self) -> Duration {
        self.duration / 3
    }

    /// The shard a Lease name is of, if it is one of this election's.
    fn shard_index(&self, lease: &str) -> Option<usize> {
        if lease == self.name {
            return Some(0);
        }
        lease.strip_prefix(&self.name)?.strip_prefix('-')?.parse().ok()
    }
}

/// Why a replica cannot take part.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ElectionError {
    /// Another live replica runs with another `--shards`.
    #[error(
        "--shards {mine}, but replica {holder:?} runs with --shards {theirs} (Lease {lease}): replicas with different --shards would write the same services; run one value (stop the others first)"
    )]
    Mismatch {
        /// Ours.
        mine: u32,
        /// Theirs.
        theirs: u32,
        /// Its identity.
        holder: String,
        /// The Lease that says so.
        lease: String,
    },
}

/// A call to the Leases' API server that failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// Someone else wrote the Lease since it was read (409).
    #[error("changed since read")]
    Conflict,
    /// Not answered within the call deadline.
    #[error("not answered within {0:?}")]
    Timeout(Duration),
    /// The API server refused or could not be reached.
    #[error("{0}")]
    Api(String),
}

/// The Leases' API, behind a trait so the election is tested in process.
pub trait LeaseApi: Send + Sync {
    /// Every Lease labelled with `selector`.
    fn list<'a>(&'a self, selector: &'a str) -> BoxFuture<'a, Result<Vec<Lease>, CallError>>;
    /// Creates `lease`.
    fn create<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<Lease, CallError>>;
    /// Replaces `lease` if its resourceVersion is still the stored one.
    fn replace<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<Lease, CallError>>;
    /// Deletes `name` if its resourceVersion is still `version`.
    fn delete<'a>(&'a self, name: &'a str, version: &'a str) -> BoxFuture<'a, Result<(), CallError>>;
}

/// [`LeaseApi`] on a real API server.
pub struct KubeLeases(Api<Lease>);

impl KubeLeases {
    /// The Leases of `namespace`.
    pub fn new(client: kube::Client, namespace: &str) -> Self {
        Self(Api::namespaced(client, namespace))
    }
}

fn call_error(e: kube::Error) -> CallError {
    match e {
        kube::Error::Api(s) if s.code == 409 => CallError::Conflict,
        e => CallError::Api(e.to_string()),
    }
}

impl LeaseApi for KubeLeases {
    fn list<'a>(&'a self, selector: &'a str) -> BoxFuture<'a, Result<Vec<Lease>, CallError>> {
        Box::pin(async move {
            Ok(self.0.list(&ListParams::default().labels(selector)).await.map_err(call_error)?.items)
        })
    }

    fn create<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<Lease, CallError>> {
        Box::pin(async move { self.0.create(&PostParams::default(), lease).await.map_err(call_error) })
    }

    fn replace<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<Lease, CallError>> {
        Box::pin(async move {
            let name = lease.metadata.name.as_deref().unwrap_or_default();
            self.0.replace(name, &PostParams::default(), lease).await.map_err(call_error)
        })
    }

    fn delete<'a>(&'a self, name: &'a str, version: &'a str) -> BoxFuture<'a, Result<(), CallError>> {
        Box::pin(async move {
            let params = DeleteParams {
                preconditions: Some(Preconditions { resource_version: Some(version.to_owned()), uid: None }),
                ..DeleteParams::default()
            };
            self.0.delete(name, &params).await.map(|_| ()).map_err(call_error)
        })
    }
}

/// What this replica knows of the election, for `/ready` and the log.
#[derive(Debug, Default)]
pub struct ElectionStatus {
    /// Why the last check failed, while the Leases cannot be read (a
    /// replica that cannot reach them leads nothing).
    unreachable: Mutex<Option<String>>,
}

impl ElectionStatus {
    /// `None` while the Leases' cluster answers; else why not.
    pub fn unreachable(&self) -> Option<String> {
        self.unreachable.lock().map(|u| u.clone()).unwrap_or(None)
    }

    fn set(&self, why: Option<String>) {
        if let Ok(mut u) = self.unreachable.lock() {
            *u = why;
        }
    }
}

/// When a Lease's resourceVersion was first seen: it is expired once seen
/// unchanged for its duration.
struct Seen {
    version: String,
    since: Instant,
}

/// One step of a check, decided from one list ([`Elector::plan`]).
#[derive(Debug, PartialEq)]
enum Step {
    /// Write this replica's own Lease (create when `None`).
    Alive(Option<Lease>),
    /// Shard `i` is led by someone else now, or its fence ran out.
    Lost(usize),
    /// Give shard `i` up: more than a fair share.
    Release(usize, Lease),
    /// Renew shard `i`.
    Renew(usize, Lease),
    /// Take shard `i` (its Lease created when it has none yet).
    Take(usize, Lease),
    /// Delete a replica Lease long expired (its replica is gone).
    Collect(String, String),
}

/// One replica's side of the election.
pub struct Elector {
    cfg: ElectionConfig,
    api: Arc<dyn LeaseApi>,
    shards: Arc<Shards>,
    status: Arc<ElectionStatus>,
    seen: HashMap<String, Seen>,
    /// Per shard: when this replica last renewed it.
    renewed: Vec<Option<Instant>>,
    /// When this replica's own Lease was last written.
    alive: Option<Instant>,
}

fn holder(l: &Lease) -> &str {
    l.spec.as_ref().and_then(|s| s.holder_identity.as_deref()).unwrap_or("")
}

fn shards_of(l: &Lease) -> Option<u32> {
    l.metadata.annotations.as_ref()?.get(ANNOTATION_SHARDS)?.parse().ok()
}

fn version(l: &Lease) -> &str {
    l.metadata.resource_version.as_deref().unwrap_or("")
}

fn name(l: &Lease) -> &str {
    l.metadata.name.as_deref().unwrap_or("")
}

impl Elector {
    /// This replica's elector.
    pub fn new(
        cfg: ElectionConfig,
        api: Arc<dyn LeaseApi>,
        shards: Arc<Shards>,
        status: Arc<ElectionStatus>,
    ) -> Self {
        let n = cfg.shards as usize;
        Self { cfg, api, shards, status, seen: HashMap::new(), renewed: vec![None; n], alive: None }
    }

    /// Checks every period until an error ends it (another `--shards`).
    pub async fn run(&mut self) -> ElectionError {
        loop {
            if let Err(e) = self.check(Instant::now()).await {
                return e;
            }
            tokio::time::sleep(self.cfg.period()).await;
        }
    }

    /// Gives up every shard led (their Leases emptied, so another replica
    /// takes them at once) and this replica's own Lease.
    pub async fn release(&mut self) {
        let deadline = self.cfg.call_deadline();
        let Ok(Ok(listed)) = tokio::time::timeout(deadline, self.api.list(&self.selector())).await else {
            return;
        };
        for l in listed {
            let mine = holder(&l) == self.cfg.identity;
            if let Some(i) = self.cfg.shard_index(name(&l)).filter(|_| role(&l) == Some("shard")) {
                self.shards.set_led(i, false);
                if mine && tokio::time::timeout(deadline, self.api.replace(&self.released(l))).await.is_ok() {
                    info!(shard = i, "released the Lease");
                }
            } else if mine {
                let _ = tokio::time::timeout(deadline, self.api.delete(name(&l), version(&l))).await;
            }
        }
    }

    fn selector(&self) -> String {
        format!("{LABEL_GROUP}={}", self.cfg.name)
    }

    /// One check: list, decide, write.
    async fn check(&mut self, now: Instant) -> Result<(), ElectionError> {
        let deadline = self.cfg.call_deadline();
        let listed = match tokio::time::timeout(deadline, self.api.list(&self.selector())).await {
            Ok(Ok(l)) => l,
            Ok(Err(e)) => {
                self.unreachable(&e.to_string());
                return Ok(());
            }
            Err(_) => {
                self.unreachable(&CallError::Timeout(deadline).to_string());
                return Ok(());
            }
        };
        if self.status.unreachable().is_some() {
            info!("the Leases' cluster answers again");
            self.status.set(None);
        }
        for step in self.plan(&listed, now)? {
            self.apply(step).await;
        }
        Ok(())
    }

    /// The Leases cannot be read: nothing is taken; led shards keep writing
    /// until their fences run out, then are lost.
    fn unreachable(&mut self, why: &str) {
        if self.status.unreachable().is_none() {
            warn!(error = %why, "cannot read the Leases: taking no shard; led ones stop writing when their Leases run out");
        }
        self.status.set(Some(why.to_owned()));
        for i in 0..self.cfg.shards as usize {
            if self.shards.leads(i) && !self.shards.fence(i).may_write() {
                warn!(shard = i, "shard's Lease ran out unrenewed: stopped writing it");
                self.shards.set_led(i, false);
            }
        }
    }

    /// What to do, from one list at `now`.
    fn plan(&mut self, listed: &[Lease], now: Instant) -> Result<Vec<Step>, ElectionError> {
        let n = self.cfg.shards as usize;
        let me = self.cfg.identity.clone();
        // Versions first seen now start their clock; Leases gone are forgotten.
        self.seen.retain(|k, _| listed.iter().any(|l| name(l) == k));
        for l in listed {
            let v = version(l);
            match self.seen.get(name(l)) {
                Some(s) if s.version == v => {}
                _ => {
                    self.seen.insert(name(l).to_owned(), Seen { version: v.to_owned(), since: now });
                }
            }
        }
        let expired = |l: &Lease| -> bool {
            let secs = l.spec.as_ref().and_then(|s| s.lease_duration_seconds).unwrap_or(0);
            let duration = Duration::from_secs(u64::try_from(secs).unwrap_or(0));
            holder(l).is_empty()
                || self.seen.get(name(l)).is_none_or(|s| now.duration_since(s.since) >= duration)
        };
        let mut shard_leases: Vec<Option<&Lease>> = vec![None; n];
        let mut replicas = 1; // this one
        let mut steps = Vec::new();
        let mine = self.cfg.replica_lease();
        let mut own = None;
        for l in listed {
            let live = !expired(l);
            match role(l) {
                Some("replica") if name(l) == mine => own = Some(l),
                Some("replica") => {
                    let theirs = shards_of(l);
                    if live && theirs.is_some_and(|t| t != self.cfg.shards) {
                        self.mismatch(l, theirs.unwrap_or(0))?;
                    } else if live && theirs == Some(self.cfg.shards) {
                        replicas += 1;
                    } else if !live
                        && self
                            .seen
                            .get(name(l))
                            .is_some_and(|s| now.duration_since(s.since) >= self.cfg.duration * 4)
                    {
                        steps.push(Step::Collect(name(l).to_owned(), version(l).to_owned()));
                    }
                }
                Some("shard") => match self.cfg.shard_index(name(l)) {
                    // Another --shards' Lease, still held: it runs.
                    _ if live && holder(l) != me && shards_of(l).is_some_and(|t| t != self.cfg.shards) => {
                        self.mismatch(l, shards_of(l).unwrap_or(0))?;
                    }
                    Some(i) if i < n && shards_of(l).is_none_or(|t| t == self.cfg.shards) => {
                        shard_leases[i] = Some(l);
                    }
                    _ => {}
                },
                _ => {}
            }
        }
        if self.alive.is_none_or(|t| now.duration_since(t) >= self.cfg.renew_after()) || own.is_none() {
            steps.insert(0, Step::Alive(own.cloned()));
        }
        let share = n.div_ceil(replicas);
        let mut led: Vec<usize> = (0..n).filter(|i| self.shards.leads(*i)).collect();
        // Lost: someone else holds it, its Lease is gone, or it ran out.
        led.retain(|&i| {
            let ours = shard_leases[i].is_some_and(|l| holder(l) == me);
            if !ours || !self.shards.fence(i).may_write() {
                steps.push(Step::Lost(i));
                return false;
            }
            true
        });
        // Above the fair share: the highest shards go.
        while led.len() > share {
            let Some(i) = led.pop() else { break };
            if let Some(l) = shard_leases[i] {
                steps.push(Step::Release(i, self.released(l.clone())));
            }
        }
        for &i in &led {
            if self.renewed[i].is_none_or(|t| now.duration_since(t) >= self.cfg.renew_after())
                && let Some(l) = shard_leases[i]
            {
                steps.push(Step::Renew(i, self.held(Some(l.clone()), i, false)));
            }
        }
        // Under the share: take what nobody holds, starting at a place of
        // this replica's own, so that replicas starting together try
        // different shards first.
        let start = {
            let mut h = SipHasher13::new_with_keys(0, 0);
            h.write(me.as_bytes());
            (h.finish() % n as u64) as usize
        };
        let mut count = led.len();
        for k in 0..n {
            let i = (start + k) % n;
            if count >= share {
                break;
            }
            if led.contains(&i) {
                continue;
            }
            match shard_leases[i] {
                None => steps.push(Step::Take(i, self.held(None, i, true))),
                Some(l) if expired(l) || holder(l) == me => {
                    steps.push(Step::Take(i, self.held(Some(l.clone()), i, true)));
                }
                Some(_) => continue,
            }
            count += 1;
        }
        Ok(steps)
    }

    fn mismatch(&self, l: &Lease, theirs: u32) -> Result<(), ElectionError> {
        let e = ElectionError::Mismatch {
            mine: self.cfg.shards,
            theirs,
            holder: holder(l).to_owned(),
            lease: format!("{}/{}", self.cfg.namespace, name(l)),
        };
        if self.shards.led_count() > 0 {
            // We ran first: the newcomer refuses; say so, lead on.
            warn!(error = %e, "a replica with other --shards is starting; it will refuse");
            return Ok(());
        }
        Err(e)
    }

    /// The Lease of shard `i` held by this replica from now (`taken`: a
    /// new holder, counted as a transition).
    fn held(&self, lease: Option<Lease>, i: usize, taken: bool) -> Lease {
        let now = MicroTime(Timestamp::now());
        let mut l = lease.unwrap_or_else(|| self.new_lease(&self.cfg.shard_lease(i), "shard"));
        let spec = l.spec.get_or_insert_with(LeaseSpec::default);
        if taken {
            let changed =
                spec.holder_identity.as_deref().is_some_and(|h| !h.is_empty() && h != self.cfg.identity);
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + i32::from(changed));
            spec.acquire_time = Some(now.clone());
        }
        spec.holder_identity = Some(self.cfg.identity.clone());
        spec.lease_duration_seconds = Some(i32::try_from(self.cfg.duration.as_secs()).unwrap_or(i32::MAX));
        spec.renew_time = Some(now);
        annotate(&mut l.metadata, self.cfg.shards);
        l
    }

    /// `lease` given up: no holder, so another replica takes it at once.
    fn released(&self, mut l: Lease) -> Lease {
        let spec = l.spec.get_or_insert_with(LeaseSpec::default);
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        l
    }

    fn new_lease(&self, lease: &str, role: &str) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(lease.to_owned()),
                namespace: Some(self.cfg.namespace.clone()),
                labels: Some(
                    [
                        (LABEL_GROUP.to_owned(), self.cfg.name.clone()),
                        (LABEL_ROLE.to_owned(), role.to_owned()),
                    ]
                    .into(),
                ),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec::default()),
        }
    }

    /// Carries out one step; what fails is tried again next check.
    async fn apply(&mut self, step: Step) {
        let deadline = self.cfg.call_deadline();
        match step {
            Step::Alive(own) => {
                let fresh = own.is_none();
                let mut l = own.unwrap_or_else(|| self.new_lease(&self.cfg.replica_lease(), "replica"));
                let spec = l.spec.get_or_insert_with(LeaseSpec::default);
                spec.holder_identity = Some(self.cfg.identity.clone());
                spec.lease_duration_seconds =
                    Some(i32::try_from(self.cfg.duration.as_secs()).unwrap_or(i32::MAX));
                spec.renew_time = Some(MicroTime(Timestamp::now()));
                annotate(&mut l.metadata, self.cfg.shards);
                let sent = Instant::now();
                let r = if fresh {
                    timed(deadline, self.api.create(&l)).await
                } else {
                    timed(deadline, self.api.replace(&l)).await
                };
                match r {
                    Ok(_) => self.alive = Some(sent),
                    Err(e) => debug!(error = %e, "cannot write this replica's Lease"),
                }
            }
            Step::Lost(i) => {
                warn!(shard = i, shards = self.cfg.shards, "lost the shard's Lease: stopped writing it");
                self.shards.set_led(i, false);
                self.renewed[i] = None;
            }
            Step::Release(i, l) => {
                // Stop writing first: the next holder may start at once.
                self.shards.set_led(i, false);
                self.renewed[i] = None;
                match timed(deadline, self.api.replace(&l)).await {
                    Ok(_) => info!(shard = i, "released the shard to a waiting replica (fair share)"),
                    Err(e) => warn!(shard = i, error = %e, "releasing the shard failed; it runs out instead"),
                }
            }
            // A Lease never stored has no resourceVersion: created.
            Step::Renew(i, l) | Step::Take(i, l) => {
                let taking = !self.shards.leads(i);
                let (sent, wall) = (Instant::now(), SystemTime::now());
                let r = if l.metadata.resource_version.is_some() {
                    timed(deadline, self.api.replace(&l)).await
                } else {
                    timed(deadline, self.api.create(&l)).await
                };
                match r {
                    Ok(_) => {
                        self.renewed[i] = Some(sent);
                        self.shards.fence(i).held(wall, self.cfg.duration);
                        if taking {
                            info!(shard = i, shards = self.cfg.shards, lease = %self.cfg.shard_lease(i), "leading the shard");
                            self.shards.set_led(i, true);
                        }
                    }
                    Err(CallError::Conflict) => debug!(shard = i, "the shard's Lease changed meanwhile"),
                    Err(e) => debug!(shard = i, error = %e, "cannot write the shard's Lease"),
                }
            }
            Step::Collect(lease, version) => {
                if tokio::time::timeout(deadline, self.api.delete(&lease, &version)).await.is_ok() {
                    info!(lease = %lease, "deleted the Lease of a replica gone long ago");
                }
            }
        }
    }
}

/// `call`, or a timeout error once `deadline` has passed.
async fn timed<T>(deadline: Duration, call: BoxFuture<'_, Result<T, CallError>>) -> Result<T, CallError> {
    tokio::time::timeout(deadline, call).await.unwrap_or(Err(CallError::Timeout(deadline)))
}

fn role(l: &Lease) -> Option<&str> {
    l.metadata.labels.as_ref()?.get(LABEL_ROLE).map(String::as_str)
}

fn annotate(meta: &mut ObjectMeta, shards: u32) {
    meta.annotations.get_or_insert_default().insert(ANNOTATION_SHARDS.to_owned(), shards.to_string());
}

#[cfg(test)]
pub mod fake {
    //! Leases in memory, with resourceVersions as an API server keeps them.

    use super::*;

    /// The fake.
    #[derive(Default)]
    pub struct FakeLeases {
        stored: Mutex<(u64, HashMap<String, Lease>)>,
        /// Leases whose writes are refused (as by an admission webhook, or
        /// RBAC on one name).
        pub refused: Mutex<Vec<String>>,
    }

    impl FakeLeases {
        fn refuses(&self, lease: &Lease) -> bool {
            self.refused.lock().unwrap().iter().any(|r| r == name(lease))
        }
    }

    impl FakeLeases {
        /// The stored Lease `name`.
        pub fn get(&self, name: &str) -> Option<Lease> {
            self.stored.lock().unwrap().1.get(name).cloned()
        }

        /// Who holds `name`.
        pub fn holder(&self, name: &str) -> String {
            self.get(name).map(|l| super::holder(&l).to_owned()).unwrap_or_default()
        }
    }

    impl LeaseApi for FakeLeases {
        fn list<'a>(&'a self, selector: &'a str) -> BoxFuture<'a, Result<Vec<Lease>, CallError>> {
            let (k, v) = selector.split_once('=').unwrap();
            let items = self
                .stored
                .lock()
                .unwrap()
                .1
                .values()
                .filter(|l| l.metadata.labels.as_ref().and_then(|m| m.get(k)).is_some_and(|x| x == v))
                .cloned()
                .collect();
            Box::pin(async move { Ok(items) })
        }

        fn create<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<Lease, CallError>> {
            let mut s = self.stored.lock().unwrap();
            let r = if s.1.contains_key(name(lease)) {
                Err(CallError::Conflict)
            } else {
                s.0 += 1;
                let mut l = lease.clone();
                l.metadata.resource_version = Some(s.0.to_string());
                s.1.insert(name(lease).to_owned(), l.clone());
                Ok(l)
            };
            Box::pin(async move { r })
        }

        fn replace<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<Lease, CallError>> {
            if self.refuses(lease) {
                return Box::pin(async { Err(CallError::Api("refused".into())) });
            }
            let mut s = self.stored.lock().unwrap();
            let r = match s.1.get(name(lease)) {
                Some(old) if old.metadata.resource_version == lease.metadata.resource_version => {
                    s.0 += 1;
                    let mut l = lease.clone();
                    l.metadata.resource_version = Some(s.0.to_string());
                    s.1.insert(name(lease).to_owned(), l.clone());
                    Ok(l)
                }
                _ => Err(CallError::Conflict),
            };
            Box::pin(async move { r })
        }

        fn delete<'a>(&'a self, lease: &'a str, version: &'a str) -> BoxFuture<'a, Result<(), CallError>> {
            let mut s = self.stored.lock().unwrap();
            let r = match s.1.get(lease) {
                Some(old) if old.metadata.resource_version.as_deref() == Some(version) => {
                    s.1.remove(lease);
                    Ok(())
                }
                _ => Err(CallError::Conflict),
            };
            Box::pin(async move { r })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fake::FakeLeases;
    use super::*;

    fn elector(api: &Arc<FakeLeases>, id: &str, shards: u32) -> Elector {
        let cfg = ElectionConfig {
            namespace: "ns".into(),
            name: "sync".into(),
            identity: id.into(),
            shards,
            duration: Duration::from_secs(15),
        };
        Elector::new(cfg, api.clone(), Shards::elected(shards), Arc::default())
    }

    fn led(e: &Elector) -> Vec<usize> {
        (0..e.cfg.shards as usize).filter(|i| e.shards.leads(*i)).collect()
    }

    #[tokio::test]
    async fn one_replica_leads_every_shard_and_a_second_takes_half() {
        let api = Arc::new(FakeLeases::default());
        let mut a = elector(&api, "a", 4);
        let t0 = Instant::now();
        a.check(t0).await.unwrap();
        assert_eq!(led(&a), vec![0, 1, 2, 3]);
        assert!((0..4).all(|i| a.shards.fence(i).may_write()));
        assert_eq!(api.holder("sync-2"), "a");
        // B arrives: it sees every shard held (and A alive), takes nothing.
        let mut b = elector(&api, "b", 4);
        b.check(t0).await.unwrap();
        assert_eq!(led(&b), Vec::<usize>::new());
        // A sees B waiting: keeps its fair share (2), releases the rest.
        a.check(t0 + Duration::from_secs(3)).await.unwrap();
        assert_eq!(led(&a), vec![0, 1]);
        assert!(!a.shards.fence(3).may_write(), "a released shard is fenced at once");
        assert_eq!(api.holder("sync-3"), "");
        // B takes the released ones at once: no wait for an expiry.
        b.check(t0 + Duration::from_secs(3)).await.unwrap();
        assert_eq!(led(&b), vec![2, 3]);
        // Stable from then on.
        for k in 2..6 {
            let t = t0 + Duration::from_secs(3 * k);
            a.check(t).await.unwrap();
            b.check(t).await.unwrap();
        }
        assert_eq!((led(&a), led(&b)), (vec![0, 1], vec![2, 3]));
    }

    #[tokio::test]
    async fn a_dead_replicas_shards_are_taken_once_seen_unchanged_for_the_duration() {
        let api = Arc::new(FakeLeases::default());
        let (mut a, mut b) = (elector(&api, "a", 4), elector(&api, "b", 4));
        let t0 = Instant::now();
        a.check(t0).await.unwrap();
        b.check(t0).await.unwrap();
        a.check(t0).await.unwrap();
        b.check(t0).await.unwrap();
        assert_eq!(led(&a).len() + led(&b).len(), 4);
        // A dies (no more checks). B waits out A's Leases on its own clock.
        b.check(t0 + Duration::from_secs(14)).await.unwrap();
        assert_eq!(led(&b).len(), 2, "not yet expired");
        b.check(t0 + Duration::from_secs(15)).await.unwrap();
        b.check(t0 + Duration::from_secs(16)).await.unwrap();
        assert_eq!(led(&b), vec![0, 1, 2, 3]);
    }

    #[tokio::test]
    async fn another_shards_value_is_refused_naming_both() {
        let api = Arc::new(FakeLeases::default());
        let mut a = elector(&api, "a", 4);
        let t0 = Instant::now();
        a.check(t0).await.unwrap();
        let mut b = elector(&api, "b", 2);
        let e = b.check(t0).await.unwrap_err();
        assert!(matches!(e, ElectionError::Mismatch { mine: 2, theirs: 4, .. }), "{e}");
        assert!(e.to_string().contains("--shards 2, but replica \"a\" runs with --shards 4"), "{e}");
        assert_eq!(led(&b), Vec::<usize>::new(), "nothing taken");
        // The one that ran first leads on.
        a.check(t0 + Duration::from_secs(3)).await.unwrap();
        assert_eq!(led(&a).len(), 4);
    }

    #[tokio::test]
    async fn a_shard_taken_by_another_is_lost_and_fenced() {
        let api = Arc::new(FakeLeases::default());
        let mut a = elector(&api, "a", 1);
        let t0 = Instant::now();
        a.check(t0).await.unwrap();
        assert_eq!(led(&a), vec![0]);
        // Someone else writes the Lease (a replica that judged it expired).
        let mut l = api.get("sync").unwrap();
        l.spec.as_mut().unwrap().holder_identity = Some("z".into());
        api.replace(&l).await.unwrap();
        a.check(t0 + Duration::from_secs(1)).await.unwrap();
        assert_eq!(led(&a), Vec::<usize>::new());
        assert!(!a.shards.fence(0).may_write());
    }

    #[tokio::test]
    async fn a_shard_lease_that_cannot_be_renewed_stops_that_shard_only() {
        let api = Arc::new(FakeLeases::default());
        let mut a = elector(&api, "a", 3);
        // A short lease (fences open 2.5 s after a renewal, renewals due
        // after 1 s), so that one runs out within the test.
        a.cfg.duration = Duration::from_secs(3);
        a.check(Instant::now()).await.unwrap();
        assert_eq!(led(&a), vec![0, 1, 2]);
        api.refused.lock().unwrap().push("sync-1".into());
        tokio::time::sleep(Duration::from_millis(1100)).await;
        // Shards 0 and 2 renewed; 1 refused, its fence still open.
        a.check(Instant::now()).await.unwrap();
        assert_eq!(led(&a), vec![0, 1, 2]);
        tokio::time::sleep(Duration::from_millis(1500)).await;
        // Past shard 1's Lease: it stops; the others write on.
        assert!(!a.shards.fence(1).may_write(), "shard 1 kept writing past its Lease");
        a.check(Instant::now()).await.unwrap();
        assert_eq!(led(&a), vec![0, 2], "only the shard that could not be renewed is given up");
        assert!(a.shards.fence(0).may_write() && a.shards.fence(2).may_write());
    }

    #[tokio::test]
    async fn released_leases_are_taken_at_once() {
        let api = Arc::new(FakeLeases::default());
        let (mut a, mut b) = (elector(&api, "a", 2), elector(&api, "b", 2));
        let t0 = Instant::now();
        a.check(t0).await.unwrap();
        b.check(t0).await.unwrap();
        a.release().await;
        assert_eq!(led(&a), Vec::<usize>::new());
        assert!(api.get(&a.cfg.replica_lease()).is_none(), "its own Lease deleted");
        b.check(t0 + Duration::from_secs(1)).await.unwrap();
        assert_eq!(led(&b), vec![0, 1]);
    }
}
