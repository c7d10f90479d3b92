//! A member's heartbeat on the hub, and its claim on its name.
//!
//! The agent holding the member's tenure renews a Lease ([`LEASE`]) in the
//! member's hub namespace every third of its duration; every other agent
//! judges the member alive by it (seen changing, on its own clock). The
//! Lease carries the member cluster's identity (its `kube-system`
//! namespace's uid): an agent that finds the name held by another cluster,
//! whose heartbeat still changes, refuses to publish (a member name
//! claimed by two clusters would mix their exports), says why on `/ready`,
//! and names both; once the other's heartbeat has stood still for its
//! duration, the name is free again.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{error, info, warn};

use crate::k8s::fence::WriteFence;

/// The heartbeat Lease's name, in each member's hub namespace.
pub const LEASE: &str = "clusterset-dns-agent";
/// The label heartbeat Leases carry, so one list finds every member.
pub const LABEL: &str = "hub.clusterset-dns.io/heartbeat";
/// The annotation naming the member cluster (its `kube-system` uid).
pub const ANNOTATION_CLUSTER: &str = "hub.clusterset-dns.io/cluster-uid";

/// Whether this agent may publish under its member's name. A watch, so
/// the publisher wakes when the name becomes (or stops being) its own: a
/// refused agent that gains the name publishes then, not at its cluster's
/// next change.
#[derive(Debug)]
pub struct Claim {
    state: watch::Sender<ClaimState>,
}

/// What the heartbeat has found of the member name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimState {
    /// Not yet read on the hub: nothing may be published (another cluster
    /// may hold the name).
    Unchecked,
    /// This cluster's: its heartbeat was written.
    Ours,
    /// Another cluster's, and why.
    Refused(String),
}

impl Default for Claim {
    fn default() -> Self {
        Self { state: watch::Sender::new(ClaimState::Unchecked) }
    }
}

impl Claim {
    /// Why the name is not ours, while it is not.
    pub fn refused(&self) -> Option<String> {
        match &*self.state.borrow() {
            ClaimState::Refused(why) => Some(why.clone()),
            _ => None,
        }
    }

    /// Whether the name was found to be ours (what the publisher waits for).
    pub fn ours(&self) -> bool {
        *self.state.borrow() == ClaimState::Ours
    }

    /// Told of every change of the claim from now on.
    pub fn changes(&self) -> watch::Receiver<ClaimState> {
        self.state.subscribe()
    }

    fn set(&self, why: Option<String>) {
        let new = why.map_or(ClaimState::Ours, ClaimState::Refused);
        self.state.send_if_modified(|s| {
            let changed = *s != new;
            *s = new;
            changed
        });
    }
}

/// The heartbeat of one member's agent.
pub struct Heartbeat {
    /// The hub's client (with the write fence at the wire).
    pub hub: kube::Client,
    /// The member's name.
    pub member: String,
    /// The member's hub namespace.
    pub namespace: String,
    /// This replica's identity.
    pub identity: String,
    /// The member cluster's identity.
    pub cluster_uid: String,
    /// How long the heartbeat holds without renewal.
    pub duration: Duration,
    /// The tenure each renewal carries.
    pub fence: WriteFence,
    /// True while this replica holds the tenure.
    pub leading: watch::Receiver<Vec<bool>>,
    /// Whether the name is ours (read by `/ready` and the publisher).
    pub claim: Arc<Claim>,
}

impl Heartbeat {
    /// Renews while this replica leads, until dropped.
    pub async fn run(mut self) {
        let api: Api<Lease> = Api::namespaced(self.hub.clone(), &self.namespace);
        // Another cluster's heartbeat: its version and when first seen.
        let mut theirs: Option<(String, Instant)> = None;
        loop {
            if self.leading.borrow().first().copied().unwrap_or(false) {
                match tokio::time::timeout(self.duration / 3, api.get_opt(LEASE)).await {
                    Ok(Ok(lease)) => self.beat(&api, lease, &mut theirs).await,
                    Ok(Err(e)) => {
                        warn!(namespace = %self.namespace, error = %e, "cannot read the heartbeat on the hub")
                    }
                    Err(_) => {
                        warn!(namespace = %self.namespace, "the hub did not answer the heartbeat's read")
                    }
                }
            }
            tokio::select! {
                () = tokio::time::sleep(self.duration / 3) => {}
                Ok(()) = self.leading.changed() => {}
            }
        }
    }

