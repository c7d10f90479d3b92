//! Unit tests of the configuration (`config.rs` and its modules).

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use clap::Parser;
use clap::error::ErrorKind;

use super::*;
use crate::cli::{Cli, Command};
use crate::cluster_dns::repair::Mode;
use crate::k8s::throttle::Limits;
use crate::k8s::watch::ListMode;
use crate::model::PolicyKind;

/// Asserts that clap refuses `clusterset-dns ARGS…` for a value of `flag`,
/// naming it as the binary prints it (`invalid value 'V' for '--flag <N>'`,
/// exit 64 in `main.rs`); returns the message.
#[track_caller]
fn refused(args: &[&str], flag: &str) -> String {
    let Err(e) = Cli::try_parse_from([&["clusterset-dns"], args].concat()) else {
        panic!("{args:?} was taken")
    };
    assert!(matches!(e.kind(), ErrorKind::InvalidValue | ErrorKind::ValueValidation), "{args:?}: {e}");
    let text = e.to_string();
    assert!(
        [" <", "[=<"].iter().any(|end| text.contains(&format!("for '{flag}{end}"))),
        "{args:?} refused without naming {flag}: {text}"
    );
    text
}

fn config(args: &[&str]) -> Result<ServeConfig, ConfigError> {
    let cli = Cli::try_parse_from([&["clusterset-dns", "serve"], args].concat()).unwrap();
    let Command::Serve(a) = cli.command else { unreachable!() };
    ServeConfig::from_args(&a)
}

fn setup_dns(args: &[&str]) -> Result<SetupDnsConfig, ConfigError> {
    let cli =
        Cli::try_parse_from([&["clusterset-dns", "setup-dns", "--kubeconfig", "k"], args].concat()).unwrap();
    let Command::SetupDns(a) = cli.command else { unreachable!() };
    SetupDnsConfig::from_args(&a)
}

#[test]
fn setup_dns_watch_reapplies_by_default_every_minute_and_bad_values_name_their_flag() {
    assert!(setup_dns(&[]).unwrap().watch.is_none());
    let w = setup_dns(&["--watch"]).unwrap().watch.unwrap();
    assert_eq!((w.mode, w.interval), (Mode::Reapply, Duration::from_secs(60)));
    let w = setup_dns(&["--watch=report", "--interval", "2"]).unwrap().watch.unwrap();
    assert_eq!((w.mode, w.interval), (Mode::Report, Duration::from_secs(2)));
    let text = refused(&["setup-dns", "--watch=fight"], "--watch");
    assert!(text.contains("[possible values: reapply, report]"), "{text}");
    refused(&["setup-dns", "--watch", "--interval", "0"], "--interval");
    refused(&["setup-dns", "--interval", "86401"], "--interval");
    assert_eq!(setup_dns(&["--watch", "--dry-run"]).unwrap_err().flag, "--watch");
    assert_eq!(setup_dns(&["--watch", "--remove"]).unwrap_err().flag, "--watch");
}

#[test]
fn defaults_serve_the_example_on_an_unprivileged_port() {
    let c = config(&[]).unwrap();
    assert_eq!(c.zone.origin.to_string(), "clusterset.local.");
    assert_eq!((c.zone.ttl, c.zone.negative_ttl), (5, 5));
    assert_eq!(c.listen, ["127.0.0.1:1053".parse().unwrap()]);
    assert!(c.objects.is_empty());
    assert_eq!(c.wire.max_udp_payload, 1232);
}

#[test]
fn watches_list_in_pages_unless_told_to_take_all_at_once() {
    let page = |args: &[&str]| {
        config(&[&["--kubeconfig", "k"], args].concat()).unwrap().kube.unwrap().lists.page_size()
    };
    assert_eq!(page(&[]).map(|n| n.get()), Some(500));
    assert_eq!(page(&["--list-page-size", "50"]).map(|n| n.get()), Some(50));
    assert_eq!(page(&["--list-page-size", "0"]), None);
}

