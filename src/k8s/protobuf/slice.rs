//! An EndpointSlice read in place from its protobuf message: the fields
//! [`SliceFields`] asks for, borrowed, everything else skipped. Field
//! numbers are k8s.io/api `discovery/v1/generated.proto`'s (EndpointSlice
//! metadata 1, endpoints 2, ports 3, addressType 4; Endpoint addresses 1,
//! conditions 2 (ready 1), hostname 3, targetRef 4 (`core.v1.ObjectReference`
//! kind 1, namespace 2, name 3), zone 7; EndpointPort name 1, protocol 2,
//! port 3) and apimachinery's `ObjectMeta` (name 1, namespace 3,
//! resourceVersion 6, labels 11, annotations 12).
//!
//! Go writes a plain `string` field even when empty, where JSON leaves it
//! out (`omitempty`); such fields (`metadata.name`, `namespace`, the
//! `targetRef` strings) read as absent when empty, so that a slice reads
//! the same in both encodings. Pointer fields (`hostname`, `zone`, a port's
//! `name`) are written only when set, in both.

use std::ops::Range;

use super::decode::{DecodeError, fields};
use crate::k8s::convert::{Addresses, EndpointFields, PortFields, SliceFields};

/// An EndpointSlice message, read.
#[derive(Debug)]
pub struct SliceView<'a> {
    meta: Meta<'a>,
    address_type: &'a str,
    ports: Vec<PortFields<'a>>,
    endpoints: Vec<EndpointView<'a>>,
    /// Every endpoint's addresses, one after the other.
    addresses: Vec<&'a str>,
}

#[derive(Debug, Default)]
struct Meta<'a> {
    name: Option<&'a str>,
    namespace: Option<&'a str>,
    labels: Vec<(&'a str, &'a str)>,
    annotations: Vec<(&'a str, &'a str)>,
}

#[derive(Debug)]
struct EndpointView<'a> {
    addresses: Range<usize>,
    hostname: Option<&'a str>,
    ready: Option<bool>,
    target: Option<(Option<&'a str>, Option<&'a str>, Option<&'a str>)>,
    zone: Option<&'a str>,
}

/// An empty plain string is an absent one (see the module's comment).
fn present(s: &str) -> Option<&str> {
    Some(s).filter(|s| !s.is_empty())
}

impl<'a> SliceView<'a> {
    /// Reads an EndpointSlice message (the raw of its envelope).
    pub fn parse(message: &'a [u8]) -> Result<Self, DecodeError> {
        let mut view = SliceView {
            meta: Meta::default(),
            address_type: "",
            ports: Vec::new(),
            endpoints: Vec::new(),
            addresses: Vec::new(),
        };
        for field in fields(message) {
            match field? {
                // A message field seen twice merges (protobuf's rule).
                (1, v) => meta(&mut view.meta, v.bytes("metadata")?)?,
                (2, v) => {
                    let endpoint = view.endpoint(v.bytes("endpoints")?)?;
                    view.endpoints.push(endpoint);
                }
                (3, v) => view.ports.push(port(v.bytes("ports")?)?),
                (4, v) => view.address_type = v.str("addressType")?,
                _ => {}
            }
        }
        Ok(view)
    }

    fn endpoint(&mut self, message: &'a [u8]) -> Result<EndpointView<'a>, DecodeError> {
        let first = self.addresses.len();
        let mut ep =
            EndpointView { addresses: first..first, hostname: None, ready: None, target: None, zone: None };
        for field in fields(message) {
            match field? {
                (1, v) => self.addresses.push(v.str("endpoints.addresses")?),
                (2, v) => {
                    for field in fields(v.bytes("endpoints.conditions")?) {
                        if let (1, v) = field? {
                            ep.ready = Some(v.varint("endpoints.conditions.ready")? != 0);
                        }
                    }
                }
                (3, v) => ep.hostname = Some(v.str("endpoints.hostname")?),
                (4, v) => {
                    let (mut kind, mut namespace, mut name) = ep.target.unwrap_or_default();
                    for field in fields(v.bytes("endpoints.targetRef")?) {
                        match field? {
                            (1, v) => kind = present(v.str("endpoints.targetRef.kind")?),
                            (2, v) => namespace = present(v.str("endpoints.targetRef.namespace")?),
                            (3, v) => name = present(v.str("endpoints.targetRef.name")?),
                            _ => {}
                        }
                    }
                    ep.target = Some((kind, namespace, name));
                }
                (7, v) => ep.zone = Some(v.str("endpoints.zone")?),
                _ => {}
            }
        }
        ep.addresses.end = self.addresses.len();
        Ok(ep)
    }
}

fn meta<'a>(meta: &mut Meta<'a>, message: &'a [u8]) -> Result<(), DecodeError> {
    for field in fields(message) {
        match field? {
            (1, v) => meta.name = present(v.str("metadata.name")?),
            (3, v) => meta.namespace = present(v.str("metadata.namespace")?),
            (11, v) => meta.labels.push(entry(v.bytes("metadata.labels")?, "metadata.labels")?),
            (12, v) => {
                meta.annotations.push(entry(v.bytes("metadata.annotations")?, "metadata.annotations")?)
            }
            _ => {}
        }
    }
    Ok(())
}

