//! Where an API server is ([`Connection`]) and a client for it: a kubeconfig
//! file (with an optional context) or the Pod's service account. Every
//! command connects through here, so every one reads kubeconfigs the same way.

use std::path::PathBuf;
use std::sync::Arc;

use kube::client::ClientBuilder;
use kube::{Client, Config};

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
pub async fn connect(connection: &Connection) -> Result<Client, ClientError> {
    Ok(Client::try_from(config(connection).await?)?)
}

/// [`connect`], every request of the client (and of its clones) first
/// taking a token of its own bucket (`limits`); `stats` counts the waits,
/// `name` says whose they are in the log.
pub async fn connect_limited(
    connection: &Connection,
    limits: Limits,
    name: &str,
    stats: Arc<ThrottleStats>,
) -> Result<Client, ClientError> {
    let builder = ClientBuilder::try_from(config(connection).await?)?;
    Ok(builder.with_layer(&ThrottleLayer::new(limits, name, stats)).build())
}

async fn config(connection: &Connection) -> Result<Config, ClientError> {
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
    Ok(config)
}
