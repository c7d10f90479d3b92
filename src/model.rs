//! The domain: what a multi-cluster service is, stripped of Kubernetes API
//! types. Everything the DNS answers is derived from these values; nothing
//! here does I/O.
//!
//! Values are validated when they are built (see `k8s::convert`), so the
//! store can trust them: every name is a valid DNS label, every address parses,
//! every port is in range.

mod cidr;
mod fleets;
mod label;
mod policy;
mod service;
mod trigger;

pub use cidr::{Cidr, CidrError};
pub use fleets::{BackingKind, BackingService, Interop, KOSMOS_ROOT_CLUSTER, SliceOrigin};
pub use label::{ClusterId, DnsLabel, LabelError};
pub use policy::{
    ANNOTATION_ENDPOINT_ANSWERS, ANNOTATION_FALLBACK_BOUNDARY, ANNOTATION_LOCAL_MIN_HEALTHY,
    ANNOTATION_MAX_ANSWERS, ANNOTATION_POLICY, ANNOTATION_PROBE_PORT, ANNOTATION_UNREACHABLE_CLUSTERS,
    ANNOTATION_WEIGHTS, AnnotationError, AnswerOverrides, Boundary, ClusterWeight, Overrides, PolicyKind,
    parse_clusters, parse_weights,
};
pub use service::{
    AddressFamily, Addresses, Endpoint, EndpointSet, ImportType, Port, Protocol, ServiceImport, ServiceKey,
    SliceKey,
};
pub use trigger::ChangeTrigger;
