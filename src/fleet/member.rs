//! Member clusters: connecting to each, learning its cluster id, and
//! watching its ServiceExports, Services and EndpointSlices into
//! [`MemberEvent`]s.
//!
//! Like the ServiceImport source, every watch restarts with a complete list
//! after any error (so deletions during an outage are seen) and reports its
//! staleness in [`WatchHealth`].

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::watcher::{self, Event};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;
use tracing::{info, warn};

use super::objects::{self, LABEL_K8S_SERVICE_NAME};
use super::state::{Change, Delta, ExportInfo, MemberEvent, ServiceInfo};
use crate::model::{ClusterId, ServiceKey, SliceKey};
use crate::source::kube::{
    self as kube_source, BACKOFF_MAX, BACKOFF_MIN, ClientError, Connection, Reporter, WatchHealth,
};

/// The ClusterProperty naming a cluster (KEP-2149).
pub const CLUSTER_ID_PROPERTY: &str = "cluster.clusterset.k8s.io";

/// A member as configured: `--cluster NAME=KUBECONFIG`.
#[derive(Debug, Clone)]
pub struct MemberConfig {
    /// The member's name; its cluster id unless its ClusterProperty says otherwise.
    pub name: String,
    /// How to reach its API server.
    pub connection: Connection,
}

/// A connected member.
#[derive(Clone)]
pub struct Member {
    /// The configured name.
    pub name: String,
    /// Its cluster id.
    pub cluster: ClusterId,
    /// Its API client.
    pub client: Client,
    /// Health of its watches (exports, services, slices; per scope).
    pub health: Vec<Arc<WatchHealth>>,
}

impl Member {
    /// Seconds since the member's API last answered: the largest staleness
    /// of its watches (0 while all are current).
    pub fn stale_seconds(&self) -> f64 {
        self.health.iter().map(|h| h.stale_seconds()).fold(0.0, f64::max)
    }
}

/// Connects to a member and learns its cluster id: the value of its
/// `cluster.clusterset.k8s.io` ClusterProperty when it has one, else the
/// configured name. A member that does not answer within `timeout` keeps its
/// configured name (it is watched, and retried, all the same).
pub async fn connect(
    cfg: &MemberConfig,
    timeout: Duration,
    namespaces: &[String],
) -> Result<Member, ClientError> {
    let client = kube_source::client(&cfg.connection).await?;
    let fallback = || {
        ClusterId::parse(&cfg.name).map_err(|e| ClientError::Kubeconfig {
            path: format!("--cluster {}", cfg.name).into(),
            source: format!("member name: {e}").into(),
        })
    };
    let cluster = match tokio::time::timeout(timeout, cluster_property(&client)).await {
        Ok(Ok(Some(value))) => match ClusterId::parse(&value) {
            Ok(id) => id,
            Err(e) => {
                warn!(member = %cfg.name, "ClusterProperty {CLUSTER_ID_PROPERTY} {value:?} is not a cluster id ({e}); using the member name");
                fallback()?
            }
        },
        Ok(Ok(None)) => fallback()?,
        Ok(Err(e)) => {
            warn!(member = %cfg.name, "cannot read ClusterProperty {CLUSTER_ID_PROPERTY}: {e}; using the member name");
            fallback()?
        }
        Err(_) => {
            warn!(member = %cfg.name, "API server did not answer within {timeout:?}; using the member name as cluster id");
            fallback()?
        }
    };
    info!(member = %cfg.name, cluster = %cluster, "member");
    let mut health = Vec::new();
    for scope in scopes(namespaces) {
        let within = scope.map_or_else(String::new, |ns| format!(" in {ns}"));
        for what in ["ServiceExports", "Services", "EndpointSlices"] {
            health.push(Arc::new(WatchHealth::new(format!("{what}{within} of member {}", cfg.name))));
        }
    }
    Ok(Member { name: cfg.name.clone(), cluster, client, health })
}

/// KEP-2149's ClusterProperty (`about.k8s.io/v1alpha1`, cluster-scoped).
pub fn cluster_property_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("about.k8s.io", "v1alpha1", "ClusterProperty"),
        "clusterproperties",
    )
}

async fn cluster_property(client: &Client) -> Result<Option<String>, kube::Error> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &cluster_property_resource());
    match api.get_opt(CLUSTER_ID_PROPERTY).await {
        Ok(obj) => Ok(obj.and_then(|o| o.data.pointer("/spec/value")?.as_str().map(str::to_owned))),
        // No ClusterProperty CRD: the API answers 404 for the whole resource.
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        Err(e) => Err(e),
    }
}

/// The scopes watches run in: each namespace, or all namespaces at once.
pub fn scopes(namespaces: &[String]) -> Vec<Option<String>> {
    if namespaces.is_empty() { vec![None] } else { namespaces.iter().cloned().map(Some).collect() }
}