    async fn beat(&self, api: &Api<Lease>, lease: Option<Lease>, theirs: &mut Option<(String, Instant)>) {
        let owner =
            lease.as_ref().and_then(|l| l.metadata.annotations.as_ref()?.get(ANNOTATION_CLUSTER).cloned());
        if let (Some(l), Some(other)) = (&lease, owner.filter(|o| *o != self.cluster_uid)) {
            let version = l.metadata.resource_version.clone().unwrap_or_default();
            let since = match theirs {
                Some((v, at)) if *v == version => *at,
                _ => {
                    *theirs = Some((version, Instant::now()));
                    Instant::now()
                }
            };
            if since.elapsed() < self.duration {
                let holder = l.spec.as_ref().and_then(|s| s.holder_identity.clone()).unwrap_or_default();
                let why = format!(
                    "member name {} is claimed on the hub by cluster {other} (agent {holder:?}) and by this cluster {} (agent {:?}): publishing nothing until one of them stops",
                    self.member, self.cluster_uid, self.identity
                );
                if self.claim.refused().as_deref() != Some(why.as_str()) {
                    error!("{why}");
                }
                self.claim.set(Some(why));
                return;
            }
            info!(member = %self.member, other = %other, "the other cluster's heartbeat stood still for its duration: claiming the name");
        }
        *theirs = None;
        let mut l = lease.unwrap_or_else(|| Lease {
            metadata: ObjectMeta {
                name: Some(LEASE.into()),
                namespace: Some(self.namespace.clone()),
                labels: Some([(LABEL.to_owned(), "agent".to_owned())].into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec::default()),
        });
        l.metadata
            .annotations
            .get_or_insert_default()
            .insert(ANNOTATION_CLUSTER.into(), self.cluster_uid.clone());
        let spec = l.spec.get_or_insert_with(LeaseSpec::default);
        spec.holder_identity = Some(self.identity.clone());
        spec.lease_duration_seconds = Some(i32::try_from(self.duration.as_secs()).unwrap_or(i32::MAX));
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        let fresh = l.metadata.resource_version.is_none();
        let request = kube::core::Request::new(api.resource_url());
        let Ok(body) = serde_json::to_vec(&l) else { return };
        let built = if fresh {
            request.create(&PostParams::default(), body)
        } else {
            request.replace(LEASE, &PostParams::default(), body)
        };
        let Ok(mut req) = built else { return };
        req.extensions_mut().insert(self.fence.clone());
        match tokio::time::timeout(self.duration / 3, self.hub.request_text(req)).await {
            Ok(Ok(_)) => {
                if self.claim.refused().is_some() {
                    info!(member = %self.member, "the member name is this cluster's on the hub again");
                }
                self.claim.set(None);
            }
            Ok(Err(e)) => {
                warn!(namespace = %self.namespace, error = %e, "cannot renew the heartbeat on the hub")
            }
            Err(_) => warn!(namespace = %self.namespace, "the hub did not answer the heartbeat's renewal"),
        }
    }
}

/// Follows which members are on the hub: the namespaces holding a
/// heartbeat Lease, each a member named by its namespace. Publishes the
/// set (this member's own name left out) whenever it changes; lists again
/// every `every`.
pub async fn members(
    hub: kube::Client,
    me: String,
    every: Duration,
    out: watch::Sender<Option<std::collections::BTreeSet<String>>>,
) {
    let api: Api<Lease> = Api::all(hub);
    let lp = kube::api::ListParams::default().labels(&format!("{LABEL}=agent"));
    loop {
        match tokio::time::timeout(every, api.list(&lp)).await {
            Ok(Ok(list)) => {
                let now: std::collections::BTreeSet<String> = list
                    .items
                    .iter()
                    .filter_map(|l| super::record::member_of(l.metadata.namespace.as_deref()?))
                    .filter(|m| *m != me)
                    .map(str::to_owned)
                    .collect();
                out.send_if_modified(|v| {
                    let changed = v.as_ref() != Some(&now);
                    if changed {
                        info!(members = ?now, "the hub's members");
                        *v = Some(now);
                    }
                    changed
                });
            }
            Ok(Err(e)) => warn!(error = %e, "cannot list the members' heartbeats on the hub"),
            Err(_) => warn!("the hub did not answer the members' list within {every:?}"),
        }
        tokio::time::sleep(every).await;
    }
}

/// How long a heartbeat has stood still, counting only the time it could
/// be read.
#[derive(Debug, Default)]
pub struct Stillness {
    /// The version last read, and since when it stands (pushed forward by
    /// the time the hub did not answer).
    last: Option<(String, Instant)>,
    /// Since when the hub has not answered.
    blind_since: Option<Instant>,
}

impl Stillness {
    /// The hub did not answer at `now`.
    pub fn blind(&mut self, now: Instant) {
        self.blind_since.get_or_insert(now);
    }

