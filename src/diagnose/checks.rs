//! Observations → verdicts: what is inconsistent about one service across
//! the members, and what to do. Pure.
//!
//! The exports are merged by the controller's own rules
//! ([`crate::fleet::merge`]), so the import every member should have, the
//! winner of each conflict and the clusters whose endpoints belong in it
//! are the ones `sync` would write; each member's objects, and its DNS
//! answers, are then compared with that.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use super::observed::{Answer, MemberSeen, Observed, Seen, SeenDns, SeenExport, SeenSlice};
use crate::fleet::export::{ClusterExport, Exported, ExportedService, ServicePortSpec};
use crate::fleet::merge::{self, Merged};
use crate::fleet::objects::MANAGED_BY;
use crate::model::{AddressFamily, ClusterId, ImportType};

/// How much a verdict matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Some clients get a wrong answer or no traffic reaches some endpoints.
    Error,
    /// Inconsistent, or not yet converged; may break later.
    Warning,
    /// Worth knowing; not a problem (does not change the exit code).
    Note,
}

impl Severity {
    /// The word shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Error => "error",
            Self::Warning => "warning",
            Self::Note => "note",
        }
    }
}

/// One finding.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Verdict {
    /// How much it matters.
    pub severity: Severity,
    /// A stable CamelCase code (`PortConflict`, `ImportMissing`, …), for scripts.
    pub code: &'static str,
    /// The members concerned (their configured names).
    pub clusters: Vec<String>,
    /// What is wrong.
    pub problem: String,
    /// What to do about it.
    pub action: String,
}

/// Every verdict about the service, errors first.
pub fn verdicts(o: &Observed) -> Vec<Verdict> {
    let mut c = Checks { o, out: Vec::new() };
    c.reads();
    let merged = c.exports();
    c.conditions(&merged);
    c.imports(&merged);
    c.slices(&merged);
    c.dns(&merged);
    let mut out = c.out;
    // Stable: errors first, then in the order found.
    out.sort_by_key(|v| v.severity);
    out
}

/// A member whose API could not be read at all (its Service read, which
/// every API serves, failed): the diagnosis is incomplete.
pub fn unreachable(m: &MemberSeen) -> bool {
    matches!(m.service, Seen::Failed(_))
}

struct Checks<'a> {
    o: &'a Observed,
    out: Vec<Verdict>,
}

impl<'a> Checks<'a> {
    fn push(
        &mut self,
        severity: Severity,
        code: &'static str,
        clusters: &[&str],
        problem: String,
        action: String,
    ) {
        let clusters = clusters.iter().map(|c| (*c).to_owned()).collect();
        self.out.push(Verdict { severity, code, clusters, problem, action });
    }

    fn name(&self) -> String {
        format!("{}/{}", self.o.key.namespace, self.o.key.name)
    }

