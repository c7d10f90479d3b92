//! Interning: clusters and zones become small integer ids, so the read path
//! compares `u16`s. [`Localities`](super::Localities) interns those of the
//! configuration; the writer's [`Interner`] continues with every one a slice
//! names, keeping the configuration's ids.

use crate::model::ClusterId;

/// The id of `v` in `list`, appending it when new.
pub(crate) fn intern<T: PartialEq + Clone>(list: &mut Vec<T>, v: &T) -> u16 {
    if let Some(i) = list.iter().position(|x| x == v) {
        return i as u16;
    }
    list.push(v.clone());
    (list.len() - 1) as u16
}

/// The writer's interned clusters and zones: those of the configuration
/// first (so their ids agree with [`Localities`](super::Localities)), then every one a slice
/// names. Ids are never reused.
#[derive(Debug, Clone, Default)]
pub(crate) struct Interner {
    pub(crate) clusters: Vec<ClusterId>,
    pub(crate) zones: Vec<String>,
}

impl Interner {
    pub(crate) fn cluster(&mut self, c: &ClusterId) -> u16 {
        intern(&mut self.clusters, c)
    }

    /// The id of a cluster interned before; one past the last id when it
    /// was not (the writer interns every cluster before it builds).
    pub(crate) fn cluster_id(&self, c: &ClusterId) -> u16 {
        self.clusters.iter().position(|x| x == c).unwrap_or(self.clusters.len()) as u16
    }

    /// The same for a zone.
    pub(crate) fn zone_id(&self, z: &str) -> u16 {
        self.zones.iter().position(|x| x == z).unwrap_or(self.zones.len()) as u16
    }

    pub(crate) fn zone(&mut self, z: &str) -> u16 {
        match self.zones.iter().position(|x| x == z) {
            Some(i) => i as u16,
            None => intern(&mut self.zones, &z.to_owned()),
        }
    }
}
