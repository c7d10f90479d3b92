//! Kubernetes watches as store sources: ServiceImports (v1beta1, or
//! v1alpha1 where the API server lacks it) and MCS EndpointSlices (label
//! `multicluster.kubernetes.io/service-name`), in all namespaces or a list.
//! With `--interop`, two more per scope: Services (the ones backing an
//! import are kept, `k8s::interop`) and EndpointSlices without MCS labels
//! (Karmada's by their controller label; every Service's slice for Kosmos,
//! whose copies are marked only by an annotation).
//!
//! Each watch is one store source. Its first complete list (`InitDone`)
//! replaces the source's state and marks it synced; until every source has
//! synced the store is not ready (SERVFAIL for names not found, `/ready`
//! failing). A relist after an outage or a 410 Gone replaces the state
//! again, so objects deleted meanwhile disappear. While a watch fails, the
//! last known data keeps being served and [`WatchHealth`] says how stale it
//! is (the loop itself is [`crate::k8s::watch::relist`]). When the store's
//! memory budget refused some of what a watch sent, it asks that watch's
//! source to list again (`store::Relists`) once the store fits: the watch
//! then starts again with a complete list, as after an error.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Client;
use kube::api::Api;
use kube::runtime::watcher;
use tokio::sync::mpsc;
use tracing::warn;

use crate::k8s::client::Connection;
use crate::k8s::convert::{self, SliceFields, SliceOutcome};
use crate::k8s::crd::WatchedImport;
use crate::k8s::interop::{self, KARMADA_DISPATCH_CONTROLLER, KARMADA_SLICE_CONTROLLER};
use crate::k8s::mcs::{LABEL_K8S_SERVICE_NAME, LABEL_MANAGED_BY, LABEL_SERVICE_NAME, discover_mcs};
use crate::k8s::protobuf::{self, Encoding, SliceObject, SliceWatch};
use crate::k8s::watch::{self, Reporter, Translate, WatchHealth};
use crate::model::{DnsLabel, Interop, ServiceKey, SliceKey};
use crate::store::{Object, ObjectId, Relists, SourceId, Update};

/// What to watch.
#[derive(Debug, Clone)]
pub struct KubeSource {
    /// Where the API server is.
    pub connection: Connection,
    /// Namespaces to watch; all when empty.
    pub namespaces: Vec<String>,
    /// Which fleet managers' shapes are watched too (`--interop`).
    pub interop: Interop,
    /// How the watches list (`--list-mode`, `--list-page-size`); one
    /// value for all of them, so that a refused streaming list switches
    /// them all to pages.
    pub lists: watch::Lists,
    /// How EndpointSlices are asked for (`--kube-encoding`).
    pub encoding: Encoding,
}

/// One planned watch.
#[derive(Clone)]
pub struct Watch {
    /// Its store source.
    pub source: SourceId,
    /// Its health.
    pub health: Arc<WatchHealth>,
    kind: Kind,
    namespace: Option<String>,
    interop: Interop,
    lists: watch::Lists,
    encoding: Encoding,
}

#[derive(Clone, Copy)]
enum Kind {
    ServiceImport,
    EndpointSlice,
    /// `--interop`: slices without MCS labels.
    ForeignSlice,
    /// `--interop`: Services.
    Service,
}

/// The watches for `src`, each its own source.
pub fn watches(src: &KubeSource) -> Vec<Watch> {
    let mut watches = Vec::new();
    for ns in watch::scopes(&src.namespaces) {
        let interop = [Kind::ForeignSlice, Kind::Service];
        let extra: &[Kind] = if src.interop.any() { &interop } else { &[] };
        for &kind in [Kind::ServiceImport, Kind::EndpointSlice].iter().chain(extra) {
            let what = match kind {
                Kind::ServiceImport => "ServiceImports",
                Kind::EndpointSlice => "EndpointSlices",
                Kind::ForeignSlice => "EndpointSlices without MCS labels",
                Kind::Service => "Services",
            };
            let scope =
                ns.as_deref().map_or_else(|| "all namespaces".to_owned(), |n| format!("namespace {n}"));
            watches.push(Watch {
                source: SourceId::Watch(watches.len() as u32),
                health: Arc::new(WatchHealth::new(format!("{what} ({scope})"))),
                kind,
                namespace: ns.clone(),
                interop: src.interop,
                lists: src.lists.clone(),
                encoding: src.encoding.clone(),
            });
        }
    }
    watches
}

