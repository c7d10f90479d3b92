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

use super::observed::{Answer, MemberSeen, Observed, Seen, SeenDns, SeenExport, SeenImport, SeenSlice};
use crate::fleet::export::{ClusterExport, Exported, ExportedService, ServicePortSpec};
use crate::fleet::merge::{self, ImportSpec, Merged};
use crate::fleet::objects::MANAGED_BY;
use crate::k8s::mcs::{LABEL_K8S_SERVICE_NAME, LABEL_SERVICE_NAME, LABEL_SOURCE_CLUSTER};
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
        if exporters.is_empty() {
            self.exported_nowhere();
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

    /// No member exports the service: an error when none imports it either
    /// (it resolves nowhere), naming the members with a Service to export.
    fn exported_nowhere(&mut self) {
        let name = self.name();
        let importers = self.o.members.iter().filter(|m| m.import.found().is_some()).count();
        let with_service: Vec<&str> =
            self.o.members.iter().filter(|m| m.service.found().is_some()).map(|m| m.name.as_str()).collect();
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
            self.setting_conflicts((&who, s), (&winner, first));
        }
        self.ports_not_served(&valid, spec);
    }

    /// Service-wide settings of `who`'s Service `s` that differ from the
    /// oldest export's (`first`, in `winner`): warnings, the oldest wins.
    fn setting_conflicts(
        &mut self,
        (who, s): (&str, &ExportedService),
        (winner, first): (&str, &ExportedService),
    ) {
        let mut differs = |code: &'static str, what: &str, theirs: String, ours: String| {
            if theirs != ours {
                self.push(
                    Severity::Warning,
                    code,
                    &[who, winner],
                    format!(
                        "{who} has {what} {theirs} but the import has {ours} (from {winner}): {code}, the oldest export, in {winner}, wins"
                    ),
                    format!("set the same {what} on the Service in every cluster"),
                );
            }
        };
        differs(
            "SessionAffinityConflict",
            "sessionAffinity",
            s.session_affinity.as_str().into(),
            first.session_affinity.as_str().into(),
        );
        if s.session_affinity == first.session_affinity {
            differs(
                "SessionAffinityConfigConflict",
                "sessionAffinityConfig timeoutSeconds",
                format!("{:?}", s.affinity_timeout),
                format!("{:?}", first.affinity_timeout),
            );
        }
        differs(
            "TrafficDistributionConflict",
            "trafficDistribution",
            s.traffic_distribution.clone().unwrap_or_else(|| "unset".into()),
            first.traffic_distribution.clone().unwrap_or_else(|| "unset".into()),
        );
        if s.kind == ImportType::ClusterSetIp && first.kind == ImportType::ClusterSetIp {
            differs("IPFamilyConflict", "ipFamilies", families(&s.ip_families), families(&first.ip_families));
        }
    }

    /// Ports of the import a cluster does not serve: not a conflict (the
    /// import is the union), but that port only reaches the others.
    fn ports_not_served(&mut self, valid: &[(&ClusterExport, &ExportedService)], spec: &ImportSpec) {
        for &(e, s) in valid {
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
            self.import_status(m, import, merged);
            if spec.kind == ImportType::ClusterSetIp {
                self.clusterset_ip(m, import);
            }
        }
    }

    /// The clusters a member's ServiceImport status lists (valid exporters,
    /// unreachable ones) against the merge.
    fn import_status(&mut self, m: &MemberSeen, import: &SeenImport, merged: &Merged) {
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
    }

    /// A member's ServiceImport ips against the VIP Service allocated there.
    fn clusterset_ip(&mut self, m: &MemberSeen, import: &SeenImport) {
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

    /// MCS EndpointSlices: every valid exporter's endpoints in every member,
    /// nothing from clusters that do not export.
    fn slices(&mut self, merged: &Merged) {
        let name = self.name();
        let valid: Vec<&ClusterId> = merged.clusters.iter().collect();
        let own = self.own_ready(&valid);
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
            self.unexpected_sources(m, &by_source, &valid);
        }
    }

    /// The ready endpoints each valid exporter has itself; a warning for
    /// an exporter with none.
    fn own_ready<'v>(&mut self, valid: &[&'v ClusterId]) -> BTreeMap<&'v str, BTreeSet<IpAddr>> {
        let name = self.name();
        let mut own: BTreeMap<&str, BTreeSet<IpAddr>> = BTreeMap::new();
        for c in valid {
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
                        "check its Pods and the Service's selector (kubectl -n {} get endpointslices -l {LABEL_K8S_SERVICE_NAME}={})",
                        self.o.key.namespace, self.o.key.name
                    ),
                );
            }
            own.insert(c.as_str(), ready);
        }
        own
    }

    /// Member `m`'s MCS EndpointSlices (`by_source`: by their source
    /// cluster label) from no source or from clusters that do not export
    /// the service (validly).
    fn unexpected_sources(
        &mut self,
        m: &MemberSeen,
        by_source: &BTreeMap<Option<&str>, Vec<&SeenSlice>>,
        valid: &[&ClusterId],
    ) {
        let name = self.name();
        for (source, from) in by_source {
            let count = ready(from.iter().copied()).len();
            let managers: BTreeSet<&str> =
                from.iter().map(|s| s.managed_by.as_deref().unwrap_or(MANAGED_BY)).collect();
            match source {
                None => self.push(
                    Severity::Warning,
                    "SliceWithoutSource",
                    &[&m.name],
                    format!(
                        "{} has MCS EndpointSlices of {name} without a {LABEL_SOURCE_CLUSTER} label: {}",
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
                            "the controller deletes them once every member has listed; if they stay: kubectl -n {} delete endpointslices -l {LABEL_SERVICE_NAME}={},{LABEL_SOURCE_CLUSTER}={s}",
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

mod dns;
#[cfg(test)]
mod tests;