    /// The member with this cluster id.
    fn member_of(&self, cluster: &str) -> Option<&'a MemberSeen> {
        self.o.members.iter().find(|m| m.cluster.as_str() == cluster)
    }

    /// True when every member's exports and Services were read: only then
    /// does "nobody exports it" (stale imports and slices) hold.
    fn exports_known(&self) -> bool {
        self.o.members.iter().all(|m| m.export.read().is_some() && m.service.read().is_some())
    }

    /// A cluster id as people know it: its member's name.
    fn shown(&self, cluster: &ClusterId) -> String {
        self.member_of(cluster.as_str()).map_or_else(|| cluster.to_string(), |m| m.name.clone())
    }

    /// Reads that were forbidden or failed.
    fn reads(&mut self) {
        for m in &self.o.members {
            if let Seen::Failed(e) = &m.service {
                self.push(
                    Severity::Error,
                    "Unreachable",
                    &[&m.name],
                    format!("{}: cannot read its API: {e}", m.name),
                    "check the member's kubeconfig and that its API server answers; the checks below leave it out"
                        .into(),
                );
                continue;
            }
            let reads: [(&str, &str, Option<&String>, Option<&String>); 5] = [
                ("ServiceExports", "serviceexports", forbidden(&m.export), failed(&m.export)),
                ("ServiceImports", "serviceimports", forbidden(&m.import), failed(&m.import)),
                ("Services", "services", forbidden(&m.vip), failed(&m.vip)),
                ("EndpointSlices", "endpointslices", forbidden(&m.mcs_slices), failed(&m.mcs_slices)),
                ("EndpointSlices", "endpointslices", forbidden(&m.own_slices), failed(&m.own_slices)),
            ];
            let mut said = BTreeSet::new();
            for (kind, resource, no, err) in reads {
                if !said.insert(kind) {
                    continue;
                }
                if let Some(e) = no {
                    self.push(
                        Severity::Warning,
                        "Forbidden",
                        &[&m.name],
                        format!("{}: may not list {kind} in namespace {}: {e}", m.name, self.o.key.namespace),
                        format!(
                            "give the identity `list` on {resource} (deploy/centralized/rbac.yaml grants every read doctor makes); what needs them is not checked"
                        ),
                    );
                }
                if let Some(e) = err {
                    self.push(
                        Severity::Error,
                        "ReadFailed",
                        &[&m.name],
                        format!("{}: cannot list {kind}: {e}", m.name),
                        "install the MCS CRDs (deploy/crds/) if they are missing; otherwise check the API server".into(),
                    );
                }
            }
        }
    }

    /// Exports and Services; returns the merge of the valid exports.
    fn exports(&mut self) -> Merged {
        let name = self.name();
        let exporters: Vec<&MemberSeen> =
            self.o.members.iter().filter(|m| m.export.found().is_some()).collect();
        let importers = self.o.members.iter().filter(|m| m.import.found().is_some()).count();
        if exporters.is_empty() {
            let with_service: Vec<&str> = self
                .o
                .members
                .iter()
                .filter(|m| m.service.found().is_some())
                .map(|m| m.name.as_str())
                .collect();
            let problem = if with_service.is_empty() {
                format!("no member has a Service or a ServiceExport {name}")
            } else {
                format!("no member exports {name} (Services exist in {})", with_service.join(", "))
            };
            if importers == 0 && self.exports_known() {
                self.push(
                    Severity::Error,
                    "NotExported",
                    &with_service,
                    format!("{problem}: {} resolves nowhere", self.o.fqdn),
                    format!(
                        "create a ServiceExport named {} in namespace {} in each cluster that should serve it",
                        self.o.key.name, self.o.key.namespace
                    ),
                );
            }
        }
        let mut exports = Vec::new();
        for m in &self.o.members {
            let Some(export) = m.export.found() else {
                if let Some(s) = m.service.found()
                    && !exporters.is_empty()
                    && !matches!(s.exported, Exported::InvalidType(_))
                {
                    self.push(
                        Severity::Note,
                        "NotExportedHere",
                        &[&m.name],
                        format!(
                            "{} has a Service {name} but no ServiceExport: its endpoints are not part of {}",
                            m.name, self.o.fqdn
                        ),
                        "export it there too if it should take clusterset traffic".into(),
                    );
                }
                continue;
            };
            let service = match &m.service {
                Seen::Read(Some(s)) => s.exported.clone(),
                Seen::Read(None) => Exported::NoService,
                // Unknown: left out of the merge rather than guessed.
                _ => continue,
            };
            match &service {
                Exported::NoService => self.push(
                    Severity::Error,
                    "NoService",
                    &[&m.name],
                    format!(
                        "{} exports {name} but has no Service {name}{}",
                        m.name,
                        condition_note(export, "Valid")
                    ),
                    format!("create the Service in {}, or delete its ServiceExport", m.name),
                ),
                Exported::InvalidType(t) => self.push(
                    Severity::Error,
                    "InvalidServiceType",
                    &[&m.name],
                    format!("{} exports {name}, a Service {t}, which cannot be exported", m.name),
                    "export a ClusterIP or headless Service instead".into(),
                ),
                // Doctor reads members one by one; the controller alone sets this.
                Exported::DuplicateCluster(_) | Exported::Service(_) => {}
            }
            exports.push(ClusterExport {
                cluster: m.cluster.clone(),
                exported_at: export.created,
                service,
                annotations: export.annotations.clone(),
                metadata: export.metadata.clone(),
            });
        }
        let merged = merge::merge(&exports);
        self.conflicts(&exports, &merged);
        merged
    }

    /// The merge's conflicts, cluster by cluster.
    fn conflicts(&mut self, exports: &[ClusterExport], merged: &Merged) {
        let Some(spec) = &merged.spec else { return };
        let valid: Vec<(&ClusterExport, &ExportedService)> = {
            let mut v: Vec<_> = exports
                .iter()
                .filter_map(|e| match &e.service {
                    Exported::Service(s) => Some((e, s)),
                    _ => None,
                })
                .collect();
            v.sort_by(|a, b| a.0.precedence().cmp(&b.0.precedence()));
            v
        };
        let Some(&(oldest, first)) = valid.first() else { return };
        let winner = self.shown(&oldest.cluster);
        let wins = format!("the oldest export, in {winner}, wins");
        for &(e, s) in &valid[1..] {
            let who = self.shown(&e.cluster);
            if s.kind != first.kind {
                self.push(
                    Severity::Error,
                    "TypeConflict",
                    &[&who, &winner],
                    format!(
                        "{who}'s Service is {} but the import is {} (from {winner}): TypeConflict, {wins}",
                        kind(s.kind),
                        kind(spec.kind)
                    ),
                    format!(
                        "make {who}'s Service {} like {winner}'s (clusterIP cannot change: recreate it), or unexport it there",
                        if first.kind == ImportType::Headless { "headless (clusterIP: None)" } else { "a ClusterIP Service" }
                    ),
                );
            }
            for p in &s.ports {
                if spec.ports.contains(p) {
                    continue;
                }
                let kept = spec.ports.iter().find(|m| {
                    (m.name.is_some() && m.name == p.name) || (m.protocol == p.protocol && m.port == p.port)
                });
                if let Some(kept) = kept {
                    self.push(
                        Severity::Error,
                        "PortConflict",
                        &[&who, &winner],
                        format!("{who} exports port {p} but the import lists {kept}: PortConflict, {wins}"),
                        format!(
                            "give {who}'s Service port {kept} like {winner}'s, or use another name and number for the different port"
                        ),
                    );
                }
            }
            let mut global = |code: &'static str, what: &str, theirs: String, ours: String| {
                if theirs != ours {
                    self.out.push(Verdict {
                        severity: Severity::Warning,
                        code,
                        clusters: vec![who.clone(), winner.clone()],
                        problem: format!(
                            "{who} has {what} {theirs} but the import has {ours} (from {winner}): {code}, {wins}"
                        ),
                        action: format!("set the same {what} on the Service in every cluster"),
                    });
                }
            };
            global(
                "SessionAffinityConflict",
                "sessionAffinity",
                s.session_affinity.as_str().into(),
                first.session_affinity.as_str().into(),
            );
            if s.session_affinity == first.session_affinity {
                global(
                    "SessionAffinityConfigConflict",
                    "sessionAffinityConfig timeoutSeconds",
                    format!("{:?}", s.affinity_timeout),
                    format!("{:?}", first.affinity_timeout),
                );
            }
            global(
                "TrafficDistributionConflict",
                "trafficDistribution",
                s.traffic_distribution.clone().unwrap_or_else(|| "unset".into()),
                first.traffic_distribution.clone().unwrap_or_else(|| "unset".into()),
            );
            if s.kind == ImportType::ClusterSetIp && first.kind == ImportType::ClusterSetIp {
                global(
                    "IPFamilyConflict",
                    "ipFamilies",
                    families(&s.ip_families),
                    families(&first.ip_families),
                );
            }
        }
        // Ports of the import a cluster does not serve: not a conflict (the
        // import is the union), but that port only reaches the others.
        for &(e, s) in &valid {
            let missing: Vec<String> = spec
                .ports
                .iter()
                .filter(|p| {
                    !s.ports.iter().any(|q| {
                        (q.name.is_some() && q.name == p.name)
                            || (q.protocol == p.protocol && q.port == p.port)
                    })
                })
                .map(ToString::to_string)
                .collect();
            if !missing.is_empty() {
                let who = self.shown(&e.cluster);
                self.push(
                    Severity::Note,
                    "PortNotServed",
                    &[&who],
                    format!("{who}'s Service has no port {} of the import: that port only reaches the other clusters", missing.join(", ")),
                    format!("add the port to {who}'s Service if it should serve it"),
                );
            }
        }
    }

    /// Export conditions against what the merge says.
    fn conditions(&mut self, merged: &Merged) {
        for m in &self.o.members {
            let Some(export) = m.export.found() else { continue };
            let Some((_, expected)) = merged.conditions.iter().find(|(c, _)| *c == m.cluster) else {
                continue;
            };
            if export.conditions.is_empty() {
                self.push(
                    Severity::Warning,
                    "NoConditions",
                    &[&m.name],
                    format!("{}'s ServiceExport has no status conditions: no controller has processed it", m.name),
                    format!(
                        "run the sync controller with {} as a member (clusterset-dns sync --cluster {}=KUBECONFIG …), or read its log",
                        m.name, m.name
                    ),
                );
                continue;
            }
            for want in expected {
                let seen = export.condition(want.kind);
                let agrees = seen.is_some_and(|s| {
                    s.status == want.status.as_str()
                        && (want.status != merge::Status::True || reasons(&s.reason) == reasons(&want.reason))
                });
                if !agrees {
                    let shown = seen.map_or_else(
                        || "none".to_owned(),
                        |s| format!("{}={} {}: {}", s.type_, s.status, s.reason, s.message),
                    );
                    self.push(
                        Severity::Warning,
                        "StaleCondition",
                        &[&m.name],
                        format!(
                            "{}'s export shows {} condition {shown}; its objects make it {}={} {}",
                            m.name,
                            want.kind,
                            want.kind,
                            want.status.as_str(),
                            want.reason
                        ),
                        "the controller rewrites conditions on its next reconcile; if this stays, check that it runs and its log".into(),
                    );
                }
            }
            if let Some(ready) = export.condition("Ready")
                && ready.status != "True"
                && merged.spec.is_some()
                && matches!(m.service.found().map(|s| &s.exported), Some(Exported::Service(_)))
            {
                self.push(
                    Severity::Warning,
                    "NotReady",
                    &[&m.name],
                    format!(
                        "{}'s export is Ready={} {}: {}",
                        m.name, ready.status, ready.reason, ready.message
                    ),
                    "the controller could not write the import into every member yet: read its log".into(),
                );
            }
        }
    }

    /// Every member's ServiceImport and VIP against the merged import.
    fn imports(&mut self, merged: &Merged) {
        let name = self.name();
        for m in &self.o.members {
            let Seen::Read(import) = &m.import else { continue };
            let Some(spec) = &merged.spec else {
                if import.is_some() && self.exports_known() {
                    self.push(
                        Severity::Warning,
                        "StaleImport",
                        &[&m.name],
                        format!("{} has a ServiceImport {name} but no member exports it validly", m.name),
                        "the controller deletes it once every member has listed; if none runs for this member, delete it"
                            .into(),
                    );
                }
                continue;
            };
            let Some(import) = import else {
                self.push(
                    Severity::Error,
                    "ImportMissing",
                    &[&m.name],
                    format!("{} has no ServiceImport {name}: {} does not resolve there", m.name, self.o.fqdn),
                    format!(
                        "check that the sync controller runs with {} as a member, and that namespace {} exists there (no namespace, no import)",
                        m.name, self.o.key.namespace
                    ),
                );
                continue;
            };
            let want = kind(spec.kind);
            if import.type_ != want {
                self.push(
                    Severity::Error,
                    "ImportType",
                    &[&m.name],
                    format!("{}'s ServiceImport is {:?}; the exports make it {want}", m.name, import.type_),
                    "the controller rewrites it on its next reconcile; if this stays, check its log".into(),
                );
            }
            let have: BTreeSet<&ServicePortSpec> = import.ports.iter().collect();
            let expect: BTreeSet<&ServicePortSpec> = spec.ports.iter().collect();
            if have != expect {
                self.push(
                    Severity::Error,
                    "ImportPorts",
                    &[&m.name],
                    format!(
                        "{}'s ServiceImport lists ports {}; the exports make {}",
                        m.name,
                        ports(&import.ports),
                        ports(&spec.ports)
                    ),
                    "the controller rewrites it on its next reconcile; if this stays, check its log".into(),
                );
            }
            let listed: BTreeSet<&str> = import.clusters.iter().map(String::as_str).collect();
            let valid: BTreeSet<&str> = merged.clusters.iter().map(ClusterId::as_str).collect();
            if listed != valid && self.exports_known() {
                self.push(
                    Severity::Warning,
                    "ImportClusters",
                    &[&m.name],
                    format!(
                        "{}'s ServiceImport status lists clusters [{}]; the valid exports are in [{}]",
                        m.name,
                        join(listed),
                        join(valid)
                    ),
                    "the controller rewrites the status on its next reconcile; if this stays, check its log"
                        .into(),
                );
            }
            if !import.unreachable.is_empty() {
                self.push(
                    Severity::Warning,
                    "SourceUnreachable",
                    &[&m.name],
                    format!(
                        "{}'s ServiceImport marks {} unreachable: their endpoints are kept as last seen",
                        m.name,
                        import.unreachable.join(", ")
                    ),
                    "check those clusters' API servers and the controller's access to them".into(),
                );
            }
            if spec.kind != ImportType::ClusterSetIp {
                continue;
            }
            let ips: BTreeSet<String> = import.ips.iter().map(|ip| normal(ip)).collect();
            match &m.vip {
                _ if ips.is_empty() => self.push(
                    Severity::Error,
                    "NoClusterSetIP",
                    &[&m.name],
                    format!("{}'s ServiceImport has no ips: {} has no address there", m.name, self.o.fqdn),
                    format!(
                        "check the controller's log: it takes the clusterset IP from the VIP Service it keeps in {} (internal, {})",
                        m.name, self.o.vip_name
                    ),
                ),
                Seen::Read(None) => self.push(
                    Severity::Error,
                    "VipMissing",
                    &[&m.name],
                    format!(
                        "{} has no clusterset VIP Service (internal, {}): the import's ips {} route nowhere",
                        m.name,
                        self.o.vip_name,
                        join(ips.iter().map(String::as_str))
                    ),
                    "the controller recreates it on its next reconcile; if this stays, check its log".into(),
                ),
                Seen::Read(Some(vip)) => {
                    let allocated: BTreeSet<String> = vip.iter().map(|ip| normal(ip)).collect();
                    if allocated != ips {
                        self.push(
                            Severity::Error,
                            "VipMismatch",
                            &[&m.name],
                            format!(
                                "{}'s ServiceImport lists ips {} but the clusterset VIP allocated there is {}: clients get an address no Service routes",
                                m.name,
                                join(ips.iter().map(String::as_str)),
                                join(allocated.iter().map(String::as_str))
                            ),
                            "the controller rewrites the import when it reconciles the service; restart it if this stays".into(),
                        );
                    }
                }
                _ => {}
            }
        }
    }

    /// MCS EndpointSlices: every valid exporter's endpoints in every member,
    /// nothing from clusters that do not export.
    fn slices(&mut self, merged: &Merged) {
        let name = self.name();
        let valid: Vec<&ClusterId> = merged.clusters.iter().collect();
        // What each valid exporter has itself.
        let mut own: BTreeMap<&str, BTreeSet<IpAddr>> = BTreeMap::new();
        for c in &valid {
            let Some(m) = self.member_of(c.as_str()) else { continue };
            let Some(slices) = m.own_slices.read() else { continue };
            let ready = ready(slices.iter());
            if ready.is_empty() {
                self.push(
                    Severity::Warning,
                    "NoReadyEndpoints",
                    &[&m.name],
                    format!("{} exports {name} but has no ready endpoints", m.name),
                    format!(
                        "check its Pods and the Service's selector (kubectl -n {} get endpointslices -l kubernetes.io/service-name={})",
                        self.o.key.namespace, self.o.key.name
                    ),
                );
            }
            own.insert(c.as_str(), ready);
        }
        for m in &self.o.members {
            let Some(slices) = m.mcs_slices.read() else { continue };
            let mut by_source: BTreeMap<Option<&str>, Vec<&SeenSlice>> = BTreeMap::new();
            for s in slices {
                by_source.entry(s.source.as_deref()).or_default().push(s);
            }
            for c in &valid {
                let from = by_source.get(&Some(c.as_str())).map(Vec::as_slice).unwrap_or(&[]);
                let there = ready(from.iter().copied());
                let source = self.shown(c);
                match own.get(c.as_str()) {
                    Some(at_source) if from.is_empty() && !at_source.is_empty() => self.push(
                        Severity::Error,
                        "SlicesMissing",
                        &[&m.name, &source],
                        format!(
                            "{} has no MCS EndpointSlices from {source}, which exports {name} with {} ready endpoint(s): clients in {} never reach {source}",
                            m.name,
                            at_source.len(),
                            m.name
                        ),
                        format!("check the sync controller: it mirrors {source}'s slices into every member"),
                    ),
                    Some(at_source) if &there != at_source => self.push(
                        Severity::Warning,
                        "SlicesStale",
                        &[&m.name, &source],
                        format!(
                            "{}'s MCS EndpointSlices from {source} list {} ready endpoint(s), {source} has {}",
                            m.name,
                            there.len(),
                            at_source.len()
                        ),
                        "the controller catches up within seconds; if this stays, check its log".into(),
                    ),
                    _ => {}
                }
            }
            for (source, from) in &by_source {
                let count = ready(from.iter().copied()).len();
                let managers: BTreeSet<&str> =
                    from.iter().map(|s| s.managed_by.as_deref().unwrap_or(MANAGED_BY)).collect();
                match source {
                    None => self.push(
                        Severity::Warning,
                        "SliceWithoutSource",
                        &[&m.name],
                        format!(
                            "{} has MCS EndpointSlices of {name} without a multicluster.kubernetes.io/source-cluster label: {}",
                            m.name,
                            from.iter().map(|s| s.name.as_str()).collect::<Vec<_>>().join(", ")
                        ),
                        "label them with their source cluster, or delete them".into(),
                    ),
                    Some(s) if valid.iter().any(|c| c.as_str() == *s) => {}
                    // Unknown exports cannot make slices stale.
                    Some(_) if !self.exports_known() => {}
                    Some(s) => match self.member_of(s) {
                        Some(src) => self.push(
                            Severity::Error,
                            "StaleSlices",
                            &[&m.name, &src.name],
                            format!(
                                "{} has MCS EndpointSlices from {}, which does not export {name} (validly): {count} ready endpoint(s) there still get traffic (written by {})",
                                m.name,
                                src.name,
                                join(managers.iter().copied())
                            ),
                            format!(
                                "the controller deletes them once every member has listed; if they stay: kubectl -n {} delete endpointslices -l multicluster.kubernetes.io/service-name={},multicluster.kubernetes.io/source-cluster={s}",
                                self.o.key.namespace, self.o.key.name
                            ),
                        ),
                        None => self.push(
                            Severity::Note,
                            "UnknownSource",
                            &[&m.name],
                            format!(
                                "{} has MCS EndpointSlices from {s}, which is not among the members given ({count} ready endpoint(s))",
                                m.name
                            ),
                            format!("add --cluster {s}=KUBECONFIG to check it"),
                        ),
                    },
                }
            }
        }
    }

    /// Each member's DNS answers against its import and endpoints.
    fn dns(&mut self, merged: &Merged) {
        let name = self.name();
        for m in &self.o.members {
            let Some(dns) = &m.dns else { continue };
            let server = dns.server;
            let (rcode, records) = match (&dns.a, &dns.aaaa) {
                (Answer::NoResponse(e), _) | (_, Answer::NoResponse(e)) => {
                    self.push(
                        Severity::Error,
                        "DnsNoAnswer",
                        &[&m.name],
                        format!("{}'s DNS {server} did not answer {}: {e}", m.name, self.o.fqdn),
                        "check --dns's address, and that clusterset-dns (or CoreDNS forwarding to it) runs there".into(),
                    );
                    continue;
                }
                (Answer::Response { rcode, records }, Answer::Response { rcode: r6, records: more }) => {
                    // One answer per name: the worse code of the two.
                    let rcode = if rcode == "NOERROR" { r6 } else { rcode };
                    (
                        rcode.as_str(),
                        records
                            .iter()
                            .chain(more)
                            .filter_map(|r| r.parse::<IpAddr>().ok())
                            .collect::<BTreeSet<_>>(),
                    )
                }
            };
            let import = m.import.found();
            let fqdn = &self.o.fqdn;
            match rcode {
                "NOERROR" => {}
                "NXDOMAIN" if import.is_none() && merged.spec.is_some() && m.import.read().is_some() => {
                    // The missing import is the verdict already; the answer confirms it.
                    continue;
                }
                "NXDOMAIN" => {
                    let why = if import.is_some() {
                        format!("but {} has its ServiceImport", m.name)
                    } else {
                        "and nothing is imported".to_owned()
                    };
                    self.push(
                        Severity::Error,
                        "DnsNxdomain",
                        &[&m.name],
                        format!("{}'s DNS {server} answers NXDOMAIN for {fqdn} {why}", m.name),
                        format!(
                            "check that clusterset-dns there watches this cluster's API and namespace {} (--namespace), and that CoreDNS forwards the zone to it",
                            self.o.key.namespace
                        ),
                    );
                    continue;
                }
                "SERVFAIL" => {
                    self.push(
                        Severity::Error,
                        "DnsServfail",
                        &[&m.name],
                        format!("{}'s DNS {server} answers SERVFAIL for {fqdn}", m.name),
                        "clusterset-dns answers SERVFAIL until its watches have listed (see its /ready), and CoreDNS when it cannot reach its forward target: check both".into(),
                    );
                    continue;
                }
                other => {
                    self.push(
                        Severity::Error,
                        "DnsRcode",
                        &[&m.name],
                        format!("{}'s DNS {server} answers {other} for {fqdn}", m.name),
                        "the query did not reach a server for the zone: point --dns at clusterset-dns, or at a CoreDNS with the forward stanza of Corefile.example".into(),
                    );
                    continue;
                }
            }
            let Some(import) = import else {
                if !records.is_empty() {
                    self.push(
                        Severity::Note,
                        "DnsWithoutImport",
                        &[&m.name],
                        format!(
                            "{}'s DNS answers {} though {} has no ServiceImport {name}: it answers from other clusters' objects (centralized serve?)",
                            m.name,
                            join(records.iter().map(ToString::to_string)),
                            m.name
                        ),
                        "fine for a centralized server; otherwise check which API it watches".into(),
                    );
                }
                continue;
            };
            let endpoints: BTreeSet<IpAddr> =
                m.mcs_slices.read().map(|s| ready(s.iter())).unwrap_or_default();
            let shown = |s: &BTreeSet<IpAddr>| {
                if s.is_empty() { "nothing".to_owned() } else { join(s.iter().map(ToString::to_string)) }
            };
            if import.type_ == "ClusterSetIP" && !import.endpoint_answers {
                let ips: BTreeSet<IpAddr> =
                    import.ips.iter().filter_map(|ip| ip.trim().parse().ok()).collect();
                if records != ips {
                    if !records.is_empty() && records == endpoints {
                        self.push(
                            Severity::Note,
                            "EndpointAnswers",
                            &[&m.name],
                            format!(
                                "{}'s DNS answers the ready endpoints instead of the clusterset IP",
                                m.name
                            ),
                            "expected with serve --endpoint-answers; otherwise check the server's flags"
                                .into(),
                        );
                    } else {
                        self.push(
                            Severity::Error,
                            "DnsMismatch",
                            &[&m.name],
                            format!(
                                "{}'s DNS {server} answers {} for {fqdn} but the ServiceImport there lists ips {}",
                                m.name,
                                shown(&records),
                                shown(&ips)
                            ),
                            "the server answers from other objects than this cluster's: check which API and namespaces clusterset-dns there watches, and its /ready".into(),
                        );
                    }
                }
            } else {
                let unknown: BTreeSet<IpAddr> = records.difference(&endpoints).copied().collect();
                if !unknown.is_empty() || (records.is_empty() && !endpoints.is_empty()) {
                    self.push(
                        Severity::Error,
                        "DnsMismatch",
                        &[&m.name],
                        format!(
                            "{}'s DNS {server} answers {} for {fqdn}; the ready endpoints there are {}",
                            m.name,
                            shown(&records),
                            shown(&endpoints)
                        ),
                        "the server answers from other objects than this cluster's: check which API and namespaces clusterset-dns there watches, and its /ready".into(),
                    );
                } else if records.len() < endpoints.len() {
                    self.push(
                        Severity::Note,
                        "DnsSubset",
                        &[&m.name],
                        format!(
                            "{}'s DNS answers {} of the {} ready endpoints",
                            m.name,
                            records.len(),
                            endpoints.len()
                        ),
                        "expected with an answer policy, --max-answers or failed health probes (clusterset-dns explain shows why)".into(),
                    );
                }
            }
            self.srv(m, dns, import.ports.as_slice());
        }
    }

    /// The SRV answer's ports against the import's.
    fn srv(&mut self, m: &MemberSeen, dns: &SeenDns, want: &[ServicePortSpec]) {
        let Answer::Response { rcode, records } = &dns.srv else { return };
        if rcode != "NOERROR" {
            return;
        }
        let got: BTreeSet<u16> =
            records.iter().filter_map(|r| r.split_whitespace().nth(2)?.parse().ok()).collect();
        let expect: BTreeSet<u16> = want.iter().map(|p| p.port).collect();
        if got != expect {
            self.push(
                Severity::Warning,
                "DnsSrvPorts",
                &[&m.name],
                format!(
                    "{}'s DNS answers SRV ports {} for {}; the ServiceImport lists {}",
                    m.name,
                    join(got.iter().map(ToString::to_string)),
                    self.o.fqdn,
                    join(expect.iter().map(ToString::to_string))
                ),
                "the server has not caught up with the import, or answers from other objects".into(),
            );
        }
    }
}

