//! Hub mode: each member's agent publishes what its cluster exports on a
//! hub cluster (a Kubernetes API server used as the fleet's store), in a
//! namespace of its own, and reads every member's records from there.
//!
//! - `record`: the ExportRecord: one per export, how it is built and read.
//! - `follow`: a member's records read back as its objects' events.
//! - `publish`: a member's exports kept as records in its hub namespace.
//! - `heartbeat`: a member's liveness and its claim on its name; the
//!   members on the hub.
//! - `enrol`: a member's namespace and hub identity, and the hub's objects.
pub mod enrol;
pub mod follow;
pub mod heartbeat;
pub mod publish;
pub mod record;
