//! Kubernetes watches as store sources: ServiceImports (v1beta1, or
//! v1alpha1 where the API server lacks it) and MCS EndpointSlices (label
//! `multicluster.kubernetes.io/service-name`), in all namespaces or a list.
//!
//! Each watch is one store source. Its first complete list (`InitDone`)
//! replaces the source's state and marks it synced; until every source has
//! synced the store is not ready (SERVFAIL for names not found, `/ready`
//! failing). A relist after an outage or a 410 Gone replaces the state
//! again, so objects deleted meanwhile disappear. While a watch fails, the
//! last known data keeps being served and [`WatchHealth`] says how stale it
//! is.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::{Stream, StreamExt};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::watcher::{self, Event};
use kube::{Client, Config};
use tokio::sync::mpsc;
use tracing::{info, warn};

use super::convert::{self, SliceOutcome};
use super::crd::{self, LABEL_SERVICE_NAME, MCS_GROUP, MCS_VERSIONS};
use crate::model::{DnsLabel, ServiceKey, SliceKey};
use crate::store::{Object, ObjectId, SourceId, Update};

/// How a failing watch is reported again while it stays down.
const STALE_LOG_EVERY: Duration = Duration::from_secs(30);
/// First wait after a watch error; doubled per failure up to the maximum.
pub(crate) const BACKOFF_MIN: Duration = Duration::from_millis(500);
/// Upper bound of the wait between attempts (watch or API discovery).
pub(crate) const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Where to reach the API server.
#[derive(Debug, Clone)]
pub enum Connection {
    /// A kubeconfig file, with an optional context.
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// The context; the file's current context when `None`.
        context: Option<String>,
    },
    /// The Pod's service account.
    InCluster,
}

/// What to watch.
#[derive(Debug, Clone)]
pub struct KubeSource {
    /// Where the API server is.
    pub connection: Connection,
    /// Namespaces to watch; all when empty.
    pub namespaces: Vec<String>,
}

