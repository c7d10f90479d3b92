//! `/metrics` speaks CoreDNS's names and labels, so dashboards built for
//! CoreDNS work unchanged; our own metrics sit under `clusterset_dns_`.

use crate::harness::eventually;
use crate::harness::served::Served;

fn value(body: &str, series: &str) -> Option<f64> {
    body.lines().find(|l| l.starts_with(series)).and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

#[test]
fn query_metrics_use_coredns_names_and_labels() {
    let s = Served::start(&[]);
    for _ in 0..3 {
        s.dig(&["web.shop.svc.clusterset.local", "A", "+short"]);
    }
    s.dig(&["nope.shop.svc.clusterset.local", "A", "+dnssec"]);
    s.dig(&["db.shop.svc.clusterset.local", "SRV", "+tcp"]);
    s.dig(&["example.com", "A"]);
    let server = format!("dns://{}", s.addr);
    let zone = "clusterset.local.";
    let a = format!(
        r#"coredns_dns_requests_total{{family="1",proto="udp",server="{server}",type="A",view="",zone="{zone}"}}"#
    );
    let srv_tcp = format!(
        r#"coredns_dns_requests_total{{family="1",proto="tcp",server="{server}",type="SRV",view="",zone="{zone}"}}"#
    );
    let refused = format!(
        r#"coredns_dns_responses_total{{plugin="clusterset",rcode="REFUSED",server="{server}",view="",zone="dropped"}}"#
    );
    // Workers flush their counts when idle for 0.2 s or every second.
    let mut body = String::new();
    eventually("query counters flushed", || {
        body = s.get("/metrics").1;
        [(&a, 4.0), (&srv_tcp, 1.0), (&refused, 1.0)]
            .iter()
            .all(|(series, n)| value(&body, series) == Some(*n))
    });
    let nx = format!(
        r#"coredns_dns_responses_total{{plugin="clusterset",rcode="NXDOMAIN",server="{server}",view="",zone="{zone}"}}"#
    );
    assert_eq!(value(&body, &nx), Some(1.0), "{body}");
    let noerror = format!(
        r#"coredns_dns_responses_total{{plugin="clusterset",rcode="NOERROR",server="{server}",view="",zone="{zone}"}}"#
    );
    assert_eq!(value(&body, &noerror), Some(4.0), "{body}");
    // Outside every zone counts under CoreDNS's `dropped` zone (checked above).
    let dos = format!(r#"coredns_dns_do_requests_total{{server="{server}",view="",zone="{zone}"}}"#);
    assert_eq!(value(&body, &dos), Some(1.0), "{body}");
    let count =
        format!(r#"coredns_dns_request_duration_seconds_count{{server="{server}",view="",zone="{zone}"}}"#);
    assert_eq!(value(&body, &count), Some(5.0), "{body}");
    let le = format!(
        r#"coredns_dns_request_duration_seconds_bucket{{server="{server}",view="",zone="{zone}",le="8.192"}}"#
    );
    assert_eq!(value(&body, &le), Some(5.0), "{body}");
    for family in ["coredns_dns_request_size_bytes_bucket", "coredns_dns_response_size_bytes_sum"] {
        assert!(body.contains(family), "{family} missing:\n{body}");
    }
    for ours in ["clusterset_dns_services 6", "clusterset_dns_ready 1", "clusterset_dns_snapshot_serial"] {
        assert!(body.contains(ours), "{ours} missing:\n{body}");
    }
}

/// A headless service with one endpoint in each of two clusters, both on
/// TCP `port`.
fn two_cluster_service(port: u16) -> String {
    let slice = |cluster: &str, ip: &str| {
        format!(
            "---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: hl-{cluster}
  namespace: shop
  labels: {{multicluster.kubernetes.io/service-name: hl, multicluster.kubernetes.io/source-cluster: {cluster}}}
addressType: IPv4
ports: [{{name: tcp, protocol: TCP, port: {port}}}]
endpoints: [{{addresses: [{ip}]}}]
"
        )
    };
    format!(
        "apiVersion: multicluster.x-k8s.io/v1beta1
kind: ServiceImport
metadata: {{name: hl, namespace: shop}}
spec: {{type: Headless, ports: [{{name: tcp, protocol: TCP, port: {port}}}]}}
{}{}",
        slice("cluster-a", "127.0.0.5"),
        slice("cluster-b", "127.0.0.6")
    )
}

/// Serves [`two_cluster_service`] with probes every 0.1 s, and `extra`.
fn probed(port: u16, dir: &std::path::Path, extra: &[&str]) -> Served {
    let file = dir.join("hl.yaml");
    std::fs::write(&file, two_cluster_service(port)).expect("write objects");
    let file = file.to_str().expect("utf-8 path").to_owned();
    let mut args = vec!["--objects", &file, "--probe", "--probe-interval", "0.1", "--probe-timeout", "0.5"];
    args.extend_from_slice(extra);
    Served::start(&args)
}

fn per_service_endpoints(cluster: &str, state: &str) -> String {
    format!(r#"clusterset_dns_endpoints{{cluster="{cluster}",service="shop/hl",state="{state}"}}"#)
}

fn per_service_answers(cluster: &str) -> String {
    format!(r#"clusterset_dns_answers_total{{cluster="{cluster}",service="shop/hl"}}"#)
}

#[test]
fn probes_and_answers_are_summed_per_cluster_and_per_service_on_request_without_addresses() {
    // cluster-a's endpoint listens; cluster-b's port is closed (refused).
    let listener = std::net::TcpListener::bind("127.0.0.5:0").expect("bind 127.0.0.5");
    let port = listener.local_addr().expect("addr").port();
    let dir = tempfile::tempdir().expect("tempdir");
    let s = probed(port, dir.path(), &[]);
    let cluster = |cluster: &str, state: &str| {
        format!(r#"clusterset_dns_cluster_endpoints{{cluster="{cluster}",state="{state}"}}"#)
    };
    let mut body = String::new();
    eventually("cluster-b's closed port probed down", || {
        body = s.get("/metrics").1;
        value(&body, &cluster("cluster-b", "unhealthy")) == Some(1.0)
    });
    assert_eq!(value(&body, &cluster("cluster-a", "healthy")), Some(1.0), "{body}");
    assert_eq!(value(&body, &cluster("cluster-a", "unhealthy")), Some(0.0), "{body}");
    assert!(s.wait_log("probe verdict changed"), "{}", s.log());
    let name = "hl.shop.svc.clusterset.local";
    for _ in 0..4 {
        assert_eq!(s.dig(&[name, "A", "+short"]).trim(), "127.0.0.5", "the down endpoint is left out");
    }
    s.dig(&[name, "A", "+tcp", "+short"]);
    let answers = |cluster: &str| format!(r#"clusterset_dns_cluster_answers_total{{cluster="{cluster}"}}"#);
    eventually("answers counted per cluster", || {
        body = s.get("/metrics").1;
        value(&body, &answers("cluster-a")) == Some(5.0)
    });
    assert_eq!(value(&body, &answers("cluster-b")), Some(0.0), "never in an answer, counted from 0: {body}");
    // Nothing per service on /metrics by default: it grows with the fleet.
    for family in ["clusterset_dns_endpoints{", "clusterset_dns_answers_total{"] {
        assert!(!body.contains(family), "{family} on /metrics without --metrics-per-service:\n{body}");
    }
    // The per-service view on request, from loopback (--allow-debug's default).
    let (status, per_service) = s.get("/debug/metrics");
    assert_eq!(status, 200, "{per_service}");
    assert_eq!(
        value(&per_service, &per_service_endpoints("cluster-b", "unhealthy")),
        Some(1.0),
        "{per_service}"
    );
    assert_eq!(
        value(&per_service, &per_service_endpoints("cluster-a", "healthy")),
        Some(1.0),
        "{per_service}"
    );
    assert_eq!(value(&per_service, &per_service_answers("cluster-a")), Some(5.0), "{per_service}");
    assert_eq!(
        value(&per_service, &per_service_answers("cluster-b")),
        None,
        "never in an answer: {per_service}"
    );
    assert!(!per_service.contains("clusterset_dns_cluster_"), "only the per-service families: {per_service}");
    for text in [&body, &per_service] {
        assert!(!text.contains("127.0.0.5") && !text.contains("127.0.0.6"), "no per-address labels:\n{text}");
    }
    drop(listener);
}

#[test]
fn metrics_per_service_puts_the_series_per_service_on_metrics_too() {
    let listener = std::net::TcpListener::bind("127.0.0.5:0").expect("bind 127.0.0.5");
    let port = listener.local_addr().expect("addr").port();
    let dir = tempfile::tempdir().expect("tempdir");
    let s = probed(port, dir.path(), &["--metrics-per-service"]);
    s.dig(&["hl.shop.svc.clusterset.local", "A", "+tcp", "+short"]);
    let mut body = String::new();
    eventually("per-service and per-cluster series on /metrics", || {
        body = s.get("/metrics").1;
        value(&body, &per_service_endpoints("cluster-b", "unhealthy")) == Some(1.0)
            && value(&body, &per_service_answers("cluster-a")).is_some()
            && value(&body, r#"clusterset_dns_cluster_endpoints{cluster="cluster-b",state="unhealthy"}"#)
                == Some(1.0)
    });
    drop(listener);
}
