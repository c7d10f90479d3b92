//! The protobuf wire format as Kubernetes uses it: fields walked in place
//! (prost's varint and key decoding), the `k8s\0` envelope around every
//! object (`runtime.Unknown`), list metadata, watch events and `Status`.
//! Nothing here allocates: every string is borrowed from the message.
//!
//! Field numbers are the upstream `generated.proto` files' (k8s.io/api and
//! k8s.io/apimachinery v0.33): `runtime.Unknown` typeMeta 1 (apiVersion 1,
//! kind 2), raw 2, contentEncoding 3; `meta.v1.ListMeta` resourceVersion 2,
//! continue 3; `meta.v1.WatchEvent` type 1, object 2 (`RawExtension` raw 1);
//! `meta.v1.Status` message 3, reason 4, code 6.

use prost::encoding::{WireType, decode_key, decode_varint};

/// The prefix of every object kube-apiserver encodes as protobuf
/// (k8s.io/apimachinery `runtime/serializer/protobuf`).
pub const MAGIC: &[u8] = b"k8s\0";

/// Why a message could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// A key or varint that does not decode (prost's message).
    #[error("{0}")]
    Wire(#[from] prost::DecodeError),
    /// A length-delimited field longer than what is left of its message.
    #[error("a field of {length} bytes where {left} are left")]
    Length {
        /// The field's declared length.
        length: u64,
        /// What its message has left.
        left: usize,
    },
    /// Groups: deprecated in proto2 and never written by Kubernetes.
    #[error("field {0} is a group")]
    Group(u32),
    /// A known field with another wire type than its schema's.
    #[error("{field}: wire type {found:?}")]
    WireType {
        /// The field, by its schema name.
        field: &'static str,
        /// What was found.
        found: WireType,
    },
    /// A string field that is not UTF-8.
    #[error("{0}: not UTF-8")]
    Utf8(&'static str),
    /// An object without the `k8s\0` prefix.
    #[error("no k8s protobuf prefix")]
    Magic,
    /// An envelope whose object is encoded (`contentEncoding`), which the
    /// API server never does for protobuf.
    #[error("object content encoded as {0:?}")]
    ContentEncoding(String),
    /// An envelope of another kind than expected.
    #[error("a {found:?} where a {expected} was expected")]
    Kind {
        /// The kind asked for.
        expected: &'static str,
        /// The envelope's kind.
        found: String,
    },
}

/// One field's value, as its wire type carries it.
#[derive(Debug, Clone, Copy)]
pub enum Value<'a> {
    /// A varint (ints, bools, enums).
    Varint(u64),
    /// Length-delimited (strings, bytes, messages, packed repeated).
    Bytes(&'a [u8]),
    /// Fixed 32 or 64 bits; no field read here has them.
    Fixed,
}

impl<'a> Value<'a> {
    /// The bytes of a length-delimited `field`.
    pub fn bytes(self, field: &'static str) -> Result<&'a [u8], DecodeError> {
        match self {
            Self::Bytes(b) => Ok(b),
            Self::Varint(_) => Err(DecodeError::WireType { field, found: WireType::Varint }),
            Self::Fixed => Err(DecodeError::WireType { field, found: WireType::SixtyFourBit }),
        }
    }

    /// A string `field`.
    pub fn str(self, field: &'static str) -> Result<&'a str, DecodeError> {
        std::str::from_utf8(self.bytes(field)?).map_err(|_| DecodeError::Utf8(field))
    }

    /// A varint `field`.
    pub fn varint(self, field: &'static str) -> Result<u64, DecodeError> {
        match self {
            Self::Varint(v) => Ok(v),
            Self::Bytes(_) => Err(DecodeError::WireType { field, found: WireType::LengthDelimited }),
            Self::Fixed => Err(DecodeError::WireType { field, found: WireType::SixtyFourBit }),
        }
    }
}

/// The fields of one message in wire order, each as (number, value). After
/// an error it ends.
pub struct Fields<'a> {
    rest: &'a [u8],
}

/// Walks the fields of `message`.
pub fn fields(message: &[u8]) -> Fields<'_> {
    Fields { rest: message }
}

impl<'a> Fields<'a> {
    fn field(&mut self) -> Result<(u32, Value<'a>), DecodeError> {
        let (tag, wire) = decode_key(&mut self.rest)?;
        let value = match wire {
            WireType::Varint => Value::Varint(decode_varint(&mut self.rest)?),
            WireType::LengthDelimited => {
                let length = decode_varint(&mut self.rest)?;
                let left = self.rest.len();
                let n = usize::try_from(length).ok().filter(|&n| n <= left);
                let n = n.ok_or(DecodeError::Length { length, left })?;
                let (bytes, rest) = self.rest.split_at(n);
                self.rest = rest;
                Value::Bytes(bytes)
            }
            WireType::SixtyFourBit | WireType::ThirtyTwoBit => {
                let n = if wire == WireType::SixtyFourBit { 8 } else { 4 };
                let left = self.rest.len();
                let rest = self.rest.get(n..).ok_or(DecodeError::Length { length: n as u64, left })?;
                self.rest = rest;
                Value::Fixed
            }
            WireType::StartGroup | WireType::EndGroup => return Err(DecodeError::Group(tag)),
        };
        Ok((tag, value))
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<(u32, Value<'a>), DecodeError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let field = self.field();
        if field.is_err() {
            self.rest = &[];
        }
        Some(field)
    }
}

/// An object as the API server sends it: `k8s\0`, then a `runtime.Unknown`
/// naming its kind around the object's own message.
#[derive(Debug, Clone, Copy)]
pub struct Envelope<'a> {
    /// `typeMeta.kind`.
    pub kind: &'a str,
    /// The object's message.
    pub raw: &'a [u8],
}

/// Opens an object's envelope.
pub fn envelope(object: &[u8]) -> Result<Envelope<'_>, DecodeError> {
    let unknown = object.strip_prefix(MAGIC).ok_or(DecodeError::Magic)?;
    let (mut kind, mut raw) = ("", &[][..]);
    for field in fields(unknown) {
        match field? {
            (1, v) => {
                for field in fields(v.bytes("typeMeta")?) {
                    if let (2, v) = field? {
                        kind = v.str("typeMeta.kind")?;
                    }
                }
            }
            (2, v) => raw = v.bytes("raw")?,
            (3, v) => {
                let encoding = v.str("contentEncoding")?;
                if !encoding.is_empty() {
                    return Err(DecodeError::ContentEncoding(encoding.to_owned()));
                }
            }
            _ => {}
        }
    }
    Ok(Envelope { kind, raw })
}

