//! ExportRecords: what a member publishes on the hub for each service it
//! exports, and how a reader turns them back into the member's objects.
//!
//! **Shape.** One record per export, named `<namespace>.<name>` in the
//! member's own hub namespace, holding the member's ServiceExport, its
//! Service and the Service's own EndpointSlices, each trimmed of what no
//! reader uses (managed fields, status, versions). Per export, not per
//! object: a hub of 100 members × 10,000 exports holds a million records,
//! not three or four million, and one change of a service is one write.
//! Whole objects, not a schema of our own: a reader converts them with
//! the same functions as the push mode's watches (`fleet::member`), so both
//! modes merge the same way by construction. **Size.** A record is kept
//! under [`RECORD_BYTES`] (etcd refuses requests over 1.5 MiB by default):
//! slices that do not fit go into continuation records
//! `<namespace>.<name>.<n>` (a Service name has no dot, so the two forms
//! never meet), whose slices a reader adds to the base record's.
//! **Writes.** A record is written only when its content changed (its
//! digest, in an annotation, is read back at start: an idle restart writes
//! nothing). A slice's trigger time
//! (`endpoints.kubernetes.io/last-change-trigger-time`) travels in the
//! record but is no part of the digest: as `sync` writes no MCS slice for
//! a time that changed alone, the agent writes no record for one; the
//! record takes the time with the next change of content.
//!
//! The namespace of a record, not its content, says which member published
//! it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use serde_json::{Value, json};

use crate::k8s::mcs::ANNOTATION_TRIGGER_TIME;

/// The records' API group.
pub const GROUP: &str = "hub.clusterset-dns.io";
/// Their version.
pub const VERSION: &str = "v1alpha1";
/// Their kind.
pub const KIND: &str = "ExportRecord";
/// Their plural.
pub const PLURAL: &str = "exportrecords";

/// A member's hub namespace is this prefix and the member's name.
pub const NAMESPACE_PREFIX: &str = "clusterset-member-";

/// The label every record carries (value: the service's namespace/name
/// as `<namespace>.<name>`), so a base record and its continuations are
/// listed together.
pub const LABEL_SERVICE: &str = "hub.clusterset-dns.io/service";
/// The annotation holding a record's content digest.
pub const ANNOTATION_DIGEST: &str = "hub.clusterset-dns.io/digest";
/// The field manager of the agent's writes on the hub.
pub const FIELD_MANAGER: &str = "clusterset-dns-agent";

/// The largest record written, in bytes of JSON.
pub const RECORD_BYTES: usize = 512 * 1024;

/// The ExportRecord resource.
pub fn resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, VERSION, KIND), PLURAL)
}

/// The hub namespace of member `name`.
pub fn namespace_of(member: &str) -> String {
    format!("{NAMESPACE_PREFIX}{member}")
}

/// The member a hub namespace is of, if it is one.
pub fn member_of(namespace: &str) -> Option<&str> {
    namespace.strip_prefix(NAMESPACE_PREFIX).filter(|m| !m.is_empty())
}

/// A record's name for the export of `namespace/name`, part `part` (0: the
/// base record).
pub fn record_name(namespace: &str, name: &str, part: usize) -> String {
    if part == 0 { format!("{namespace}.{name}") } else { format!("{namespace}.{name}.{part}") }
}

/// The service (namespace, name) and part a record's name says.
pub fn parse_name(record: &str) -> Option<(&str, &str, usize)> {
    let mut it = record.splitn(3, '.');
    let (ns, name) = (it.next()?, it.next()?);
    let part = match it.next() {
        None => 0,
        Some(p) => p.parse().ok().filter(|p| *p > 0)?,
    };
    (!ns.is_empty() && !name.is_empty()).then_some((ns, name, part))
}

/// What a member exports of one service, as its objects.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Exported {
    /// Its ServiceExport.
    pub export: Option<DynamicObject>,
    /// Its Service.
    pub service: Option<Service>,
    /// The Service's own EndpointSlices.
    pub slices: Vec<EndpointSlice>,
}

/// Removes what no reader uses: versions, managed fields, owner references,
/// status; a Service keeps `spec` and the metadata the merge reads.
fn trimmed(mut v: Value) -> Value {
    if let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        for k in
            ["managedFields", "resourceVersion", "generation", "selfLink", "ownerReferences", "finalizers"]
        {
            meta.remove(k);
        }
        if let Some(a) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
            a.remove("kubectl.kubernetes.io/last-applied-configuration");
        }
    }
    if let Some(o) = v.as_object_mut() {
        o.remove("status");
    }
    v
}

