//! EndpointSlices in Kubernetes protobuf (`k8s::protobuf`), two ways,
//! chosen by the first byte:
//!
//! - **bytes** (0: a list response, 1: a watch stream's frames, 2: an
//!   error response): whatever the rest is, reading it never panics; a
//!   slice that reads converts without panicking, and a slice it refuses
//!   is named as `ConvertError` promises (`EndpointSlice ns/name: field:
//!   …`).
//! - **structure** (3 and above): a slice built from the input (names,
//!   addresses, ports, conditions and references drawn from sets that hit
//!   every rule of the conversion), encoded as kube-apiserver encodes it,
//!   converts to exactly what the same slice converts to through JSON (as
//!   the API server would write it: plain strings left out when empty).
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use clusterset_dns::k8s::convert;
use clusterset_dns::k8s::protobuf::{SliceView, decode, slice};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    match mode {
        0 => list(rest),
        1 => frames(rest),
        2 => {
            let _ = decode::envelope_of(rest, "Status").and_then(decode::status);
        }
        _ => {
            if let Ok(s) = Slice::arbitrary(&mut Unstructured::new(rest)) {
                same_both_ways(&s.build());
            }
        }
    }
});

/// A slice message read and converted: never a panic, errors named.
fn read(message: &[u8]) {
    let Ok(view) = SliceView::parse(message) else {
        let _ = slice::identity(message);
        return;
    };
    if let Err(e) = convert::endpoint_slice(&view) {
        let shown = e.to_string();
        assert!(shown.starts_with("EndpointSlice "), "{shown}");
        assert!(!e.field.is_empty(), "{shown}");
    }
}

fn list(body: &[u8]) {
    let Ok(raw) = decode::envelope_of(body, "EndpointSliceList") else { return };
    let Ok(list) = decode::list(raw) else { return };
    for item in list.items {
        read(item);
    }
}

/// 4-byte big-endian lengths, each before a watch event.
fn frames(mut stream: &[u8]) {
    while let Some((length, rest)) = stream.split_first_chunk::<4>() {
        let length = (u32::from_be_bytes(*length) as usize).min(rest.len());
        let (frame, next) = rest.split_at(length);
        stream = next;
        let Ok(event) = decode::watch_event(frame) else { continue };
        let Ok(envelope) = decode::envelope(event.object) else { continue };
        let _ = slice::version_and_end(envelope.raw);
        read(envelope.raw);
    }
}

fn same_both_ways(s: &EndpointSlice) {
    let message = slice::encode::slice(s);
    let view = SliceView::parse(&message).expect("an encoded slice reads");
    // JSON as the server's JSON path reads it: the object written and read back.
    let json: EndpointSlice =
        serde_json::from_slice(&serde_json::to_vec(s).expect("to JSON")).expect("from JSON");
    let (p, j) = (convert::endpoint_slice(&view), convert::endpoint_slice(&json));
    assert_eq!(format!("{p:?}"), format!("{j:?}"));
}

/// Strings that hit the conversion's rules: valid and invalid labels, an
/// empty one, one too long, non-ASCII.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Text {
    Empty,
    Db,
    Db0,
    Upper,
    Dotted,
    ClusterA,
    Long,
    Accent,
    Tcp,
    Udp,
    Sctp,
    LowerTcp,
}

impl Text {
    fn get(self) -> String {
        match self {
            Self::Empty => "",
            Self::Db => "db",
            Self::Db0 => "db-0",
            Self::Upper => "DB",
            Self::Dotted => "db.0",
            Self::ClusterA => "cluster-a",
            Self::Long => "a123456789012345678901234567890123456789012345678901234567890123",
            Self::Accent => "dé",
            Self::Tcp => "TCP",
            Self::Udp => "UDP",
            Self::Sctp => "SCTP",
            Self::LowerTcp => "tcp",
        }
        .to_owned()
    }
}

/// A plain Go string: absent when empty, as the API server's JSON has it.
fn plain(t: Option<Text>) -> Option<String> {
    t.map(Text::get).filter(|s| !s.is_empty())
}

#[derive(Arbitrary, Debug)]
enum Address {
    V4,
    V4b,
    V6,
    Mapped,
    Bad,
    Empty,
    Name,
}

impl Address {
    fn get(&self) -> &'static str {
        match self {
            Self::V4 => "10.0.0.1",
            Self::V4b => "10.0.0.2",
            Self::V6 => "fd00::1",
            Self::Mapped => "::ffff:10.0.0.1",
            Self::Bad => "10.0.0.300",
            Self::Empty => "",
            Self::Name => "db.example.com",
        }
    }
}

#[derive(Arbitrary, Debug)]
struct Ep {
    addresses: Vec<Address>,
    hostname: Option<Text>,
    ready: Option<bool>,
    conditions: bool,
    target: Option<(Option<Text>, Option<Text>, Option<Text>)>,
    zone: Option<Text>,
}

#[derive(Arbitrary, Debug)]
struct Slice {
    name: Option<Text>,
    namespace: Option<Text>,
    service: Option<Text>,
    cluster: Option<Text>,
    labels: Vec<(Text, Text)>,
    address_type: u8,
    ports: Option<Vec<(Option<Text>, Option<Text>, Option<i32>)>>,
    endpoints: Vec<Ep>,
}

impl Slice {
    fn build(&self) -> EndpointSlice {
        let mut labels: std::collections::BTreeMap<String, String> =
            self.labels.iter().map(|(k, v)| (k.get(), v.get())).collect();
        if let Some(s) = self.service {
            labels.insert("multicluster.kubernetes.io/service-name".into(), s.get());
        }
        if let Some(c) = self.cluster {
            labels.insert("multicluster.kubernetes.io/source-cluster".into(), c.get());
        }
        let mut s = EndpointSlice {
            address_type: ["IPv4", "IPv6", "FQDN", "IPv5"][usize::from(self.address_type % 4)].to_owned(),
            ..EndpointSlice::default()
        };
        s.metadata.name = plain(self.name);
        s.metadata.namespace = plain(self.namespace);
        s.metadata.labels = Some(labels);
        s.ports = self.ports.as_ref().map(|ports| {
            ports
                .iter()
                .map(|&(name, protocol, port)| EndpointPort {
                    name: name.map(Text::get),
                    protocol: protocol.map(Text::get),
                    port,
                    ..EndpointPort::default()
                })
                .collect()
        });
        s.endpoints = self
            .endpoints
            .iter()
            .map(|e| Endpoint {
                addresses: e.addresses.iter().map(|a| a.get().to_owned()).collect(),
                hostname: e.hostname.map(Text::get),
                conditions: (e.conditions || e.ready.is_some())
                    .then(|| EndpointConditions { ready: e.ready, ..EndpointConditions::default() }),
                target_ref: e.target.map(|(kind, namespace, name)| ObjectReference {
                    kind: plain(kind),
                    namespace: plain(namespace),
                    name: plain(name),
                    ..ObjectReference::default()
                }),
                zone: e.zone.map(Text::get),
                ..Endpoint::default()
            })
            .collect();
        s
    }
}
