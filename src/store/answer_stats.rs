//! The table behind `clusterset_dns_answers_total{service,cluster}`: a
//! fixed number of counter slots, assigned per (service, cluster) at publish
//! time and counted into by the answering threads.

use std::sync::atomic::Ordering;

use crate::model::{ClusterId, ServiceKey};

/// Most (service, cluster) pairs `clusterset_dns_answers_total` counts;
/// pairs beyond it are not counted (logged once).
pub const ANSWER_SLOTS: usize = 16384;

/// `clusterset_dns_answers_total{service,cluster}`: how often a cluster's
/// endpoints were in a service's answer. The writer gives each (service,
/// cluster) a slot at publish time (the mutex is never taken on the
/// answer path); answering threads add their local counts to the atomics
/// now and then (`wire::stats::AnswerHits`); `/metrics` reads them.
#[derive(Debug)]
pub struct AnswerStats {
    counts: Box<[std::sync::atomic::AtomicU64]>,
    slots: std::sync::Mutex<Slots>,
}

#[derive(Debug, Default)]
struct Slots {
    index: std::collections::HashMap<(ServiceKey, ClusterId), u32>,
    labels: Vec<(String, String)>,
    full_logged: bool,
}

impl Default for AnswerStats {
    fn default() -> Self {
        Self {
            counts: (0..ANSWER_SLOTS).map(|_| std::sync::atomic::AtomicU64::new(0)).collect(),
            slots: std::sync::Mutex::default(),
        }
    }
}

impl AnswerStats {
    /// The slot of a (service, cluster), assigned on first use; slots are
    /// never reused, so a counter never changes labels.
    pub(crate) fn slot(&self, service: &ServiceKey, cluster: &ClusterId) -> u32 {
        let Ok(mut s) = self.slots.lock() else { return u32::MAX };
        if let Some(&i) = s.index.get(&(service.clone(), cluster.clone())) {
            return i;
        }
        if s.labels.len() >= ANSWER_SLOTS {
            if !s.full_logged {
                s.full_logged = true;
                tracing::warn!(
                    "more than {ANSWER_SLOTS} (service, cluster) pairs: the rest are not counted in clusterset_dns_answers_total"
                );
            }
            return u32::MAX;
        }
        let i = s.labels.len() as u32;
        s.labels.push((service.to_string(), cluster.to_string()));
        s.index.insert((service.clone(), cluster.clone()), i);
        i
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
}
