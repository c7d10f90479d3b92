//! Answer policies: how the endpoints of a service's A/AAAA answer are
//! chosen and ordered (issue 6). The values here are the validated form of
//! the global flags and of a ServiceImport's `clusterset-dns.io/…`
//! annotations; choosing happens in `answer::select`.

use std::fmt;
use std::str::FromStr;

use super::ClusterId;

/// Annotation: the policy (`rotation`, `random`, `weighted`, `local-first`,
/// `topology`, `all`).
pub const ANNOTATION_POLICY: &str = "clusterset-dns.io/answer-policy";
/// Annotation: cluster weights for `weighted`, `cluster-a=3,cluster-b=1`.
pub const ANNOTATION_WEIGHTS: &str = "clusterset-dns.io/cluster-weights";
/// Annotation: healthy endpoints the preferred locality needs before
/// answers stop spilling over to the next one (`local-first`, `topology`).
pub const ANNOTATION_LOCAL_MIN_HEALTHY: &str = "clusterset-dns.io/local-min-healthy";
/// Annotation: `"true"` answers a ClusterSetIP service's endpoints instead of its VIP.
pub const ANNOTATION_ENDPOINT_ANSWERS: &str = "clusterset-dns.io/endpoint-answers";
/// Annotation: most endpoints in one answer (`0`: all).
pub const ANNOTATION_MAX_ANSWERS: &str = "clusterset-dns.io/max-answers";
/// Annotation: the TCP port active probes connect to (default: the first
/// TCP port of the endpoints).
pub const ANNOTATION_PROBE_PORT: &str = "clusterset-dns.io/probe-port";
/// Annotation written by the sync controller: the exporting clusters whose
/// API is unreachable (`cluster-2,cluster-3`); their endpoints are demoted
/// in this service's answers. Absent while every cluster is reachable.
pub const ANNOTATION_UNREACHABLE_CLUSTERS: &str = "clusterset-dns.io/unreachable-clusters";
/// Annotation: how far from the asking client the `topology` and
/// `local-first` policies may send it (`zone`, `cluster`, `region`, or
/// `none` to lift `--fallback-boundary` for this service).
pub const ANNOTATION_FALLBACK_BOUNDARY: &str = "clusterset-dns.io/fallback-boundary";

/// How a service's endpoints are chosen and ordered for one query.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PolicyKind {
    /// Every endpoint in the store's order (cluster, then endpoint): no load spreading.
    All,
    /// Every endpoint, the order rotated by one per query (the default).
    Rotation,
    /// Every endpoint in a pseudo-random order per query.
    Random,
    /// One cluster first, chosen per query by weight; the others after it.
    Weighted,
    /// The client's cluster's endpoints while enough are healthy, then the rest.
    LocalFirst,
    /// Same zone, then same region (or cluster), then any.
    Topology,
}

impl PolicyKind {
    /// Every policy, for tests and documentation.
    pub const ALL: [Self; 6] =
        [Self::All, Self::Rotation, Self::Random, Self::Weighted, Self::LocalFirst, Self::Topology];

    /// The name used by flags and annotations.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::All => "all",
            Self::Rotation => "rotation",
            Self::Random => "random",
            Self::Weighted => "weighted",
            Self::LocalFirst => "local-first",
            Self::Topology => "topology",
        }
    }

    /// True when the answer depends on who asks (EDNS Client Subnet scope).
    pub fn depends_on_client(self) -> bool {
        matches!(self, Self::LocalFirst | Self::Topology)
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for PolicyKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL.into_iter().find(|p| p.as_str() == s).ok_or_else(|| {
            format!("{s:?} is not one of all, rotation, random, weighted, local-first, topology")
        })
    }
}

/// How far from the asking client the `topology` and `local-first`
/// policies may answer endpoints (issue 31): spill-over stops at this
/// scope, and inside it unhealthy endpoints are answered before any
/// outside it would be (never). Policies that do not look at the client
/// ignore it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Boundary {
    /// No boundary: spill over to any cluster (the default).
    #[default]
    None,
    /// The client's zone (`--client-cluster CIDR=NAME/ZONE`, the
    /// endpoints' `zone`).
    Zone,
    /// The client's cluster.
    Cluster,
    /// The client's region (its cluster's `--cluster-region`); a client
    /// whose cluster has no region is bounded by its cluster.
    Region,
}

