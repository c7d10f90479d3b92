//! The MCS custom resources, reduced to the fields DNS answers from
//! (`multicluster.x-k8s.io`; v1alpha1 and v1beta1 have the same shape, so
//! one type reads both; [`super::mcs`] has the group, versions and labels).
//!
//! Plain serde, not kube's `CustomResource`: a derived type is bound to one
//! version, and a watch of typed objects fails its whole list on one object
//! that does not deserialize. Watches read dynamic objects of the discovered
//! version and parse each spec here, so a bad object is skipped by name.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

/// A `ServiceImport` object.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ServiceImport {
    /// Standard object metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The spec. Optional in the CRD; without one the import is skipped by
    /// name (it has no type), not a reason to reject a whole file or list.
    #[serde(default)]
    pub spec: ServiceImportSpec,
}

/// `ServiceImport.spec`, the fields DNS uses.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceImportSpec {
    /// `ClusterSetIP` or `Headless`.
    #[serde(rename = "type", default)]
    pub type_: String,
    /// Clusterset VIPs, at most one per family.
    #[serde(default)]
    pub ips: Vec<String>,
    /// Ports.
    #[serde(default)]
    pub ports: Vec<ServicePort>,
    /// Routing preference hint as for a Service (`PreferClose`,
    /// `PreferSameZone`): selects the topology answer policy.
    #[serde(default)]
    pub traffic_distribution: Option<String>,
}

/// A ServiceImport port.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServicePort {
    /// Optional name; named ports get `_<name>._<proto>` SRV records.
    #[serde(default)]
    pub name: Option<String>,
    /// `TCP` (also when omitted), `UDP` or `SCTP`.
    #[serde(default)]
    pub protocol: Option<String>,
    /// Port number (kept wide so out-of-range values are reported, not misparsed).
    pub port: i64,
}
