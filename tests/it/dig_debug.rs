//! Debugging with `dig` alone: which server answered (CHAOS TXT
//! `id.server.`, `hostname.bind.`, `version.server.`, `version.bind.`, RFC
//! 4892, and NSID, RFC 5001, so two replicas behind one Service can be told
//! apart), how it would answer a name and why (`dig CH TXT <name>`), and
//! what it knows of the asker (`dig CH TXT whoami.<zone>`).

use std::net::IpAddr;
use std::process::Command;

use crate::fleet::metric;
use crate::harness::http::{http_get_from, metric_value};
use crate::harness::served::Served;
use crate::harness::{BIN, served::dig};

#[test]
fn chaos_txt_names_give_the_server_id_and_version_over_udp_and_tcp() {
    let s = Served::start(&["--server-id", "replica-1"]);
    for transport in ["+notcp", "+tcp"] {
        for name in ["id.server", "hostname.bind", "ID.Server"] {
            assert_eq!(s.dig(&["CH", "TXT", name, "+short", transport]).trim(), "\"replica-1\"", "{name}");
        }
        let version = format!("\"clusterset-dns {}\"", env!("CARGO_PKG_VERSION"));
        for name in ["version.server", "version.bind"] {
            assert_eq!(s.dig(&["CH", "TXT", name, "+short", transport]).trim(), version, "{name}");
        }
    }
    let full = s.dig(&["CH", "TXT", "id.server"]);
    assert!(full.contains("status: NOERROR") && full.contains("flags: qr aa"), "{full}");
    assert!(full.contains("id.server.\t\t0\tCH\tTXT\t\"replica-1\""), "{full}");
    // Other CHAOS names are not ours.
    assert!(s.dig(&["CH", "TXT", "authors.bind"]).contains("status: REFUSED"));
    // Names of the zone in CHAOS are debug queries (explained below).
    assert!(s.dig(&["CH", "TXT", "web.shop.svc.clusterset.local", "+short"]).starts_with("\"query: "));
    assert!(s.dig(&["CH", "A", "web.shop.svc.clusterset.local"]).contains("status: REFUSED"), "TXT only");
}

#[test]
fn hide_version_refuses_the_version_and_keeps_the_id() {
    let s = Served::start(&["--server-id", "replica-2", "--hide-version"]);
    assert!(s.dig(&["CH", "TXT", "version.bind"]).contains("status: REFUSED"));
    assert!(s.dig(&["CH", "TXT", "version.server"]).contains("status: REFUSED"));
    assert_eq!(s.dig(&["CH", "TXT", "id.server", "+short"]).trim(), "\"replica-2\"");
}

#[test]
fn nsid_tells_two_replicas_apart_and_defaults_to_the_pod_name() {
    let a = Served::start_env("serve", &[], &[("HOSTNAME", "clusterset-dns-7d9f8-abcde")]);
    let b = Served::start_env("serve", &[], &[("HOSTNAME", "clusterset-dns-7d9f8-xyz12")]);
    for (s, id) in [(&a, "clusterset-dns-7d9f8-abcde"), (&b, "clusterset-dns-7d9f8-xyz12")] {
        let out = s.dig(&["web.shop.svc.clusterset.local", "A", "+nsid"]);
        assert!(out.contains("; NSID: ") && out.contains(&format!("(\"{id}\")")), "{out}");
        assert!(out.contains("10.42.0.10"), "the answer is unchanged: {out}");
        // Not asked, not sent.
        assert!(!s.dig(&["web.shop.svc.clusterset.local", "A"]).contains("NSID"));
        assert_eq!(s.dig(&["CH", "TXT", "hostname.bind", "+short"]).trim(), format!("\"{id}\""));
    }
}

