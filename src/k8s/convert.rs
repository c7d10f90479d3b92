//! API objects → model values. This is the edge where bad input stops: an
//! object that cannot be answered correctly becomes a [`ConvertError`] naming
//! the object and the field, and is skipped by the caller; it never reaches
//! the store.

use std::net::IpAddr;

use k8s_openapi::api::discovery::v1 as discovery;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tracing::warn;

use super::crd;
use super::mcs::{ANNOTATION_TRIGGER_TIME, LABEL_SERVICE_NAME, LABEL_SOURCE_CLUSTER};
use crate::model::{
    AddressFamily, AnswerOverrides, ChangeTrigger, ClusterId, DnsLabel, Endpoint, EndpointSet, ImportType,
    LabelError, Port, Protocol, ServiceImport, ServiceKey, SliceKey, SliceOrigin,
};

/// Why an object was skipped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind} {namespace}/{name}: {field}: {problem}")]
pub struct ConvertError {
    /// `ServiceImport` or `EndpointSlice`.
    pub kind: &'static str,
    /// The object's namespace ("" when missing).
    pub namespace: String,
    /// The object's name ("" when missing).
    pub name: String,
    /// The offending field, as a path (`spec.ips[0]`).
    pub field: String,
    /// What is wrong with it.
    pub problem: String,
}

/// The outcome for one EndpointSlice: most slices become an [`EndpointSet`];
/// FQDN slices carry nothing DNS answers from and are ignored on purpose.
#[derive(Debug)]
pub enum SliceOutcome {
    /// A usable slice.
    Endpoints(EndpointSet),
    /// `addressType: FQDN`, which MCS DNS does not serve.
    Fqdn,
}

/// The object being converted, for error messages.
pub(super) struct Ctx<'a> {
    pub(super) kind: &'static str,
    pub(super) namespace: &'a str,
    pub(super) name: &'a str,
}

impl Ctx<'_> {
    pub(super) fn err(&self, field: impl Into<String>, problem: impl ToString) -> ConvertError {
        ConvertError {
            kind: self.kind,
            namespace: self.namespace.to_owned(),
            name: self.name.to_owned(),
            field: field.into(),
            problem: problem.to_string(),
        }
    }

    pub(super) fn label(&self, field: &str, value: &str) -> Result<DnsLabel, ConvertError> {
        DnsLabel::parse(value).map_err(|e: LabelError| self.err(field, e))
    }

    pub(super) fn key(&self) -> Result<ServiceKey, ConvertError> {
        Ok(ServiceKey {
            namespace: self.label("metadata.namespace", self.namespace)?,
            name: self.label("metadata.name", self.name)?,
        })
    }
}

/// Converts a ServiceImport object.
pub fn service_import(obj: &crd::ServiceImport) -> Result<ServiceImport, ConvertError> {
    service_import_of(&obj.metadata, &obj.spec)
}

/// [`service_import`] of an import's parts: a watched import's metadata and
/// its spec, parsed apart ([`crd::WatchedImport`]).
pub fn service_import_of(
    metadata: &ObjectMeta,
    spec: &crd::ServiceImportSpec,
) -> Result<ServiceImport, ConvertError> {
    let cx = Ctx {
        kind: "ServiceImport",
        namespace: metadata.namespace.as_deref().unwrap_or(""),
        name: metadata.name.as_deref().unwrap_or(""),
    };
    let key = cx.key()?;
    let kind = match spec.type_.as_str() {
        "ClusterSetIP" => ImportType::ClusterSetIp,
        "Headless" => ImportType::Headless,
        other => {
            return Err(cx.err("spec.type", format!("{other:?} is not ClusterSetIP or Headless")));
        }
    };
    let mut ips: Vec<IpAddr> = Vec::with_capacity(spec.ips.len());
    for (i, ip) in spec.ips.iter().enumerate() {
        let field = format!("spec.ips[{i}]");
        let ip: IpAddr =
            ip.trim().parse().map_err(|_| cx.err(&field, format!("{ip:?} is not an IP address")))?;
        if ips.iter().any(|seen| seen.is_ipv4() == ip.is_ipv4()) {
            return Err(cx.err(field, "more than one address of the same family"));
        }
        ips.push(ip);
    }
    let ports = exactly(spec.ports.iter().enumerate().map(|(i, p)| {
        port(&cx, &format!("spec.ports[{i}]"), p.name.as_deref(), p.protocol.as_deref(), p.port)
    }))?;
    let (answers, problems) = answer_overrides_of(metadata, spec);
    for problem in problems {
        // A bad annotation must not take the service away: it is served
        // with the global settings for what the annotation would change.
        warn!(service = %key, "ServiceImport {key}: {problem}; using the default");
    }
    Ok(ServiceImport { key, kind, ips: ips.into(), ports: ports.into(), answers: answers.into() })
}

