//! Watches of the controller's own objects (ServiceImports, VIP Services and
//! MCS EndpointSlices, by our label) in every member, so that an object of
//! ours deleted or edited by someone else is written again within seconds
//! instead of at the next restart; and of every member's Namespaces, so a
//! namespace created after an export gets the import.
//!
//! Every write of ours records the resourceVersion the API server gave it
//! ([`Written`]); an event with another version, or a deletion of an object
//! we still want, is someone else's doing.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Resource;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::watcher;
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;

use super::api::Kind;
use super::desired::{FIELD_MANAGER, LABEL_APP_MANAGED_BY};
use crate::fleet::member::Member;
use crate::k8s::mcs::LABEL_SERVICE_NAME;
use crate::k8s::watch::{self, Reporter, Translate, WatchHealth, WatchTask, scopes};

/// One of our objects as a watch saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnObject {
    /// `ServiceImport`, `Service` or `EndpointSlice`.
    pub kind: Kind,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// The service it belongs to (our `multicluster.kubernetes.io/service-name` label).
    pub service: String,
    /// Its resourceVersion.
    pub version: String,
}

/// What a watch of our objects reports.
#[derive(Debug)]
pub enum OwnChange {
    /// A complete list of one kind in one scope (`None`: every namespace),
    /// asked for at the instant given: what was written after it may be
    /// missing from the list and still exist.
    Listed(Kind, Option<String>, Vec<OwnObject>, Instant),
    /// Created or changed.
    Applied(OwnObject),
    /// Deleted.
    Deleted(OwnObject),
    /// The member's namespaces, complete (first list or relist).
    Namespaces(Vec<String>),
    /// A namespace of the member created or changed.
    Namespace(String),
}

/// An [`OwnChange`] of member `member`.
#[derive(Debug)]
pub struct OwnEvent {
    /// The member's index.
    pub member: usize,
    /// What happened.
    pub change: OwnChange,
}

/// The last resourceVersions our own writes produced, per object: a spec
/// apply and a status write follow each other, and their events may arrive
/// after both, so one version is not enough. With them, when the last was
/// recorded: a list asked for before it may not hold the object yet.
#[derive(Debug)]
pub struct Written<R> {
    versions: HashMap<R, (Instant, VecDeque<String>)>,
}

impl<R> Default for Written<R> {
    fn default() -> Self {
        Self { versions: HashMap::new() }
    }
}

/// Versions kept per object.
const KEPT: usize = 4;

impl<R: Hash + Eq> Written<R> {
    /// Records a version one of our writes produced.
    pub fn record(&mut self, object: R, version: Option<&str>) {
        let Some(v) = version else { return };
        let now = Instant::now();
        let (at, slot) = self.versions.entry(object).or_insert_with(|| (now, VecDeque::new()));
        *at = now;
        if slot.len() == KEPT {
            slot.pop_front();
        }
        slot.push_back(v.to_owned());
    }

    /// True when `version` of `object` is the result of one of our writes.
    pub fn ours(&self, object: &R, version: &str) -> bool {
        self.versions.get(object).is_some_and(|(_, v)| v.iter().any(|x| x == version))
    }

    /// True when our last write of `object` was recorded before `instant`
    /// (and it has not been forgotten since).
    pub fn before(&self, object: &R, instant: Instant) -> bool {
        self.versions.get(object).is_some_and(|(at, _)| *at < instant)
    }

    /// Forgets an object (deleted, or to be written again).
    pub fn forget(&mut self, object: &R) {
        self.versions.remove(object);
    }

    /// True when nothing is recorded.
    pub fn is_empty(&self) -> bool {
        self.versions.is_empty()
    }

    /// Moves out the objects `which` picks (one member's, for its lane).
    pub fn take(&mut self, which: impl Fn(&R) -> bool) -> Self {
        let (out, keep) = std::mem::take(&mut self.versions).into_iter().partition(|(r, _)| which(r));
        self.versions = keep;
        Self { versions: out }
    }

    /// Takes back what [`Self::take`] moved out; entries here win.
    pub fn absorb(&mut self, other: Self) {
        for (r, v) in other.versions {
            self.versions.entry(r).or_insert(v);
        }
    }
}

#[derive(Clone)]
struct ToOwn {
    member: usize,
    kind: Kind,
    scope: Option<String>,
}

impl ToOwn {
    fn seen<K: Resource>(&self, k: &K) -> Option<OwnObject> {
        let m = k.meta();
        Some(OwnObject {
            kind: self.kind,
            namespace: m.namespace.clone()?,
            name: m.name.clone()?,
            service: m.labels.as_ref()?.get(LABEL_SERVICE_NAME)?.clone(),
            version: m.resource_version.clone().unwrap_or_default(),
        })
    }

    fn event(&self, change: OwnChange) -> OwnEvent {
        OwnEvent { member: self.member, change }
    }
}

impl<K: Resource> Translate<K> for ToOwn {
    type Item = OwnObject;
    type Message = OwnEvent;

    fn item(&self, k: &K) -> Option<OwnObject> {
        self.seen(k)
    }

    fn listed(&self, items: Vec<OwnObject>, began: Instant) -> OwnEvent {
        self.event(OwnChange::Listed(self.kind, self.scope.clone(), items, began))
    }

    fn applied(&self, k: &K) -> Option<OwnEvent> {
        Some(self.event(OwnChange::Applied(self.seen(k)?)))
    }

    fn deleted(&self, k: &K) -> Option<OwnEvent> {
        Some(self.event(OwnChange::Deleted(self.seen(k)?)))
    }
}

