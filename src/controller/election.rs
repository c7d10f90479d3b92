//! Which replica leads which shard, on coordination.k8s.io Leases, and the
//! one rule that keeps two replicas from writing a shard at once.
//!
//! Shard `i` of `N` has the Lease `<name>-i` (`<name>` itself when `N` is
//! 1); every replica also keeps a Lease of its own,
//! `<name>-replica-<hash of its identity>`, that says it is alive. All are
//! labelled with the group (`clusterset-dns.io/lease-group: <name>`) and
//! carry the replica's `--shards` in an annotation, so one list per check
//! shows the whole election, whatever `N`.
//!
//! Every check (a fifth of the lease duration, 1-3 s) a replica: counts the
//! live replicas `R` and takes `ceil(N / R)` as its fair share; gives up
//! shards above its share (another replica is waiting); renews the shards
//! it leads; takes shards it may take while under its share. The writes of
//! one check go out together, each with its own deadline, so one slow
//! renewal delays no other. The elector runs on a thread and runtime of its
//! own ([`spawn`]): no reconcile, member join or discovery of the
//! controller can delay a renewal.
//!
//! # Tenure
//!
//! A replica writes a shard only while it holds the shard's tenure, and a
//! tenure ends before another replica's may begin:
//!
//! - **The holder** may write until the instant it *sent* its last
//!   successful write of the Lease, plus its lease duration, less
//!   [`MARGIN`], on its own monotonic clock (the shard's [`Fence`](crate::k8s::fence::Fence)); and not
//!   at all from the moment it sees the Lease written by anyone else, or
//!   gone.
//! - **Another replica** may take the Lease only once it has seen the
//!   Lease's version unchanged for the longer of the Lease's
//!   `leaseDurationSeconds` and its own `--lease-duration`, counted on its
//!   own monotonic clock from when that version reached it; at once when
//!   the holder released it (no holder, and [`ANNOTATION_RELEASED`]: the
//!   holder closed its fence before writing that); and a Lease that is
//!   missing only once it has been missing that long, unless no other
//!   replica is alive.
//!
//! The holder's write was sent before the API server stored it, and any
//! other replica saw the stored version after that, so the other's wait
//! starts after the holder's tenure starts, and is no shorter. Only
//! durations are compared, each measured on one machine's monotonic clock
//! (client-go's leader election judges expiry the same way): a step of a
//! wall clock moves nothing (`renewTime` is written for people reading the
//! Lease). Writes of a Lease carry the resourceVersion read, so of two
//! replicas taking one, exactly one succeeds. Each write request of a
//! shard is checked against its fence at the wire (`k8s::fence`), after the
//! client's rate limit: a write queued while the tenure held is not sent
//! after it.
//!
//! What no clock inside a machine sees: a VM paused with its clocks held
//! still (QEMU/KVM keep a guest's kvmclock still across a pause), or a host
//! suspended (the monotonic clock does not count suspend). Such a replica
//! wakes believing its tenure still runs; the Kubernetes API has no fencing
//! token to refuse its writes. client-go's leader election has the same
//! limit. Nor can a check at the sender recall bytes already sent: a write
//! sent in time to an API server that is then frozen waits in its socket
//! and is read after the thaw, perhaps after another replica's takeover
//! (once in the 30-minute fault run, BENCHMARKS.md, "Tenure"). Only a
//! precondition the API server checks (the resourceVersion a write was
//! derived from) would refuse it; server-side apply without one does not.
//!
//! Not kube-lease-manager (used before): it elects one Lease per manager
//! with no way to give one up for a fair share, and its renewal waited on a
//! frozen API server with no deadline.

use std::collections::HashMap;
use std::hash::Hasher;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::future::{BoxFuture, join_all};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::ObjectMeta;
use siphasher::sip::SipHasher13;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::shard::Shards;
pub use crate::k8s::fence::MARGIN;

mod leases;
mod running;
mod status;

#[cfg(test)]
pub mod fake;
#[cfg(test)]
mod tests;

