//! The MCS sync controller (`clusterset-dns sync`): every member's
//! ServiceExports → a ServiceImport, MCS EndpointSlices and a clusterset
//! VIP in every member that has the namespace, and the KEP's conditions on
//! every ServiceExport. A separate path from DNS: it writes Kubernetes
//! objects and never touches the store.
//!
//! - `desired`: the objects to keep, pure functions of the merged import.
//! - `sync`: the event loop: fleet state → reconcile of touched services.

pub mod desired;
pub mod sync;
