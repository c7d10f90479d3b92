//! The one way this program watches Kubernetes: a relist-after-error loop
//! with health and staleness reporting, shared by the store's sources, the
//! centralized members and the sync controller.
//!
//! After any watch error the watcher is started afresh (after a backoff), so
//! recovery always goes through a complete list: that list replaces what the
//! consumer held (what was deleted meanwhile disappears) and is the proof
//! that the data is current again. Re-watching from the last resource
//! version would give no such proof: a quiet watch delivers no event. While
//! a watch fails, [`WatchHealth`] says how stale its data is.
//!
//! What a watch sends is its consumer's business ([`Translate`]); this
//! module knows nothing of the store or the fleet.

use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::{FutureExt, Stream, StreamExt};
use kube::Client;
use kube::Resource;
use kube::api::{Api, ApiResource};
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;
use tracing::{info, warn};

/// How a failing watch is reported again while it stays down.
const STALE_LOG_EVERY: Duration = Duration::from_secs(30);
/// First wait after a watch error; doubled per failure up to the maximum.
pub(super) const BACKOFF_MIN: Duration = Duration::from_millis(500);
/// Upper bound of the wait between attempts (watch or API discovery).
pub(super) const BACKOFF_MAX: Duration = Duration::from_secs(30);

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
    /// A healthy watch named `name` (what it watches, for logs and metrics).
    pub fn new(name: String) -> Self {
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

/// `d` plus up to 20 %, so that many servers do not retry in lockstep.
pub(super) fn jitter(d: Duration) -> Duration {
    let spread = SystemTime::now().duration_since(UNIX_EPOCH).map(|t| t.subsec_nanos()).unwrap_or(0) % 200;
    d + d * spread / 1000
}

/// Logs watch failures and recoveries, and keeps the health figures.
pub struct Reporter {
    health: Arc<WatchHealth>,
    last_log: Option<Instant>,
}

impl Reporter {
    /// Reports into `health`.
    pub fn new(health: Arc<WatchHealth>) -> Self {
        Self { health, last_log: None }
    }

    /// What is watched (the health's name).
    pub fn name(&self) -> &str {
        &self.health.name
    }

    /// The watch (or discovery) is current again.
    pub fn ok(&mut self) {
        let since = self.health.stale_since_ms.swap(0, Ordering::Relaxed);
        if since != 0 {
            let down = now_ms().saturating_sub(since) as f64 / 1000.0;
            info!(watch = %self.health.name, stale_seconds = down, "watch recovered; converging on the current state");
            self.last_log = None;
        }
    }

    /// The watch (or discovery) failed with `error`; logged at once, then at
    /// most every [`STALE_LOG_EVERY`] while it stays down.
    pub fn failed(&mut self, error: &str) {
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

/// The scopes watches run in: each namespace, or all namespaces at once.
pub fn scopes(namespaces: &[String]) -> Vec<Option<String>> {
    if namespaces.is_empty() { vec![None] } else { namespaces.iter().cloned().map(Some).collect() }
}

/// An API of a built-in namespaced kind in one scope (a namespace, or all).
pub fn scoped<K>(client: Client, scope: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match scope {
        Some(ns) => Api::namespaced(client, ns),
        None => Api::all(client),
    }
}

/// An API of a dynamic kind (a discovered MCS version) in one scope.
pub fn scoped_with<K>(client: Client, scope: Option<&str>, resource: &ApiResource) -> Api<K>
where
    K: Resource<DynamicType = ApiResource, Scope = kube::core::DynamicResourceScope>,
{
    match scope {
        Some(ns) => Api::namespaced_with(client, ns, resource),
        None => Api::all_with(client, resource),
    }
}

/// What one watch makes of its objects. The relist loop is the same for
/// every watch; what it sends, and what an object that cannot be used
/// means, is the consumer's.
pub trait Translate<K>: Send {
    /// A listed object as kept until its list is complete.
    type Item: Send;
    /// What the watch sends.
    type Message: Send;
    /// One object of a list; `None` leaves it out.
    fn item(&self, object: &K) -> Option<Self::Item>;
    /// A complete list (the first, or a relist): it replaces what the
    /// consumer held from this watch.
    fn listed(&self, items: Vec<Self::Item>) -> Self::Message;
    /// An object added or changed; `None` sends nothing.
    fn applied(&self, object: &K) -> Option<Self::Message>;
    /// An object deleted; `None` sends nothing.
    fn deleted(&self, object: &K) -> Option<Self::Message>;
}

/// Runs one watch until `out`'s receiver is gone, restarting it with a
/// complete list (after a backoff) after every error.
pub async fn relist<K, T>(
    api: Api<K>,
    config: watcher::Config,
    mut reporter: Reporter,
    translate: T,
    out: mpsc::Sender<T::Message>,
) where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    T: Translate<K>,
{
    let mut backoff = BACKOFF_MIN;
    loop {
        let stream = watcher::watcher(api.clone(), config.clone());
        // A panic while translating an object (a bug, never an input we
        // expect) is a watch failure like any other: reported, then a
        // relist after the backoff. Whoever spawned the watch never sees
        // it die.
        let run =
            std::panic::AssertUnwindSafe(pump(stream, &mut reporter, &translate, &out)).catch_unwind().await;
        let end = run.unwrap_or_else(|payload| {
            let message = payload
                .downcast_ref::<&str>()
                .copied()
                .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
                .unwrap_or("(no message)");
            reporter.failed(&format!("panicked: {message}"));
            End::Failed { listed: false }
        });
        match end {
            End::Closed => return,
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

/// Why a watcher stream was left.
enum End {
    /// The receiver is gone: the consumer is shutting down.
    Closed,
    /// The watch failed; `listed` when it had completed a list first.
    Failed { listed: bool },
}

/// Turns watch events into messages until the watch fails.
async fn pump<K, S, T>(
    stream: S,
    reporter: &mut Reporter,
    translate: &T,
    out: &mpsc::Sender<T::Message>,
) -> End
where
    S: Stream<Item = Result<Event<K>, watcher::Error>>,
    T: Translate<K>,
{
    let mut stream = std::pin::pin!(stream);
    let mut buffer = Vec::new();
    let mut listed = false;
    while let Some(event) = stream.next().await {
        let (message, complete) = match event {
            Err(e) => {
                reporter.failed(&e.to_string());
                return End::Failed { listed };
            }
            Ok(Event::Init) => {
                buffer.clear();
                continue;
            }
            Ok(Event::InitApply(k)) => {
                buffer.extend(translate.item(&k));
                continue;
            }
            Ok(Event::InitDone) => {
                let items = std::mem::take(&mut buffer);
                info!(watch = %reporter.name(), objects = items.len(), "watch listed");
                listed = true;
                (translate.listed(items), true)
            }
            Ok(Event::Apply(k)) => match translate.applied(&k) {
                Some(m) => (m, false),
                None => continue,
            },
            Ok(Event::Delete(k)) => match translate.deleted(&k) {
                Some(m) => (m, false),
                None => continue,
            },
        };
        if out.send(message).await.is_err() {
            return End::Closed;
        }
        if complete {
            // Current again only once the complete list is delivered.
            reporter.ok();
        }
    }
    // A watcher stream does not end by itself; treat it as a failure.
    End::Failed { listed }
}
