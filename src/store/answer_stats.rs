//! The tables behind `clusterset_dns_cluster_answers_total{cluster}` and
//! `clusterset_dns_answers_total{service,cluster}`: a fixed number of
//! counter slots, one per interned cluster and one per (service, cluster)
//! assigned at publish time, counted into by the answering threads.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::model::{ClusterId, ServiceKey};

/// Most (service, cluster) pairs `clusterset_dns_answers_total` counts;
/// pairs beyond it are not counted (logged once).
pub const ANSWER_SLOTS: usize = 16384;

/// Most clusters `clusterset_dns_cluster_answers_total` counts, by interned
/// id (a clusterset has tens); those beyond are not counted (logged once).
pub const CLUSTER_SLOTS: usize = 1024;

/// How often a cluster's endpoints were in an answer: per cluster (every
/// answer, whatever the fleet's size) and per (service, cluster) (the
/// first [`ANSWER_SLOTS`] pairs). The writer gives each (service, cluster)
/// a slot and names each cluster's at publish time (the mutex is never
/// taken on the answer path); answering threads add their local counts to
/// the atomics now and then (`wire::stats::AnswerHits`); `/metrics` reads
/// them.
#[derive(Debug)]
pub struct AnswerStats {
    /// The pairs' slots, then the clusters' ([`AnswerStats::cluster_slot`]).
    counts: Box<[AtomicU64]>,
    slots: std::sync::Mutex<Slots>,
}

#[derive(Debug, Default)]
struct Slots {
    index: std::collections::HashMap<(ServiceKey, ClusterId), u32>,
    labels: Vec<(String, String)>,
    /// Each counted cluster's name, by interned id.
    clusters: Vec<Option<String>>,
    full_logged: bool,
    clusters_full_logged: bool,
}

impl Default for AnswerStats {
    fn default() -> Self {
        Self {
            counts: (0..ANSWER_SLOTS + CLUSTER_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            slots: std::sync::Mutex::default(),
        }
    }
}

impl AnswerStats {
    /// The slot of a (service, cluster), assigned on first use, and the
    /// cluster's name under its interned `id`; slots are never reused, so
    /// a counter never changes labels.
    pub(crate) fn slot(&self, service: &ServiceKey, cluster: &ClusterId, id: u16) -> u32 {
        let Ok(mut s) = self.slots.lock() else { return u32::MAX };
        name_cluster(&mut s, id, cluster);
        if let Some(&i) = s.index.get(&(service.clone(), cluster.clone())) {
            return i;
        }
        if s.labels.len() >= ANSWER_SLOTS {
            if !s.full_logged {
                s.full_logged = true;
                tracing::warn!(
                    "more than {ANSWER_SLOTS} (service, cluster) pairs: the rest are not counted in clusterset_dns_answers_total (clusterset_dns_cluster_answers_total counts them all)"
                );
            }
            return u32::MAX;
        }
        let i = s.labels.len() as u32;
        s.labels.push((service.to_string(), cluster.to_string()));
        s.index.insert((service.clone(), cluster.clone()), i);
        i
    }

    /// The slot of the cluster of interned id `id` (`u32::MAX`: beyond
    /// [`CLUSTER_SLOTS`], not counted).
    pub fn cluster_slot(id: u16) -> u32 {
        let id = usize::from(id);
        if id < CLUSTER_SLOTS { (ANSWER_SLOTS + id) as u32 } else { u32::MAX }
    }

    /// Adds `n` to a slot.
    pub fn add(&self, slot: u32, n: u64) {
        if let Some(c) = self.counts.get(slot as usize) {
            c.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Every counted (service, cluster) and its count, for `/metrics`.
    pub fn read(&self) -> Vec<(String, String, u64)> {
        let Ok(s) = self.slots.lock() else { return Vec::new() };
        s.labels
            .iter()
            .zip(self.counts.iter())
            .map(|((svc, c), n)| (svc.clone(), c.clone(), n.load(Ordering::Relaxed)))
            .filter(|(_, _, n)| *n > 0)
            .collect()
    }

    /// Every cluster that had a slot and its count (0 included: a rate()
    /// starts from a value), for `/metrics`.
    pub fn read_clusters(&self) -> Vec<(String, u64)> {
        let Ok(s) = self.slots.lock() else { return Vec::new() };
        s.clusters
            .iter()
            .zip(&self.counts[ANSWER_SLOTS..])
            .filter_map(|(name, n)| Some((name.clone()?, n.load(Ordering::Relaxed))))
            .collect()
    }
}

/// Records the name of the cluster of interned id `id`, once.
fn name_cluster(s: &mut Slots, id: u16, cluster: &ClusterId) {
    let i = usize::from(id);
    if i >= CLUSTER_SLOTS {
        if !s.clusters_full_logged {
            s.clusters_full_logged = true;
            tracing::warn!(
                "more than {CLUSTER_SLOTS} clusters: the rest are not counted in clusterset_dns_cluster_answers_total"
            );
        }
        return;
    }
    if s.clusters.len() <= i {
        s.clusters.resize(i + 1, None);
    }
    if s.clusters[i].is_none() {
        s.clusters[i] = Some(cluster.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::DnsLabel;

    fn key(name: &str) -> ServiceKey {
        ServiceKey { namespace: DnsLabel::parse("ns").unwrap(), name: DnsLabel::parse(name).unwrap() }
    }

    #[test]
    fn clusters_count_every_answer_past_the_pairs_bound() {
        let stats = AnswerStats::default();
        let a = ClusterId::parse("cluster-a").unwrap();
        // Every pair slot taken: the next service's pair is not counted,
        // its cluster still is.
        for i in 0..ANSWER_SLOTS {
            assert_eq!(stats.slot(&key(&format!("s{i}")), &a, 0), i as u32);
        }
        assert_eq!(stats.slot(&key("late"), &a, 0), u32::MAX);
        stats.add(AnswerStats::cluster_slot(0), 3);
        stats.add(0, 2);
        assert_eq!(stats.read_clusters(), vec![("cluster-a".to_owned(), 3)]);
        assert_eq!(stats.read(), vec![("ns/s0".to_owned(), "cluster-a".to_owned(), 2)]);
    }

    #[test]
    fn every_named_cluster_is_read_from_zero_and_ids_past_the_bound_are_not_counted() {
        let stats = AnswerStats::default();
        let (a, b) = (ClusterId::parse("a").unwrap(), ClusterId::parse("b").unwrap());
        stats.slot(&key("x"), &b, 2);
        assert_eq!(stats.read_clusters(), vec![("b".to_owned(), 0)], "ids 0 and 1 never named");
        stats.slot(&key("y"), &a, CLUSTER_SLOTS as u16);
        assert_eq!(stats.read_clusters().len(), 1);
        assert_eq!(AnswerStats::cluster_slot(CLUSTER_SLOTS as u16), u32::MAX);
    }
}
