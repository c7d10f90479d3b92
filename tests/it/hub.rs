//! Hub mode on real clusters: a hub and three members (four API servers).
//! Each member's agent (`clusterset-dns agent`) runs with that member's own
//! restricted identity (deploy/agent/rbac.yaml) and a hub identity made by
//! `clusterset-dns hub enrol` (deploy/hub/), which may write only its own
//! hub namespace: exports converge into every member, each agent writes
//! only its own cluster and namespace (another's is 403 from the real API
//! server), a slice's trigger time reaches every member's MCS slices and a
//! time alone writes nothing, an agent's spans reach a collector, and a
//! killed agent, a frozen member and a frozen hub each have the expected
//! outcome.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DynamicObject, PostParams};
use serde_json::json;

use crate::fleet::metric;
use crate::harness::clusters::TestClusters;
use crate::harness::process::Frozen;
use crate::harness::served::Served;
use crate::harness::syncing::Syncing;
use crate::harness::{BIN, within};
use crate::sync::{readers, users};
use crate::traces::{receiver, spans};
use crate::watch::runtime;

/// Enrols member `name` on the hub with the real command; returns its
/// agent's hub kubeconfig.
pub(crate) fn enrol(clusters: &TestClusters, name: &str, dir: &Path) -> PathBuf {
    let out = dir.join(format!("hub-{name}.kubeconfig"));
    let done = Command::new(BIN)
        .args(["hub", "enrol", name, "--hub-kubeconfig"])
        .arg(clusters.kubeconfig(0))
        .arg("--out")
        .arg(&out)
        .output()
        .expect("run hub enrol");
    assert!(done.status.success(), "hub enrol {name}: {}", String::from_utf8_lossy(&done.stderr));
    assert!(String::from_utf8_lossy(&done.stdout).contains(&format!("enrolled member {name}")));
    out
}

/// Member `i`'s agent, with `extra` arguments.
pub(crate) fn agent(clusters: &TestClusters, i: usize, hub: &Path, ns: &str, extra: &[&str]) -> Syncing {
    let id = format!("agent-{}", clusters.name(i));
    agent_as(clusters, i, clusters.name(i), hub, ns, &id, extra)
}

/// An agent in cluster `i` (its own identity there) that says it is member
/// `member` on the hub, as `identity`, with `extra` arguments.
pub(crate) fn agent_as(
    clusters: &TestClusters,
    i: usize,
    member: &str,
    hub: &Path,
    ns: &str,
    identity: &str,
    extra: &[&str],
) -> Syncing {
    let (own, hub) = (clusters.role_kubeconfig(i, "agent"), hub.display().to_string());
    let own = own.display().to_string();
    let mut args = vec![
        "--member",
        member,
        "--kubeconfig",
        &own,
        "--hub-kubeconfig",
        &hub,
        "--namespace",
        ns,
        "--lease-duration",
        "5",
        "--identity",
        identity,
    ];
    args.extend_from_slice(extra);
    Syncing::agent(&args)
}

pub(crate) async fn client_from(path: &Path) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(path).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.expect("config");
    kube::Client::try_from(config).expect("client")
}

/// Waits up to `secs` for `f`.
pub(crate) fn waits(secs: u64, what: &str, f: impl FnMut() -> bool, log: impl Fn() -> String) {
    assert!(within(Duration::from_secs(secs), f), "{what}: not within {secs} s\n{}", log());
}

