//! Everything that feeds the store. A source turns Kubernetes objects into
//! model values (`k8s::convert`) and hands them to the store's writer as
//! [`crate::store::Update`]s; it never builds answers.
//!
//! - `objects`: multi-document YAML/JSON as `kubectl get -o yaml` writes it.
//! - `files`: `--objects PATH` sources, watched and reloaded on change.
//! - `embedded`: the example fleet in `zones/`, served when no source is given.
//! - `kube`: ServiceImport and MCS EndpointSlice watches of one cluster.
//! - `centralized`: centralized mode, every member's exports as one source.
//! - `hub`: centralized mode from a hub's ExportRecords, one watch for the fleet.

pub mod centralized;
pub mod embedded;
pub mod files;
pub mod hub;
pub mod kube;
pub mod objects;

/// The members' liveness as `/metrics` reads it at scrape time
/// (`clusterset_dns_cluster_alive`), whichever source follows them.
pub trait MembersAlive: Send + Sync {
    /// Each member's cluster id and whether it is alive now.
    fn alive(&self) -> Vec<(crate::model::ClusterId, bool)>;
}
