//! KEP-1645's conflict resolution: every cluster's export of a service →
//! the one ServiceImport spec all members get, and the `Valid` and
//! `Conflict` conditions each ServiceExport shows.
//!
//! The rules ("Constraints and Conflict Resolution" in the KEP): a global
//! property takes the value of the oldest ServiceExport (creation time,
//! cluster name breaking ties); ports are the union of all exports', merged
//! by name, then by (protocol, port), the oldest winning a disagreement.
//! Because the winner only changes when the oldest export changes or goes,
//! an import does not flap while a conflict appears or clears.

use std::collections::BTreeSet;
use std::fmt::Display;

use super::export::{
    ClusterExport, Exported, ExportedMetadata, ExportedService, ServicePortSpec, SessionAffinity,
};
use crate::model::{AddressFamily, ClusterId, ImportType};

/// Condition types on a ServiceExport (mcs-api v1beta1).
pub mod condition {
    /// The export is valid (its Service exists and can be exported).
    pub const VALID: &str = "Valid";
    /// The export has been propagated to the members.
    pub const READY: &str = "Ready";
    /// Some property disagrees with the other clusters' exports.
    pub const CONFLICT: &str = "Conflict";
}

/// A condition's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// `True`.
    True,
    /// `False`.
    False,
    /// `Unknown`.
    Unknown,
}

impl Status {
    /// The API value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::True => "True",
            Self::False => "False",
            Self::Unknown => "Unknown",
        }
    }
}

/// One status condition, without its transition time (the writer keeps the
/// previous time when the status did not change).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    /// `Valid`, `Ready` or `Conflict`.
    pub kind: &'static str,
    /// The status.
    pub status: Status,
    /// A CamelCase reason (`PortConflict`, or several joined by commas).
    pub reason: String,
    /// For people.
    pub message: String,
}

impl Condition {
    fn new(kind: &'static str, status: Status, reason: &str, message: impl Into<String>) -> Self {
        Self { kind, status, reason: reason.to_owned(), message: message.into() }
    }
}

/// The merged ServiceImport spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportSpec {
    /// ClusterSetIP or Headless.
    pub kind: ImportType,
    /// The union of ports.
    pub ports: Vec<ServicePortSpec>,
    /// `sessionAffinity`.
    pub session_affinity: SessionAffinity,
    /// `sessionAffinityConfig.clientIP.timeoutSeconds`.
    pub affinity_timeout: Option<i32>,
    /// `ipFamilies`.
    pub ip_families: Vec<AddressFamily>,
    /// `trafficDistribution`.
    pub traffic_distribution: Option<String>,
    /// `internalTrafficPolicy`.
    pub internal_traffic_policy: Option<String>,
    /// The oldest valid export's `spec.exportedLabels` and
    /// `spec.exportedAnnotations`, for the ServiceImport's metadata.
    pub metadata: ExportedMetadata,
    /// The oldest valid export's `clusterset-dns.io/…` annotations: how the
    /// service is answered, configured where the service is exported.
    pub annotations: std::collections::BTreeMap<String, String>,
}

/// The outcome of merging one service's exports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Merged {
    /// The import, while at least one export is valid.
    pub spec: Option<ImportSpec>,
    /// The clusters whose exports are valid, oldest first (`status.clusters`).
    pub clusters: Vec<ClusterId>,
    /// For every export: its `Valid` and `Conflict` conditions.
    pub conditions: Vec<(ClusterId, Vec<Condition>)>,
}

/// One property's disagreement.
struct Conflict {
    reason: &'static str,
    message: String,
}

