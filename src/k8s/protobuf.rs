//! EndpointSlices in Kubernetes protobuf: the one built-in kind this server
//! lists in bulk (ServiceImports are a CRD, which the API server serves as
//! JSON only). kube-apiserver encodes protobuf at a fraction of JSON's CPU,
//! and a message is read here in place, into the model, with no
//! intermediate JSON or k8s-openapi objects (`docs/benchmarks-history.md`,
//! "Start-up: protobuf").
//!
//! - [`decode`]: the wire format as Kubernetes uses it (envelope, lists,
//!   watch events, Status).
//! - [`slice`](mod@slice): an EndpointSlice message as [`crate::k8s::convert::SliceFields`],
//!   converted by the same rules as a JSON one.
//! - [`stream`]: lists and watches asking for protobuf, read as JSON where
//!   the server answers JSON.

pub mod decode;
pub mod slice;
pub mod stream;

pub use slice::SliceView;
pub use stream::{Encoding, KubeEncoding, SliceObject, SliceWatch, slices};
