//! The cluster inventory (sigs.k8s.io/cluster-inventory-api, KEP-4322):
//! the ClusterProfile objects a fleet manager (Open Cluster Management,
//! Azure Fleet, Karmada, Clusternet) keeps in a hub cluster, one per member,
//! and the access providers of KEP-5339 that say how to reach each one.
//!
//! Read against upstream commit 8375ac21498c5d46948b9e0bd19d4bbb8cc2b219
//! (`apis/v1alpha1/clusterprofile_types.go`, `pkg/access/config.go`). A
//! profile lists providers in `status.accessProviders` (and the deprecated
//! `status.credentialProviders`), each a name and a clientcmd v1 `Cluster`
//! (server, CA data, ...); the consumer's provider file (`{"providers":
//! [{"name", "execConfig", ...}]}`) maps a provider name to the exec plugin
//! that returns an ExecCredential for it. The first provider of the file
//! that the profile offers is used, as upstream's `BuildConfigFromCP` does.
//!
//! [`access`] is pure: a profile's status and the provider file in, an
//! in-memory kubeconfig (that cluster, that exec plugin) out, which
//! [`super::client`] turns into a client exactly as it does a kubeconfig
//! file; kube runs the plugin.

use std::collections::{BTreeMap, HashMap};

use kube::api::{ApiResource, GroupVersionKind};
use kube::config::{
    AuthInfo, Cluster, ExecConfig, ExecInteractiveMode, Kubeconfig, NamedAuthInfo, NamedCluster,
    NamedContext, NamedExtension,
};
use serde::Deserialize;

use crate::model::ClusterId;

/// The ClusterProfile API group (shared with MCS).
pub const GROUP: &str = "multicluster.x-k8s.io";
/// Its version.
pub const VERSION: &str = "v1alpha1";
/// The label of a namespace holding one ClusterSet's profiles
/// (`LabelClusterSetKey`); its value is the ClusterSet's name.
pub const CLUSTERSET_LABEL: &str = "multicluster.x-k8s.io/clusterset";
/// The condition a fleet manager sets False when a member's control plane
/// is not healthy (`ClusterConditionControlPlaneHealthy`).
pub const CONTROL_PLANE_HEALTHY: &str = "ControlPlaneHealthy";
/// KEP-5339's extension of a profile's cluster: more arguments for the exec
/// plugin, used only when the provider's policy allows it.
const ARGS_EXTENSION: &str = "clusterprofiles.multicluster.x-k8s.io/exec/additional-args";
/// The same for environment variables.
const ENVS_EXTENSION: &str = "clusterprofiles.multicluster.x-k8s.io/exec/additional-envs";

/// The ClusterProfile resource, for dynamic reads: one malformed profile is
/// then skipped by name instead of failing its watch's list.
pub fn profile_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(GROUP, VERSION, "ClusterProfile"),
        "clusterprofiles",
    )
}

/// Why the provider file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ProvidersError {
    /// Not the JSON of KEP-5339's provider file.
    #[error("{path}: {message}")]
    Parse {
        /// Where in the document.
        path: String,
        /// What is wrong there.
        message: String,
    },
    /// A provider cannot run a plugin.
    #[error("provider {name:?}: {problem}")]
    Provider {
        /// The provider.
        name: String,
        /// What is missing or wrong.
        problem: String,
    },
}

/// The consumer's access providers (KEP-5339's provider file): which exec
/// plugin gives credentials for which provider name, in order of
/// preference.
#[derive(Debug, Clone)]
pub struct Providers(Vec<Provider>);

/// One provider of the file.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Provider {
    name: String,
    exec_config: Option<ExecConfig>,
    #[serde(default, rename = "profileSourcedCLIArgsPolicy")]
    args_policy: String,
    #[serde(default, rename = "profileSourcedEnvVarsPolicy")]
    envs_policy: String,
}

#[derive(Deserialize)]
struct ProvidersFile {
    providers: Vec<Provider>,
}

