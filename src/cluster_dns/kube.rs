//! Reading what `plan` needs from a cluster and writing its edits.
//!
//! Every ConfigMap write carries the `resourceVersion` it was planned
//! from, so a ConfigMap edited meanwhile (by a person, an addon manager)
//! fails with a conflict instead of being overwritten with a stale copy.
//! Writes name the field manager [`MANAGER`], so `--watch` can tell its own
//! writes from another controller's in `managedFields`.

use std::collections::BTreeMap;

use std::time::Instant;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference, Service};
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::plan::{Edit, Observed};
use crate::k8s::watch::{Lists, Reporter, Translate, WatchHealth, relist};

/// Where the cluster DNS lives.
pub const NS: &str = "kube-system";

/// The field manager of our writes.
pub const MANAGER: &str = "clusterset-dns-setup-dns";

/// The ConfigMaps `plan` may write into (RKE2's is only read: Helm owns it).
pub const WRITABLE: [&str; 4] = ["coredns", "coredns-custom", "kube-dns", "node-local-dns"];

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
    /// Per ConfigMap read: a reference for Events about it.
    pub references: BTreeMap<String, ObjectReference>,
    /// Per ConfigMap read: the field manager of its latest write that was
    /// not ours, from `managedFields` (absent when every write was ours or
    /// the server keeps none).
    pub last_writer: BTreeMap<String, String>,
    /// DaemonSet `kube-system/node-local-dns` exists (NodeLocal DNSCache).
    pub nodelocal_daemonset: bool,
}

/// The manager of `cm`'s most recent write that was not ours.
fn other_writer(cm: &ConfigMap) -> Option<String> {
    cm.metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|m| m.manager.as_deref().is_some_and(|n| n != MANAGER))
        .max_by_key(|m| m.time.as_ref().map(|t| t.0))
        .and_then(|m| m.manager.clone())
}

/// A reference to ConfigMap `kube-system/<name>` (with its uid, so
/// `kubectl describe` lists the Events).
pub fn reference(name: &str, uid: Option<String>) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("ConfigMap".into()),
        namespace: Some(NS.into()),
        name: Some(name.into()),
        uid,
        ..Default::default()
    }
}

/// Reads every object `plan` looks at.
pub async fn read(client: &kube::Client) -> Result<Read, SetupError> {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    let mut versions = BTreeMap::new();
    let mut references = BTreeMap::new();
    let mut last_writer = BTreeMap::new();
    let mut get = async |name: &str| -> Result<Option<ConfigMap>, SetupError> {
        let cm = cms.get_opt(name).await.map_err(api_err(format!("ConfigMap {NS}/{name}")))?;
        if let Some(c) = &cm {
            if let Some(v) = c.metadata.resource_version.clone() {
                versions.insert(name.to_owned(), v);
            }
            references.insert(name.to_owned(), reference(name, c.metadata.uid.clone()));
            if let Some(w) = other_writer(c) {
                last_writer.insert(name.to_owned(), w);
            }
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
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), NS);
    let nodelocal_daemonset = daemonsets
        .get_opt("node-local-dns")
        .await
        .map_err(api_err(format!("DaemonSet {NS}/node-local-dns")))?
        .is_some();
    Ok(Read { observed, versions, references, last_writer, nodelocal_daemonset })
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
            let params = PostParams { field_manager: Some(MANAGER.into()), ..Default::default() };
            cms.create(&params, &cm).await.map_err(api_err(format!("ConfigMap {NS}/{name}")))?;
        }
        Edit::ConfigMapKey { name, key, value, create: false } => {
            let cms: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
            // A merge patch: only our key changes (null deletes it); the
            // resourceVersion makes it fail if anything changed since read.
            let patch = json!({
                "metadata": {"resourceVersion": read.versions.get(*name)},
                "data": { *key: value },
            });
            let params = PatchParams { field_manager: Some(MANAGER.into()), ..Default::default() };
            cms.patch(name, &params, &Patch::Merge(&patch))
                .await
                .map_err(api_err(format!("ConfigMap {NS}/{name}")))?;
        }
        Edit::OpenShiftServers(servers) => {
            let dns: Api<DynamicObject> = Api::all_with(client.clone(), &openshift_dns());
            let patch = json!({"spec": {"servers": servers}});
            let params = PatchParams { field_manager: Some(MANAGER.into()), ..Default::default() };
            dns.patch("default", &params, &Patch::Merge(&patch))
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

/// A change of a watched ConfigMap: its name.
struct Changed(String);

impl Translate<ConfigMap> for Changed {
    type Item = ();
    type Message = String;
    fn item(&self, _: &ConfigMap) -> Option<()> {
        Some(())
    }
    fn listed(&self, _: Vec<()>, _: Instant) -> String {
        self.0.clone()
    }
    fn applied(&self, _: &ConfigMap) -> Option<String> {
        Some(self.0.clone())
    }
    fn deleted(&self, _: &ConfigMap) -> Option<String> {
        Some(self.0.clone())
    }
}

/// Sends the name of every [`WRITABLE`] ConfigMap on each of its changes
/// (and on each complete list, after a watch error too: something may
/// have changed unseen), until `out`'s receiver is gone. One watch per
/// name, selected by `metadata.name`, so the RBAC can name them.
pub async fn follow(client: &kube::Client, out: mpsc::Sender<String>) {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    let lists = Lists::default();
    let watches = WRITABLE.iter().map(|name| {
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let health = std::sync::Arc::new(WatchHealth::new(format!("ConfigMap {NS}/{name}")));
        relist(cms.clone(), config, &lists, Reporter::new(health), Changed((*name).to_owned()), out.clone())
    });
    futures::future::join_all(watches).await;
}
