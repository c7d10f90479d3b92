//! The `clusterset-dns` binary as a user runs it: objects files watched and
//! reloaded, errors reported with file, document and field, SIGHUP, bad
//! configuration, `check`. Answers are read with `dig`.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::harness::served::{Served, dig};
use crate::harness::{BIN, eventually};

const WEB: &str = "apiVersion: multicluster.x-k8s.io/v1beta1
kind: ServiceImport
metadata: {name: web, namespace: shop}
spec: {type: ClusterSetIP, ips: [10.0.0.1], ports: [{name: http, protocol: TCP, port: 80}]}
";

fn write(path: &Path, text: &str) {
    // Write then rename, as editors and ConfigMap updates do.
    let tmp = path.with_extension("tmp~");
    std::fs::write(&tmp, text).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

#[test]
fn embedded_example_answers_dig_at_once() {
    let s = Served::start(&[]);
    assert_eq!(s.dig(&["web.shop.svc.clusterset.local", "A", "+short"]).trim(), "10.42.0.10");
    assert_eq!(s.dig(&["dns-version.clusterset.local", "TXT", "+short"]).trim(), "\"1.0.0\"");
    let srv = s.dig(&["_postgres._tcp.db.shop.svc.clusterset.local", "SRV", "+short"]);
    assert!(srv.contains("5432 db-0.cluster-a.db.shop.svc.clusterset.local."), "{srv}");
    let full = s.dig(&["nope.shop.svc.clusterset.local", "A", "+tcp"]);
    assert!(full.contains("status: NXDOMAIN") && full.contains("flags: qr aa rd"), "{full}");
}

#[test]
fn an_edit_is_served_without_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("web.yaml");
    write(&file, WEB);
    let s = Served::start(&["--objects", dir.path().to_str().expect("path")]);
    assert_eq!(s.dig(&["web.shop.svc.clusterset.local", "A", "+short"]).trim(), "10.0.0.1");
    write(&file, &WEB.replace("10.0.0.1", "10.0.0.2"));
    let took = eventually("edit served", || {
        s.dig(&["web.shop.svc.clusterset.local", "A", "+short"]).trim() == "10.0.0.2"
    });
    eprintln!("edit served after {took:?}");
    // A new file in the directory is picked up too, and a removed one dropped.
    let extra = dir.path().join("api.yml");
    write(&extra, &WEB.replace("web", "api"));
    eventually("new file served", || {
        !s.dig(&["api.shop.svc.clusterset.local", "A", "+short"]).trim().is_empty()
    });
    std::fs::remove_file(&extra).expect("remove");
    eventually("removed file dropped", || {
        s.dig(&["api.shop.svc.clusterset.local", "A"]).contains("NXDOMAIN")
    });
}

#[test]
fn a_broken_edit_is_reported_and_the_last_good_state_kept() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("objects.yaml");
    write(&file, WEB);
    let s = Served::start(&["--objects", file.to_str().expect("path")]);
    let broken = format!("{WEB}---\n{}", WEB.replace("web", "api").replace("port: 80", "port: eighty"));
    write(&file, &broken);
    assert!(s.wait_log("document 2, field spec.ports[0].port"), "{}", s.log());
    assert!(s.log().contains(&file.display().to_string()));
    assert_eq!(
        s.dig(&["web.shop.svc.clusterset.local", "A", "+short"]).trim(),
        "10.0.0.1",
        "last good state served"
    );
    // An object with an invalid IP is skipped with its name; the rest is served.
    write(&file, &format!("{WEB}---\n{}", WEB.replace("web", "api").replace("10.0.0.1", "10.0.0.256")));
    assert!(s.wait_log("ServiceImport shop/api: spec.ips[0]"), "{}", s.log());
    assert_eq!(s.dig(&["web.shop.svc.clusterset.local", "A", "+short"]).trim(), "10.0.0.1");
    assert!(s.dig(&["api.shop.svc.clusterset.local", "A"]).contains("NXDOMAIN"));
}

#[test]
fn sighup_forces_a_reload() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("objects.yaml");
    write(&file, "kind: [broken");
    // A broken file at start is a start-up error, not a silent empty zone.
    let out = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0", "--objects"])
        .arg(&file)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("document 1"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    write(&file, WEB);
    let s = Served::start(&["--objects", file.to_str().expect("path")]);
    write(&file, "kind: [broken");
    assert!(s.wait_log("serving the file's last good state"));
    let reported = s.log().matches("serving the file's last good state").count();
    // Unchanged bytes are not parsed again on a file event; SIGHUP re-reads
    // everything and reports the error again.
    s.signal("HUP");
    assert!(s.wait_log("SIGHUP: reloading objects files"));
    eventually("error reported again", || {
        s.log().matches("serving the file's last good state").count() > reported
    });
    assert_eq!(s.dig(&["web.shop.svc.clusterset.local", "A", "+short"]).trim(), "10.0.0.1");
}