impl Providers {
    /// Reads the file's text (JSON, as upstream's `NewFromFile`). Every
    /// provider must name an exec plugin, with its `apiVersion`, and known
    /// policies: a mistake here fails at start, not at the first profile.
    pub fn parse(text: &str) -> Result<Self, ProvidersError> {
        let file: ProvidersFile =
            serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_str(text)).map_err(|e| {
                ProvidersError::Parse { path: e.path().to_string(), message: e.inner().to_string() }
            })?;
        for p in &file.providers {
            let bad =
                |problem: &str| ProvidersError::Provider { name: p.name.clone(), problem: problem.into() };
            let exec = p.exec_config.as_ref().ok_or_else(|| bad("no execConfig"))?;
            if exec.command.as_deref().is_none_or(str::is_empty) {
                return Err(bad("execConfig has no command"));
            }
            if exec.api_version.as_deref().is_none_or(str::is_empty) {
                return Err(bad("execConfig has no apiVersion (client.authentication.k8s.io/v1)"));
            }
            if !matches!(p.args_policy.as_str(), "" | "Ignore" | "Append") {
                return Err(bad(&format!(
                    "profileSourcedCLIArgsPolicy {:?} is not Append or Ignore",
                    p.args_policy
                )));
            }
            if !matches!(p.envs_policy.as_str(), "" | "Ignore" | "AppendIfNotExists" | "Replace") {
                return Err(bad(&format!(
                    "profileSourcedEnvVarsPolicy {:?} is not AppendIfNotExists, Replace or Ignore",
                    p.envs_policy
                )));
            }
        }
        Ok(Self(file.providers))
    }

    /// The provider names, in order of preference.
    pub fn names(&self) -> Vec<&str> {
        self.0.iter().map(|p| p.name.as_str()).collect()
    }
}

/// The part of a ClusterProfile's status read here.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProfileStatus {
    #[serde(default)]
    conditions: Option<Vec<Condition>>,
    #[serde(default)]
    credential_providers: Option<Vec<AccessProvider>>,
    #[serde(default)]
    access_providers: Option<Vec<AccessProvider>>,
}

#[derive(Debug, Clone, Deserialize)]
struct Condition {
    #[serde(rename = "type")]
    type_: String,
    status: String,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    message: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
struct AccessProvider {
    name: String,
    #[serde(default)]
    cluster: Option<Cluster>,
}

/// Why a profile gives no member; the profile is skipped, the others are not.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProfileError {
    /// Its name cannot be a cluster id (the member's name is the profile's).
    #[error("its name is not a cluster id: {0}")]
    Name(String),
    /// Its status could not be read.
    #[error("status: {0}")]
    Status(String),
    /// It offers none of the providers of the provider file.
    #[error("it offers no provider of the provider file ({wanted}); it offers: {offered}")]
    NoProvider {
        /// The file's providers.
        wanted: String,
        /// The profile's.
        offered: String,
    },
    /// The chosen provider's cluster has no server.
    #[error("provider {0:?} gives no cluster server")]
    NoServer(String),
    /// A KEP-5339 extension of the cluster is not what its policy reads.
    #[error("provider {provider:?}: extension {extension}: {problem}")]
    Extension {
        /// The provider.
        provider: String,
        /// The extension.
        extension: &'static str,
        /// What is wrong.
        problem: String,
    },
}

/// What the fleet manager says of a member's control plane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    /// `ControlPlaneHealthy` True, Unknown or absent: nothing to add to our
    /// own probes of its API.
    NotUnhealthy,
    /// `ControlPlaneHealthy` False, with the condition's reason and message.
    Unhealthy(String),
}

/// How to reach a profile's member.
#[derive(Debug, Clone)]
pub struct Access {
    /// The provider used.
    pub provider: String,
    /// One cluster, one user (the exec plugin), one context: the profile's.
    pub kubeconfig: Kubeconfig,
    /// The fleet manager's word on its control plane.
    pub health: Health,
}

/// A profile's member access: the first provider of `providers` the profile
/// offers (`accessProviders` before the deprecated `credentialProviders`
/// of the same name, as upstream), its cluster, and its exec plugin with
/// the profile's extra arguments and variables where the provider allows
/// them. Fields of the profile's cluster that would make this process read
/// its own files (`certificate-authority`) or skip TLS verification
/// (`insecure-skip-tls-verify`) are not taken: a profile is written by
/// whoever may write in the hub, and upstream's consumer ignores them too.
pub fn access(name: &str, status: &ProfileStatus, providers: &Providers) -> Result<Access, ProfileError> {
    ClusterId::parse(name).map_err(|e| ProfileError::Name(e.to_string()))?;
    let mut offered: BTreeMap<&str, &AccessProvider> = BTreeMap::new();
    for p in status.credential_providers.iter().flatten().chain(status.access_providers.iter().flatten()) {
        offered.insert(&p.name, p);
    }
    let Some((provider, offer)) = providers.0.iter().find_map(|p| Some((p, *offered.get(p.name.as_str())?)))
    else {
        return Err(ProfileError::NoProvider {
            wanted: providers.names().join(", "),
            offered: if offered.is_empty() {
                "none".into()
            } else {
                offered.keys().copied().collect::<Vec<_>>().join(", ")
            },
        });
    };
    let given = offer.cluster.clone().unwrap_or_default();
    if given.server.as_deref().is_none_or(str::is_empty) {
        return Err(ProfileError::NoServer(provider.name.clone()));
    }
    let cluster = Cluster {
        server: given.server.clone(),
        certificate_authority_data: given.certificate_authority_data.clone(),
        tls_server_name: given.tls_server_name.clone(),
        proxy_url: given.proxy_url.clone(),
        disable_compression: given.disable_compression,
        // Kept whole: kube hands `client.authentication.k8s.io/exec` to a
        // plugin with provideClusterInfo, as client-go does.
        extensions: given.extensions.clone(),
        ..Cluster::default()
    };
    let exec = exec_for(provider, given.extensions.as_deref().unwrap_or_default())?;
    Ok(Access {
        provider: provider.name.clone(),
        kubeconfig: kubeconfig(name, cluster, exec),
        health: health(status),
    })
}

