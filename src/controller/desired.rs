//! The objects the controller keeps in every member, as server-side-apply
//! bodies: pure functions of the merged import and the source slices, so a
//! reconcile after a crash at any point writes exactly the same objects.

use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::{Value, json};

use crate::fleet::export::{ServicePortSpec, SessionAffinity};
use crate::fleet::merge::{Condition, ImportSpec};
use crate::fleet::objects::{ANNOTATION_CONSUMER_CLUSTERS, MANAGED_BY};
use crate::fleet::state::FleetState;
use crate::k8s::mcs::{
    ANNOTATION_TRIGGER_TIME, LABEL_K8S_SERVICE_NAME, LABEL_MANAGED_BY, LABEL_SERVICE_NAME,
    LABEL_SOURCE_CLUSTER,
};
use crate::model::{ANNOTATION_UNREACHABLE_CLUSTERS, AddressFamily, ClusterId, ImportType, ServiceKey};

pub use crate::fleet::objects::{LABEL_APP_MANAGED_BY, SYNC_MANAGER as FIELD_MANAGER};

/// A stable 8-hex-digit digest (FNV-1a over the parts, each followed by a
/// 0 byte): the same in every process and version, unlike `std`'s hashers.
/// Only 32 bits, and weak ones (the low half of FNV-1a 64 is multiplied by
/// 0x1b3 only), so distinct inputs can share one: see [`slice_names`].
/// Pinned all the same: a new digest would rename every object on upgrade.
fn digest(parts: &[&str]) -> String {
    format!("{:08x}", fnv(parts) as u32)
}

/// [`digest`] with all 64 bits, 16 hex digits: for the names [`digest`]
/// gave twice.
fn long_digest(parts: &[&str]) -> String {
    format!("{:016x}", fnv(parts))
}

fn fnv(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for b in part.bytes().chain([0]) {
            h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    h
}

fn truncated(name: &str, max: usize) -> &str {
    let cut = &name[..name.len().min(max)];
    cut.trim_end_matches('-')
}

/// Annotation on every object the controller applies: the digest of the
/// body it applied ([`digest_of`]). A new leader reads it back instead of
/// rewriting what is already there.
pub const ANNOTATION_APPLIED: &str = "clusterset-dns.io/applied";

/// A digest of a JSON body (FNV-1a 64 over its text; serde_json writes
/// object keys sorted, so equal bodies give equal digests in every process).
pub fn digest_of(body: &Value) -> String {
    crate::k8s::digest::of(body)
}

/// True when the object `live` (as an API server returned it) holds every
/// field of the apply body `body` with its value: what server-side apply
/// would change is nothing. Fields others added, or the server defaulted,
/// are not looked at; a null or empty value in the body matches an absent
/// field (the API server drops them); lists must match item by item, as
/// every list we write is atomic or keyed by position.
pub fn covers(live: &Value, body: &Value) -> bool {
    difference(live, body).is_none()
}

/// [`difference`] of a whole object: its `apiVersion` and `kind` left out,
/// which a list's items do not carry.
pub fn object_difference(live: &Value, body: &Value) -> Option<String> {
    let fields = body.as_object()?;
    fields.iter().filter(|(k, _)| !matches!(k.as_str(), "apiVersion" | "kind")).find_map(|(k, v)| {
        let d = difference(live.get(k).unwrap_or(&Value::Null), v)?;
        Some(if d.is_empty() {
            k.clone()
        } else if d.starts_with('[') {
            format!("{k}{d}")
        } else {
            format!("{k}.{d}")
        })
    })
}

/// The path of the first field of `body` that `live` does not hold with
/// its value (`spec.ports[0].port`), for the log; `None` when it
/// [`covers`] it.
pub fn difference(live: &Value, body: &Value) -> Option<String> {
    match body {
        Value::Null => None,
        Value::Object(fields) => fields.iter().find_map(|(k, v)| {
            let have = live.get(k).unwrap_or(&Value::Null);
            difference(have, v).map(|d| {
                if d.is_empty() {
                    k.clone()
                } else {
                    format!("{k}{}{d}", if d.starts_with('[') { "" } else { "." })
                }
            })
        }),
        Value::Array(items) => match live {
            Value::Array(have) if have.len() == items.len() => {
                have.iter().zip(items).enumerate().find_map(|(i, (h, v))| {
                    difference(h, v).map(|d| {
                        if d.is_empty() {
                            format!("[{i}]")
                        } else if d.starts_with('[') {
                            format!("[{i}]{d}")
                        } else {
                            format!("[{i}].{d}")
                        }
                    })
                })
            }
            Value::Null if items.is_empty() => None,
            _ => Some(String::new()),
        },
        scalar => (live != scalar).then(String::new),
    }
}

/// How a service's VIP Service and MCS EndpointSlices are named. Their
/// names start with the service's name cut to 40 characters (its
/// [`stem`]), so services whose names share those 40 characters, and
/// nothing else, would share objects on a 32-bit digest collision: one
/// writing the other's VIP Service and slices in turn. Among the exported
/// services of a namespace that share a stem, the eldest keeps the short
/// names and the others take long ones (see `syncer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Naming {
    /// `<stem>-clusterset-<8 hex>`, `<stem>-<8 hex>`: what every service
    /// has had since the first release.
    Short,
    /// `<name cut to 35>-clusterset-<16 hex>` and `<name cut to 46>-<16 hex>`,
    /// each digest over the whole service name too: no short name has that
    /// shape, and two services share one only on a 64-bit collision.
    Long,
}

