//! `GET /debug/explain?name=..&type=..&cluster=..`: how the server would
//! answer a query, from the snapshot it answers with: the candidates, their
//! cluster, zone and health, the policy's decision, and the exact answer
//! (the wire path runs on a real query; it counts as one query).

use std::fmt::Write;
use std::str::FromStr;

use hickory_proto::op::{Edns, Message, Query};
use hickory_proto::rr::{Name, RecordType};

use crate::answer::select::{self, Picks};
use crate::model::Boundary;
use crate::store::{Balance, Client, ServiceNames, Snapshot};
use crate::wire::{Explain, Scratch, Transport, WireConfig, respond_as};

/// Builds the report; `Err` explains a bad request.
pub fn report(snap: &Snapshot, name: &str, qtype: &str, cluster: Option<&str>) -> Result<String, String> {
    let qname = Name::from_ascii(name).map_err(|e| format!("name {name:?}: {e}"))?.to_lowercase();
    let mut qname = qname;
    qname.set_fqdn(true);
    let rtype =
        RecordType::from_str(&qtype.to_ascii_uppercase()).map_err(|e| format!("type {qtype:?}: {e}"))?;
    let l = &snap.zone().localities;
    let service = service_of(snap, &qname);
    let balance = service.filter(|(_, is_service_name)| *is_service_name).and_then(|(s, _)| s.balance());
    let client = match cluster {
        None => Client::default(),
        Some(c) => l
            .cluster_id(c)
            .or_else(|| {
                balance.and_then(|b| b.clusters.iter().find(|bc| bc.name.as_str() == c)).map(|bc| bc.id)
            })
            .map(|id| l.client_in(id))
            .ok_or_else(|| {
                format!("cluster {c:?} is neither a --client-cluster nor one of this service's")
            })?,
    };
    report_for(snap, &qname, rtype, client, &format!("cluster {}", cluster.unwrap_or("(unknown)")))
}

/// The report for `client` (described as `who`), as `dig CH TXT` asks it:
/// the wire path has already attributed the client.
pub fn report_for(
    snap: &Snapshot,
    qname: &Name,
    rtype: RecordType,
    client: Client,
    who: &str,
) -> Result<String, String> {
    let mut out = String::new();
    let service = service_of(snap, qname).filter(|(_, is_service_name)| *is_service_name).map(|(s, _)| s);
    let _ = writeln!(out, "query: {qname} {rtype} from {who}");
    // Debug clients are operators (--allow-debug): they are told why a
    // restricted service is not found, which a plain query never says.
    let all = service_of(snap, qname).map(|(s, _)| s);
    if let Some(consumers) = all.and_then(|s| s.hosts().consumers()) {
        let l = &snap.zone().localities;
        let names: Vec<&str> =
            consumers.iter().filter_map(|&c| l.cluster_name(c)).map(|c| c.as_str()).collect();
        let seen = all.is_some_and(|s| s.hosts().visible_to(client.cluster));
        let _ = writeln!(
            out,
            "consumers: {} ({})",
            if names.is_empty() { "none of the client clusters".to_owned() } else { names.join(", ") },
            if seen {
                "the client is one"
            } else {
                "the client is not one: the service does not exist for it"
            }
        );
    }
    let service = service.filter(|s| s.hosts().visible_to(client.cluster));
    let balance = service.and_then(|s| s.balance().map(|b| (s, b)));
    let family = match rtype {
        RecordType::A => Some(0),
        RecordType::AAAA => Some(1),
        _ => None,
    };
    match (balance, family) {
        (Some((names, b)), Some(fam)) => explain_balance(&mut out, snap, (names, b), fam, &client),
        (Some(_), None) => {
            let _ = writeln!(out, "policy: none for {rtype} (policies choose A and AAAA answers)");
        }
        (None, _) => {
            let _ = writeln!(out, "policy: none (not a balanced service name: the answer is fixed)");
        }
    }
    // The exact answer: the wire path on a real query.
    let mut m = Message::query();
    m.metadata.id = 1;
    m.add_query(Query::query(qname.clone(), rtype));
    let mut edns = Edns::new();
    edns.set_max_payload(1232);
    m.set_edns(edns);
    let packet = m.to_vec().map_err(|e| e.to_string())?;
    let mut scratch = Scratch::default();
    let mut response = Vec::new();
    let cfg = WireConfig::default();
    respond_as(snap, &packet, client, Transport::Tcp, &cfg, &mut scratch, &mut response)
        .ok_or("no response")?;
    // It went through the answer path: it counts as an answer.
    scratch.flush_answers(&snap.zone().answer_stats);
    let r = Message::from_vec(&response).map_err(|e| e.to_string())?;
    let _ = writeln!(
        out,
        "answer: {:?}{}",
        r.metadata.response_code,
        if r.answers.is_empty() { " (no records)" } else { "" }
    );
    for rec in r.answers.iter().chain(&r.authorities) {
        let _ = writeln!(out, "  {}", rec.to_string().trim_end());
    }
    Ok(out)
}

/// The report as the wire layer asks for it (`dig CH TXT <name>`).
pub struct Report;

impl Explain for Report {
    fn explain(&self, snap: &Snapshot, qname: &[u8], qtype: u16, client: Client, who: &str) -> Vec<String> {
        use hickory_proto::serialize::binary::{BinDecodable, BinDecoder};
        let rtype = RecordType::from(qtype);
        let name = Name::read(&mut BinDecoder::new(qname)).map_err(|e| e.to_string());
        match name.and_then(|n| report_for(snap, &n, rtype, client, who)) {
            Ok(text) => text.lines().map(str::to_owned).collect(),
            Err(e) => vec![format!("error: {e}")],
        }
    }
}