#[test]
fn bad_configuration_fails_at_start_naming_the_flag() {
    // clap's own refusals exit as the configuration checks do, for every
    // command (docs/exit-codes.md).
    for args in [
        &["serve", "--no-such-flag"][..],
        &["serve", "--ttl", "soon"],
        &["doctor", "--no-such-flag", "web.shop"],
        &["sync", "--shards", "many"],
        // Outside its range: clap's refusal, as --ttl soon's.
        &["serve", "--max-udp-payload", "100"],
        // Not a zone: the one zone parser, clap's refusal too.
        &["serve", "--zone", "bad..zone"],
        &["setup-dns", "--zone", "."],
    ] {
        let out = Command::new(BIN).args(args).output().expect("run");
        assert_eq!(out.status.code(), Some(64), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    for (args, flag) in [
        (vec!["--cluster-id", "Not_Valid"], "--cluster-id"),
        // Flags that go together are the configuration's to judge.
        (vec!["--rrl-exempt", "10.0.0.0/8"], "--rrl-rate"),
    ] {
        let out = Command::new(BIN).arg("serve").args(&args).output().expect("run");
        assert_eq!(out.status.code(), Some(64), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(&format!("invalid configuration: {flag}:")), "{err}");
    }
    let out = Command::new(BIN)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--http-listen",
            "127.0.0.1:0",
            "--objects",
            "/nonexistent/x.yaml",
        ])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    // The flag and the path, the cause once.
    assert!(err.contains("error: --objects: /nonexistent/x.yaml: No such file"), "{err}");
    assert_eq!(err.matches("No such file").count(), 1, "{err}");
    // An address taken: the flag that named it, the cause once, and no
    // task reporting its own end as the failure.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr").to_string();
    let out = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--http-listen", &addr])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("error: --http-listen {addr}: Address already in use")), "{err}");
    assert_eq!(err.matches("Address already in use").count(), 1, "{err}");
    assert!(!err.contains("ERROR"), "a task blamed for the failed start:\n{err}");
}

/// Whether clap's message names `flag` (`for '--flag <NAME>'`, or
/// `for '--flag[=<NAME>]'` when the value is optional).
fn names_flag(stderr: &str, flag: &str) -> bool {
    [" <", "[=<"].iter().any(|end| stderr.contains(&format!("for '{flag}{end}")))
}