/// How much of a service's name its short object names keep.
pub const STEM_LEN: usize = 40;

/// The part of a service's name its objects' names start with.
pub fn stem(name: &str) -> &str {
    truncated(name, STEM_LEN)
}

/// The clusterset VIP Service's name: internal (DNS never shows it), unique
/// per service, at most 63 characters.
pub fn vip_name(key: &ServiceKey, naming: Naming) -> String {
    let name = key.name.as_str();
    match naming {
        Naming::Short => format!("{}-clusterset-{}", stem(name), digest(&[name])),
        Naming::Long => format!("{}-clusterset-{}", truncated(name, 35), long_digest(&[name])),
    }
}

/// The short name of the MCS EndpointSlice mirroring `source` of `cluster`
/// ([`slice_names`] gives the one in use).
fn slice_name(key: &ServiceKey, cluster: &ClusterId, source: &str) -> String {
    format!("{}-{}", stem(key.name.as_str()), digest(&[cluster.as_str(), source]))
}

/// The names of the MCS EndpointSlices mirroring `sources` (cluster, source
/// slice) of `key`, in their order. [`Naming::Long`] gives each a name with a
/// 64-bit digest of the service, cluster and source. [`Naming::Short`] gives
/// `slice_name`'s, except that where several sources would share a name
/// (its digest is 32 bits, and the EndpointSlice controller's own names
/// collide: `web-h6kvr` and `web-efi2a` of one cluster do), only the first
/// of them by (cluster, source) keeps it and the others get a 64-bit digest
/// (16 hex digits, a name no short one can have). Without this, two
/// sources' endpoints would be written in turn to one slice, each write
/// undoing the other.
pub fn slice_names(key: &ServiceKey, naming: Naming, sources: &[(&ClusterId, &str)]) -> Vec<String> {
    let name = key.name.as_str();
    if naming == Naming::Long {
        return sources
            .iter()
            .map(|(c, s)| format!("{}-{}", truncated(name, 46), long_digest(&[name, c.as_str(), s])))
            .collect();
    }
    let short: Vec<String> = sources.iter().map(|(c, s)| slice_name(key, c, s)).collect();
    let mut first: std::collections::HashMap<&str, (&ClusterId, &str)> = std::collections::HashMap::new();
    for (name, (c, s)) in short.iter().zip(sources) {
        let slot = first.entry(name.as_str()).or_insert((c, s));
        if (*c, *s) < *slot {
            *slot = (c, s);
        }
    }
    short
        .iter()
        .zip(sources)
        .map(|(short, (c, s))| {
            if first.get(short.as_str()) == Some(&(*c, *s)) {
                short.clone()
            } else {
                format!("{}-{}", stem(name), long_digest(&[c.as_str(), s]))
            }
        })
        .collect()
}

