//! Zone transfer (RFC 5936 AXFR; IXFR answered in full, RFC 1995 §4) over
//! TCP, against a real server: `dig axfr clusterset.local` lists every name
//! and record the server answers, the SOA first and last, from one
//! snapshot, in as many messages as the zone needs; only `--allow-transfer`
//! clients get it.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use hickory_proto::op::{Message, ResponseCode};
use hickory_proto::rr::{Record, RecordType};

use crate::harness::served::Served;
use crate::support::{TestServer, decode, many_services, q, read_frame, udp_raw};

/// Sends `query` over one TCP connection and reads messages until the
/// second SOA (the transfer's end), a non-NOERROR message, or 10 s.
fn transfer(addr: SocketAddr, query: &Message) -> Vec<Message> {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let bytes = query.to_vec().expect("encode");
    let mut framed = (bytes.len() as u16).to_be_bytes().to_vec();
    framed.extend_from_slice(&bytes);
    s.write_all(&framed).expect("write");
    let mut messages = Vec::new();
    let mut soas = 0;
    while let Some(frame) = read_frame(&mut s) {
        assert!(frame.len() <= 65535);
        let m = decode(&frame);
        soas += m.answers.iter().filter(|r| r.record_type() == RecordType::SOA).count();
        let done = m.metadata.response_code != ResponseCode::NoError || soas >= 2;
        messages.push(m);
        if done {
            break;
        }
    }
    messages
}

/// Every record of a complete transfer, checked for the RFC 5936 shape:
/// the query's ID on every message, the question in the first, the SOA
/// first and last and nowhere else.
fn records(messages: &[Message], id: u16) -> Vec<Record> {
    assert!(!messages.is_empty(), "no message");
    for (i, m) in messages.iter().enumerate() {
        assert_eq!(m.metadata.id, id, "message {i}");
        assert_eq!(m.metadata.response_code, ResponseCode::NoError, "message {i}");
        assert!(m.metadata.authoritative, "message {i}");
    }
    assert_eq!(messages[0].queries.len(), 1, "the question in the first message");
    let all: Vec<Record> = messages.iter().flat_map(|m| m.answers.iter().cloned()).collect();
    let soa = |r: &Record| r.record_type() == RecordType::SOA;
    assert!(all.len() >= 2 && soa(&all[0]) && soa(&all[all.len() - 1]), "SOA first and last");
    assert_eq!(all[0], all[all.len() - 1], "the same SOA opens and closes it");
    assert_eq!(all.iter().filter(|r| soa(r)).count(), 2, "no other SOA");
    all
}

#[test]
fn axfr_lists_every_record_the_server_answers_between_two_soas() {
    let s = TestServer::embedded();
    let query = q("clusterset.local.", "AXFR").no_edns();
    let messages = transfer(s.addr, &query.msg);
    assert!(messages.iter().all(|m| m.edns.is_none()), "no OPT asked, none sent");
    let all = records(&messages, query.msg.metadata.id);
    // Grouped into RRsets; each is exactly what a query for it answers
    // (the default policies answer every endpoint, in rotating order).
    let mut sets: BTreeMap<(String, RecordType), BTreeSet<String>> = BTreeMap::new();
    for r in &all[1..all.len() - 1] {
        assert_eq!(r.dns_class, hickory_proto::rr::DNSClass::IN);
        sets.entry((r.name.to_string(), r.record_type())).or_default().insert(r.data.to_string());
    }
    let names: BTreeSet<&str> = sets.keys().map(|(n, _)| n.as_str()).collect();
    for name in [
        "clusterset.local.",
        "dns-version.clusterset.local.",
        "web.shop.svc.clusterset.local.",
        "_http._tcp.web.shop.svc.clusterset.local.",
        "db-0.cluster-a.db.shop.svc.clusterset.local.",
        "10-3-0-10.cluster-c.eu.cache.shop.svc.clusterset.local.",
    ] {
        assert!(names.contains(name), "{name} missing from {names:?}");
    }
    for ((name, rtype), rdata) in &sets {
        let m = q(name, &rtype.to_string()).tcp(s.addr);
        assert_eq!(m.metadata.response_code, ResponseCode::NoError, "{name} {rtype}");
        let answered: BTreeSet<String> = m.answers.iter().map(|r| r.data.to_string()).collect();
        assert_eq!(&answered, rdata, "{name} {rtype}: transferred and answered differ");
    }
    // IXFR gets the same, whole (no history to send increments from).
    let ixfr = q("clusterset.local.", "IXFR").no_edns();
    assert_eq!(records(&transfer(s.addr, &ixfr.msg), ixfr.msg.metadata.id), all);
}