/// Starts the three watches of member `index` in every scope (see
/// [`scopes`]), sending to `events`. The member's health list has three
/// entries per scope, in that order.
pub fn spawn_watches(
    index: usize,
    member: &Member,
    namespaces: &[String],
    events: mpsc::Sender<MemberEvent>,
) {
    for (s, scope) in scopes(namespaces).into_iter().enumerate() {
        let health =
            |k: usize| member.health.get(s * 3 + k).cloned().unwrap_or_else(|| member.health[k].clone());
        let watcher = || Watcher {
            index,
            cluster: member.cluster.clone(),
            scope: scope.clone(),
            events: events.clone(),
        };
        let (exports, client, h) = (watcher(), member.client.clone(), health(0));
        tokio::spawn(async move {
            let mut reporter = Reporter { health: h, last_log: None };
            let resource =
                kube_source::discover_mcs(&client, "ServiceExport", "serviceexports", &mut reporter).await;
            let api: Api<DynamicObject> = match &exports.scope {
                Some(ns) => Api::namespaced_with(client, ns, &resource),
                None => Api::all_with(client, &resource),
            };
            exports.run(api, watcher::Config::default(), reporter, export_entry, Change::Exports).await;
        });
        let (services, client, h) = (watcher(), member.client.clone(), health(1));
        tokio::spawn(async move {
            let reporter = Reporter { health: h, last_log: None };
            let api = scoped(client, &services.scope);
            services.run(api, watcher::Config::default(), reporter, service_entry, Change::Services).await;
        });
        let (slices, client, h) = (watcher(), member.client.clone(), health(2));
        tokio::spawn(async move {
            let reporter = Reporter { health: h, last_log: None };
            let cfg = watcher::Config::default().labels(LABEL_K8S_SERVICE_NAME);
            let api = scoped(client, &slices.scope);
            slices.run(api, cfg, reporter, slice_entry, Change::Slices).await;
        });
    }
}

fn scoped<K>(client: Client, scope: &Option<String>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match scope {
        Some(ns) => Api::namespaced(client, ns),
        None => Api::all(client),
    }
}

type Entry<V> = (SliceKey, ServiceKey, V);

fn object_id<K: Resource>(k: &K) -> Option<SliceKey> {
    let m = k.meta();
    Some(SliceKey { namespace: m.namespace.clone()?, name: m.name.clone()? })
}

fn export_entry(cluster: &ClusterId, o: &DynamicObject) -> Option<Entry<ExportInfo>> {
    let key = objects::key_of(cluster, "ServiceExport", &o.metadata)
        .map_err(|e| warn!("skipping object: {e}"))
        .ok()?;
    let info = ExportInfo {
        exported_at: objects::exported_at(&o.metadata),
        ours: objects::is_ours(&o.metadata),
        annotations: objects::our_annotations(&o.metadata),
    };
    Some((object_id(o)?, key, info))
}

fn service_entry(cluster: &ClusterId, s: &Service) -> Option<Entry<ServiceInfo>> {
    // Services whose names are not DNS labels can never be exported; they
    // are not worth a warning each.
    let key = objects::key_of(cluster, "Service", &s.metadata).ok()?;
    let info = ServiceInfo {
        exported: objects::exported(cluster, s),
        auto_export: objects::asks_export(&s.metadata),
    };
    Some((object_id(s)?, key, info))
}

fn slice_entry(_: &ClusterId, s: &EndpointSlice) -> Option<Entry<Arc<EndpointSlice>>> {
    let key = objects::slice_service(s)?;
    Some((object_id(s)?, key, Arc::new(s.clone())))
}

struct Watcher {
    index: usize,
    cluster: ClusterId,
    scope: Option<String>,
    events: mpsc::Sender<MemberEvent>,
}

impl Watcher {
    /// Runs one watch until the receiver goes away, restarting it with a
    /// complete list after every error.
    async fn run<K, V>(
        self,
        api: Api<K>,
        cfg: watcher::Config,
        mut reporter: Reporter,
        entry: fn(&ClusterId, &K) -> Option<Entry<V>>,
        wrap: fn(Delta<V>) -> Change,
    ) where
        K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    {
        let mut backoff = BACKOFF_MIN;
        loop {
            let mut stream = std::pin::pin!(watcher::watcher(api.clone(), cfg.clone()));
            let mut buffer = Vec::new();
            let mut listed = false;
            while let Some(event) = stream.next().await {
                let delta = match event {
                    Err(e) => {
                        reporter.failed(&e.to_string());
                        break;
                    }
                    Ok(Event::Init) => {
                        buffer.clear();
                        continue;
                    }
                    Ok(Event::InitApply(k)) => {
                        buffer.extend(entry(&self.cluster, &k));
                        continue;
                    }
                    Ok(Event::InitDone) => {
                        listed = true;
                        info!(watch = %reporter.health.name, objects = buffer.len(), "watch listed");
                        Delta::Listed(self.scope.clone(), std::mem::take(&mut buffer))
                    }
                    Ok(Event::Apply(k)) => match entry(&self.cluster, &k) {
                        Some((id, key, v)) => Delta::Applied(id, key, v),
                        // No longer relevant (a slice lost its service label).
                        None => match object_id(&k) {
                            Some(id) => Delta::Deleted(id),
                            None => continue,
                        },
                    },
                    Ok(Event::Delete(k)) => match object_id(&k) {
                        Some(id) => Delta::Deleted(id),
                        None => continue,
                    },
                };
                let relisted = matches!(delta, Delta::Listed(..));
                if self.events.send(MemberEvent { member: self.index, change: wrap(delta) }).await.is_err() {
                    return;
                }
                if relisted {
                    reporter.ok();
                }
            }
            if listed {
                backoff = BACKOFF_MIN;
            }
            tokio::time::sleep(kube_source::jitter(backoff)).await;
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }
}