fn labels(key: &ServiceKey) -> Value {
    json!({ LABEL_APP_MANAGED_BY: FIELD_MANAGER, LABEL_SERVICE_NAME: key.name.as_str() })
}

fn ports(ports: &[ServicePortSpec]) -> Vec<Value> {
    ports
        .iter()
        .map(|p| {
            let mut v = json!({"protocol": p.protocol.srv_label().to_ascii_uppercase(), "port": p.port});
            if let Some(n) = &p.name {
                v["name"] = json!(n.as_str());
            }
            if let Some(a) = &p.app_protocol {
                v["appProtocol"] = json!(a);
            }
            v
        })
        .collect()
}

fn families(f: &[AddressFamily]) -> Vec<&'static str> {
    f.iter().map(|f| if *f == AddressFamily::V4 { "IPv4" } else { "IPv6" }).collect()
}

/// The ServiceImport's metadata and spec. `unreachable` (exporting
/// clusters whose API does not answer) becomes the annotation
/// `clusterset-dns.io/unreachable-clusters`, which `serve` reads to demote
/// their endpoints; without any, the annotation is absent (server-side
/// apply then removes it).
pub fn import(
    api_version: &str,
    key: &ServiceKey,
    spec: &ImportSpec,
    ips: &[String],
    unreachable: &[ClusterId],
) -> Value {
    let mut s = json!({
        "type": if spec.kind == ImportType::Headless { "Headless" } else { "ClusterSetIP" },
        "ports": ports(&spec.ports),
        "sessionAffinity": spec.session_affinity.as_str(),
        "ipFamilies": families(&spec.ip_families),
    });
    if spec.kind == ImportType::ClusterSetIp {
        s["ips"] = json!(ips);
    }
    if let (SessionAffinity::ClientIp, Some(t)) = (spec.session_affinity, spec.affinity_timeout) {
        s["sessionAffinityConfig"] = json!({"clientIP": {"timeoutSeconds": t}});
    }
    if let Some(t) = &spec.traffic_distribution {
        s["trafficDistribution"] = json!(t);
    }
    if let Some(p) = &spec.internal_traffic_policy {
        s["internalTrafficPolicy"] = json!(p);
    }
    // The export's exportedLabels/-Annotations first: our own keys, which
    // serve and the controller rely on, win over an exported one of the
    // same name.
    let mut all_labels: serde_json::Map<String, Value> =
        spec.metadata.labels.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
    if let Value::Object(ours) = labels(key) {
        all_labels.extend(ours);
    }
    let mut metadata =
        json!({"name": key.name.as_str(), "namespace": key.namespace.as_str(), "labels": all_labels});
    let mut annotations: serde_json::Map<String, Value> =
        spec.metadata.annotations.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
    // The export's answer configuration travels with the import, so
    // `serve` in every member answers the service the same way.
    annotations.extend(spec.annotations.iter().map(|(k, v)| (k.clone(), json!(v))));
    if !unreachable.is_empty() {
        let mut names: Vec<&str> = unreachable.iter().map(ClusterId::as_str).collect();
        // Sorted: the same set is the same body, so no write.
        names.sort_unstable();
        names.dedup();
        annotations.insert(ANNOTATION_UNREACHABLE_CLUSTERS.into(), json!(names.join(",")));
    }
    if !annotations.is_empty() {
        metadata["annotations"] = Value::Object(annotations);
    }
    json!({
        "apiVersion": api_version, "kind": "ServiceImport",
        "metadata": metadata,
        "spec": s,
    })
}

/// Condition on ServiceImports saying whether every exporting cluster's
/// API answers (endpoints of one that does not are kept, but may be stale).
pub const CONDITION_SOURCES_REACHABLE: &str = "clusterset-dns.io/SourcesReachable";

