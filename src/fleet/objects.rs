//! Kubernetes objects of a member cluster → the fleet's view: a Service →
//! [`Exported`], a ServiceExport → its key and age, a Service's own
//! EndpointSlice → an MCS [`EndpointSet`] of that cluster. The edge where a
//! member's bad objects stop, with an error naming them.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::ObjectMeta;

use super::export::{Exported, ExportedMetadata, ExportedService, ServicePortSpec, SessionAffinity};
use crate::k8s::convert::{self, SliceOutcome};
use crate::k8s::mcs::{LABEL_K8S_SERVICE_NAME, LABEL_MANAGED_BY, LABEL_SERVICE_NAME, LABEL_SOURCE_CLUSTER};
use crate::model::{AddressFamily, ClusterId, DnsLabel, EndpointSet, ImportType, Protocol, ServiceKey};

/// Our value of [`LABEL_MANAGED_BY`]: slices we write are never read back as
/// a Service's own endpoints.
pub const MANAGED_BY: &str = "sync.clusterset-dns.io";

/// Annotation asking for a Service to be exported (`"true"`).
pub const ANNOTATION_EXPORT: &str = "clusterset-dns.io/export";
/// Kosmos's annotation with the same meaning, honoured for users moving over.
pub const ANNOTATION_KOSMOS_EXPORT: &str = "kosmos.io/auto-create-mcs";
/// On a ServiceExport (or on a Service that asks to be auto-exported, which
/// passes it to the export it gets): the member clusters that import the
/// service, `cluster-a,cluster-c`. Without it every member imports (the
/// KEP's default); members outside the list get no import, no VIP and no
/// slices, and a change of the list adds and removes them. The oldest
/// export's list counts, like every `clusterset-dns.io/` annotation. The
/// same as Karmada's MultiClusterService `consumerClusters` and the open
/// KEP-1645 change kubernetes/enhancements#6329.
pub const ANNOTATION_CONSUMER_CLUSTERS: &str = "clusterset-dns.io/consumer-clusters";

/// Label on every object the sync controller owns.
pub const LABEL_APP_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Our value of [`LABEL_APP_MANAGED_BY`] (also the field manager).
pub const SYNC_MANAGER: &str = "clusterset-dns-sync";

/// True when the Service asks to be exported by annotation.
pub fn asks_export(meta: &ObjectMeta) -> bool {
    let a = meta.annotations.as_ref();
    [ANNOTATION_EXPORT, ANNOTATION_KOSMOS_EXPORT]
        .iter()
        .any(|k| a.and_then(|a| a.get(*k)).is_some_and(|v| v.eq_ignore_ascii_case("true")))
}

/// Prefix of the annotations that configure answers (see `model::policy`).
pub const ANNOTATION_PREFIX: &str = "clusterset-dns.io/";

