//! The record store: the only mutable state on the answering side.
//!
//! One [`Writer`] owns the model (every source's objects) and publishes
//! immutable [`Snapshot`]s; any number of [`Reader`]s load the current one
//! without a lock (arc-swap). A snapshot holds answers already encoded in
//! wire format, so answering is lookup plus copy; the exceptions, endpoint
//! names' A/AAAA records and PTR records, are written from compact data
//! (`hosts`), a few bytes each.
//!
//! **Invariant:** a snapshot is never modified after it is published; a
//! change builds a new one that shares every untouched service with the old.

mod answer_config;
mod answer_stats;
mod balance;
mod encode;
mod hosts;
mod input;
mod intern;
mod localities;
mod names;
mod owners;
pub mod programming;
mod records;
mod relist;
mod resolve;
mod reverse;
mod shards;
mod slice;
mod snapshot;
mod transfer;
mod vec_map;
mod wire_key;
mod writer;

pub use answer_config::{AnswerConfig, ClientNet};
pub use answer_stats::{ANSWER_SLOTS, AnswerStats, CLUSTER_SLOTS};
pub use balance::{Balance, BalanceCluster, EndpointMeta};
pub use hosts::{HostSrv, Hosts, PtrTargetRef, Ptrs, address_len, write_address, write_ptr};
pub use input::{Object, ObjectId, SourceId, Update};
pub use localities::{Client, Localities};
pub use programming::{Programmed, Unmeasured};
pub use records::{NameNode, RRset, Records};
pub use relist::Relists;
pub use snapshot::{Identity, NameTable, ServiceNames, Snapshot, Zone, ZoneConfig, version};
pub use transfer::ZoneWalk;
pub use writer::{Growth, Kinds, Writer};

use std::sync::Arc;

use arc_swap::ArcSwap;

/// CHAOS-class TXT records of `lines` (one character-string each, cut at
/// 255 bytes), TTL 0, encoded as answers to a question for `owner`: the
/// debug answers (`dig CH TXT <name>`), built per query, off the hot path.
pub fn chaos_txt_answer(owner: &hickory_proto::rr::Name, lines: &[String]) -> Records {
    encode::chaos_txt_lines(owner, lines)
}

/// The snapshot's key of a service: the wire bytes of `<name>.<namespace>`.
pub fn names_key(namespace: &str, name: &str) -> Vec<u8> {
    names::prefix_key(&[name, namespace])
}

/// Read access to the current snapshot; cheap to clone, shared by every
/// answering thread.
#[derive(Clone)]
pub struct Reader {
    current: Arc<ArcSwap<Snapshot>>,
}

impl Reader {
    /// The current snapshot. Holding the guard keeps that snapshot alive;
    /// hold it for one query (or one batch), not longer.
    pub fn load(&self) -> arc_swap::Guard<Arc<Snapshot>> {
        self.current.load()
    }

    /// The current snapshot as an owned `Arc`, for long-lived readers.
    pub fn load_full(&self) -> Arc<Snapshot> {
        self.current.load_full()
    }
}

/// Creates an empty store for a zone: the reader side and the single writer.
pub fn new(config: ZoneConfig) -> (Reader, Writer) {
    let zone = Arc::new(Zone::new(config));
    let empty = Snapshot::empty(zone.clone(), names::zone_names(&zone, 0, std::iter::empty()));
    let current = Arc::new(ArcSwap::from_pointee(empty));
    (Reader { current: current.clone() }, Writer::new(zone, current))
}