/// A map entry: key 1, value 2; either may be left out when empty.
fn entry<'a>(message: &'a [u8], field: &'static str) -> Result<(&'a str, &'a str), DecodeError> {
    let (mut key, mut value) = ("", "");
    for f in fields(message) {
        match f? {
            (1, v) => key = v.str(field)?,
            (2, v) => value = v.str(field)?,
            _ => {}
        }
    }
    Ok((key, value))
}

fn port(message: &[u8]) -> Result<PortFields<'_>, DecodeError> {
    let mut port = PortFields { name: None, protocol: None, port: None };
    for field in fields(message) {
        match field? {
            (1, v) => port.name = Some(v.str("ports.name")?),
            (2, v) => port.protocol = Some(v.str("ports.protocol")?),
            // int32: negative numbers are sign-extended to 64 bits.
            (3, v) => port.port = Some(v.varint("ports.port")? as i64 as i32),
            _ => {}
        }
    }
    Ok(port)
}

/// The last value of `key`: a later map entry replaces an earlier one.
fn lookup<'a>(map: &[(&'a str, &'a str)], key: &str) -> Option<&'a str> {
    map.iter().rev().find(|(k, _)| *k == key).map(|&(_, v)| v)
}

impl SliceFields for SliceView<'_> {
    fn name(&self) -> Option<&str> {
        self.meta.name
    }

    fn namespace(&self) -> Option<&str> {
        self.meta.namespace
    }

    fn label(&self, key: &str) -> Option<&str> {
        lookup(&self.meta.labels, key)
    }

    fn annotation(&self, key: &str) -> Option<&str> {
        lookup(&self.meta.annotations, key)
    }

    fn address_type(&self) -> &str {
        self.address_type
    }

    fn ports(&self) -> impl Iterator<Item = PortFields<'_>> {
        self.ports.iter().copied()
    }

    fn endpoints(&self) -> impl ExactSizeIterator<Item = EndpointFields<'_>> {
        self.endpoints.iter().map(|ep| EndpointFields {
            addresses: Addresses::Borrowed(&self.addresses[ep.addresses.clone()]),
            hostname: ep.hostname,
            ready: ep.ready,
            target: ep.target,
            zone: ep.zone,
        })
    }
}

/// A slice's namespace and name, read as far as the message allows: for
/// naming one that does not decode.
pub fn identity(message: &[u8]) -> (Option<&str>, Option<&str>) {
    let metadata = fields(message).map_while(Result::ok).find_map(|(tag, v)| match (tag, v) {
        (1, v) => v.bytes("metadata").ok(),
        _ => None,
    });
    let (mut namespace, mut name) = (None, None);
    for (tag, v) in metadata.into_iter().flat_map(|m| fields(m).map_while(Result::ok)) {
        match tag {
            1 => name = v.str("metadata.name").ok().and_then(present),
            3 => namespace = v.str("metadata.namespace").ok().and_then(present),
            _ => {}
        }
    }
    (namespace, name)
}