/// The `clusterset-dns.io/…` annotations and `spec.trafficDistribution`,
/// with the annotations that could not be used.
pub fn answer_overrides(obj: &crd::ServiceImport) -> (AnswerOverrides, Vec<crate::model::AnnotationError>) {
    answer_overrides_of(&obj.metadata, &obj.spec)
}

fn answer_overrides_of(
    metadata: &ObjectMeta,
    spec: &crd::ServiceImportSpec,
) -> (AnswerOverrides, Vec<crate::model::AnnotationError>) {
    let annotations = metadata.annotations.iter().flatten().map(|(k, v)| (k.as_str(), v.as_str()));
    let (mut o, problems) = AnswerOverrides::from_annotations(annotations);
    o.prefer_close = matches!(spec.traffic_distribution.as_deref(), Some("PreferClose" | "PreferSameZone"));
    (o, problems)
}

/// Converts an MCS EndpointSlice, read from JSON ([`discovery::EndpointSlice`])
/// or from protobuf (`k8s::protobuf::SliceView`): the same rules for both.
pub fn endpoint_slice(obj: &impl SliceFields) -> Result<SliceOutcome, ConvertError> {
    endpoint_slice_of(obj, |cx, obj| {
        let service_field = format!("metadata.labels[{LABEL_SERVICE_NAME}]");
        let service = obj.label(LABEL_SERVICE_NAME).ok_or_else(|| cx.err(&service_field, "is missing"))?;
        let service = ServiceKey {
            namespace: cx.label("metadata.namespace", cx.namespace)?,
            name: cx.label(&service_field, service)?,
        };
        let cluster_field = format!("metadata.labels[{LABEL_SOURCE_CLUSTER}]");
        let cluster = obj.label(LABEL_SOURCE_CLUSTER).ok_or_else(|| cx.err(&cluster_field, "is missing"))?;
        let cluster = ClusterId::parse(cluster).map_err(|e| cx.err(&cluster_field, e))?;
        Ok((service, cluster, SliceOrigin::Mcs))
    })
}

/// What conversion reads of an EndpointSlice, whichever encoding it came
/// in: one set of rules, so that a slice read as JSON and the same slice
/// read as protobuf become the same [`EndpointSet`] (the differential test
/// in `tests/it/protobuf.rs` holds them to it).
pub trait SliceFields {
    /// `metadata.name`.
    fn name(&self) -> Option<&str>;
    /// `metadata.namespace`.
    fn namespace(&self) -> Option<&str>;
    /// One of `metadata.labels`.
    fn label(&self, key: &str) -> Option<&str>;
    /// One of `metadata.annotations`.
    fn annotation(&self, key: &str) -> Option<&str>;
    /// `addressType`.
    fn address_type(&self) -> &str;
    /// `ports`.
    fn ports(&self) -> impl Iterator<Item = PortFields<'_>>;
    /// `endpoints`.
    fn endpoints(&self) -> impl ExactSizeIterator<Item = EndpointFields<'_>>;
}