fn forbidden<T>(s: &Seen<T>) -> Option<&String> {
    match s {
        Seen::Forbidden(e) => Some(e),
        _ => None,
    }
}

fn failed<T>(s: &Seen<T>) -> Option<&String> {
    match s {
        Seen::Failed(e) => Some(e),
        _ => None,
    }
}

/// `": Valid=False NoService"` when the export has that condition.
fn condition_note(export: &SeenExport, type_: &str) -> String {
    export
        .condition(type_)
        .filter(|c| c.status != "True")
        .map_or_else(String::new, |c| format!(" (its export shows {}={} {})", c.type_, c.status, c.reason))
}

fn ready<'s>(slices: impl Iterator<Item = &'s SeenSlice>) -> BTreeSet<IpAddr> {
    slices.flat_map(|s| s.ready.iter().copied()).collect()
}

fn reasons(r: &str) -> BTreeSet<&str> {
    r.split(',').map(str::trim).filter(|r| !r.is_empty()).collect()
}

fn kind(k: ImportType) -> &'static str {
    match k {
        ImportType::ClusterSetIp => "ClusterSetIP",
        ImportType::Headless => "Headless",
    }
}

fn families(f: &[AddressFamily]) -> String {
    let names: Vec<&str> = f.iter().map(|f| if *f == AddressFamily::V4 { "IPv4" } else { "IPv6" }).collect();
    names.join(",")
}