pub use leases::{CallError, KubeLeases, LeaseApi};
pub use running::{Connect, Running, connect_leases, spawn};
pub use status::{Anomaly, ElectionStatus};

/// The label every Lease of one election carries, valued with its name.
pub const LABEL_GROUP: &str = "clusterset-dns.io/lease-group";
/// The label telling a shard's Lease (`shard`) from a replica's (`replica`).
pub const LABEL_ROLE: &str = "clusterset-dns.io/lease-role";
/// The annotation holding the `--shards` of the replica that wrote it.
pub const ANNOTATION_SHARDS: &str = "clusterset-dns.io/shards";
/// The annotation a holder sets, with its identity, when it gives a shard
/// up: its fence is closed, so another replica may take the shard at once.
/// A Lease emptied by anyone else (by hand) is waited out like any other.
pub const ANNOTATION_RELEASED: &str = "clusterset-dns.io/released-by";

/// A step of the wall clock larger than this between two checks is named
/// in the log (it moves no tenure).
const CLOCK_STEP: Duration = Duration::from_secs(1);

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
    /// next check past the point where the fence closes.
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
    /// The Leases' cluster could not be connected to at all.
    #[error("the Leases' cluster: {0}")]
    Connect(String),
}
/// When a Lease's version first reached this replica: it may be taken once
/// seen unchanged long enough.
#[derive(Debug)]
struct FirstSeen {
    version: String,
    at: Instant,
}

/// What this replica wrote of one Lease, to tell its own writes from
/// anyone else's: the version its last answered write gave, and a write
/// whose answer was lost (it may have landed), by the `renewTime` it wrote
/// and when it was sent.
#[derive(Debug, Clone, Default)]
struct Sent {
    confirmed: Option<String>,
    unanswered: Option<(MicroTime, Instant)>,
}

/// Why a led shard is given up.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Loss {
    /// Its Lease ran out unrenewed (its fence closed).
    RanOut,
    /// Another replica holds it now.
    Taken(String),
    /// Someone else wrote it while this replica held it.
    Overwritten,
    /// Its Lease is gone.
    Deleted,
}

/// One step of a check, decided from one list ([`Elector::decide`]).
#[derive(Debug, PartialEq)]
enum Step {
    /// Write this replica's own Lease (create when `None`).
    Alive(Option<Lease>),
    /// Shard `i` is given up at once (nothing written).
    Lost(usize, Loss),
    /// Give shard `i` up: more than a fair share.
    Release(usize, Lease),
    /// Renew shard `i`.
    Renew(usize, Lease),
    /// Take shard `i` (its Lease created when it has none yet).
    Take(usize, Lease),
    /// Delete a replica Lease long expired (its replica is gone).
    Collect(String, String),
}

/// A clock of wall time, for the `renewTime` written and for naming steps
/// of it; the tenure never reads it. A function so tests can step it.
pub type WallClock = Arc<dyn Fn() -> SystemTime + Send + Sync>;

/// One replica's side of the election.
pub struct Elector {
    cfg: ElectionConfig,
    api: Arc<dyn LeaseApi>,
    shards: Arc<Shards>,
    status: Arc<ElectionStatus>,
    wall: WallClock,
    seen: HashMap<String, FirstSeen>,
    /// Per shard: since when its Lease has been missing, as seen here.
    missing: Vec<Option<Instant>>,
    /// Per Lease name: the last write this replica sent of it.
    sent: HashMap<String, Sent>,
    /// Per shard: when this replica last renewed it.
    renewed: Vec<Option<Instant>>,
    /// When this replica's own Lease was last written.
    alive: Option<Instant>,
    /// The clocks at the last check, to name a step of the wall clock.
    last_check: Option<(Instant, SystemTime)>,
}

fn holder(l: &Lease) -> &str {
    l.spec.as_ref().and_then(|s| s.holder_identity.as_deref()).unwrap_or("")
}

fn shards_of(l: &Lease) -> Option<u32> {
    l.metadata.annotations.as_ref()?.get(ANNOTATION_SHARDS)?.parse().ok()
}

