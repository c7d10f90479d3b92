//! The Multi-Cluster Services API as the API server offers it: the
//! `multicluster.x-k8s.io` group and its versions, the labels KEP-1645 puts
//! on MCS EndpointSlices, KEP-2149's ClusterProperty, and discovery of the
//! version a cluster serves.
//!
//! ServiceImport and ServiceExport are reached as dynamic objects of the
//! discovered version (see [`super::crd`] for why), so every version we read
//! goes through the same code.

use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use tracing::info;

use super::watch::{Reporter, WATCH_BACKOFF};

/// API group of ServiceImport and ServiceExport.
pub const MCS_GROUP: &str = "multicluster.x-k8s.io";
/// Versions of that group we read.
pub const MCS_VERSIONS: [&str; 2] = ["v1beta1", "v1alpha1"];
/// An MCS kind (`ServiceImport`, `ServiceExport`) at `version`, for
/// dynamic API access.
pub fn mcs_resource(version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(MCS_GROUP, version, kind), plural)
}

/// Label on MCS EndpointSlices naming their ServiceImport.
pub const LABEL_SERVICE_NAME: &str = "multicluster.kubernetes.io/service-name";
/// Label on MCS EndpointSlices naming the cluster the endpoints run in.
pub const LABEL_SOURCE_CLUSTER: &str = "multicluster.kubernetes.io/source-cluster";
/// Kubernetes' label naming an EndpointSlice's Service (a Service's own
/// slices, and the VIP Service on the slices sync writes).
pub const LABEL_K8S_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// Kubernetes' label naming the controller that manages an EndpointSlice.
pub const LABEL_MANAGED_BY: &str = "endpointslice.kubernetes.io/managed-by";
/// Kubernetes' annotation on an EndpointSlice: when the change it carries
/// was triggered (RFC 3339, written by kube-controller-manager's
/// EndpointSlice controller; `sync` carries it onto the MCS slices it
/// writes, `serve` measures from it).
pub const ANNOTATION_TRIGGER_TIME: &str = "endpoints.kubernetes.io/last-change-trigger-time";

/// Finds the newest served version of an MCS kind (`plural`), retrying (and
/// reporting) until its CRD is installed.
pub async fn discover_mcs(client: &Client, kind: &str, plural: &str, reporter: &mut Reporter) -> ApiResource {
    // The watches' backoff: API discovery is the first step of a watch.
    let mut backoff = WATCH_BACKOFF;
    loop {
        match find_mcs(client, kind, plural).await {
            Ok(found) => {
                info!(api_version = %found.api_version, watch = %reporter.name(), "watching {kind}s");
                reporter.ok();
                return found;
            }
            Err(e) => reporter.failed(&e),
        }
        tokio::time::sleep(backoff.next_wait()).await;
    }
}

/// The newest served version of an MCS kind (`plural`), asked once; the
/// error says what each version answered (not served, or the request's
/// error: a discovery document that does not parse is one).
pub async fn find_mcs(client: &Client, kind: &str, plural: &str) -> Result<ApiResource, String> {
    let mut last_error = String::new();
    for version in MCS_VERSIONS {
        let api_version = format!("{MCS_GROUP}/{version}");
        match client.list_api_group_resources(&api_version).await {
            Ok(list) if list.resources.iter().any(|r| r.name == plural) => {
                return Ok(mcs_resource(version, kind, plural));
            }
            Ok(_) => last_error = format!("{api_version} has no {plural}"),
            Err(e) => last_error = format!("{api_version}: {e}"),
        }
    }
    Err(format!("{kind} API not found (is the CRD installed?): {last_error}"))
}

/// The ClusterProperty naming a cluster (KEP-2149).
pub const CLUSTER_ID_PROPERTY: &str = "cluster.clusterset.k8s.io";

/// KEP-2149's ClusterProperty (`about.k8s.io/v1alpha1`, cluster-scoped).
pub fn cluster_property_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("about.k8s.io", "v1alpha1", "ClusterProperty"),
        "clusterproperties",
    )
}

/// The value of the cluster's `cluster.clusterset.k8s.io` ClusterProperty;
/// `None` when it has none (or the API has no ClusterProperty at all).
pub async fn cluster_property(client: &Client) -> Result<Option<String>, kube::Error> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &cluster_property_resource());
    match api.get_opt(CLUSTER_ID_PROPERTY).await {
        Ok(obj) => Ok(obj.and_then(|o| o.data.pointer("/spec/value")?.as_str().map(str::to_owned))),
        // No ClusterProperty CRD: the API answers 404 for the whole resource.
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        Err(e) => Err(e),
    }
}
