//! The MCS sync controller (`clusterset-dns sync`): every member's
//! ServiceExports → a ServiceImport, MCS EndpointSlices and a clusterset
//! VIP in every member that has the namespace, and the KEP's conditions on
//! every ServiceExport. A separate path from DNS: it writes Kubernetes
//! objects and never touches the store.
//!
//! - `desired`: the objects to keep, pure functions of the merged import.
//! - `reconcile`: one service in every member, each member in its own lane.
//! - `api`: every member write behind one trait, with deadlines.
//! - `link`: what the controller needs of one member, behind one trait.
//! - `adopt`: our objects read whole from a member, to repair drift.
//! - `shard`: services split between replicas by a stable hash.
//! - `election`: which replica leads which shard, on Leases.
//! - `own`: watches of our own objects, so what someone else deletes or
//!   edits is written again.
//! - `queue`: which service is reconciled next, and retries.
//! - `stats`: what the controller did, for `/metrics`.
//! - `syncer`: the event loop: fleet state → reconciles of touched services.

pub mod adopt;
pub mod api;
pub mod desired;
pub mod election;
pub mod link;
pub mod own;
pub mod queue;
pub mod reconcile;
pub mod shard;
pub mod stats;
pub mod syncer;
