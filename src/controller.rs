//! The MCS sync controller (`clusterset-dns sync`): every member's
//! ServiceExports → a ServiceImport, MCS EndpointSlices and a clusterset
//! VIP in every member that has the namespace, and the KEP's conditions on
//! every ServiceExport. A separate path from DNS: it writes Kubernetes
//! objects and never touches the store.
//!
//! - `desired`: the objects to keep, pure functions of the merged import.
//! - `own`: watches of our own objects, so what someone else deletes or
//!   edits is written again.
//! - `sync`: the event loop: fleet state → reconcile of touched services.

pub mod desired;
pub mod own;
pub mod sync;