/// The ServiceImport's status: the exporting clusters, and which of them
/// are unreachable (with the time they became so); when none is,
/// `reachable_since` is when that became true (kept while it stays true,
/// so that the status is written only when it changes).
pub fn import_status(
    api_version: &str,
    key: &ServiceKey,
    clusters: &[ClusterId],
    unreachable: &[(ClusterId, String)],
    reachable_since: &str,
) -> Value {
    let list: Vec<Value> = clusters.iter().map(|c| json!({"cluster": c.as_str()})).collect();
    let condition = match unreachable.iter().map(|(_, t)| t).max() {
        None => json!({"type": CONDITION_SOURCES_REACHABLE, "status": "True", "reason": "AllReachable",
                       "message": "Every exporting cluster's API answers.",
                       "lastTransitionTime": reachable_since}),
        Some(since) => {
            let names: Vec<&str> = unreachable.iter().map(|(c, _)| c.as_str()).collect();
            json!({"type": CONDITION_SOURCES_REACHABLE, "status": "False", "reason": "ClusterUnreachable",
                   "message": format!("API of {} unreachable; their endpoints are kept as last seen.", names.join(", ")),
                   "lastTransitionTime": since})
        }
    };
    json!({
        "apiVersion": api_version, "kind": "ServiceImport",
        "metadata": {"name": key.name.as_str(), "namespace": key.namespace.as_str()},
        "status": {"clusters": list, "conditions": [condition]},
    })
}

/// Which members import a service, from the oldest export's
/// `clusterset-dns.io/consumer-clusters`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Consumers {
    /// No list: every member (the KEP's default).
    All,
    /// The listed clusters only (sorted; names that are not members are
    /// kept, to be reported).
    Only(Vec<ClusterId>),
    /// A list that does not parse: no member, until it is fixed. Failing
    /// closed, because the list exists to keep a service from clusters.
    Invalid(String),
}

impl Consumers {
    /// Reads the export annotations the import is configured from.
    pub fn of(annotations: &std::collections::BTreeMap<String, String>) -> Self {
        match annotations.get(ANNOTATION_CONSUMER_CLUSTERS) {
            None => Self::All,
            Some(v) => match crate::model::parse_clusters(v) {
                Ok(list) => Self::Only(list),
                Err(e) => Self::Invalid(format!("{ANNOTATION_CONSUMER_CLUSTERS}: {e}")),
            },
        }
    }

    /// True when `cluster` imports the service.
    pub fn includes(&self, cluster: &ClusterId) -> bool {
        match self {
            Self::All => true,
            Self::Only(list) => list.contains(cluster),
            Self::Invalid(_) => false,
        }
    }

    /// What the export's Ready condition says about where it is imported,
    /// given the member clusters.
    pub fn describe(&self, members: &[&ClusterId]) -> String {
        match self {
            Self::All => "Imported into every member cluster that has the namespace.".into(),
            Self::Only(list) => {
                let names = |pick: bool| {
                    list.iter()
                        .filter(|c| members.contains(c) == pick)
                        .map(|c| c.as_str())
                        .collect::<Vec<_>>()
                };
                let (known, unknown) = (names(true), names(false));
                let mut m = if known.is_empty() {
                    format!(
                        "Imported into no member cluster: {ANNOTATION_CONSUMER_CLUSTERS} lists none of them."
                    )
                } else {
                    format!(
                        "Imported into {} only ({ANNOTATION_CONSUMER_CLUSTERS}), where the namespace exists.",
                        known.join(", ")
                    )
                };
                if !unknown.is_empty() {
                    m.push_str(&format!(" Not member clusters: {}.", unknown.join(", ")));
                }
                m
            }
            Self::Invalid(e) => format!("Imported nowhere until fixed: {e}"),
        }
    }
}