/// The provider's plugin with the profile's extensions applied per its
/// policies (upstream `processClusterProfileSourced*`), never interactive.
fn exec_for(provider: &Provider, extensions: &[NamedExtension]) -> Result<ExecConfig, ProfileError> {
    // Parse checked it is there.
    let mut exec = provider.exec_config.clone().unwrap_or_default();
    exec.interactive_mode = Some(ExecInteractiveMode::Never);
    let bad = |extension, problem: String| ProfileError::Extension {
        provider: provider.name.clone(),
        extension,
        problem,
    };
    for ext in extensions {
        if ext.name == ARGS_EXTENSION && provider.args_policy == "Append" {
            let args: Vec<String> = serde_json::from_value(ext.extension.clone())
                .map_err(|e| bad(ARGS_EXTENSION, e.to_string()))?;
            exec.args.get_or_insert_with(Vec::new).extend(args);
        }
        if ext.name == ENVS_EXTENSION
            && matches!(provider.envs_policy.as_str(), "AppendIfNotExists" | "Replace")
        {
            let extra: BTreeMap<String, String> = serde_json::from_value(ext.extension.clone())
                .map_err(|e| bad(ENVS_EXTENSION, e.to_string()))?;
            exec.env = Some(merge_env(
                exec.env.take().unwrap_or_default(),
                extra,
                provider.envs_policy == "Replace",
            ));
        }
    }
    Ok(exec)
}

/// The plugin's variables and the profile's: on a name both give, the
/// provider file's value wins unless `profile_wins` (policy `Replace`).
fn merge_env(
    own: Vec<HashMap<String, String>>,
    mut merged: BTreeMap<String, String>,
    profile_wins: bool,
) -> Vec<HashMap<String, String>> {
    for var in own {
        if let (Some(name), Some(value)) = (var.get("name"), var.get("value"))
            && (!profile_wins || !merged.contains_key(name))
        {
            merged.insert(name.clone(), value.clone());
        }
    }
    merged
        .into_iter()
        .map(|(name, value)| HashMap::from([("name".to_owned(), name), ("value".to_owned(), value)]))
        .collect()
}

fn kubeconfig(name: &str, cluster: Cluster, exec: ExecConfig) -> Kubeconfig {
    Kubeconfig {
        clusters: vec![NamedCluster { name: name.into(), cluster: Some(cluster), ..NamedCluster::default() }],
        auth_infos: vec![NamedAuthInfo {
            name: name.into(),
            auth_info: Some(AuthInfo { exec: Some(exec), ..AuthInfo::default() }),
            ..NamedAuthInfo::default()
        }],
        contexts: vec![NamedContext {
            name: name.into(),
            context: Some(kube::config::Context {
                cluster: name.into(),
                user: Some(name.into()),
                ..kube::config::Context::default()
            }),
            ..NamedContext::default()
        }],
        current_context: Some(name.into()),
        ..Kubeconfig::default()
    }
}

fn health(status: &ProfileStatus) -> Health {
    let condition = status.conditions.iter().flatten().find(|c| c.type_ == CONTROL_PLANE_HEALTHY);
    match condition {
        Some(c) if c.status == "False" => Health::Unhealthy(format!(
            "ClusterProfile condition {CONTROL_PLANE_HEALTHY}=False ({}): {}",
            c.reason.as_deref().unwrap_or(""),
            c.message.as_deref().unwrap_or("")
        )),
        _ => Health::NotUnhealthy,
    }
}