    /// `version` read at `now`: how long it has stood still, as seen; on
    /// the first read, `first_estimate`.
    pub fn seen(&mut self, version: String, now: Instant, first_estimate: Duration) -> Duration {
        let blind = self.blind_since.take().map(|b| now.saturating_duration_since(b));
        match &mut self.last {
            Some((old, at)) if *old == version => {
                if let Some(b) = blind {
                    *at += b;
                }
                now.saturating_duration_since(*at)
            }
            None => {
                let since = now.checked_sub(first_estimate).unwrap_or(now);
                self.last = Some((version, since));
                now.saturating_duration_since(since)
            }
            Some(_) => {
                self.last = Some((version, now));
                Duration::ZERO
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_heartbeat_stands_still_only_for_the_time_it_could_be_read() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut still = Stillness::default();
        assert_eq!(still.seen("1".into(), at(0), Duration::ZERO), Duration::ZERO);
        assert_eq!(still.seen("1".into(), at(4), Duration::ZERO), Duration::from_secs(4));
        // The hub silent from 5 s to 65 s: a minute unseen is not a minute still.
        still.blind(at(5));
        still.blind(at(30));
        assert_eq!(still.seen("1".into(), at(65), Duration::ZERO), Duration::from_secs(5));
        // A member that had stopped before the hub went silent stays stopped.
        assert_eq!(still.seen("1".into(), at(80), Duration::ZERO), Duration::from_secs(20));
        still.blind(at(81));
        assert_eq!(still.seen("1".into(), at(200), Duration::ZERO), Duration::from_secs(21));
        // A renewal starts it again.
        assert_eq!(still.seen("2".into(), at(201), Duration::ZERO), Duration::ZERO);
        // Read first long after its last renewal: stale from the start.
        let mut late = Stillness::default();
        assert_eq!(late.seen("7".into(), at(100), Duration::from_secs(40)), Duration::from_secs(40));
        assert_eq!(late.seen("7".into(), at(101), Duration::ZERO), Duration::from_secs(41));
    }

    #[tokio::test]
    async fn the_publisher_is_told_when_the_name_becomes_its_own() {
        let claim = Claim::default();
        assert!(!claim.ours() && claim.refused().is_none(), "unchecked is neither ours nor refused");
        let mut changes = claim.changes();
        claim.set(Some("claimed by cluster a and by this cluster b".into()));
        assert!(changes.has_changed().unwrap());
        changes.borrow_and_update();
        // The same refusal again is no change.
        claim.set(Some("claimed by cluster a and by this cluster b".into()));
        assert!(!changes.has_changed().unwrap());
        claim.set(None);
        tokio::time::timeout(Duration::from_secs(1), changes.changed()).await.unwrap().unwrap();
        assert_eq!(claim.refused(), None);
        assert!(claim.ours());
    }
}
