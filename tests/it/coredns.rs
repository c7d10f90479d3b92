//! clusterset-dns behind a real CoreDNS, as a cluster runs it: `dig` →
//! CoreDNS (stock 1.12.4 from `scripts/k8s-bins.sh coredns`, running the
//! server block of `Corefile.example`) → `forward` → the `clusterset-dns`
//! binary, fed by a real kube-apiserver (`harness::clusters::shared()`).
//!
//! What CoreDNS 1.12.4 does that these tests pin down (plugin/forward,
//! plugin/cache, request/ of its source):
//! - `forward` asks upstream over the client's transport and hands a
//!   truncated (TC) answer to the client unchanged; the client's TCP retry
//!   is forwarded over TCP. Only with `prefer_udp` does forward itself
//!   retry over TCP.
//! - `cache` never stores truncated answers, keeps a negative answer for
//!   the TTL of the SOA in it (at least 5 s), and serves a stored answer to
//!   a UDP client cut down to the client's buffer.
//! - Health checks (`. IN NS`) run only after a forwarded query failed,
//!   every `health_check` interval until one gets any reply; our REFUSED
//!   counts as healthy.

use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::harness::clusters::shared;
pub(crate) use crate::harness::coredns::{coredns_bin, free_port};
use crate::harness::eventually;
use crate::harness::process::capture_output;
use crate::harness::served::Served;
use crate::watch::{Kube, headless, runtime, vip};

/// The forward target in `Corefile.example`, replaced by the server's address.
pub(crate) const PLACEHOLDER: &str = "CLUSTERSET_DNS_SERVICE_IP";

// ---------------------------------------------------------------------------
// The tests

#[test]
fn answers_pass_through_coredns_unchanged() {
    let ns = "coredns-e2e";
    let rt = runtime();
    rt.block_on(async {
        let k = Kube::new(shared().client(0).await, ns).await;
        k.import("web", vip(&["10.90.0.1", "fd00:90::1"])).await;
        k.import("v4only", vip(&["10.90.0.2"])).await;
        k.import("db", headless()).await;
        k.slice("db-a", "db", "cluster-a", json!([{"addresses": ["10.91.0.1"], "hostname": "db-0"}]), None)
            .await;
    });
    let s = serve(0, ns);
    let c = CoreDns::start(s.addr, &[]);
    let zone = format!("{ns}.svc.clusterset.local");

    let a = c.dig(&[&format!("web.{zone}"), "A"]);
    assert_eq!((a.status.as_str(), a.rdata("A")), ("NOERROR", vec!["10.90.0.1".to_owned()]), "{}", a.text);
    assert!(a.flags.iter().any(|f| f == "aa"), "the AA bit passes through: {}", a.text);
    assert!(a.answer.iter().all(|r| r.ttl <= 5), "{}", a.text);
    let aaaa = c.dig(&[&format!("web.{zone}"), "AAAA"]);
    assert_eq!(aaaa.rdata("AAAA"), ["fd00:90::1"], "{}", aaaa.text);
    let srv = c.dig(&[&format!("_http._tcp.web.{zone}"), "SRV"]);
    assert_eq!(srv.rdata("SRV"), [format!("0 100 80 web.{zone}.")], "{}", srv.text);
    let srv = c.dig(&[&format!("_http._tcp.db.{zone}"), "SRV"]);
    assert_eq!(srv.rdata("SRV"), [format!("0 100 8080 db-0.cluster-a.db.{zone}.")], "{}", srv.text);
    let host = c.dig(&[&format!("db-0.cluster-a.db.{zone}"), "A"]);
    assert_eq!(host.rdata("A"), ["10.91.0.1"], "{}", host.text);
    let txt = c.dig(&["dns-version.clusterset.local", "TXT"]);
    assert_eq!(txt.rdata("TXT"), ["\"1.0.0\""], "{}", txt.text);

    // NXDOMAIN: the SOA in authority, cacheable for the SOA minimum (5 s).
    let nx = c.dig(&[&format!("nope.{zone}"), "A"]);
    assert_eq!(nx.status, "NXDOMAIN", "{}", nx.text);
    assert!(nx.answer.is_empty(), "{}", nx.text);
    assert_negative_soa(&nx);
    // NODATA: the name exists (an IPv4-only VIP), no AAAA.
    let nodata = c.dig(&[&format!("v4only.{zone}"), "AAAA"]);
    assert_eq!(nodata.status, "NOERROR", "{}", nodata.text);
    assert!(nodata.answer.is_empty(), "{}", nodata.text);
    assert_negative_soa(&nodata);
    // An empty non-terminal is NODATA through CoreDNS too (RFC 8020).
    let ent = c.dig(&[&zone, "A"]);
    assert_eq!((ent.status.as_str(), ent.answer.len()), ("NOERROR", 0), "{}", ent.text);
}