/// Merges the exports of one service (in any order).
pub fn merge(exports: &[ClusterExport]) -> Merged {
    let mut sorted: Vec<&ClusterExport> = exports.iter().collect();
    sorted.sort_by(|a, b| a.precedence().cmp(&b.precedence()));
    let valid: Vec<(&ClusterId, &ExportedService)> = sorted
        .iter()
        .filter_map(|e| match &e.service {
            Exported::Service(s) => Some((&e.cluster, s)),
            _ => None,
        })
        .collect();
    let valid_exports: Vec<&ClusterExport> =
        sorted.iter().copied().filter(|e| matches!(e.service, Exported::Service(_))).collect();

    // The order conflicts are found in is the order of the Conflict
    // condition's reasons.
    let mut conflicts = Vec::new();
    let spec = valid.first().map(|&(_, first)| {
        property_conflicts(&valid, &mut conflicts);
        metadata_conflicts(&valid_exports, &mut conflicts);
        conflicts.extend(affinity_config_conflict(&valid));
        conflicts.extend(family_conflict(&valid));
        let ports = merge_ports(&valid, &mut conflicts);
        ImportSpec {
            kind: first.kind,
            ports,
            session_affinity: first.session_affinity,
            affinity_timeout: first.affinity_timeout,
            ip_families: first.ip_families.clone(),
            traffic_distribution: first.traffic_distribution.clone(),
            internal_traffic_policy: first.internal_traffic_policy.clone(),
            metadata: valid_exports[0].metadata.clone(),
            annotations: valid_exports[0].annotations.clone(),
        }
    });
    let conflict = conflict_condition(&conflicts);
    let conditions = sorted.iter().map(|e| (e.cluster.clone(), export_conditions(e, &conflict))).collect();
    Merged { spec, clusters: valid.iter().map(|(c, _)| (*c).clone()).collect(), conditions }
}

/// The Service properties every valid export (`valid`, oldest first, not
/// empty) must agree on: type, session affinity, traffic distribution,
/// internal traffic policy. The oldest wins.
fn property_conflicts(valid: &[(&ClusterId, &ExportedService)], conflicts: &mut Vec<Conflict>) {
    let mut global = |what: &str, reason: &'static str, value: &dyn Fn(&ExportedService) -> String| {
        let (oldest, first) = valid[0];
        let winner = value(first);
        let disagree = valid.iter().filter(|(_, s)| value(s) != winner).count();
        if disagree > 0 {
            conflicts
                .push(Conflict { reason, message: message(what, &winner, oldest, disagree, valid.len()) });
        }
    };
    global("type", "TypeConflict", &|s| kind_name(s.kind).to_owned());
    global("sessionAffinity", "SessionAffinityConflict", &|s| s.session_affinity.as_str().to_owned());
    global("trafficDistribution", "TrafficDistributionConflict", &|s| {
        s.traffic_distribution.clone().unwrap_or_else(|| "unset".to_owned())
    });
    global("internalTrafficPolicy", "InternalTrafficPolicyConflict", &|s| {
        s.internal_traffic_policy.clone().unwrap_or_else(|| "unset".to_owned())
    });
}

/// Exported labels and annotations: properties of the ServiceExport, not
/// the Service, but resolved the same way (KEP "Labels and annotations"):
/// the oldest valid export's set wins whole.
fn metadata_conflicts(valid_exports: &[&ClusterExport], conflicts: &mut Vec<Conflict>) {
    let mut carried = |what: &str, reason: &'static str, value: &dyn Fn(&ExportedMetadata) -> String| {
        let oldest = valid_exports[0];
        let winner = value(&oldest.metadata);
        let disagree = valid_exports.iter().filter(|e| value(&e.metadata) != winner).count();
        if disagree > 0 {
            conflicts.push(Conflict {
                reason,
                message: message(what, &winner, &oldest.cluster, disagree, valid_exports.len()),
            });
        }
    };
    carried("exportedLabels", "LabelsConflict", &|m| pairs(&m.labels));
    carried("exportedAnnotations", "AnnotationsConflict", &|m| pairs(&m.annotations));
}

/// The session affinity config, which only means something between exports
/// that agree on affinity (the API server fills in a timeout for every
/// ClientIP).
fn affinity_config_conflict(valid: &[(&ClusterId, &ExportedService)]) -> Option<Conflict> {
    let same_affinity: Vec<&ExportedService> =
        valid.iter().map(|(_, s)| *s).filter(|s| s.session_affinity == valid[0].1.session_affinity).collect();
    let timeout = |s: &ExportedService| {
        s.affinity_timeout.map_or_else(|| "none".to_owned(), |t| format!("timeoutSeconds={t}"))
    };
    let winner = timeout(valid[0].1);
    let disagree = same_affinity.iter().filter(|s| timeout(s) != winner).count();
    (disagree > 0).then(|| Conflict {
        reason: "SessionAffinityConfigConflict",
        message: message("sessionAffinityConfig", &winner, valid[0].0, disagree, same_affinity.len()),
    })
}

