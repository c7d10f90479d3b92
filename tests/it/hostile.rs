//! Malformed and hostile packets, byte by byte, over UDP and TCP: each shape
//! the audit of the query path found gets the answer the RFCs give it
//! (FORMERR, or no answer at all), and the same worker answers a good query
//! right after it. Every shape here is also a fuzz seed (`fuzz/seeds/`).

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use crate::support::{TestServer, decode, q, read_frame, tcp_raw, udp_raw};

/// `web.shop.svc.clusterset.local.` in wire form.
const QNAME: &[u8] = b"\x03web\x04shop\x03svc\x0aclusterset\x05local\x00";

/// A query: header (one question, `ar` additional records), QNAME, type A,
/// class IN, then `tail` as it is.
fn packet(qname: &[u8], ar: u16, tail: &[u8]) -> Vec<u8> {
    let mut p = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0];
    p.extend_from_slice(&ar.to_be_bytes());
    p.extend_from_slice(qname);
    p.extend_from_slice(&[0, 1, 0, 1]);
    p.extend_from_slice(tail);
    p
}

/// An OPT record for the root (payload 1232, version 0) whose RDATA is
/// `rdata`, with RDLENGTH `rdlen` (normally `rdata.len()`).
fn opt(rdlen: u16, rdata: &[u8]) -> Vec<u8> {
    let mut o = vec![0, 0, 41, 0x04, 0xd0, 0, 0, 0, 0];
    o.extend_from_slice(&rdlen.to_be_bytes());
    o.extend_from_slice(rdata);
    o
}

/// One EDNS option: code, length, data.
fn option(code: u16, data: &[u8]) -> Vec<u8> {
    let mut o = code.to_be_bytes().to_vec();
    o.extend_from_slice(&(data.len() as u16).to_be_bytes());
    o.extend_from_slice(data);
    o
}

/// The response code of a response, extended RCODE included.
fn rcode(resp: &[u8]) -> u16 {
    u16::from(decode(resp).metadata.response_code)
}

const FORMERR: u16 = 1;

/// An A record for the root, TTL 0, 192.0.2.1: an additional record that
/// makes the in-place reader hand the query to hickory-proto.
const SOME_A: [u8; 15] = [0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 4, 192, 0, 2, 1];

/// Sends `bytes` over UDP and over TCP, expects `want` (a response code, or
/// no response), then checks a good query is answered over both.
#[track_caller]
fn expect(addr: SocketAddr, what: &str, bytes: &[u8], want: Option<u16>) {
    for (transport, got) in [("UDP", udp_raw(addr, bytes)), ("TCP", tcp_raw(addr, bytes))] {
        match (want, got) {
            (None, None) => {}
            (None, Some(r)) => panic!("{what} over {transport}: answered {r:02x?}, expected no response"),
            (Some(_), None) => panic!("{what} over {transport}: no response"),
            (Some(code), Some(r)) => {
                assert_eq!(rcode(&r), code, "{what} over {transport}");
                assert_eq!(&r[..2], &bytes[..2], "{what} over {transport}: the id is echoed");
            }
        }
    }
    still_answers(addr, what);
}

#[track_caller]
fn still_answers(addr: SocketAddr, after: &str) {
    let good = q("web.shop.svc.clusterset.local.", "A");
    assert!(!good.udp(addr).answers.is_empty(), "UDP answers after {after}");
    assert!(!good.tcp(addr).answers.is_empty(), "TCP answers after {after}");
}

#[test]
fn the_client_subnet_option_that_killed_a_worker_gets_formerr() {
    let s = TestServer::embedded();
    // FAMILY 1, SOURCE PREFIX-LENGTH 24, and nothing more: 3 bytes.
    let bytes = packet(QNAME, 1, &opt(7, &option(8, &[0x00, 0x01, 0x18])));
    for _ in 0..5 {
        expect(s.addr, "ECS of 3 bytes", &bytes, Some(FORMERR));
    }
}

#[test]
fn client_subnet_options_of_every_length_up_to_20_are_answered_or_formerr() {
    let s = TestServer::embedded();
    for len in 0..=20usize {
        // FAMILY 1, SOURCE 0, SCOPE 0, then address bytes: valid only at 4
        // bytes (a /0 needs none), FORMERR otherwise, never a panic.
        let data: Vec<u8> = [0u8, 1, 0, 0].into_iter().chain((1..=16u8).map(|b| b * 7)).take(len).collect();
        let bytes = packet(QNAME, 1, &opt(4 + len as u16, &option(8, &data)));
        let want = if len == 4 { 0 } else { FORMERR };
        expect(s.addr, &format!("ECS of {len} bytes"), &bytes, Some(want));
    }
}

