//! `sync --otlp-endpoint`: the controller's spans reach an OpenTelemetry
//! collector. The collector here is a minimal OTLP/HTTP receiver on
//! loopback (a thread that answers each POST with 200 and keeps its body);
//! every body is decoded as the OTLP protobuf `ExportTraceServiceRequest`,
//! so what is checked is what a real collector would read: one export,
//! from its reconcile to each member's write, in one trace. (`agent
//! --otlp-endpoint` is checked in `it/hub`, with this receiver.)

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, any_value};
use prost::Message;

use crate::fleet::User;
use crate::harness::clusters::shared;
use crate::harness::within;
use crate::sync::syncing;
use crate::watch::runtime;

/// What the receiver was sent: each POST's path and body.
pub(crate) type Received = Arc<Mutex<Vec<(String, Vec<u8>)>>>;

/// An OTLP/HTTP receiver on loopback: answers every request 200 with an
/// empty protobuf body. Bounded: it stops after 10,000 requests.
pub(crate) fn receiver() -> (String, Received) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind the receiver");
    let addr = listener.local_addr().expect("its address");
    let received: Received = Arc::default();
    let keep = received.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().take(10_000) {
            let Ok(mut stream) = stream else { continue };
            let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
            let keep = keep.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().expect("clone the connection"));
                // HTTP/1.1 keep-alive: requests one after the other.
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let path = line.split_whitespace().nth(1).unwrap_or_default().to_owned();
                    let mut length = 0;
                    loop {
                        let mut header = String::new();
                        if reader.read_line(&mut header).unwrap_or(0) == 0 {
                            return;
                        }
                        let header = header.trim_end();
                        if header.is_empty() {
                            break;
                        }
                        if let Some((k, v)) = header.split_once(':')
                            && k.eq_ignore_ascii_case("content-length")
                        {
                            length = v.trim().parse().unwrap_or(0);
                        }
                    }
                    let mut body = vec![0; length];
                    if reader.read_exact(&mut body).is_err() {
                        return;
                    }
                    keep.lock().expect("received").push((path, body));
                    let answer = "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
                    if stream.write_all(answer.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (format!("http://{addr}/v1/traces"), received)
}

/// One span as the collector reads it.
#[derive(Debug, Clone)]
pub(crate) struct Span {
    trace: Vec<u8>,
    id: Vec<u8>,
    parent: Vec<u8>,
    pub(crate) name: String,
    pub(crate) attributes: BTreeMap<String, String>,
}

fn text(v: &Option<AnyValue>) -> String {
    match v.as_ref().and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

/// Every span of every request, and the service name each came from.
pub(crate) fn spans(received: &Received) -> (Vec<Span>, BTreeSet<String>) {
    let mut out = Vec::new();
    let mut services = BTreeSet::new();
    for (path, body) in received.lock().expect("received").iter() {
        assert_eq!(path, "/v1/traces");
        let request = ExportTraceServiceRequest::decode(&body[..]).expect("an OTLP protobuf trace export");
        for resource in request.resource_spans {
            for kv in resource.resource.iter().flat_map(|r| &r.attributes) {
                if kv.key == "service.name" {
                    services.insert(text(&kv.value));
                }
            }
            for scope in resource.scope_spans {
                for s in scope.spans {
                    out.push(Span {
                        trace: s.trace_id,
                        id: s.span_id,
                        parent: s.parent_span_id,
                        name: s.name,
                        attributes: s.attributes.iter().map(|kv| (kv.key.clone(), text(&kv.value))).collect(),
                    });
                }
            }
        }
    }
    (out, services)
}

#[test]
fn an_exports_reconcile_reaches_the_collector_with_every_members_write_in_its_trace() {
    let clusters = shared();
    let rt = runtime();
    let ns = "traced";
    let user = rt.block_on(User::new(clusters, 0, ns));
    for i in 1..clusters.len() {
        rt.block_on(User::new(clusters, i, ns));
    }
    rt.block_on(user.exported_service("web", "10.40.0.1"));
    let (endpoint, received) = receiver();
    let sync = syncing(clusters, ns, &["--otlp-endpoint", &endpoint]);
    // The SDK sends a batch every 5 s or every 512 spans.
    let service = format!("{ns}/web");
    let mut found = Vec::new();
    let arrived = within(Duration::from_secs(60), || {
        let (all, _) = spans(&received);
        found = all;
        found.iter().any(|s| s.name == "reconcile" && s.attributes.get("service") == Some(&service))
            && found.iter().filter(|s| s.name == "write").count() >= 3 * clusters.len()
    });
    assert!(
        arrived,
        "no reconcile of {service} with its writes at the collector: {found:#?}\n{}",
        sync.log()
    );
    let (all, services) = spans(&received);
    assert_eq!(services, ["clusterset-dns".to_owned()].into());
    let reconcile = all
        .iter()
        .find(|s| s.name == "reconcile" && s.attributes.get("service") == Some(&service))
        .expect("the reconcile");
    let a = &reconcile.attributes;
    for key in ["shard", "reason", "members_written", "writes", "outcome"] {
        assert!(a.contains_key(key), "the reconcile span has no {key}: {a:?}");
    }
    assert_eq!(a["outcome"], "ok", "{a:?}");
    assert_eq!(a["members_written"], clusters.len().to_string(), "{a:?}");
    // Its member lanes are its children, and every write is a child of one:
    // the trace holds the export's way to every member.
    let in_trace: Vec<&Span> = all.iter().filter(|s| s.trace == reconcile.trace).collect();
    let lanes: Vec<&&Span> =
        in_trace.iter().filter(|s| s.name == "member" && s.parent == reconcile.id).collect();
    let members: BTreeSet<&str> =
        lanes.iter().filter_map(|s| s.attributes.get("member").map(String::as_str)).collect();
    let names: BTreeSet<String> = (0..clusters.len()).map(|i| clusters.name(i).to_owned()).collect();
    assert_eq!(members, names.iter().map(String::as_str).collect(), "{in_trace:#?}");
    for member in &names {
        let lane_ids: Vec<&Vec<u8>> =
            lanes.iter().filter(|s| s.attributes.get("member") == Some(member)).map(|s| &s.id).collect();
        let kinds: BTreeSet<&str> = in_trace
            .iter()
            .filter(|s| s.name == "write" && lane_ids.contains(&&s.parent))
            .filter_map(|s| s.attributes.get("kind").map(String::as_str))
            .collect();
        assert!(
            ["ServiceImport", "EndpointSlice"].iter().all(|k| kinds.contains(k)),
            "{member}: writes {kinds:?}"
        );
    }
}