/// An object's `clusterset-dns.io/…` annotations.
pub fn our_annotations(meta: &ObjectMeta) -> std::collections::BTreeMap<String, String> {
    meta.annotations
        .iter()
        .flatten()
        .filter(|(k, _)| k.starts_with(ANNOTATION_PREFIX) && k.as_str() != ANNOTATION_EXPORT)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// The Service's consumer clusters annotation, passed on to the export
/// auto-export creates for it.
pub fn consumers(meta: &ObjectMeta) -> Option<String> {
    meta.annotations.as_ref()?.get(ANNOTATION_CONSUMER_CLUSTERS).cloned()
}

/// True for objects the sync controller created.
pub fn is_ours(meta: &ObjectMeta) -> bool {
    meta.labels.as_ref().and_then(|l| l.get(LABEL_APP_MANAGED_BY)).is_some_and(|v| v == SYNC_MANAGER)
}

/// Why an object of a member was skipped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{cluster}: {kind} {namespace}/{name}: {problem}")]
pub struct ObjectError {
    /// The member.
    pub cluster: String,
    /// The object's kind.
    pub kind: &'static str,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// What is wrong, naming the field.
    pub problem: String,
}

fn object_error(cluster: &ClusterId, kind: &'static str, meta: &ObjectMeta, problem: String) -> ObjectError {
    ObjectError {
        cluster: cluster.to_string(),
        kind,
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        problem,
    }
}

/// The service key of an object named like its Service (a Service or a
/// ServiceExport).
pub fn key_of(cluster: &ClusterId, kind: &'static str, meta: &ObjectMeta) -> Result<ServiceKey, ObjectError> {
    let label = |field: &str, v: Option<&str>| {
        DnsLabel::parse(v.unwrap_or(""))
            .map_err(|e| object_error(cluster, kind, meta, format!("{field}: {e}")))
    };
    Ok(ServiceKey {
        namespace: label("metadata.namespace", meta.namespace.as_deref())?,
        name: label("metadata.name", meta.name.as_deref())?,
    })
}

/// A ServiceExport's creation time in Unix seconds: the oldest export wins
/// conflicts. An object without one (never the case from an API server)
/// counts as newest.
pub fn exported_at(meta: &ObjectMeta) -> i64 {
    meta.creation_timestamp.as_ref().map_or(i64::MAX, |t| t.0.as_second())
}

/// A ServiceExport's `spec.exportedLabels` and `spec.exportedAnnotations`.
/// An entry the API server would refuse on the ServiceImport (a bad key or
/// label value) is left out with a warning naming it, so one bad entry
/// never blocks the import.
pub fn exported_metadata(cluster: &ClusterId, export: &kube::api::DynamicObject) -> ExportedMetadata {
    let spec = export.data.get("spec");
    let read = |field: &str, value_ok: fn(&str) -> bool| {
        let mut out = std::collections::BTreeMap::new();
        let Some(map) = spec.and_then(|s| s.get(field)) else { return out };
        let Some(map) = map.as_object() else {
            let e =
                object_error(cluster, "ServiceExport", &export.metadata, format!("spec.{field}: not a map"));
            tracing::warn!("ignoring {field}: {e}");
            return out;
        };
        for (k, v) in map {
            let problem = match v.as_str() {
                None => Some("the value is not a string".to_owned()),
                Some(_) if !qualified_name(k) => Some("not a qualified name".to_owned()),
                Some(v) if !value_ok(v) => Some(format!("{v:?} is not a valid label value")),
                Some(v) => {
                    out.insert(k.clone(), v.to_owned());
                    None
                }
            };
            if let Some(problem) = problem {
                let e = object_error(
                    cluster,
                    "ServiceExport",
                    &export.metadata,
                    format!("spec.{field}[{k:?}]: {problem}"),
                );
                tracing::warn!("not carried to the ServiceImport: {e}");
            }
        }
        out
    };
    ExportedMetadata {
        labels: read("exportedLabels", label_value),
        annotations: read("exportedAnnotations", |_| true),
    }
}

/// A label or annotation key: `[prefix/]name`, the prefix a DNS subdomain.
fn qualified_name(key: &str) -> bool {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    let subdomain = |p: &str| {
        !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|l| {
                !l.is_empty()
                    && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            })
    };
    !name.is_empty() && label_value(name) && prefix.is_none_or(subdomain)
}

/// A label value: empty, or at most 63 alphanumerics, `-`, `_` and `.`,
/// starting and ending alphanumeric.
fn label_value(v: &str) -> bool {
    let edge = |b: Option<u8>| b.is_none_or(|b| b.is_ascii_alphanumeric());
    v.len() <= 63
        && v.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && edge(v.bytes().next())
        && edge(v.bytes().last())
}

/// What a Service offers for export.
pub fn exported(cluster: &ClusterId, svc: &Service) -> Exported {
    let Some(spec) = &svc.spec else { return Exported::InvalidType("without spec".into()) };
    if spec.type_.as_deref() == Some("ExternalName") {
        return Exported::InvalidType("ExternalName".into());
    }
    match exported_service(spec) {
        Ok(s) => Exported::Service(s),
        Err(problem) => {
            let e = object_error(cluster, "Service", &svc.metadata, problem);
            tracing::warn!("cannot export: {e}");
            Exported::InvalidType(format!("with {}", e.problem))
        }
    }
}

