//! Other fleet managers' shapes of an imported service, read with
//! `--interop`: Karmada (`derived-<svc>` Services and their
//! `imported-<cluster>-…` EndpointSlices; MultiClusterService `CrossCluster`
//! with dispatched slices) and Kosmos (a same-name Service and copies of the
//! root cluster's slices). The model keeps only what decides an answer:
//! where a slice came from ([`SliceOrigin`]) and the Service that backs an
//! import without `spec.ips` ([`BackingService`]).

use std::net::IpAddr;

use super::{Port, ServiceKey, SliceKey};

/// Which fleet managers' objects are read besides the MCS API's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Interop {
    /// Karmada: `derived-<svc>` Services, slices managed by its
    /// endpointslice controllers.
    pub karmada: bool,
    /// Kosmos: Services and slices annotated `kosmos.io/service-import`.
    pub kosmos: bool,
}

impl Interop {
    /// Only the MCS API's objects.
    pub const NONE: Self = Self { karmada: false, kosmos: false };

    /// True when any other shape is read.
    pub fn any(self) -> bool {
        self.karmada || self.kosmos
    }

    /// Parses a comma-separated list: `karmada`, `kosmos`, `karmada,kosmos`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut out = Self::NONE;
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part.to_ascii_lowercase().as_str() {
                "karmada" => out.karmada = true,
                "kosmos" => out.kosmos = true,
                other => return Err(format!("{other:?} is not karmada or kosmos")),
            }
        }
        Ok(out)
    }
}

/// Who wrote an EndpointSlice. The order is the precedence: when a service
/// has slices of several origins, only those of the first are served, so an
/// answer never depends on which object arrived last (MCS slices win).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SliceOrigin {
    /// An MCS EndpointSlice (`multicluster.kubernetes.io/…` labels).
    Mcs,
    /// Karmada's endpointslice-controller: `imported-<cluster>-<slice>`,
    /// labelled `kubernetes.io/service-name: derived-<svc>`.
    Karmada,
    /// Karmada's endpointslice-dispatch-controller (MultiClusterService
    /// `CrossCluster`): `<provider>-<slice>`, labelled with the service.
    KarmadaDispatch,
    /// Kosmos: the root cluster's slices copied into a leaf.
    Kosmos,
}

impl SliceOrigin {
    /// A short name for logs and `check`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Mcs => "mcs",
            Self::Karmada => "karmada",
            Self::KarmadaDispatch => "karmada-dispatch",
            Self::Kosmos => "kosmos",
        }
    }
}

/// What a backing Service is. The order is the precedence when one service
/// has several.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum BackingKind {
    /// Karmada's `derived-<svc>`, created for a ClusterSetIP ServiceImport.
    KarmadaDerived,
    /// Kosmos's same-name Service in a leaf cluster.
    Kosmos,
    /// A Service Karmada propagated for a MultiClusterService with
    /// `CrossCluster` exposure: it stands for the import, which does not
    /// exist in this mode.
    KarmadaCrossCluster,
}

impl BackingKind {
    /// A short name for logs and `check`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::KarmadaDerived => "karmada-derived",
            Self::Kosmos => "kosmos",
            Self::KarmadaCrossCluster => "karmada-crosscluster",
        }
    }
}

/// A Kubernetes Service that backs an imported service: its cluster IPs are
/// answered for an import without `spec.ips`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackingService {
    /// The Service object (`derived-db`, or `db` itself).
    pub object: SliceKey,
    /// The imported service it backs (`db`).
    pub service: ServiceKey,
    /// Which shape it is.
    pub kind: BackingKind,
    /// `clusterIP: None`.
    pub headless: bool,
    /// `spec.clusterIPs` (at most one per family); empty when headless or
    /// not allocated.
    pub ips: Vec<IpAddr>,
    /// The Service's ports.
    pub ports: Vec<Port>,
}

/// The cluster Kosmos's slice copies are attributed to: they are copies of
/// the root cluster's EndpointSlices, and Kosmos records no other source.
pub const KOSMOS_ROOT_CLUSTER: &str = "kosmos-root";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interop_lists_parse_and_reject_unknown_names() {
        assert_eq!(Interop::parse("karmada").unwrap(), Interop { karmada: true, kosmos: false });
        assert_eq!(Interop::parse("Kosmos, karmada").unwrap(), Interop { karmada: true, kosmos: true });
        assert_eq!(Interop::parse("").unwrap(), Interop::NONE);
        assert!(Interop::parse("karmada,istio").unwrap_err().contains("istio"));
    }

    #[test]
    fn mcs_slices_and_derived_services_come_first() {
        assert!(SliceOrigin::Mcs < SliceOrigin::Karmada);
        assert!(SliceOrigin::Karmada < SliceOrigin::Kosmos);
        assert!(BackingKind::KarmadaDerived < BackingKind::Kosmos);
        assert!(super::super::ClusterId::parse(KOSMOS_ROOT_CLUSTER).is_ok());
    }
}