#[test]
fn agents_sync_every_member_from_the_hub_each_writing_only_its_own() {
    let clusters = TestClusters::start(4);
    let rt = runtime();
    let ns = "hub-shop";
    let dir = tempfile::tempdir().expect("tempdir");
    let hub_kc: Vec<PathBuf> = (1..4).map(|i| enrol(&clusters, clusters.name(i), dir.path())).collect();
    // Enrolling again changes nothing but the token.
    enrol(&clusters, clusters.name(1), dir.path());
    // cluster-2's agent sends its spans to a collector.
    let (collector, received) = receiver();
    let traced = ["--otlp-endpoint", collector.as_str()];
    let mut agents: Vec<Syncing> =
        (1..4).map(|i| agent(&clusters, i, &hub_kc[i - 1], ns, if i == 1 { &traced } else { &[] })).collect();
    let logs = |agents: &[Syncing]| agents.iter().map(|a| a.log()).collect::<Vec<_>>().join("\n---\n");
    let u = users(&rt, &clusters, ns);
    let r = readers(&rt, &clusters, ns);
    rt.block_on(async {
        u[1].exported_service("web", "10.1.0.5").await;
        u[2].exported_service("web", "10.2.0.5").await;
        u[3].exported_service("db", "10.3.0.7").await;
    });
    waits(
        60,
        "every member imports web and db",
        || {
            (1..4).all(|i| {
                rt.block_on(r[i].import("web")).is_some() && rt.block_on(r[i].import("db")).is_some()
            })
        },
        || logs(&agents),
    );
    // The agent's reconciles reach the collector (a batch every 5 s).
    let web = format!("{ns}/web");
    waits(
        30,
        "cluster-2's agent's reconcile of web at the collector",
        || {
            spans(&received)
                .0
                .iter()
                .any(|s| s.name == "reconcile" && s.attributes.get("service") == Some(&web))
        },
        || logs(&agents),
    );
    // The hub itself is no member: nothing imported there.
    assert!(rt.block_on(r[0].import("web")).is_none());
    waits(
        30,
        "the exports' conditions written by their own agents",
        || {
            [1, 2]
                .iter()
                .all(|&i| rt.block_on(r[i].conditions("web")).iter().any(|c| c.starts_with("Ready=True")))
        },
        || logs(&agents),
    );

    // The trigger time travels through the hub: cluster-2's slice of web
    // changed at a time its annotation says reaches cluster-4's MCS slice;
    // the time alone changed again writes nothing, on the hub or in any
    // member.
    let stamp = |at: &str| {
        rt.block_on(u[1].endpoints_at("web-a", "web", json!([{"addresses": ["10.1.0.6"]}]), at));
    };
    let changed = Timestamp::now().to_string();
    stamp(&changed);
    waits(
        30,
        "cluster-4's slice of web from cluster-2 carries the change's trigger time",
        || rt.block_on(r[3].trigger_times("web", clusters.name(1))) == [changed.clone()],
        || logs(&agents),
    );
    let (written, unchanged) =
        ("clusterset_dns_hub_records_written_total", "clusterset_dns_hub_records_unchanged_total");
    let counts = |agents: &[Syncing]| {
        for a in agents {
            a.settle(0.0, 1.0, "the change reconciled");
        }
        let writes = agents.iter().map(|a| a.metric("clusterset_dns_sync_writes_total")).collect::<Vec<_>>();
        (writes, agents[0].metric(written), agents[0].metric(unchanged))
    };
    let before = counts(&agents);
    stamp(&Timestamp::now().to_string());
    waits(
        30,
        "cluster-2's agent saw its slice's new time",
        || agents[0].metric(unchanged) > before.2,
        || logs(&agents),
    );
    let after = counts(&agents);
    assert_eq!((&after.0, after.1), (&before.0, before.1), "a time alone written\n{}", logs(&agents));
    assert_eq!(rt.block_on(r[3].trigger_times("web", clusters.name(1))), [changed]);

    // An agent's hub identity writing another member's namespace: 403.
    let forbidden = rt.block_on(async {
        let hub = client_from(&hub_kc[0]).await;
        let ar = clusterset_dns::hub::record::resource();
        let api: Api<DynamicObject> = Api::namespaced_with(hub, "clusterset-member-cluster-3", &ar);
        let body: DynamicObject = serde_json::from_value(json!({
            "apiVersion": ar.api_version, "kind": "ExportRecord",
            "metadata": {"name": "hub-shop.web", "namespace": "clusterset-member-cluster-3"},
            "spec": {"endpointSlices": []}}))
        .expect("record");
        api.create(&PostParams::default(), &body).await
    });
    match forbidden {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 403, "{s:?}"),
        other => panic!("cluster-2 wrote cluster-3's namespace: {other:?}"),
    }

    // A member frozen: the others go on (a new export in cluster-2 reaches
    // cluster-3).
    {
        let _frozen = Frozen::new(clusters.pids(3).0);
        rt.block_on(u[1].exported_service("api", "10.1.0.9"));
        waits(
            30,
            "api imported in cluster-3 while cluster-4 is frozen",
            || rt.block_on(r[2].import("api")).is_some(),
            || logs(&agents),
        );
    }
    waits(
        60,
        "api imported in cluster-4 once it thaws",
        || rt.block_on(r[3].import("api")).is_some(),
        || logs(&agents),
    );

    // The hub frozen: every member keeps what it has, removes nothing.
    {
        let _frozen = Frozen::new(clusters.pids(0).0);
        std::thread::sleep(Duration::from_secs(25));
        for (i, reader) in r.iter().enumerate().skip(1) {
            for svc in ["web", "db", "api"] {
                assert!(
                    rt.block_on(reader.import(svc)).is_some(),
                    "{} lost {svc} with the hub frozen",
                    clusters.name(i)
                );
                // A silent hub says nothing of the members behind it.
                assert_eq!(
                    rt.block_on(reader.condition(svc, "clusterset-dns.io/SourcesReachable")).as_deref(),
                    Some("True"),
                    "{}: {svc} marked unreachable because the hub was frozen\n{}",
                    clusters.name(i),
                    logs(&agents)
                );
            }
        }
    }
    // It converges once the hub is back.
    rt.block_on(u[2].exported_service("cart", "10.2.0.11"));
    waits(
        60,
        "cart imported everywhere after the hub thawed",
        || (1..4).all(|i| rt.block_on(r[i].import("cart")).is_some()),
        || logs(&agents),
    );

    // cluster-4's agent killed: its export is kept everywhere (the default,
    // --on-member-lost=keep), marked unreachable once its heartbeat stops.
    assert_eq!(
        rt.block_on(r[1].condition("db", "clusterset-dns.io/SourcesReachable")).as_deref(),
        Some("True"),
        "db marked unreachable in cluster-2 before its agent was killed\n{}",
        logs(&agents)
    );
    agents[2].kill();
    waits(
        60,
        "db marked as from an unreachable source in cluster-2",
        || {
            rt.block_on(r[1].condition("db", "clusterset-dns.io/SourcesReachable")).as_deref()
                == Some("False")
        },
        || logs(&agents),
    );
    assert!(rt.block_on(r[1].import("db")).is_some(), "db removed after its agent stopped");

    // An idle restart of cluster-2's agent writes nothing, here or on the hub.
    agents[0].stop();
    let restarted = agent(&clusters, 1, &hub_kc[0], ns, &[]);
    restarted.settle(0.0, 1.0, "the restarted agent reconciled");
    std::thread::sleep(Duration::from_secs(3));
    restarted.settle(0.0, 1.0, "the restarted agent idle");
    assert_eq!(restarted.metric("clusterset_dns_sync_writes_total"), Some(0.0), "{}", restarted.log());
    assert_eq!(
        restarted.metric("clusterset_dns_hub_records_written_total"),
        Some(0.0),
        "{}",
        restarted.log()
    );
    assert!(restarted.metric("clusterset_dns_hub_records_unchanged_total").is_some_and(|n| n > 0.0));
}

