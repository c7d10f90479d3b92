//! Other fleet managers' objects → model values (`--interop`), read exactly
//! as their controllers write them in a member cluster:
//!
//! - **Karmada**, `pkg/controllers/mcs/` (commit f8fdd02d): a ClusterSetIP
//!   ServiceImport gets a `derived-<svc>` Service (ports of the import, a
//!   locally allocated ClusterIP); the exporting clusters' slices arrive as
//!   `imported-<cluster>-<slice>`, labelled `kubernetes.io/service-name:
//!   derived-<svc>` and `endpointslice.kubernetes.io/managed-by:
//!   endpointslice-controller.karmada.io`. The source cluster is in the
//!   name only: the `work.karmada.io/namespace` annotation that names it in
//!   the control plane is overwritten with the consumer's when the slice is
//!   propagated.
//! - **Karmada MultiClusterService `CrossCluster`**,
//!   `pkg/controllers/multiclusterservice/`: the consumer gets the Service
//!   itself (annotated `multiclusterservice.karmada.io/name` and
//!   `…/namespace`) and the providers' slices as `<provider>-<slice>`,
//!   labelled `kubernetes.io/service-name: <svc>`, managed by
//!   `endpointslice-dispatch-controller.karmada.io`, the provider in the
//!   annotation `endpointslice.karmada.io/provision-cluster`.
//! - **Kosmos**, `pkg/clustertree/cluster-manager/controllers/mcs/` (commit
//!   df846c34): a ServiceImport without `ips` (always ClusterSetIP, port 80),
//!   a same-name Service with a local ClusterIP or `None`, and the root
//!   cluster's slices copied with their names, labelled
//!   `kubernetes.io/service-name`; Service and slices annotated
//!   `kosmos.io/service-import` (value `"ture"`, sic). Its eps-probe-plugin
//!   lists unreachable Pod IPs in the import's
//!   `kosmos.io/disconnected-address`.
//!
//! An object of none of these shapes is not an error: it is someone else's
//! Service or slice, and is ignored (`Ok(None)`).

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tracing::warn;

use super::convert::{self, ConvertError, Ctx, SliceFields, SliceOutcome, meta_value};
use super::crd;
use super::mcs::LABEL_SERVICE_NAME;
use crate::model::{
    BackingKind, BackingService, ClusterId, Interop, KOSMOS_ROOT_CLUSTER, ServiceImport, ServiceKey,
    SliceKey, SliceOrigin,
};

use super::mcs::{LABEL_K8S_SERVICE_NAME, LABEL_MANAGED_BY};

/// Karmada's endpointslice-controller (`util.EndpointSliceControllerLabelValue`).
pub const KARMADA_SLICE_CONTROLLER: &str = "endpointslice-controller.karmada.io";
/// Karmada's endpointslice-dispatch-controller (`util.EndpointSliceDispatchControllerLabelValue`).
pub const KARMADA_DISPATCH_CONTROLLER: &str = "endpointslice-dispatch-controller.karmada.io";
/// The provider cluster of a dispatched slice (`util.EndpointSliceProvisionClusterAnnotation`).
pub const KARMADA_PROVISION_CLUSTER: &str = "endpointslice.karmada.io/provision-cluster";
/// The MultiClusterService a propagated Service belongs to.
pub const KARMADA_MCS_NAME: &str = "multiclusterservice.karmada.io/name";
/// Its namespace.
pub const KARMADA_MCS_NAMESPACE: &str = "multiclusterservice.karmada.io/namespace";
/// `names.GenerateDerivedServiceName`'s prefix.
pub const KARMADA_DERIVED_PREFIX: &str = "derived-";
/// `names.GenerateEndpointSliceName`'s prefix.
pub const KARMADA_IMPORTED_PREFIX: &str = "imported-";
/// Marks Kosmos's Services and slice copies in a leaf (`utils.ServiceImportLabelKey`).
pub const KOSMOS_SERVICE_IMPORT: &str = "kosmos.io/service-import";
/// Pod IPs Kosmos's probe cannot reach (`utils.DisconnectedEndpointsKey`).
pub const KOSMOS_DISCONNECTED: &str = "kosmos.io/disconnected-address";

/// Converts a ServiceImport, with Kosmos's disconnected addresses when
/// Kosmos is read. A bad address in the annotation is logged and left out;
/// it never takes the service away.
pub fn service_import(obj: &crd::ServiceImport, interop: Interop) -> Result<ServiceImport, ConvertError> {
    service_import_of(&obj.metadata, &obj.spec, interop)
}

