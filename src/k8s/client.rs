//! Where an API server is ([`Connection`]) and a client for it: a kubeconfig
//! file (with an optional context), one built in memory (a ClusterProfile's
//! member, `k8s::inventory`) or the Pod's service account. Every command
//! connects through here, so every one reads kubeconfigs the same way and
//! every client gets the same User-Agent, retries and rate limit.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kube::client::ClientBuilder;
use kube::client::retry::RetryPolicy;
use kube::{Client, Config};
use tower::buffer::BufferLayer;
use tower::retry::RetryLayer;

use super::fence::FenceLayer;
use super::throttle::{Limits, ThrottleLayer, ThrottleStats};

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
    /// A kubeconfig built in memory, its current context used; `origin`
    /// says where it came from (in errors), e.g. `ClusterProfile ns/name`.
    Inline {
        /// Where it came from.
        origin: String,
        /// The kubeconfig.
        kubeconfig: Box<kube::config::Kubeconfig>,
    },
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
    /// A kubeconfig built in memory could not be used.
    #[error("{origin}: {source}")]
    Inline {
        /// Where it came from.
        origin: String,
        /// The error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// In-cluster configuration is missing (not running in a Pod).
    #[error("in-cluster configuration: {0}")]
    InCluster(#[from] kube::config::InClusterError),
    /// The client could not be built.
    #[error("Kubernetes client: {0}")]
    Client(#[from] kube::Error),
    /// The retry policy was refused (a build defect).
    #[error("Kubernetes client retries: {0}")]
    Retry(String),
}

/// Builds a client for the connection (no request is made yet). Requests
/// refused with 429, 503 or 504 are retried as [`connect_limited`]'s are,
/// never with kube's default policy (minutes for one request; see there).
/// `agent` names the caller in the User-Agent ([`user_agent`]).
pub async fn connect(connection: &Connection, agent: &str) -> Result<Client, ClientError> {
    let mut config = config(connection, agent).await?;
    config.default_retry = false;
    Ok(ClientBuilder::try_from(config)?
        .with_layer(&BufferLayer::new(1024))
        .with_layer(&RetryLayer::new(retry_policy()?))
        .build())
}

/// A client of a member the sync controller writes: [`connect`] with the
/// write fence at the wire ([`super::fence`]) always, and with `limits`,
/// every request of the client (and of its clones), and every retry of
/// one, first taking a token of its own bucket; `stats` counts the waits,
/// `name` says whose they are in the log.
///
/// The retries of 429, 503 and 504 are ours, not kube's default: kube's
/// (`RetryPolicy::server_retry`) makes 15 attempts whose backoff doubles from
/// 5 ms to 1,000 s with up to 2× jitter on top, so against an API server that
/// refuses most requests one request waited minutes, and the controller with
/// it (measured: `sync_throttle`, 30 services, nothing written for 4 min).
/// Ours waits at least the server's Retry-After, and at most `RETRY_MAX`
/// between attempts, `RETRIES` times; a request still refused then fails
/// its reconcile, which the controller retries with its own backoff. Retries
/// are outside the bucket, so they take tokens too (as client-go's): the rate
/// limit bounds what the API server sees, retries included.
pub async fn connect_limited(
    connection: &Connection,
    agent: &str,
    limits: Option<Limits>,
    name: &str,
    stats: Arc<ThrottleStats>,
) -> Result<Client, ClientError> {
    let mut config = config(connection, agent).await?;
    config.default_retry = false;
    limited(ClientBuilder::try_from(config)?, limits, name, stats)
}

/// The stack of [`connect_limited`] over `builder`'s (kube's own, or a
/// test's in-process API server). From the outside in: retries of 429, 503
/// and 504; a buffer (retry needs a service it can clone; kube's stack is
/// not one); the rate limit (with `limits`), whose wait happens in the
/// buffer's worker; and innermost the write fence ([`super::fence`]), so
/// each attempt of a fenced write is checked after its token was waited
/// for, just before it is sent.
pub fn limited<S, B>(
    builder: ClientBuilder<S>,
    limits: Option<Limits>,
    name: &str,
    stats: Arc<ThrottleStats>,
) -> Result<Client, ClientError>
where
    S: tower::Service<http::Request<kube::client::Body>, Response = http::Response<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<tower::BoxError>,
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<tower::BoxError>,
{
    let throttle = limits.map(|l| ThrottleLayer::new(l, name, stats));
    Ok(builder
        .with_layer(&FenceLayer::default())
        .with_layer(&tower::util::option_layer(throttle))
        .with_layer(&BufferLayer::new(1024))
        .with_layer(&RetryLayer::new(retry_policy()?))
        .build())
}

fn retry_policy() -> Result<RetryPolicy, ClientError> {
    RetryPolicy::new(RETRY_MIN, RETRY_MAX, RETRIES, true).map_err(|e| ClientError::Retry(e.to_string()))
}

/// The first wait before a retry of a throttled request (the server's
/// Retry-After, 1 s from kube-apiserver, wins when longer).
const RETRY_MIN: Duration = Duration::from_millis(100);
/// The longest wait between two attempts of one request.
const RETRY_MAX: Duration = Duration::from_secs(2);
/// Retries of one request before it fails.
const RETRIES: u32 = 10;

/// The User-Agent of every request: `clusterset-dns/VERSION (OS/ARCH) AGENT`,
/// the shape client-go gives its binaries, so an API server's audit log and
/// request metrics tell our commands, and `sync` replicas (`sync/IDENTITY`),
/// apart.
pub fn user_agent(agent: &str) -> String {
    format!(
        "clusterset-dns/{} ({}/{}) {agent}",
        env!("CARGO_PKG_VERSION"),
        std::env::consts::OS,
        std::env::consts::ARCH
    )
}

async fn config(connection: &Connection, agent: &str) -> Result<Config, ClientError> {
    let mut config = match connection {
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
        Connection::Inline { origin, kubeconfig } => {
            Config::from_custom_kubeconfig((**kubeconfig).clone(), &Default::default())
                .await
                .map_err(|e| ClientError::Inline { origin: origin.clone(), source: e.into() })?
        }
    };
    // Only characters a header value may hold: an identity is the user's.
    let agent: String =
        user_agent(agent).chars().map(|c| if c.is_ascii_graphic() || c == ' ' { c } else { '_' }).collect();
    if let Ok(value) = agent.parse() {
        config.headers.push((http::header::USER_AGENT, value));
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::Mutex;

    use kube::client::Body;
    use tokio::time::Instant;

    use super::*;
    use crate::k8s::fence::{AUDIT_ID, Fence, WriteFence, is_fenced};

    /// What reached the API server: when, and its Audit-ID.
    type Seen = Arc<Mutex<Vec<(Duration, String)>>>;

    type Server =
        ClientBuilder<tower::util::BoxService<http::Request<Body>, http::Response<Body>, Infallible>>;

    /// An API server in process: the first `refuse` requests get 429 with
    /// `Retry-After: 1`, the rest 200; each is recorded with the paused
    /// clock's time and its Audit-ID.
    fn server(refuse: usize) -> (Server, Seen) {
        let seen: Arc<Mutex<Vec<(Duration, String)>>> = Arc::default();
        let (log, start) = (seen.clone(), Instant::now());
        let svc = tower::service_fn(move |req: http::Request<Body>| {
            let id = req.headers().get(AUDIT_ID).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
            let mut log = log.lock().unwrap();
            log.push((start.elapsed(), id));
            let response = if log.len() <= refuse {
                http::Response::builder()
                    .status(429)
                    .header("Retry-After", "1")
                    .body(Body::from(b"{}".to_vec()))
            } else {
                http::Response::builder().status(200).body(Body::from(b"{}".to_vec()))
            };
            std::future::ready(Ok::<_, Infallible>(response.unwrap()))
        });
        (ClientBuilder::new(tower::util::BoxService::new(svc), "default"), seen)
    }

    fn write(fence: &Arc<Fence>) -> http::Request<Vec<u8>> {
        let mut r = http::Request::patch("/api/v1/namespaces/ns/services/web").body(b"{}".to_vec()).unwrap();
        r.extensions_mut().insert(WriteFence::new(fence.clone(), 0));
        r
    }

    /// The fence is checked at the wire, after the rate limit's wait: of
    /// twenty writes queued at once behind one token a second, under a
    /// tenure that ends at 4.5 s, the five that reach the wire before are
    /// sent and the rest refused, each where it would have been sent. (With
    /// the fence checked only before the queue, all twenty were sent, over
    /// twenty seconds.)
    #[tokio::test(start_paused = true)]
    async fn writes_reaching_the_wire_after_the_tenure_are_refused_there() {
        let (builder, seen) = server(0);
        let client = limited(builder, Some(Limits { qps: 1.0, burst: 1 }), "m", Arc::default()).unwrap();
        let fence = Arc::new(Fence::closed());
        fence.held(Instant::now(), Duration::from_secs(5));
        let sends = (0..20).map(|_| client.request_text(write(&fence)));
        let results = futures::future::join_all(sends).await;
        let sent = seen.lock().unwrap().clone();
        assert_eq!(sent.iter().map(|(t, _)| t.as_secs()).collect::<Vec<_>>(), [0, 1, 2, 3, 4], "{sent:?}");
        assert!(sent.iter().all(|(_, id)| id.starts_with("fence-0-")), "{sent:?}");
        let refused = results.iter().filter(|r| r.as_ref().is_err_and(is_fenced)).count();
        assert_eq!(refused, 15, "{results:?}");
    }

    /// Each attempt is checked: a write refused with 429 and retried after
    /// the tenure ended is not sent again.
    #[tokio::test(start_paused = true)]
    async fn a_retry_after_the_tenure_is_refused_at_the_wire() {
        let (builder, seen) = server(3);
        let client = limited(builder, Some(Limits { qps: 100.0, burst: 10 }), "m", Arc::default()).unwrap();
        let fence = Arc::new(Fence::closed());
        fence.held(Instant::now(), Duration::from_millis(2800));
        let r = client.request_text(write(&fence)).await;
        assert!(r.as_ref().is_err_and(is_fenced), "{r:?}");
        let sent = seen.lock().unwrap().clone();
        // Attempts at 0, 1 and 2 s (Retry-After: 1 each); the fourth, at
        // 3 s, is past the tenure (2.3 s).
        assert_eq!(sent.iter().map(|(t, _)| t.as_secs()).collect::<Vec<_>>(), [0, 1, 2], "{sent:?}");
        let ids: std::collections::BTreeSet<&String> = sent.iter().map(|(_, id)| id).collect();
        assert_eq!(ids.len(), 3, "each attempt stamped when it passed: {sent:?}");
    }
}
