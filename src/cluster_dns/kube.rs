//! Reading what `plan` needs from a cluster and writing its edits.
//!
//! Every ConfigMap write carries the `resourceVersion` it was planned
//! from, so a ConfigMap edited meanwhile (by a person, an addon manager)
//! fails with a conflict instead of being overwritten with a stale copy.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use super::plan::{Edit, Observed};

/// Where the cluster DNS lives.
const NS: &str = "kube-system";

/// OpenShift's DNS operator resource.
fn openshift_dns() -> ApiResource {
    ApiResource {
        group: "operator.openshift.io".into(),
        version: "v1".into(),
        api_version: "operator.openshift.io/v1".into(),
        kind: "DNS".into(),
        plural: "dnses".into(),
    }
}

/// A read or write failed.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// The API said no.
    #[error("{what}: {source}")]
    Api {
        /// What was read or written.
        what: String,
        /// The error.
        source: kube::Error,
    },
    /// The object changed between reading and writing.
    #[error("{0} changed while it was being edited; nothing of it was written, run setup-dns again")]
    Conflict(String),
}

fn api_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> SetupError {
    let what = what.into();
    move |source| match &source {
        kube::Error::Api(s) if s.code == 409 => SetupError::Conflict(what),
        _ => SetupError::Api { what, source },
    }
}

/// Absent is `None`; a missing resource type (OpenShift's on other
/// clusters) counts as absent too.
fn absent<T>(r: Result<Option<T>, kube::Error>) -> Result<Option<T>, kube::Error> {
    match r {
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        other => other,
    }
}

/// What a cluster's DNS configuration looks like, with the
/// resourceVersions of the ConfigMaps read.
pub struct Read {
    /// For `plan`.
    pub observed: Observed,
    versions: BTreeMap<String, String>,
}

/// Reads every object `plan` looks at.
pub async fn read(client: &kube::Client) -> Result<Read, SetupError> {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    let mut versions = BTreeMap::new();
    let mut get = async |name: &str| -> Result<Option<ConfigMap>, SetupError> {
        let cm = cms.get_opt(name).await.map_err(api_err(format!("ConfigMap {NS}/{name}")))?;
        if let Some(v) = cm.as_ref().and_then(|c| c.metadata.resource_version.clone()) {
            versions.insert(name.to_owned(), v);
        }
        Ok(cm)
    };
    let key = |cm: &Option<ConfigMap>, k: &str| cm.as_ref()?.data.as_ref()?.get(k).cloned();
    let coredns = get("coredns").await?;
    let custom = get("coredns-custom").await?;
    let rke2 = get("rke2-coredns-rke2-coredns").await?;
    let kube_dns_cm = get("kube-dns").await?;
    let nodelocal = get("node-local-dns").await?;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NS);
    let kube_dns = deployments
        .get_opt("kube-dns")
        .await
        .map_err(api_err(format!("Deployment {NS}/kube-dns")))?
        .map(|_| key(&kube_dns_cm, "stubDomains"));
    let dns: Api<DynamicObject> = Api::all_with(client.clone(), &openshift_dns());
    let openshift = absent(dns.get_opt("default").await)
        .map_err(api_err("dns.operator.openshift.io/default"))?
        .map(|o| o.data.pointer("/spec/servers").and_then(Value::as_array).cloned().unwrap_or_default());
    let observed = Observed {
        coredns: key(&coredns, "Corefile"),
        coredns_custom: custom.map(|c| c.data.unwrap_or_default()),
        rke2: rke2.is_some(),
        kube_dns,
        openshift,
        nodelocal: key(&nodelocal, "Corefile"),
    };
    Ok(Read { observed, versions })
}

/// Writes one edit planned from `read`.
pub async fn write(client: &kube::Client, read: &Read, edit: &Edit) -> Result<(), SetupError> {
    match edit {
        Edit::ConfigMapKey { name, key, value, create: true } => {
            let cms: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
            let cm: ConfigMap = serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": NS},
                "data": value.as_ref().map(|v| json!({ *key: v })).unwrap_or(json!({})),
            }))
            .map_err(|e| SetupError::Api {
                what: format!("ConfigMap {NS}/{name}"),
                source: kube::Error::SerdeError(e),
            })?;
            cms.create(&PostParams::default(), &cm)
                .await
                .map_err(api_err(format!("ConfigMap {NS}/{name}")))?;
        }
        Edit::ConfigMapKey { name, key, value, create: false } => {
            let cms: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
            // A merge patch: only our key changes (null deletes it); the
            // resourceVersion makes it fail if anything changed since read.
            let patch = json!({
                "metadata": {"resourceVersion": read.versions.get(*name)},
                "data": { *key: value },
            });
            cms.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(api_err(format!("ConfigMap {NS}/{name}")))?;
        }
        Edit::OpenShiftServers(servers) => {
            let dns: Api<DynamicObject> = Api::all_with(client.clone(), &openshift_dns());
            let patch = json!({"spec": {"servers": servers}});
            dns.patch("default", &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(api_err("dns.operator.openshift.io/default"))?;
        }
    }
    Ok(())
}

/// The ClusterIP of Service `namespace/name`, if it has one.
pub async fn cluster_ip(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<Option<String>, SetupError> {
    let services: Api<Service> = Api::namespaced(client.clone(), namespace);
    let svc = services.get_opt(name).await.map_err(api_err(format!("Service {namespace}/{name}")))?;
    Ok(svc.and_then(|s| s.spec?.cluster_ip).filter(|ip| !ip.is_empty() && ip != "None"))
}
