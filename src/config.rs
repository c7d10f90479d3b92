//! Validated configuration. Every check names the flag it concerns, and runs
//! once at start: a bad value stops the server before it answers anything.
//! One module per command: `serve`, `sync` (and `run`), `tools` (`setup-dns`,
//! `doctor`); what several share (members, the error) is here.

use std::path::PathBuf;

use crate::cli::MembersArgs;
use crate::fleet::member::MemberConfig;
use crate::k8s::client::Connection;
use crate::model::{ClusterId, LabelError};

mod serve;
mod sync;
mod tools;

pub use serve::ServeConfig;
pub use sync::{AgentConfig, LeaseConfig, RunConfig, SyncConfig, behaviour, kube_limits, lease};
pub use tools::{DoctorConfig, SetupDnsConfig, WatchConfig};

/// A configuration value that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("{flag}: {problem}")]
pub struct ConfigError {
    /// The flag, e.g. `--zone`.
    pub flag: &'static str,
    /// What is wrong.
    pub problem: String,
}

fn bad(flag: &'static str, problem: impl Into<String>) -> ConfigError {
    ConfigError { flag, problem: problem.into() }
}

/// Why `value` is not a label (or cluster id), naming the value once: the
/// error already names it when the whole value is the offending label.
fn not_a_label(value: &str, e: &LabelError) -> String {
    let why = e.to_string();
    if why.starts_with(&format!("{value:?}")) { why } else { format!("{value:?} {why}") }
}

/// The members of `--cluster` and `--members`, checked: names are cluster
/// ids, kubeconfig files exist, no name is given twice.
pub fn members(a: &MembersArgs) -> Result<Vec<MemberConfig>, ConfigError> {
    let mut members = Vec::new();
    for spec in &a.clusters {
        let (name, rest) = spec
            .split_once('=')
            .ok_or_else(|| bad("--cluster", format!("{spec:?} is not NAME=KUBECONFIG")))?;
        let (path, context) = match rest.split_once('#') {
            Some((p, c)) => (p, Some(c.to_owned())),
            None => (rest, None),
        };
        members.push(member("--cluster", name, path, context)?);
    }
    if let Some(file) = &a.members_file {
        let text = std::fs::read_to_string(file)
            .map_err(|e| bad("--members", format!("{}: {e}", file.display())))?;
        let parsed: MembersFile =
            serde_path_to_error::deserialize(serde_yaml_ng::Deserializer::from_str(&text))
                .map_err(|e| bad("--members", format!("{}: {}: {}", file.display(), e.path(), e.inner())))?;
        for m in parsed.members {
            members.push(member("--members", &m.name, &m.kubeconfig, m.context)?);
        }
    }
    for (i, m) in members.iter().enumerate() {
        if members[..i].iter().any(|o| o.name == m.name) {
            return Err(bad("--cluster", format!("member {:?} is given twice", m.name)));
        }
    }
    Ok(members)
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct MembersFile {
    members: Vec<MemberEntry>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct MemberEntry {
    name: String,
    kubeconfig: String,
    #[serde(default)]
    context: Option<String>,
}

fn member(
    flag: &'static str,
    name: &str,
    path: &str,
    context: Option<String>,
) -> Result<MemberConfig, ConfigError> {
    ClusterId::parse(name).map_err(|e| bad(flag, format!("member name {}", not_a_label(name, &e))))?;
    let path = PathBuf::from(path);
    if !path.is_file() {
        return Err(bad(flag, format!("{name}: kubeconfig {} is not a readable file", path.display())));
    }
    Ok(MemberConfig { name: name.to_owned(), connection: Connection::Kubeconfig { path, context } })
}

#[cfg(test)]
mod tests;