/// What conversion reads of one of a slice's `ports`.
#[derive(Debug, Clone, Copy)]
pub struct PortFields<'a> {
    /// `name`.
    pub name: Option<&'a str>,
    /// `protocol`.
    pub protocol: Option<&'a str>,
    /// `port`; none means "all ports".
    pub port: Option<i32>,
}

/// What conversion reads of one of a slice's `endpoints`.
pub struct EndpointFields<'a> {
    /// `addresses`.
    pub addresses: Addresses<'a>,
    /// `hostname`.
    pub hostname: Option<&'a str>,
    /// `conditions.ready`.
    pub ready: Option<bool>,
    /// `targetRef`: kind, namespace, name.
    pub target: Option<(Option<&'a str>, Option<&'a str>, Option<&'a str>)>,
    /// `zone`.
    pub zone: Option<&'a str>,
}

/// An endpoint's `addresses`, as whichever decoder holds them.
#[derive(Clone, Copy)]
pub enum Addresses<'a> {
    /// Owned strings (JSON).
    Owned(&'a [String]),
    /// Borrowed from the message (protobuf).
    Borrowed(&'a [&'a str]),
}

impl<'a> Addresses<'a> {
    fn len(self) -> usize {
        match self {
            Self::Owned(a) => a.len(),
            Self::Borrowed(a) => a.len(),
        }
    }

    fn iter(self) -> impl Iterator<Item = &'a str> {
        let (owned, borrowed) = match self {
            Self::Owned(a) => (a, &[][..]),
            Self::Borrowed(a) => (&[][..], a),
        };
        owned.iter().map(String::as_str).chain(borrowed.iter().copied())
    }
}

impl SliceFields for discovery::EndpointSlice {
    fn name(&self) -> Option<&str> {
        self.metadata.name.as_deref()
    }

    fn namespace(&self) -> Option<&str> {
        self.metadata.namespace.as_deref()
    }

    fn label(&self, key: &str) -> Option<&str> {
        meta_value(self.metadata.labels.as_ref(), key)
    }

    fn annotation(&self, key: &str) -> Option<&str> {
        meta_value(self.metadata.annotations.as_ref(), key)
    }

    fn address_type(&self) -> &str {
        &self.address_type
    }

    fn ports(&self) -> impl Iterator<Item = PortFields<'_>> {
        self.ports.iter().flatten().map(|p| PortFields {
            name: p.name.as_deref(),
            protocol: p.protocol.as_deref(),
            port: p.port,
        })
    }

    fn endpoints(&self) -> impl ExactSizeIterator<Item = EndpointFields<'_>> {
        self.endpoints.iter().map(|ep| EndpointFields {
            addresses: Addresses::Owned(&ep.addresses),
            hostname: ep.hostname.as_deref(),
            ready: ep.conditions.as_ref().and_then(|c| c.ready),
            target: ep
                .target_ref
                .as_ref()
                .map(|t| (t.kind.as_deref(), t.namespace.as_deref(), t.name.as_deref())),
            zone: ep.zone.as_deref(),
        })
    }
}

/// A slice's service, source cluster and origin, read from its metadata by
/// whoever knows its shape.
pub(super) type SliceIdentity = (ServiceKey, ClusterId, SliceOrigin);

/// A label or annotation of an object.
pub(super) fn meta_value<'a>(
    map: Option<&'a std::collections::BTreeMap<String, String>>,
    key: &str,
) -> Option<&'a str> {
    map.and_then(|m| m.get(key)).map(String::as_str)
}