#[test]
fn watches_stream_their_lists_where_allowed_unless_told_otherwise() {
    let mode = |args: &[&str]| {
        config(&[&["--kubeconfig", "k"], args].concat()).map(|c| c.kube.unwrap().lists.mode())
    };
    assert_eq!(mode(&[]).unwrap(), ListMode::Auto);
    assert_eq!(mode(&["--list-mode", "auto"]).unwrap(), ListMode::Auto);
    assert_eq!(mode(&["--list-mode", "stream"]).unwrap(), ListMode::Stream);
    assert_eq!(mode(&["--list-mode", "paged"]).unwrap(), ListMode::Paged);
    let text = refused(&["serve", "--list-mode", "Stream"], "--list-mode");
    assert!(text.contains("[possible values: auto, stream, paged]"), "{text}");
    refused(&["serve", "--list-mode", ""], "--list-mode");
}

#[test]
fn bad_values_name_their_flag() {
    assert_eq!(config(&["--cluster-id", "bad_id"]).unwrap_err().flag, "--cluster-id");
    assert_eq!(config(&["--namespace", "shop"]).unwrap_err().flag, "--namespace");
    assert_eq!(config(&["--in-cluster", "--namespace", "Not_OK"]).unwrap_err().flag, "--namespace");
    assert_eq!(config(&["--cluster", "no-equals-sign"]).unwrap_err().flag, "--cluster");
    assert_eq!(config(&["--cluster", "a=/does/not/exist"]).unwrap_err().flag, "--cluster");
    assert_eq!(config(&["--members", "/does/not/exist"]).unwrap_err().flag, "--members");
}

fn sync_config(args: &[&str]) -> Result<SyncConfig, ConfigError> {
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("kc");
    std::fs::write(&kc, "apiVersion: v1").unwrap();
    let member = format!("a={}", kc.display());
    let cli =
        Cli::try_parse_from([&["clusterset-dns", "sync", "--cluster", &member], args].concat()).unwrap();
    let Command::Sync(a) = cli.command else { unreachable!() };
    SyncConfig::from_args(&a)
}

/// The flags clap holds to a range: the bounds are taken, one past them
/// is refused naming the flag.
#[test]
fn numbers_outside_their_range_are_refused_by_clap() {
    let cases: &[(&str, &str, &[&str], &[&str])] = &[
        ("serve", "--ttl", &["0", "2147483647"], &["2147483648", "4294967295", "-1"]),
        ("serve", "--negative-ttl", &["0", "2147483647"], &["2147483648"]),
        ("serve", "--udp-workers", &["1"], &["0"]),
        ("serve", "--max-udp-payload", &["512", "4096"], &["511", "4097", "100"]),
        ("serve", "--tcp-idle-timeout", &["1"], &["0"]),
        ("serve", "--tcp-max-connections", &["1"], &["0"]),
        ("serve", "--tcp-max-per-client", &["1"], &["0"]),
        ("serve", "--tcp-io-timeout", &["0.05", "60"], &["0.04", "61", "NaN"]),
        ("serve", "--rrl-slip", &["0", "10"], &["11"]),
        ("serve", "--rrl-ipv4-prefix", &["0", "32"], &["33"]),
        ("serve", "--rrl-ipv6-prefix", &["0", "128"], &["129"]),
        ("serve", "--rrl-table-size", &["1", "16777216"], &["0", "16777217"]),
        ("serve", "--local-min-healthy", &["1"], &["0"]),
        ("serve", "--cluster-dead-after", &["1", "3600"], &["0", "3601"]),
        ("serve", "--probe-interval", &["0.01", "3600"], &["0", "3601", "inf"]),
        ("serve", "--probe-recheck", &["0.01"], &["0"]),
        ("serve", "--probe-timeout", &["3600"], &["NaN"]),
        ("serve", "--probe-fall", &["1"], &["0"]),
        ("serve", "--probe-rise", &["1"], &["0"]),
        ("serve", "--probe-concurrency", &["1"], &["0"]),
        ("serve", "--probe-rate", &["1"], &["0"]),
        ("run", "--cluster-dead-after", &["1"], &["0"]),
        ("sync", "--shards", &["1", "64"], &["0", "65"]),
        ("sync", "--lease-duration", &["5", "3600"], &["4", "3601"]),
        ("sync", "--member-lost-after", &["1"], &["0"]),
        ("sync", "--resync-interval", &["10"], &["9"]),
        ("sync", "--concurrent-syncs", &["1", "1024"], &["0", "1025"]),
        ("sync", "--kube-qps", &["0", "2.5"], &["-1", "NaN", "inf"]),
        ("setup-dns", "--interval", &["1", "86400"], &["0", "86401"]),
        ("setup-dns", "--verify-timeout", &["1", "3600"], &["0.5", "3601"]),
        ("doctor", "--timeout", &["0.1", "300"], &["0", "301"]),
    ];
    for &(command, flag, good, bad) in cases {
        // doctor's NAME is required; the others need nothing else.
        let name: &[&str] = if command == "doctor" { &["web.shop"] } else { &[] };
        for v in good {
            let arg = format!("{flag}={v}");
            let argv = [&["clusterset-dns", command, arg.as_str()][..], name].concat();
            if let Err(e) = Cli::try_parse_from(&argv) {
                panic!("{argv:?}: {e}");
            }
        }
        for v in bad {
            let arg = format!("{flag}={v}");
            refused(&[&[command, arg.as_str()][..], name].concat(), flag);
        }
    }
    // The command line may not import the controller: one limit, two names.
    assert_eq!(crate::cli::MAX_SHARDS, i64::from(crate::controller::shard::MAX_SHARDS));
}

