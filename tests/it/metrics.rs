//! `/metrics` speaks CoreDNS's names and labels, so dashboards built for
//! CoreDNS work unchanged; our own metrics sit under `clusterset_dns_`.

use crate::binary::{Served, eventually};

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