/// Every flag whose value clap reads into a type (an enum, a range, a
/// network, a size, an address): a bad value exits 64 naming the flag
/// before anything starts (docs/exit-codes.md), for every command.
#[test]
fn values_clap_refuses_exit_64_naming_the_flag() {
    let cases: &[(&[&str], &str)] = &[
        (&["serve", "--list-mode", "streaming"], "--list-mode"),
        (&["serve", "--answer-policy", "fastest"], "--answer-policy"),
        (&["serve", "--fallback-boundary", "planet"], "--fallback-boundary"),
        (&["serve", "--interop", "karmada,istio"], "--interop"),
        (&["serve", "--memory-limit", "lots"], "--memory-limit"),
        (&["serve", "--rrl-exempt", "10.1.2.3/16"], "--rrl-exempt"),
        (&["serve", "--allow-debug", "10.0.0.0/33"], "--allow-debug"),
        (&["serve", "--allow-transfer", "nowhere"], "--allow-transfer"),
        (&["serve", "--client-cluster", "10.0.0.0/8"], "--client-cluster"),
        (&["serve", "--cluster-region", "east"], "--cluster-region"),
        (&["serve", "--ttl", "2147483648"], "--ttl"),
        (&["serve", "--negative-ttl", "2147483648"], "--negative-ttl"),
        (&["serve", "--udp-workers", "0"], "--udp-workers"),
        (&["serve", "--max-udp-payload", "100"], "--max-udp-payload"),
        (&["serve", "--tcp-idle-timeout", "0"], "--tcp-idle-timeout"),
        (&["serve", "--tcp-max-connections", "0"], "--tcp-max-connections"),
        (&["serve", "--tcp-max-per-client", "0"], "--tcp-max-per-client"),
        (&["serve", "--tcp-io-timeout", "0"], "--tcp-io-timeout"),
        (&["serve", "--rrl-slip", "11"], "--rrl-slip"),
        (&["serve", "--rrl-ipv4-prefix", "33"], "--rrl-ipv4-prefix"),
        (&["serve", "--rrl-ipv6-prefix", "129"], "--rrl-ipv6-prefix"),
        (&["serve", "--rrl-table-size", "0"], "--rrl-table-size"),
        (&["serve", "--local-min-healthy", "0"], "--local-min-healthy"),
        (&["serve", "--cluster-dead-after", "3601"], "--cluster-dead-after"),
        (&["serve", "--probe-interval", "0"], "--probe-interval"),
        (&["serve", "--probe-recheck", "NaN"], "--probe-recheck"),
        (&["serve", "--probe-timeout", "3601"], "--probe-timeout"),
        (&["serve", "--probe-fall", "0"], "--probe-fall"),
        (&["serve", "--probe-rise", "0"], "--probe-rise"),
        (&["serve", "--probe-concurrency", "0"], "--probe-concurrency"),
        (&["serve", "--probe-rate", "0"], "--probe-rate"),
        (&["run", "--list-mode", "Stream"], "--list-mode"),
        (&["run", "--on-member-lost", "forget"], "--on-member-lost"),
        (&["check", "--objects", "x.yaml", "--interop", "istio"], "--interop"),
        (&["sync", "--on-member-lost", "forget"], "--on-member-lost"),
        (&["sync", "--shards", "65"], "--shards"),
        (&["sync", "--lease-duration", "4"], "--lease-duration"),
        (&["sync", "--member-lost-after", "0"], "--member-lost-after"),
        (&["sync", "--concurrent-syncs", "0"], "--concurrent-syncs"),
        (&["sync", "--kube-qps=-1"], "--kube-qps"),
        (&["doctor", "web.shop", "--output", "yaml"], "--output"),
        (&["doctor", "web.shop", "--dns", "a=nowhere"], "--dns"),
        (&["doctor", "web.shop", "--timeout", "0"], "--timeout"),
        (&["explain", "web.shop", "--type", "AAA"], "--type"),
        (&["setup-dns", "--watch=fight"], "--watch"),
        (&["setup-dns", "--interval", "0"], "--interval"),
        (&["setup-dns", "--verify-timeout", "0"], "--verify-timeout"),
        (&["setup-dns", "--server", "dns.example"], "--server"),
        (&["setup-dns", "--verify", "10.0.0.1:99999"], "--verify"),
    ];
    for (args, flag) in cases {
        let out = Command::new(BIN).args(*args).output().expect("run");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {err}");
        assert!(names_flag(&err, flag), "{args:?}: {flag} not named: {err}");
    }
}

/// `--help` lists the values each enum-like flag takes, with what each
/// does, and clap's refusal repeats them.
#[test]
fn help_lists_the_values_of_every_enum_flag() {
    let cases: &[(&str, &str, &[&str])] = &[
        ("serve", "--list-mode", &["auto", "stream", "paged"]),
        ("serve", "--answer-policy", &["rotation", "random", "weighted", "local-first", "topology", "all"]),
        ("serve", "--fallback-boundary", &["zone", "cluster", "region", "none"]),
        ("serve", "--interop", &["karmada", "kosmos"]),
        ("serve", "--kube-encoding", &["auto", "json"]),
        ("serve", "--on-memory-limit", &["keep-serving", "exit"]),
        ("run", "--answer-policy", &["rotation", "local-first"]),
        ("run", "--on-member-lost", &["keep", "remove"]),
        ("check", "--interop", &["karmada", "kosmos"]),
        ("sync", "--on-member-lost", &["keep", "remove"]),
        ("doctor", "--output", &["text", "json"]),
        ("setup-dns", "--watch", &["reapply", "report"]),
    ];
    for &(command, flag, values) in cases {
        let out = Command::new(BIN).args([command, "--help"]).output().expect("run");
        assert_eq!(out.status.code(), Some(0));
        let help = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = help.lines().map(str::trim_start).collect();
        let at = lines
            .iter()
            .position(|l| l.strip_prefix(flag).is_some_and(|r| r.starts_with([' ', '['])))
            .unwrap_or_else(|| panic!("{command} --help has no {flag}:\n{help}"));
        // The flag's text runs to the next flag's line; a value's line is `- NAME: help`.
        let section: Vec<&str> = lines[at + 1..]
            .iter()
            .take_while(|l| !l.starts_with("--") && !l.starts_with("-h,"))
            .copied()
            .collect();
        for value in values {
            assert!(
                section.iter().any(|l| l.starts_with(&format!("- {value}:"))),
                "{command} --help does not list {value} under {flag}:\n{}",
                section.join("\n")
            );
        }
        let bad_value = format!("{flag}=no-such-value");
        let bad = Command::new(BIN).args([command, bad_value.as_str()]).output().expect("run");
        let err = String::from_utf8_lossy(&bad.stderr);
        assert_eq!(bad.status.code(), Some(64), "{command} {flag}: {err}");
        // --interop's list is read by its own parser, which names the entry instead.
        if flag != "--interop" {
            assert!(err.contains("[possible values: ") && err.contains(values[0]), "{command} {flag}: {err}");
        }
    }
}

