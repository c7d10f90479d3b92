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

/// [`connect`], every request of the client (and of its clones), and every
/// retry of one, first taking a token of its own bucket (`limits`); `stats`
/// counts the waits, `name` says whose they are in the log.
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
    limits: Limits,
    name: &str,
    stats: Arc<ThrottleStats>,
) -> Result<Client, ClientError> {
    let mut config = config(connection, agent).await?;
    config.default_retry = false;
    Ok(ClientBuilder::try_from(config)?
        .with_layer(&ThrottleLayer::new(limits, name, stats))
        // Retry needs a service it can clone; kube's stack is not one.
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