#[test]
fn members_clients_are_rate_limited_unless_told_otherwise() {
    let limits = |args: &[&str]| sync_config(args).unwrap().kube_limits;
    assert_eq!(limits(&[]), Some(Limits { qps: 50.0, burst: 100 }));
    assert_eq!(limits(&["--kube-qps", "2.5", "--kube-burst", "1"]), Some(Limits { qps: 2.5, burst: 1 }));
    assert_eq!(limits(&["--kube-qps", "0"]), None, "0 turns the limit off");
    assert_eq!(sync_config(&["--kube-burst", "0"]).unwrap_err().flag, "--kube-burst");
}

#[test]
fn cluster_profiles_alone_are_members_enough_and_bad_files_name_their_flag() {
    let dir = tempfile::tempdir().unwrap();
    let hub = dir.path().join("hub");
    std::fs::write(&hub, "apiVersion: v1").unwrap();
    let good = dir.path().join("providers.json");
    std::fs::write(
            &good,
            r#"{"providers": [{"name": "t", "execConfig": {"apiVersion": "client.authentication.k8s.io/v1", "command": "/bin/t"}}]}"#,
        )
        .unwrap();
    let broken = dir.path().join("broken.json");
    std::fs::write(&broken, r#"{"providers": [{"name": "t"}]}"#).unwrap();
    let (hub, good, broken) = (hub.to_str().unwrap(), good.to_str().unwrap(), broken.to_str().unwrap());
    let parse = |args: &[&str]| {
        let cli = Cli::try_parse_from([&["clusterset-dns", "sync"], args].concat()).unwrap();
        let Command::Sync(a) = cli.command else { unreachable!() };
        SyncConfig::from_args(&a)
    };
    let c =
        parse(&["--cluster-profiles", "fleet", "--cluster-profile-providers", good, "--hub-kubeconfig", hub])
            .unwrap();
    let p = c.profiles.expect("profiles");
    assert_eq!((p.namespace.as_str(), p.providers.names()), ("fleet", vec!["t"]));
    // Without a --cluster member the Lease is in the hub.
    let lease = c.lease.expect("lease").connection;
    assert!(matches!(lease, Connection::Kubeconfig { path, .. } if path.to_str() == Some(hub)));
    let flag = |args: &[&str]| parse(args).unwrap_err().flag;
    assert_eq!(flag(&[]), "--cluster", "neither members nor profiles");
    assert_eq!(
        flag(&["--cluster-profiles", "fleet", "--cluster-profile-providers", broken]),
        "--cluster-profile-providers"
    );
    assert_eq!(
        flag(&["--cluster-profiles", "fleet", "--cluster-profile-providers", "/no/such"]),
        "--cluster-profile-providers"
    );
    assert_eq!(
        flag(&["--cluster-profiles", "Fleet!", "--cluster-profile-providers", good]),
        "--cluster-profiles"
    );
    assert_eq!(
        flag(&[
            "--cluster-profiles",
            "fleet",
            "--cluster-profile-providers",
            good,
            "--hub-kubeconfig",
            "/no/such"
        ]),
        "--hub-kubeconfig"
    );
    // clap: the namespace needs the provider file.
    assert!(Cli::try_parse_from(["clusterset-dns", "sync", "--cluster-profiles", "fleet"]).is_err());
}

#[test]
fn shards_need_leader_election_and_a_sane_count() {
    let shards = |args: &[&str]| sync_config(args).unwrap().lease.map(|l| l.shards);
    assert_eq!(shards(&[]), Some(1));
    assert_eq!(shards(&["--shards", "4"]), Some(4));
    let e = sync_config(&["--shards", "4", "--no-leader-election"]).unwrap_err();
    assert_eq!(e.flag, "--shards");
    assert!(sync_config(&["--shards", "1", "--no-leader-election"]).is_ok());
}

#[test]
fn members_come_from_flags_and_a_file_and_are_unique() {
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("kc");
    std::fs::write(&kc, "apiVersion: v1").unwrap();
    let kc = kc.to_str().unwrap();
    let file = dir.path().join("members.yaml");
    std::fs::write(&file, format!("members:\n- {{name: b, kubeconfig: {kc}, context: ctx}}\n")).unwrap();
    let c = config(&["--cluster", &format!("a={kc}"), "--members", file.to_str().unwrap()]).unwrap();
    assert_eq!(c.members.iter().map(|m| m.name.as_str()).collect::<Vec<_>>(), ["a", "b"]);
    let Connection::Kubeconfig { context, .. } = &c.members[1].connection else { panic!() };
    assert_eq!(context.as_deref(), Some("ctx"));
    let e = config(&["--cluster", &format!("a={kc}"), "--cluster", &format!("a={kc}")]).unwrap_err();
    assert!(e.problem.contains("twice"), "{e}");
    std::fs::write(&file, "members:\n- {name: b, kubeconfg: x}\n").unwrap();
    let e = config(&["--members", file.to_str().unwrap()]).unwrap_err();
    assert!(e.problem.contains("members[0]"), "{e}");
    assert!(config(&["--cluster", &format!("Bad_Name={kc}")]).is_err());
}

#[test]
fn policy_flags_are_checked() {
    let text = refused(&["serve", "--answer-policy", "fastest"], "--answer-policy");
    assert!(
        text.contains("[possible values: rotation, random, weighted, local-first, topology, all]"),
        "{text}"
    );
    for bad in ["10.0.0.0/8", "10.0.0.0/33=a", "nonsense=a", "10.0.0.0/8=Bad_Name"] {
        refused(&["serve", "--client-cluster", bad], "--client-cluster");
    }
    for bad in ["a", "a=", "Bad_Name=eu"] {
        refused(&["serve", "--cluster-region", bad], "--cluster-region");
    }
    let text = refused(&["serve", "--fallback-boundary", "planet"], "--fallback-boundary");
    assert!(text.contains("[possible values: zone, cluster, region, none]"), "{text}");
    let c = config(&["--answer-policy", "local-first", "--cluster-region", "East=eu"]).unwrap();
    assert_eq!(c.zone.answers.policy, PolicyKind::LocalFirst);
    assert_eq!(c.zone.answers.regions, [(crate::model::ClusterId::parse("east").unwrap(), "eu".to_owned())]);
}

#[test]
fn network_flags_take_networks_and_hosts_and_refuse_host_bits() {
    let c = config(&["--allow-debug", "10.0.0.0/8", "--allow-debug", "fd00::1", "--rrl-rate", "5"]).unwrap();
    let allow = &c.wire.debug.as_ref().unwrap().allow;
    assert_eq!(allow.iter().map(|n| n.prefix_len()).collect::<Vec<_>>(), [8, 128]);
    let d = config(&[]).unwrap();
    let loopback: Vec<String> =
        d.wire.allow_transfer.iter().map(|n| format!("{}/{}", n.addr(), n.prefix_len())).collect();
    assert_eq!(loopback, ["127.0.0.0/8", "::1/128"], "the default: loopback only");
    let trusted: Vec<String> =
        d.wire.trust_ecs.iter().map(|n| format!("{}/{}", n.addr(), n.prefix_len())).collect();
    assert_eq!(trusted, ["127.0.0.0/8", "::1/128"], "ECS believed from loopback only by default");
    let t = config(&["--trust-ecs-from", "10.96.0.0/16", "--trust-ecs-from", "fd00::53"]).unwrap();
    assert_eq!(t.wire.trust_ecs.iter().map(|n| n.prefix_len()).collect::<Vec<_>>(), [16, 128], "replaces it");
    for flag in ["--allow-debug", "--allow-transfer", "--rrl-exempt", "--trust-ecs-from"] {
        let text = refused(&["serve", flag, "10.1.2.3/16"], flag);
        assert!(text.contains("did you mean 10.1.0.0/16?"), "{text}");
        refused(&["serve", flag, "nonsense"], flag);
    }
    assert_eq!(
        config(&["--rrl-exempt", "10.0.0.0/8"]).unwrap_err().flag,
        "--rrl-rate",
        "exempt from nothing"
    );
}

#[test]
fn memory_limits_are_sizes_auto_or_none() {
    let limit = |v: &str| config(&["--memory-limit", v]).unwrap().memory.map(|b| b.limit);
    assert_eq!(limit("512Mi"), Some(512 << 20));
    assert_eq!(limit("none"), None);
    for bad in ["1Mi", "12Pb", "lots"] {
        refused(&["serve", "--memory-limit", bad], "--memory-limit");
    }
}

#[test]
fn fleet_shapes_are_a_list_of_names() {
    let interop = |v: &str| config(&["--interop", v]).unwrap().interop;
    assert_eq!(interop(""), crate::model::Interop::NONE);
    assert_eq!(interop("Kosmos, karmada"), crate::model::Interop { karmada: true, kosmos: true });
    let text = refused(&["serve", "--interop", "karmada,istio"], "--interop");
    assert!(text.contains("\"istio\" is not karmada or kosmos"), "{text}");
    refused(&["check", "--objects", "x", "--interop", "istio"], "--interop");
}

#[test]
fn health_flags_are_checked() {
    assert_eq!(config(&[]).unwrap().cluster_dead_after, Duration::from_secs(15));
    assert!(config(&[]).unwrap().probe.is_none(), "probes are off by default");
    let p = config(&["--probe", "--probe-interval", "0.5"]).unwrap().probe.unwrap();
    assert_eq!((p.interval, p.timeout), (Duration::from_millis(500), Duration::from_secs(1)));
    assert_eq!(p.recheck, Duration::from_millis(500));
    assert_eq!((p.fall, p.rise, p.concurrency, p.rate), (3, 2, 64, 200));
}

#[test]
fn client_networks_are_canonical_and_may_name_a_zone() {
    // Host bits are refused, as by every CIDR flag (`model::Cidr`), naming the network meant.
    let e = refused(&["serve", "--client-cluster", "10.1.2.3/16=cluster-a/zone-1"], "--client-cluster");
    assert!(e.contains("did you mean 10.1.0.0/16?"), "{e}");
    let e = refused(&["serve", "--client-cluster", "fd00::1/64=b"], "--client-cluster");
    assert!(e.contains("did you mean fd00::/64?"), "{e}");
    let c = config(&["--client-cluster", "10.1.0.0/16=cluster-a/zone-1", "--client-cluster", "fd00::/64=b"])
        .unwrap();
    let nets = &c.zone.answers.clients;
    assert_eq!(nets[0].net.addr(), "10.1.0.0".parse::<IpAddr>().unwrap());
    assert_eq!((nets[0].net.prefix_len(), nets[0].zone.as_deref()), (16, Some("zone-1")));
    assert_eq!(nets[1].net.addr(), "fd00::".parse::<IpAddr>().unwrap());
    assert_eq!(c.zone.answers.policy, PolicyKind::Rotation);
    assert!(c.zone.answers.fail_open);
    assert_eq!(c.zone.answers.fallback_boundary, crate::model::Boundary::None);
    let c = config(&["--fallback-boundary", "region"]).unwrap();
    assert_eq!(c.zone.answers.fallback_boundary, crate::model::Boundary::Region);
}

fn doctor(args: &[&str]) -> Result<DoctorConfig, ConfigError> {
    let cli = Cli::try_parse_from([&["clusterset-dns", "doctor"], args].concat()).unwrap();
    let Command::Doctor(a) = cli.command else { unreachable!() };
    DoctorConfig::from_args(&a)
}

#[test]
fn doctor_takes_the_short_or_the_full_name_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("kc");
    std::fs::write(&kc, "apiVersion: v1").unwrap();
    let a = format!("a={}", kc.display());
    for name in ["web.shop", "Web.Shop.svc.clusterset.local", "web.shop.svc.clusterset.local."] {
        let c = doctor(&[name, "--cluster", &a]).unwrap();
        assert_eq!(c.key.to_string(), "shop/web", "{name}");
    }
    let c = doctor(&["web.shop.svc.fleet.example", "--zone", "fleet.example", "--cluster", &a]).unwrap();
    assert_eq!(c.key.to_string(), "shop/web");
    for name in [
        "web",
        "web.shop.svc",
        "web.shop.svc.cluster.local",
        "a.b.c",
        "web_x.shop",
        "web.shop.svc.clusterset.local.x",
    ] {
        let e = doctor(&[name, "--cluster", &a]).unwrap_err();
        assert_eq!(e.flag, "NAME", "{name}: {e}");
    }
    assert_eq!(doctor(&["web.shop"]).unwrap_err().flag, "--cluster");
    let c = doctor(&["web.shop", "--cluster", &a, "--dns", "a=127.0.0.1:5353"]).unwrap();
    assert_eq!(c.dns, [("a".to_owned(), "127.0.0.1:5353".parse().unwrap())]);
    let c = doctor(&["web.shop", "--cluster", &a, "--dns", "a=10.0.0.10"]).unwrap();
    assert_eq!(c.dns[0].1, "10.0.0.10:53".parse::<SocketAddr>().unwrap());
    assert_eq!(doctor(&["web.shop", "--cluster", &a, "--dns", "b=10.0.0.10"]).unwrap_err().flag, "--dns");
    let twice = ["web.shop", "--cluster", &a, "--dns", "a=10.0.0.10", "--dns", "a=10.0.0.11"];
    assert_eq!(doctor(&twice).unwrap_err().flag, "--dns");
    refused(&["doctor", "web.shop", "--dns", "a=nowhere"], "--dns");
    refused(&["doctor", "web.shop", "--dns", "a"], "--dns");
    let text = refused(&["doctor", "web.shop", "--output", "yaml"], "--output");
    assert!(text.contains("[possible values: text, json]"), "{text}");
    let c = doctor(&["web.shop", "--cluster", &a, "--output", "json"]).unwrap();
    assert_eq!(c.format, crate::diagnose::report::Format::Json);
}