#[test]
fn check_reports_what_would_be_served() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("objects.yaml");
    std::fs::write(&file, format!("{WEB}---\n{}", WEB.replace("web", "bad").replace("10.0.0.1", "nope")))
        .expect("write");
    let out = Command::new(BIN).args(["check", "--objects"]).arg(&file).output().expect("run");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(report.contains("1 ServiceImports, 0 EndpointSlices"), "{report}");
    assert!(report.contains("skipped: ServiceImport shop/bad: spec.ips[0]"), "{report}");
    assert_eq!(out.status.code(), Some(1));
    let out = Command::new(BIN)
        .args(["check", "--objects", "zones"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
}

#[test]
fn dig_over_tcp_and_with_edns_sizes() {
    let s = Served::start(&[]);
    let tcp = s.dig(&["db.shop.svc.clusterset.local", "A", "+tcp"]);
    assert!(tcp.contains("status: NOERROR") && tcp.contains("10.1.4.10"), "{tcp}");
    let noedns = s.dig(&["web.shop.svc.clusterset.local", "A", "+noedns"]);
    assert!(!noedns.contains("OPT PSEUDOSECTION"), "{noedns}");
    let edns = s.dig(&["web.shop.svc.clusterset.local", "A", "+bufsize=4096"]);
    assert!(edns.contains("udp: 1232"), "server caps the UDP size: {edns}");
    let refused = s.dig(&["example.com", "A"]);
    assert!(refused.contains("status: REFUSED") && !refused.contains(" aa"), "{refused}");
}

#[test]
fn sigterm_keeps_answering_during_lameduck_while_ready_fails() {
    let mut s = Served::start(&["--lameduck", "3"]);
    assert_eq!(s.get("/ready").0, 200);
    s.signal("TERM");
    eventually("/ready fails during lameduck", || s.get("/ready").0 == 503);
    assert_eq!(s.dig(&["web.shop.svc.clusterset.local", "A", "+short"]).trim(), "10.42.0.10");
    assert!(!s.exited(), "still running during lameduck");
    eventually("exits after lameduck", || s.exited());
    assert!(s.log().contains("lameduck: still answering while /ready fails"), "{}", s.log());
}

#[test]
fn sigint_stops_at_once() {
    let mut s = Served::start(&["--lameduck", "30"]);
    s.signal("INT");
    let took = eventually("exits on SIGINT", || s.exited());
    assert!(took < Duration::from_secs(10), "{took:?}");
}

#[test]
fn ipv4_and_ipv6_wildcards_bind_the_same_port() {
    // Find a port free for UDP and TCP on both families, then let the
    // server take it twice (0.0.0.0 and [::]), as a Deployment would.
    let port = (0..50)
        .find_map(|_| {
            let p = std::net::UdpSocket::bind("0.0.0.0:0").ok()?.local_addr().ok()?.port();
            // One socket at a time (each dropped when its closure returns):
            // std binds [::] dual-stack, which would collide with 0.0.0.0.
            let tcp = |ip: &str| std::net::TcpListener::bind((ip, p)).is_ok();
            let udp = |ip: &str| std::net::UdpSocket::bind((ip, p)).is_ok();
            (tcp("0.0.0.0") && tcp("::") && udp("::")).then_some(p)
        })
        .expect("a free port");
    let (v4, v6) = (format!("0.0.0.0:{port}"), format!("[::]:{port}"));
    let s = Served::start(&["--listen", &v4, "--listen", &v6]);
    for server in ["127.0.0.1", "::1"] {
        for transport in ["+notcp", "+tcp"] {
            let addr = SocketAddr::new(server.parse().expect("ip"), port);
            let out = dig(addr, &["web.shop.svc.clusterset.local", "A", "+short", transport]);
            assert_eq!(out.trim(), "10.42.0.10", "{server} {transport}");
        }
    }
    drop(s);
}

/// A workload that does not fit `--memory-limit`: at start the server does
/// not start, naming the size it reached. Once serving, an update that
/// would not fit is refused whole and the last good state is served
/// (`/health` and `/ready` stay 200, `clusterset_dns_memory_over_budget` is
/// 1 until the refused file is read back in, or gone): a file weighed by
/// its size before it is read, a source's objects by their number before
/// they are applied. With
/// `--on-memory-limit exit` the server exits instead. The limit is set from
/// this machine's own figure for the small start, so the test does not
/// depend on the build.
#[test]
fn a_workload_over_the_memory_limit_is_refused_and_the_last_good_state_served() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(&dir.path().join("web.yaml"), WEB);
    let objects = dir.path().to_str().expect("path");
    let out = Command::new(BIN)
        .args(["serve", "--memory-limit", "16Mi", "--objects", objects])
        .args(["--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"])
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "started over the limit:\n{err}");
    assert!(
        err.contains("MiB resident with 1 services, over 90 % of the 16 MiB limit (--memory-limit)"),
        "{err}"
    );

    let mut idle = Served::start(&["--memory-limit", "none", "--objects", objects]);
    idle.wait_ready(Duration::from_secs(20));
    let start_kib = idle.status_kib("VmRSS");
    idle.stop();
    // Room for the start and 16 MiB more.
    let limit = format!("{}Ki", (start_kib + 16 * 1024) * 10 / 9);
    let mut s = Served::start(&["--memory-limit", &limit, "--objects", objects]);
    s.wait_ready(Duration::from_secs(20));
    let over = |s: &Served| {
        let (code, body) = s.get("/metrics");
        assert_eq!(code, 200);
        body.lines().find_map(|l| l.strip_prefix("clusterset_dns_memory_over_budget ")).map(str::to_owned)
    };
    assert_eq!(over(&s).as_deref(), Some("0"));
    let answered = |s: &Served, name: &str| !s.dig(&[name, "A", "+short"]).trim().is_empty();
    // 20,000 services: a 4 MB file passes the file's weighing, but its
    // objects do not fit (the writer's weighing).
    write(&dir.path().join("bulk.yaml"), &crate::support::many_services(20_000));
    eventually("the bulk refused", || s.log().contains("update refused"));
    assert!(s.log().contains("20000 ServiceImports more from --objects #0"), "{}", s.log());
    assert_eq!(over(&s).as_deref(), Some("1"));
    assert_eq!(s.get("/health").0, 200);
    assert_eq!(s.get("/ready").0, 200);
    assert!(answered(&s, "web.shop.svc.clusterset.local"), "the last good state is served");
    assert!(!answered(&s, "svc-0.ns-0.svc.clusterset.local"), "the refused file is not");
    std::fs::remove_file(dir.path().join("bulk.yaml")).expect("rm");
    eventually("fits again once the file is gone", || over(&s).as_deref() == Some("0"));
    // 100,000 services: a 19 MB file is not even read.
    let huge = dir.path().join("huge.yaml");
    write(&huge, &crate::support::many_services(100_000));
    eventually("the huge file refused before it is read", || s.log().contains("objects file not loaded"));
    assert!(s.log().contains(&format!("objects file {}", huge.display())), "{}", s.log());
    assert_eq!(over(&s).as_deref(), Some("1"));
    assert!(answered(&s, "web.shop.svc.clusterset.local"));
    std::fs::remove_file(&huge).expect("rm");
    eventually("fits again once the huge file is gone", || over(&s).as_deref() == Some("0"));
    assert!(s.wait_exit(Duration::from_millis(100)).is_none(), "exited:\n{}", s.log());
    s.stop();

    // The exit, for those who want it.
    let mut s = Served::start(&["--memory-limit", &limit, "--on-memory-limit", "exit", "--objects", objects]);
    s.wait_ready(Duration::from_secs(20));
    write(&dir.path().join("bulk.yaml"), &crate::support::many_services(20_000));
    let status = s.wait_exit(Duration::from_secs(120));
    assert!(status.is_some_and(|st| !st.success()), "still running (or exit 0) over the limit:\n{}", s.log());
    assert!(s.log().contains("services, over 90 % of the"), "the size is named:\n{}", s.log());
}