impl Boundary {
    /// Every value, for tests and documentation.
    pub const ALL: [Self; 4] = [Self::None, Self::Zone, Self::Cluster, Self::Region];

    /// The name used by the flag and the annotation.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Zone => "zone",
            Self::Cluster => "cluster",
            Self::Region => "region",
        }
    }
}

impl fmt::Display for Boundary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Boundary {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|b| b.as_str() == s)
            .ok_or_else(|| format!("{s:?} is not one of zone, cluster, region, none"))
    }
}

/// A cluster's weight for [`PolicyKind::Weighted`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterWeight {
    /// The cluster.
    pub cluster: ClusterId,
    /// Its weight (relative; 0 never comes first).
    pub weight: u32,
}

/// What a ServiceImport's annotations override; `None` keeps the global
/// setting. Built from valid annotations only: a bad value is reported and
/// left out, so the service is still served.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AnswerOverrides {
    /// `clusterset-dns.io/answer-policy`.
    pub policy: Option<PolicyKind>,
    /// `clusterset-dns.io/cluster-weights`.
    pub weights: Option<Vec<ClusterWeight>>,
    /// `clusterset-dns.io/local-min-healthy`.
    pub local_min_healthy: Option<u16>,
    /// `clusterset-dns.io/endpoint-answers`.
    pub endpoint_answers: Option<bool>,
    /// `clusterset-dns.io/max-answers` (0: all).
    pub max_answers: Option<u16>,
    /// `spec.trafficDistribution` is `PreferClose` or `PreferSameZone`: the
    /// topology ladder unless the policy annotation says otherwise.
    pub prefer_close: bool,
    /// `clusterset-dns.io/probe-port`.
    pub probe_port: Option<u16>,
    /// `clusterset-dns.io/fallback-boundary`.
    pub boundary: Option<Boundary>,
    /// Centralized mode only: the oldest export's
    /// `clusterset-dns.io/consumer-clusters`, sorted; the service's names
    /// exist only for clients of these clusters (an empty list: for no
    /// one). Not read from a ServiceImport: in a member, the import exists
    /// only where the service is consumed.
    pub consumers: Option<Vec<ClusterId>>,
    /// `clusterset-dns.io/unreachable-clusters`, sorted: health, not
    /// records, so a change of it re-encodes nothing.
    pub unreachable: Vec<ClusterId>,
    /// Kosmos's `kosmos.io/disconnected-address` (read with `--interop
    /// kosmos`), sorted: addresses its probe found unreachable, demoted like
    /// our own probe's failures. Health, not records.
    pub disconnected: Vec<std::net::IpAddr>,
}

/// A ServiceImport's [`AnswerOverrides`], kept in a block of its own only
/// when it overrides something: nearly every import overrides nothing, and
/// the 88 bytes inline were 8 MB of a 100,000-service fleet's model. Reads
/// as the overrides (`Deref`, none when absent); a write (`DerefMut`)
/// makes the block.
#[derive(Debug, Clone, Default)]
pub struct Overrides(Option<Box<AnswerOverrides>>);

/// What an import without overrides reads.
static NO_OVERRIDES: AnswerOverrides = AnswerOverrides {
    policy: None,
    weights: None,
    local_min_healthy: None,
    endpoint_answers: None,
    max_answers: None,
    prefer_close: false,
    probe_port: None,
    boundary: None,
    consumers: None,
    unreachable: Vec::new(),
    disconnected: Vec::new(),
};

impl std::ops::Deref for Overrides {
    type Target = AnswerOverrides;

    fn deref(&self) -> &AnswerOverrides {
        self.0.as_deref().unwrap_or(&NO_OVERRIDES)
    }
}

impl std::ops::DerefMut for Overrides {
    fn deref_mut(&mut self) -> &mut AnswerOverrides {
        self.0.get_or_insert_with(Box::default)
    }
}

impl From<AnswerOverrides> for Overrides {
    fn from(o: AnswerOverrides) -> Self {
        Self((o != NO_OVERRIDES).then(|| Box::new(o)))
    }
}