/// [`service_import`] of an import's parts (a watched import's metadata
/// and its spec, parsed apart).
pub fn service_import_of(
    metadata: &ObjectMeta,
    spec: &crd::ServiceImportSpec,
    interop: Interop,
) -> Result<ServiceImport, ConvertError> {
    let mut import = convert::service_import_of(metadata, spec)?;
    if interop.kosmos {
        let value = meta_value(metadata.annotations.as_ref(), KOSMOS_DISCONNECTED).unwrap_or("");
        let (mut addresses, bad) = disconnected(value);
        for b in bad {
            warn!(service = %import.key, "ServiceImport {}: {KOSMOS_DISCONNECTED}: {b:?} is not an IP address; ignoring it", import.key);
        }
        addresses.sort();
        addresses.dedup();
        import.answers.disconnected = addresses;
    }
    Ok(import)
}

/// The addresses of `kosmos.io/disconnected-address` (comma-separated, as
/// Kosmos joins them), and the entries that are not addresses.
pub fn disconnected(value: &str) -> (Vec<IpAddr>, Vec<&str>) {
    let mut good = Vec::new();
    let mut bad = Vec::new();
    for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.parse() {
            Ok(ip) => good.push(ip),
            Err(_) => bad.push(part),
        }
    }
    (good, bad)
}

/// Converts an EndpointSlice without MCS labels that a fleet manager read
/// with `interop` wrote; `Ok(None)` for any other slice.
pub fn foreign_slice(obj: &impl SliceFields, interop: Interop) -> Result<Option<SliceOutcome>, ConvertError> {
    // MCS slices are the MCS watch's (they may carry this label too).
    if obj.label(LABEL_SERVICE_NAME).is_some() {
        return Ok(None);
    }
    let Some(service) = obj.label(LABEL_K8S_SERVICE_NAME) else {
        return Ok(None);
    };
    let managed_by = obj.label(LABEL_MANAGED_BY);
    let service_field = format!("metadata.labels[{LABEL_K8S_SERVICE_NAME}]");
    let key = |cx: &Ctx<'_>, name: &str| -> Result<ServiceKey, ConvertError> {
        Ok(ServiceKey {
            namespace: cx.label("metadata.namespace", cx.namespace)?,
            name: cx.label(&service_field, name)?,
        })
    };
    let outcome = if interop.karmada && managed_by == Some(KARMADA_SLICE_CONTROLLER) {
        convert::endpoint_slice_of(obj, |cx, _| {
            let Some(svc) = service.strip_prefix(KARMADA_DERIVED_PREFIX).filter(|s| !s.is_empty()) else {
                return Err(cx.err(&service_field, format!("{service:?} is not derived-<service>")));
            };
            let cluster = karmada_imported_cluster(cx.name, svc).ok_or_else(|| {
                cx.err(
                    "metadata.name",
                    format!("is not {KARMADA_IMPORTED_PREFIX}<cluster>-{svc}-…: no source cluster"),
                )
            })?;
            let cluster = ClusterId::parse(cluster)
                .map_err(|e| cx.err("metadata.name", format!("cluster {cluster:?} {e}")))?;
            Ok((key(cx, svc)?, cluster, SliceOrigin::Karmada))
        })?
    } else if interop.karmada && managed_by == Some(KARMADA_DISPATCH_CONTROLLER) {
        convert::endpoint_slice_of(obj, |cx, _| {
            let field = format!("metadata.annotations[{KARMADA_PROVISION_CLUSTER}]");
            let cluster =
                obj.annotation(KARMADA_PROVISION_CLUSTER).ok_or_else(|| cx.err(&field, "is missing"))?;
            let cluster = ClusterId::parse(cluster).map_err(|e| cx.err(&field, e))?;
            Ok((key(cx, service)?, cluster, SliceOrigin::KarmadaDispatch))
        })?
    } else if interop.kosmos && obj.annotation(KOSMOS_SERVICE_IMPORT).is_some() {
        convert::endpoint_slice_of(obj, |cx, _| {
            let cluster = ClusterId::parse(KOSMOS_ROOT_CLUSTER).map_err(|e| cx.err("metadata", e))?;
            Ok((key(cx, service)?, cluster, SliceOrigin::Kosmos))
        })?
    } else {
        return Ok(None);
    };
    Ok(Some(outcome))
}

/// The source cluster in Karmada's `imported-<cluster>-<slice>`, where the
/// slice's own name starts with `<svc>-` (the EndpointSlice controller's
/// generateName, a suffix without `-`) or is `<svc>`: the part before the
/// last `-<svc>` that ends the name or is followed by `-`.
fn karmada_imported_cluster<'a>(name: &'a str, svc: &str) -> Option<&'a str> {
    let rest = name.strip_prefix(KARMADA_IMPORTED_PREFIX)?;
    let needle = format!("-{svc}");
    let at = rest
        .rmatch_indices(needle.as_str())
        .map(|(i, _)| i)
        .find(|&i| matches!(rest[i + needle.len()..].chars().next(), None | Some('-')))?;
    Some(&rest[..at]).filter(|c| !c.is_empty())
}

