//! The publisher: what a member's own cluster exports, kept as ExportRecords
//! in its namespace on the hub. It watches the cluster's ServiceExports,
//! Services and their EndpointSlices, and on each change of a service
//! writes that service's records (only those whose content changed, by
//! their digest), and deletes those no export wants once every watch has
//! listed. The records on the hub are read at start and whenever this
//! replica gains the tenure, so an idle restart or a move of the tenure
//! writes nothing. Every write carries the tenure's fence, checked at the
//! wire (`k8s::fence`): a replica that lost its Lease publishes nothing.
//! Nor does one before its heartbeat has found the member name its own
//! (`hub::heartbeat::Claim`: another cluster may hold it); it publishes
//! what waits once the name is its own.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::runtime::watcher;
use serde_json::Value;
use tokio::sync::{mpsc, watch};
use tracing::{info, warn};

use super::record::{self, Exported, FIELD_MANAGER};
use crate::fleet::member::Member;
use crate::k8s::fence::{WriteFence, is_fenced};
use crate::k8s::mcs::{LABEL_K8S_SERVICE_NAME, discover_mcs};
use crate::k8s::watch::{Lists, Reporter, Translate, relist};

/// How long a write waits before it is tried again after failing.
const RETRY: Duration = Duration::from_secs(2);
/// How long one call to the hub may take.
const CALL_DEADLINE: Duration = Duration::from_secs(10);

/// What the publisher did, for `/metrics`.
#[derive(Debug, Default)]
pub struct PublishStats {
    /// Records written.
    pub written: AtomicU64,
    /// Records deleted.
    pub deleted: AtomicU64,
    /// Writes skipped: the record on the hub already held the content.
    pub unchanged: AtomicU64,
    /// Writes or deletes that failed (each retried).
    pub failed: AtomicU64,
}

/// Where and under which tenure a member publishes.
pub struct Publisher {
    /// The member's own cluster (its watches).
    pub cluster: Member,
    /// The hub's client (with the write fence at the wire).
    pub hub: kube::Client,
    /// The member's hub namespace.
    pub namespace: String,
    /// The tenure every write carries.
    pub fence: WriteFence,
    /// True while this replica holds the tenure (the election's).
    pub leading: watch::Receiver<Vec<bool>>,
    /// Counters.
    pub stats: Arc<PublishStats>,
    /// Whether the member's name is this cluster's on the hub: nothing is
    /// published while it is not.
    pub claim: Arc<super::heartbeat::Claim>,
}

/// One kind of the member's objects, as its watch reports them.
enum MemberChange {
    Exports(Change<DynamicObject>),
    Services(Change<Service>),
    Slices(Change<EndpointSlice>),
}

enum Change<K> {
    Listed(Vec<K>),
    Applied(Box<K>),
    Deleted(Box<K>),
}

struct Keep<K> {
    wrap: fn(Change<K>) -> MemberChange,
}

impl<K: kube::Resource + Clone + Send + Sync + 'static> Translate<K> for Keep<K> {
    type Item = K;
    type Message = MemberChange;

    fn item(&self, k: &K) -> Option<K> {
        Some(k.clone())
    }

    fn listed(&self, items: Vec<K>, _: std::time::Instant) -> MemberChange {
        (self.wrap)(Change::Listed(items))
    }

    fn applied(&self, k: &K) -> Option<MemberChange> {
        Some((self.wrap)(Change::Applied(Box::new(k.clone()))))
    }

    fn deleted(&self, k: &K) -> Option<MemberChange> {
        Some((self.wrap)(Change::Deleted(Box::new(k.clone()))))
    }
}

/// A service: (namespace, name).
type Key = (String, String);

fn key_of<K: kube::Resource>(k: &K) -> Option<Key> {
    Some((k.meta().namespace.clone()?, k.meta().name.clone()?))
}

fn slice_service(s: &EndpointSlice) -> Option<Key> {
    let name = s.metadata.labels.as_ref()?.get(LABEL_K8S_SERVICE_NAME)?;
    Some((s.metadata.namespace.clone()?, name.clone()))
}