/// `clusterset-dns hub reader`: serve's read-only hub identity
/// (deploy/hub/serve.yaml); returns its kubeconfig.
fn reader(clusters: &TestClusters, dir: &Path) -> PathBuf {
    let out = dir.join("hub-serve.kubeconfig");
    let done = Command::new(BIN)
        .args(["hub", "reader", "--hub-kubeconfig"])
        .arg(clusters.kubeconfig(0))
        .arg("--out")
        .arg(&out)
        .output()
        .expect("run hub reader");
    assert!(done.status.success(), "hub reader: {}", String::from_utf8_lossy(&done.stderr));
    out
}

/// Centralized DNS from the hub (issue 41): agents publish on a hub, one
/// `serve --hub-kubeconfig` (as the read-only identity of `hub reader`)
/// answers for the fleet per asking cluster, exactly as a push-centralized
/// `serve --cluster` over the same members answers; a change on a member
/// shows; a frozen hub demotes no one and removes nothing; a stopped
/// agent's heartbeat demotes its member, whose answers are kept.
#[test]
fn serve_from_the_hub_answers_as_push_centralized_answers_the_same_fleet() {
    let clusters = TestClusters::start(3);
    let rt = runtime();
    let ns = "hub-dns";
    let dir = tempfile::tempdir().expect("tempdir");
    let hub_kc: Vec<PathBuf> = (1..3).map(|i| enrol(&clusters, clusters.name(i), dir.path())).collect();
    let mut agents: Vec<Syncing> = (1..3).map(|i| agent(&clusters, i, &hub_kc[i - 1], ns, &[])).collect();
    let u = users(&rt, &clusters, ns);
    let (two, three) = (clusters.name(1), clusters.name(2));
    rt.block_on(async {
        u[1].exported_service("web", "10.2.0.5").await;
        u[2].exported_service("web", "10.3.0.5").await;
        // db (headless, in cluster-2) only for cluster-3.
        u[1].service("db", json!({"clusterIP": "None"})).await;
        u[1].endpoints("db-x", "db", json!([{"addresses": ["10.2.0.7"], "hostname": "db-0"}])).await;
        u[1].annotated_export("db", json!({"clusterset-dns.io/consumer-clusters": three})).await;
    });
    // Asking clusters by EDNS Client Subnet, believed from 127.0.0.1 only.
    let nets = [format!("198.51.100.0/24={two}"), format!("203.0.113.0/24={three}")];
    // Heartbeats are renewed every 5/3 s (agents' --lease-duration 5). Dead
    // after 8 s, not 5: once a frozen hub thaws, its backlog can hold a
    // renewal back by a period or two, and the stillness seen before the
    // freeze (up to a period and a read) counts on; 12 s frozen still tests
    // that a silent hub demotes no one.
    let mut common = vec!["--trust-ecs-from", "127.0.0.1", "--cluster-dead-after", "8"];
    for n in &nets {
        common.extend(["--client-cluster", n.as_str()]);
    }
    let reader_kc = reader(&clusters, dir.path()).display().to_string();
    let mut args = vec!["--hub-kubeconfig", reader_kc.as_str()];
    args.extend(&common);
    let hub = Served::start(&args);
    let members: Vec<String> = (1..3)
        .map(|i| format!("{}={}", clusters.name(i), clusters.role_kubeconfig(i, "centralized").display()))
        .collect();
    let mut args = common.clone();
    for m in &members {
        args.extend(["--cluster", m.as_str()]);
    }
    let push = Served::start(&args);
    let logs = |agents: &[Syncing]| {
        let agents: Vec<String> = agents.iter().map(|a| a.log()).collect();
        format!("serve --hub-kubeconfig:\n{}\n---\n{}", hub.log(), agents.join("\n---\n"))
    };
    let (from_two, from_three) = ("+subnet=198.51.100.0/24", "+subnet=203.0.113.0/24");
    // Status and sorted answer lines of one question asked as one client.
    let ask = |s: &Served, name: &str, t: &str, from: &str| {
        let mut a = vec![name, t, "+noall", "+comments", "+answer"];
        if !from.is_empty() {
            a.push(from);
        }
        let out = s.dig(&a);
        let status =
            out.split("status: ").nth(1).and_then(|r| r.split(',').next()).unwrap_or("none").to_owned();
        let mut answers: Vec<String> = out
            .lines()
            .filter(|l| !l.starts_with(';') && !l.trim().is_empty())
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            .collect();
        answers.sort();
        (status, answers)
    };
    let web = format!("web.{ns}.svc.clusterset.local");
    let db = format!("db.{ns}.svc.clusterset.local");
    let questions = [
        (web.clone(), "A"),
        (format!("_http._tcp.{web}"), "SRV"),
        (db.clone(), "A"),
        (format!("db-0.{two}.{db}"), "A"),
        (format!("_http._tcp.{db}"), "SRV"),
    ];
    let every = |s: &Served| {
        let mut all = Vec::new();
        for (name, t) in &questions {
            for from in [from_two, from_three, ""] {
                all.push(((name.clone(), *t, from), ask(s, name, t, from)));
            }
        }
        all
    };
    waits(
        90,
        "both servers answer web from both members and db to cluster-3",
        || {
            [&hub, &push]
                .iter()
                .all(|s| ask(s, &web, "A", "").1.len() == 2 && ask(s, &db, "A", from_three).1.len() == 1)
        },
        || logs(&agents),
    );
    let from_hub = every(&hub);
    assert_eq!(from_hub, every(&push), "the hub's answers differ from push-centralized's\n{}", logs(&agents));
    // Per asking cluster: db exists for cluster-3 only.
    assert_eq!(ask(&hub, &db, "A", from_two).0, "NXDOMAIN");
    assert_eq!(ask(&hub, &db, "A", "").0, "NXDOMAIN", "an unknown client");
    assert!(ask(&hub, &db, "A", from_three).1[0].ends_with("A 10.2.0.7"), "{from_hub:?}");

    // A change on a member reaches serve through its agent and the hub.
    rt.block_on(u[1].endpoints("db-x", "db", json!([{"addresses": ["10.2.0.8"], "hostname": "db-0"}])));
    waits(
        60,
        "db's new endpoint answered from the hub",
        || ask(&hub, &db, "A", from_three).1.first().is_some_and(|a| a.ends_with("A 10.2.0.8")),
        || logs(&agents),
    );

    // The hub frozen past --cluster-dead-after: every answer kept, no
    // member demoted.
    let alive =
        |cluster: &str| metric(&hub, &format!("clusterset_dns_cluster_alive{{cluster=\"{cluster}\"}}"));
    waits(
        30,
        "both members alive",
        || alive(two) == Some(1.0) && alive(three) == Some(1.0),
        || logs(&agents),
    );
    let before = every(&hub);
    {
        let _frozen = Frozen::new(clusters.pids(0).0);
        std::thread::sleep(Duration::from_secs(12));
        assert_eq!(every(&hub), before, "answers changed with the hub frozen");
        assert_eq!(
            (alive(two), alive(three)),
            (Some(1.0), Some(1.0)),
            "demoted by a frozen hub\n{}",
            logs(&agents)
        );
    }
    // cluster-3's agent stopped: its heartbeat stands still, its member is
    // demoted, its export kept.
    agents[1].kill();
    waits(
        30,
        "cluster-3 not alive once its heartbeat stopped",
        || alive(three) == Some(0.0),
        || logs(&agents),
    );
    assert_eq!(alive(two), Some(1.0), "cluster-2 demoted with cluster-3\n{}", logs(&agents));
    assert_eq!(ask(&hub, &web, "A", "").1.len(), 2, "cluster-3's export removed\n{}", logs(&agents));
    assert_eq!(metric(&hub, "clusterset_dns_hub_records_skipped_total"), Some(0.0));
}