/// Runs one watch forever, sending its updates to the store and listing
/// again when `relists` asks for its source; returns when the store is gone.
pub async fn run(watch: Watch, client: Client, updates: mpsc::Sender<Update>, relists: Relists) {
    let mut reporter = Reporter::new(watch.health.clone());
    let scope = watch.namespace.as_deref();
    let base = watcher::Config::default();
    let lists = &watch.lists;
    match watch.kind {
        Kind::EndpointSlice | Kind::ForeignSlice => {
            let (labels, convert): (String, Convert<SliceObject>) =
                if matches!(watch.kind, Kind::EndpointSlice) {
                    (LABEL_SERVICE_NAME.to_owned(), slice_object)
                } else if watch.interop.kosmos {
                    // Kosmos marks its copies by annotation only, so every
                    // Service's slices are listed; Karmada's are found by
                    // their controller.
                    (format!("{LABEL_K8S_SERVICE_NAME},!{LABEL_SERVICE_NAME}"), foreign_slice_object)
                } else {
                    let managed = format!("{KARMADA_SLICE_CONTROLLER},{KARMADA_DISPATCH_CONTROLLER}");
                    (format!("{LABEL_MANAGED_BY} in ({managed}),!{LABEL_SERVICE_NAME}"), foreign_slice_object)
                };
            let slices = watch.slices(client, labels);
            let to_store = watch.to_store(convert, slice_id, relists);
            let start = |streaming| protobuf::slices(slices.clone(), streaming);
            watch::relist_with(start, lists, reporter, to_store, updates).await;
        }
        Kind::Service => {
            let api: Api<Service> = watch::scoped(client, scope);
            let to_store = watch.to_store(service_object, service_id, relists);
            watch::relist(api, base, lists, reporter, to_store, updates).await;
        }
        Kind::ServiceImport => {
            let resource = discover_mcs(&client, "ServiceImport", "serviceimports", &mut reporter).await;
            let api: Api<WatchedImport> = watch::scoped_with(client, scope, &resource);
            let to_store = watch.to_store(import_object, import_id, relists);
            watch::relist(api, base, lists, reporter, to_store, updates).await;
        }
    }
}

impl Watch {
    /// The EndpointSlices of this watch's scope that `labels` selects.
    fn slices(&self, client: Client, labels: String) -> SliceWatch {
        let api: Api<EndpointSlice> = watch::scoped(client.clone(), self.namespace.as_deref());
        SliceWatch {
            url: api.resource_url().to_owned(),
            client,
            labels,
            page_size: self.lists.page_size().map(std::num::NonZeroU32::get),
            encoding: self.encoding.clone(),
            health: self.health.clone(),
        }
    }

    fn to_store<K>(
        &self,
        object: Convert<K>,
        id: fn(&K) -> Option<ObjectId>,
        relists: Relists,
    ) -> ToStore<K> {
        ToStore { source: self.source, interop: self.interop, object, id, relists }
    }
}

/// Converts one watched object: `Ok(None)` when it is not one the store
/// serves from (someone else's Service or slice, an FQDN slice).
type Convert<K> = fn(&K, Interop) -> Result<Option<Object>, String>;

/// A watch's objects as one store source: the list replaces the source's
/// state, changes upsert and remove.
struct ToStore<K> {
    source: SourceId,
    interop: Interop,
    object: Convert<K>,
    id: fn(&K) -> Option<ObjectId>,
    /// Where the store asks this source to list again.
    relists: Relists,
}

