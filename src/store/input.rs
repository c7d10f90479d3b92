//! What the store takes in: the objects a source delivers ([`Object`]),
//! their identity within it ([`ObjectId`]), the source itself
//! ([`SourceId`]) and the changes a source sends ([`Update`]).
//!
//! These live in the store, not in `source/`, because they are the store's
//! interface: every producer (files, watches, the centralized fleet, the
//! health probes) speaks them, and the store needs nothing else but `model`.

use std::net::IpAddr;

use crate::model::{BackingService, ClusterId, EndpointSet, ServiceImport, ServiceKey, SliceKey};

/// Identifies one source of objects: the store keeps each source's objects
/// apart, so a source can be replaced whole (a file reloaded, a watch
/// relisted) without touching the others. The order (derived) is the
/// order sources were numbered in before they were named: the example,
/// files, watches, the members.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SourceId {
    /// The embedded example fleet.
    Example,
    /// One file of one `--objects` path: each file is a source of its own,
    /// so the store keeps a file's last good objects while another file
    /// changes. `path` is the flag's position, `file` numbers the files
    /// found under it (a removed file's number is reused).
    File {
        /// Which `--objects` path (0-based).
        path: u16,
        /// Which file under it.
        file: u32,
    },
    /// One Kubernetes watch (one kind in one namespace scope).
    Watch(u32),
    /// The member clusters of centralized mode (`--cluster`, `--members`).
    Members,
}

impl std::fmt::Display for SourceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Example => f.write_str("the embedded example"),
            Self::File { path, file } => write!(f, "--objects #{path}, file #{file}"),
            Self::Watch(n) => write!(f, "watch #{n}"),
            Self::Members => f.write_str("the member clusters"),
        }
    }
}

/// One object the store serves from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Object {
    /// A ServiceImport.
    Import(ServiceImport),
    /// An EndpointSlice (MCS, or a fleet manager's read with `--interop`).
    Slice(EndpointSet),
    /// A Service backing an import without `spec.ips` (`--interop`).
    Service(BackingService),
}

/// Identity of an object within one source.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ObjectId {
    /// A ServiceImport, by service.
    Import(ServiceKey),
    /// An EndpointSlice, by namespace and name.
    Slice(SliceKey),
    /// A Service, by namespace and name.
    Service(SliceKey),
}

impl Object {
    /// The object's identity within its source.
    pub fn id(&self) -> ObjectId {
        match self {
            Self::Import(i) => ObjectId::Import(i.key.clone()),
            Self::Slice(s) => ObjectId::Slice(s.slice.clone()),
            Self::Service(s) => ObjectId::Service(s.object.clone()),
        }
    }

    pub(super) fn service(&self) -> &ServiceKey {
        match self {
            Self::Import(i) => &i.key,
            Self::Slice(s) => &s.service,
            Self::Service(s) => &s.service,
        }
    }
}

/// A change from a source.
#[derive(Debug)]
pub enum Update {
    /// The source exists and will deliver its first complete state later;
    /// until it does, the store is not ready.
    Register(SourceId),
    /// The source's complete state (a file read, a watch's relist): objects it
    /// held before and not now are gone. Marks the source as synced.
    Replace {
        /// Which source.
        source: SourceId,
        /// Everything it holds now.
        objects: Vec<Object>,
    },
    /// Part of a list that arrives in parts (a watch's list of many
    /// objects): its objects are applied at once, so that the list is never
    /// held whole; what the source held and the list no longer has is
    /// removed by the list's [`Update::LastPart`]. `first` starts a list
    /// (a part of an earlier list that never ended counts for nothing).
    Part {
        /// Which source.
        source: SourceId,
        /// Objects of the list.
        objects: Vec<Object>,
        /// Whether this is the list's first part.
        first: bool,
    },
    /// The rest of a list that arrived in parts: with its parts, the
    /// source's complete state, as [`Update::Replace`]'s objects are.
    LastPart {
        /// Which source.
        source: SourceId,
        /// The list's objects after its last part.
        objects: Vec<Object>,
    },
    /// One object added or changed.
    Upsert {
        /// Which source.
        source: SourceId,
        /// The object.
        object: Object,
    },
    /// One object removed.
    Remove {
        /// Which source.
        source: SourceId,
        /// The object.
        id: ObjectId,
    },
    /// An active probe's verdict on one address of a service's endpoint:
    /// an endpoint with an address marked down is unhealthy, and answer
    /// policies leave it out while others are healthy. Re-encodes nothing.
    EndpointHealth {
        /// The service whose endpoint was probed.
        service: ServiceKey,
        /// The probed address.
        address: IpAddr,
        /// The verdict.
        healthy: bool,
    },
    /// A member cluster is reachable or not (its API server, its
    /// connectivity): every endpoint of a cluster that is not alive is
    /// unhealthy in every service. Re-encodes nothing.
    ClusterLiveness {
        /// The cluster.
        cluster: ClusterId,
        /// Whether it is alive.
        alive: bool,
    },
}
