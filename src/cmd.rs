//! The commands' composition roots (`serve`, `sync`, `agent`, `run`, `hub`,
//! `check`, `explain`, `doctor`, `setup-dns`): each connects the modules
//! into one command, and the loop that ties one command's parts together
//! lives here too: `serve`'s writer loop (updates in batches, one publish
//! per batch), the `select!` loops of `sync` and `agent` (signals; a change
//! of members, or in `sync` of a cluster id, restarts the controller), `setup-dns
//! --watch`'s checks with their metric and Events. What those loops decide
//! by is the modules': which update the memory budget admits is
//! `ops::memory::admission`, what a `--watch` check does
//! `cluster_dns::repair`.
//!
//! A running process has one [`Process`]: one metrics registry and one
//! record of failures, shared by every part of it (`run` is DNS and the
//! controller in one process, with one `/metrics` view).

pub mod agent;
pub mod check;
pub mod doctor;
pub mod explain;
pub mod hub;
pub mod run;
pub mod serve;
pub mod setup_dns;
pub mod sync;

use std::sync::Arc;

use prometheus::Registry;

use crate::fault::Failures;
use crate::ops::metrics;

/// What every part of one process shares.
#[derive(Clone)]
pub struct Process {
    /// The one metrics registry.
    pub registry: Registry,
    /// Panics caught, and the fatal failure once a task that cannot be
    /// restarted died: `/health` of every part fails then.
    pub failures: Arc<Failures>,
}

impl Process {
    /// A registry with `clusterset_dns_panics_total` in it.
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let failures = Failures::new();
        metrics::register_panics(&registry, failures.clone())?;
        Ok(Self { registry, failures })
    }
}