/// Opens an envelope that must hold a `kind`.
pub fn envelope_of<'a>(object: &'a [u8], kind: &'static str) -> Result<&'a [u8], DecodeError> {
    let envelope = envelope(object)?;
    if envelope.kind != kind {
        return Err(DecodeError::Kind { expected: kind, found: envelope.kind.to_owned() });
    }
    Ok(envelope.raw)
}

/// A list: its metadata and where each item's message is.
#[derive(Debug, Default)]
pub struct List<'a> {
    /// `metadata.resourceVersion`: where a watch after it starts.
    pub resource_version: &'a str,
    /// `metadata.continue`: the next page's token; empty on the last page.
    pub continue_token: &'a str,
    /// Each item's message (without envelope: items are not wrapped).
    pub items: Vec<&'a [u8]>,
}

/// Reads a list message (the raw of a `…List` envelope).
pub fn list(message: &[u8]) -> Result<List<'_>, DecodeError> {
    let mut list = List::default();
    for field in fields(message) {
        match field? {
            (1, v) => {
                for field in fields(v.bytes("metadata")?) {
                    match field? {
                        (2, v) => list.resource_version = v.str("metadata.resourceVersion")?,
                        (3, v) => list.continue_token = v.str("metadata.continue")?,
                        _ => {}
                    }
                }
            }
            (2, v) => list.items.push(v.bytes("items")?),
            _ => {}
        }
    }
    Ok(list)
}

/// One event of a watch: its type and its object (with envelope).
#[derive(Debug, Clone, Copy)]
pub struct WatchEvent<'a> {
    /// `ADDED`, `MODIFIED`, `DELETED`, `BOOKMARK` or `ERROR`.
    pub kind: &'a str,
    /// The object, `k8s\0` and envelope included.
    pub object: &'a [u8],
}

/// Reads one frame of a protobuf watch (`stream=watch`): a `WatchEvent`
/// message, not enveloped.
pub fn watch_event(frame: &[u8]) -> Result<WatchEvent<'_>, DecodeError> {
    let (mut kind, mut object) = ("", &[][..]);
    for field in fields(frame) {
        match field? {
            (1, v) => kind = v.str("type")?,
            (2, v) => {
                for field in fields(v.bytes("object")?) {
                    if let (1, v) = field? {
                        object = v.bytes("object.raw")?;
                    }
                }
            }
            _ => {}
        }
    }
    Ok(WatchEvent { kind, object })
}

/// What an error response or an `ERROR` event says.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Status<'a> {
    /// `code`: the HTTP status it stands for.
    pub code: u16,
    /// `message`.
    pub message: &'a str,
    /// `reason`, e.g. `Expired`, `Invalid`.
    pub reason: &'a str,
}

/// Reads a `Status` message (the raw of its envelope).
pub fn status(message: &[u8]) -> Result<Status<'_>, DecodeError> {
    let mut status = Status::default();
    for field in fields(message) {
        match field? {
            (3, v) => status.message = v.str("message")?,
            (4, v) => status.reason = v.str("reason")?,
            (6, v) => status.code = u16::try_from(v.varint("code")?).unwrap_or(0),
            _ => {}
        }
    }
    Ok(status)
}