#[test]
fn the_allocator_starts_with_the_options_the_binary_gives_it() {
    // jemalloc lists every source of options it read when asked to
    // (`confirm_conf`); the binary's own are the global variable's.
    let out = Command::new(BIN)
        .arg("--version")
        .env("_RJEM_MALLOC_CONF", "confirm_conf:true")
        .output()
        .expect("run");
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let options = std::str::from_utf8(clusterset_dns::ops::memory::ALLOCATOR_OPTIONS)
        .expect("ASCII")
        .trim_end_matches('\0');
    assert!(
        err.lines()
            .any(|l| l.contains("global variable malloc_conf)") && l.ends_with(&format!("\"{options}\""))),
        "jemalloc did not read the binary's options {options:?}:\n{err}"
    );
    assert!(err.contains(&format!("Set conf value: {options}")), "{err}");
}

/// Each stderr line of a `--log-format json` process as JSON, asserting
/// that it is an object with a level and a message (`fields.message`, as
/// tracing-subscriber writes events).
fn json_lines(stderr: &str) -> Vec<serde_json::Value> {
    assert!(!stderr.trim().is_empty(), "nothing logged");
    stderr
        .lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("not JSON ({e}): {line}\nin:\n{stderr}"));
            assert!(v["level"].is_string(), "no level: {line}");
            assert!(v["fields"]["message"].is_string(), "no fields.message: {line}");
            v
        })
        .collect()
}

