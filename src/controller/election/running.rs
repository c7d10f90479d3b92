//! The election on a thread and runtime of its own ([`spawn`]), and its
//! client of the Leases' cluster, never shared with the members'.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::{oneshot, watch};
use tracing::error;

use super::{ElectionConfig, ElectionError, ElectionStatus, Elector, KubeLeases, LeaseApi};
use crate::controller::shard::Shards;
use crate::fault::{Failures, Task, panic_message};
use crate::k8s::client::{self, Connection};

/// Connects to the Leases' cluster, on the election's own runtime.
pub type Connect = Box<dyn FnOnce() -> BoxFuture<'static, Result<Arc<dyn LeaseApi>, String>> + Send>;

/// [`Connect`] for the Leases of `namespace` in the cluster of
/// `connection`: a client of their own, never shared with the members'
/// (whose requests wait in a rate limit), so a renewal never queues behind
/// a member write.
pub fn connect_leases(connection: Connection, agent: String, namespace: String) -> Connect {
    Box::new(move || {
        Box::pin(async move {
            let client = client::connect(&connection, &agent).await.map_err(|e| e.to_string())?;
            Ok(Arc::new(KubeLeases::new(client, &namespace)) as Arc<dyn LeaseApi>)
        })
    })
}

/// An election running on a thread of its own ([`spawn`]).
pub struct Running {
    stop: watch::Sender<bool>,
    ended: Option<oneshot::Receiver<Result<(), ElectionError>>>,
}

impl Running {
    /// Resolves when the election ends on its own: refused (another
    /// `--shards`) or unable to connect. Pending while it runs.
    pub async fn refused(&mut self) -> ElectionError {
        let ended = match self.ended.as_mut() {
            Some(ended) => ended.await,
            None => return std::future::pending().await,
        };
        self.ended = None;
        match ended {
            Ok(Err(e)) => e,
            // Stopped, or died: a panic is recorded in the failures.
            Ok(Ok(())) | Err(_) => std::future::pending().await,
        }
    }

    /// Stops the election: every shard's fence closed, its Lease released,
    /// this replica's own Lease deleted. Waits up to `wait` for that.
    pub async fn stop(self, wait: Duration) {
        let _ = self.stop.send(true);
        if let Some(ended) = self.ended {
            let _ = tokio::time::timeout(wait, ended).await;
        }
    }
}

/// Runs the election of `cfg` on a thread named `election` with a runtime
/// of its own: nothing the controller does on its runtime can delay a
/// check. A panic there is counted and fatal (`failures`): `/health`
/// fails and `sync` exits, and another replica takes the shards once their
/// Leases run out (their fences close here on their own).
pub fn spawn(
    cfg: ElectionConfig,
    connect: Connect,
    shards: Arc<Shards>,
    status: Arc<ElectionStatus>,
    failures: Arc<Failures>,
) -> std::io::Result<Running> {
    let (stop, stop_rx) = watch::channel(false);
    let (ended_tx, ended) = oneshot::channel();
    std::thread::Builder::new().name("election".into()).spawn(move || {
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| ElectionError::Connect(format!("the election's runtime: {e}")))?;
            runtime.block_on(async move {
                let api = connect().await.map_err(ElectionError::Connect)?;
                Elector::new(cfg, api, shards, status).run(stop_rx).await
            })
        }));
        match run {
            Ok(r) => {
                let _ = ended_tx.send(r);
            }
            Err(payload) => {
                failures.panicked(Task::Election);
                let reason = format!(
                    "task {} panicked and cannot be restarted: {}",
                    Task::Election.name(),
                    panic_message(&*payload)
                );
                error!("{reason}; the server fails /health and exits");
                failures.fatal(reason);
            }
        }
    })?;
    Ok(Running { stop, ended: Some(ended) })
}
