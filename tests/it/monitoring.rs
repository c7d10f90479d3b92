//! `deploy/monitoring/`: the Grafana dashboard and the Prometheus alert rules
//! query only metrics that clusterset-dns exports. The list is scraped from
//! real running processes: `serve` with the embedded fleet (answers, endpoint
//! health), centralized `serve --cluster` against a real API server (member
//! liveness, watch staleness), `sync` on the shared clusters (writes,
//! conflicts, members) and `setup-dns --watch=report` (the wiring). The
//! rules are checked for structure (every rule an
//! alert with an expression, a severity and a summary; balanced brackets).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use crate::harness::clusters::shared;
use crate::harness::eventually;
use crate::harness::served::Served;
use crate::harness::syncing::Syncing;

fn monitoring_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/monitoring")
}

/// Metric names in a text exposition (histograms with their `_bucket`,
/// `_sum` and `_count` series).
fn names(exposition: &str) -> BTreeSet<String> {
    exposition
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_owned)
        .collect()
}

/// Tokens of a PromQL expression that name one of our metrics (CoreDNS's
/// names or ours); label names and functions never start with these.
fn metrics_in(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut token = String::new();
    let mut in_string = false;
    for c in expr.chars().chain([' ']) {
        if c == '"' {
            in_string = !in_string;
        }
        if !in_string && (c.is_ascii_alphanumeric() || c == '_' || c == ':') {
            token.push(c);
        } else {
            if token.starts_with("coredns_") || token.starts_with("clusterset_dns_") {
                out.push(token.clone());
            }
            token.clear();
        }
    }
    out
}

fn balanced(expr: &str) -> bool {
    let mut stack = Vec::new();
    for c in expr.chars() {
        match c {
            '(' | '{' | '[' => stack.push(c),
            ')' | '}' | ']' => {
                let open = stack.pop();
                if open
                    != Some(match c {
                        ')' => '(',
                        '}' => '{',
                        _ => '[',
                    })
                {
                    return false;
                }
            }
            _ => {}
        }
    }
    stack.is_empty()
}

/// Every metric name a running serve (both modes) and sync export.
fn exported() -> BTreeSet<String> {
    let mut all = BTreeSet::new();
    // The embedded fleet: headless services answered with endpoints.
    let s = Served::start(&[]);
    s.wait_ready(std::time::Duration::from_secs(20));
    for name in
        ["db.shop.svc.clusterset.local", "cache.shop.svc.clusterset.local", "web.shop.svc.clusterset.local"]
    {
        s.dig(&[name, "A", "+short"]);
    }
    // A query with the DO bit (coredns_dns_do_requests_total), and one over TCP.
    s.dig(&["web.shop.svc.clusterset.local", "A", "+dnssec", "+tcp"]);
    // The workers add their answer counts up when idle, within a second.
    // The series per service are not on /metrics by default (the
    // dashboard must do without them); the per-cluster sums are.
    let mut body = String::new();
    let families = [
        "clusterset_dns_cluster_answers_total",
        "clusterset_dns_cluster_endpoints",
        "clusterset_dns_udp_workers",
    ];
    eventually("serve exports answers, endpoints and UDP workers", || {
        body = s.get("/metrics").1;
        families.iter().all(|f| body.contains(&format!("\n{f}{{")))
    });
    all.extend(names(&body));

    // Centralized: a member, watched through a real API server.
    let clusters = shared();
    let member = format!("{}={}", clusters.name(0), clusters.kubeconfig(0).display());
    let c = Served::start(&["--cluster", &member]);
    c.wait_ready(std::time::Duration::from_secs(30));
    eventually("centralized serve exports member liveness and watch staleness", || {
        body = c.get("/metrics").1;
        body.contains("clusterset_dns_cluster_alive{") && body.contains("clusterset_dns_watch_stale_seconds{")
    });
    all.extend(names(&body));

    let sync = Syncing::start(clusters, &["--no-leader-election"], &[]);
    eventually("sync exports its families", || {
        body = sync.get("/metrics");
        body.contains("clusterset_dns_sync_member_stale_seconds{")
            && body.contains("clusterset_dns_sync_conflicts ")
    });
    all.extend(names(&body));

    // setup-dns --watch=report: on the shared clusters, which run no
    // cluster DNS, the layout is unknown; it reads, never writes.
    let http = format!("127.0.0.1:{}", crate::coredns::free_port());
    let child = std::process::Command::new(crate::harness::BIN)
        .args(["setup-dns", "--kubeconfig"])
        .arg(clusters.kubeconfig(0))
        .args(["--watch=report", "--server", "127.0.0.1:53", "--no-verify", "--http-listen", &http])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start setup-dns --watch");
    let mut child = crate::harness::process::Owned::new(child);
    eventually("setup-dns --watch exports clusterset_dns_wiring_ok", || {
        body = crate::harness::http::try_http_get(http.parse().expect("addr"), "/metrics")
            .map(|(_, b)| b)
            .unwrap_or_default();
        body.contains("clusterset_dns_wiring_ok{")
    });
    child.kill();
    all.extend(names(&body));
    all
}