/// The IP families, which decide which VIPs exist: a headless Service has
/// none (selector-less ones even get both families), so only exports with
/// a cluster IP take part, and only when the oldest has one.
fn family_conflict(valid: &[(&ClusterId, &ExportedService)]) -> Option<Conflict> {
    if valid[0].1.kind != ImportType::ClusterSetIp {
        return None;
    }
    let vips: Vec<(&ClusterId, &ExportedService)> =
        valid.iter().copied().filter(|(_, s)| s.kind == ImportType::ClusterSetIp).collect();
    let winner = families(&valid[0].1.ip_families);
    let disagree = vips.iter().filter(|(_, s)| families(&s.ip_families) != winner).count();
    (disagree > 0).then(|| Conflict {
        reason: "IPFamilyConflict",
        message: message("ipFamilies", &winner, valid[0].0, disagree, vips.len()),
    })
}

/// The one Conflict condition every valid export carries: every reason
/// found, or none.
fn conflict_condition(conflicts: &[Conflict]) -> Condition {
    if conflicts.is_empty() {
        Condition::new(condition::CONFLICT, Status::False, "NoConflicts", "No conflicts.")
    } else {
        let reasons: Vec<&str> = conflicts.iter().map(|c| c.reason).collect();
        let messages: Vec<&str> = conflicts.iter().map(|c| c.message.as_str()).collect();
        Condition::new(condition::CONFLICT, Status::True, &reasons.join(","), messages.join(" "))
    }
}

/// An export's conditions: Valid and the shared `conflict` when it is
/// valid, Valid=False with the reason otherwise.
fn export_conditions(e: &ClusterExport, conflict: &Condition) -> Vec<Condition> {
    match &e.service {
        Exported::Service(_) => vec![
            Condition::new(condition::VALID, Status::True, "Valid", "Service is valid for export."),
            conflict.clone(),
        ],
        Exported::NoService => vec![Condition::new(
            condition::VALID,
            Status::False,
            "NoService",
            "No Service of this name in this namespace.",
        )],
        Exported::InvalidType(t) => vec![Condition::new(
            condition::VALID,
            Status::False,
            "InvalidServiceType",
            format!("Services of type {t} cannot be exported."),
        )],
        Exported::DuplicateCluster(why) => {
            vec![Condition::new(condition::VALID, Status::False, "DuplicateClusterID", why.clone())]
        }
    }
}

/// The union of ports, oldest export first. A port of a newer export
/// conflicts when its name is taken by a different port, or its (protocol,
/// port) by a port of another name; the older one is kept.
fn merge_ports(
    valid: &[(&ClusterId, &ExportedService)],
    conflicts: &mut Vec<Conflict>,
) -> Vec<ServicePortSpec> {
    let mut merged: Vec<(ServicePortSpec, &ClusterId)> = Vec::new();
    let mut disagree: BTreeSet<&ClusterId> = BTreeSet::new();
    let mut first: Option<(ServicePortSpec, &ClusterId)> = None;
    for (cluster, service) in valid {
        for port in &service.ports {
            let clash = merged.iter().find(|(m, _)| {
                let same_name = m.name.is_some() && m.name == port.name;
                let same_number = m.protocol == port.protocol && m.port == port.port;
                (same_name || same_number) && m != port
            });
            match clash {
                Some((kept, owner)) => {
                    disagree.insert(cluster);
                    first.get_or_insert_with(|| (kept.clone(), owner));
                }
                None if merged.iter().any(|(m, _)| m == port) => {}
                None => merged.push((port.clone(), cluster)),
            }
        }
    }
    let mut ports: Vec<ServicePortSpec> = merged.into_iter().map(|(p, _)| p).collect();
    ports.sort();
    if let Some((kept, owner)) = first {
        conflicts.push(Conflict {
            reason: "PortConflict",
            message: message("ports", &kept, owner, disagree.len(), valid.len()),
        });
    } else {
        // No port collides, but the clusters do not export the same ports:
        // the import offers the union, so a client may reach a port that some
        // clusters' backends do not serve. The conformance suite ("should
        // expose the union of the constituent service ports and raise a
        // conflict") reads the KEP as requiring a Conflict for it.
        let lacking: Vec<&ClusterId> =
            valid.iter().filter(|(_, s)| s.ports.len() != ports.len()).map(|(c, _)| *c).collect();
        if !lacking.is_empty() {
            let union: Vec<String> = ports.iter().map(ToString::to_string).collect();
            let names: Vec<&str> = lacking.iter().map(|c| c.as_str()).collect();
            conflicts.push(Conflict {
                reason: "PortConflict",
                message: format!(
                    "Exported ports differ. Using the union [{}]; {}/{} clusters do not export all of them: {}.",
                    union.join(", "),
                    lacking.len(),
                    valid.len(),
                    names.join(", ")
                ),
            });
        }
    }
    ports
}