impl<K> ToStore<K> {
    fn convert(&self, k: &K) -> Option<Object> {
        match (self.object)(k, self.interop) {
            Ok(o) => o,
            Err(e) => {
                warn!(error = %e, "skipping object");
                None
            }
        }
    }
}

impl<K> Translate<K> for ToStore<K> {
    type Item = Object;
    type Message = Update;

    fn item(&self, k: &K) -> Option<Object> {
        self.convert(k)
    }

    fn part(&self, objects: &mut Vec<Object>, first: bool) -> Option<Update> {
        Some(Update::Part { source: self.source, objects: std::mem::take(objects), first })
    }

    fn listed(&self, objects: Vec<Object>, _: std::time::Instant) -> Update {
        Update::Replace { source: self.source, objects }
    }

    fn rest(&self, objects: Vec<Object>, _: std::time::Instant) -> Update {
        Update::LastPart { source: self.source, objects }
    }

    fn applied(&self, k: &K) -> Option<Update> {
        match (self.object)(k, self.interop) {
            Ok(Some(object)) => Some(Update::Upsert { source: self.source, object }),
            // No longer one the store serves from (a Service that lost its
            // annotation): gone, like a deleted one.
            Ok(None) => self.deleted(k),
            // An object that became invalid keeps its last good state.
            Err(e) => {
                warn!(error = %e, "skipping object");
                None
            }
        }
    }

    fn deleted(&self, k: &K) -> Option<Update> {
        Some(Update::Remove { source: self.source, id: (self.id)(k)? })
    }

    fn relist(&self) -> impl Future<Output = ()> + Send + '_ {
        let source = self.source;
        // A watch starting lists anyway: the asks made before are answered.
        self.relists.take(|s| s == source);
        async move {
            self.relists.asked(|s| s == source).await;
        }
    }
}

fn slice_object(s: &SliceObject, _: Interop) -> Result<Option<Object>, String> {
    match s.read(|v| convert::endpoint_slice(v), convert::endpoint_slice)? {
        Ok(SliceOutcome::Endpoints(set)) => Ok(Some(Object::Slice(set))),
        Ok(SliceOutcome::Fqdn) => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

fn foreign_slice_object(s: &SliceObject, interop: Interop) -> Result<Option<Object>, String> {
    match s.read(|v| interop::foreign_slice(v, interop), |j| interop::foreign_slice(j, interop))? {
        Ok(Some(SliceOutcome::Endpoints(set))) => Ok(Some(Object::Slice(set))),
        Ok(Some(SliceOutcome::Fqdn) | None) => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

fn service_object(s: &Service, interop: Interop) -> Result<Option<Object>, String> {
    interop::backing_service(s, interop).map(|b| b.map(Object::Service)).map_err(|e| e.to_string())
}

fn service_id(s: &Service) -> Option<ObjectId> {
    Some(ObjectId::Service(SliceKey {
        namespace: s.metadata.namespace.clone()?,
        name: s.metadata.name.clone()?,
    }))
}

fn slice_id(s: &SliceObject) -> Option<ObjectId> {
    let key = |namespace: Option<&str>, name: Option<&str>| {
        Some(SliceKey { namespace: namespace?.to_owned(), name: name?.to_owned() })
    };
    let key = s.read(|v| key(v.namespace(), v.name()), |j| key(j.namespace(), j.name())).ok()??;
    Some(ObjectId::Slice(key))
}

fn import_object(o: &WatchedImport, interop: Interop) -> Result<Option<Object>, String> {
    let spec = o.spec()?;
    interop::service_import_of(&o.metadata, &spec, interop)
        .map(|i| Some(Object::Import(i)))
        .map_err(|e| e.to_string())
}

fn import_id(o: &WatchedImport) -> Option<ObjectId> {
    Some(ObjectId::Import(ServiceKey {
        namespace: DnsLabel::parse(o.metadata.namespace.as_deref()?).ok()?,
        name: DnsLabel::parse(o.metadata.name.as_deref()?).ok()?,
    }))
}
