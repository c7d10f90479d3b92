//! The diagnosis for people (text) or scripts (JSON), and the exit status
//! it means: 0 healthy, 1 problems, 2 a member could not be read.

use std::fmt::Write as _;

use serde::Serialize;

use super::checks::{Severity, Verdict, unreachable};
use super::observed::{
    Answer, MemberSeen, Observed, Seen, SeenDns, SeenExport, SeenImport, SeenService, SeenSlice,
};
use crate::fleet::export::Exported;

/// How the report is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// For people.
    Text,
    /// For scripts: one JSON object.
    Json,
}

/// No problem found.
pub const HEALTHY: u8 = 0;
/// Errors or warnings found.
pub const PROBLEMS: u8 = 1;
/// A member could not be read: the diagnosis is incomplete.
pub const INCOMPLETE: u8 = 2;

/// The exit status the verdicts mean.
pub fn exit_status(o: &Observed, verdicts: &[Verdict]) -> u8 {
    if o.members.iter().any(unreachable) {
        INCOMPLETE
    } else if verdicts.iter().any(|v| v.severity != Severity::Note) {
        PROBLEMS
    } else {
        HEALTHY
    }
}

#[derive(Serialize)]
struct JsonReport<'a> {
    service: String,
    name: &'a str,
    healthy: bool,
    members: Vec<JsonMember>,
    verdicts: &'a [Verdict],
}

#[derive(Serialize)]
struct JsonMember {
    name: String,
    cluster: String,
    /// What was seen, one entry per kind of object, as in the text report.
    seen: Vec<(String, String)>,
}

/// The report in `format`.
pub fn render(o: &Observed, verdicts: &[Verdict], format: Format) -> String {
    match format {
        Format::Text => text(o, verdicts),
        Format::Json => {
            let report = JsonReport {
                service: o.key.to_string(),
                name: &o.fqdn,
                healthy: exit_status(o, verdicts) == HEALTHY,
                members: o
                    .members
                    .iter()
                    .map(|m| JsonMember {
                        name: m.name.clone(),
                        cluster: m.cluster.to_string(),
                        seen: lines(m),
                    })
                    .collect(),
                verdicts,
            };
            // Plain data: serialization cannot fail.
            serde_json::to_string_pretty(&report).unwrap_or_default() + "\n"
        }
    }
}

fn text(o: &Observed, verdicts: &[Verdict]) -> String {
    let mut out = format!("{} (service {}), {} member(s)\n", o.fqdn, o.key, o.members.len());
    for m in &o.members {
        let id =
            if m.cluster.as_str() == m.name { String::new() } else { format!(" (cluster id {})", m.cluster) };
        let _ = writeln!(out, "\n{}{id}", m.name);
        for (what, seen) in lines(m) {
            let _ = writeln!(out, "  {what:<15} {seen}");
        }
    }
    out.push_str("\nVerdicts\n");
    if verdicts.is_empty() {
        out.push_str("  none\n");
    }
    for v in verdicts {
        let _ = writeln!(out, "  {:<8} {}: {}", v.severity.as_str(), v.code, v.problem);
        let _ = writeln!(out, "  {:<8} -> {}", "", v.action);
    }
    let count = |s: Severity| verdicts.iter().filter(|v| v.severity == s).count();
    let _ = match exit_status(o, verdicts) {
        HEALTHY => writeln!(out, "\nHealthy: no problems found ({} note(s)).", count(Severity::Note)),
        PROBLEMS => writeln!(
            out,
            "\nProblems: {} error(s), {} warning(s), {} note(s).",
            count(Severity::Error),
            count(Severity::Warning),
            count(Severity::Note)
        ),
        _ => writeln!(out, "\nIncomplete: a member could not be read; {} error(s).", count(Severity::Error)),
    };
    out
}

