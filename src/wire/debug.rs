//! The debug answers: `dig CH TXT <name in the zone>` answers how that
//! name would be answered to the asker, `dig CH TXT whoami.<zone>` what the
//! server makes of the asker; for `--allow-debug` clients only.

use std::net::IpAddr;
use std::sync::Arc;

use super::ClientSubnet;
use crate::answer::rtype;
use crate::model::Cidr;
use crate::store::{Client, Records, Snapshot};

/// The labels of a lower-case wire-form name, for building a `Name`.
fn label_iter(name: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut i = 0;
    std::iter::from_fn(move || {
        let len = usize::from(*name.get(i)?);
        let label = name.get(i + 1..i + 1 + len).filter(|_| len > 0)?;
        i += 1 + len;
        Some(label)
    })
}

/// Explains an answer in words: what `clusterset-dns explain` prints. Given
/// to the wire layer by the command (the report lives in `ops`, above it).
pub trait Explain: Send + Sync {
    /// The report's lines for `qname` (lower-case wire form) and `qtype`
    /// as answered to `client`, described as `who`.
    fn explain(&self, snap: &Snapshot, qname: &[u8], qtype: u16, client: Client, who: &str) -> Vec<String>;
}

/// `dig CH TXT <name in the zone>` answers the explain report for that
/// name as the asker would be answered, and `dig CH TXT whoami.<zone>`
/// what the server attributes to the asker: only to `allow` (refused and
/// counted otherwise), each line one TXT record.
pub struct DebugAnswers {
    /// Clients that may ask (`--allow-debug`).
    pub allow: Vec<Cidr>,
    /// The report.
    pub explain: Arc<dyn Explain>,
}

impl DebugAnswers {
    /// Whether a client at `ip` may ask (`--allow-debug`). The one rule for
    /// every debug door, DNS names here and HTTP `/debug/` in `ops::debug`,
    /// so that the flag means the same wherever it is asked; the access
    /// list rule is [`Cidr::allows`], as `--allow-transfer`'s.
    pub fn allows(&self, ip: IpAddr) -> bool {
        Cidr::allows(&self.allow, ip)
    }
}

impl std::fmt::Debug for DebugAnswers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DebugAnswers").field("allow", &self.allow).finish_non_exhaustive()
    }
}

/// True when `name` (lower-case wire form) is `zone` or below it.
pub(super) fn within(name: &[u8], zone: &[u8]) -> bool {
    let mut i = 0;
    while let Some(&len) = name.get(i) {
        if name.get(i..) == Some(zone) {
            return true;
        }
        if len == 0 {
            return false;
        }
        i += 1 + usize::from(len);
    }
    false
}

/// The debug answer to a CHAOS TXT query for `name` in the zone: the
/// lines, or `None` when the client may not ask.
fn lines(
    debug: &DebugAnswers,
    snap: &Snapshot,
    name: &[u8],
    peer: Option<IpAddr>,
    ecs: Option<(ClientSubnet, bool)>,
    client: Client,
) -> Option<Vec<String>> {
    // No peer: asked in-process (`explain`), which is trusted.
    if let Some(ip) = peer
        && !debug.allows(ip)
    {
        return None;
    }
    let l = &snap.zone().localities;
    let cluster = client.cluster.and_then(|c| l.cluster_name(c)).map_or("(unknown)", |c| c.as_str());
    let zone = client.zone.and_then(|z| l.zone_name(z)).unwrap_or("(unknown)");
    let address = peer.map_or_else(|| "(in process)".to_owned(), |ip| ip.to_string());
    // The subnet as sent, and whether it was believed (`--trust-ecs-from`).
    let ecs = ecs.map(|(e, believed)| {
        let mut bytes = [0u8; 16];
        bytes[..e.address().len()].copy_from_slice(e.address());
        let ip: IpAddr = if e.family == 1 {
            std::net::Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3]).into()
        } else {
            std::net::Ipv6Addr::from(bytes).into()
        };
        let ignored = if believed { "" } else { " ignored: the sender is not in --trust-ecs-from" };
        format!("{ip}/{}{ignored}", e.source_prefix)
    });
    let whoami = [b"\x06whoami".as_slice(), &snap.zone().wire].concat();
    if name == whoami.as_slice() {
        let mut lines = vec![format!("address {address}")];
        lines.extend(ecs.map(|e| format!("ecs {e}")));
        lines.push(format!("cluster {cluster}"));
        lines.push(format!("zone {zone}"));
        return Some(lines);
    }
    let who = match &ecs {
        Some(e) => format!("{address} (ECS {e}, cluster {cluster})"),
        None => format!("{address} (cluster {cluster})"),
    };
    // Asked with TXT (or ANY) of the CHAOS class; the report is for the
    // A answer unless the name only has others (SRV names).
    Some(debug.explain.explain(snap, name, rtype::A, client, &who))
}

/// The records answering a CHAOS TXT question for `name`, or `None` when
/// the client may not ask. `ecs`: the query's Client Subnet, and whether it
/// was believed.
pub(super) fn records(
    debug: &DebugAnswers,
    snap: &Snapshot,
    name: &[u8],
    peer: Option<IpAddr>,
    ecs: Option<(ClientSubnet, bool)>,
    client: Client,
) -> Option<Records> {
    let lines = lines(debug, snap, name, peer, ecs, client)?;
    let owner = hickory_proto::rr::Name::from_labels(label_iter(name)).unwrap_or_default();
    Some(crate::store::chaos_txt_answer(&owner, &lines))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A report of no lines: these tests are about who may ask.
    struct NoReport;

    impl Explain for NoReport {
        fn explain(&self, _: &Snapshot, _: &[u8], _: u16, _: Client, _: &str) -> Vec<String> {
            Vec::new()
        }
    }

    #[test]
    fn debug_access_is_the_allowed_networks_for_ipv4_clients_of_dual_stack_sockets_too() {
        let allow = ["127.0.0.0/8", "::1", "192.0.2.0/24"];
        let allow = allow.iter().map(|c| Cidr::parse(c).expect("cidr")).collect();
        let debug = DebugAnswers { allow, explain: Arc::new(NoReport) };
        for (ip, allowed) in [
            ("127.0.0.1", true),
            ("127.0.0.2", true),
            ("::1", true),
            ("192.0.2.77", true),
            ("::ffff:127.0.0.1", true),
            ("::ffff:192.0.2.77", true),
            ("10.0.0.1", false),
            ("::ffff:10.0.0.1", false),
            ("::2", false),
            ("2001:db8::1", false),
        ] {
            let ip: IpAddr = ip.parse().expect("ip");
            assert_eq!(debug.allows(ip), allowed, "{ip}");
        }
    }
}