/// An object's `metadata.resourceVersion`, and whether it carries the
/// annotation `k8s.io/initial-events-end: "true"` (the bookmark that ends
/// a streaming list), read without allocating.
pub fn version_and_end(message: &[u8]) -> Result<(&str, bool), DecodeError> {
    let (mut version, mut end) = ("", false);
    for field in fields(message) {
        if let (1, v) = field? {
            for field in fields(v.bytes("metadata")?) {
                match field? {
                    (6, v) => version = v.str("metadata.resourceVersion")?,
                    (12, v) => {
                        let (key, value) = entry(v.bytes("metadata.annotations")?, "metadata.annotations")?;
                        if key == INITIAL_EVENTS_END {
                            end = value == "true";
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    Ok((version, end))
}

/// The annotation of the bookmark that ends a streaming list (KEP-3157).
pub const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// Encoding an EndpointSlice as kube-apiserver does, for tests and the
/// fuzz target: from the JSON-side object, so that both encodings of one
/// slice can be read and compared.
pub mod encode {
    use k8s_openapi::api::discovery::v1::EndpointSlice;

    use crate::k8s::protobuf::decode::encode::{bytes, message, varint};

    /// `slice` as its protobuf message (no envelope). Plain strings are
    /// written even when empty, pointers only when set, as Go does.
    pub fn slice(slice: &EndpointSlice) -> Vec<u8> {
        message(|out| {
            let m = &slice.metadata;
            let meta = message(|o| {
                bytes(o, 1, m.name.as_deref().unwrap_or("").as_bytes());
                bytes(o, 3, m.namespace.as_deref().unwrap_or("").as_bytes());
                bytes(o, 6, m.resource_version.as_deref().unwrap_or("").as_bytes());
                for (tag, map) in [(11, &m.labels), (12, &m.annotations)] {
                    for (k, v) in map.iter().flatten() {
                        bytes(
                            o,
                            tag,
                            &message(|e| {
                                bytes(e, 1, k.as_bytes());
                                bytes(e, 2, v.as_bytes());
                            }),
                        );
                    }
                }
            });
            bytes(out, 1, &meta);
            for ep in &slice.endpoints {
                let endpoint = message(|o| {
                    for a in &ep.addresses {
                        bytes(o, 1, a.as_bytes());
                    }
                    if let Some(c) = &ep.conditions {
                        bytes(
                            o,
                            2,
                            &message(|c2| {
                                if let Some(r) = c.ready {
                                    varint(c2, 1, u64::from(r));
                                }
                            }),
                        );
                    }
                    if let Some(h) = &ep.hostname {
                        bytes(o, 3, h.as_bytes());
                    }
                    if let Some(t) = &ep.target_ref {
                        bytes(
                            o,
                            4,
                            &message(|r| {
                                bytes(r, 1, t.kind.as_deref().unwrap_or("").as_bytes());
                                bytes(r, 2, t.namespace.as_deref().unwrap_or("").as_bytes());
                                bytes(r, 3, t.name.as_deref().unwrap_or("").as_bytes());
                            }),
                        );
                    }
                    if let Some(z) = &ep.zone {
                        bytes(o, 7, z.as_bytes());
                    }
                });
                bytes(out, 2, &endpoint);
            }
            for p in slice.ports.iter().flatten() {
                bytes(
                    out,
                    3,
                    &message(|o| {
                        if let Some(n) = &p.name {
                            bytes(o, 1, n.as_bytes());
                        }
                        if let Some(pr) = &p.protocol {
                            bytes(o, 2, pr.as_bytes());
                        }
                        if let Some(n) = p.port {
                            // int32: negative values sign-extended, as Go writes them.
                            varint(o, 3, i64::from(n) as u64);
                        }
                    }),
                );
            }
            bytes(out, 4, slice.address_type.as_bytes());
        })
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::discovery::v1::EndpointSlice;

    use super::*;
    use crate::k8s::convert::{self, SliceOutcome};
    use crate::k8s::interop;
    use crate::model::Interop;

    const SLICE: &str = "
metadata:
  name: db-a
  namespace: shop
  resourceVersion: '7'
  labels:
    multicluster.kubernetes.io/service-name: db
    multicluster.kubernetes.io/source-cluster: cluster-a
  annotations: {note: x}
addressType: IPv4
ports: [{name: pg, port: 5432}, {name: all}, {port: 53, protocol: UDP}]
endpoints:
- addresses: [10.1.0.1]
  hostname: db-0
  zone: z1
  targetRef: {kind: Pod, name: db-0}
- addresses: [10.1.0.2, 10.1.0.3]
  conditions: {ready: false, serving: true}
- addresses: [10.1.0.4]
  conditions: {}
  targetRef: {kind: Pod, namespace: other, name: x}
";

    fn json(yaml: &str) -> EndpointSlice {
        serde_yaml_ng::from_str(yaml).unwrap()
    }

    /// The slice converted from JSON and from its protobuf encoding.
    fn both(yaml: &str) -> (String, String) {
        let j = json(yaml);
        let bytes = encode::slice(&j);
        let view = SliceView::parse(&bytes).unwrap();
        (format!("{:?}", convert::endpoint_slice(&j)), format!("{:?}", convert::endpoint_slice(&view)))
    }

    #[test]
    fn a_slice_reads_the_same_from_protobuf_as_from_json() {
        let (j, p) = both(SLICE);
        assert!(j.starts_with("Ok(Endpoints("), "{j}");
        assert_eq!(j, p);
        let SliceOutcome::Endpoints(set) =
            convert::endpoint_slice(&SliceView::parse(&encode::slice(&json(SLICE))).unwrap()).unwrap()
        else {
            panic!("not endpoints")
        };
        assert_eq!(set.endpoints.len(), 3);
        assert_eq!(
            set.endpoints[0].target(),
            Some("Pod/shop/db-0"),
            "the slice's namespace when the ref has none"
        );
        assert_eq!(set.endpoints[2].target(), Some("Pod/other/x"));
        assert!(!set.endpoints[1].ready && set.endpoints[2].ready, "conditions without ready mean ready");
        assert_eq!(set.ports.len(), 2, "a port without a number is all ports: no SRV");
    }

    #[test]
    fn errors_read_the_same_from_protobuf_as_from_json() {
        for (from, to) in [
            ("10.1.0.2", "fd00::2"),
            ("hostname: db-0", "hostname: DB_0"),
            ("multicluster.kubernetes.io/source-cluster", "x"),
            ("IPv4", "IPv5"),
            ("port: 53", "port: 70000"),
            ("port: 53", "port: -1"),
            ("protocol: UDP", "protocol: QUIC"),
            ("name: db-a", "name: ''"),
            ("IPv4", "FQDN"),
        ] {
            let (j, p) = both(&SLICE.replace(from, to));
            assert_eq!(j, p, "{from} -> {to}");
        }
    }

    #[test]
    fn foreign_slices_read_the_same_from_protobuf_as_from_json() {
        let kosmos = SLICE
            .replace("multicluster.kubernetes.io/service-name", "kubernetes.io/service-name")
            .replace("annotations: {note: x}", "annotations: {kosmos.io/service-import: ture}");
        let j = json(&kosmos);
        let bytes = encode::slice(&j);
        let view = SliceView::parse(&bytes).unwrap();
        let interop = Interop::parse("kosmos").unwrap();
        let (a, b) = (interop::foreign_slice(&j, interop), interop::foreign_slice(&view, interop));
        assert!(matches!(a, Ok(Some(SliceOutcome::Endpoints(_)))), "{a:?}");
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
    }

    #[test]
    fn a_message_field_seen_twice_merges_and_the_last_map_entry_wins() {
        use crate::k8s::protobuf::decode::encode::{bytes, message};
        let mut slice = encode::slice(&json(SLICE));
        // A second metadata message, as protobuf allows: its fields merge
        // into the first's, and its label replaces the earlier one.
        let meta = message(|o| {
            bytes(
                o,
                11,
                &message(|e| {
                    bytes(e, 1, b"multicluster.kubernetes.io/source-cluster");
                    bytes(e, 2, b"cluster-b");
                }),
            );
        });
        bytes(&mut slice, 1, &meta);
        let view = SliceView::parse(&slice).unwrap();
        assert_eq!(view.label("multicluster.kubernetes.io/source-cluster"), Some("cluster-b"));
        assert_eq!((view.namespace(), view.name()), (Some("shop"), Some("db-a")));
        assert_eq!(view.label("multicluster.kubernetes.io/service-name"), Some("db"));
    }

    #[test]
    fn identity_and_version_are_read_without_the_rest() {
        let bytes = encode::slice(&json(SLICE));
        assert_eq!(identity(&bytes), (Some("shop"), Some("db-a")));
        assert_eq!(version_and_end(&bytes).unwrap(), ("7", false));
        let end = SLICE.replace("{note: x}", "{k8s.io/initial-events-end: 'true'}");
        assert_eq!(version_and_end(&encode::slice(&json(&end))).unwrap(), ("7", true));
        // A slice cut short: the name is still found, the parse fails.
        let cut = &bytes[..bytes.len() - 3];
        assert!(SliceView::parse(cut).is_err());
        assert_eq!(identity(cut), (Some("shop"), Some("db-a")));
        assert_eq!(identity(b"\xff"), (None, None));
    }
}
