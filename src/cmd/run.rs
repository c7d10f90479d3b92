//! `run`: DNS and the sync controller in one process, sharing one
//! [`Process`] (one metrics registry, one record of failures: a fatal
//! failure of either part fails `/health` of both and ends the process).

use super::{Process, serve, sync};
use crate::config::RunConfig;

/// Runs both parts. Each handles SIGTERM and SIGINT itself (lameduck for
/// DNS, Lease release for the controller); the process ends when both have
/// stopped, or when either fails.
pub async fn run(cfg: RunConfig) -> anyhow::Result<()> {
    let process = Process::new()?;
    let dns = serve::run_in(cfg.serve, process.clone());
    let controller = async { sync::run_in(cfg.sync, process.clone()).await.map_err(anyhow::Error::from) };
    tokio::try_join!(dns, controller)?;
    Ok(())
}