/// A ServiceExport created for a Service that asks to be exported, with
/// the Service's consumer clusters when it names them.
pub fn export(api_version: &str, key: &ServiceKey, consumers: Option<&str>) -> Value {
    let mut body = json!({
        "apiVersion": api_version, "kind": "ServiceExport",
        "metadata": {"name": key.name.as_str(), "namespace": key.namespace.as_str(),
                     "labels": {LABEL_APP_MANAGED_BY: FIELD_MANAGER}},
    });
    if let Some(c) = consumers {
        body["metadata"]["annotations"] = json!({ ANNOTATION_CONSUMER_CLUSTERS: c });
    }
    body
}

/// The ports of a VIP Service: the import's, each named. The API server
/// refuses a Service with several ports unless every one has a name, and
/// kube-proxy matches a slice's ports to the Service's by name, so an
/// unnamed port of the union (each cluster exports at most one: a Service
/// with two ports names both) gets `<protocol>-<port>` there, and the
/// slices mirrored from the cluster that exports it carry that name too
/// ([`VipPorts::unnamed_in`]). A single port keeps its name, or none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VipPorts {
    ports: Vec<(ServicePortSpec, Option<String>)>,
}

impl VipPorts {
    /// Names the import's ports for the VIP Service.
    pub fn new(ports: &[ServicePortSpec]) -> Self {
        let mut taken: Vec<String> =
            ports.iter().filter_map(|p| p.name.as_ref().map(|n| n.as_str().to_owned())).collect();
        let named = ports
            .iter()
            .map(|p| {
                let name = match &p.name {
                    Some(n) => Some(n.as_str().to_owned()),
                    None if ports.len() == 1 => None,
                    None => {
                        let mut n = format!("{}-{}", p.protocol.srv_label(), p.port);
                        // A user's port may already be called so.
                        while taken.contains(&n) {
                            n.push_str("-x");
                        }
                        taken.push(n.clone());
                        Some(n)
                    }
                };
                (p.clone(), name)
            })
            .collect();
        Self { ports: named }
    }

    /// How the slice ports of a cluster that exports `exported` appear
    /// behind the VIP (see [`ClusterPorts`]).
    pub fn of_cluster(&self, exported: &[ServicePortSpec]) -> ClusterPorts {
        let served = exported
            .iter()
            .filter_map(|p| {
                let name = p.name.as_ref()?;
                self.ports
                    .iter()
                    .any(|(q, _)| {
                        q.name.as_ref() == Some(name) && q.port == p.port && q.protocol == p.protocol
                    })
                    .then(|| name.as_str().to_owned())
            })
            .collect();
        ClusterPorts { served, unnamed_as: self.unnamed_in(exported).map(str::to_owned) }
    }

    /// The name the VIP Service gives the unnamed port of a cluster that
    /// exports `exported`, if it exports one and the VIP Service renames it.
    pub fn unnamed_in(&self, exported: &[ServicePortSpec]) -> Option<&str> {
        let unnamed = exported.iter().find(|p| p.name.is_none())?;
        self.ports.iter().find(|(p, _)| p == unnamed).and_then(|(_, n)| n.as_deref())
    }

    fn body(&self) -> Vec<Value> {
        let specs: Vec<ServicePortSpec> = self.ports.iter().map(|(p, _)| p.clone()).collect();
        let mut body = ports(&specs);
        for (v, (_, name)) in body.iter_mut().zip(&self.ports) {
            if let Some(n) = name {
                v["name"] = json!(n);
            }
        }
        body
    }
}

/// How one exporting cluster's slice ports appear in the MCS slices that
/// mirror them ([`VipPorts::of_cluster`]). kube-proxy matches a slice's
/// ports to the VIP Service's by name, and the EndpointSlice controller
/// names a slice's ports after the Service's: so a named port is mirrored
/// only when the import has that name with this cluster's own number and
/// protocol. A cluster whose port of that name has another number lost the
/// port conflict to the oldest export and does not serve the import's port
/// (KEP-1645; the conformance suite's StrictPortConflict specs): without
/// this, the VIP's port would reach its Pods too. Its unnamed port is
/// renamed as the VIP names it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterPorts {
    /// The cluster's named ports the import has with the same number and protocol.
    pub served: Vec<String>,
    /// The VIP Service's name for the cluster's unnamed port, when renamed.
    pub unnamed_as: Option<String>,
}