/// The service's boundary and where it puts this client: which zone,
/// cluster or region is inside, or why nothing is.
fn boundary_line(snap: &Snapshot, b: &Balance, client: &Client) -> String {
    let l = &snap.zone().localities;
    let cluster = client.cluster.and_then(|c| l.cluster_name(c)).map(|c| c.as_str());
    let scope = match b.applied_boundary() {
        Boundary::None if b.boundary != Boundary::None => {
            return format!(
                "boundary: {} (not applied: the {} policy does not look at the client)",
                b.boundary, b.policy
            );
        }
        Boundary::None => return "boundary: none".to_owned(),
        Boundary::Zone => {
            client.zone.and_then(|z| l.zone_name(z)).map(|z| format!("zone {z}")).unwrap_or_else(|| {
                "nothing: the client's zone is unknown (--client-cluster CIDR=NAME/ZONE)".into()
            })
        }
        Boundary::Cluster => cluster
            .map(|c| format!("cluster {c}"))
            .unwrap_or_else(|| "nothing: the client's cluster is unknown".into()),
        Boundary::Region => match (client.region.and_then(|r| l.region_name(r)), cluster) {
            (Some(r), _) => format!("region {r}"),
            (None, Some(c)) => format!("cluster {c} (its region is unknown: --cluster-region)"),
            (None, None) => "nothing: the client's cluster is unknown".into(),
        },
    };
    format!("boundary: {} (inside: {scope}; never answered outside it)", b.boundary)
}

/// The service a name belongs to, and whether it is the service name itself.
fn service_of<'s>(snap: &'s Snapshot, name: &Name) -> Option<(&'s ServiceNames, bool)> {
    let origin = &snap.zone().config.origin;
    if !origin.zone_of(name) {
        return None;
    }
    let labels: Vec<String> = name.iter().map(|l| String::from_utf8_lossy(l).into_owned()).collect();
    let k = labels.len().checked_sub(origin.num_labels() as usize)?;
    if k < 3 || labels[k - 1] != "svc" {
        return None;
    }
    let key = crate::store::names_key(&labels[k - 2], &labels[k - 3]);
    let s = snap.service(&key)?;
    Some((s, k == 3))
}

fn explain_balance(
    out: &mut String,
    snap: &Snapshot,
    (names, b): (&ServiceNames, &Balance),
    fam: usize,
    client: &Client,
) {
    let seq = b.peek_seq(fam);
    let records = b.endpoints.iter().map(|e| usize::from(e.records[fam].1)).sum();
    let mut picks = Picks::default();
    let decision = select::choose(b, fam, client, seq, records, &mut picks);
    let _ = writeln!(
        out,
        "policy: {} (max-answers {}, local-min-healthy {}, fail-open {})",
        b.policy,
        if b.max_answers == 0 { "all".to_owned() } else { b.max_answers.to_string() },
        b.min_healthy,
        b.fail_open
    );
    let bounded = b.applied_boundary() != Boundary::None;
    let _ = writeln!(out, "{}", boundary_line(snap, b, client));
    let drawn = decision.as_ref().and_then(|(_, d)| d.drawn);
    let _ = writeln!(out, "candidates ({}):", b.endpoints.len());
    for (i, e) in b.endpoints.iter().enumerate() {
        let c = &b.clusters[usize::from(e.cluster)];
        let addrs: Vec<String> = names.endpoint_addresses(e).map(|a| a.to_string()).collect();
        let _ = writeln!(
            out,
            "  {:<28} cluster {:<12} zone {:<12} {:<9} tier {:<7} weight {} [{}]",
            names.endpoint_label(e),
            c.name.as_str(),
            e.zone.and_then(|z| snap.topology_zone(z)).unwrap_or("-"),
            if b.healthy[i] { "healthy" } else { "UNHEALTHY" },
            if bounded && !select::inside(b, i, client) {
                "outside".to_owned()
            } else {
                select::tier(b, i, client, drawn).to_string()
            },
            c.weight,
            addrs.join(" ")
        );
    }
    match decision {
        None if bounded
            && !(0..b.endpoints.len())
                .any(|i| b.endpoints[i].records[fam].1 > 0 && select::inside(b, i, client)) =>
        {
            let _ = writeln!(
                out,
                "decision: no ready endpoint inside the {} boundary: NODATA",
                b.applied_boundary()
            );
        }
        None if bounded => {
            let _ = writeln!(out, "decision: nothing healthy inside the boundary and fail-open off: NODATA");
        }
        None => {
            let _ = writeln!(out, "decision: nothing healthy and fail-open off: NODATA");
        }
        Some((pick, d)) => {
            let _ = writeln!(
                out,
                "decision: query #{} of this family; eligible per tier {:?}; answering {} tier(s), {} endpoint(s){}{}; {:?}",
                d.seq,
                d.tiers,
                d.answered_tiers,
                d.endpoints,
                drawn
                    .map(|c| format!("; weighted draw: {}", b.clusters[usize::from(c)].name))
                    .unwrap_or_default(),
                match (d.failed_open, bounded) {
                    (true, true) => "; none healthy inside the boundary: fail-open answers those inside",
                    (true, false) => "; none healthy: fail-open answers all",
                    _ => "",
                },
                pick
            );
        }
    }
}