/// The same overrides, boxed or not.
impl PartialEq for Overrides {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Eq for Overrides {}

impl AnswerOverrides {
    /// True when `self` and `other` differ at most in what only the health
    /// overlay reads (the unreachable clusters, the disconnected addresses).
    pub fn same_records(&self, other: &Self) -> bool {
        let records = |o: &Self| Self { unreachable: Vec::new(), disconnected: Vec::new(), ..o.clone() };
        records(self) == records(other)
    }
}

/// An annotation whose value cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("annotation {annotation}: {problem}")]
pub struct AnnotationError {
    /// The annotation key.
    pub annotation: &'static str,
    /// What is wrong with its value.
    pub problem: String,
}

impl AnswerOverrides {
    /// Reads the `clusterset-dns.io/…` annotations; every bad one is
    /// returned as an error and left out, the others still apply.
    pub fn from_annotations<'a>(
        annotations: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> (Self, Vec<AnnotationError>) {
        let mut o = Self::default();
        let mut errors = Vec::new();
        for (key, value) in annotations {
            let value = value.trim();
            let result = match key {
                ANNOTATION_POLICY => {
                    value.parse().map(|p| o.policy = Some(p)).map_err(|e| (ANNOTATION_POLICY, e))
                }
                ANNOTATION_WEIGHTS => {
                    parse_weights(value).map(|w| o.weights = Some(w)).map_err(|e| (ANNOTATION_WEIGHTS, e))
                }
                ANNOTATION_LOCAL_MIN_HEALTHY => parse_count(value)
                    .map(|n| o.local_min_healthy = Some(n))
                    .map_err(|e| (ANNOTATION_LOCAL_MIN_HEALTHY, e)),
                ANNOTATION_MAX_ANSWERS => parse_count(value)
                    .map(|n| o.max_answers = Some(n))
                    .map_err(|e| (ANNOTATION_MAX_ANSWERS, e)),
                ANNOTATION_ENDPOINT_ANSWERS => match value {
                    "true" | "false" => {
                        o.endpoint_answers = Some(value == "true");
                        Ok(())
                    }
                    other => Err((ANNOTATION_ENDPOINT_ANSWERS, format!("{other:?} is not true or false"))),
                },
                ANNOTATION_PROBE_PORT => match value.parse::<u16>() {
                    Ok(p) if p > 0 => {
                        o.probe_port = Some(p);
                        Ok(())
                    }
                    _ => Err((ANNOTATION_PROBE_PORT, format!("{value:?} is not a port from 1 to 65535"))),
                },
                // A value not understood is left out like every bad
                // annotation: the service keeps the boundary it has
                // without the annotation (`--fallback-boundary`), so a typo
                // never widens a boundary the operator set for everyone.
                ANNOTATION_FALLBACK_BOUNDARY => {
                    value.parse().map(|b| o.boundary = Some(b)).map_err(|e| (ANNOTATION_FALLBACK_BOUNDARY, e))
                }
                ANNOTATION_UNREACHABLE_CLUSTERS => parse_clusters(value)
                    .map(|c| o.unreachable = c)
                    .map_err(|e| (ANNOTATION_UNREACHABLE_CLUSTERS, e)),
                _ => Ok(()),
            };
            if let Err((annotation, problem)) = result {
                errors.push(AnnotationError { annotation, problem });
            }
        }
        (o, errors)
    }
}

fn parse_count(s: &str) -> Result<u16, String> {
    s.parse::<u16>().map_err(|_| format!("{s:?} is not a number from 0 to 65535"))
}

/// `cluster-a,cluster-b` (spaces allowed; empty is none), sorted.
pub fn parse_clusters(s: &str) -> Result<Vec<ClusterId>, String> {
    let mut out = Vec::new();
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        out.push(ClusterId::parse(item).map_err(|e| format!("{item:?} {e}"))?);
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// `cluster-a=3,cluster-b=1` (spaces allowed around items).
pub fn parse_weights(s: &str) -> Result<Vec<ClusterWeight>, String> {
    let mut out: Vec<ClusterWeight> = Vec::new();
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (cluster, weight) =
            item.split_once('=').ok_or_else(|| format!("{item:?} is not CLUSTER=WEIGHT"))?;
        let cluster = ClusterId::parse(cluster.trim()).map_err(|e| format!("{cluster:?} {e}"))?;
        let weight = weight.trim().parse::<u32>().map_err(|_| format!("{weight:?} is not a weight"))?;
        if out.iter().any(|w| w.cluster == cluster) {
            return Err(format!("{cluster} is given twice"));
        }
        out.push(ClusterWeight { cluster, weight });
    }
    if out.is_empty() {
        return Err("no CLUSTER=WEIGHT given".into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_take_a_block_only_when_they_override_something() {
        let none = Overrides::from(AnswerOverrides::default());
        assert!(none.0.is_none() && *none == AnswerOverrides::default());
        let some = Overrides::from(AnswerOverrides { max_answers: Some(3), ..Default::default() });
        assert!(some.0.is_some() && some.max_answers == Some(3));
        assert_ne!(none, some);
        // A write makes the block; equal values are equal either way.
        let mut written = none.clone();
        written.max_answers = Some(3);
        assert_eq!(written, some);
        written.max_answers = None;
        assert_eq!(written, none);
        assert!(std::mem::size_of::<Overrides>() <= 8);
    }

    #[test]
    fn annotations_are_read_and_bad_ones_reported_by_key() {
        let (o, errors) = AnswerOverrides::from_annotations([
            (ANNOTATION_POLICY, "local-first"),
            (ANNOTATION_WEIGHTS, "cluster-a=3, cluster-b=1"),
            (ANNOTATION_LOCAL_MIN_HEALTHY, "2"),
            (ANNOTATION_ENDPOINT_ANSWERS, "true"),
            (ANNOTATION_MAX_ANSWERS, "x"),
            ("other.io/key", "ignored"),
        ]);
        assert_eq!(o.policy, Some(PolicyKind::LocalFirst));
        assert_eq!(o.weights.as_ref().map(Vec::len), Some(2));
        assert_eq!(o.local_min_healthy, Some(2));
        assert_eq!(o.endpoint_answers, Some(true));
        assert_eq!(o.max_answers, None);
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].annotation, ANNOTATION_MAX_ANSWERS);
    }

    #[test]
    fn health_annotations_are_read_and_only_health_differs() {
        let (o, errors) = AnswerOverrides::from_annotations([
            (ANNOTATION_PROBE_PORT, "8080"),
            (ANNOTATION_UNREACHABLE_CLUSTERS, " cluster-3, cluster-2 ,cluster-3"),
        ]);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(o.probe_port, Some(8080));
        let names: Vec<&str> = o.unreachable.iter().map(ClusterId::as_str).collect();
        assert_eq!(names, ["cluster-2", "cluster-3"], "sorted, without duplicates");
        assert!(o.same_records(&AnswerOverrides { probe_port: Some(8080), ..Default::default() }));
        assert!(!o.same_records(&AnswerOverrides::default()), "the probe port is not health-only");
        let (_, errors) = AnswerOverrides::from_annotations([
            (ANNOTATION_PROBE_PORT, "0"),
            (ANNOTATION_UNREACHABLE_CLUSTERS, "Bad_Name"),
        ]);
        assert_eq!(errors.len(), 2);
    }

    #[test]
    fn a_boundary_is_read_and_an_unknown_one_is_reported_and_left_out() {
        for b in Boundary::ALL {
            assert_eq!(b.as_str().parse::<Boundary>(), Ok(b));
            let (o, errors) = AnswerOverrides::from_annotations([(ANNOTATION_FALLBACK_BOUNDARY, b.as_str())]);
            assert!(errors.is_empty(), "{errors:?}");
            assert_eq!(o.boundary, Some(b));
        }
        let (o, errors) = AnswerOverrides::from_annotations([(ANNOTATION_FALLBACK_BOUNDARY, "continent")]);
        assert_eq!(o.boundary, None, "left out: the default applies");
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].annotation, ANNOTATION_FALLBACK_BOUNDARY);
        assert!(errors[0].problem.contains("continent"), "{}", errors[0]);
        assert!(!o.same_records(&AnswerOverrides { boundary: Some(Boundary::Zone), ..Default::default() }));
    }

    #[test]
    fn weights_reject_duplicates_and_garbage() {
        assert!(parse_weights("a=1,a=2").is_err());
        assert!(parse_weights("a").is_err());
        assert!(parse_weights("a=-1").is_err());
        assert!(parse_weights("").is_err());
        assert_eq!(parse_weights("a=0").unwrap()[0].weight, 0);
    }

    #[test]
    fn policy_names_round_trip() {
        for p in PolicyKind::ALL {
            assert_eq!(p.as_str().parse::<PolicyKind>(), Ok(p));
        }
        assert!("round-robin".parse::<PolicyKind>().is_err());
    }
}