/// Issue 40: what a CoreDNS in front does with a client's EDNS Client
/// Subnet, which decides whether `--trust-ecs-from` may name it. The
/// example block's `forward` passes the client's option on unchanged (so
/// trusting that CoreDNS would let every Pod claim any cluster); with
/// `rewrite edns0 subnet set 32 128` CoreDNS puts the client's own address
/// there instead, whatever it sent. `whoami` (CoreDNS forwards the CHAOS
/// query like any other) says what the server received; CoreDNS on
/// 127.0.0.1 is in the default `--trust-ecs-from`.
#[test]
fn forward_passes_a_clients_subnet_on_and_rewrite_set_replaces_it() {
    let s = Served::start(&["--client-cluster", "198.51.100.0/24=cluster-b"]);
    let whoami = |c: &CoreDns| {
        let out = crate::harness::served::dig(
            c.addr,
            &["CH", "TXT", "whoami.clusterset.local", "+subnet=198.51.100.0/24"],
        );
        parse(&out).rdata("TXT")
    };
    let forward = CoreDns::start(s.addr, &[]);
    let got = whoami(&forward);
    assert!(got.contains(&"\"ecs 198.51.100.0/24\"".to_owned()), "{got:?}");
    assert!(got.contains(&"\"cluster cluster-b\"".to_owned()), "the client's claim stands: {got:?}");

    let conf = corefile(0, s.addr, &[]).replace("clusterset.local:0 {", "clusterset.local:{PORT} {");
    let conf = conf.replacen("    log\n", "    log\n    rewrite edns0 subnet set 32 128\n", 1);
    let rewrite = CoreDns::start_conf(&conf, "clusterset.local");
    let got = whoami(&rewrite);
    assert!(got.contains(&"\"ecs 127.0.0.1/32\"".to_owned()), "the client's own address: {got:?}");
    assert!(got.contains(&"\"cluster (unknown)\"".to_owned()), "{got:?}");
}

#[test]
fn an_answer_too_large_for_udp_reaches_the_client_in_full_over_tcp() {
    let ns = "coredns-e2e-tc";
    let endpoints: Vec<Value> = (1..=100).map(|i| json!({"addresses": [format!("10.92.0.{i}")]})).collect();
    let rt = runtime();
    rt.block_on(async {
        let k = Kube::new(shared().client(1).await, ns).await;
        k.import("big", headless()).await;
        k.slice("big-a", "big", "cluster-a", Value::Array(endpoints), None).await;
    });
    let s = serve(1, ns);
    let big = format!("big.{ns}.svc.clusterset.local");
    eventually("all 100 endpoints served", || {
        parse(&crate::harness::served::dig(s.addr, &[&big, "A", "+tcp"])).answer.len() == 100
    });
    let c = CoreDns::start(s.addr, &[]);

    // 1. A client with a large buffer, no retry: forward asked us over UDP,
    //    we cut the answer at 1232 bytes with TC, CoreDNS passed that on.
    let first = c.dig(&[&big, "A", "+bufsize=4096", "+ignore"]);
    assert!(first.flags.iter().any(|f| f == "tc"), "TC reaches the client: {}", first.text);
    assert!(!first.answer.is_empty() && first.answer.len() < 100, "{}", first.text);
    assert!(first.size <= 1232, "at most our UDP limit: {}", first.text);

    // 2. dig as usual (UDP, 1232): TC, dig retries over TCP, CoreDNS forwards
    //    that over TCP and the client ends with every record.
    let full = c.dig(&[&big, "A"]);
    assert!(full.text.contains(";; Truncated, retrying in TCP mode."), "{}", full.text);
    assert!(!full.flags.iter().any(|f| f == "tc"), "{}", full.text);
    let mut got = full.rdata("A");
    got.sort();
    got.dedup();
    assert_eq!(got.len(), 100, "{}", full.text);
    assert!(c.wait_log(&format!("\"A IN {big}. tcp ")), "the retry reached CoreDNS over TCP:\n{}", c.log());

    // 3. The full answer is now in CoreDNS's cache (the truncated one never
    //    was): a large-buffer UDP client gets it whole, without TC.
    let cached = c.dig(&[&big, "A", "+bufsize=4096", "+ignore"]);
    assert!(!cached.flags.iter().any(|f| f == "tc"), "{}", cached.text);
    assert_eq!(cached.answer.len(), 100, "{}", cached.text);

    // 4. With `prefer_udp`, forward itself retries over TCP on TC, so even
    //    the first large-buffer UDP query gets everything.
    let prefer = CoreDns::start(s.addr, &["prefer_udp"]);
    let r = prefer.dig(&[&big, "A", "+bufsize=4096", "+ignore"]);
    assert!(!r.flags.iter().any(|f| f == "tc"), "{}", r.text);
    assert_eq!(r.answer.len(), 100, "{}", r.text);
    eprintln!(
        "100 records: {} bytes in full; {} records ({} bytes) in the truncated UDP answer",
        r.size,
        first.answer.len(),
        first.size
    );
}

