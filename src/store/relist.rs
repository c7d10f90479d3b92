//! The way back from the store to its sources: [`Relists`], the store's
//! requests that a source list again.
//!
//! The writer refuses an update that would not fit the memory budget
//! (`ops::memory`); the source it came from then differs from what the
//! store holds (it *diverged*), and no later change of that source tells
//! the store what it missed. Once the store fits again, the budget asks
//! that source for its complete state through this handle, and each kind
//! of source answers in the way it recovers from any other fault:
//!
//! - a Kubernetes watch (`SourceId::Watch`) restarts its watcher, which
//!   lists again (`k8s::watch`, `Translate::relist`);
//! - an objects file (`SourceId::File`) is read again even if its bytes did
//!   not change (`source::files`);
//! - the members of centralized mode (`SourceId::Members`) list the fleet
//!   again (`source::centralized`).
//!
//! One handle serves every source: the asks are a set of [`SourceId`]s,
//! each producer waits for those it owns ([`Relists::asked`]) and takes
//! them. An ask nobody is waiting for stays until its source takes it (a
//! watch in its backoff lists when it starts again), and a source that
//! starts a list anyway discards the asks made before it
//! ([`Relists::take`]). Asks are rare (a store coming back within its
//! budget), so every producer is woken for each and looks for its own.

use std::collections::BTreeSet;
use std::sync::Arc;

use tokio::sync::watch;

use super::input::SourceId;

/// The sources asked to list again, shared by the writer's memory budget
/// (which asks) and every source (which waits for its own asks). Cheap to
/// clone.
#[derive(Clone, Debug)]
pub struct Relists {
    asked: Arc<watch::Sender<BTreeSet<SourceId>>>,
}

impl Default for Relists {
    fn default() -> Self {
        Self { asked: Arc::new(watch::Sender::new(BTreeSet::new())) }
    }
}

impl Relists {
    /// Asks `source` to deliver its complete state again.
    pub fn ask(&self, source: SourceId) {
        self.asked.send_if_modified(|asked| asked.insert(source));
    }

    /// Takes the asks of the sources `mine` owns, if any, without waiting:
    /// for a source about to list anyway.
    pub fn take(&self, mine: impl Fn(SourceId) -> bool) -> Vec<SourceId> {
        let mut taken = Vec::new();
        // Only a change wakes the waiters; a look that finds nothing is a read.
        if self.asked.borrow().iter().any(|s| mine(*s)) {
            self.asked.send_if_modified(|asked| {
                asked.retain(|s| {
                    let keep = !mine(*s);
                    if !keep {
                        taken.push(*s);
                    }
                    keep
                });
                false
            });
        }
        taken
    }

    /// Waits until a source `mine` owns is asked to list again, and takes
    /// its asks (those of every source `mine` owns). Cancel-safe: an ask is
    /// taken only by the poll that returns it.
    pub async fn asked(&self, mine: impl Fn(SourceId) -> bool) -> Vec<SourceId> {
        let mut changes = self.asked.subscribe();
        loop {
            let taken = self.take(&mine);
            if !taken.is_empty() {
                return taken;
            }
            // The sender lives in `self`: the channel never closes while
            // this waits.
            if changes.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Whether `source` was asked and has not taken the ask yet.
    pub fn is_asked(&self, source: SourceId) -> bool {
        self.asked.borrow().contains(&source)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap()
    }

    #[test]
    fn each_source_takes_only_its_own_asks_and_an_early_ask_waits_for_it() {
        let relists = Relists::default();
        let file = |s: SourceId| matches!(s, SourceId::File { .. });
        relists.ask(SourceId::Watch(3));
        relists.ask(SourceId::File { path: 0, file: 1 });
        assert!(relists.is_asked(SourceId::Watch(3)));
        let rt = rt();
        // Asked before anyone waited: taken at once.
        let files = rt.block_on(relists.asked(file));
        assert_eq!(files, [SourceId::File { path: 0, file: 1 }]);
        let watch = rt.block_on(relists.asked(|s| s == SourceId::Watch(3)));
        assert_eq!(watch, [SourceId::Watch(3)]);
        assert!(!relists.is_asked(SourceId::Watch(3)));
        // Nothing asked: it waits.
        let waited =
            rt.block_on(async { tokio::time::timeout(Duration::from_millis(50), relists.asked(file)).await });
        assert!(waited.is_err(), "took an ask nobody made");
    }

    #[test]
    fn a_waiting_source_wakes_for_its_ask_and_not_for_another_sources() {
        let relists = Relists::default();
        let rt = rt();
        let asker = relists.clone();
        let got = rt.block_on(async move {
            let waiting = tokio::spawn(async move { relists.asked(|s| s == SourceId::Members).await });
            tokio::time::sleep(Duration::from_millis(20)).await;
            asker.ask(SourceId::Watch(0));
            tokio::time::sleep(Duration::from_millis(20)).await;
            assert!(!waiting.is_finished(), "woke for another source's ask");
            asker.ask(SourceId::Members);
            let got = waiting.await.unwrap();
            assert!(asker.is_asked(SourceId::Watch(0)), "another source's ask is left for it");
            got
        });
        assert_eq!(got, [SourceId::Members]);
    }

    #[test]
    fn a_source_about_to_list_discards_the_asks_made_before() {
        let relists = Relists::default();
        relists.ask(SourceId::Watch(1));
        assert_eq!(relists.take(|s| s == SourceId::Watch(2)), []);
        assert_eq!(relists.take(|s| s == SourceId::Watch(1)), [SourceId::Watch(1)]);
        assert!(!relists.is_asked(SourceId::Watch(1)));
    }
}
