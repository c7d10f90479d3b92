//! The global answer settings (`--answer-policy`, `--max-answers`, client
//! networks, regions, …) as the operator gives them, before anything is
//! interned; a ServiceImport's annotations override them per service.

use crate::model::{Boundary, Cidr, ClusterId, PolicyKind};

/// A client network: queries from (or with an EDNS Client Subnet inside)
/// `net` come from `cluster`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientNet {
    /// The network.
    pub net: Cidr,
    /// The cluster its clients run in.
    pub cluster: ClusterId,
    /// Their zone, when known (`CIDR=CLUSTER/ZONE`), for the topology ladder.
    pub zone: Option<String>,
}

/// The global answer settings (`--answer-policy`, `--max-answers`, …);
/// a ServiceImport's annotations override them per service.
#[derive(Debug, Clone)]
pub struct AnswerConfig {
    /// Policy of headless services (and ClusterSetIP services answered with
    /// their endpoints).
    pub policy: PolicyKind,
    /// Most endpoints in one answer; 0 answers all.
    pub max_answers: u16,
    /// Healthy endpoints the preferred locality needs before answers stop
    /// spilling to the next one.
    pub local_min_healthy: u16,
    /// When every endpoint is unhealthy, answer them all rather than none.
    pub fail_open: bool,
    /// Answer every ClusterSetIP service with its endpoints, not its VIP.
    pub endpoint_answers: bool,
    /// How far from the client `topology` and `local-first` answers may
    /// reach (`--fallback-boundary`).
    pub fallback_boundary: Boundary,
    /// Client networks, the most specific match wins.
    pub clients: Vec<ClientNet>,
    /// Region of each cluster, for the topology ladder.
    pub regions: Vec<(ClusterId, String)>,
    /// The cluster of clients no network matches (`--cluster-id`).
    pub default_cluster: Option<ClusterId>,
}

impl AnswerConfig {
    /// The specification's behaviour: rotation over every ready endpoint of
    /// a headless service, VIPs for ClusterSetIP, no client networks.
    pub fn standard() -> Self {
        Self {
            policy: PolicyKind::Rotation,
            max_answers: 0,
            local_min_healthy: 1,
            fail_open: true,
            endpoint_answers: false,
            fallback_boundary: Boundary::None,
            clients: Vec::new(),
            regions: Vec::new(),
            default_cluster: None,
        }
    }
}