/// The clusterset VIP: a selector-less ClusterIP Service with the merged
/// ports ([`VipPorts`]), one ClusterIP per family; kube-proxy routes it
/// through the EndpointSlices labelled with its name.
pub fn vip_service(key: &ServiceKey, name: &str, spec: &ImportSpec) -> Value {
    let policy = if spec.ip_families.len() > 1 { "PreferDualStack" } else { "SingleStack" };
    // internalTrafficPolicy stays Cluster here whatever the import says:
    // `Local` would make kube-proxy drop every endpoint whose node is not
    // this node, i.e. every endpoint of another cluster.
    let mut s = json!({
        "type": "ClusterIP",
        "ports": VipPorts::new(&spec.ports).body(),
        "ipFamilyPolicy": policy,
        "ipFamilies": families(&spec.ip_families),
        "sessionAffinity": spec.session_affinity.as_str(),
    });
    if let (SessionAffinity::ClientIp, Some(t)) = (spec.session_affinity, spec.affinity_timeout) {
        s["sessionAffinityConfig"] = json!({"clientIP": {"timeoutSeconds": t}});
    }
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": key.namespace.as_str(), "labels": labels(key)},
        "spec": s,
    })
}

/// The MCS EndpointSlice `name` mirroring one source slice of `cluster`:
/// its addresses, readiness, hostname, zone and targetRef. For ClusterSetIP
/// services it is also the slice of the VIP Service named `vip`
/// (`kubernetes.io/service-name`).
pub fn slice(
    key: &ServiceKey,
    name: &str,
    cluster: &ClusterId,
    source: &EndpointSlice,
    vip: Option<&str>,
    ports: Option<&ClusterPorts>,
) -> Value {
    let mut l = labels(key);
    l[LABEL_SOURCE_CLUSTER] = json!(cluster.as_str());
    l[LABEL_MANAGED_BY] = json!(MANAGED_BY);
    if let Some(vip) = vip {
        l[LABEL_K8S_SERVICE_NAME] = json!(vip);
    }
    let endpoints: Vec<Value> = source
        .endpoints
        .iter()
        .map(|e| {
            let mut v = json!({"addresses": e.addresses});
            // serving and terminating let kube-proxy fall back to terminating
            // endpoints behind the VIP while a rollout drains the last ready ones.
            if let Some(c) = &e.conditions {
                let mut conditions = serde_json::Map::new();
                for (k, value) in [("ready", c.ready), ("serving", c.serving), ("terminating", c.terminating)]
                {
                    if let Some(b) = value {
                        conditions.insert(k.into(), json!(b));
                    }
                }
                if !conditions.is_empty() {
                    v["conditions"] = Value::Object(conditions);
                }
            }
            if let Some(h) = &e.hostname {
                v["hostname"] = json!(h);
            }
            if let Some(n) = &e.node_name {
                v["nodeName"] = json!(n);
            }
            if let Some(z) = &e.zone {
                v["zone"] = json!(z);
            }
            if let Some(h) = &e.hints
                && let Ok(h) = serde_json::to_value(h)
            {
                v["hints"] = h;
            }
            // Pairs an endpoint's IPv4 and IPv6 slices for answer policies.
            if let Some(t) = &e.target_ref {
                v["targetRef"] = json!({"kind": t.kind, "namespace": t.namespace, "name": t.name});
            }
            v
        })
        .collect();
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": key.namespace.as_str(), "labels": l},
        "addressType": source.address_type,
        "ports": slice_ports(source, ports),
        "endpoints": endpoints,
    })
}