#[derive(Deserialize)]
struct Rules {
    groups: Vec<Group>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Group {
    name: String,
    rules: Vec<Rule>,
}

/// An alerting rule (`alert`) or a recording rule (`record`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Rule {
    alert: Option<String>,
    record: Option<String>,
    expr: String,
    #[serde(rename = "for")]
    for_: Option<String>,
    #[serde(default)]
    labels: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    annotations: std::collections::BTreeMap<String, String>,
}

/// Names of series recorded by rules (`level:metric:operations`) in an
/// expression.
fn recorded_in(expr: &str) -> Vec<String> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|t| t.contains(":clusterset_dns_"))
        .map(str::to_owned)
        .collect()
}

/// The dashboard's expressions, and the rules' (alert, expression) pairs.
fn dashboard_exprs() -> Vec<String> {
    let text =
        std::fs::read_to_string(monitoring_dir().join("grafana-dashboard.json")).expect("read dashboard");
    let dashboard: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let mut exprs = Vec::new();
    fn walk(v: &Value, exprs: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                for (k, v) in m {
                    if (k == "expr" || k == "query") && v.is_string() {
                        exprs.push(v.as_str().unwrap_or_default().to_owned());
                    }
                    walk(v, exprs);
                }
            }
            Value::Array(a) => a.iter().for_each(|v| walk(v, exprs)),
            _ => {}
        }
    }
    walk(&dashboard, &mut exprs);
    exprs.retain(|e| e != "prometheus");
    exprs
}

fn rules() -> Vec<Rule> {
    let text = std::fs::read_to_string(monitoring_dir().join("alerts.yaml")).expect("read alerts.yaml");
    let rules: Rules = serde_yaml_ng::from_str(&text).expect("alerts.yaml: groups of rules");
    assert!(rules.groups.iter().all(|g| !g.name.is_empty()));
    rules.groups.into_iter().flat_map(|g| g.rules).collect()
}