/// `--log-format json`: a server's start, answers and stop, and a failed
/// start, are all one JSON object a line, the error a field of its own;
/// before or after the subcommand, or from the environment. An unknown
/// format is clap's usage error listing the known ones.
#[test]
fn log_format_json_writes_one_object_a_line_with_errors_as_fields() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("web.yaml");
    write(&file, WEB);
    let mut s = Served::start(&["--log-format", "json", "--objects", file.to_str().expect("path")]);
    s.wait_ready(Duration::from_secs(20));
    assert_eq!(s.dig(&["web.shop.svc.clusterset.local", "A", "+short"]).trim(), "10.0.0.1");
    // A broken file: its error is logged, as a field.
    write(&file, "kind: [broken");
    assert!(s.wait_log("serving the file's last good state"), "{}", s.log());
    s.stop();
    assert!(s.wait_log("shutting down"), "{}", s.log());
    let lines = json_lines(&s.log());
    let broken = lines
        .iter()
        .find(|v| v["fields"]["message"] == "serving the file's last good state")
        .expect("the broken file's line");
    assert_eq!(broken["level"], "ERROR");
    assert!(broken["fields"]["error"].as_str().is_some_and(|e| e.contains("document 1")), "{broken}");
    // Values are fields too: the address a pipeline would alert on.
    let listening = lines.iter().find(|v| v["fields"]["message"] == "listening on UDP and TCP");
    assert_eq!(
        listening.map(|v| v["fields"]["addr"].clone()),
        Some(s.addr.to_string().into()),
        "{}",
        s.log()
    );

    let failing = [
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--http-listen",
        "127.0.0.1:0",
        "--objects",
        "/nonexistent/x.yaml",
    ];
    let runs = [
        (Command::new(BIN).args(["--log-format", "json"]).args(failing).output(), 1, "/nonexistent/x.yaml"),
        (
            Command::new(BIN).args(failing).env("CLUSTERSET_DNS_LOG_FORMAT", "json").output(),
            1,
            "/nonexistent/x.yaml",
        ),
        (
            Command::new(BIN).args(["serve", "--cluster-id", "Not_Valid", "--log-format", "json"]).output(),
            64,
            "--cluster-id",
        ),
    ];
    for (out, code, named) in runs {
        let out = out.expect("run");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{err}");
        let lines = json_lines(&err);
        let last = lines.last().expect("a line");
        assert_eq!(last["level"], "ERROR", "{err}");
        assert!(last["fields"]["error"].as_str().is_some_and(|e| e.contains(named)), "{err}");
        assert!(!last["fields"]["message"].as_str().is_some_and(|m| m.contains(named)), "{err}");
    }

    let out = Command::new(BIN).args(["serve", "--log-format", "xml"]).output().expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(64),
        "a usage error exits 64 for every command (docs/exit-codes.md): {err}"
    );
    assert!(err.contains("invalid value 'xml'") && err.contains("[possible values: text, json]"), "{err}");
    let help = Command::new(BIN).args(["sync", "--help"]).output().expect("run");
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("--log-format <FORMAT>") && help.contains("json"), "{help}");
}