/// The member's objects, by service.
#[derive(Default)]
struct Objects {
    exports: BTreeMap<Key, DynamicObject>,
    services: BTreeMap<Key, Service>,
    /// Slices by (namespace, slice name), and which service each is of.
    slices: BTreeMap<Key, (Key, EndpointSlice)>,
    listed: [bool; 3],
}

impl Objects {
    fn take<K: kube::Resource + Clone>(
        map: &mut BTreeMap<Key, K>,
        change: Change<K>,
        touched: &mut BTreeSet<Key>,
    ) {
        match change {
            Change::Listed(all) => {
                touched.extend(map.keys().cloned());
                *map = all.into_iter().filter_map(|k| Some((key_of(&k)?, k))).collect();
                touched.extend(map.keys().cloned());
            }
            Change::Applied(k) => {
                if let Some(key) = key_of(&*k) {
                    touched.insert(key.clone());
                    map.insert(key, *k);
                }
            }
            Change::Deleted(k) => {
                if let Some(key) = key_of(&*k) {
                    touched.insert(key.clone());
                    map.remove(&key);
                }
            }
        }
    }

    fn apply(&mut self, seen: MemberChange, touched: &mut BTreeSet<Key>) {
        match seen {
            MemberChange::Exports(c) => {
                if matches!(c, Change::Listed(_)) {
                    self.listed[0] = true;
                }
                Self::take(&mut self.exports, c, touched);
            }
            MemberChange::Services(c) => {
                if matches!(c, Change::Listed(_)) {
                    self.listed[1] = true;
                }
                Self::take(&mut self.services, c, touched);
            }
            MemberChange::Slices(c) => {
                let keyed = |s: EndpointSlice| Some((key_of(&s)?, (slice_service(&s)?, s)));
                match c {
                    Change::Listed(all) => {
                        self.listed[2] = true;
                        touched.extend(self.slices.values().map(|(k, _)| k.clone()));
                        self.slices = all.into_iter().filter_map(keyed).collect();
                        touched.extend(self.slices.values().map(|(k, _)| k.clone()));
                    }
                    Change::Applied(s) => {
                        if let Some((id, (svc, s))) = keyed(*s) {
                            if let Some((old, _)) = self.slices.insert(id, (svc.clone(), s)) {
                                touched.insert(old);
                            }
                            touched.insert(svc);
                        }
                    }
                    Change::Deleted(s) => {
                        if let Some(id) = key_of(&*s)
                            && let Some((svc, _)) = self.slices.remove(&id)
                        {
                            touched.insert(svc);
                        }
                    }
                }
            }
        }
    }

    /// What the member exports of `key` (nothing without a ServiceExport).
    fn exported(&self, key: &Key) -> Exported {
        let Some(export) = self.exports.get(key) else { return Exported::default() };
        Exported {
            export: Some(export.clone()),
            service: self.services.get(key).cloned(),
            slices: self.slices.values().filter(|(k, _)| k == key).map(|(_, s)| s.clone()).collect(),
        }
    }

    fn synced(&self) -> bool {
        self.listed.iter().all(|l| *l)
    }
}