fn exported_service(spec: &k8s_openapi::api::core::v1::ServiceSpec) -> Result<ExportedService, String> {
    let headless = spec.cluster_ip.as_deref() == Some("None");
    let mut ports = Vec::new();
    for (i, p) in spec.ports.iter().flatten().enumerate() {
        let name = match p.name.as_deref() {
            None | Some("") => None,
            Some(n) => Some(DnsLabel::parse(n).map_err(|e| format!("spec.ports[{i}].name: {e}"))?),
        };
        let protocol = Protocol::from_api(p.protocol.as_deref())
            .ok_or_else(|| format!("spec.ports[{i}].protocol: {:?} is not TCP, UDP or SCTP", p.protocol))?;
        let port = u16::try_from(p.port)
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("spec.ports[{i}].port: {} is not a port number", p.port))?;
        ports.push(ServicePortSpec { name, protocol, port, app_protocol: p.app_protocol.clone() });
    }
    ports.sort();
    let mut cluster_ips = Vec::new();
    if !headless {
        let ips = spec.cluster_ips.clone().unwrap_or_else(|| spec.cluster_ip.iter().cloned().collect());
        for (i, ip) in ips.iter().enumerate() {
            let ip: IpAddr =
                ip.parse().map_err(|_| format!("spec.clusterIPs[{i}]: {ip:?} is not an IP address"))?;
            cluster_ips.push(ip);
        }
    }
    let ip_families = match &spec.ip_families {
        Some(f) => f
            .iter()
            .map(|f| match f.as_str() {
                "IPv4" => Ok(AddressFamily::V4),
                "IPv6" => Ok(AddressFamily::V6),
                other => Err(format!("spec.ipFamilies: {other:?} is not IPv4 or IPv6")),
            })
            .collect::<Result<_, _>>()?,
        // Older objects: derive from the addresses.
        None => cluster_ips
            .iter()
            .map(|ip| if ip.is_ipv4() { AddressFamily::V4 } else { AddressFamily::V6 })
            .collect(),
    };
    let session_affinity = match spec.session_affinity.as_deref() {
        Some("ClientIP") => SessionAffinity::ClientIp,
        _ => SessionAffinity::None,
    };
    let affinity_timeout = spec
        .session_affinity_config
        .as_ref()
        .and_then(|c| c.client_ip.as_ref())
        .and_then(|c| c.timeout_seconds)
        .filter(|_| session_affinity == SessionAffinity::ClientIp);
    Ok(ExportedService {
        kind: if headless { ImportType::Headless } else { ImportType::ClusterSetIp },
        ports,
        session_affinity,
        affinity_timeout,
        ip_families,
        cluster_ips,
        traffic_distribution: spec.traffic_distribution.clone(),
        internal_traffic_policy: spec.internal_traffic_policy.clone(),
    })
}

/// The service a Service's own EndpointSlice belongs to, or `None` for
/// slices that are not a Service's own (no service label, or written by us).
pub fn slice_service(slice: &EndpointSlice) -> Option<ServiceKey> {
    let labels = slice.metadata.labels.as_ref()?;
    if labels.get(LABEL_MANAGED_BY).map(String::as_str) == Some(MANAGED_BY) {
        return None;
    }
    Some(ServiceKey {
        namespace: DnsLabel::parse(slice.metadata.namespace.as_deref()?).ok()?,
        name: DnsLabel::parse(labels.get(LABEL_K8S_SERVICE_NAME)?).ok()?,
    })
}

