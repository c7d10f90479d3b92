//! What the answer policies need per service, built when it is published: a
//! [`Balance`]: its policy, its clusters (with their weights), and for every
//! endpoint of its A/AAAA answer the cluster, zone, health and the records
//! it owns. The global settings are `answer_config`, who the clients are
//! `localities`, the ids `intern`, the answer counters `answer_stats`.
//!
//! The records themselves stay in the service's RRsets, encoded once and in
//! endpoint order; a [`Balance`] only points into them by index. So marking
//! an endpoint or a cluster down (`Update::EndpointHealth`,
//! `Update::ClusterLiveness`) builds a new `Balance` and re-encodes nothing.

use std::sync::atomic::{AtomicU32, Ordering};

use crate::model::{Boundary, ClusterId, ClusterWeight, PolicyKind, ServiceKey};

/// One cluster of a balanced service.
#[derive(Debug, Clone)]
pub struct BalanceCluster {
    /// Interned id (compared with [`Client::cluster`](super::Client::cluster)).
    pub id: u16,
    /// Its name.
    pub name: ClusterId,
    /// Region id, when configured.
    pub region: Option<u16>,
    /// Weight for the weighted policy.
    pub weight: u32,
    /// Its slot in [`AnswerStats`](super::AnswerStats) (`u32::MAX`: not counted).
    pub stat: u32,
    /// Its records per family (0 = A, 1 = AAAA): first index, end. A
    /// cluster's endpoints are neighbours, so this is one range.
    pub records: [(u32, u32); 2],
}

/// One endpoint of a balanced service's A/AAAA answer.
#[derive(Debug, Clone)]
pub struct EndpointMeta {
    /// Index into [`Balance::clusters`].
    pub cluster: u16,
    /// Interned zone id.
    pub zone: Option<u16>,
    /// Its records per family (0 = A, 1 = AAAA): first index, count.
    pub records: [(u32, u16); 2],
    /// What identifies it (targetRef or hostname), for explain; none when
    /// its address does, the common case, which then costs no allocation
    /// (see [`ServiceNames::endpoint_label`](super::ServiceNames::endpoint_label)).
    pub name: Option<Box<str>>,
    // Its addresses are not kept here: they are in its records
    // (`ServiceNames::endpoint_addresses`), and a copy was 24 of 64 bytes
    // per endpoint at fleet scale (docs/benchmarks-history.md, "Packed
    // endpoints, addresses read from records, a slimmer index and reverse map").
}

/// A service's answer policy and the metadata of its endpoints; see the
/// module docs.
#[derive(Debug)]
pub struct Balance {
    /// The policy.
    pub policy: PolicyKind,
    /// Most endpoints per answer, 0 for all.
    pub max_answers: u16,
    /// Healthy endpoints a locality needs before answers stop spilling over.
    pub min_healthy: u16,
    /// Answer every endpoint when none is healthy.
    pub fail_open: bool,
    /// How far from the client answers may reach, as configured; see
    /// [`Balance::applied_boundary`] for whether the policy uses it.
    pub boundary: Boundary,
    /// The service's clusters.
    pub clusters: Box<[BalanceCluster]>,
    /// The endpoints, in the order of their records.
    pub endpoints: Box<[EndpointMeta]>,
    /// Health overlay, one per endpoint.
    pub healthy: Box<[bool]>,
    /// Healthy endpoints with records of each family.
    pub healthy_count: [u32; 2],
    /// Endpoints with records of each family.
    pub present: [u32; 2],
    /// Per-family query counters: the n-th A and the n-th AAAA query pick
    /// the same endpoints, and each family rotates evenly on its own.
    seq: [AtomicU32; 2],
    /// Varies the random policy between services.
    pub salt: u32,
    /// The service, for active probes' verdicts.
    pub service: ServiceKey,
    /// The TCP port active probes connect to; none: not probed.
    pub probe_port: Option<u16>,
}

impl Balance {
    pub(crate) fn new(
        policy: PolicyKind,
        (max_answers, min_healthy, fail_open, boundary): (u16, u16, bool, Boundary),
        clusters: Box<[BalanceCluster]>,
        endpoints: Box<[EndpointMeta]>,
        healthy: Box<[bool]>,
        salt: u32,
        (service, probe_port): (ServiceKey, Option<u16>),
    ) -> Self {
        let mut b = Self {
            policy,
            max_answers,
            min_healthy: min_healthy.max(1),
            fail_open,
            boundary,
            clusters,
            endpoints,
            healthy,
            healthy_count: [0; 2],
            present: [0; 2],
            seq: [AtomicU32::new(0), AtomicU32::new(0)],
            salt,
            service,
            probe_port,
        };
        b.count();
        b
    }

    fn count(&mut self) {
        for (i, c) in self.clusters.iter_mut().enumerate() {
            for f in 0..2 {
                let mut range = (u32::MAX, 0);
                for e in self.endpoints.iter().filter(|e| usize::from(e.cluster) == i && e.records[f].1 > 0) {
                    range.0 = range.0.min(e.records[f].0);
                    range.1 = range.1.max(e.records[f].0 + u32::from(e.records[f].1));
                }
                c.records[f] = if range.1 == 0 { (0, 0) } else { range };
            }
        }
        for f in 0..2 {
            self.present[f] = self.endpoints.iter().filter(|e| e.records[f].1 > 0).count() as u32;
            self.healthy_count[f] = self
                .endpoints
                .iter()
                .zip(&self.healthy[..])
                .filter(|(e, h)| **h && e.records[f].1 > 0)
                .count() as u32;
        }
    }

    /// The same service with another health overlay; records untouched.
    pub(crate) fn with_health(&self, healthy: Box<[bool]>, weights: Option<&[ClusterWeight]>) -> Self {
        let mut clusters = self.clusters.clone();
        set_weights(&mut clusters, &self.endpoints, &healthy, weights);
        Self::new(
            self.policy,
            (self.max_answers, self.min_healthy, self.fail_open, self.boundary),
            clusters,
            self.endpoints.clone(),
            healthy,
            self.salt,
            (self.service.clone(), self.probe_port),
        )
    }

    /// The boundary the answers keep: the configured one under the
    /// policies that look at the client (`local-first`, `topology`), none
    /// under the others, whose answers are the same for every client.
    pub fn applied_boundary(&self) -> Boundary {
        if self.policy.depends_on_client() { self.boundary } else { Boundary::None }
    }

    /// Takes the next sequence number of a family (0 = A, 1 = AAAA).
    pub fn next_seq(&self, family: usize) -> u32 {
        self.seq[family].fetch_add(1, Ordering::Relaxed)
    }

    /// The sequence number the next query of a family will take.
    pub fn peek_seq(&self, family: usize) -> u32 {
        self.seq[family].load(Ordering::Relaxed)
    }
}

/// Weights from the annotation (clusters it does not list get 0), else
/// proportional to each cluster's healthy endpoints.
pub(crate) fn set_weights(
    clusters: &mut [BalanceCluster],
    endpoints: &[EndpointMeta],
    healthy: &[bool],
    weights: Option<&[ClusterWeight]>,
) {
    for (i, c) in clusters.iter_mut().enumerate() {
        c.weight = match weights {
            Some(w) => w.iter().find(|w| w.cluster == c.name).map_or(0, |w| w.weight),
            None => endpoints.iter().zip(healthy).filter(|(e, h)| **h && usize::from(e.cluster) == i).count()
                as u32,
        };
    }
}