fn ports(p: &[ServicePortSpec]) -> String {
    if p.is_empty() {
        "none".into()
    } else {
        p.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
    }
}

/// An address in canonical form (so `fd00::0:1` equals `fd00::1`).
fn normal(ip: &str) -> String {
    ip.trim().parse::<IpAddr>().map_or_else(|_| ip.trim().to_owned(), |ip| ip.to_string())
}

fn join<'s>(items: impl IntoIterator<Item = impl Into<std::borrow::Cow<'s, str>>>) -> String {
    let v: Vec<String> = items.into_iter().map(|s| s.into().into_owned()).collect();
    if v.is_empty() { "none".into() } else { v.join(", ") }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnose::observed::{SeenCondition, SeenImport, SeenService};
    use crate::diagnose::report::{HEALTHY, INCOMPLETE, PROBLEMS, exit_status};
    use crate::fleet::export::SessionAffinity;
    use crate::model::{DnsLabel, Protocol, ServiceKey};

    fn port(name: &str, number: u16) -> ServicePortSpec {
        ServicePortSpec {
            name: Some(DnsLabel::parse(name).unwrap()),
            protocol: Protocol::Tcp,
            port: number,
            app_protocol: None,
        }
    }

    fn service(kind: ImportType, ports: Vec<ServicePortSpec>) -> SeenService {
        SeenService {
            type_: "ClusterIP".into(),
            headless: kind == ImportType::Headless,
            cluster_ips: vec![],
            exported: Exported::Service(ExportedService {
                kind,
                ports,
                session_affinity: SessionAffinity::None,
                affinity_timeout: None,
                ip_families: vec![AddressFamily::V4],
                cluster_ips: vec![],
                traffic_distribution: None,
                internal_traffic_policy: None,
            }),
        }
    }

    fn export(created: i64, conflict: Option<&str>) -> SeenExport {
        let c = |t: &str, s: &str, r: &str| SeenCondition {
            type_: t.into(),
            status: s.into(),
            reason: r.into(),
            message: String::new(),
        };
        let conflict = match conflict {
            None => c("Conflict", "False", "NoConflicts"),
            Some(r) => c("Conflict", "True", r),
        };
        SeenExport {
            created,
            created_text: format!("t{created}"),
            conditions: vec![c("Valid", "True", "Valid"), conflict, c("Ready", "True", "Exported")],
            annotations: Default::default(),
            metadata: Default::default(),
        }
    }

    fn import(ips: &[&str], ports: Vec<ServicePortSpec>, clusters: &[&str]) -> SeenImport {
        SeenImport {
            type_: if ips.is_empty() { "Headless" } else { "ClusterSetIP" }.into(),
            ips: ips.iter().map(|s| (*s).to_owned()).collect(),
            ports,
            clusters: clusters.iter().map(|s| (*s).to_owned()).collect(),
            unreachable: vec![],
            endpoint_answers: false,
        }
    }

    fn slice(source: Option<&str>, ready: &[&str]) -> SeenSlice {
        SeenSlice {
            name: format!("web-{}", source.unwrap_or("x")),
            source: source.map(str::to_owned),
            managed_by: source.map(|_| MANAGED_BY.to_owned()),
            service_name: None,
            ready: ready.iter().map(|a| a.parse().unwrap()).collect(),
            not_ready: 0,
        }
    }

    fn member(name: &str) -> MemberSeen {
        MemberSeen {
            name: name.into(),
            cluster: ClusterId::parse(name).unwrap(),
            service: Seen::Read(None),
            export: Seen::Read(None),
            import: Seen::Read(None),
            vip: Seen::Read(None),
            mcs_slices: Seen::Read(vec![]),
            own_slices: Seen::Read(vec![]),
            dns: None,
        }
    }

    /// cluster-a and cluster-b export web (http 80, one endpoint each);
    /// cluster-c only imports. Every member has the import, its VIP and
    /// both clusters' slices.
    fn healthy() -> Observed {
        let mut members = Vec::new();
        for (i, name) in ["cluster-a", "cluster-b", "cluster-c"].into_iter().enumerate() {
            let mut m = member(name);
            if i < 2 {
                m.service = Seen::Read(Some(service(ImportType::ClusterSetIp, vec![port("http", 80)])));
                m.export = Seen::Read(Some(export(10 + i as i64, None)));
                m.own_slices = Seen::Read(vec![slice(None, &[&format!("10.{i}.0.1")])]);
            }
            let vip = format!("10.96.0.{}", 10 + i);
            m.import = Seen::Read(Some(import(&[&vip], vec![port("http", 80)], &["cluster-a", "cluster-b"])));
            m.vip = Seen::Read(Some(vec![vip]));
            m.mcs_slices = Seen::Read(vec![
                slice(Some("cluster-a"), &["10.0.0.1"]),
                slice(Some("cluster-b"), &["10.1.0.1"]),
            ]);
            members.push(m);
        }
        Observed {
            key: ServiceKey {
                namespace: DnsLabel::parse("shop").unwrap(),
                name: DnsLabel::parse("web").unwrap(),
            },
            fqdn: "web.shop.svc.clusterset.local.".into(),
            vip_name: "web-clusterset-19ea9383".into(),
            members,
        }
    }

    fn dns(a: &[&str]) -> SeenDns {
        SeenDns {
            server: "127.0.0.1:53".parse().unwrap(),
            name: "web.shop.svc.clusterset.local.".into(),
            a: Answer::Response {
                rcode: "NOERROR".into(),
                records: a.iter().map(|s| (*s).to_owned()).collect(),
            },
            aaaa: Answer::Response { rcode: "NOERROR".into(), records: vec![] },
            srv: Answer::Response {
                rcode: "NOERROR".into(),
                records: vec!["0 100 80 web.shop.svc.clusterset.local.".into()],
            },
        }
    }

    fn codes(o: &Observed) -> Vec<&'static str> {
        verdicts(o).iter().map(|v| v.code).collect()
    }

    fn find(o: &Observed, code: &str) -> Verdict {
        let all = verdicts(o);
        all.iter().find(|v| v.code == code).cloned().unwrap_or_else(|| panic!("no {code} in {all:#?}"))
    }

    #[test]
    fn a_consistent_service_has_no_verdict() {
        let mut o = healthy();
        o.members[2].dns = Some(dns(&["10.96.0.12"]));
        assert_eq!(codes(&o), Vec::<&str>::new(), "{:#?}", verdicts(&o));
        assert_eq!(exit_status(&o, &verdicts(&o)), HEALTHY);
    }

    #[test]
    fn a_port_conflict_names_the_cluster_the_port_and_the_winner() {
        let mut o = healthy();
        o.members[1].service = Seen::Read(Some(service(ImportType::ClusterSetIp, vec![port("http", 8080)])));
        o.members[0].export = Seen::Read(Some(export(10, Some("PortConflict"))));
        o.members[1].export = Seen::Read(Some(export(11, Some("PortConflict"))));
        let v = find(&o, "PortConflict");
        assert_eq!(v.severity, Severity::Error);
        assert_eq!(v.clusters, ["cluster-b", "cluster-a"]);
        assert_eq!(
            v.problem,
            "cluster-b exports port http (TCP/8080) but the import lists http (TCP/80): PortConflict, the oldest export, in cluster-a, wins"
        );
        assert!(v.action.contains("cluster-b's Service port http (TCP/80)"), "{}", v.action);
        // The conditions agree with the objects: nothing stale.
        assert!(!codes(&o).contains(&"StaleCondition"), "{:#?}", verdicts(&o));
        assert_eq!(exit_status(&o, &verdicts(&o)), PROBLEMS);
        // A condition that does not show the conflict yet is stale.
        o.members[1].export = Seen::Read(Some(export(11, None)));
        assert_eq!(find(&o, "StaleCondition").clusters, ["cluster-b"]);
    }

    #[test]
    fn the_oldest_export_wins_whatever_the_member_order() {
        let mut o = healthy();
        o.members[0].service = Seen::Read(Some(service(ImportType::Headless, vec![port("http", 80)])));
        o.members[0].export = Seen::Read(Some(export(20, Some("TypeConflict"))));
        o.members[1].export = Seen::Read(Some(export(5, Some("TypeConflict"))));
        let v = find(&o, "TypeConflict");
        assert_eq!(
            v.problem,
            "cluster-a's Service is Headless but the import is ClusterSetIP (from cluster-b): TypeConflict, the oldest export, in cluster-b, wins"
        );
    }

    #[test]
    fn a_missing_import_and_its_nxdomain_are_one_verdict() {
        let mut o = healthy();
        o.members[2].import = Seen::Read(None);
        o.members[2].dns = Some(SeenDns {
            a: Answer::Response { rcode: "NXDOMAIN".into(), records: vec![] },
            aaaa: Answer::Response { rcode: "NXDOMAIN".into(), records: vec![] },
            ..dns(&[])
        });
        assert_eq!(codes(&o), ["ImportMissing"]);
        assert_eq!(find(&o, "ImportMissing").clusters, ["cluster-c"]);
    }

    #[test]
    fn slices_from_a_cluster_that_no_longer_exports_are_stale() {
        let mut o = healthy();
        o.members[1].export = Seen::Read(None);
        for m in &mut o.members {
            if let Seen::Read(Some(i)) = &mut m.import {
                i.clusters = vec!["cluster-a".into()];
            }
        }
        let v = find(&o, "StaleSlices");
        assert_eq!(v.severity, Severity::Error);
        assert!(
            v.problem.starts_with(
                "cluster-a has MCS EndpointSlices from cluster-b, which does not export shop/web"
            ),
            "{}",
            v.problem
        );
        assert!(v.action.contains("multicluster.kubernetes.io/source-cluster=cluster-b"), "{}", v.action);
        // cluster-b still has the Service: a note, not a problem.
        assert!(codes(&o).contains(&"NotExportedHere"));
    }

    #[test]
    fn a_cluster_missing_from_a_members_slices_is_an_error_and_a_short_one_is_stale() {
        let mut o = healthy();
        o.members[2].mcs_slices = Seen::Read(vec![slice(Some("cluster-a"), &["10.0.0.1"])]);
        let v = find(&o, "SlicesMissing");
        assert_eq!(v.clusters, ["cluster-c", "cluster-b"]);
        o.members[2].mcs_slices =
            Seen::Read(vec![slice(Some("cluster-a"), &["10.0.0.1"]), slice(Some("cluster-b"), &[])]);
        assert_eq!(find(&o, "SlicesStale").severity, Severity::Warning);
    }

    #[test]
    fn import_ips_are_checked_against_the_vip_and_the_dns_answer() {
        let mut o = healthy();
        o.members[2].vip = Seen::Read(Some(vec!["10.96.0.99".into()]));
        o.members[1].dns = Some(dns(&["10.96.0.77"]));
        let v = find(&o, "VipMismatch");
        assert!(
            v.problem.contains("lists ips 10.96.0.12 but the clusterset VIP allocated there is 10.96.0.99"),
            "{}",
            v.problem
        );
        assert!(!v.problem.contains("19ea9383"), "the internal name is not what users call: {}", v.problem);
        let d = find(&o, "DnsMismatch");
        assert_eq!(d.clusters, ["cluster-b"]);
        assert!(
            d.problem.contains("answers 10.96.0.77") && d.problem.contains("lists ips 10.96.0.11"),
            "{}",
            d.problem
        );
        // Answers with the ready endpoints are endpoint answers, a note.
        o.members[1].dns = Some(dns(&["10.0.0.1", "10.1.0.1"]));
        assert!(codes(&o).contains(&"EndpointAnswers"));
        assert!(!codes(&o).contains(&"DnsMismatch"));
    }

    #[test]
    fn headless_answers_must_be_ready_endpoints_and_a_subset_is_a_note() {
        let mut o = healthy();
        for m in &mut o.members {
            if let Seen::Read(Some(s)) = &mut m.service {
                *s = service(ImportType::Headless, vec![port("http", 80)]);
            }
            m.import = Seen::Read(Some(import(&[], vec![port("http", 80)], &["cluster-a", "cluster-b"])));
            m.vip = Seen::Read(None);
        }
        o.members[2].dns = Some(dns(&["10.0.0.1"]));
        assert_eq!(codes(&o), ["DnsSubset"]);
        o.members[2].dns = Some(dns(&["10.0.0.1", "10.9.9.9"]));
        assert_eq!(codes(&o), ["DnsMismatch"]);
        o.members[2].dns = Some(SeenDns { a: Answer::NoResponse("no answer within 1s".into()), ..dns(&[]) });
        assert_eq!(codes(&o), ["DnsNoAnswer"]);
    }

    #[test]
    fn an_export_without_a_service_and_a_service_nobody_exports() {
        let mut o = healthy();
        o.members[1].service = Seen::Read(None);
        o.members[1].own_slices = Seen::Read(vec![]);
        let v = find(&o, "NoService");
        assert_eq!(v.problem, "cluster-b exports shop/web but has no Service shop/web");
        let mut o = healthy();
        for m in &mut o.members {
            m.export = Seen::Read(None);
            m.import = Seen::Read(None);
            m.vip = Seen::Read(None);
            m.mcs_slices = Seen::Read(vec![]);
        }
        let v = find(&o, "NotExported");
        assert_eq!(v.clusters, ["cluster-a", "cluster-b"]);
        assert!(v.problem.contains("Services exist in cluster-a, cluster-b"), "{}", v.problem);
    }

    #[test]
    fn forbidden_reads_are_warnings_and_an_unreachable_member_is_incomplete() {
        let mut o = healthy();
        o.members[2].import = Seen::Forbidden("serviceimports is forbidden".into());
        assert_eq!(codes(&o), ["Forbidden"]);
        assert_eq!(exit_status(&o, &verdicts(&o)), PROBLEMS);
        // Exports that cannot be read make nothing stale.
        o.members[1].export = Seen::Forbidden("serviceexports is forbidden".into());
        assert!(!codes(&o).contains(&"StaleSlices"), "{:#?}", verdicts(&o));
        o.members[1].service = Seen::Failed("connection refused".into());
        assert!(codes(&o).contains(&"Unreachable"));
        assert_eq!(exit_status(&o, &verdicts(&o)), INCOMPLETE);
    }
}
