//! The MCS custom resources, reduced to the fields DNS answers from
//! (`multicluster.x-k8s.io`; v1alpha1 and v1beta1 have the same shape, so
//! one type reads both; [`super::mcs`] has the group, versions and labels).
//!
//! Plain serde, not kube's `CustomResource`: a derived type is bound to one
//! version, and a watch of typed objects fails its whole list on one object
//! that does not deserialize. Watches read [`WatchedImport`]s of the
//! discovered version, whose spec is parsed apart, so a bad object is
//! skipped by name.

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::{ApiResource, DynamicResourceScope, Resource};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// A `ServiceImport` object.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ServiceImport {
    /// Standard object metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The spec. Optional in the CRD; without one the import is skipped by
    /// name (it has no type), not a reason to reject a whole file or list.
    #[serde(default)]
    pub spec: ServiceImportSpec,
}

/// `ServiceImport.spec`, the fields DNS uses.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceImportSpec {
    /// `ClusterSetIP` or `Headless`.
    #[serde(rename = "type", default)]
    pub type_: String,
    /// Clusterset VIPs, at most one per family.
    #[serde(default)]
    pub ips: Vec<String>,
    /// Ports.
    #[serde(default)]
    pub ports: Vec<ServicePort>,
    /// Routing preference hint as for a Service (`PreferClose`,
    /// `PreferSameZone`): selects the topology answer policy.
    #[serde(default)]
    pub traffic_distribution: Option<String>,
}

/// A ServiceImport port.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServicePort {
    /// Optional name; named ports get `_<name>._<proto>` SRV records.
    #[serde(default)]
    pub name: Option<String>,
    /// `TCP` (also when omitted), `UDP` or `SCTP`.
    #[serde(default)]
    pub protocol: Option<String>,
    /// Port number (kept wide so out-of-range values are reported, not misparsed).
    pub port: i64,
}

/// A ServiceImport as a watch reads it from the API server's JSON: the
/// metadata typed, the spec kept as its JSON text until the import is
/// converted ([`WatchedImport::spec`]), the status (which DNS never reads)
/// skipped without being built. A spec that does not fit skips that one
/// import, named, instead of failing the list or event it came in (kube
/// reads a list in one piece); and unlike kube's `DynamicObject`, which this
/// replaces, no JSON tree of the whole object is built and then copied.
#[derive(Debug, Clone, Deserialize)]
pub struct WatchedImport {
    /// The object metadata conversion and the watch read: name, namespace,
    /// annotations, uid and resourceVersion (`read_meta`).
    #[serde(default, deserialize_with = "read_meta")]
    pub metadata: ObjectMeta,
    /// The spec's JSON text, as it came.
    #[serde(default)]
    spec: Option<Box<RawValue>>,
}

impl WatchedImport {
    /// The spec, parsed: `Err` names the import and the field that does
    /// not fit (`ServiceImport ns/name: spec.ports[0].port: invalid type
    /// …`), as conversion errors do. No spec is the default one (no type),
    /// which conversion refuses by name.
    pub fn spec(&self) -> Result<ServiceImportSpec, String> {
        let Some(raw) = &self.spec else { return Ok(ServiceImportSpec::default()) };
        let mut json = serde_json::Deserializer::from_str(raw.get());
        serde_path_to_error::deserialize(&mut json).map_err(|e| {
            let (ns, name) = (self.metadata.namespace.as_deref(), self.metadata.name.as_deref());
            let at = format!("ServiceImport {}/{}", ns.unwrap_or(""), name.unwrap_or(""));
            format!("{at}: spec.{}: {}", e.path(), e.inner())
        })
    }
}

/// The metadata a watched import is read by. The rest (managedFields
/// above all, a tree per writer; labels, owners, timestamps) is skipped
/// without being built: at 100,000 imports it was most of the work.
fn read_meta<'de, D: serde::Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Read {
        name: Option<String>,
        namespace: Option<String>,
        uid: Option<String>,
        resource_version: Option<String>,
        annotations: Option<std::collections::BTreeMap<String, String>>,
    }
    let Read { name, namespace, uid, resource_version, annotations } = Read::deserialize(d)?;
    Ok(ObjectMeta { name, namespace, uid, resource_version, annotations, ..ObjectMeta::default() })
}

/// As kube's `DynamicObject`: the group and version are the discovered
/// ones (v1alpha1 or v1beta1), given as an [`ApiResource`].
impl Resource for WatchedImport {
    type DynamicType = ApiResource;
    type Scope = DynamicResourceScope;

    fn group(dt: &ApiResource) -> Cow<'_, str> {
        dt.group.as_str().into()
    }

    fn version(dt: &ApiResource) -> Cow<'_, str> {
        dt.version.as_str().into()
    }

    fn kind(dt: &ApiResource) -> Cow<'_, str> {
        dt.kind.as_str().into()
    }

    fn api_version(dt: &ApiResource) -> Cow<'_, str> {
        dt.api_version.as_str().into()
    }

    fn plural(dt: &ApiResource) -> Cow<'_, str> {
        dt.plural.as_str().into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use kube::core::ObjectList;

    use super::*;
    use crate::k8s::convert;

    /// A list as the API server sends it: a good import, one whose spec
    /// does not fit, one without a spec, one with a null spec.
    const LIST: &str = r#"{"apiVersion": "multicluster.x-k8s.io/v1beta1", "kind": "ServiceImportList",
      "metadata": {"resourceVersion": "7"},
      "items": [
        {"metadata": {"name": "web", "namespace": "shop", "annotations": {"clusterset-dns.io/answer-policy": "random"}},
         "spec": {"type": "ClusterSetIP", "ips": ["10.9.0.1"], "ports": [{"name": "http", "protocol": "TCP", "port": 80}],
                  "trafficDistribution": "PreferClose"},
         "status": {"clusters": [{"cluster": "a"}, {"cluster": "b"}]}},
        {"metadata": {"name": "bad", "namespace": "shop"},
         "spec": {"type": "Headless", "ports": [{"port": "eighty"}]}},
        {"metadata": {"name": "bare", "namespace": "shop"}},
        {"metadata": {"name": "null", "namespace": "shop"}, "spec": null}
      ]}"#;

    #[test]
    fn a_list_reads_whole_and_each_spec_alone() {
        let list: ObjectList<WatchedImport> = serde_json::from_str(LIST).expect("the list reads whole");
        let [web, bad, bare, null] = &list.items[..] else { panic!("{} items", list.items.len()) };
        // The same import as read from a file (the whole object typed).
        let item: serde_json::Value =
            serde_json::from_str::<serde_json::Value>(LIST).expect("json")["items"][0].clone();
        let typed: ServiceImport = serde_json::from_value(item).expect("typed");
        let from_parts = convert::service_import_of(&web.metadata, &web.spec().expect("spec"));
        assert_eq!(from_parts.expect("web"), convert::service_import(&typed).expect("web"));
        let why = bad.spec().expect_err("a port that is not a number");
        assert!(
            why.starts_with("ServiceImport shop/bad: spec.ports[0].port: invalid type: string \"eighty\""),
            "{why}"
        );
        for empty in [bare, null] {
            let spec = empty.spec().expect("no spec is the default");
            assert_eq!(spec.type_, "");
            let why = convert::service_import_of(&empty.metadata, &spec).expect_err("no type");
            assert!(why.to_string().contains("spec.type"), "{why}");
        }
    }
}