#[test]
fn negative_answers_are_cached_no_longer_than_the_soa_minimum() {
    let ns = "coredns-e2e-neg";
    let rt = runtime();
    let k = rt.block_on(async { Kube::new(shared().client(2).await, ns).await });
    let s = serve(2, ns);
    let c = CoreDns::start(s.addr, &[]);
    let late = format!("late.{ns}.svc.clusterset.local");

    let t0 = Instant::now();
    let nx = c.dig(&[&late, "A"]);
    assert_eq!(nx.status, "NXDOMAIN", "{}", nx.text);
    assert_negative_soa(&nx);
    rt.block_on(k.import("late", vip(&["10.93.0.1"])));
    eventually("the server answers the new service", || {
        parse(&s.dig(&[&late, "A"])).rdata("A") == ["10.93.0.1"]
    });
    // CoreDNS keeps the NXDOMAIN for the SOA's TTL (5 s), then asks again.
    let deadline = t0 + Duration::from_secs(9);
    let seen = loop {
        if c.dig(&[&late, "A"]).rdata("A") == ["10.93.0.1"] {
            break t0.elapsed();
        }
        assert!(Instant::now() < deadline, "still not served through CoreDNS after 9 s:\n{}", c.log());
        std::thread::sleep(Duration::from_millis(50));
    };
    eprintln!("new service visible through CoreDNS {seen:?} after the cached NXDOMAIN");
    assert!(seen >= Duration::from_millis(4900), "the NXDOMAIN was not cached: {seen:?}");
    assert!(seen <= Duration::from_secs(8), "the NXDOMAIN was cached longer than 5 s: {seen:?}");
}