#[test]
fn ch_txt_of_a_name_explains_its_answer_to_the_asker() {
    let s = Served::start(&[
        "--client-cluster",
        "127.0.0.0/8=cluster-a/eu-west-1a",
        "--answer-policy",
        "local-first",
    ]);
    let out = s.dig(&["CH", "TXT", "db.shop.svc.clusterset.local", "+short", "+tcp"]);
    let lines: Vec<&str> = out.lines().map(|l| l.trim_matches('"')).collect();
    assert_eq!(
        lines[0], "query: db.shop.svc.clusterset.local. A from 127.0.0.1 (cluster cluster-a)",
        "{out}"
    );
    assert!(lines[1].starts_with("policy: local-first"), "{out}");
    assert!(lines.contains(&"candidates (3):"), "{out}");
    assert!(lines.iter().any(|l| l.starts_with("decision: ")), "{out}");
    assert!(lines.contains(&"answer: NoError"), "{out}");
    // The answer the asker itself gets: cluster-a's endpoints only (local-first).
    let answer = s.dig(&["db.shop.svc.clusterset.local", "A", "+short"]);
    for address in answer.lines() {
        assert!(lines.iter().any(|l| l.ends_with(&format!(" IN A {address}"))), "{address} in {out}");
    }
    // Over UDP without EDNS it is cut at whole strings, with TC.
    let udp = s.dig(&["CH", "TXT", "db.shop.svc.clusterset.local", "+noedns", "+ignore"]);
    assert!(udp.contains("flags: qr aa tc"), "{udp}");
    let cut = udp.lines().filter(|l| l.contains("\tCH\tTXT\t\"")).count();
    assert!(cut > 0 && cut < lines.len(), "{cut} of {} strings over UDP", lines.len());
}

/// `clusterset-dns explain --type` takes a type's name in any letter case,
/// as the server does, and the report is for that type.
#[test]
fn explain_asks_for_the_type_given() {
    let s = Served::start(&[]);
    s.wait_ready(std::time::Duration::from_secs(20));
    let out = Command::new(BIN)
        .args(["explain", "web.shop.svc.clusterset.local", "--type", "aaaa", "--server", &s.http.to_string()])
        .output()
        .expect("run clusterset-dns explain");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(report.starts_with("query: web.shop.svc.clusterset.local. AAAA"), "{report}");
}

#[test]
fn whoami_says_what_the_server_attributes_to_the_asker() {
    let s = Served::start(&["--client-cluster", "127.0.0.0/8=cluster-a/eu-west-1a"]);
    let plain = s.dig(&["CH", "TXT", "whoami.clusterset.local", "+short"]);
    assert_eq!(plain, "\"address 127.0.0.1\"\n\"cluster cluster-a\"\n\"zone eu-west-1a\"\n");
    let ecs = s.dig(&["CH", "TXT", "whoami.clusterset.local", "+short", "+subnet=198.51.100.0/24"]);
    assert!(ecs.contains("\"ecs 198.51.100.0/24\"") && ecs.contains("\"cluster (unknown)\""), "{ecs}");
}

/// Issue 40: a sender outside `--trust-ecs-from` reads that its subnet was
/// ignored and is answered as its own address; an operator sees it in
/// `clusterset_dns_ecs_queries_total` and in one log line.
#[test]
fn an_ignored_client_subnet_is_shown_counted_and_logged_once() {
    let s = Served::start(&[
        "--trust-ecs-from",
        "127.0.0.1",
        "--allow-debug",
        "127.0.0.0/8",
        "--client-cluster",
        "198.51.100.0/24=cluster-b",
    ]);
    let whoami = |from: &str| {
        let args = ["-b", from, "CH", "TXT", "whoami.clusterset.local", "+short", "+subnet=198.51.100.0/24"];
        dig(s.addr, &args)
    };
    let trusted = whoami("127.0.0.1");
    assert!(
        trusted.contains("\"ecs 198.51.100.0/24\"") && trusted.contains("\"cluster cluster-b\""),
        "{trusted}"
    );
    for _ in 0..3 {
        let spoofed = whoami("127.0.0.2");
        assert!(
            spoofed.contains("\"ecs 198.51.100.0/24 ignored: the sender is not in --trust-ecs-from\""),
            "{spoofed}"
        );
        assert!(
            spoofed.contains("\"address 127.0.0.2\"") && spoofed.contains("\"cluster (unknown)\""),
            "{spoofed}"
        );
    }
    let series = |result: &str| {
        format!("clusterset_dns_ecs_queries_total{{result=\"{result}\",server=\"dns://{}\"}}", s.addr)
    };
    // UDP workers add their counts at most about once a second.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while metric(&s, &series("ignored")) != Some(3.0) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(metric(&s, &series("ignored")), Some(3.0));
    assert_eq!(metric(&s, &series("believed")), Some(1.0));
    let warned = s.log().lines().filter(|l| l.contains("outside --trust-ecs-from was ignored")).count();
    assert_eq!(warned, 1, "{}", s.log());
}