/// Converts a Service that backs an import in one of `interop`'s shapes;
/// `Ok(None)` for any other Service.
pub fn backing_service(obj: &Service, interop: Interop) -> Result<Option<BackingService>, ConvertError> {
    let namespace = obj.metadata.namespace.as_deref().unwrap_or("");
    let name = obj.metadata.name.as_deref().unwrap_or("");
    let cx = Ctx { kind: "Service", namespace, name };
    let annotations = obj.metadata.annotations.as_ref();
    let derived = name.strip_prefix(KARMADA_DERIVED_PREFIX).filter(|s| !s.is_empty());
    let crosscluster = meta_value(annotations, KARMADA_MCS_NAME) == Some(name)
        && meta_value(annotations, KARMADA_MCS_NAMESPACE).is_none_or(|ns| ns == namespace);
    let (kind, service) = match derived {
        Some(svc) if interop.karmada => (BackingKind::KarmadaDerived, svc),
        _ if interop.karmada && crosscluster => (BackingKind::KarmadaCrossCluster, name),
        _ if interop.kosmos && meta_value(annotations, KOSMOS_SERVICE_IMPORT).is_some() => {
            (BackingKind::Kosmos, name)
        }
        _ => return Ok(None),
    };
    let service = ServiceKey {
        namespace: cx.label("metadata.namespace", namespace)?,
        name: cx.label("metadata.name", service)?,
    };
    let spec = obj.spec.as_ref();
    let cluster_ip = spec.and_then(|s| s.cluster_ip.as_deref()).unwrap_or("");
    let headless = cluster_ip == "None";
    // `clusterIPs` is the dual-stack list; old objects have only `clusterIP`.
    let listed: Vec<&str> = match spec.and_then(|s| s.cluster_ips.as_ref()) {
        Some(ips) if !ips.is_empty() => ips.iter().map(String::as_str).collect(),
        _ => vec![cluster_ip],
    };
    let mut ips: Vec<IpAddr> = Vec::new();
    for (i, ip) in listed.iter().enumerate().filter(|(_, ip)| !ip.is_empty() && **ip != "None") {
        let field = format!("spec.clusterIPs[{i}]");
        let ip: IpAddr = ip.parse().map_err(|_| cx.err(&field, format!("{ip:?} is not an IP address")))?;
        if ips.iter().any(|seen| seen.is_ipv4() == ip.is_ipv4()) {
            return Err(cx.err(field, "more than one address of the same family"));
        }
        ips.push(ip);
    }
    let ports = spec
        .and_then(|s| s.ports.as_ref())
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(i, p)| {
            convert::port(
                &cx,
                &format!("spec.ports[{i}]"),
                p.name.as_deref(),
                p.protocol.as_deref(),
                p.port.into(),
            )
        })
        .collect::<Result<_, _>>()?;
    Ok(Some(BackingService {
        object: SliceKey { namespace: namespace.to_owned(), name: name.to_owned() },
        service,
        kind,
        headless,
        ips,
        ports,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::discovery::v1 as discovery;

    const KARMADA: &str = include_str!("../../tests/data/interop/karmada.yaml");
    const KOSMOS: &str = include_str!("../../tests/data/interop/kosmos.yaml");
    const BOTH: Interop = Interop { karmada: true, kosmos: true };

    /// The fixture's documents of `kind`, by name.
    fn doc<T: serde::de::DeserializeOwned>(text: &str, kind: &str, name: &str) -> T {
        for d in serde_yaml_ng::Deserializer::from_str(text) {
            let v = serde_yaml_ng::Value::deserialize(d).unwrap();
            if v["kind"].as_str() == Some(kind) && v["metadata"]["name"].as_str() == Some(name) {
                return serde_yaml_ng::from_value(v).unwrap();
            }
        }
        panic!("no {kind} {name}");
    }
    use serde::Deserialize;

    fn slice(text: &str, name: &str, interop: Interop) -> Option<crate::model::EndpointSet> {
        match foreign_slice(&doc::<discovery::EndpointSlice>(text, "EndpointSlice", name), interop)
            .unwrap()?
        {
            SliceOutcome::Endpoints(s) => Some(s),
            SliceOutcome::Fqdn => panic!("fqdn"),
        }
    }

    #[test]
    fn karmada_collected_slices_name_their_service_and_source_cluster() {
        let s = slice(KARMADA, "imported-member1-web-8zq5t", BOTH).unwrap();
        assert_eq!(s.service.to_string(), "shop/web");
        assert_eq!(s.cluster.as_str(), "member1");
        assert_eq!(s.origin, SliceOrigin::Karmada);
        assert!(!s.endpoints[1].ready);
        assert_eq!(slice(KARMADA, "imported-member1-db-4kfj2", BOTH).unwrap().service.to_string(), "shop/db");
        // Read only when asked for.
        assert!(
            slice(KARMADA, "imported-member1-web-8zq5t", Interop { karmada: false, kosmos: true }).is_none()
        );
    }

    #[test]
    fn karmada_cluster_names_with_dashes_and_the_service_name_in_them() {
        assert_eq!(karmada_imported_cluster("imported-member1-web-8zq5t", "web"), Some("member1"));
        assert_eq!(karmada_imported_cluster("imported-web-east-web-8zq5t", "web"), Some("web-east"));
        assert_eq!(karmada_imported_cluster("imported-eu-1-web", "web"), Some("eu-1"));
        assert_eq!(karmada_imported_cluster("imported-eu-1-webby-x", "web"), None);
        assert_eq!(karmada_imported_cluster("imported--web-x", "web"), None);
        assert_eq!(karmada_imported_cluster("web-x", "web"), None);
    }

    #[test]
    fn a_karmada_slice_without_its_cluster_is_skipped_by_name() {
        let mut s: discovery::EndpointSlice = doc(KARMADA, "EndpointSlice", "imported-member1-web-8zq5t");
        s.metadata.name = Some("web-8zq5t".into());
        let e = foreign_slice(&s, BOTH).unwrap_err();
        assert!(e.to_string().starts_with("EndpointSlice shop/web-8zq5t: metadata.name: "), "{e}");
    }

    #[test]
    fn karmada_dispatched_slices_take_the_provision_cluster() {
        let s = slice(KARMADA, "member1-cache-x9k2p", BOTH).unwrap();
        assert_eq!((s.service.to_string().as_str(), s.cluster.as_str()), ("shop/cache", "member1"));
        assert_eq!(s.origin, SliceOrigin::KarmadaDispatch);
    }

    #[test]
    fn karmada_services() {
        let b = backing_service(&doc(KARMADA, "Service", "derived-web"), BOTH).unwrap().unwrap();
        assert_eq!((b.kind, b.service.to_string().as_str()), (BackingKind::KarmadaDerived, "shop/web"));
        assert_eq!(b.ips, vec!["10.96.120.15".parse::<IpAddr>().unwrap()]);
        assert!(!b.headless);
        let b = backing_service(&doc(KARMADA, "Service", "cache"), BOTH).unwrap().unwrap();
        assert_eq!(b.kind, BackingKind::KarmadaCrossCluster);
        assert_eq!(b.ports[0].port, 6379);
        assert!(backing_service(&doc(KARMADA, "Service", "derived-web"), Interop::NONE).unwrap().is_none());
    }

    #[test]
    fn kosmos_services_slices_and_disconnected_addresses() {
        let b = backing_service(&doc(KOSMOS, "Service", "db"), BOTH).unwrap().unwrap();
        assert_eq!(b.kind, BackingKind::Kosmos);
        assert!(b.headless && b.ips.is_empty());
        let s = slice(KOSMOS, "db-7hd2m", BOTH).unwrap();
        assert_eq!((s.cluster.as_str(), s.origin), (KOSMOS_ROOT_CLUSTER, SliceOrigin::Kosmos));
        let i = service_import(&doc(KOSMOS, "ServiceImport", "web"), BOTH).unwrap();
        assert_eq!(i.answers.disconnected, vec!["10.233.65.12".parse::<IpAddr>().unwrap()]);
        let i = service_import(&doc(KOSMOS, "ServiceImport", "web"), Interop::NONE).unwrap();
        assert!(i.answers.disconnected.is_empty());
        assert_eq!(disconnected(" 10.0.0.1,,x,fd00::1 ").1, vec!["x"]);
    }

    #[test]
    fn other_services_and_slices_are_not_errors() {
        let mut svc: Service = doc(KOSMOS, "Service", "web");
        svc.metadata.annotations = None;
        assert!(backing_service(&svc, BOTH).unwrap().is_none());
        let mut s: discovery::EndpointSlice = doc(KOSMOS, "EndpointSlice", "web-2xk9q");
        s.metadata.annotations = None;
        assert!(foreign_slice(&s, BOTH).unwrap().is_none());
    }
}
