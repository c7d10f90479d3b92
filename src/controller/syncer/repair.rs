//! Our objects changed by someone else: an own-watch event of a version we
//! did not write, a deletion of an object we want, or an object missing
//! from a relist, forgets what was applied to it and reconciles its
//! service; events about a service being reconciled wait for it to end.

use std::collections::BTreeSet;
use std::sync::Arc;

use tracing::info;

use super::{Deferred, Syncer};
use crate::controller::api::Kind;
use crate::controller::own::{OwnChange, OwnEvent, OwnObject};
use crate::controller::queue::Reason;
use crate::controller::reconcile::{KeyState, WrittenObject};
use crate::model::ServiceKey;

impl Syncer {
    /// Someone else's change to one of our objects: what we recorded as
    /// applied no longer holds, so the service is reconciled and the object
    /// written again.
    pub(super) fn own_event(&mut self, e: OwnEvent) {
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
                    self.queue.touch(key, Reason::Drift);
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
            self.queue.touch(key, Reason::Event);
        }
    }

    /// Queues the service of `seen` for another write of it, unless the
    /// event is of our own write or of an object we no longer want.
    fn repair(&mut self, m: usize, seen: OwnObject, deleted: bool) {
        let meta = kube::api::ObjectMeta {
            namespace: Some(seen.namespace.clone()),
            name: Some(seen.service.clone()),
            ..Default::default()
        };
        let Ok(key) = crate::fleet::objects::key_of(self.members[m].cluster(), seen.kind.as_str(), &meta)
        else {
            return;
        };
        if self.queue.is_running(&key) {
            self.deferred.entry(key).or_default().push(Deferred::Changed { member: m, seen, deleted });
            return;
        }
        let Some(mut ks) = self.keys.remove(&key) else { return };
        if self.repair_in(&mut ks, m, &seen, deleted) {
            self.queue.touch(key.clone(), Reason::Drift);
        }
        self.keys.insert(key, ks);
    }

    /// [`Self::repair`] on the service's state; true when it needs a write.
    pub(super) fn repair_in(&self, ks: &mut KeyState, m: usize, seen: &OwnObject, deleted: bool) -> bool {
        let r = WrittenObject {
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
        info!(member = %self.members[m].name(), kind = %r.kind, object = %r.path(), "ours, {what} by someone else: writing it again");
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
    pub(super) fn gone_in(
        &self,
        ks: &mut KeyState,
        m: usize,
        (kind, scope): (Kind, Option<&str>),
        listed: &BTreeSet<(String, String)>,
        began: std::time::Instant,
    ) -> bool {
        let gone: Vec<WrittenObject> = ks.gone(m, (kind, scope), listed, began);
        for r in &gone {
            info!(member = %self.members[m].name(), kind = %r.kind, object = %r.path(), "ours, and gone: writing it again");
            self.stats.drift(r.kind);
            ks.invalidate(r);
        }
        !gone.is_empty()
    }
}