/// A label or annotation map as one comparable, readable value.
fn pairs(map: &std::collections::BTreeMap<String, String>) -> String {
    if map.is_empty() {
        return "none".to_owned();
    }
    let p: Vec<String> = map.iter().map(|(k, v)| format!("{k}={v}")).collect();
    p.join(",")
}

fn message(what: &str, winner: &dyn Display, oldest: &ClusterId, disagree: usize, total: usize) -> String {
    format!(
        "Conflicting {what}. Using \"{winner}\" from oldest service export in \"{oldest}\". \
         {disagree}/{total} clusters disagree."
    )
}

fn kind_name(kind: ImportType) -> &'static str {
    match kind {
        ImportType::ClusterSetIp => "ClusterSetIP",
        ImportType::Headless => "Headless",
    }
}

fn families(f: &[AddressFamily]) -> String {
    let names: Vec<&str> = f
        .iter()
        .map(|f| match f {
            AddressFamily::V4 => "IPv4",
            AddressFamily::V6 => "IPv6",
        })
        .collect();
    names.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{DnsLabel, Protocol};

    fn port(name: Option<&str>, protocol: Protocol, port: u16) -> ServicePortSpec {
        ServicePortSpec {
            name: name.map(|n| DnsLabel::parse(n).unwrap()),
            protocol,
            port,
            app_protocol: None,
        }
    }

    fn service(kind: ImportType, ports: Vec<ServicePortSpec>) -> ExportedService {
        ExportedService {
            kind,
            ports,
            session_affinity: SessionAffinity::None,
            affinity_timeout: None,
            ip_families: vec![AddressFamily::V4],
            cluster_ips: vec![],
            traffic_distribution: None,
            internal_traffic_policy: Some("Cluster".into()),
        }
    }

    fn export(cluster: &str, at: i64, s: ExportedService) -> ClusterExport {
        ClusterExport {
            cluster: ClusterId::parse(cluster).unwrap(),
            exported_at: at,
            service: Exported::Service(s),
            annotations: Default::default(),
            metadata: Default::default(),
        }
    }

    fn conflict_of<'m>(m: &'m Merged, cluster: &str) -> Option<&'m Condition> {
        let (_, conds) = m.conditions.iter().find(|(c, _)| c.as_str() == cluster)?;
        conds.iter().find(|c| c.kind == condition::CONFLICT)
    }

    fn http() -> ServicePortSpec {
        port(Some("http"), Protocol::Tcp, 80)
    }

    #[test]
    fn one_export_becomes_the_import_without_conflict() {
        let m = merge(&[export("a", 10, service(ImportType::ClusterSetIp, vec![http()]))]);
        let spec = m.spec.as_ref().unwrap();
        assert_eq!(spec.kind, ImportType::ClusterSetIp);
        assert_eq!(spec.ports, vec![http()]);
        assert_eq!(m.clusters.len(), 1);
        assert_eq!(conflict_of(&m, "a").unwrap().status, Status::False);
        assert_eq!(conflict_of(&m, "a").unwrap().reason, "NoConflicts");
    }

    #[test]
    fn ports_are_the_union_of_every_cluster() {
        let sctp = port(Some("stcp"), Protocol::Sctp, 142);
        let m = merge(&[
            export("a", 10, service(ImportType::ClusterSetIp, vec![http()])),
            export("b", 20, service(ImportType::ClusterSetIp, vec![http(), sctp.clone()])),
        ]);
        assert_eq!(m.spec.as_ref().unwrap().ports, vec![http(), sctp.clone()]);
        // Different port sets are a conflict, on every export, though the
        // import keeps the union (the conformance suite's reading of the KEP).
        for c in ["a", "b"] {
            let cond = conflict_of(&m, c).unwrap();
            assert_eq!((cond.status, cond.reason.as_str()), (Status::True, "PortConflict"));
            assert_eq!(
                cond.message,
                "Exported ports differ. Using the union [http (TCP/80), stcp (SCTP/142)]; 1/2 clusters do not export all of them: a."
            );
        }
        // The same ports in every cluster: no conflict.
        let m = merge(&[
            export("a", 10, service(ImportType::ClusterSetIp, vec![http(), sctp.clone()])),
            export("b", 20, service(ImportType::ClusterSetIp, vec![sctp, http()])),
        ]);
        assert_eq!(conflict_of(&m, "b").unwrap().reason, "NoConflicts");
    }

    #[test]
    fn unnamed_ports_of_different_clusters_merge_as_a_conflicting_union() {
        let m = merge(&[
            export("a", 10, service(ImportType::ClusterSetIp, vec![port(None, Protocol::Tcp, 80)])),
            export("b", 20, service(ImportType::ClusterSetIp, vec![port(None, Protocol::Tcp, 8080)])),
        ]);
        assert_eq!(
            m.spec.as_ref().unwrap().ports,
            vec![port(None, Protocol::Tcp, 80), port(None, Protocol::Tcp, 8080)]
        );
        assert_eq!(conflict_of(&m, "a").unwrap().reason, "PortConflict");
    }

    #[test]
    fn internal_traffic_policy_follows_the_oldest_export_and_conflicts() {
        let mut local = service(ImportType::ClusterSetIp, vec![]);
        local.internal_traffic_policy = Some("Local".into());
        let m = merge(&[export("b", 20, local), export("a", 10, service(ImportType::ClusterSetIp, vec![]))]);
        assert_eq!(m.spec.as_ref().unwrap().internal_traffic_policy.as_deref(), Some("Cluster"));
        let cond = conflict_of(&m, "b").unwrap();
        assert_eq!(cond.reason, "InternalTrafficPolicyConflict");
        assert!(
            cond.message.starts_with("Conflicting internalTrafficPolicy. Using \"Cluster\""),
            "{}",
            cond.message
        );
    }

    #[test]
    fn exported_labels_and_annotations_come_from_the_oldest_export_whole() {
        let with = |cluster: &str, at: i64, label: &str, annotation: &str| {
            let mut e = export(cluster, at, service(ImportType::ClusterSetIp, vec![]));
            e.metadata.labels.insert(label.into(), "true".into());
            e.metadata.annotations.insert(annotation.into(), "true".into());
            e
        };
        let m = merge(&[with("a", 10, "dummy-label", "dummy-annotation")]);
        let spec = m.spec.as_ref().unwrap();
        assert_eq!(spec.metadata.labels, [("dummy-label".to_owned(), "true".to_owned())].into());
        assert_eq!(spec.metadata.annotations, [("dummy-annotation".to_owned(), "true".to_owned())].into());
        assert_eq!(conflict_of(&m, "a").unwrap().reason, "NoConflicts");

        let m = merge(&[
            with("b", 20, "dummy-label2", "dummy-annotation2"),
            with("a", 10, "dummy-label", "dummy-annotation"),
        ]);
        let spec = m.spec.as_ref().unwrap();
        assert_eq!(spec.metadata.labels.keys().collect::<Vec<_>>(), ["dummy-label"]);
        assert_eq!(spec.metadata.annotations.keys().collect::<Vec<_>>(), ["dummy-annotation"]);
        for c in ["a", "b"] {
            let cond = conflict_of(&m, c).unwrap();
            assert_eq!(cond.status, Status::True);
            assert_eq!(cond.reason, "LabelsConflict,AnnotationsConflict");
        }
        // An export without any disagrees with one that has some.
        let m = merge(&[with("a", 10, "l", "a"), export("b", 20, service(ImportType::ClusterSetIp, vec![]))]);
        assert!(
            conflict_of(&m, "b").unwrap().message.contains("Conflicting exportedLabels. Using \"l=true\"")
        );
    }

    #[test]
    fn a_port_conflict_keeps_the_oldest_and_is_raised_on_every_export() {
        let m = merge(&[
            export("b", 20, service(ImportType::ClusterSetIp, vec![port(Some("http"), Protocol::Tcp, 81)])),
            export("a", 10, service(ImportType::ClusterSetIp, vec![http()])),
        ]);
        assert_eq!(m.spec.as_ref().unwrap().ports, vec![http()]);
        for c in ["a", "b"] {
            let cond = conflict_of(&m, c).unwrap();
            assert_eq!(cond.status, Status::True);
            assert_eq!(cond.reason, "PortConflict");
            assert_eq!(
                cond.message,
                "Conflicting ports. Using \"http (TCP/80)\" from oldest service export in \"a\". 1/2 clusters disagree."
            );
        }
        // The same number under another name conflicts too.
        let m = merge(&[
            export("a", 10, service(ImportType::ClusterSetIp, vec![http()])),
            export("b", 20, service(ImportType::ClusterSetIp, vec![port(Some("web"), Protocol::Tcp, 80)])),
        ]);
        assert_eq!(m.spec.as_ref().unwrap().ports, vec![http()]);
        assert_eq!(conflict_of(&m, "a").unwrap().reason, "PortConflict");
    }

    #[test]
    fn type_conflict_uses_the_oldest_and_counts_disagreeing_clusters() {
        let exports: Vec<ClusterExport> = (1..=5)
            .map(|i| {
                let kind = if i > 3 { ImportType::Headless } else { ImportType::ClusterSetIp };
                export(&format!("cluster-{i}"), 100 + i, service(kind, vec![http()]))
            })
            .collect();
        let m = merge(&exports);
        assert_eq!(m.spec.as_ref().unwrap().kind, ImportType::ClusterSetIp);
        let cond = conflict_of(&m, "cluster-5").unwrap();
        assert_eq!(cond.reason, "TypeConflict");
        assert_eq!(
            cond.message,
            "Conflicting type. Using \"ClusterSetIP\" from oldest service export in \"cluster-1\". 2/5 clusters disagree."
        );
    }

    #[test]
    fn the_oldest_valid_exports_annotations_configure_the_import() {
        let mut older = export("a", 1, service(ImportType::Headless, vec![]));
        older.annotations.insert("clusterset-dns.io/answer-policy".into(), "local-first".into());
        let mut newer = export("b", 2, service(ImportType::Headless, vec![]));
        newer.annotations.insert("clusterset-dns.io/answer-policy".into(), "random".into());
        let m = merge(&[newer, older]);
        let spec = m.spec.unwrap();
        assert_eq!(
            spec.annotations.get("clusterset-dns.io/answer-policy").map(String::as_str),
            Some("local-first")
        );
    }

    #[test]
    fn ties_in_age_are_broken_by_cluster_name() {
        let m = merge(&[
            export("b", 10, service(ImportType::Headless, vec![])),
            export("a", 10, service(ImportType::ClusterSetIp, vec![])),
        ]);
        assert_eq!(m.spec.as_ref().unwrap().kind, ImportType::ClusterSetIp);
        assert_eq!(m.clusters[0].as_str(), "a");
    }

    #[test]
    fn several_conflicts_join_their_reasons() {
        let mut newer = service(ImportType::Headless, vec![]);
        newer.session_affinity = SessionAffinity::ClientIp;
        newer.affinity_timeout = Some(60);
        newer.ip_families = vec![AddressFamily::V6];
        newer.traffic_distribution = Some("PreferClose".into());
        let m = merge(&[export("a", 1, service(ImportType::ClusterSetIp, vec![])), export("b", 2, newer)]);
        assert_eq!(
            conflict_of(&m, "a").unwrap().reason,
            "TypeConflict,SessionAffinityConflict,TrafficDistributionConflict"
        );
        let spec = m.spec.as_ref().unwrap();
        assert_eq!(spec.session_affinity, SessionAffinity::None);
        assert_eq!(spec.ip_families, vec![AddressFamily::V4]);
    }

    #[test]
    fn affinity_config_conflicts_only_between_equal_affinities() {
        let client_ip = |t| {
            let mut s = service(ImportType::ClusterSetIp, vec![]);
            s.session_affinity = SessionAffinity::ClientIp;
            s.affinity_timeout = Some(t);
            s
        };
        let m = merge(&[export("a", 1, client_ip(60)), export("b", 2, client_ip(90))]);
        assert_eq!(conflict_of(&m, "b").unwrap().reason, "SessionAffinityConfigConflict");
        assert_eq!(m.spec.as_ref().unwrap().affinity_timeout, Some(60));
    }

    #[test]
    fn ip_families_conflict_only_between_services_with_cluster_ips() {
        let mut v6 = service(ImportType::ClusterSetIp, vec![]);
        v6.ip_families = vec![AddressFamily::V6];
        let mut headless = service(ImportType::Headless, vec![]);
        headless.ip_families = vec![AddressFamily::V4, AddressFamily::V6];
        let m = merge(&[
            export("a", 1, service(ImportType::ClusterSetIp, vec![])),
            export("b", 2, v6),
            export("c", 3, headless),
        ]);
        let cond = conflict_of(&m, "c").unwrap();
        assert_eq!(cond.reason, "TypeConflict,IPFamilyConflict");
        assert!(
            cond.message
                .ends_with("Using \"IPv4\" from oldest service export in \"a\". 1/2 clusters disagree."),
            "{}",
            cond.message
        );
    }

    #[test]
    fn the_import_does_not_change_while_a_newer_export_conflicts() {
        let base = [export("a", 1, service(ImportType::ClusterSetIp, vec![http()]))];
        let alone = merge(&base).spec;
        let mut with = base.to_vec();
        with.push(export("b", 2, service(ImportType::Headless, vec![port(Some("http"), Protocol::Tcp, 81)])));
        assert_eq!(merge(&with).spec, alone);
    }

    #[test]
    fn invalid_exports_get_valid_false_and_no_import_alone() {
        let m = merge(&[
            ClusterExport {
                cluster: ClusterId::parse("a").unwrap(),
                exported_at: 1,
                service: Exported::NoService,
                annotations: Default::default(),
                metadata: Default::default(),
            },
            ClusterExport {
                cluster: ClusterId::parse("b").unwrap(),
                exported_at: 2,
                service: Exported::InvalidType("ExternalName".into()),
                annotations: Default::default(),
                metadata: Default::default(),
            },
        ]);
        assert_eq!(m.spec, None);
        assert!(m.clusters.is_empty());
        let reasons: Vec<&str> = m.conditions.iter().map(|(_, c)| c[0].reason.as_str()).collect();
        assert_eq!(reasons, ["NoService", "InvalidServiceType"]);
        assert!(m.conditions.iter().all(|(_, c)| c[0].status == Status::False && c.len() == 1));
    }

    #[test]
    fn an_invalid_export_does_not_take_part_in_conflicts() {
        let m = merge(&[
            ClusterExport {
                cluster: ClusterId::parse("a").unwrap(),
                exported_at: 1,
                service: Exported::InvalidType("ExternalName".into()),
                annotations: Default::default(),
                metadata: Default::default(),
            },
            export("b", 2, service(ImportType::Headless, vec![])),
        ]);
        assert_eq!(m.spec.as_ref().unwrap().kind, ImportType::Headless);
        assert_eq!(m.clusters.len(), 1);
    }
}
