//! The Kubernetes layer: everything that talks to an API server, shared by
//! the store's sources (`source/`), the members of the fleet (`fleet/`) and
//! the sync controller (`controller/`). It knows the model (it converts API
//! objects into model values) and nothing above it.
//!
//! - `client`: where an API server is, and a client for it.
//! - `watch`: the one relist-after-error watcher, with its health.
//! - `throttle`: the client-side rate limit (a token bucket layer).
//! - `fence`: a write gate open until a deadline, checked at the wire.
//! - `mcs`: the MCS API group, its labels, ClusterProperty, version discovery.
//! - `crd`: the ServiceImport object, reduced to the fields DNS uses.
//! - `convert`: API object → model value, or an error naming object and field.
//! - `digest`: the digest of a body written, to skip writing it again.
//! - `inventory`: ClusterProfiles (KEP-4322) and their access providers (KEP-5339).
//! - `interop`: the same for Karmada's and Kosmos's shapes (`--interop`).

pub mod client;
pub mod convert;
pub mod crd;
pub mod digest;
pub mod fence;
pub mod interop;
pub mod inventory;
pub mod mcs;
pub mod protobuf;
pub mod throttle;
pub mod watch;