/// A member's Namespaces: one created after an export must get the import.
struct ToNamespaces {
    member: usize,
}

impl Translate<Namespace> for ToNamespaces {
    type Item = String;
    type Message = OwnEvent;

    fn item(&self, n: &Namespace) -> Option<String> {
        n.metadata.name.clone()
    }

    fn listed(&self, items: Vec<String>, _: Instant) -> OwnEvent {
        OwnEvent { member: self.member, change: OwnChange::Namespaces(items) }
    }

    fn applied(&self, n: &Namespace) -> Option<OwnEvent> {
        Some(OwnEvent { member: self.member, change: OwnChange::Namespace(n.metadata.name.clone()?) })
    }

    fn deleted(&self, _: &Namespace) -> Option<OwnEvent> {
        None
    }
}

/// The watches of our objects in member `index` that need no MCS version
/// (its Namespaces, our VIP Services and MCS slices), as tasks for the
/// controller to run and restart.
pub fn watches(
    index: usize,
    member: &Member,
    namespaces: &[String],
    events: mpsc::Sender<OwnEvent>,
) -> Vec<WatchTask> {
    let mut out = Vec::new();
    let (client, out_) = (member.client.clone(), events.clone());
    let health = Arc::new(WatchHealth::new(format!("Namespaces of member {}", member.name)));
    out.push(WatchTask::new(health.clone(), move || {
        let (client, events, health) = (client.clone(), out_.clone(), health.clone());
        async move {
            let api: kube::Api<Namespace> = kube::Api::all(client);
            let to = ToNamespaces { member: index };
            let lists = watch::Lists::default();
            watch::relist(api, watcher::Config::default(), &lists, Reporter::new(health), to, events).await;
        }
    }));
    for scope in scopes(namespaces) {
        let typed = |c, s: Option<&str>| watch::scoped::<Service>(c, s);
        out.push(own_watch(index, member, &scope, (Kind::Service, "Services"), typed, &events));
        let typed = |c, s: Option<&str>| watch::scoped::<EndpointSlice>(c, s);
        out.push(own_watch(index, member, &scope, (Kind::EndpointSlice, "EndpointSlices"), typed, &events));
    }
    out
}

/// The watches of our ServiceImports in member `index`, of the version
/// `import` its discovery found: started again when discovery learns
/// another.
pub fn import_watches(
    index: usize,
    member: &Member,
    import: &ApiResource,
    namespaces: &[String],
    events: mpsc::Sender<OwnEvent>,
) -> Vec<WatchTask> {
    scopes(namespaces)
        .into_iter()
        .map(|scope| {
            let what = format!("ServiceImports ({})", import.api_version);
            let import = import.clone();
            let dynamic = move |c, s: Option<&str>| watch::scoped_with::<DynamicObject>(c, s, &import);
            own_watch(index, member, &scope, (Kind::ServiceImport, &what), dynamic, &events)
        })
        .collect()
}

/// One watch of our objects of one kind in one scope, through `api`.
fn own_watch<K, A>(
    index: usize,
    member: &Member,
    scope: &Option<String>,
    (kind, what): (Kind, &str),
    api: A,
    events: &mpsc::Sender<OwnEvent>,
) -> WatchTask
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
    A: Fn(kube::Client, Option<&str>) -> kube::Api<K> + Send + Sync + 'static,
{
    let within = scope.as_deref().map_or_else(String::new, |ns| format!(" in {ns}"));
    let health = Arc::new(WatchHealth::new(format!("our {what}{within} of member {}", member.name)));
    let cfg = watcher::Config::default().labels(&format!("{LABEL_APP_MANAGED_BY}={FIELD_MANAGER}"));
    let to = ToOwn { member: index, kind, scope: scope.clone() };
    let (client, events) = (member.client.clone(), events.clone());
    WatchTask::new(health.clone(), move || {
        let (cfg, events, to, health) = (cfg.clone(), events.clone(), to.clone(), health.clone());
        let api = api(client.clone(), to.scope.as_deref());
        async move {
            watch::relist(api, cfg, &watch::Lists::default(), Reporter::new(health), to, events).await;
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_versions_our_writes_produced_are_ours() {
        let mut w: Written<(usize, &str)> = Written::default();
        let web = (0, "shop/web");
        assert!(!w.ours(&web, "1"));
        w.record(web, Some("5"));
        w.record(web, Some("6"));
        assert!(w.ours(&web, "5") && w.ours(&web, "6"));
        assert!(!w.ours(&web, "7"), "someone else's edit");
        assert!(!w.ours(&(1, "shop/web"), "6"), "another member");
        for v in 7..=10 {
            w.record(web, Some(&v.to_string()));
        }
        assert!(!w.ours(&web, "6"), "only the last {KEPT} are kept");
        w.forget(&web);
        assert!(!w.ours(&web, "10") && w.is_empty());
    }

    #[test]
    fn a_write_is_before_an_instant_when_its_last_record_is() {
        let mut w: Written<(usize, &str)> = Written::default();
        let web = (0, "shop/web");
        let first = Instant::now();
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert!(!w.before(&web, Instant::now()), "never written");
        w.record(web, Some("5"));
        assert!(!w.before(&web, first), "written after the instant");
        std::thread::sleep(std::time::Duration::from_millis(2));
        let second = Instant::now();
        assert!(w.before(&web, second));
        w.record(web, Some("6"));
        assert!(!w.before(&web, second), "the last write counts");
        w.forget(&web);
        assert!(!w.before(&web, Instant::now()), "forgotten");
    }
}