#[test]
fn setup_dns_addresses_default_to_port_53() {
    let c = setup_dns(&["--server", "10.96.0.53", "--verify", "[fd00::a]:5353"]).unwrap();
    assert_eq!(c.server, Some("10.96.0.53:53".parse().unwrap()));
    assert_eq!(c.verify_at, Some("[fd00::a]:5353".parse().unwrap()));
    refused(&["setup-dns", "--server", "dns.example"], "--server");
    refused(&["setup-dns", "--verify", "10.0.0.1:99999"], "--verify");
}

#[test]
fn members_lost_are_kept_unless_told_otherwise() {
    use crate::controller::syncer::MemberLost;
    assert_eq!(sync_config(&[]).unwrap().behaviour.on_member_lost, MemberLost::Keep);
    let c = sync_config(&["--on-member-lost=remove"]).unwrap();
    assert_eq!(c.behaviour.on_member_lost, MemberLost::Remove);
    let text = refused(&["sync", "--on-member-lost", "forget"], "--on-member-lost");
    assert!(text.contains("[possible values: keep, remove]"), "{text}");
}

#[test]
fn explain_takes_any_dns_type_name() {
    let parse = |args: &[&str]| {
        let cli = Cli::try_parse_from([&["clusterset-dns", "explain", "web.shop"], args].concat()).unwrap();
        let Command::Explain(a) = cli.command else { unreachable!() };
        a.qtype.to_string()
    };
    assert_eq!(parse(&[]), "A");
    assert_eq!(parse(&["--type", "srv"]), "SRV");
    refused(&["explain", "web.shop", "--type", "AAA"], "--type");
}