fn released(l: &Lease) -> bool {
    holder(l).is_empty()
        && l.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(ANNOTATION_RELEASED))
}

fn version(l: &Lease) -> &str {
    l.metadata.resource_version.as_deref().unwrap_or("")
}

fn name(l: &Lease) -> &str {
    l.metadata.name.as_deref().unwrap_or("")
}

fn lease_duration(l: &Lease) -> Duration {
    let secs = l.spec.as_ref().and_then(|s| s.lease_duration_seconds).unwrap_or(0);
    Duration::from_secs(u64::try_from(secs).unwrap_or(0))
}

fn renew_time(l: &Lease) -> Option<&MicroTime> {
    l.spec.as_ref()?.renew_time.as_ref()
}

/// Now on `wall`, to the microsecond: the precision a MicroTime keeps
/// through the API server, so a `renewTime` this replica wrote compares
/// equal when it reads it back.
fn micro_now(wall: &WallClock) -> MicroTime {
    let t = Timestamp::try_from(wall()).unwrap_or(Timestamp::UNIX_EPOCH);
    MicroTime(Timestamp::from_microsecond(t.as_microsecond()).unwrap_or(t))
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
        Self {
            cfg,
            api,
            shards,
            status,
            wall: Arc::new(SystemTime::now),
            seen: HashMap::new(),
            missing: vec![None; n],
            sent: HashMap::new(),
            renewed: vec![None; n],
            alive: None,
            last_check: None,
        }
    }

    /// The same elector, reading wall time from `wall` (tests step it).
    pub fn with_wall_clock(mut self, wall: WallClock) -> Self {
        self.wall = wall;
        self
    }

    /// Checks every period until `stop` turns true (or its sender is
    /// dropped), then gives every shard up; ends early only when another
    /// `--shards` refuses this replica.
    pub async fn run(&mut self, mut stop: watch::Receiver<bool>) -> Result<(), ElectionError> {
        while !*stop.borrow_and_update() {
            self.check().await?;
            tokio::select! {
                () = tokio::time::sleep(self.cfg.period()) => {}
                changed = stop.changed() => if changed.is_err() { break },
            }
        }
        self.release().await;
        Ok(())
    }

    /// Gives up every shard led (each fence closed first, then its Lease
    /// released, so another replica takes it at once) and deletes this
    /// replica's own Lease.
    pub async fn release(&mut self) {
        for i in 0..self.cfg.shards as usize {
            self.shards.set_led(i, false);
        }
        let deadline = self.cfg.call_deadline();
        let Ok(Ok(listed)) = tokio::time::timeout(deadline, self.api.list(&self.selector())).await else {
            return;
        };
        let (api, me) = (&*self.api, &*self);
        let writes = listed.into_iter().filter(|l| holder(l) == me.cfg.identity).map(|l| async move {
            match me.cfg.shard_index(name(&l)).filter(|_| role(&l) == Some("shard")) {
                Some(i) => {
                    if timed(deadline, api.replace(&me.released(l))).await.is_ok() {
                        info!(shard = i, "released the shard's Lease");
                    }
                }
                None => {
                    let _ = timed(deadline, api.delete(name(&l), version(&l))).await;
                }
            }
        });
        join_all(writes).await;
    }

    fn selector(&self) -> String {
        format!("{LABEL_GROUP}={}", self.cfg.name)
    }

    /// One check: list, decide, write.
    async fn check(&mut self) -> Result<(), ElectionError> {
        let deadline = self.cfg.call_deadline();
        let listed = match timed(deadline, self.api.list(&self.selector())).await {
            Ok(l) => l,
            Err(e) => {
                self.unreachable(&e.to_string());
                return Ok(());
            }
        };
        // The list's versions reached this replica now, not when it asked:
        // a wait counted from the asking could start before a renewal the
        // list already holds was sent.
        let now = Instant::now();
        self.status.checked();
        self.note_clock(now);
        if self.status.unreachable().is_some() {
            info!("the Leases' cluster answers again");
            self.status.set(None);
        }
        let steps = self.decide(&listed, now)?;
        self.apply(steps).await;
        Ok(())
    }

    /// Names a step of the wall clock since the last check: the tenure is
    /// kept on the monotonic clock and does not move with it.
    fn note_clock(&mut self, now: Instant) {
        let wall = (self.wall)();
        if let Some((then, wall_then)) = self.last_check {
            let monotonic = now.duration_since(then).as_secs_f64();
            let walked = match wall.duration_since(wall_then) {
                Ok(d) => d.as_secs_f64(),
                Err(e) => -e.duration().as_secs_f64(),
            };
            let step = walked - monotonic;
            if step.abs() > CLOCK_STEP.as_secs_f64() {
                warn!(
                    step_seconds = step,
                    "the wall clock stepped: tenure is kept on the monotonic clock and does not move; the renewTime of the Leases jumps with it"
                );
                self.status.count(Anomaly::ClockStep);
            }
        }
        self.last_check = Some((now, wall));
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
                self.lose(i, &Loss::RanOut);
            }
        }
    }

    /// True when `l`'s current version is a write this replica sent (its
    /// answer may have been lost on the way).
    fn written_here(&self, l: &Lease) -> bool {
        holder(l) == self.cfg.identity
            && self.sent.get(name(l)).is_some_and(|s| {
                s.confirmed.as_deref() == Some(version(l))
                    || s.unanswered.as_ref().is_some_and(|(t, _)| Some(t) == renew_time(l))
            })
    }

    /// How long `l`'s version must stay unchanged before another replica
    /// may take it: the longer of what its holder wrote and our own.
    fn wait_for(&self, l: &Lease) -> Duration {
        lease_duration(l).max(self.cfg.duration)
    }

    /// True once `l`'s version has been seen unchanged for its wait.
    fn ran_out(&self, l: &Lease, now: Instant) -> bool {
        self.seen.get(name(l)).is_some_and(|s| now.duration_since(s.at) >= self.wait_for(l))
    }

    /// What to do, from one list that arrived at `now`.
    fn decide(&mut self, listed: &[Lease], now: Instant) -> Result<Vec<Step>, ElectionError> {
        let n = self.cfg.shards as usize;
        let me = self.cfg.identity.clone();
        // Versions first seen now start their clock; Leases gone are forgotten.
        self.seen.retain(|k, _| listed.iter().any(|l| name(l) == k));
        for l in listed {
            if self.seen.get(name(l)).is_none_or(|s| s.version != version(l)) {
                self.seen.insert(name(l).to_owned(), FirstSeen { version: version(l).to_owned(), at: now });
            }
        }
        let mut shard_leases: Vec<Option<&Lease>> = vec![None; n];
        let mut replicas = 1; // this one
        let mut steps = Vec::new();
        let mine = self.cfg.replica_lease();
        let mut own = None;
        for l in listed {
            let live = !holder(l).is_empty() && !self.ran_out(l, now);
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
                            .is_some_and(|s| now.duration_since(s.at) >= self.wait_for(l) * 4)
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
        for (i, l) in shard_leases.iter().enumerate() {
            if l.is_some() {
                self.missing[i] = None;
            } else {
                self.missing[i].get_or_insert(now);
            }
        }
        // Nothing of the election but this replica's own Lease: no writer to
        // collide with, so a missing shard Lease is created at once (two
        // creating one: exactly one succeeds).
        let fresh = listed.iter().all(|l| name(l) == mine);
        if self.alive.is_none_or(|t| now.duration_since(t) >= self.cfg.renew_after()) || own.is_none() {
            steps.insert(0, Step::Alive(own.cloned()));
        }
        let share = n.div_ceil(replicas);
        let mut led: Vec<usize> = (0..n).filter(|i| self.shards.leads(*i)).collect();
        let mut lost_answers = Vec::new();
        led.retain(|&i| {
            let loss = match shard_leases[i] {
                None => Some(Loss::Deleted),
                Some(l) if holder(l) != me && self.shards.fence(i).may_write() => Some(Loss::Overwritten),
                Some(l) if holder(l) != me => Some(Loss::Taken(holder(l).to_owned())),
                Some(l) if !self.written_here(l) => Some(Loss::Overwritten),
                // A renewal whose answer was lost, and that landed: the
                // tenure runs from when it was sent.
                Some(l) if !self.shards.fence(i).may_write() => {
                    let landed = self.sent.get(name(l)).and_then(|s| s.unanswered.as_ref());
                    match landed.filter(|(t, _)| Some(t) == renew_time(l)).map(|(_, at)| *at) {
                        Some(at) if now.duration_since(at) < self.cfg.duration.saturating_sub(MARGIN) => {
                            lost_answers.push((i, at));
                            None
                        }
                        _ => Some(Loss::RanOut),
                    }
                }
                Some(_) => None,
            };
            match loss {
                Some(loss) => {
                    steps.push(Step::Lost(i, loss));
                    false
                }
                None => true,
            }
        });
        for (i, at) in lost_answers {
            debug!(
                shard = i,
                "a renewal whose answer was lost landed: the shard's tenure runs from when it was sent"
            );
            self.confirmed(i, at);
        }
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
        // Under the share: take what may be taken, starting at a place of
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
            if led.contains(&i) || steps.iter().any(|s| matches!(s, Step::Lost(j, _) if *j == i)) {
                continue;
            }
            match shard_leases[i] {
                None if fresh
                    || self.missing[i].is_some_and(|t| now.duration_since(t) >= self.cfg.duration) =>
                {
                    steps.push(Step::Take(i, self.held(None, i, true)));
                }
                Some(l) if released(l) || self.written_here(l) || self.ran_out(l, now) => {
                    steps.push(Step::Take(i, self.held(Some(l.clone()), i, true)));
                }
                _ => continue,
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
        self.status.count(Anomaly::OtherShards);
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
        let now = micro_now(&self.wall);
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
        if let Some(a) = l.metadata.annotations.as_mut() {
            a.remove(ANNOTATION_RELEASED);
        }
        l
    }

    /// `lease` given up: no holder, and marked released by this replica,
    /// so another replica takes it at once.
    fn released(&self, mut l: Lease) -> Lease {
        let spec = l.spec.get_or_insert_with(LeaseSpec::default);
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        l.metadata
            .annotations
            .get_or_insert_default()
            .insert(ANNOTATION_RELEASED.to_owned(), self.cfg.identity.clone());
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

    /// This replica's own Lease (`own`, or a new one), renewed now.
    fn alive_lease(&self, own: Option<Lease>) -> Lease {
        let mut l = own.unwrap_or_else(|| self.new_lease(&self.cfg.replica_lease(), "replica"));
        let spec = l.spec.get_or_insert_with(LeaseSpec::default);
        spec.holder_identity = Some(self.cfg.identity.clone());
        spec.lease_duration_seconds = Some(i32::try_from(self.cfg.duration.as_secs()).unwrap_or(i32::MAX));
        spec.renew_time = Some(micro_now(&self.wall));
        annotate(&mut l.metadata, self.cfg.shards);
        l
    }

    /// Gives shard `i` up at once (its fence closed first).
    fn lose(&mut self, i: usize, why: &Loss) {
        self.shards.set_led(i, false);
        self.renewed[i] = None;
        let lease = self.cfg.shard_lease(i);
        match why {
            Loss::RanOut => {
                warn!(shard = i, %lease, "the shard's Lease ran out unrenewed: stopped writing it")
            }
            Loss::Taken(by) => {
                warn!(shard = i, %lease, holder = %by, "lost the shard's Lease to another replica: stopped writing it");
            }
            Loss::Overwritten => {
                self.status.count(Anomaly::Overwritten);
                warn!(shard = i, %lease, "the shard's Lease was written by someone else while this replica held it (edited by hand, or a replica with the same --identity?): stopped writing it");
            }
            Loss::Deleted => {
                self.status.count(Anomaly::Deleted);
                warn!(shard = i, %lease, "the shard's Lease was deleted while this replica held it: stopped writing it; it is taken again once missing for the lease duration");
            }
        }
    }

    /// Carries out one check's steps: the shards given up at once, then
    /// every write together, each under its own deadline.
    async fn apply(&mut self, steps: Vec<Step>) {
        let mut writes = Vec::new();
        for step in steps {
            match step {
                Step::Lost(i, why) => self.lose(i, &why),
                // Stop writing first: the next holder may start at once.
                Step::Release(i, l) => {
                    self.shards.set_led(i, false);
                    self.renewed[i] = None;
                    writes.push(Step::Release(i, l));
                }
                Step::Alive(own) => writes.push(Step::Alive(Some(self.alive_lease(own)))),
                step => writes.push(step),
            }
        }
        let deadline = self.cfg.call_deadline();
        let api = &*self.api;
        let sent = join_all(writes.into_iter().map(|step| async move {
            let at = Instant::now();
            let r = match &step {
                // A Lease never stored has no resourceVersion: created.
                Step::Alive(Some(l)) | Step::Renew(_, l) | Step::Take(_, l)
                    if l.metadata.resource_version.is_none() =>
                {
                    timed(deadline, api.create(l)).await
                }
                Step::Alive(Some(l)) | Step::Release(_, l) | Step::Renew(_, l) | Step::Take(_, l) => {
                    timed(deadline, api.replace(l)).await
                }
                Step::Collect(lease, version) => {
                    timed(deadline, api.delete(lease, version)).await.map(|()| Lease::default())
                }
                Step::Alive(None) | Step::Lost(..) => Ok(Lease::default()),
            };
            (step, at, r)
        }))
        .await;
        for (step, at, r) in sent {
            self.absorb(step, at, r);
        }
    }

    /// Takes in what one write sent at `at` came to.
    fn absorb(&mut self, step: Step, at: Instant, r: Result<Lease, CallError>) {
        match step {
            Step::Alive(_) => match r {
                Ok(_) => self.alive = Some(at),
                Err(e) => debug!(error = %e, "cannot write this replica's Lease"),
            },
            Step::Release(i, _) => match r {
                Ok(_) => info!(shard = i, "released the shard to a waiting replica (fair share)"),
                Err(e) => warn!(shard = i, error = %e, "releasing the shard failed; it runs out instead"),
            },
            Step::Renew(i, l) | Step::Take(i, l) => {
                // Kept whatever the answer: a write that landed with its
                // answer lost is recognized as ours by its renewTime.
                let sent = self.sent.entry(name(&l).to_owned()).or_default();
                match r {
                    Ok(stored) => {
                        *sent = Sent { confirmed: stored.metadata.resource_version, unanswered: None };
                        self.confirmed(i, at);
                    }
                    Err(CallError::Conflict) => {
                        sent.unanswered = None;
                        debug!(shard = i, "the shard's Lease changed meanwhile");
                    }
                    Err(e) => {
                        // It may have landed: recognized by its renewTime.
                        sent.unanswered = renew_time(&l).cloned().map(|t| (t, at));
                        debug!(shard = i, error = %e, "cannot write the shard's Lease");
                    }
                }
            }
            Step::Collect(lease, _) => {
                if r.is_ok() {
                    info!(lease = %lease, "deleted the Lease of a replica gone long ago");
                }
            }
            Step::Lost(..) => {}
        }
    }

    /// Shard `i`'s Lease is this replica's, by a write sent at `at`.
    fn confirmed(&mut self, i: usize, at: Instant) {
        self.renewed[i] = Some(at);
        self.shards.fence(i).held(at, self.cfg.duration);
        if !self.shards.leads(i) {
            info!(shard = i, shards = self.cfg.shards, lease = %self.cfg.shard_lease(i), "leading the shard");
            self.shards.set_led(i, true);
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