#[test]
fn the_forward_health_check_counts_our_refused_as_healthy() {
    let ns = "coredns-e2e-health";
    let rt = runtime();
    rt.block_on(async {
        let k = Kube::new(shared().client(0).await, ns).await;
        k.import("web", vip(&["10.94.0.1"])).await;
        k.import("web2", vip(&["10.94.0.2"])).await;
    });
    let s = serve(0, ns);
    let relay = Relay::start(s.addr);
    // max_fails 1: down after two failed checks; failfast: SERVFAIL at once
    // while down, so "up again" can only come from a successful check.
    let c = CoreDns::start(relay.addr, &["max_fails 1", "failfast_all_unhealthy_upstreams"]);
    let zone = format!("{ns}.svc.clusterset.local");
    assert_eq!(c.dig(&[&format!("web.{zone}"), "A"]).rdata("A"), ["10.94.0.1"]);
    eprintln!("health checks while everything works: {}", relay.counts.hc_seen.load(Ordering::SeqCst));

    // The network to clusterset-dns breaks: a query times out, which starts
    // the health checks; they time out too and the upstream goes down.
    relay.cut.store(true, Ordering::SeqCst);
    let trigger = format!("cut-trigger.{zone}");
    let _ = dig_once(c.addr, &[&trigger, "A"]);
    poll("three health checks dropped", Duration::from_secs(20), || {
        relay.counts.hc_dropped.load(Ordering::SeqCst) >= 3
    });
    let down = c.dig(&[&format!("while-down.{zone}"), "A"]);
    assert_eq!(down.status, "SERVFAIL", "upstream marked down: {}\n{}", down.text, c.log());
    // Every query sent while cut has finished inside CoreDNS (logged), so no
    // failure is still in flight when the network comes back.
    assert!(c.wait_log(&format!("\"A IN {trigger}. udp ")), "{}", c.log());

    relay.cut.store(false, Ordering::SeqCst);
    let back = poll("forwarded again", Duration::from_secs(10), || {
        c.dig(&[&format!("web2.{zone}"), "A"]).rdata("A") == ["10.94.0.2"]
    });
    eprintln!("healthy again {back:?} after the network came back");
    let refused = relay.counts.hc_refused.load(Ordering::SeqCst);
    assert!(refused >= 1, "a health check went through and got REFUSED from clusterset-dns");

    // Healthy means the checks stop: over several intervals (0.5 s) queries
    // keep being forwarded and no further `. IN NS` is sent.
    let checks = relay.counts.hc_seen.load(Ordering::SeqCst);
    let until = Instant::now() + Duration::from_secs(2);
    let mut i = 0;
    while Instant::now() < until {
        i += 1;
        let r = c.dig(&[&format!("after-{i}.{zone}"), "A"]);
        assert_eq!(r.status, "NXDOMAIN", "query {i} after recovery: {}\n{}", r.text, c.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(relay.counts.hc_seen.load(Ordering::SeqCst), checks, "health checks went on after a REFUSED");
    assert_eq!(relay.counts.hc_refused.load(Ordering::SeqCst), refused);
}

#[test]
fn reverse_lookups_of_clusterset_addresses_go_through_coredns_and_never_show_the_vip_service() {
    // Three clusters: `sync` gives cluster-1 a VIP Service and ServiceImport
    // for `web` (exported from cluster-1 and -2) and the headless `db` of
    // cluster-2; cluster-1 also has a Service of its own, `plain`. Pods of
    // cluster-N are in 198.18.N.0/24 (RFC 2544's benchmarking range).
    let clusters = shared();
    let ns = "coredns-e2e-reverse";
    let rt = runtime();
    let plain = rt.block_on(async {
        let mut users = Vec::new();
        for i in 0..2 {
            users.push(crate::fleet::User::new(clusters, i, ns).await);
        }
        for (i, u) in users.iter().enumerate() {
            u.service("web", json!({})).await;
            let ip = format!("198.18.{}.10", i + 1);
            u.endpoints("web-x", "web", json!([{"addresses": [ip], "conditions": {"ready": true}}])).await;
            u.export("web").await;
        }
        users[1].service("db", json!({"clusterIP": "None"})).await;
        let db0 = json!([{"addresses": ["198.18.2.20"], "hostname": "db-0", "conditions": {"ready": true}}]);
        users[1].endpoints("db-x", "db", db0).await;
        users[1].export("db").await;
        users[0].service("plain", json!({})).await.expect("plain has a ClusterIP")
    });
    let lease = format!("sync-{ns}");
    let sync =
        crate::harness::syncing::Syncing::start(clusters, &["--namespace", ns, "--lease-name", &lease], &[]);
    let s = serve(0, ns);
    let zone = format!("{ns}.svc.clusterset.local");
    let direct = |name: &str, t: &str| crate::harness::served::dig(s.addr, &[name, t, "+short"]);
    let mut vip = String::new();
    eventually("sync imported web and db into cluster-1", || {
        vip = direct(&format!("web.{zone}"), "A").trim().to_owned();
        !vip.is_empty() && !direct(&format!("db-0.cluster-2.db.{zone}"), "A").trim().is_empty()
    });
    let (main, reverse) = reverse_corefile(s.addr, clusters.kubeconfig(0).as_path());
    // Control: the stock kubernetes plugin alone answers the VIP with the
    // internal Service name, which is what the example's blocks prevent.
    let stock = CoreDns::start_conf(
        &main.replace("        labels !multicluster.kubernetes.io/service-name\n", ""),
        ".",
    );
    let ptr = |c: &CoreDns, ip: &str| -> Vec<String> {
        let mut last = Vec::new();
        // The kubernetes plugin serves before its first list completes.
        poll(&format!("PTR of {ip}"), Duration::from_secs(20), || {
            let r = c.dig(&["-x", ip]);
            last = r.rdata("PTR");
            r.status == "NOERROR" || r.status == "REFUSED" || r.status == "NXDOMAIN"
        });
        last
    };
    let internal = ptr(&stock, &vip);
    assert!(internal.iter().any(|n| n.starts_with("web-clusterset-")), "control: {internal:?}");
    drop(stock);

    let c = CoreDns::start_conf(&format!("{main}{reverse}"), ".");
    assert_eq!(ptr(&c, &vip), [format!("web.{zone}.")], "the VIP names the service");
    assert_eq!(
        ptr(&c, &plain),
        [format!("plain.{ns}.svc.cluster.local.")],
        "local Services keep their names"
    );
    assert_eq!(ptr(&c, "198.18.2.20"), [format!("db-0.cluster-2.db.{zone}.")], "a remote headless endpoint");
    // A local Pod behind the exported service: named by the local Service
    // only, not again under the VIP Service that mirrors it.
    let local = ptr(&c, "198.18.1.10");
    assert!(local.iter().all(|n| !n.contains("-clusterset-")), "{local:?}");
    // An address nobody names in a range sent to clusterset-dns: REFUSED.
    assert_eq!(c.dig(&["-x", "198.18.3.99"]).status, "REFUSED");
    drop(sync);
}

#[test]
fn the_same_name_in_every_cluster_keeps_local_answers_and_resolves_the_rest_through_us() {
    // cluster-1 has `plain` and `web` of its own; `web` is also exported by
    // cluster-2, and `api` and the headless `db` only by cluster-2.
    let clusters = shared();
    let ns = "coredns-e2e-samename";
    let rt = runtime();
    let (plain, web) = rt.block_on(async {
        let mut users = Vec::new();
        for i in 0..2 {
            users.push(crate::fleet::User::new(clusters, i, ns).await);
        }
        let mut local_web = None;
        for (i, u) in users.iter().enumerate() {
            let ip = u.service("web", json!({})).await;
            local_web = local_web.or(ip);
            u.endpoints("web-x", "web", json!([{"addresses": [format!("198.18.{}.11", i + 1)]}])).await;
            u.export("web").await;
        }
        users[1].service("api", json!({})).await;
        users[1].endpoints("api-x", "api", json!([{"addresses": ["198.18.2.12"]}])).await;
        users[1].export("api").await;
        users[1].service("db", json!({"clusterIP": "None"})).await;
        let db0 = json!([{"addresses": ["198.18.2.20"], "hostname": "db-0", "conditions": {"ready": true}}]);
        users[1].endpoints("db-x", "db", db0).await;
        users[1].export("db").await;
        let plain = users[0].service("plain", json!({})).await.expect("plain has a ClusterIP");
        (plain, local_web.expect("web has a ClusterIP"))
    });
    let lease = format!("sync-{ns}");
    let sync =
        crate::harness::syncing::Syncing::start(clusters, &["--namespace", ns, "--lease-name", &lease], &[]);
    let kubeconfig = shared().serve_kubeconfig(0);
    let s = Served::start(&[
        "--kubeconfig",
        kubeconfig.to_str().expect("path"),
        "--namespace",
        ns,
        "--also-zone",
        "cluster.local",
    ]);
    eventually("ready", || s.get("/ready").0 == 200);
    let local = |name: &str| format!("{name}.{ns}.svc.cluster.local");
    let direct = |name: &str| crate::harness::served::dig(s.addr, &[name, "A", "+short"]).trim().to_owned();
    eventually("sync imported api and db into cluster-1", || {
        !direct(&local("api")).is_empty()
            && !direct(&format!("db-0.cluster-2.db.{ns}.svc.cluster.local")).is_empty()
    });
    let vip = direct(&format!("api.{ns}.svc.clusterset.local"));

    let block = example_block_at("cluster.local:53 {");
    assert_eq!(block.matches(PLACEHOLDER).count(), 1, "{block}");
    assert!(block.lines().any(|l| l.trim_start().starts_with("kubernetes ")), "kubernetes line: {block}");
    let conf = on_loopback(
        &block.replacen("cluster.local:53", "cluster.local:{PORT}", 1),
        s.addr,
        &clusters.kubeconfig(0),
    );
    let c = CoreDns::start_conf(&conf, "cluster.local.");
    let a = |name: &str| {
        let mut last = Reply::default();
        poll(&format!("{name} answered"), Duration::from_secs(20), || {
            last = c.dig(&[name, "A"]);
            last.status != "SERVFAIL" && last.status != "no answer"
        });
        last
    };
    assert_eq!(a(&local("plain")).rdata("A"), [plain], "a local-only Service: the cluster's answer");
    assert_eq!(a(&local("web")).rdata("A"), [web], "exists here and elsewhere: the local answer wins");
    assert_eq!(a(&local("api")).rdata("A"), [vip], "only in another cluster: the clusterset VIP");
    assert_eq!(a(&format!("db-0.cluster-2.db.{ns}.svc.cluster.local")).rdata("A"), ["198.18.2.20"]);
    let srv = c.dig(&[&format!("_http._tcp.db.{ns}.svc.cluster.local"), "SRV", "+tcp"]);
    assert_eq!(
        srv.rdata("SRV"),
        [format!("0 100 8080 db-0.cluster-2.db.{ns}.svc.cluster.local.")],
        "{}",
        srv.text
    );
    let nope = a(&local("nope"));
    assert_eq!(nope.status, "NXDOMAIN", "{}", nope.text);
    drop(sync);
}

// ---------------------------------------------------------------------------
// CoreDNS

/// The `clusterset.local:53 { … }` server block of `Corefile.example`.
fn example_block() -> String {
    example_block_at("clusterset.local:53 {")
}

/// The server block of `Corefile.example` whose first line starts with `start`.
pub(crate) fn example_block_at(start: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("Corefile.example");
    let text = std::fs::read_to_string(&path).expect("read Corefile.example");
    let mut block = Vec::new();
    let mut depth = 0usize;
    for line in text.lines() {
        let code = line.split('#').next().unwrap_or_default();
        if block.is_empty() && !code.trim_start().starts_with(start) {
            continue;
        }
        block.push(line);
        depth += code.matches('{').count();
        depth -= code.matches('}').count();
        if depth == 0 {
            return block.join("\n") + "\n";
        }
    }
    panic!("Corefile.example has no complete `{start}` block");
}

/// The example block on 127.0.0.1:`port`, forwarding to `upstream`, with a
/// `log` line and `extra` options appended to its `forward` block.
fn corefile(port: u16, upstream: SocketAddr, extra: &[&str]) -> String {
    let block = example_block();
    assert_eq!(block.matches(PLACEHOLDER).count(), 1, "one forward target in Corefile.example:\n{block}");
    let mut lines: Vec<String> = block
        .replace("clusterset.local:53 {", &format!("clusterset.local:{port} {{"))
        .replace(PLACEHOLDER, &upstream.to_string())
        // Metrics on loopback, any free port (CONTRIBUTING: loopback only).
        .replace("prometheus :9153", "prometheus 127.0.0.1:0")
        .lines()
        .map(str::to_owned)
        .collect();
    lines.insert(1, "    bind 127.0.0.1".into());
    lines.insert(2, "    log".into());
    let forward = lines.iter().position(|l| l.trim_start().starts_with("forward . ")).expect("forward line");
    assert!(lines[forward].trim_end().ends_with('{'), "forward has an option block: {}", lines[forward]);
    let close =
        forward + lines[forward..].iter().position(|l| l.trim() == "}").expect("end of forward block");
    for (i, option) in extra.iter().enumerate() {
        lines.insert(close + i, format!("        {option}"));
    }
    lines.join("\n") + "\n"
}

/// A cluster's CoreDNS with the reverse blocks of `Corefile.example`, as
/// templates with `{PORT}` for the port: the `.:53` block a cluster runs
/// (the kubernetes plugin of shared cluster-1 through `kubeconfig`, with
/// the example's label selector), and the example's Service CIDR and
/// remote Pod CIDR blocks for cluster-1 (Services in 10.101.0.0/16,
/// `scripts/clusters.sh`; the other clusters' Pods in 198.18.2-3.0/24),
/// forwarding to `upstream`.
fn reverse_corefile(upstream: SocketAddr, kubeconfig: &Path) -> (String, String) {
    let kubeconfig = kubeconfig.to_str().expect("utf-8 path");
    let main = format!(
        ".:{{PORT}} {{\n    bind 127.0.0.1\n    errors\n    kubernetes cluster.local in-addr.arpa ip6.arpa {{\n        kubeconfig {kubeconfig}\n        labels !multicluster.kubernetes.io/service-name\n        fallthrough in-addr.arpa ip6.arpa\n    }}\n}}\n"
    );
    let mut reverse = String::new();
    for (start, zones) in [
        ("SERVICE_CIDR:53 {", "10.101.0.0/16:{PORT}"),
        ("REMOTE_POD_CIDRS:53 {", "198.18.2.0/24:{PORT} 198.18.3.0/24:{PORT}"),
    ] {
        let (key, _) = start.split_once(':').expect("zone:port");
        let block =
            example_block_at(start).replacen(&format!("{key}:53"), zones, 1).replace(key, "10.101.0.0/16");
        reverse.push_str(&on_loopback(&block, upstream, Path::new(kubeconfig)));
    }
    (main, reverse)
}

/// A server block of `Corefile.example` made runnable here: forwarding to
/// `upstream`, bound to 127.0.0.1, its kubernetes plugin (if any) reading
/// the API server of `kubeconfig`.
fn on_loopback(block: &str, upstream: SocketAddr, kubeconfig: &Path) -> String {
    let mut lines: Vec<String> =
        block.replace(PLACEHOLDER, &upstream.to_string()).lines().map(str::to_owned).collect();
    lines.insert(1, "    bind 127.0.0.1".into());
    if let Some(k) = lines.iter().position(|l| l.trim_start().starts_with("kubernetes ")) {
        lines.insert(k + 1, format!("        kubeconfig {}", kubeconfig.display()));
    }
    lines.join("\n") + "\n"
}

/// A running CoreDNS on 127.0.0.1; stdout and stderr collected; killed on drop.
struct CoreDns {
    child: Child,
    addr: SocketAddr,
    log: Arc<Mutex<String>>,
    _dir: tempfile::TempDir,
}

/// Starts CoreDNS `bin` on `conf`, written as `Corefile` in `dir` (its
/// working directory); stdout and stderr go to the returned log.
pub(crate) fn spawn_coredns(bin: &Path, dir: &Path, conf: &str) -> (std::process::Child, Arc<Mutex<String>>) {
    std::fs::write(dir.join("Corefile"), conf).expect("write Corefile");
    let mut child = Command::new(bin)
        .args(["-conf", "Corefile"])
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start CoreDNS {}: {e}", bin.display()));
    let log = capture_output(&mut child);
    (child, log)
}

impl CoreDns {
    /// Runs the example block forwarding to `upstream` (see `corefile`) and
    /// waits until it serves.
    fn start(upstream: SocketAddr, extra: &[&str]) -> Self {
        let mut last = String::new();
        // A free port can be taken by someone else before CoreDNS binds it.
        for _ in 0..3 {
            let port = free_port();
            let dir = tempfile::tempdir().expect("tempdir");
            let conf = corefile(port, upstream, extra);
            let (child, log) = spawn_coredns(coredns_bin(), dir.path(), &conf);
            let mut c = Self { child, addr: SocketAddr::from(([127, 0, 0, 1], port)), log, _dir: dir };
            // CoreDNS prints its server blocks once it listens.
            let banner = format!("clusterset.local.:{port} on 127.0.0.1");
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                if c.log().contains(&banner) {
                    eprintln!("CoreDNS on {} forwarding to {upstream}:\n{conf}", c.addr);
                    return c;
                }
                if let Ok(Some(status)) = c.child.try_wait() {
                    std::thread::sleep(Duration::from_millis(100)); // let the readers finish
                    last = format!("CoreDNS exited ({status}):\n{}\n--- Corefile ---\n{conf}", c.log());
                    break;
                }
                assert!(Instant::now() < deadline, "CoreDNS did not start in 20 s:\n{}\n{conf}", c.log());
                std::thread::sleep(Duration::from_millis(20));
            }
            if !last.contains("address already in use") {
                break;
            }
        }
        panic!("{last}");
    }

    /// Runs `conf`, `{PORT}` replaced by a free port, and waits until the
    /// block of `zone` serves.
    fn start_conf(conf: &str, zone: &str) -> Self {
        let mut last = String::new();
        for _ in 0..3 {
            let port = free_port();
            let dir = tempfile::tempdir().expect("tempdir");
            let conf = conf.replace("{PORT}", &port.to_string());
            let (child, log) = spawn_coredns(coredns_bin(), dir.path(), &conf);
            let mut c = Self { child, addr: SocketAddr::from(([127, 0, 0, 1], port)), log, _dir: dir };
            let banner = format!("{}:{port} on 127.0.0.1", zone.trim_end_matches('.').to_owned() + ".");
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                if c.log().contains(&banner) {
                    eprintln!("CoreDNS on {}:\n{conf}", c.addr);
                    return c;
                }
                if let Ok(Some(status)) = c.child.try_wait() {
                    std::thread::sleep(Duration::from_millis(100));
                    last = format!("CoreDNS exited ({status}):\n{}\n--- Corefile ---\n{conf}", c.log());
                    break;
                }
                assert!(Instant::now() < deadline, "CoreDNS did not start in 30 s:\n{}\n{conf}", c.log());
                std::thread::sleep(Duration::from_millis(20));
            }
            if !last.contains("address already in use") {
                break;
            }
        }
        panic!("{last}");
    }

    fn log(&self) -> String {
        self.log.lock().expect("log lock").clone()
    }

    /// Waits (10 s at most) until the log contains `needle`.
    fn wait_log(&self, needle: &str) -> bool {
        crate::harness::within(Duration::from_secs(10), || self.log().contains(needle))
    }

    /// `dig` through this CoreDNS (UDP unless told otherwise).
    fn dig(&self, args: &[&str]) -> Reply {
        parse(&crate::harness::served::dig(self.addr, args))
    }
}