#[test]
fn debug_queries_from_clients_not_allowed_are_refused_and_counted() {
    let s = Served::start(&["--allow-debug", "192.0.2.0/24"]);
    assert!(s.dig(&["CH", "TXT", "web.shop.svc.clusterset.local"]).contains("status: REFUSED"));
    assert!(s.dig(&["CH", "TXT", "whoami.clusterset.local"]).contains("status: REFUSED"));
    let server = format!("dns://{}", s.addr);
    let refused = format!("clusterset_dns_debug_queries_total{{result=\"refused\",server=\"{server}\"}}");
    // UDP workers add their counts at most about once a second.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while metric(&s, &refused) != Some(2.0) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(metric(&s, &refused), Some(2.0));
    // Ordinary queries are untouched.
    assert_eq!(s.dig(&["web.shop.svc.clusterset.local", "A", "+short"]).trim(), "10.42.0.10");
}

/// `--allow-debug` is one rule for every debug door: HTTP `/debug/` is
/// refused (403, naming the flag, counted) to the peers whose DNS debug
/// names are refused, and answered to those allowed; `/metrics`, `/health`
/// and `/ready` stay open to everyone.
#[test]
fn http_debug_follows_allow_debug_like_the_dns_names_and_the_rest_stays_open() {
    let s = Served::start(&["--allow-debug", "127.0.0.2/32"]);
    s.wait_ready(std::time::Duration::from_secs(20));
    let (outside, inside): (IpAddr, IpAddr) = ([127, 0, 0, 1].into(), [127, 0, 0, 2].into());
    let explain = "/debug/explain?name=web.shop.svc.clusterset.local";

    let (status, body) = http_get_from(outside, s.http, explain);
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("--allow-debug") && body.contains("127.0.0.1"), "{body}");
    assert!(!body.contains("query:"), "the report leaked: {body}");
    // The same peer over DNS: refused by the same rule.
    let dns = dig(s.addr, &["-b", "127.0.0.1", "CH", "TXT", "whoami.clusterset.local"]);
    assert!(dns.contains("status: REFUSED"), "{dns}");
    // What a user of `clusterset-dns explain` from there reads.
    let out = Command::new(BIN)
        .args(["explain", "web.shop.svc.clusterset.local", "--server", &s.http.to_string()])
        .output()
        .expect("run clusterset-dns explain");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("403") && err.contains("--allow-debug"), "{err}");

    let (status, body) = http_get_from(inside, s.http, explain);
    assert_eq!(status, 200, "{body}");
    assert!(body.starts_with("query: web.shop.svc.clusterset.local. A"), "{body}");
    // The per-service metrics too: refused outside, answered inside.
    let (status, body) = http_get_from(outside, s.http, "/debug/metrics");
    assert_eq!(status, 403, "{body}");
    assert!(!body.contains("clusterset_dns_endpoints"), "{body}");
    let (status, body) = http_get_from(inside, s.http, "/debug/metrics");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("clusterset_dns_endpoints{"), "{body}");
    let dns = dig(s.addr, &["-b", "127.0.0.2", "CH", "TXT", "whoami.clusterset.local", "+short"]);
    assert!(dns.contains("\"address 127.0.0.2\""), "{dns}");

    for path in ["/metrics", "/health", "/ready"] {
        let (status, body) = http_get_from(outside, s.http, path);
        assert_eq!(status, 200, "{path} from {outside}: {body}");
    }
    let scrape = http_get_from(outside, s.http, "/metrics").1;
    let series = |result: &str| format!("clusterset_dns_http_debug_requests_total{{result=\"{result}\"}}");
    assert_eq!(metric_value(&scrape, &series("refused")), Some(3.0), "{scrape}");
    assert_eq!(metric_value(&scrape, &series("answered")), Some(2.0), "{scrape}");
    // And the DNS family counted its own (UDP workers add theirs about
    // once a second).
    let server = format!("dns://{}", s.addr);
    let dns_refused = format!("clusterset_dns_debug_queries_total{{result=\"refused\",server=\"{server}\"}}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while metric(&s, &dns_refused) != Some(1.0) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(metric(&s, &dns_refused), Some(1.0));
}