#[test]
fn the_dashboard_and_the_alerts_use_only_exported_metrics() {
    let exported = exported();
    let exprs = dashboard_exprs();
    assert!(exprs.len() > 20, "the dashboard has {} queries", exprs.len());
    let mut used = BTreeSet::new();
    for expr in &exprs {
        let metrics = metrics_in(expr);
        assert!(!metrics.is_empty(), "dashboard query names none of our metrics: {expr}");
        assert!(balanced(expr), "dashboard query unbalanced: {expr}");
        for m in metrics {
            assert!(
                exported.contains(&m),
                "dashboard query uses {m}, which /metrics does not export: {expr}"
            );
            used.insert(m);
        }
    }
    // What the dashboard is for: CoreDNS's panels and ours.
    for m in [
        "coredns_dns_requests_total",
        "coredns_dns_responses_total",
        "coredns_dns_request_duration_seconds_bucket",
        "clusterset_dns_cluster_answers_total",
        "clusterset_dns_cluster_endpoints",
        "clusterset_dns_cluster_alive",
        "clusterset_dns_sync_member_stale_seconds",
        "clusterset_dns_watch_stale_seconds",
        "clusterset_dns_sync_writes_total",
        "clusterset_dns_sync_conflicts",
        "clusterset_dns_udp_workers",
        "clusterset_dns_tcp_connections_shed_total",
        "clusterset_dns_programming_duration_seconds_bucket",
        "clusterset_dns_programming_unmeasured_total",
        "clusterset_dns_sync_reconciles_total",
    ] {
        assert!(used.contains(m), "the dashboard shows no {m}");
    }

    let rules = rules();
    // Recording rules (the programming latency SLO): named in Prometheus's
    // level:metric:operations form, over exported metrics only.
    let mut recorded = BTreeSet::new();
    for rule in rules.iter().filter(|r| r.alert.is_none()) {
        let name = rule.record.as_deref().expect("a rule is an alert or a record");
        assert!(name.split(':').count() == 3 && name.contains(":clusterset_dns_"), "recorded as {name}");
        assert!(balanced(&rule.expr), "{name}: unbalanced expression");
        assert!(
            rule.for_.is_none() && rule.annotations.is_empty(),
            "{name}: a record has no for or annotations"
        );
        let metrics = metrics_in(&rule.expr);
        assert!(!metrics.is_empty(), "{name} names none of our metrics");
        for m in metrics {
            assert!(exported.contains(&m), "{name} uses {m}, which /metrics does not export");
        }
        recorded.insert(name.to_owned());
    }
    for m in [
        "service_kind:clusterset_dns_programming_duration_seconds:p99_5m",
        "cause:clusterset_dns_programming_unmeasured:ratio_5m",
    ] {
        assert!(recorded.contains(m), "no recording rule {m}");
    }
    let mut paged = BTreeSet::new();
    let mut alerted = BTreeSet::new();
    for rule in &rules {
        let Some(alert) = &rule.alert else { continue };
        assert!(rule.record.is_none(), "{alert} is also a record");
        assert!(alert.starts_with("ClusterSetDNS"), "{alert}");
        assert!(balanced(&rule.expr), "{alert}: unbalanced expression");
        for r in recorded_in(&rule.expr) {
            assert!(recorded.contains(&r), "{alert} uses {r}, which no rule records");
            alerted.insert(r);
        }
        assert!(rule.annotations.get("summary").is_some_and(|s| !s.is_empty()), "{alert}: no summary");
        let severity = rule.labels.get("severity").map(String::as_str);
        assert!(matches!(severity, Some("page" | "warning")), "{alert}: severity {severity:?}");
        if let Some(f) = &rule.for_ {
            assert!(f.trim_end_matches(['s', 'm', 'h']).parse::<u32>().is_ok(), "{alert}: for: {f}");
        }
        let metrics = metrics_in(&rule.expr);
        assert!(
            !metrics.is_empty() || !recorded_in(&rule.expr).is_empty(),
            "{alert} names none of our metrics"
        );
        for m in metrics {
            assert!(exported.contains(&m), "{alert} uses {m}, which /metrics does not export");
            if severity == Some("page") {
                paged.insert(m);
            }
        }
    }
    // What must page: UDP workers gone, stale watches, members lost,
    // conflicts, the cluster DNS no longer wired.
    for m in [
        "clusterset_dns_wiring_ok",
        "clusterset_dns_udp_workers",
        "clusterset_dns_watch_stale_seconds",
        "clusterset_dns_cluster_alive",
        "clusterset_dns_sync_member_stale_seconds",
        "clusterset_dns_sync_conflicts",
    ] {
        assert!(paged.contains(m), "no paging alert on {m}");
    }
    assert!(
        alerted.contains("service_kind:clusterset_dns_programming_duration_seconds:p99_5m"),
        "no alert on the DNS programming latency SLO"
    );
}

/// The checks above can fail: a name that is not exported is caught.
#[test]
fn the_metric_name_check_catches_a_name_not_exported() {
    let metrics = metrics_in(r#"sum by (zone) (rate(coredns_dns_request_total{job="x"}[5m])) + up"#);
    assert_eq!(metrics, ["coredns_dns_request_total"]);
    let s = Served::start(&[]);
    s.wait_ready(std::time::Duration::from_secs(20));
    let exported = names(&s.get("/metrics").1);
    assert!(exported.contains("coredns_dns_requests_total") || !exported.is_empty());
    assert!(!exported.contains("coredns_dns_request_total"), "a misspelt name is exported");
    assert!(!balanced("sum(rate(x[5m])"), "an unbalanced expression passes");
    // An alert on a recorded series is checked against the records: the
    // series is found (a misspelt one would then not be recorded), and a
    // metric's own name is not taken for one.
    let alert = "max by (service_kind) (service_kind:clusterset_dns_programming_duraton_seconds:p99_5m) > 2";
    assert_eq!(recorded_in(alert), ["service_kind:clusterset_dns_programming_duraton_seconds:p99_5m"]);
    let recorded = rules().into_iter().filter_map(|r| r.record).collect::<BTreeSet<_>>();
    assert!(!recorded.contains(&recorded_in(alert)[0]), "a misspelt record is recorded");
    assert!(recorded_in("rate(clusterset_dns_programming_duration_seconds_count[5m])").is_empty());
}