/// A Service's own EndpointSlice as the MCS EndpointSlice of `cluster`: the
/// same endpoints, labelled for the clusterset. The slice key is prefixed
/// with the cluster so slices of equal names in two members stay apart.
/// `Ok(None)` for FQDN slices, which DNS does not serve.
pub fn endpoint_set(
    cluster: &ClusterId,
    service: &ServiceKey,
    slice: &EndpointSlice,
) -> Result<Option<EndpointSet>, ObjectError> {
    // Relabel a copy and let the MCS slice conversion do the checking, so
    // both paths accept exactly the same endpoints.
    let mut mcs = slice.clone();
    let labels = mcs.metadata.labels.get_or_insert_with(Default::default);
    labels.insert(LABEL_SERVICE_NAME.into(), service.name.to_string());
    labels.insert(LABEL_SOURCE_CLUSTER.into(), cluster.to_string());
    match convert::endpoint_slice(&mcs) {
        Ok(SliceOutcome::Endpoints(mut set)) => {
            set.slice.name = format!("{cluster}/{}", set.slice.name);
            Ok(Some(set))
        }
        Ok(SliceOutcome::Fqdn) => Ok(None),
        Err(e) => Err(object_error(
            cluster,
            "EndpointSlice",
            &slice.metadata,
            format!("{}: {}", e.field, e.problem),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster() -> ClusterId {
        ClusterId::parse("cluster-a").unwrap()
    }

    fn service(yaml: &str) -> Exported {
        exported(&cluster(), &serde_yaml_ng::from_str(yaml).unwrap())
    }

    #[test]
    fn exported_labels_and_annotations_drop_only_what_the_api_would_refuse() {
        let export: kube::api::DynamicObject = serde_yaml_ng::from_str(
            "apiVersion: multicluster.x-k8s.io/v1alpha1
kind: ServiceExport
metadata: {name: web, namespace: shop}
spec:
  exportedLabels: {team: payments, example.com/tier: gold, bad key: x, 'example.com/too': '-dash', empty: ''}
  exportedAnnotations: {note: 'any text: at all', 'Not_A/Prefix/x': y}",
        )
        .unwrap();
        let m = exported_metadata(&cluster(), &export);
        let keys = |m: &std::collections::BTreeMap<String, String>| m.keys().cloned().collect::<Vec<_>>();
        assert_eq!(keys(&m.labels), ["empty", "example.com/tier", "team"]);
        assert_eq!(keys(&m.annotations), ["note"]);
        assert_eq!(m.annotations["note"], "any text: at all");
        let none: kube::api::DynamicObject = serde_yaml_ng::from_str(
            "apiVersion: multicluster.x-k8s.io/v1alpha1\nkind: ServiceExport\nmetadata: {name: web, namespace: shop}",
        )
        .unwrap();
        assert_eq!(exported_metadata(&cluster(), &none), ExportedMetadata::default());
    }

    #[test]
    fn cluster_ip_services_export_as_clustersetip_with_their_properties() {
        let e = service(
            "metadata: {name: web, namespace: shop}
spec:
  clusterIP: 10.96.0.10
  clusterIPs: [10.96.0.10, fd00::10]
  ipFamilies: [IPv4, IPv6]
  sessionAffinity: ClientIP
  sessionAffinityConfig: {clientIP: {timeoutSeconds: 60}}
  ports: [{name: http, port: 80, appProtocol: http}, {port: 53, protocol: UDP}]",
        );
        let Exported::Service(s) = e else { panic!("{e:?}") };
        assert_eq!(s.kind, ImportType::ClusterSetIp);
        assert_eq!(s.cluster_ips.len(), 2);
        assert_eq!(s.ip_families, [AddressFamily::V4, AddressFamily::V6]);
        assert_eq!(s.session_affinity, SessionAffinity::ClientIp);
        assert_eq!(s.affinity_timeout, Some(60));
        assert_eq!(s.ports.len(), 2);
        assert_eq!(s.ports.iter().find(|p| p.port == 80).unwrap().app_protocol.as_deref(), Some("http"));
    }

    #[test]
    fn headless_and_externalname_services() {
        let e =
            service("metadata: {name: db, namespace: shop}\nspec: {clusterIP: None, ports: [{port: 5432}]}");
        assert!(matches!(e, Exported::Service(ExportedService { kind: ImportType::Headless, .. })), "{e:?}");
        let e = service(
            "metadata: {name: ext, namespace: shop}\nspec: {type: ExternalName, externalName: example.com}",
        );
        assert_eq!(e, Exported::InvalidType("ExternalName".into()));
    }

    #[test]
    fn own_slices_are_relabelled_and_ours_are_not_read_back() {
        let yaml = "
metadata:
  name: web-abcde
  namespace: shop
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- addresses: [10.1.0.1]
  zone: z1
";
        let slice: EndpointSlice = serde_yaml_ng::from_str(yaml).unwrap();
        let key = slice_service(&slice).unwrap();
        assert_eq!(key.to_string(), "shop/web");
        let set = endpoint_set(&cluster(), &key, &slice).unwrap().unwrap();
        assert_eq!(set.cluster, cluster());
        assert_eq!(set.slice.name, "cluster-a/web-abcde");
        assert_eq!(set.endpoints[0].zone(), Some("z1"));
        let ours: EndpointSlice = serde_yaml_ng::from_str(
            &yaml.replace("{kubernetes.io/service-name: web}", "{kubernetes.io/service-name: web, endpointslice.kubernetes.io/managed-by: sync.clusterset-dns.io}"),
        )
        .unwrap();
        assert_eq!(slice_service(&ours), None);
    }
}
