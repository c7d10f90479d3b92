//! Enrolling a member on the hub (`clusterset-dns hub enrol NAME`): the
//! hub's shared objects (`deploy/hub/`: the ExportRecord CRD, the reader
//! and member roles), the member's namespace, its hub identity (a
//! ServiceAccount in `clusterset-hub`) bound to write that namespace only
//! and read the others, and a kubeconfig of that identity for its agent.
//! Applied with server-side apply: enrolling again changes nothing but
//! the token.

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use super::record;

/// The CRD, as `deploy/hub/exportrecords.yaml` has it.
const CRD: &str = include_str!("../../deploy/hub/exportrecords.yaml");
/// The hub's namespace and roles, as `deploy/hub/rbac.yaml` has them.
const RBAC: &str = include_str!("../../deploy/hub/rbac.yaml");
/// The namespace of the members' hub identities.
pub const IDENTITIES: &str = "clusterset-hub";
/// The field manager of enrolment.
const MANAGER: &str = "clusterset-dns-hub-enrol";

/// Why an enrolment failed.
#[derive(Debug, thiserror::Error)]
pub enum EnrolError {
    /// A write to the hub failed.
    #[error("{what}: {source}")]
    Hub {
        /// What was written.
        what: String,
        /// The API server's answer.
        source: kube::Error,
    },
    /// The embedded manifests do not parse (a build defect).
    #[error("deploy/hub: {0}")]
    Manifest(String),
}

/// A member's hub identity: its ServiceAccount's name.
pub fn identity(member: &str) -> String {
    format!("member-{member}")
}

/// Applies the hub's shared objects and member `member`'s, and returns a
/// token of the member's identity, valid for `seconds` (the hub may cap
/// it: the token says until when).
pub async fn enrol(hub: &kube::Client, member: &str, seconds: i64) -> Result<String, EnrolError> {
    let pp = PatchParams::apply(MANAGER).force();
    let fail = |what: &str| {
        let what = what.to_owned();
        move |source| EnrolError::Hub { what, source }
    };
    let crd: CustomResourceDefinition =
        serde_yaml_ng::from_str(CRD).map_err(|e| EnrolError::Manifest(format!("exportrecords.yaml: {e}")))?;
    let crds: Api<CustomResourceDefinition> = Api::all(hub.clone());
    crds.patch(crd.metadata.name.as_deref().unwrap_or_default(), &pp, &Patch::Apply(&crd))
        .await
        .map_err(fail("the ExportRecord CRD"))?;
    for doc in serde_yaml_ng::Deserializer::from_str(RBAC) {
        let v: serde_json::Value = serde::Deserialize::deserialize(doc)
            .map_err(|e| EnrolError::Manifest(format!("rbac.yaml: {e}")))?;
        let name = v["metadata"]["name"].as_str().unwrap_or_default().to_owned();
        match v["kind"].as_str() {
            Some("Namespace") => {
                let api: Api<Namespace> = Api::all(hub.clone());
                api.patch(&name, &pp, &Patch::Apply(&v)).await.map_err(fail(&format!("Namespace {name}")))?;
            }
            Some("ClusterRole") => {
                let api: Api<ClusterRole> = Api::all(hub.clone());
                api.patch(&name, &pp, &Patch::Apply(&v))
                    .await
                    .map_err(fail(&format!("ClusterRole {name}")))?;
            }
            other => return Err(EnrolError::Manifest(format!("rbac.yaml: unexpected kind {other:?}"))),
        }
    }
    let ns = record::namespace_of(member);
    let sa = identity(member);
    let labels = json!({"app.kubernetes.io/name": "clusterset-dns", "app.kubernetes.io/component": "hub",
                        "hub.clusterset-dns.io/member": member});
    let namespaces: Api<Namespace> = Api::all(hub.clone());
    let body = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": labels}});
    namespaces.patch(&ns, &pp, &Patch::Apply(&body)).await.map_err(fail(&format!("Namespace {ns}")))?;
    let accounts: Api<ServiceAccount> = Api::namespaced(hub.clone(), IDENTITIES);
    let body = json!({"apiVersion": "v1", "kind": "ServiceAccount",
                      "metadata": {"name": sa, "namespace": IDENTITIES, "labels": labels}});
    accounts
        .patch(&sa, &pp, &Patch::Apply(&body))
        .await
        .map_err(fail(&format!("ServiceAccount {IDENTITIES}/{sa}")))?;
    let subject = json!([{"kind": "ServiceAccount", "name": sa, "namespace": IDENTITIES}]);
    let bindings: Api<RoleBinding> = Api::namespaced(hub.clone(), &ns);
    let body = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                      "metadata": {"name": "clusterset-dns-hub-member", "namespace": ns, "labels": labels},
                      "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "clusterset-dns-hub-member"},
                      "subjects": subject});
    bindings
        .patch("clusterset-dns-hub-member", &pp, &Patch::Apply(&body))
        .await
        .map_err(fail(&format!("RoleBinding {ns}/clusterset-dns-hub-member")))?;
    let reader = format!("clusterset-dns-hub-reader-{member}");
    let cluster_bindings: Api<ClusterRoleBinding> = Api::all(hub.clone());
    let body = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                      "metadata": {"name": reader, "labels": labels},
                      "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "clusterset-dns-hub-reader"},
                      "subjects": subject});
    cluster_bindings
        .patch(&reader, &pp, &Patch::Apply(&body))
        .await
        .map_err(fail(&format!("ClusterRoleBinding {reader}")))?;
    let request = TokenRequest {
        spec: TokenRequestSpec { expiration_seconds: Some(seconds), ..TokenRequestSpec::default() },
        ..TokenRequest::default()
    };
    let token = accounts
        .create_token_request(&sa, &PostParams::default(), &request)
        .await
        .map_err(fail(&format!("a token of ServiceAccount {IDENTITIES}/{sa}")))?;
    Ok(token.status.map(|s| s.token).unwrap_or_default())
}