impl Drop for CoreDns {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One `dig` try with a 1 s timeout: no client retry adding a second
/// upstream exchange inside CoreDNS.
fn dig_once(addr: SocketAddr, args: &[&str]) -> String {
    let out = Command::new("dig")
        .args([&format!("@{}", addr.ip()), "-p", &addr.port().to_string(), "+time=1", "+tries=1"])
        .args(args)
        .output()
        .expect("dig (apt-get install bind9-dnsutils)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

// ---------------------------------------------------------------------------
// dig output

/// One record of a dig section.
#[derive(Debug)]
struct Rr {
    ttl: u32,
    rtype: String,
    rdata: String,
}

/// The last response dig printed.
#[derive(Debug, Default)]
struct Reply {
    text: String,
    status: String,
    flags: Vec<String>,
    answer: Vec<Rr>,
    authority: Vec<Rr>,
    /// `MSG SIZE rcvd`.
    size: usize,
}

impl Reply {
    /// Rdata of the answer records of type `rtype`, in order.
    fn rdata(&self, rtype: &str) -> Vec<String> {
        self.answer.iter().filter(|r| r.rtype == rtype).map(|r| r.rdata.clone()).collect()
    }
}

fn parse(text: &str) -> Reply {
    let mut reply = Reply { text: text.to_owned(), status: "no answer".into(), ..Reply::default() };
    let mut section = "";
    for line in text.lines() {
        if let Some(rest) = line.split("status: ").nth(1) {
            reply.status = rest.split(',').next().unwrap_or_default().to_owned();
            reply.answer.clear();
            reply.authority.clear();
        } else if let Some(rest) = line.strip_prefix(";; flags: ") {
            reply.flags =
                rest.split(';').next().unwrap_or_default().split_whitespace().map(str::to_owned).collect();
        } else if let Some(rest) = line.strip_prefix(";; MSG SIZE  rcvd: ") {
            reply.size = rest.trim().parse().unwrap_or(0);
        } else if let Some(title) = line.strip_prefix(";; ").and_then(|l| l.strip_suffix(" SECTION:")) {
            section = if title == "ANSWER" || title == "AUTHORITY" { title } else { "" };
        } else if line.is_empty() || line.starts_with(';') {
            if line.is_empty() {
                section = "";
            }
        } else if !section.is_empty() {
            let mut f = line.split_whitespace();
            let (_name, ttl, _class) = (f.next(), f.next(), f.next());
            let rr = Rr {
                ttl: ttl.and_then(|t| t.parse().ok()).unwrap_or(u32::MAX),
                rtype: f.next().unwrap_or_default().to_owned(),
                rdata: f.collect::<Vec<_>>().join(" "),
            };
            if section == "ANSWER" { reply.answer.push(rr) } else { reply.authority.push(rr) }
        }
    }
    reply
}

/// A negative answer carries our SOA (minimum 5 s) in authority with a TTL
/// of at most 5 s: what CoreDNS's cache keeps it for.
#[track_caller]
fn assert_negative_soa(r: &Reply) {
    let [soa] = r.authority.as_slice() else { panic!("one SOA in authority: {}", r.text) };
    assert_eq!(soa.rtype, "SOA", "{}", r.text);
    assert!(soa.rdata.starts_with("ns.dns.clusterset.local. hostmaster.clusterset.local. "), "{}", r.text);
    assert_eq!(soa.rdata.split_whitespace().last(), Some("5"), "SOA minimum: {}", r.text);
    assert!(soa.ttl <= 5, "negative TTL: {}", r.text);
}

/// Polls `f` every 50 ms until true; panics after `limit`.
fn poll(what: &str, limit: Duration, mut f: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while start.elapsed() < limit {
        if f() {
            return start.elapsed();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{what}: not within {limit:?}");
}

// ---------------------------------------------------------------------------
// A UDP relay between CoreDNS and clusterset-dns that can be cut

/// `. IN NS` packets seen by the relay (CoreDNS's forward health check).
#[derive(Default)]
struct Counts {
    /// Health-check queries from CoreDNS.
    hc_seen: AtomicUsize,
    /// Of those, dropped while cut.
    hc_dropped: AtomicUsize,
    /// REFUSED replies to them relayed back from clusterset-dns.
    hc_refused: AtomicUsize,
}

/// Forwards UDP datagrams to `server` and back; while `cut`, drops them all
/// (a network partition between CoreDNS and clusterset-dns).
struct Relay {
    addr: SocketAddr,
    cut: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    counts: Arc<Counts>,
}

/// Whether `p` is a message with the single question `. IN NS`.
fn is_root_ns(p: &[u8]) -> bool {
    p.len() >= 17 && p[4..6] == [0, 1] && p[12] == 0 && p[13..17] == [0, 2, 0, 1]
}

impl Relay {
    fn start(server: SocketAddr) -> Self {
        let front = UdpSocket::bind("127.0.0.1:0").expect("bind relay");
        front.set_read_timeout(Some(Duration::from_millis(100))).expect("timeout");
        let addr = front.local_addr().expect("relay address");
        let (cut, stop, counts) =
            (Arc::<AtomicBool>::default(), Arc::<AtomicBool>::default(), Arc::<Counts>::default());
        let (c, s, n) = (cut.clone(), stop.clone(), counts.clone());
        std::thread::spawn(move || {
            let mut upstreams: HashMap<SocketAddr, UdpSocket> = HashMap::new();
            let mut buf = [0u8; 65535];
            while !s.load(Ordering::SeqCst) {
                let Ok((len, client)) = front.recv_from(&mut buf) else { continue };
                let packet = &buf[..len];
                let hc = is_root_ns(packet);
                if hc {
                    n.hc_seen.fetch_add(1, Ordering::SeqCst);
                }
                if c.load(Ordering::SeqCst) {
                    if hc {
                        n.hc_dropped.fetch_add(1, Ordering::SeqCst);
                    }
                    continue;
                }
                let upstream = upstreams.entry(client).or_insert_with(|| {
                    let up = UdpSocket::bind("127.0.0.1:0").expect("bind relay upstream");
                    up.connect(server).expect("connect relay upstream");
                    up.set_read_timeout(Some(Duration::from_millis(100))).expect("timeout");
                    let (back, up2) = (front.try_clone().expect("clone"), up.try_clone().expect("clone"));
                    let (c, s, n) = (c.clone(), s.clone(), n.clone());
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 65535];
                        while !s.load(Ordering::SeqCst) {
                            let Ok(len) = up2.recv(&mut buf) else { continue };
                            if c.load(Ordering::SeqCst) {
                                continue;
                            }
                            let reply = &buf[..len];
                            if is_root_ns(reply) && reply[2] & 0x80 != 0 && reply[3] & 0x0f == 5 {
                                n.hc_refused.fetch_add(1, Ordering::SeqCst);
                            }
                            let _ = back.send_to(reply, client);
                        }
                    });
                    up
                });
                let _ = upstream.send(packet);
            }
        });
        Self { addr, cut, stop, counts }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

// ---------------------------------------------------------------------------
// Kubernetes objects and the server

/// `clusterset-dns serve` watching `ns` of shared cluster `cluster`, as the
/// least-privilege ServiceAccount; returns once it is ready.
fn serve(cluster: usize, ns: &str) -> Served {
    let kubeconfig = shared().serve_kubeconfig(cluster);
    let s = Served::start(&["--kubeconfig", kubeconfig.to_str().expect("path"), "--namespace", ns]);
    eventually("ready", || s.get("/ready").0 == 200);
    s
}