/// One line per kind of object of a member.
fn lines(m: &MemberSeen) -> Vec<(String, String)> {
    let mut v = vec![
        ("Service".to_owned(), shown(&m.service, service_text)),
        ("ServiceExport".to_owned(), shown(&m.export, export_text)),
        ("ServiceImport".to_owned(), shown(&m.import, import_text)),
    ];
    // The messages of the conditions that say something is wrong, as the
    // controller (ours or another MCS implementation) wrote them.
    for c in m.export.found().map(|e| e.conditions.as_slice()).unwrap_or_default() {
        let wrong = if c.type_ == "Conflict" { c.status == "True" } else { c.status != "True" };
        if wrong && !c.message.is_empty() {
            v.push(("  condition".into(), format!("{}={} {}: {}", c.type_, c.status, c.reason, c.message)));
        }
    }
    if let Seen::Read(Some(ips)) = &m.vip {
        v.push(("clusterset VIP".into(), or_none(&ips.join(", "))));
    }
    v.push((
        "MCS slices".into(),
        match &m.mcs_slices {
            Seen::Read(slices) => by_source(slices),
            other => shown_err(other),
        },
    ));
    v.push((
        "own endpoints".into(),
        match &m.own_slices {
            Seen::Read(slices) => {
                let ready: usize = slices.iter().map(|s| s.ready.len()).sum();
                let not: usize = slices.iter().map(|s| s.not_ready).sum();
                format!("{ready} ready{}", if not > 0 { format!(", {not} not ready") } else { String::new() })
            }
            other => shown_err(other),
        },
    ));
    if let Some(dns) = &m.dns {
        v.push((format!("DNS {}", dns.server), dns_text(dns)));
    }
    v
}

/// A Service's type, addresses and ports, or why it cannot be exported.
fn service_text(s: &SeenService) -> String {
    match (&s.exported, s.headless) {
        (Exported::Service(e), headless) => {
            let ports = e.ports.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ");
            let ips = if headless { "clusterIP None".to_owned() } else { s.cluster_ips.join(", ") };
            format!("{} {ips}; ports {}", if headless { "Headless" } else { &s.type_ }, or_none(&ports))
        }
        _ => format!("{} (cannot be exported)", s.type_),
    }
}

/// A ServiceExport's age and conditions.
fn export_text(e: &SeenExport) -> String {
    let conds: Vec<String> =
        e.conditions.iter().map(|c| format!("{}={} {}", c.type_, c.status, c.reason)).collect();
    format!(
        "created {}; {}",
        e.created_text,
        if conds.is_empty() { "no conditions".into() } else { conds.join("; ") }
    )
}

/// A ServiceImport's type, addresses, ports and clusters.
fn import_text(i: &SeenImport) -> String {
    let ports = i.ports.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ");
    let ips = if i.ips.is_empty() { String::new() } else { format!("; ips {}", i.ips.join(", ")) };
    format!("{}{ips}; ports {}; clusters {}", i.type_, or_none(&ports), or_none(&i.clusters.join(", ")))
}

/// The A, AAAA and SRV answers of a member's DNS.
fn dns_text(dns: &SeenDns) -> String {
    let answer = |a: &Answer| match a {
        Answer::Response { rcode, records } if rcode == "NOERROR" => or_none(&records.join(", ")),
        Answer::Response { rcode, records } if records.is_empty() => rcode.clone(),
        Answer::Response { rcode, records } => format!("{rcode} {}", records.join(", ")),
        Answer::NoResponse(e) => format!("no answer ({e})"),
    };
    format!("A {} | AAAA {} | SRV {}", answer(&dns.a), answer(&dns.aaaa), answer(&dns.srv))
}

fn by_source(slices: &[SeenSlice]) -> String {
    let mut sources: Vec<(String, usize, usize)> = Vec::new();
    for s in slices {
        let source = s.source.clone().unwrap_or_else(|| "(no source label)".into());
        match sources.iter_mut().find(|(c, _, _)| *c == source) {
            Some(e) => {
                e.1 += s.ready.len();
                e.2 += s.not_ready;
            }
            None => sources.push((source, s.ready.len(), s.not_ready)),
        }
    }
    sources.sort();
    let parts: Vec<String> = sources
        .iter()
        .map(|(c, r, n)| {
            format!("from {c}: {r} ready{}", if *n > 0 { format!(", {n} not ready") } else { String::new() })
        })
        .collect();
    or_none(&parts.join("; "))
}

fn shown<T>(s: &Seen<Option<T>>, f: impl Fn(&T) -> String) -> String {
    match s {
        Seen::Read(Some(v)) => f(v),
        Seen::Read(None) => "none".into(),
        other => shown_err(other),
    }
}

fn shown_err<T>(s: &Seen<T>) -> String {
    match s {
        Seen::Forbidden(e) => format!("not readable (forbidden: {e})"),
        Seen::Failed(e) => format!("not read ({e})"),
        Seen::Read(_) => String::new(),
    }
}

fn or_none(s: &str) -> String {
    if s.is_empty() { "none".into() } else { s.to_owned() }
}