/// Converts an EndpointSlice whose service and cluster `identify` reads:
/// MCS labels here, a fleet manager's metadata in `interop`.
pub(super) fn endpoint_slice_of<S: SliceFields>(
    obj: &S,
    identify: impl FnOnce(&Ctx<'_>, &S) -> Result<SliceIdentity, ConvertError>,
) -> Result<SliceOutcome, ConvertError> {
    let namespace = obj.namespace().unwrap_or("");
    let cx = Ctx { kind: "EndpointSlice", namespace, name: obj.name().unwrap_or("") };
    if cx.name.is_empty() {
        return Err(cx.err("metadata.name", "is missing"));
    }
    let family = match obj.address_type() {
        "IPv4" => AddressFamily::V4,
        "IPv6" => AddressFamily::V6,
        "FQDN" => return Ok(SliceOutcome::Fqdn),
        other => {
            return Err(cx.err("addressType", format!("{other:?} is not IPv4, IPv6 or FQDN")));
        }
    };
    let (service, cluster, origin) = identify(&cx, obj)?;

    let ports = exactly(obj.ports().enumerate().filter_map(|(i, p)| {
        // A slice port without a number means "all ports" (EndpointSlice
        // API); it gives no SRV record, so it is left out, not an error.
        let number = p.port?;
        Some(port(&cx, &format!("ports[{i}]"), p.name, p.protocol, number.into()))
    }))?;

    let all = obj.endpoints();
    let mut endpoints = Vec::with_capacity(all.len());
    for (i, ep) in all.enumerate() {
        let mut addresses = Vec::with_capacity(ep.addresses.len());
        for (j, a) in ep.addresses.iter().enumerate() {
            let field = format!("endpoints[{i}].addresses[{j}]");
            let ip: IpAddr = a.parse().map_err(|_| cx.err(&field, format!("{a:?} is not an IP address")))?;
            if ip.is_ipv4() != (family == AddressFamily::V4) {
                return Err(cx.err(field, format!("{a} does not match addressType {}", obj.address_type())));
            }
            addresses.push(ip);
        }
        let hostname = match ep.hostname {
            None | Some("") => None,
            Some(h) => Some(cx.label(&format!("endpoints[{i}].hostname"), h)?),
        };
        // EndpointSlice API: "ready" unset means ready; `false` is not ready,
        // also while serving or terminating.
        let ready = ep.ready.unwrap_or(true);
        // The same Pod appears in the IPv4 and the IPv6 slice with the same
        // targetRef; that pairs its A and AAAA answers.
        let target = ep.target.and_then(|(kind, ns, name)| {
            let name = name.filter(|n| !n.is_empty())?;
            Some(format!("{}/{}/{}", kind.unwrap_or(""), ns.unwrap_or(namespace), name))
        });
        endpoints.push(Endpoint::new(addresses.into(), ready).with_names(
            hostname.as_ref(),
            ep.zone,
            target.as_deref(),
        ));
    }
    Ok(SliceOutcome::Endpoints(EndpointSet {
        slice: SliceKey { namespace: namespace.to_owned(), name: cx.name.to_owned() },
        service,
        cluster,
        family,
        ports,
        endpoints,
        origin,
        trigger: trigger_time(obj.annotation(ANNOTATION_TRIGGER_TIME)),
    }))
}

/// A slice's trigger time from its annotation's value. One that does not
/// parse is not an error (the slice is answered all the same); `serve`
/// counts it apart.
pub fn trigger_time(annotation: Option<&str>) -> ChangeTrigger {
    match annotation.map(str::parse::<k8s_openapi::jiff::Timestamp>) {
        None => ChangeTrigger::Missing,
        Some(Ok(t)) => ChangeTrigger::At(t.into()),
        Some(Err(_)) => ChangeTrigger::Unparsable,
    }
}

/// The items, or the first error, in a vector no longer than they are.
/// `collect` through `Result` cannot know the count and keeps room for
/// four; a fleet holds one such vector per import and per slice (~14 MB of
/// room for ports never there at 100,000 services).
pub(super) fn exactly<T, E>(items: impl Iterator<Item = Result<T, E>>) -> Result<Vec<T>, E> {
    let (least, most) = items.size_hint();
    let mut out = Vec::with_capacity(most.unwrap_or(least));
    for item in items {
        out.push(item?);
    }
    Ok(out)
}

pub(super) fn port(
    cx: &Ctx<'_>,
    field: &str,
    name: Option<&str>,
    protocol: Option<&str>,
    number: i64,
) -> Result<Port, ConvertError> {
    let name = match name {
        None | Some("") => None,
        Some(n) => Some(cx.label(&format!("{field}.name"), n)?),
    };
    // The ServiceImport CRD has no enum for the protocol (the API server
    // accepts "tcp") and no default: the Service API's default is TCP.
    let protocol = Protocol::from_api(protocol).ok_or_else(|| {
        let other = protocol.unwrap_or_default();
        cx.err(format!("{field}.protocol"), format!("{other:?} is not TCP, UDP or SCTP"))
    })?;
    let port = u16::try_from(number)
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| cx.err(format!("{field}.port"), format!("{number} is not a port number (1-65535)")))?;
    Ok(Port { name, protocol, port })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn import(yaml: &str) -> Result<ServiceImport, ConvertError> {
        service_import(&serde_yaml_ng::from_str(yaml).unwrap())
    }

    fn slice(yaml: &str) -> Result<SliceOutcome, ConvertError> {
        endpoint_slice(&serde_yaml_ng::from_str::<discovery::EndpointSlice>(yaml).unwrap())
    }

    const SLICE: &str = "
metadata:
  name: db-a
  namespace: shop
  labels:
    multicluster.kubernetes.io/service-name: db
    multicluster.kubernetes.io/source-cluster: cluster-a
addressType: IPv4
ports: [{name: pg, port: 5432}]
endpoints:
- addresses: [10.1.0.1]
  hostname: db-0
- addresses: [10.1.0.2]
  conditions: {ready: false}
";

    #[test]
    fn a_slice_carries_its_trigger_time_and_one_that_does_not_parse_is_served_all_same() {
        use std::time::{Duration, UNIX_EPOCH};
        let with = |value: &str| {
            let yaml = SLICE.replace(
                "  labels:\n",
                &format!("  annotations: {{endpoints.kubernetes.io/last-change-trigger-time: '{value}'}}\n  labels:\n"),
            );
            match slice(&yaml).unwrap() {
                SliceOutcome::Endpoints(set) => set.trigger,
                SliceOutcome::Fqdn => panic!("not FQDN"),
            }
        };
        let at = |secs: u64, nanos: u32| ChangeTrigger::At(UNIX_EPOCH + Duration::new(secs, nanos));
        // kube-controller-manager writes Go's RFC3339Nano: whole seconds as
        // they are, fractions without trailing zeros.
        assert_eq!(with("2026-11-28T01:58:05Z"), at(1_795_831_085, 0));
        assert_eq!(with("2026-11-28T01:58:05.12Z"), at(1_795_831_085, 120_000_000));
        assert_eq!(with("2026-11-28T02:58:05+01:00"), at(1_795_831_085, 0));
        assert_eq!(with("yesterday"), ChangeTrigger::Unparsable);
        let SliceOutcome::Endpoints(set) = slice(SLICE).unwrap() else { panic!("not FQDN") };
        assert_eq!(set.trigger, ChangeTrigger::Missing);
        assert_eq!(set.endpoints.len(), 2, "answered as before");
    }

    #[test]
    fn import_protocols_are_read_in_any_case() {
        let i = import("metadata: {name: web, namespace: shop}\nspec: {type: Headless, ports: [{port: 53, protocol: udp}]}").unwrap();
        assert_eq!(i.ports[0].protocol, Protocol::Udp);
    }

    #[test]
    fn import_with_omitted_protocol_means_tcp() {
        let i = import("metadata: {name: web, namespace: shop}\nspec: {type: ClusterSetIP, ips: [10.0.0.1], ports: [{name: http, port: 80}]}").unwrap();
        assert_eq!(i.kind, ImportType::ClusterSetIp);
        assert_eq!(i.ports[0].protocol, Protocol::Tcp);
        assert_eq!(i.ports[0].name.as_ref().map(DnsLabel::as_str), Some("http"));
    }

    #[test]
    fn import_errors_name_the_object_and_field() {
        let e =
            import("metadata: {name: web, namespace: shop}\nspec: {type: ClusterSetIP, ips: [10.0.0.300]}")
                .unwrap_err();
        assert_eq!(e.to_string(), "ServiceImport shop/web: spec.ips[0]: \"10.0.0.300\" is not an IP address");
        let e = import(
            "metadata: {name: web, namespace: shop}\nspec: {type: ClusterSetIP, ips: [10.0.0.1, 10.0.0.2]}",
        )
        .unwrap_err();
        assert_eq!(e.field, "spec.ips[1]");
        let e = import(
            "metadata: {name: web, namespace: shop}\nspec: {type: ClusterSetIP, ports: [{port: 70000}]}",
        )
        .unwrap_err();
        assert_eq!(e.field, "spec.ports[0].port");
        let e = import("metadata: {name: Web_1, namespace: shop}\nspec: {type: Headless}").unwrap_err();
        assert_eq!(e.field, "metadata.name");
        let e = import("metadata: {name: web, namespace: shop}\nspec: {type: LoadBalancer}").unwrap_err();
        assert_eq!(e.field, "spec.type");
        // Valid for the API server, but there is nothing to answer.
        let e = import("metadata: {name: web, namespace: shop}").unwrap_err();
        assert_eq!(e.field, "spec.type");
        let e = import("metadata: {name: web, namespace: shop}\nspec: {type: Headless, ports: [{port: 1, protocol: QUIC}]}").unwrap_err();
        assert_eq!(e.field, "spec.ports[0].protocol");
    }

    #[test]
    fn slice_readiness_defaults_to_ready() {
        let SliceOutcome::Endpoints(s) = slice(SLICE).unwrap() else { panic!("not endpoints") };
        assert_eq!(s.cluster.as_str(), "cluster-a");
        assert_eq!(s.service.name.as_str(), "db");
        assert!(s.endpoints[0].ready);
        assert!(!s.endpoints[1].ready);
        assert_eq!(s.endpoints[0].hostname(), Some("db-0"));
    }

    #[test]
    fn slice_with_wrong_family_address_is_rejected() {
        let e = slice(&SLICE.replace("10.1.0.2", "fd00::2")).unwrap_err();
        assert_eq!(e.field, "endpoints[1].addresses[0]");
        assert!(e.to_string().starts_with("EndpointSlice shop/db-a: "), "{e}");
    }

    #[test]
    fn slice_without_mcs_labels_is_rejected() {
        let e = slice(&SLICE.replace("multicluster.kubernetes.io/source-cluster", "x")).unwrap_err();
        assert_eq!(e.field, "metadata.labels[multicluster.kubernetes.io/source-cluster]");
    }

    #[test]
    fn slice_target_refs_identify_endpoints() {
        let yaml =
            SLICE.replace("  hostname: db-0", "  hostname: db-0\n  targetRef: {kind: Pod, name: db-0}");
        let SliceOutcome::Endpoints(s) = slice(&yaml).unwrap() else { panic!("not endpoints") };
        assert_eq!(s.endpoints[0].target(), Some("Pod/shop/db-0"));
        assert_eq!(s.endpoints[1].target(), None);
    }

    #[test]
    fn bad_annotations_keep_the_import_and_leave_the_default() {
        let i = import(
            "metadata:\n  name: web\n  namespace: shop\n  annotations:\n    clusterset-dns.io/answer-policy: fastest\n    clusterset-dns.io/max-answers: \"3\"\nspec: {type: Headless, trafficDistribution: PreferClose}",
        )
        .unwrap();
        assert_eq!(i.answers.policy, None);
        assert_eq!(i.answers.max_answers, Some(3));
        assert!(i.answers.prefer_close);
    }

    #[test]
    fn fqdn_slices_are_ignored() {
        assert!(matches!(slice(&SLICE.replace("IPv4", "FQDN")).unwrap(), SliceOutcome::Fqdn));
    }
}
