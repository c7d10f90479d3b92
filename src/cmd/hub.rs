//! The `hub` command: `hub enrol NAME` enrols a member on the hub
//! (`hub::enrol`) and writes its agent's hub kubeconfig.

use kube::config::{AuthInfo, Context, Kubeconfig, NamedAuthInfo, NamedContext};

use crate::cli::{EnrolArgs, HubArgs, HubCommand};
use crate::hub::enrol;
use crate::k8s::client::{self, Connection};

/// Runs `hub`: what it did, for the command's output.
pub async fn run(args: &HubArgs) -> anyhow::Result<String> {
    match &args.command {
        HubCommand::Enrol(a) => enrol_member(a).await,
    }
}

async fn enrol_member(a: &EnrolArgs) -> anyhow::Result<String> {
    crate::model::ClusterId::parse(&a.member).map_err(|e| anyhow::anyhow!("NAME {:?}: {e}", a.member))?;
    let connection = Connection::Kubeconfig { path: a.hub_kubeconfig.clone(), context: None };
    let hub = client::connect(&connection, "hub-enrol").await?;
    let token = enrol::enrol(&hub, &a.member, a.token_seconds).await?;
    // The hub as the admin kubeconfig reaches it, with the member's token.
    let admin = Kubeconfig::read_from(&a.hub_kubeconfig)?;
    let current = admin.current_context.clone().unwrap_or_default();
    let context = admin
        .contexts
        .iter()
        .find(|c| c.name == current)
        .and_then(|c| c.context.clone())
        .ok_or_else(|| anyhow::anyhow!("{}: no current context", a.hub_kubeconfig.display()))?;
    let cluster =
        admin.clusters.iter().find(|c| c.name == context.cluster).cloned().ok_or_else(|| {
            anyhow::anyhow!("{}: no cluster {:?}", a.hub_kubeconfig.display(), context.cluster)
        })?;
    let user = enrol::identity(&a.member);
    let out = Kubeconfig {
        clusters: vec![cluster.clone()],
        auth_infos: vec![NamedAuthInfo {
            name: user.clone(),
            auth_info: Some(AuthInfo { token: Some(token.into()), ..AuthInfo::default() }),
            other: Default::default(),
        }],
        contexts: vec![NamedContext {
            name: "hub".into(),
            context: Some(Context {
                cluster: cluster.name.clone(),
                user: Some(user.clone()),
                ..Context::default()
            }),
            other: Default::default(),
        }],
        current_context: Some("hub".into()),
        ..Kubeconfig::default()
    };
    let text = serde_yaml_ng::to_string(&out)?;
    let tmp = a.out.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, &a.out)?;
    Ok(format!(
        "enrolled member {} on the hub: namespace {}, identity {}/{}; its agent's hub kubeconfig: {}\n",
        a.member,
        crate::hub::record::namespace_of(&a.member),
        enrol::IDENTITIES,
        user,
        a.out.display()
    ))
}