/// The records of one export: the base record (export, Service, slices
/// that fit) and continuations for the slices that do not, each under
/// [`RECORD_BYTES`]; `None` when nothing is exported. Each body is a
/// server-side apply body with its digest annotated.
pub fn records(member_namespace: &str, namespace: &str, name: &str, e: &Exported) -> Vec<Value> {
    let Some(export) = &e.export else { return Vec::new() };
    let export = trimmed(serde_json::to_value(export).unwrap_or_default());
    let service = e.service.as_ref().map(|s| trimmed(serde_json::to_value(s).unwrap_or_default()));
    let slices: Vec<Value> =
        e.slices.iter().map(|s| trimmed(serde_json::to_value(s).unwrap_or_default())).collect();
    let mut parts: Vec<Vec<Value>> = vec![Vec::new()];
    let mut size = export.to_string().len() + service.as_ref().map_or(0, |s| s.to_string().len());
    for s in slices {
        let n = s.to_string().len();
        if size + n > RECORD_BYTES && !parts.last().is_none_or(Vec::is_empty) {
            parts.push(Vec::new());
            size = 0;
        }
        size += n;
        if let Some(last) = parts.last_mut() {
            last.push(s);
        }
    }
    parts
        .into_iter()
        .enumerate()
        .map(|(part, slices)| {
            let spec = if part == 0 {
                json!({"serviceExport": export, "service": service, "endpointSlices": slices})
            } else {
                json!({"endpointSlices": slices})
            };
            let digest = content_digest(&spec);
            json!({
                "apiVersion": format!("{GROUP}/{VERSION}"), "kind": KIND,
                "metadata": {
                    "name": record_name(namespace, name, part), "namespace": member_namespace,
                    "labels": {LABEL_SERVICE: record_name(namespace, name, 0)},
                    "annotations": {ANNOTATION_DIGEST: digest},
                },
                "spec": spec,
            })
        })
        .collect()
}

/// The digest of a record's `spec`, less its slices' trigger times.
fn content_digest(spec: &Value) -> String {
    let mut content = spec.clone();
    let slices = content.get_mut("endpointSlices").and_then(Value::as_array_mut);
    for s in slices.into_iter().flatten() {
        let Some(meta) = s.get_mut("metadata").and_then(Value::as_object_mut) else { continue };
        if let Some(a) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
            a.remove(ANNOTATION_TRIGGER_TIME);
            if a.is_empty() {
                meta.remove("annotations");
            }
        }
    }
    crate::k8s::digest::of(&content)
}

/// A record's content digest, as written.
pub fn digest(record: &Value) -> Option<&str> {
    record.pointer(&format!("/metadata/annotations/{}", ANNOTATION_DIGEST.replace('/', "~1")))?.as_str()
}

/// Why a record could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("ExportRecord {namespace}/{name} (member {member}): {problem}")]
pub struct RecordError {
    /// The member whose namespace holds it.
    pub member: String,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// What is wrong, naming the field.
    pub problem: String,
}

/// One record as read back: which service and part, and its objects.
#[derive(Debug, Clone, PartialEq)]
pub struct Read {
    /// The service's namespace and name.
    pub service: (String, String),
    /// 0: the base record (export and Service); n: a continuation.
    pub part: usize,
    /// Its objects (a continuation has slices only).
    pub objects: Exported,
}

/// Reads a record of member `member`'s namespace: its name must be one of
/// the export's records, and each object it holds must be of the service
/// it names (a record that says another namespace or service is refused:
/// a member publishes only its own exports, by name).
pub fn read(member: &str, record: &DynamicObject) -> Result<Read, RecordError> {
    let ns = record.metadata.namespace.clone().unwrap_or_default();
    let rname = record.metadata.name.clone().unwrap_or_default();
    let fail = |problem: String| RecordError {
        member: member.to_owned(),
        namespace: ns.clone(),
        name: rname.clone(),
        problem,
    };
    let (svc_ns, svc_name, part) =
        parse_name(&rname).ok_or_else(|| fail("metadata.name: not <namespace>.<name>[.<n>]".into()))?;
    let spec = record.data.get("spec").ok_or_else(|| fail("no spec".into()))?;
    let same = |what: &str, meta: &kube::api::ObjectMeta, name_too: bool| -> Result<(), RecordError> {
        if meta.namespace.as_deref() != Some(svc_ns) || (name_too && meta.name.as_deref() != Some(svc_name)) {
            return Err(fail(format!("spec.{what}: not of {svc_ns}/{svc_name}")));
        }
        Ok(())
    };
    let mut objects = Exported::default();
    if part == 0 {
        let export: DynamicObject =
            serde_json::from_value(spec.get("serviceExport").cloned().unwrap_or(Value::Null))
                .map_err(|e| fail(format!("spec.serviceExport: {e}")))?;
        same("serviceExport", &export.metadata, true)?;
        objects.export = Some(export);
        objects.service = match spec.get("service") {
            None | Some(Value::Null) => None,
            Some(s) => {
                let s: Service =
                    serde_json::from_value(s.clone()).map_err(|e| fail(format!("spec.service: {e}")))?;
                same("service", &s.metadata, true)?;
                Some(s)
            }
        };
    }
    let slices = spec.get("endpointSlices").cloned().unwrap_or(Value::Array(Vec::new()));
    let slices: Vec<EndpointSlice> =
        serde_json::from_value(slices).map_err(|e| fail(format!("spec.endpointSlices: {e}")))?;
    for s in &slices {
        same("endpointSlices", &s.metadata, false)?;
        let of = s.metadata.labels.as_ref().and_then(|l| l.get(crate::k8s::mcs::LABEL_K8S_SERVICE_NAME));
        if of.map(String::as_str) != Some(svc_name) {
            return Err(fail(format!("spec.endpointSlices: {:?} is not of {svc_name}", s.metadata.name)));
        }
    }
    objects.slices = slices;
    Ok(Read { service: (svc_ns.to_owned(), svc_name.to_owned()), part, objects })
}

