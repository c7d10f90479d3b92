//! `clusterset-dns doctor NAME`: connects to the members (read only), reads
//! what each holds for the service, asks the DNS servers named by `--dns`,
//! and reports the diagnosis (`diagnose`). The internal name of the
//! clusterset VIP Service comes from the controller (`controller::desired`),
//! so the Service looked for is the one `sync` keeps.

use futures::future::join_all;
use hickory_proto::rr::Name;

use crate::config::DoctorConfig;
use crate::controller::desired::{Naming, vip_name};
use crate::diagnose::observed::Observed;
use crate::diagnose::{checks, dns, read, report};
use crate::fleet::member;
use crate::k8s::client::ClientError;

/// Why `doctor` could not diagnose at all.
#[derive(Debug, thiserror::Error)]
pub enum DoctorError {
    /// A member's kubeconfig could not be used.
    #[error("{0}")]
    Client(#[from] ClientError),
    /// The service's name is not a DNS name in the zone (a configuration defect).
    #[error("the service name in zone {zone}: {problem}")]
    Name {
        /// The zone.
        zone: String,
        /// What is wrong.
        problem: String,
    },
}

/// Diagnoses the service: the report and the exit status it means.
pub async fn run(cfg: DoctorConfig) -> Result<(String, u8), DoctorError> {
    let namespaces = [cfg.key.namespace.to_string()];
    let members = member::connect_all(&cfg.members, "doctor", &namespaces, None).await?;
    let fqdn = Name::from_ascii(format!("{}.{}.svc.{}", cfg.key.name, cfg.key.namespace, cfg.zone))
        .map_err(|e| DoctorError::Name { zone: cfg.zone.to_string(), problem: e.to_string() })?;
    // Named in messages by its usual name; found by either.
    let vip = vip_name(&cfg.key, Naming::Short);
    let vip_names = [vip.clone(), vip_name(&cfg.key, Naming::Long)];
    // Members, and DNS servers, are asked at the same time: a member that
    // does not answer costs one timeout, not one per member after it.
    let reads = join_all(members.iter().map(|m| read::member(m, &cfg.key, &vip_names, cfg.timeout)));
    let answers = join_all(cfg.dns.iter().map(|(_, addr)| dns::ask(*addr, &fqdn, cfg.timeout)));
    let (mut seen, answers) = tokio::join!(reads, answers);
    for ((member, _), answer) in cfg.dns.iter().zip(answers) {
        if let Some(m) = seen.iter_mut().find(|m| &m.name == member) {
            m.dns = Some(answer);
        }
    }
    let observed = Observed { key: cfg.key.clone(), fqdn: fqdn.to_string(), vip_name: vip, members: seen };
    let verdicts = checks::verdicts(&observed);
    Ok((report::render(&observed, &verdicts, cfg.format), report::exit_status(&observed, &verdicts)))
}