#[test]
fn zone_names_are_folded_to_lower_case() {
    assert_eq!(config(&["--zone", "Fleet.Example."]).unwrap().zone.origin.to_string(), "fleet.example.");
    let also = config(&["--also-zone", "Cluster.Local"]).unwrap().zone.also;
    assert_eq!(also.map(|a| a.to_string()).as_deref(), Some("cluster.local."));
    // Not a zone at all: clap's refusal, by the one zone parser of every
    // command; a zone over or under --zone: the configuration's.
    for (command, flag) in [("serve", "--zone"), ("serve", "--also-zone"), ("setup-dns", "--zone")] {
        for bad_zone in [".", "a..b"] {
            refused(&[command, flag, bad_zone], flag);
        }
    }
    refused(&["doctor", "web.shop", "--zone", "a..b"], "--zone");
    for bad_zone in ["clusterset.local", "local", "x.clusterset.local"] {
        let e = config(&["--also-zone", bad_zone]).unwrap_err().to_string();
        assert!(e.contains("--also-zone"), "{bad_zone}: {e}");
    }
    let s = setup_dns(&["--zone", "Fleet.Example."]).unwrap();
    assert_eq!(s.zone, "fleet.example");
}

#[test]
fn a_bad_label_is_named_once() {
    for (value, want) in [
        ("bad_id", r#"--cluster-id: "bad_id" has a character other than letters, digits and '-'"#),
        ("a.b_c", r#"--cluster-id: "a.b_c" "b_c" has a character other than letters, digits and '-'"#),
        ("-a", r#"--cluster-id: "-a" starts or ends with '-'"#),
        ("", r#"--cluster-id: "" is empty"#),
    ] {
        let e = config(&[&format!("--cluster-id={value}")]).expect_err("refused");
        assert_eq!(e.to_string(), want);
    }
}

#[test]
fn a_negative_rate_after_a_space_is_the_flags_value() {
    // Not an unknown flag `-1`: the refusal names --kube-qps.
    let text = refused(&["sync", "--kube-qps", "-1"], "--kube-qps");
    assert!(text.contains("-1 is not a rate"), "{text}");
}