#[test]
fn cookie_options_of_every_length_are_answered_or_formerr() {
    let s = TestServer::embedded();
    for len in 0..=48usize {
        // RFC 7873 §5.2.2: a client cookie (8) and a server cookie (8-32).
        let data: Vec<u8> = (0..len as u8).collect();
        let bytes = packet(QNAME, 1, &opt(4 + len as u16, &option(10, &data)));
        let want = if len == 8 || (16..=40).contains(&len) { 0 } else { FORMERR };
        expect(s.addr, &format!("COOKIE of {len} bytes"), &bytes, Some(want));
    }
}

#[test]
fn edns_records_that_overrun_their_bounds_get_formerr() {
    let s = TestServer::embedded();
    let ecs = option(8, &[0, 1, 24, 0, 198, 51, 100]);
    let shapes: Vec<(&str, Vec<u8>)> = vec![
        ("OPT RDLENGTH past the end", packet(QNAME, 1, &opt(200, &ecs))),
        ("option length past RDATA", packet(QNAME, 1, &opt(4, &option(8, &[0; 8])[..4]))),
        ("option header cut short", packet(QNAME, 1, &opt(3, &[0, 8, 0]))),
        ("OPT cut inside its fixed part", packet(QNAME, 1, &[0, 0, 41, 0x04, 0xd0, 0])),
        ("ECS family 3", packet(QNAME, 1, &opt(8, &option(8, &[0, 3, 0, 0])))),
        // Two additional records send the query down the slow path
        // (hickory-proto), where COOKIE's length is checked by us.
        (
            "COOKIE of 9 bytes, slow path",
            packet(QNAME, 2, &[&SOME_A[..], &opt(13, &option(10, &[7; 9]))].concat()),
        ),
        (
            "ECS of 3 bytes, slow path",
            packet(QNAME, 2, &[&SOME_A[..], &opt(7, &option(8, &[0, 1, 24]))].concat()),
        ),
        ("ECS /33 for IPv4", packet(QNAME, 1, &opt(13, &option(8, &[0, 1, 33, 0, 1, 2, 3, 4, 5])))),
        // Found by the differential fuzz target: only the first ECS option
        // used to be checked.
        ("a valid ECS, then one of family 0x2121", {
            let rdata = [option(8, &[0, 1, 24, 0, 198, 51, 100]), option(8, &[0x21, 0x21, 0, 0])].concat();
            packet(QNAME, 1, &opt(rdata.len() as u16, &rdata))
        }),
    ];
    for (what, bytes) in shapes {
        expect(s.addr, what, &bytes, Some(FORMERR));
    }
}

/// Issue 40: the Client Subnet shapes RFC 7871 names, each as it says,
/// on the in-place reader and on hickory-proto's (the slow path: a second
/// additional record). FORMERR (§7.2.1: a wrongly formatted option is
/// rejected; §6 names how) for a prefix longer than its family's
/// addresses, address bytes of another family, a family other than 1 or 2,
/// and a SCOPE PREFIX-LENGTH set in a query (§6: it MUST be 0 there); an
/// answer for a SOURCE PREFIX-LENGTH of 0 (§7.1.2: the client asks that no
/// address be used) in either family, and for an IPv6 subnet sent over
/// IPv4.
#[test]
fn client_subnets_get_what_rfc_7871_says() {
    let s = TestServer::embedded();
    let ecs = |data: &[u8]| option(8, data);
    let fast = |data: &[u8]| packet(QNAME, 1, &opt(4 + data.len() as u16, &ecs(data)));
    let slow =
        |data: &[u8]| packet(QNAME, 2, &[&SOME_A[..], &opt(4 + data.len() as u16, &ecs(data))].concat());
    let v6_129: Vec<u8> = [0, 2, 129, 0].into_iter().chain([0x20; 17]).collect();
    let v4_with_v6_bytes: Vec<u8> = [0, 1, 32, 0].into_iter().chain([0x20; 16]).collect();
    let shapes: [(&str, Vec<u8>, Option<u16>); 9] = [
        ("IPv4 /33", vec![0, 1, 33, 0, 1, 2, 3, 4, 5], Some(FORMERR)),
        ("IPv6 /129", v6_129, Some(FORMERR)),
        ("FAMILY 1 with an IPv6 address", v4_with_v6_bytes, Some(FORMERR)),
        ("FAMILY 0", vec![0, 0, 0, 0], Some(FORMERR)),
        ("SCOPE 24 in a query", vec![0, 1, 24, 24, 198, 51, 100], Some(FORMERR)),
        ("SCOPE 1 with SOURCE 0", vec![0, 1, 0, 1], Some(FORMERR)),
        ("IPv4 SOURCE 0", vec![0, 1, 0, 0], Some(0)),
        ("IPv6 SOURCE 0", vec![0, 2, 0, 0], Some(0)),
        ("IPv6 /24 over IPv4", vec![0, 2, 24, 0, 0x20, 0x01, 0x0d], Some(0)),
    ];
    for (what, data, want) in shapes {
        expect(s.addr, what, &fast(&data), want);
        expect(s.addr, &format!("{what}, slow path"), &slow(&data), want);
    }
}

