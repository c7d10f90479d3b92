//! The DNS checks of `doctor`: each member's answers for the name against
//! the import and the endpoints the controller's rules give.

use std::net::SocketAddr;

use super::*;

impl Checks<'_> {
    /// Each member's DNS answers against its import and endpoints.
    pub(super) fn dns(&mut self, merged: &Merged) {
        let name = self.name();
        for m in &self.o.members {
            let Some(dns) = &m.dns else { continue };
            let Some((rcode, records)) = self.addresses(m, dns) else { continue };
            let import = m.import.found();
            if !self.rcode_fine(m, dns.server, rcode, merged) {
                continue;
            }
            let Some(import) = import else {
                if !records.is_empty() {
                    self.push(
                        Severity::Note,
                        "DnsWithoutImport",
                        &[&m.name],
                        format!(
                            "{}'s DNS answers {} though {} has no ServiceImport {name}: it answers from other clusters' objects (centralized serve?)",
                            m.name,
                            join(records.iter().map(ToString::to_string)),
                            m.name
                        ),
                        "fine for a centralized server; otherwise check which API it watches".into(),
                    );
                }
                continue;
            };
            let endpoints: BTreeSet<IpAddr> =
                m.mcs_slices.read().map(|s| ready(s.iter())).unwrap_or_default();
            if import.type_ == "ClusterSetIP" && !import.endpoint_answers {
                self.clusterset_ip_answer(m, dns.server, &records, import, &endpoints);
            } else {
                self.endpoint_answer(m, dns.server, &records, &endpoints);
            }
            self.srv(m, dns, import.ports.as_slice());
        }
    }

    /// The response code of the A and AAAA answers (the worse of the two)
    /// and their addresses; `None`, with an error, when there was no answer.
    fn addresses<'d>(&mut self, m: &MemberSeen, dns: &'d SeenDns) -> Option<(&'d str, BTreeSet<IpAddr>)> {
        match (&dns.a, &dns.aaaa) {
            (Answer::NoResponse(e), _) | (_, Answer::NoResponse(e)) => {
                self.push(
                    Severity::Error,
                    "DnsNoAnswer",
                    &[&m.name],
                    format!("{}'s DNS {} did not answer {}: {e}", m.name, dns.server, self.o.fqdn),
                    "check --dns's address, and that clusterset-dns (or CoreDNS forwarding to it) runs there"
                        .into(),
                );
                None
            }
            (Answer::Response { rcode, records }, Answer::Response { rcode: r6, records: more }) => {
                // One answer per name: the worse code of the two.
                let rcode = if rcode == "NOERROR" { r6 } else { rcode };
                let addresses = records.iter().chain(more).filter_map(|r| r.parse::<IpAddr>().ok()).collect();
                Some((rcode.as_str(), addresses))
            }
        }
    }

    /// True when `rcode` is NOERROR; otherwise says what the code means
    /// (nothing when NXDOMAIN only confirms a missing import).
    fn rcode_fine(&mut self, m: &MemberSeen, server: SocketAddr, rcode: &str, merged: &Merged) -> bool {
        let import = m.import.found();
        let fqdn = &self.o.fqdn;
        match rcode {
            "NOERROR" => return true,
            // The missing import is the verdict already; the answer confirms it.
            "NXDOMAIN" if import.is_none() && merged.spec.is_some() && m.import.read().is_some() => {}
            "NXDOMAIN" => {
                let why = if import.is_some() {
                    format!("but {} has its ServiceImport", m.name)
                } else {
                    "and nothing is imported".to_owned()
                };
                self.push(
                    Severity::Error,
                    "DnsNxdomain",
                    &[&m.name],
                    format!("{}'s DNS {server} answers NXDOMAIN for {fqdn} {why}", m.name),
                    format!(
                        "check that clusterset-dns there watches this cluster's API and namespace {} (--namespace), and that CoreDNS forwards the zone to it",
                        self.o.key.namespace
                    ),
                );
            }
            "SERVFAIL" => self.push(
                Severity::Error,
                "DnsServfail",
                &[&m.name],
                format!("{}'s DNS {server} answers SERVFAIL for {fqdn}", m.name),
                "clusterset-dns answers SERVFAIL until its watches have listed (see its /ready), and CoreDNS when it cannot reach its forward target: check both".into(),
            ),
            other => self.push(
                Severity::Error,
                "DnsRcode",
                &[&m.name],
                format!("{}'s DNS {server} answers {other} for {fqdn}", m.name),
                "the query did not reach a server for the zone: point --dns at clusterset-dns, or at a CoreDNS with the forward stanza of Corefile.example".into(),
            ),
        }
        false
    }

    /// The addresses answered for a ClusterSetIP import against its ips
    /// (the ready `endpoints` instead: a note, `serve --endpoint-answers`).
    fn clusterset_ip_answer(
        &mut self,
        m: &MemberSeen,
        server: SocketAddr,
        records: &BTreeSet<IpAddr>,
        import: &SeenImport,
        endpoints: &BTreeSet<IpAddr>,
    ) {
        let ips: BTreeSet<IpAddr> = import.ips.iter().filter_map(|ip| ip.trim().parse().ok()).collect();
        if *records == ips {
            return;
        }
        if !records.is_empty() && records == endpoints {
            self.push(
                Severity::Note,
                "EndpointAnswers",
                &[&m.name],
                format!("{}'s DNS answers the ready endpoints instead of the clusterset IP", m.name),
                "expected with serve --endpoint-answers; otherwise check the server's flags".into(),
            );
        } else {
            self.push(
                Severity::Error,
                "DnsMismatch",
                &[&m.name],
                format!(
                    "{}'s DNS {server} answers {} for {} but the ServiceImport there lists ips {}",
                    m.name,
                    shown_addresses(records),
                    self.o.fqdn,
                    shown_addresses(&ips)
                ),
                "the server answers from other objects than this cluster's: check which API and namespaces clusterset-dns there watches, and its /ready".into(),
            );
        }
    }

    /// The addresses answered for a headless import (or with endpoint
    /// answers) against the ready `endpoints`: none unknown, a subset noted.
    fn endpoint_answer(
        &mut self,
        m: &MemberSeen,
        server: SocketAddr,
        records: &BTreeSet<IpAddr>,
        endpoints: &BTreeSet<IpAddr>,
    ) {
        let unknown = records.difference(endpoints).next().is_some();
        if unknown || (records.is_empty() && !endpoints.is_empty()) {
            self.push(
                Severity::Error,
                "DnsMismatch",
                &[&m.name],
                format!(
                    "{}'s DNS {server} answers {} for {}; the ready endpoints there are {}",
                    m.name,
                    shown_addresses(records),
                    self.o.fqdn,
                    shown_addresses(endpoints)
                ),
                "the server answers from other objects than this cluster's: check which API and namespaces clusterset-dns there watches, and its /ready".into(),
            );
        } else if records.len() < endpoints.len() {
            self.push(
                Severity::Note,
                "DnsSubset",
                &[&m.name],
                format!("{}'s DNS answers {} of the {} ready endpoints", m.name, records.len(), endpoints.len()),
                "expected with an answer policy, --max-answers or failed health probes (clusterset-dns explain shows why)".into(),
            );
        }
    }

    /// The SRV answer's ports against the import's.
    fn srv(&mut self, m: &MemberSeen, dns: &SeenDns, want: &[ServicePortSpec]) {
        let Answer::Response { rcode, records } = &dns.srv else { return };
        if rcode != "NOERROR" {
            return;
        }
        let got: BTreeSet<u16> =
            records.iter().filter_map(|r| r.split_whitespace().nth(2)?.parse().ok()).collect();
        let expect: BTreeSet<u16> = want.iter().map(|p| p.port).collect();
        if got != expect {
            self.push(
                Severity::Warning,
                "DnsSrvPorts",
                &[&m.name],
                format!(
                    "{}'s DNS answers SRV ports {} for {}; the ServiceImport lists {}",
                    m.name,
                    join(got.iter().map(ToString::to_string)),
                    self.o.fqdn,
                    join(expect.iter().map(ToString::to_string))
                ),
                "the server has not caught up with the import, or answers from other objects".into(),
            );
        }
    }
}

/// Addresses as shown in a verdict.
fn shown_addresses(s: &BTreeSet<IpAddr>) -> String {
    if s.is_empty() { "nothing".to_owned() } else { join(s.iter().map(ToString::to_string)) }
}
