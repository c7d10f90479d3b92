//! One member cluster's view of one exported service: its ServiceExport and
//! the Service behind it, reduced to the properties KEP-1645 merges.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use crate::model::{AddressFamily, ClusterId, DnsLabel, ImportType, Protocol};

/// A Service port as the ServiceImport carries it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServicePortSpec {
    /// The port name; ports merge by it when set.
    pub name: Option<DnsLabel>,
    /// TCP, UDP or SCTP.
    pub protocol: Protocol,
    /// The port number.
    pub port: u16,
    /// `appProtocol`, carried through unchanged.
    pub app_protocol: Option<String>,
}

impl fmt::Display for ServicePortSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let proto = self.protocol.srv_label().to_ascii_uppercase();
        match &self.name {
            Some(n) => write!(f, "{n} ({proto}/{})", self.port),
            None => write!(f, "{proto}/{}", self.port),
        }
    }
}

/// `sessionAffinity`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SessionAffinity {
    /// No affinity (the Service API's default).
    #[default]
    None,
    /// Affinity by client IP.
    ClientIp,
}

impl SessionAffinity {
    /// The API value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "None",
            Self::ClientIp => "ClientIP",
        }
    }
}

/// The properties of a Service that a ServiceImport is built from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportedService {
    /// ClusterSetIP for a Service with a cluster IP, Headless for `clusterIP: None`.
    pub kind: ImportType,
    /// The Service's ports.
    pub ports: Vec<ServicePortSpec>,
    /// `sessionAffinity`.
    pub session_affinity: SessionAffinity,
    /// `sessionAffinityConfig.clientIP.timeoutSeconds`.
    pub affinity_timeout: Option<i32>,
    /// `ipFamilies`, in the Service's order.
    pub ip_families: Vec<AddressFamily>,
    /// `clusterIPs`: the cluster-local VIPs (none when headless).
    pub cluster_ips: Vec<IpAddr>,
    /// `trafficDistribution`.
    pub traffic_distribution: Option<String>,
    /// `internalTrafficPolicy` (`Cluster` or `Local`; the API server sets
    /// one on every Service that has a cluster IP).
    pub internal_traffic_policy: Option<String>,
}

/// What a ServiceExport's spec asks to carry to the ServiceImport
/// (`spec.exportedLabels`, `spec.exportedAnnotations`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ExportedMetadata {
    /// Labels for the ServiceImport.
    pub labels: BTreeMap<String, String>,
    /// Annotations for the ServiceImport.
    pub annotations: BTreeMap<String, String>,
}

/// What stands behind a ServiceExport.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exported {
    /// No Service of that name in the namespace (reason `NoService`).
    NoService,
    /// A Service that cannot be exported (`InvalidServiceType`): ExternalName.
    InvalidType(String),
    /// An exportable Service.
    Service(ExportedService),
    /// A member whose cluster id another member has too (`DuplicateClusterID`):
    /// its endpoints cannot be told from the other's, so neither counts.
    DuplicateCluster(String),
}

/// One cluster's export of a service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterExport {
    /// The exporting cluster.
    pub cluster: ClusterId,
    /// The ServiceExport's `creationTimestamp` (Unix seconds): the oldest
    /// export wins every conflict.
    pub exported_at: i64,
    /// What it exports.
    pub service: Exported,
    /// The ServiceExport's `clusterset-dns.io/…` annotations (answer
    /// policy and the like), carried to the ServiceImport.
    pub annotations: BTreeMap<String, String>,
    /// Its `spec.exportedLabels` and `spec.exportedAnnotations`.
    pub metadata: ExportedMetadata,
}

impl ClusterExport {
    /// The order of precedence: oldest first, cluster name breaking ties.
    pub fn precedence(&self) -> (i64, &ClusterId) {
        (self.exported_at, &self.cluster)
    }
}
