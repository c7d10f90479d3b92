//! Enrolling a member on the hub (`clusterset-dns hub enrol NAME`): the
//! hub's shared objects (`deploy/hub/`: the ExportRecord CRD, the reader
//! and member roles), the member's namespace, its hub identity (a
//! ServiceAccount in `clusterset-hub`) bound to write that namespace only
//! and read the others, and a kubeconfig of that identity for its agent.
//! Also the read-only identity of a centralized `serve --hub-kubeconfig`
//! (`clusterset-dns hub reader`, `deploy/hub/serve.yaml`). Applied with
//! server-side apply: enrolling again changes nothing but the token.

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
/// A centralized serve's identity, as `deploy/hub/serve.yaml` has it.
const SERVE: &str = include_str!("../../deploy/hub/serve.yaml");
/// That identity's ServiceAccount, in [`IDENTITIES`].
pub const READER: &str = "clusterset-dns-serve";
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
    shared(hub).await?;
    let accounts: Api<ServiceAccount> = Api::namespaced(hub.clone(), IDENTITIES);
    let ns = record::namespace_of(member);
    let sa = identity(member);
    let labels = json!({"app.kubernetes.io/name": "clusterset-dns", "app.kubernetes.io/component": "hub",
                        "hub.clusterset-dns.io/member": member});
    let namespaces: Api<Namespace> = Api::all(hub.clone());
    let body = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": labels}});
    namespaces.patch(&ns, &pp, &Patch::Apply(&body)).await.map_err(fail(&format!("Namespace {ns}")))?;
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
    token(hub, &sa, seconds).await
}

/// Applies the hub's shared objects and the read-only identity of a
/// centralized serve ([`READER`]), and returns a token of it valid for
/// `seconds` (the hub may cap it).
pub async fn reader(hub: &kube::Client, seconds: i64) -> Result<String, EnrolError> {
    shared(hub).await?;
    apply(hub, SERVE, "serve.yaml").await?;
    token(hub, READER, seconds).await
}

/// The ExportRecord CRD, the hub's namespace and its roles.
async fn shared(hub: &kube::Client) -> Result<(), EnrolError> {
    let pp = PatchParams::apply(MANAGER).force();
    let crd: CustomResourceDefinition =
        serde_yaml_ng::from_str(CRD).map_err(|e| EnrolError::Manifest(format!("exportrecords.yaml: {e}")))?;
    let crds: Api<CustomResourceDefinition> = Api::all(hub.clone());
    crds.patch(crd.metadata.name.as_deref().unwrap_or_default(), &pp, &Patch::Apply(&crd))
        .await
        .map_err(|source| EnrolError::Hub { what: "the ExportRecord CRD".into(), source })?;
    apply(hub, RBAC, "rbac.yaml").await
}

/// Applies every object of manifest `text` (`file`, for messages).
async fn apply(hub: &kube::Client, text: &str, file: &str) -> Result<(), EnrolError> {
    let pp = PatchParams::apply(MANAGER).force();
    for doc in serde_yaml_ng::Deserializer::from_str(text) {
        let v: serde_json::Value =
            serde::Deserialize::deserialize(doc).map_err(|e| EnrolError::Manifest(format!("{file}: {e}")))?;
        let name = v["metadata"]["name"].as_str().unwrap_or_default().to_owned();
        let kind = v["kind"].as_str().unwrap_or_default().to_owned();
        let fail = |source| EnrolError::Hub { what: format!("{kind} {name}"), source };
        match kind.as_str() {
            "Namespace" => {
                Api::<Namespace>::all(hub.clone()).patch(&name, &pp, &Patch::Apply(&v)).await.map(drop)
            }
            "ClusterRole" => {
                Api::<ClusterRole>::all(hub.clone()).patch(&name, &pp, &Patch::Apply(&v)).await.map(drop)
            }
            "ClusterRoleBinding" => Api::<ClusterRoleBinding>::all(hub.clone())
                .patch(&name, &pp, &Patch::Apply(&v))
                .await
                .map(drop),
            "ServiceAccount" => Api::<ServiceAccount>::namespaced(hub.clone(), IDENTITIES)
                .patch(&name, &pp, &Patch::Apply(&v))
                .await
                .map(drop),
            other => return Err(EnrolError::Manifest(format!("{file}: unexpected kind {other:?}"))),
        }
        .map_err(fail)?;
    }
    Ok(())
}

/// A token of ServiceAccount `account` in [`IDENTITIES`], valid for `seconds`.
async fn token(hub: &kube::Client, account: &str, seconds: i64) -> Result<String, EnrolError> {
    let accounts: Api<ServiceAccount> = Api::namespaced(hub.clone(), IDENTITIES);
    let request = TokenRequest {
        spec: TokenRequestSpec { expiration_seconds: Some(seconds), ..TokenRequestSpec::default() },
        ..TokenRequest::default()
    };
    let token =
        accounts.create_token_request(account, &PostParams::default(), &request).await.map_err(|source| {
            EnrolError::Hub { what: format!("a token of ServiceAccount {IDENTITIES}/{account}"), source }
        })?;
    Ok(token.status.map(|s| s.token).unwrap_or_default())
}