/// Every record of one member as read, by record name.
pub type Records = BTreeMap<String, Read>;

/// What a member exports of each service, from all its records (a base
/// record's objects with its continuations' slices; continuations without
/// a base record are waited for, not read).
pub fn exports(records: &Records) -> BTreeMap<(String, String), Exported> {
    let mut out: BTreeMap<(String, String), Exported> = BTreeMap::new();
    for r in records.values().filter(|r| r.part == 0) {
        out.insert(r.service.clone(), r.objects.clone());
    }
    for r in records.values().filter(|r| r.part > 0) {
        if let Some(e) = out.get_mut(&r.service) {
            e.slices.extend(r.objects.slices.iter().cloned());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// shop/web as `tests/data/sync/web.yaml` has it, with a managed-fields
    /// entry and a status as an API server returns them.
    fn web() -> Exported {
        let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/sync/web.yaml"))
            .unwrap();
        let mut e = Exported::default();
        for doc in serde_yaml_ng::Deserializer::from_str(&text) {
            let mut v: Value = serde::Deserialize::deserialize(doc).unwrap();
            v["metadata"]["managedFields"] = json!([{"manager": "kubectl", "operation": "Apply"}]);
            v["metadata"]["resourceVersion"] = json!("123");
            match v["kind"].as_str().unwrap() {
                "Service" => {
                    v["status"] = json!({"loadBalancer": {}});
                    e.service = Some(serde_json::from_value(v).unwrap());
                }
                "ServiceExport" => e.export = Some(serde_json::from_value(v).unwrap()),
                _ => e.slices.push(serde_json::from_value(v).unwrap()),
            }
        }
        e
    }

    fn as_read(body: &Value) -> Result<Read, RecordError> {
        read("cluster-1", &serde_json::from_value(body.clone()).unwrap())
    }

    #[test]
    fn a_record_reads_back_as_the_members_objects_trimmed() {
        let e = web();
        let written = records(&namespace_of("cluster-1"), "shop", "web", &e);
        assert_eq!(written.len(), 1);
        let r = &written[0];
        assert_eq!(r["metadata"]["name"], "shop.web");
        assert_eq!(r["metadata"]["namespace"], "clusterset-member-cluster-1");
        assert_eq!(r["metadata"]["labels"][LABEL_SERVICE], "shop.web");
        let text = r.to_string();
        assert!(
            !text.contains("managedFields") && !text.contains("loadBalancer") && !text.contains("\"123\""),
            "{text}"
        );
        let back = as_read(r).unwrap();
        assert_eq!((back.service.0.as_str(), back.service.1.as_str(), back.part), ("shop", "web", 0));
        // What the push mode's conversion reads is all there.
        let svc = back.objects.service.unwrap();
        assert_eq!(svc.spec.unwrap().cluster_ips, Some(vec!["10.96.0.10".to_owned()]));
        assert_eq!(back.objects.slices[0].endpoints[0].addresses, ["10.0.1.5"]);
        let export = back.objects.export.unwrap();
        assert_eq!(export.metadata.uid.as_deref(), Some("6f0e1a4c-0000-4000-8000-000000000001"));
        assert!(export.metadata.creation_timestamp.is_some());
        // The same content, the same digest: written once.
        assert_eq!(digest(r), digest(&records(&namespace_of("cluster-1"), "shop", "web", &web())[0]));
    }

    /// A slice's trigger time reaches the reader; the time alone changed
    /// gives the same digest (no write), a change of content with a new
    /// time a new one.
    #[test]
    fn a_trigger_time_travels_in_the_record_but_alone_writes_none() {
        let stamped = |at: &str, address: &str| {
            let mut e = web();
            let s = &mut e.slices[0];
            s.metadata.annotations = Some([(ANNOTATION_TRIGGER_TIME.to_owned(), at.to_owned())].into());
            s.endpoints[0].addresses = vec![address.to_owned()];
            records(&namespace_of("cluster-1"), "shop", "web", &e).remove(0)
        };
        let first = stamped("2026-11-28T06:00:00.25Z", "10.0.1.5");
        let back = as_read(&first).unwrap().objects.slices.remove(0);
        let at = back.metadata.annotations.as_ref().and_then(|a| a.get(ANNOTATION_TRIGGER_TIME));
        assert_eq!(at.map(String::as_str), Some("2026-11-28T06:00:00.25Z"));
        let retimed = stamped("2026-11-28T06:00:01.5Z", "10.0.1.5");
        assert_eq!(digest(&retimed), digest(&first), "a new time alone is no new content");
        let untimed = records(&namespace_of("cluster-1"), "shop", "web", &web()).remove(0);
        assert_eq!(digest(&untimed), digest(&first), "nor is a time added alone");
        assert_ne!(digest(&stamped("2026-11-28T06:00:01.5Z", "10.0.1.6")), digest(&first));
    }

    #[test]
    fn slices_that_do_not_fit_go_into_continuations_that_read_back_whole() {
        let mut e = web();
        let one = e.slices[0].clone();
        // 600 slices of 100 endpoints each: several records.
        e.slices = (0..600)
            .map(|i| {
                let mut s = one.clone();
                s.metadata.name = Some(format!("web-{i}"));
                s.endpoints = (0..100)
                    .map(|k| {
                        let mut ep = one.endpoints[0].clone();
                        ep.addresses = vec![format!("10.{}.{}.{}", i / 250, i % 250, k)];
                        ep
                    })
                    .collect();
                s
            })
            .collect();
        let written = records("clusterset-member-c1", "shop", "web", &e);
        assert!(written.len() > 4, "{} records", written.len());
        let mut all = Records::new();
        for r in &written {
            assert!(r.to_string().len() <= RECORD_BYTES + 1024, "{} bytes", r.to_string().len());
            let read = read("c1", &serde_json::from_value(r.clone()).unwrap()).unwrap();
            all.insert(r["metadata"]["name"].as_str().unwrap().to_owned(), read);
        }
        let whole = exports(&all);
        let back = &whole[&("shop".to_owned(), "web".to_owned())];
        assert_eq!(back.slices.len(), 600);
        assert!(back.export.is_some() && back.service.is_some());
        // A continuation alone (its base record not read yet) is waited for.
        all.remove("shop.web");
        assert!(exports(&all).is_empty());
    }

    #[test]
    fn a_record_of_another_service_or_a_bad_one_is_refused_naming_it() {
        let mut r = records("clusterset-member-c1", "shop", "web", &web()).remove(0);
        r["metadata"]["name"] = json!("shop.db");
        let e = as_read(&r).unwrap_err();
        assert!(
            e.to_string().contains("ExportRecord clusterset-member-c1/shop.db (member cluster-1)"),
            "{e}"
        );
        assert!(e.problem.contains("spec.serviceExport: not of shop/db"), "{e}");
        let mut r = records("clusterset-member-c1", "shop", "web", &web()).remove(0);
        r["spec"]["endpointSlices"][0]["metadata"]["labels"]["kubernetes.io/service-name"] = json!("db");
        assert!(as_read(&r).unwrap_err().problem.contains("is not of web"));
        let mut r = records("clusterset-member-c1", "shop", "web", &web()).remove(0);
        r["spec"]["service"]["spec"]["ports"] = json!("eighty");
        assert!(as_read(&r).unwrap_err().problem.starts_with("spec.service:"));
        r["metadata"]["name"] = json!("nodot");
        assert!(as_read(&r).unwrap_err().problem.starts_with("metadata.name"));
    }

    #[test]
    fn record_names_say_the_service_and_the_part() {
        assert_eq!(parse_name("shop.web"), Some(("shop", "web", 0)));
        assert_eq!(parse_name("shop.web.3"), Some(("shop", "web", 3)));
        assert_eq!(parse_name("shop.web.0"), None);
        assert_eq!(parse_name("shop.web.x"), None);
        assert_eq!(parse_name("shop"), None);
        assert_eq!(member_of("clusterset-member-c1"), Some("c1"));
        assert_eq!(member_of("clusterset-member-"), None);
        assert_eq!(member_of("default"), None);
    }
}
