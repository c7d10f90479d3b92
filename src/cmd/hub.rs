//! The `hub` command: `hub enrol NAME` enrols a member on the hub
//! (`hub::enrol`) and writes its agent's hub kubeconfig; `hub reader`
//! writes one of a centralized serve's read-only identity.

use std::path::Path;

use kube::config::{AuthInfo, Context, Kubeconfig, NamedAuthInfo, NamedContext};

use crate::cli::{EnrolArgs, HubArgs, HubCommand, ReaderArgs};
use crate::hub::enrol;
use crate::k8s::client::{self, Connection};

/// Runs `hub`: what it did, for the command's output.
pub async fn run(args: &HubArgs) -> anyhow::Result<String> {
    match &args.command {
        HubCommand::Enrol(a) => enrol_member(a).await,
        HubCommand::Reader(a) => reader(a).await,
    }
}

async fn reader(ReaderArgs { hub: a }: &ReaderArgs) -> anyhow::Result<String> {
    let connection = Connection::Kubeconfig { path: a.hub_kubeconfig.clone(), context: None };
    let hub = client::connect(&connection, "hub-reader").await?;
    let token = enrol::reader(&hub, a.token_seconds).await?;
    write_kubeconfig(&a.hub_kubeconfig, enrol::READER, token, &a.out)?;
    Ok(format!(
        "serve's hub identity {}/{} reads every member's records; its kubeconfig (serve --hub-kubeconfig): {}\n",
        enrol::IDENTITIES,
        enrol::READER,
        a.out.display()
    ))
}

async fn enrol_member(EnrolArgs { member, hub: a }: &EnrolArgs) -> anyhow::Result<String> {
    crate::model::ClusterId::parse(member).map_err(|e| anyhow::anyhow!("NAME {member:?}: {e}"))?;
    let connection = Connection::Kubeconfig { path: a.hub_kubeconfig.clone(), context: None };
    let hub = client::connect(&connection, "hub-enrol").await?;
    let token = enrol::enrol(&hub, member, a.token_seconds).await?;
    let user = enrol::identity(member);
    write_kubeconfig(&a.hub_kubeconfig, &user, token, &a.out)?;
    Ok(format!(
        "enrolled member {member} on the hub: namespace {}, identity {}/{}; its agent's hub kubeconfig: {}\n",
        crate::hub::record::namespace_of(member),
        enrol::IDENTITIES,
        user,
        a.out.display()
    ))
}

/// Writes to `out` a kubeconfig of the hub as `admin` reaches it (its
/// current context's cluster), as user `user` with `token`.
fn write_kubeconfig(admin: &Path, user: &str, token: String, out: &Path) -> anyhow::Result<()> {
    let kubeconfig = Kubeconfig::read_from(admin)?;
    let current = kubeconfig.current_context.clone().unwrap_or_default();
    let context = kubeconfig
        .contexts
        .iter()
        .find(|c| c.name == current)
        .and_then(|c| c.context.clone())
        .ok_or_else(|| anyhow::anyhow!("{}: no current context", admin.display()))?;
    let cluster = kubeconfig
        .clusters
        .iter()
        .find(|c| c.name == context.cluster)
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("{}: no cluster {:?}", admin.display(), context.cluster))?;
    let written = Kubeconfig {
        clusters: vec![cluster.clone()],
        auth_infos: vec![NamedAuthInfo {
            name: user.to_owned(),
            auth_info: Some(AuthInfo { token: Some(token.into()), ..AuthInfo::default() }),
            other: Default::default(),
        }],
        contexts: vec![NamedContext {
            name: "hub".into(),
            context: Some(Context {
                cluster: cluster.name.clone(),
                user: Some(user.to_owned()),
                ..Context::default()
            }),
            other: Default::default(),
        }],
        current_context: Some("hub".into()),
        ..Kubeconfig::default()
    };
    let text = serde_yaml_ng::to_string(&written)?;
    let tmp = out.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, out)?;
    Ok(())
}