/// Encoding, for tests and the fuzz target only: the few calls that build
/// the messages above (the server never writes protobuf).
pub mod encode {
    use prost::encoding::{WireType, encode_key, encode_varint};

    /// Appends a length-delimited field.
    pub fn bytes(out: &mut Vec<u8>, tag: u32, value: &[u8]) {
        encode_key(tag, WireType::LengthDelimited, out);
        encode_varint(value.len() as u64, out);
        out.extend_from_slice(value);
    }

    /// Appends a varint field.
    pub fn varint(out: &mut Vec<u8>, tag: u32, value: u64) {
        encode_key(tag, WireType::Varint, out);
        encode_varint(value, out);
    }

    /// A message built by `build`.
    pub fn message(build: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
        let mut out = Vec::new();
        build(&mut out);
        out
    }

    /// `raw` in the `k8s\0` envelope as a `kind` of `api_version`.
    pub fn envelope(api_version: &str, kind: &str, raw: &[u8]) -> Vec<u8> {
        let mut out = super::MAGIC.to_vec();
        let type_meta = message(|m| {
            bytes(m, 1, api_version.as_bytes());
            bytes(m, 2, kind.as_bytes());
        });
        bytes(&mut out, 1, &type_meta);
        bytes(&mut out, 2, raw);
        bytes(&mut out, 3, b"");
        bytes(&mut out, 4, b"");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::encode::{bytes, envelope as wrap, message, varint};
    use super::*;

    #[test]
    fn envelopes_name_their_kind_and_hold_the_object() {
        let object = wrap("discovery.k8s.io/v1", "EndpointSlice", b"\x0a\x00");
        let e = envelope(&object).unwrap();
        assert_eq!((e.kind, e.raw), ("EndpointSlice", &b"\x0a\x00"[..]));
        assert_eq!(envelope_of(&object, "EndpointSlice").unwrap(), b"\x0a\x00");
        let wrong = envelope_of(&object, "Status").unwrap_err();
        assert_eq!(wrong.to_string(), "a \"EndpointSlice\" where a Status was expected");
        assert_eq!(envelope(&object[1..]).unwrap_err(), DecodeError::Magic);
    }

    #[test]
    fn a_list_gives_its_version_token_and_items() {
        let meta = message(|m| {
            bytes(m, 2, b"42");
            bytes(m, 3, b"next");
        });
        let raw = message(|m| {
            bytes(m, 1, &meta);
            bytes(m, 2, b"one");
            bytes(m, 2, b"two");
        });
        let l = list(&raw).unwrap();
        assert_eq!((l.resource_version, l.continue_token), ("42", "next"));
        assert_eq!(l.items, [&b"one"[..], b"two"]);
    }

    #[test]
    fn statuses_give_code_reason_and_message() {
        let raw = message(|m| {
            bytes(m, 2, b"Failure");
            bytes(m, 3, b"too old resource version");
            bytes(m, 4, b"Expired");
            varint(m, 6, 410);
        });
        let s = status(&raw).unwrap();
        assert_eq!((s.code, s.reason, s.message), (410, "Expired", "too old resource version"));
    }

    #[test]
    fn watch_events_carry_type_and_enveloped_object() {
        let object = wrap("v1", "Status", b"");
        let frame = message(|m| {
            bytes(m, 1, b"ERROR");
            bytes(m, 2, &message(|r| bytes(r, 1, &object)));
        });
        let e = watch_event(&frame).unwrap();
        assert_eq!((e.kind, e.object), ("ERROR", &object[..]));
    }

    #[test]
    fn bad_wire_data_is_an_error_never_a_panic() {
        // A length past the end, a group, a truncated varint, bad UTF-8.
        assert!(matches!(list(b"\x12\x05ab").unwrap_err(), DecodeError::Length { length: 5, left: 2 }));
        assert_eq!(list(b"\x0b").unwrap_err(), DecodeError::Group(1));
        assert!(matches!(list(b"\x10\xff").unwrap_err(), DecodeError::Wire(_)));
        let meta = message(|m| bytes(m, 2, b"\xff"));
        let raw = message(|m| bytes(m, 1, &meta));
        assert_eq!(list(&raw).unwrap_err(), DecodeError::Utf8("metadata.resourceVersion"));
        // A string field sent as a varint.
        assert!(matches!(status(b"\x18\x01").unwrap_err(), DecodeError::WireType { field: "message", .. }));
        // Fixed-width fields are skipped, unless cut short.
        assert_eq!(status(b"\x09\0\0\0\0\0\0\0\0\x30\x05").unwrap().code, 5);
        assert!(status(b"\x09\0\0").is_err());
    }
}