/// `t` as the API writes times in conditions and annotations (RFC 3339,
/// whole seconds, UTC).
pub fn rfc3339(t: k8s_openapi::jiff::Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// The trigger time the MCS slice mirroring `source` carries
/// (`endpoints.kubernetes.io/last-change-trigger-time`, as the
/// EndpointSlice controller writes it): the latest of what it merges, the
/// source slice's own time and the creation of its cluster's ServiceExport
/// (`exported_at`, Unix seconds; exporting an old slice is a change of its
/// own). `None` when the source has none (no EndpointSlice controller wrote
/// it: nothing says when its change began); one that does not parse is
/// carried as it is, for `serve` to count.
///
/// It is written with the body and never decides a write: it is added
/// after the body's digest (as `clusterset-dns.io/applied` is) and left out
/// of the comparison with the live object, so a source whose time alone
/// changed costs no write.
pub fn trigger_time(source: &EndpointSlice, exported_at: Option<i64>) -> Option<String> {
    use k8s_openapi::jiff::Timestamp;
    let own = source.metadata.annotations.as_ref()?.get(ANNOTATION_TRIGGER_TIME)?;
    let exported = exported_at.and_then(|s| Timestamp::from_second(s).ok());
    match (own.parse::<Timestamp>(), exported) {
        (Ok(t), Some(e)) if e > t => Some(rfc3339(e)),
        _ => Some(own.clone()),
    }
}

/// A mirrored slice's ports: the source's that the cluster serves behind
/// the VIP, its unnamed port renamed as the VIP Service names it
/// ([`ClusterPorts`]); all of them as they are when the cluster's Service
/// ports are not known.
fn slice_ports(source: &EndpointSlice, ports: Option<&ClusterPorts>) -> Vec<Value> {
    source
        .ports
        .iter()
        .flatten()
        .filter(|p| match (ports, p.name.as_deref().filter(|n| !n.is_empty())) {
            (Some(c), Some(name)) => c.served.iter().any(|s| s == name),
            _ => true,
        })
        .map(|p| {
            let mut v = serde_json::to_value(p).unwrap_or_default();
            if let Some(n) = ports.and_then(|c| c.unnamed_as.as_deref())
                && p.name.as_deref().is_none_or(str::is_empty)
            {
                v["name"] = json!(n);
            }
            v
        })
        .collect()
}

/// A ServiceExport's status conditions; `times` gives each condition's
/// lastTransitionTime (kept while its status does not change).
pub fn export_status(api_version: &str, key: &ServiceKey, conditions: &[(Condition, String)]) -> Value {
    let c: Vec<Value> = conditions
        .iter()
        .map(|(c, t)| {
            json!({"type": c.kind, "status": c.status.as_str(), "reason": c.reason,
                   "message": c.message, "lastTransitionTime": t})
        })
        .collect();
    json!({
        "apiVersion": api_version, "kind": "ServiceExport",
        "metadata": {"name": key.name.as_str(), "namespace": key.namespace.as_str()},
        "status": {"conditions": c},
    })
}

/// True when another exported service of `key`'s namespace shares its
/// [`stem`] with an older export (the service name breaking ties): `key`'s
/// objects then take long names, since that service may have the short
/// ones. Only the services whose names start with the stem are read (an
/// index by name, not a walk of the fleet): what matters is those longer
/// than their objects' names can hold with this very stem, and the service
/// whose name is the stem itself.
pub fn has_elder(state: &FleetState, key: &ServiceKey) -> bool {
    let stem = stem(key.name.as_str());
    let ns = key.namespace.as_str();
    let long: Vec<ServiceKey> = state
        .exported_starting_with(ns, stem)
        .filter(|k| k.name.as_str().len() > STEM_LEN && self::stem(k.name.as_str()) == stem)
        .collect();
    if long.is_empty() {
        return false;
    }
    // The service whose name is the stem itself shares it too.
    let named_stem = crate::model::DnsLabel::parse(stem)
        .ok()
        .map(|name| ServiceKey { namespace: key.namespace.clone(), name })
        .filter(|k| !long.contains(k));
    let mine = (state.oldest_export(key).unwrap_or(i64::MAX), key.name.as_str());
    long.iter()
        .chain(named_stem.as_ref())
        .filter_map(|k| Some((state.oldest_export(k)?, k)))
        .any(|(at, k)| k != key && (at, k.name.as_str()) < mine)
}

#[cfg(test)]
mod tests;
