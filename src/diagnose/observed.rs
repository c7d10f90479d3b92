//! What `doctor` saw of one service in each member: plain values, so the
//! checks are a pure function of them and can be tested without clusters.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use crate::fleet::export::{Exported, ExportedMetadata, ServicePortSpec};
use crate::model::{ClusterId, ServiceKey};

/// One read of one kind of object in one member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen<T> {
    /// The objects (or their absence).
    Read(T),
    /// The identity may not list them (HTTP 403): the message.
    Forbidden(String),
    /// The read failed otherwise (the API unreachable, the CRD missing).
    Failed(String),
}

impl<T> Seen<T> {
    /// The value, when it was read.
    pub fn read(&self) -> Option<&T> {
        match self {
            Self::Read(v) => Some(v),
            _ => None,
        }
    }
}

impl<T> Seen<Option<T>> {
    /// The object, when it was read and exists.
    pub fn found(&self) -> Option<&T> {
        self.read().and_then(Option::as_ref)
    }
}

/// The member's Service of the name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenService {
    /// `spec.type` (ClusterIP when unset).
    pub type_: String,
    /// True for `clusterIP: None`.
    pub headless: bool,
    /// `spec.clusterIPs`.
    pub cluster_ips: Vec<String>,
    /// What it offers for export, as the controller reads it.
    pub exported: Exported,
}

/// One status condition of a ServiceExport.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenCondition {
    /// `Valid`, `Ready`, `Conflict`.
    pub type_: String,
    /// `True`, `False`, `Unknown`.
    pub status: String,
    /// CamelCase reason(s).
    pub reason: String,
    /// For people.
    pub message: String,
}

/// The member's ServiceExport of the name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenExport {
    /// `creationTimestamp` in Unix seconds: the oldest export wins conflicts.
    pub created: i64,
    /// The same, as the API wrote it.
    pub created_text: String,
    /// `status.conditions`.
    pub conditions: Vec<SeenCondition>,
    /// Its `clusterset-dns.io/…` annotations (carried to the import).
    pub annotations: BTreeMap<String, String>,
    /// Its `spec.exportedLabels` and `spec.exportedAnnotations`.
    pub metadata: ExportedMetadata,
}

impl SeenExport {
    /// The condition of a type, if the export has one.
    pub fn condition(&self, type_: &str) -> Option<&SeenCondition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }
}

/// The member's ServiceImport of the name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenImport {
    /// `spec.type` as written.
    pub type_: String,
    /// `spec.ips` as written.
    pub ips: Vec<String>,
    /// `spec.ports`, those that parse.
    pub ports: Vec<ServicePortSpec>,
    /// `status.clusters`.
    pub clusters: Vec<String>,
    /// The clusters its `clusterset-dns.io/unreachable-clusters` annotation names.
    pub unreachable: Vec<String>,
    /// `clusterset-dns.io/endpoint-answers: "true"` (answered with endpoints, not the VIP).
    pub endpoint_answers: bool,
}

/// One EndpointSlice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenSlice {
    /// Its object name.
    pub name: String,
    /// `multicluster.kubernetes.io/source-cluster`.
    pub source: Option<String>,
    /// `endpointslice.kubernetes.io/managed-by`.
    pub managed_by: Option<String>,
    /// `kubernetes.io/service-name` (on MCS slices: the VIP Service they back).
    pub service_name: Option<String>,
    /// Addresses of ready endpoints (`ready` unset counts as ready).
    pub ready: Vec<IpAddr>,
    /// Endpoints not ready.
    pub not_ready: usize,
}

/// The answer to one DNS question.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// A response: its RCODE (`NOERROR`, `NXDOMAIN`, …) and its records'
    /// data (addresses, or `priority weight port target` for SRV).
    Response {
        /// The response code.
        rcode: String,
        /// The answer records' data, sorted.
        records: Vec<String>,
    },
    /// No response (timeout, connection refused): why.
    NoResponse(String),
}

/// What one member's DNS answered for the name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenDns {
    /// The server asked.
    pub server: SocketAddr,
    /// The name asked (fully qualified).
    pub name: String,
    /// A.
    pub a: Answer,
    /// AAAA.
    pub aaaa: Answer,
    /// SRV.
    pub srv: Answer,
}

/// Everything seen in one member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberSeen {
    /// The configured member name (`--cluster NAME=…`).
    pub name: String,
    /// Its cluster id (its ClusterProperty, else the name).
    pub cluster: ClusterId,
    /// The Service of the name.
    pub service: Seen<Option<SeenService>>,
    /// The ServiceExport.
    pub export: Seen<Option<SeenExport>>,
    /// The ServiceImport.
    pub import: Seen<Option<SeenImport>>,
    /// The ClusterIPs of the clusterset VIP Service the controller keeps
    /// for a ClusterSetIP import (None: no such Service).
    pub vip: Seen<Option<Vec<String>>>,
    /// MCS EndpointSlices of the name (any source cluster).
    pub mcs_slices: Seen<Vec<SeenSlice>>,
    /// The Service's own EndpointSlices (what this cluster would export).
    pub own_slices: Seen<Vec<SeenSlice>>,
    /// Its DNS's answers, when `--dns` named it.
    pub dns: Option<SeenDns>,
}

/// One service across the members.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// The service.
    pub key: ServiceKey,
    /// Its DNS name, fully qualified.
    pub fqdn: String,
    /// The internal name of its clusterset VIP Service.
    pub vip_name: String,
    /// Every member, in the order given.
    pub members: Vec<MemberSeen>,
}