/// Why the API server could not be reached at all.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The kubeconfig could not be read or used.
    #[error("kubeconfig {path}: {source}")]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// The error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// In-cluster configuration is missing (not running in a Pod).
    #[error("in-cluster configuration: {0}")]
    InCluster(#[from] kube::config::InClusterError),
    /// The client could not be built.
    #[error("Kubernetes client: {0}")]
    Client(#[from] kube::Error),
}

/// Builds a client for the connection (no request is made yet).
pub async fn client(connection: &Connection) -> Result<Client, ClientError> {
    let config = match connection {
        Connection::InCluster => Config::incluster()?,
        Connection::Kubeconfig { path, context } => {
            let fail = |e: Box<dyn std::error::Error + Send + Sync>| ClientError::Kubeconfig {
                path: path.clone(),
                source: e,
            };
            let file = kube::config::Kubeconfig::read_from(path).map_err(|e| fail(e.into()))?;
            let options = kube::config::KubeConfigOptions { context: context.clone(), ..Default::default() };
            Config::from_custom_kubeconfig(file, &options).await.map_err(|e| fail(e.into()))?
        }
    };
    Ok(Client::try_from(config)?)
}

/// The health of one watch, shared with the metrics endpoint.
#[derive(Debug)]
pub struct WatchHealth {
    /// What is watched, e.g. `ServiceImport (all namespaces)`.
    pub name: String,
    /// Unix time in ms since which the watch has been failing; 0 while healthy.
    stale_since_ms: AtomicU64,
    /// Watch errors seen.
    errors: AtomicU64,
}

impl WatchHealth {
    pub(crate) fn new(name: String) -> Self {
        Self { name, stale_since_ms: AtomicU64::new(0), errors: AtomicU64::new(0) }
    }

    /// Seconds since the watch started failing; 0 while it is healthy. The
    /// data served from it is at least this old.
    pub fn stale_seconds(&self) -> f64 {
        match self.stale_since_ms.load(Ordering::Relaxed) {
            0 => 0.0,
            since => now_ms().saturating_sub(since) as f64 / 1000.0,
        }
    }

    /// Errors seen since start.
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(1)
}

/// One planned watch.
pub struct Watch {
    /// Its store source.
    pub source: SourceId,
    /// Its health.
    pub health: Arc<WatchHealth>,
    kind: Kind,
    namespace: Option<String>,
}

#[derive(Clone, Copy)]
enum Kind {
    ServiceImport,
    EndpointSlice,
}

/// Plans the watches for `src`, numbering their sources from `first`.
pub fn plan(src: &KubeSource, first: u32) -> Vec<Watch> {
    let namespaces: Vec<Option<String>> = if src.namespaces.is_empty() {
        vec![None]
    } else {
        src.namespaces.iter().cloned().map(Some).collect()
    };
    let mut watches = Vec::new();
    for ns in namespaces {
        for kind in [Kind::ServiceImport, Kind::EndpointSlice] {
            let what = match kind {
                Kind::ServiceImport => "ServiceImports",
                Kind::EndpointSlice => "EndpointSlices",
            };
            let scope =
                ns.as_deref().map_or_else(|| "all namespaces".to_owned(), |n| format!("namespace {n}"));
            watches.push(Watch {
                source: SourceId(first + watches.len() as u32),
                health: Arc::new(WatchHealth::new(format!("{what} ({scope})"))),
                kind,
                namespace: ns.clone(),
            });
        }
    }
    watches
}

/// Runs one watch forever, sending its updates to the store.
///
/// After any watch error the watcher is started afresh (after a backoff), so
/// recovery always goes through a complete list: that list replaces the
/// source's state (what was deleted meanwhile disappears) and is the proof
/// that the data is current again. Re-watching from the last resource
/// version would give no such proof: a quiet watch delivers no event.
pub async fn run(watch: Watch, client: Client, updates: mpsc::Sender<Update>) {
    let mut reporter = Reporter { health: watch.health.clone(), last_log: None };
    let mut backoff = BACKOFF_MIN;
    let resource = match watch.kind {
        Kind::ServiceImport => Some(discover_service_import(&client, &mut reporter).await),
        Kind::EndpointSlice => None,
    };
    loop {
        let end = match &resource {
            None => {
                let api: Api<EndpointSlice> = match &watch.namespace {
                    Some(ns) => Api::namespaced(client.clone(), ns),
                    None => Api::all(client.clone()),
                };
                let cfg = watcher::Config::default().labels(LABEL_SERVICE_NAME);
                pump(
                    watcher::watcher(api, cfg),
                    watch.source,
                    &mut reporter,
                    &updates,
                    slice_object,
                    slice_id,
                )
                .await
            }
            Some(resource) => {
                let api: Api<DynamicObject> = match &watch.namespace {
                    Some(ns) => Api::namespaced_with(client.clone(), ns, resource),
                    None => Api::all_with(client.clone(), resource),
                };
                let stream = watcher::watcher(api, watcher::Config::default());
                pump(stream, watch.source, &mut reporter, &updates, import_object, import_id).await
            }
        };
        match end {
            End::StoreGone => return,
            End::Failed { listed } => {
                if listed {
                    backoff = BACKOFF_MIN;
                }
                tokio::time::sleep(jitter(backoff)).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
        }
    }
}

/// `d` plus up to 20 %, so that many servers do not retry in lockstep.
pub(crate) fn jitter(d: Duration) -> Duration {
    let spread = SystemTime::now().duration_since(UNIX_EPOCH).map(|t| t.subsec_nanos()).unwrap_or(0) % 200;
    d + d * spread / 1000
}

/// Finds the newest served ServiceImport version, retrying (and reporting)
/// until the CRD is installed.
async fn discover_service_import(client: &Client, reporter: &mut Reporter) -> ApiResource {
    discover_mcs(client, "ServiceImport", "serviceimports", reporter).await
}

/// Finds the newest served version of an MCS kind (`plural`), retrying (and
/// reporting) until its CRD is installed.
pub(crate) async fn discover_mcs(
    client: &Client,
    kind: &str,
    plural: &str,
    reporter: &mut Reporter,
) -> ApiResource {
    let mut wait = BACKOFF_MIN;
    loop {
        let mut last_error = String::new();
        for version in MCS_VERSIONS {
            let api_version = format!("{MCS_GROUP}/{version}");
            match client.list_api_group_resources(&api_version).await {
                Ok(list) if list.resources.iter().any(|r| r.name == plural) => {
                    info!(%api_version, watch = %reporter.health.name, "watching {kind}s");
                    reporter.ok();
                    return crd::mcs_resource(version, kind, plural);
                }
                Ok(_) => last_error = format!("{api_version} has no {plural}"),
                Err(e) => last_error = format!("{api_version}: {e}"),
            }
        }
        reporter.failed(&format!("{kind} API not found (is the CRD installed?): {last_error}"));
        tokio::time::sleep(jitter(wait)).await;
        wait = (wait * 2).min(BACKOFF_MAX);
    }
}

/// Logs watch failures and recoveries, and keeps the health figures.
pub(crate) struct Reporter {
    pub(crate) health: Arc<WatchHealth>,
    pub(crate) last_log: Option<Instant>,
}

impl Reporter {
    pub(crate) fn ok(&mut self) {
        let since = self.health.stale_since_ms.swap(0, Ordering::Relaxed);
        if since != 0 {
            let down = now_ms().saturating_sub(since) as f64 / 1000.0;
            info!(watch = %self.health.name, stale_seconds = down, "watch recovered; converging on the current state");
            self.last_log = None;
        }
    }

    pub(crate) fn failed(&mut self, error: &str) {
        self.health.errors.fetch_add(1, Ordering::Relaxed);
        let first = self
            .health
            .stale_since_ms
            .compare_exchange(0, now_ms(), Ordering::Relaxed, Ordering::Relaxed)
            .is_ok();
        let due = self.last_log.is_none_or(|t| t.elapsed() >= STALE_LOG_EVERY);
        if first || due {
            warn!(
                watch = %self.health.name,
                stale_seconds = self.health.stale_seconds(),
                %error,
                "watch failing; serving the last known data and retrying"
            );
            self.last_log = Some(Instant::now());
        }
    }
}

/// Why a watcher stream was left.
enum End {
    /// The store's channel closed: the server is shutting down.
    StoreGone,
    /// The watch failed; `listed` when it had completed a list first.
    Failed { listed: bool },
}

/// Turns watch events into store updates until the watch fails.
async fn pump<K, S>(
    stream: S,
    source: SourceId,
    reporter: &mut Reporter,
    updates: &mpsc::Sender<Update>,
    object: fn(&K) -> Result<Option<Object>, String>,
    id: fn(&K) -> Option<ObjectId>,
) -> End
where
    S: Stream<Item = Result<Event<K>, watcher::Error>>,
{
    let mut stream = std::pin::pin!(stream);
    let mut buffer: Vec<Object> = Vec::new();
    let mut listed = false;
    let convert = |k: &K| match object(k) {
        Ok(o) => o,
        Err(e) => {
            warn!("skipping object: {e}");
            None
        }
    };
    while let Some(event) = stream.next().await {
        let update = match event {
            Err(e) => {
                reporter.failed(&e.to_string());
                return End::Failed { listed };
            }
            Ok(Event::Init) => {
                buffer.clear();
                continue;
            }
            Ok(Event::InitApply(k)) => {
                buffer.extend(convert(&k));
                continue;
            }
            Ok(Event::InitDone) => {
                let objects = std::mem::take(&mut buffer);
                info!(watch = %reporter.health.name, objects = objects.len(), "watch listed");
                listed = true;
                Update::Replace { source, objects }
            }
            Ok(Event::Apply(k)) => {
                // An object that became invalid keeps its last good state.
                let Some(object) = convert(&k) else { continue };
                Update::Upsert { source, object }
            }
            Ok(Event::Delete(k)) => {
                let Some(id) = id(&k) else { continue };
                Update::Remove { source, id }
            }
        };
        let replaced = matches!(update, Update::Replace { .. });
        if updates.send(update).await.is_err() {
            return End::StoreGone;
        }
        if replaced {
            // Current again only once the complete list is in the store.
            reporter.ok();
        }
    }
    // A watcher stream does not end by itself; treat it as a failure.
    End::Failed { listed }
}

fn slice_object(s: &EndpointSlice) -> Result<Option<Object>, String> {
    match convert::endpoint_slice(s) {
        Ok(SliceOutcome::Endpoints(set)) => Ok(Some(Object::Slice(set))),
        Ok(SliceOutcome::Fqdn) => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

fn slice_id(s: &EndpointSlice) -> Option<ObjectId> {
    Some(ObjectId::Slice(SliceKey {
        namespace: s.metadata.namespace.clone()?,
        name: s.metadata.name.clone()?,
    }))
}

fn import_object(o: &DynamicObject) -> Result<Option<Object>, String> {
    let name = |o: &DynamicObject| {
        format!(
            "ServiceImport {}/{}",
            o.metadata.namespace.as_deref().unwrap_or(""),
            o.metadata.name.as_deref().unwrap_or("")
        )
    };
    let spec = o.data.get("spec").cloned().unwrap_or_default();
    let spec: crd::ServiceImportSpec = serde_path_to_error::deserialize(spec)
        .map_err(|e| format!("{}: spec.{}: {}", name(o), e.path(), e.inner()))?;
    let import = crd::ServiceImport { metadata: o.metadata.clone(), spec };
    convert::service_import(&import).map(|i| Some(Object::Import(i))).map_err(|e| e.to_string())
}

fn import_id(o: &DynamicObject) -> Option<ObjectId> {
    Some(ObjectId::Import(ServiceKey {
        namespace: DnsLabel::parse(o.metadata.namespace.as_deref()?).ok()?,
        name: DnsLabel::parse(o.metadata.name.as_deref()?).ok()?,
    }))
}