impl Publisher {
    /// Runs until dropped.
    pub async fn run(mut self) {
        let (tx, mut rx) = mpsc::channel::<MemberChange>(1024);
        let mut watches = tokio::task::JoinSet::new();
        self.spawn_watches(&mut watches, &tx);
        let mut objects = Objects::default();
        // The records on the hub: name → digest. `None` until read.
        let mut published: Option<HashMap<String, String>> = None;
        let mut pending: BTreeSet<Key> = BTreeSet::new();
        let mut leading = self.leads();
        let mut retry_at: Option<tokio::time::Instant> = None;
        let mut claim = self.claim.changes();
        loop {
            if leading && published.is_none() {
                published = self.read_published().await;
                if published.is_some() {
                    // A fresh read: every service is compared with it.
                    pending.extend(objects.exports.keys().cloned());
                    pending.extend(self.published_services(published.as_ref()));
                }
            }
            if leading
                && self.claim.ours()
                && objects.synced()
                && let Some(p) = published.as_mut()
                && !pending.is_empty()
                && retry_at.is_none_or(|t| tokio::time::Instant::now() >= t)
            {
                let failed = self.publish(&objects, p, std::mem::take(&mut pending)).await;
                retry_at = (!failed.is_empty()).then(|| tokio::time::Instant::now() + RETRY);
                pending = failed;
            }
            let wake = retry_at.unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(3600));
            tokio::select! {
                Some(seen) = rx.recv() => objects.apply(seen, &mut pending),
                Ok(()) = self.leading.changed() => {
                    let now = self.leads();
                    if now != leading {
                        info!(namespace = %self.namespace, leading = now, "publishing on the hub: tenure changed");
                        // Gained: read the hub again before writing; lost: forget it.
                        published = None;
                    }
                    leading = now;
                }
                () = tokio::time::sleep_until(wake) => retry_at = None,
                // The name became ours (or not): what waits is published now.
                Ok(()) = claim.changed() => {}
                Some(ended) = watches.join_next() => {
                    warn!(ended = ?ended.err().map(|e| e.to_string()), "a watch of the member's exports ended; starting them again");
                    watches.abort_all();
                    objects = Objects::default();
                    self.spawn_watches(&mut watches, &tx);
                }
            }
        }
    }

    fn leads(&self) -> bool {
        self.leading.borrow().first().copied().unwrap_or(false)
    }

    fn spawn_watches(&self, set: &mut tokio::task::JoinSet<()>, tx: &mpsc::Sender<MemberChange>) {
        let lists = Lists::default();
        let (client, health) = (self.cluster.client.clone(), self.cluster.health.clone());
        let name = |k: usize| health.get(k).cloned().unwrap_or_else(|| health[0].clone());
        let (c, t, l, h) = (client.clone(), tx.clone(), lists.clone(), name(0));
        set.spawn(async move {
            let mut reporter = Reporter::new(h);
            let resource = discover_mcs(&c, "ServiceExport", "serviceexports", &mut reporter).await;
            let api: Api<DynamicObject> = Api::all_with(c, &resource);
            relist(api, watcher::Config::default(), &l, reporter, Keep { wrap: MemberChange::Exports }, t)
                .await;
        });
        let (c, t, l, h) = (client.clone(), tx.clone(), lists.clone(), name(1));
        set.spawn(async move {
            let api: Api<Service> = Api::all(c);
            let keep = Keep { wrap: MemberChange::Services };
            relist(api, watcher::Config::default(), &l, Reporter::new(h), keep, t).await;
        });
        let (c, t, l, h) = (client, tx.clone(), lists, name(2));
        set.spawn(async move {
            let api: Api<EndpointSlice> = Api::all(c);
            let cfg = watcher::Config::default().labels(LABEL_K8S_SERVICE_NAME);
            relist(api, cfg, &l, Reporter::new(h), Keep { wrap: MemberChange::Slices }, t).await;
        });
    }

    fn records(&self) -> Api<DynamicObject> {
        Api::namespaced_with(self.hub.clone(), &self.namespace, &record::resource())
    }

    /// The records on the hub now, by name with their digests; `None` when
    /// the hub does not answer (tried again on the next turn).
    async fn read_published(&self) -> Option<HashMap<String, String>> {
        let listed = tokio::time::timeout(CALL_DEADLINE, self.records().list(&ListParams::default())).await;
        match listed {
            Ok(Ok(list)) => Some(
                list.items
                    .into_iter()
                    .filter_map(|o| {
                        let v = serde_json::to_value(&o).ok()?;
                        Some((o.metadata.name?, record::digest(&v).unwrap_or("").to_owned()))
                    })
                    .collect(),
            ),
            Ok(Err(e)) => {
                warn!(namespace = %self.namespace, error = %e, "cannot read this member's records on the hub; trying again");
                None
            }
            Err(_) => {
                warn!(namespace = %self.namespace, "the hub did not answer within {CALL_DEADLINE:?}; trying again");
                None
            }
        }
    }

    /// The services whose records are on the hub.
    fn published_services(&self, published: Option<&HashMap<String, String>>) -> Vec<Key> {
        published
            .into_iter()
            .flat_map(|p| p.keys())
            .filter_map(|n| record::parse_name(n).map(|(ns, name, _)| (ns.to_owned(), name.to_owned())))
            .collect()
    }

    /// Brings the records of `keys` to what the member exports; returns the
    /// services to try again.
    async fn publish(
        &self,
        objects: &Objects,
        published: &mut HashMap<String, String>,
        keys: BTreeSet<Key>,
    ) -> BTreeSet<Key> {
        let mut failed = BTreeSet::new();
        for key in keys {
            let wanted = record::records(&self.namespace, &key.0, &key.1, &objects.exported(&key));
            let names: BTreeSet<String> =
                wanted.iter().filter_map(|r| r["metadata"]["name"].as_str().map(str::to_owned)).collect();
            let mut ok = true;
            for body in &wanted {
                let (Some(name), Some(digest)) = (body["metadata"]["name"].as_str(), record::digest(body))
                else {
                    continue;
                };
                if published.get(name).is_some_and(|d| d == digest) {
                    self.stats.unchanged.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                match self.apply(name, body).await {
                    Ok(()) => {
                        published.insert(name.to_owned(), digest.to_owned());
                        self.stats.written.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        ok = false;
                        self.failed(&key, &e);
                    }
                }
            }
            let stale: Vec<String> = published
                .keys()
                .filter(|n| {
                    record::parse_name(n)
                        .is_some_and(|(ns, name, _)| (ns, name) == (key.0.as_str(), key.1.as_str()))
                        && !names.contains(*n)
                })
                .cloned()
                .collect();
            for name in stale {
                match self.delete(&name).await {
                    Ok(()) => {
                        published.remove(&name);
                        self.stats.deleted.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        ok = false;
                        self.failed(&key, &e);
                    }
                }
            }
            if !ok {
                failed.insert(key);
            }
        }
        failed
    }

    fn failed(&self, key: &Key, e: &kube::Error) {
        self.stats.failed.fetch_add(1, Ordering::Relaxed);
        if is_fenced(e) {
            info!(service = %format!("{}/{}", key.0, key.1), "not published: the tenure ran out");
        } else {
            warn!(service = %format!("{}/{}", key.0, key.1), error = %e, "cannot publish the export on the hub; trying again");
        }
    }

    async fn apply(&self, name: &str, body: &Value) -> Result<(), kube::Error> {
        let pp = PatchParams::apply(FIELD_MANAGER).force();
        let mut req = kube::core::Request::new(self.records().resource_url())
            .patch(name, &pp, &Patch::Apply(body))
            .map_err(kube::Error::BuildRequest)?;
        req.extensions_mut().insert("patch");
        req.extensions_mut().insert(self.fence.clone());
        self.call(self.hub.request_text(req)).await.map(|_| ())
    }

    async fn delete(&self, name: &str) -> Result<(), kube::Error> {
        let mut req = kube::core::Request::new(self.records().resource_url())
            .delete(name, &Default::default())
            .map_err(kube::Error::BuildRequest)?;
        req.extensions_mut().insert("delete");
        req.extensions_mut().insert(self.fence.clone());
        match self.call(self.hub.request_text(req)).await {
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            r => r.map(|_| ()),
        }
    }

    /// `call` under the deadline, and never past the tenure.
    async fn call<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, kube::Error> {
        let tenure = self.fence.fence.remaining().unwrap_or(CALL_DEADLINE);
        let fenced = || kube::Error::Service(Box::new(crate::k8s::fence::Fenced { shard: self.fence.shard }));
        tokio::select! {
            r = tokio::time::timeout(tenure.min(CALL_DEADLINE), call) => r.unwrap_or_else(|_| {
                if tenure < CALL_DEADLINE {
                    Err(fenced())
                } else {
                    Err(kube::Error::Service(format!("the hub did not answer within {CALL_DEADLINE:?}").into()))
                }
            }),
            () = self.fence.fence.closing() => Err(fenced()),
        }
    }
}