#[test]
fn broken_questions_get_formerr_and_responses_get_nothing() {
    let s = TestServer::embedded();
    let mut long = Vec::new();
    for _ in 0..4 {
        long.extend_from_slice(&[63]);
        long.extend_from_slice(&[b'a'; 63]);
    }
    long.push(0);
    let mut response = packet(QNAME, 0, &[]);
    response[2] |= 0x80;
    let shapes: Vec<(&str, Vec<u8>, Option<u16>)> = vec![
        ("a label running past the end", packet(b"\x3fweb", 0, &[]), Some(FORMERR)),
        ("QNAME without QTYPE", packet(QNAME, 0, &[])[..12 + QNAME.len() + 2].to_vec(), Some(FORMERR)),
        ("a 257-byte QNAME", packet(&long, 0, &[]), Some(FORMERR)),
        // A compression pointer to itself (the slow path's parser).
        ("a pointer loop in QNAME", packet(b"\xc0\x0c", 0, &[]), Some(FORMERR)),
        ("a pointer past the end", packet(b"\xc0\xff", 0, &[]), Some(FORMERR)),
        ("no question at all", vec![0x12, 0x34, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0], Some(FORMERR)),
        (
            "QDCOUNT 2, one question",
            packet(QNAME, 0, &[]).into_iter().enumerate().map(|(i, b)| if i == 5 { 2 } else { b }).collect(),
            Some(FORMERR),
        ),
        ("a response (QR set)", response, None),
        ("11 bytes", vec![0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0], None),
    ];
    for (what, bytes, want) in shapes {
        expect(s.addr, what, &bytes, want);
    }
}

#[test]
fn tcp_framing_edge_cases_leave_the_connection_or_the_server_usable() {
    let s = TestServer::embedded();
    let good = q("web.shop.svc.clusterset.local.", "A").bytes();
    let frame = |b: &[u8]| {
        let mut f = (b.len() as u16).to_be_bytes().to_vec();
        f.extend_from_slice(b);
        f
    };
    // A zero-length message gets no response; the next one on the same
    // connection is answered.
    let mut c = TcpStream::connect(s.addr).expect("connect");
    c.set_read_timeout(Some(Duration::from_secs(2))).expect("timeout");
    c.write_all(&frame(&[])).expect("write");
    c.write_all(&frame(&good)).expect("write");
    let r = read_frame(&mut c).expect("the message after the empty one is answered");
    assert_eq!(&r[..2], &good[..2]);
    // A length prefix promising more than ever comes, then a half-close:
    // the connection ends without a response.
    let mut c = TcpStream::connect(s.addr).expect("connect");
    c.set_read_timeout(Some(Duration::from_secs(2))).expect("timeout");
    c.write_all(&[0xff, 0xff, 1, 2, 3]).expect("write");
    c.shutdown(std::net::Shutdown::Write).expect("half-close");
    assert!(read_frame(&mut c).is_none(), "nothing answers a message that never completed");
    // One byte of a length prefix, then a half-close.
    let mut c = TcpStream::connect(s.addr).expect("connect");
    c.set_read_timeout(Some(Duration::from_secs(2))).expect("timeout");
    c.write_all(&[0x00]).expect("write");
    c.shutdown(std::net::Shutdown::Write).expect("half-close");
    assert!(read_frame(&mut c).is_none());
    still_answers(s.addr, "TCP framing edge cases");
}