#[test]
fn a_10000_service_zone_transfers_completely_in_several_messages() {
    const N: usize = 10_000;
    let s = TestServer::start(&[("many.yaml", &many_services(N))], &[]);
    let query = q("clusterset.local.", "AXFR");
    let messages = transfer(s.addr, &query.msg);
    assert!(messages.len() > 1, "{} messages", messages.len());
    // The query had an OPT: so has every message (RFC 6891 §7).
    assert!(messages.iter().all(|m| m.edns.is_some()), "an OPT in every message");
    let all = records(&messages, query.msg.metadata.id);
    // Per service: the A of its VIP, the SRV of the bare name and of
    // `_http._tcp`; then the apex SOA twice, its NS and dns-version's TXT.
    assert_eq!(all.len(), 3 * N + 4, "records");
    let vips: BTreeMap<String, String> = all
        .iter()
        .filter(|r| r.record_type() == RecordType::A)
        .map(|r| (r.name.to_string(), r.data.to_string()))
        .collect();
    assert_eq!(vips.len(), N);
    for i in [0, 1, 4242, N - 1] {
        let name = format!("svc-{i}.ns-{}.svc.clusterset.local.", i / 100);
        let ip = format!("10.{}.{}.{}", 100 + i / 65536, (i / 256) % 256, i % 256);
        assert_eq!(vips.get(&name), Some(&ip), "{name}");
    }
}

#[test]
fn transfers_outside_the_allow_list_are_refused_and_counted() {
    let s = Served::start(&["--allow-transfer", "192.0.2.0/24", "--allow-transfer", "2001:db8::/32"]);
    let out = s.dig(&["axfr", "clusterset.local"]);
    assert!(out.contains("Transfer failed"), "{out}");
    let m = q("clusterset.local.", "IXFR").tcp(s.addr);
    assert_eq!(m.metadata.response_code, ResponseCode::Refused);
    let scrape = s.get("/metrics").1;
    let count = |result: &str| -> f64 {
        let prefix = format!("clusterset_dns_transfers_total{{result=\"{result}\",");
        scrape
            .lines()
            .filter(|l| l.starts_with(&prefix))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    assert_eq!(count("refused"), 2.0, "{scrape}");
    assert_eq!(count("streamed"), 0.0, "{scrape}");
}

#[test]
fn dig_axfr_from_loopback_gets_the_zone_by_default() {
    let s = Served::start(&[]);
    let out = s.dig(&["axfr", "clusterset.local"]);
    let soa = out.lines().filter(|l| l.contains("\tSOA\t")).count();
    assert_eq!(soa, 2, "{out}");
    assert!(out.contains(";; XFR size: "), "{out}");
    assert!(out.lines().any(|l| l.starts_with("web.shop.svc.clusterset.local.") && l.contains("\tA\t")));
    // A name below the apex is not a zone: refused, as before.
    let below = q("shop.svc.clusterset.local.", "AXFR").tcp(s.addr);
    assert_eq!(below.metadata.response_code, ResponseCode::Refused);
}

#[test]
fn over_udp_ixfr_gets_the_soa_alone_and_axfr_formerr() {
    let s = TestServer::embedded();
    let m = decode(&udp_raw(s.addr, &q("clusterset.local.", "IXFR").bytes()).expect("IXFR response"));
    assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    assert_eq!(m.answers.len(), 1);
    assert_eq!(m.answers[0].record_type(), RecordType::SOA, "ask again over TCP (RFC 1995 §2)");
    let m = decode(&udp_raw(s.addr, &q("clusterset.local.", "AXFR").bytes()).expect("AXFR response"));
    assert_eq!(m.metadata.response_code, ResponseCode::FormErr, "AXFR has no UDP form");
    assert!(m.answers.is_empty());
}