/// A profile's status from its dynamic object (`status` absent: empty).
pub fn status_of(object: &kube::api::DynamicObject) -> Result<ProfileStatus, ProfileError> {
    match object.data.get("status") {
        None | Some(serde_json::Value::Null) => Ok(ProfileStatus::default()),
        Some(s) => serde_path_to_error::deserialize(s)
            .map_err(|e| ProfileError::Status(format!("{}: {}", e.path(), e.inner()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn providers(v: serde_json::Value) -> Providers {
        Providers::parse(&v.to_string()).expect("providers")
    }

    fn token_provider() -> Providers {
        providers(json!({"providers": [
            {"name": "token", "execConfig": {"apiVersion": "client.authentication.k8s.io/v1",
             "command": "/bin/token", "args": ["--for"], "env": null},
             "profileSourcedCLIArgsPolicy": "Append"},
        ]}))
    }

    fn status(v: serde_json::Value) -> ProfileStatus {
        serde_json::from_value(v).expect("status")
    }

    fn cluster_of(a: &Access) -> &Cluster {
        a.kubeconfig.clusters[0].cluster.as_ref().expect("cluster")
    }

    fn exec_of(a: &Access) -> &ExecConfig {
        a.kubeconfig.auth_infos[0].auth_info.as_ref().and_then(|u| u.exec.as_ref()).expect("exec")
    }

    #[test]
    fn a_profile_becomes_its_cluster_and_the_providers_exec_plugin() {
        let s = status(json!({"accessProviders": [{"name": "token", "cluster": {
            "server": "https://10.0.0.1:6443", "certificate-authority-data": "Q0E=",
            "tls-server-name": "api.c1", "proxy-url": "http://proxy:3128",
            "certificate-authority": "/etc/hub/ca.crt", "insecure-skip-tls-verify": true,
            "extensions": [{"name": ARGS_EXTENSION, "extension": ["cluster-1"]}]}}]}));
        let a = access("cluster-1", &s, &token_provider()).expect("access");
        assert_eq!(a.provider, "token");
        let c = cluster_of(&a);
        assert_eq!(c.server.as_deref(), Some("https://10.0.0.1:6443"));
        assert_eq!(c.certificate_authority_data.as_deref(), Some("Q0E="));
        assert_eq!(c.tls_server_name.as_deref(), Some("api.c1"));
        assert_eq!(c.proxy_url.as_deref(), Some("http://proxy:3128"));
        assert_eq!((c.certificate_authority.as_deref(), c.insecure_skip_tls_verify), (None, None));
        let e = exec_of(&a);
        assert_eq!(e.command.as_deref(), Some("/bin/token"));
        assert_eq!(e.args, Some(vec!["--for".to_owned(), "cluster-1".to_owned()]));
        assert!(matches!(e.interactive_mode, Some(ExecInteractiveMode::Never)));
        assert_eq!(a.kubeconfig.current_context.as_deref(), Some("cluster-1"));
        assert_eq!(a.health, Health::NotUnhealthy);
    }

    #[test]
    fn profile_arguments_are_ignored_unless_the_provider_appends_them() {
        let p = providers(json!({"providers": [{"name": "token", "execConfig":
            {"apiVersion": "client.authentication.k8s.io/v1", "command": "/bin/token"}}]}));
        let s = status(json!({"accessProviders": [{"name": "token", "cluster": {"server": "https://a",
            "extensions": [{"name": ARGS_EXTENSION, "extension": ["--evil"]}]}}]}));
        assert_eq!(exec_of(&access("a", &s, &p).expect("access")).args, None);
    }

    #[test]
    fn profile_variables_follow_the_providers_policy() {
        let p = |policy: &str| {
            providers(
                json!({"providers": [{"name": "t", "profileSourcedEnvVarsPolicy": policy, "execConfig": {
                "apiVersion": "client.authentication.k8s.io/v1", "command": "/bin/t",
                "env": [{"name": "A", "value": "file"}]}}]}),
            )
        };
        let s = status(json!({"accessProviders": [{"name": "t", "cluster": {"server": "https://a",
            "extensions": [{"name": ENVS_EXTENSION, "extension": {"A": "profile", "B": "profile"}}]}}]}));
        let env = |policy: &str| {
            let a = access("a", &s, &p(policy)).expect("access");
            let mut v: Vec<String> =
                exec_of(&a).env.iter().flatten().map(|e| format!("{}={}", e["name"], e["value"])).collect();
            v.sort();
            v
        };
        assert_eq!(env("AppendIfNotExists"), ["A=file", "B=profile"]);
        assert_eq!(env("Replace"), ["A=profile", "B=profile"]);
        assert_eq!(env("Ignore"), ["A=file"]);
    }

    #[test]
    fn the_provider_files_order_chooses_and_access_providers_win_over_deprecated_ones() {
        let p = providers(json!({"providers": [
            {"name": "second", "execConfig": {"apiVersion": "v", "command": "/bin/second"}},
            {"name": "first", "execConfig": {"apiVersion": "v", "command": "/bin/first"}},
        ]}));
        let s = status(json!({
            "credentialProviders": [{"name": "second", "cluster": {"server": "https://old"}}],
            "accessProviders": [{"name": "first", "cluster": {"server": "https://f"}},
                                {"name": "second", "cluster": {"server": "https://new"}}]}));
        let a = access("a", &s, &p).expect("access");
        assert_eq!(a.provider, "second");
        assert_eq!(cluster_of(&a).server.as_deref(), Some("https://new"));
        // The deprecated field alone still works.
        let old =
            status(json!({"credentialProviders": [{"name": "first", "cluster": {"server": "https://o"}}]}));
        assert_eq!(cluster_of(&access("a", &old, &p).expect("access")).server.as_deref(), Some("https://o"));
    }

    #[test]
    fn a_profile_without_a_usable_provider_says_why() {
        let p = token_provider();
        let none = access("a", &status(json!({})), &p).expect_err("no providers");
        assert_eq!(none.to_string(), "it offers no provider of the provider file (token); it offers: none");
        let other =
            status(json!({"accessProviders": [{"name": "oidc", "cluster": {"server": "https://a"}}]}));
        assert!(matches!(access("a", &other, &p), Err(ProfileError::NoProvider { .. })));
        let serverless = status(json!({"accessProviders": [{"name": "token", "cluster": {}}]}));
        assert_eq!(
            access("a", &serverless, &p).expect_err("no server"),
            ProfileError::NoServer("token".into())
        );
        let named =
            status(json!({"accessProviders": [{"name": "token", "cluster": {"server": "https://a"}}]}));
        assert!(matches!(access("Not_A_Cluster", &named, &p), Err(ProfileError::Name(_))));
        let bad_args =
            status(json!({"accessProviders": [{"name": "token", "cluster": {"server": "https://a",
            "extensions": [{"name": ARGS_EXTENSION, "extension": {"not": "a list"}}]}}]}));
        assert!(matches!(access("a", &bad_args, &p), Err(ProfileError::Extension { .. })));
    }

    #[test]
    fn control_plane_healthy_false_marks_the_member_and_unknown_does_not() {
        let with = |s: &str| {
            let st = status(json!({
                "accessProviders": [{"name": "token", "cluster": {"server": "https://a"}}],
                "conditions": [{"type": CONTROL_PLANE_HEALTHY, "status": s, "reason": "Probe", "message": "down"}]}));
            access("a", &st, &token_provider()).expect("access").health
        };
        assert_eq!(
            with("False"),
            Health::Unhealthy("ClusterProfile condition ControlPlaneHealthy=False (Probe): down".into())
        );
        assert_eq!(with("Unknown"), Health::NotUnhealthy);
        assert_eq!(with("True"), Health::NotUnhealthy);
    }

    #[test]
    fn a_provider_file_that_cannot_run_a_plugin_is_refused() {
        let refused =
            |v: serde_json::Value| Providers::parse(&v.to_string()).expect_err("refused").to_string();
        assert_eq!(refused(json!({"providers": [{"name": "x"}]})), "provider \"x\": no execConfig");
        assert!(
            refused(json!({"providers": [{"name": "x", "execConfig": {"command": "/c"}}]}))
                .contains("apiVersion")
        );
        assert!(
            refused(json!({"providers": [{"name": "x", "profileSourcedCLIArgsPolicy": "Prepend",
                "execConfig": {"apiVersion": "v", "command": "/c"}}]}))
            .contains("Prepend")
        );
        assert!(refused(json!({"provider": []})).contains("providers"));
        // Upstream's example file, as written.
        let upstream = json!({"providers": [{"name": "secretreader", "execConfig": {
            "apiVersion": "client.authentication.k8s.io/v1", "args": null,
            "command": "./bin/secretreader-plugin", "env": null, "provideClusterInfo": true}}]});
        assert_eq!(
            Providers::parse(&upstream.to_string()).expect("upstream example").names(),
            ["secretreader"]
        );
    }
}
