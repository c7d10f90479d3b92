//! A DNS query as the structure-aware targets build it from fuzzer bytes.
//!
//! Raw bytes rarely get past the header, so the byte-level target never
//! reached an EDNS option. This model makes every part of a query a choice
//! the fuzzer can make cheaply: header bits, opcode and section counts (which
//! may lie), questions whose names mostly hit the embedded zone, records in
//! every section, any number of OPT records carrying options of every code
//! with data lengths that may lie, and trailing garbage. [`Query::wire`]
//! turns a value into the bytes sent to the server.

use arbitrary::Arbitrary;

/// Labels of the embedded example (`zones/`) and of names around it: the
/// fuzzer picks by index, so most names exist in the zone or nearly do.
pub const WORDS: &[&str] = &[
    "web",
    "api",
    "db",
    "cache",
    "pending",
    "dns-probe",
    "empty",
    "shop",
    "infra",
    "svc",
    "_http",
    "_metrics",
    "_grpc",
    "_postgres",
    "_redis",
    "_dns",
    "_tcp",
    "_udp",
    "cluster-a",
    "cluster-b",
    "cluster-c",
    "eu",
    "db-0",
    "db-1",
    "10-3-0-10",
    "10-1-6-20",
    "fd00-1--6-20",
    "clusterset",
    "local",
    "*",
    "nope",
    "",
];

/// A whole query message.
#[derive(Arbitrary, Debug, Clone, PartialEq, Eq)]
pub struct Query {
    /// Message ID.
    pub id: u16,
    /// Flag bits other than QR and OPCODE (AA, TC, RD, RA, Z, AD, CD, RCODE).
    pub flags: u16,
    /// OPCODE.
    pub opcode: Opcode,
    /// QR is set only when this is 0xFF: a response must never be answered,
    /// but most inputs should be queries.
    pub response: u8,
    /// QDCOUNT, ANCOUNT, NSCOUNT, ARCOUNT as sent; `None`: the true count.
    pub counts: [Option<u16>; 4],
    /// The question section.
    pub questions: Vec<Question>,
    /// The answer section (unusual in a query, but a shape a client can send).
    pub answers: Vec<Record>,
    /// The authority section.
    pub authority: Vec<Record>,
    /// The additional section: OPT records and others.
    pub additional: Vec<Additional>,
    /// Bytes after the last section.
    pub trailing: Vec<u8>,
}

/// OPCODE: mostly QUERY.
#[derive(Arbitrary, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opcode {
    /// 0.
    Query,
    /// Any other value (low 4 bits).
    Other(u8),
}

/// One question.
#[derive(Arbitrary, Debug, Clone, PartialEq, Eq)]
pub struct Question {
    /// QNAME.
    pub name: Name,
    /// QTYPE.
    pub qtype: Type,
    /// QCLASS.
    pub qclass: Class,
}

/// A domain name in wire form, label by label.
#[derive(Arbitrary, Debug, Clone, PartialEq, Eq)]
pub struct Name {
    /// Leading labels.
    pub labels: Vec<Label>,
    /// How the name ends.
    pub end: NameEnd,
}

/// One label.
#[derive(Arbitrary, Debug, Clone, PartialEq, Eq)]
pub enum Label {
    /// A word of [`WORDS`] (index modulo its length).
    Word(u8),
    /// The same word in upper case: names compare case-insensitively.
    Upper(u8),
    /// Any bytes; the length byte is their count (over 63 makes it an
    /// extended label type or a pointer).
    Bytes(Vec<u8>),
    /// A length byte that need not match the bytes after it.
    Lying(u8, Vec<u8>),
}

/// The end of a name.
#[derive(Arbitrary, Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameEnd {
    /// `svc.clusterset.local.`: services of the zone.
    Services,
    /// `clusterset.local.`: the apex.
    Apex,
    /// The root label.
    Root,
    /// `example.com.`: outside the zone.
    Outside,
    /// A compression pointer (its offset, 14 bits).
    Pointer(u16),
    /// Nothing: the name runs into whatever follows.
    Cut,
}

/// A record type.
#[derive(Arbitrary, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Type {
    /// A.
    A,
    /// AAAA.
    Aaaa,
    /// SRV.
    Srv,
    /// ANY.
    Any,
    /// NS.
    Ns,
    /// SOA.
    Soa,
    /// TXT.
    Txt,
    /// PTR.
    Ptr,
    /// CNAME.
    Cname,
    /// OPT as a QTYPE.
    Opt,
    /// AXFR.
    Axfr,
    /// Any value.
    Other(u16),
}

impl Type {
    /// The value on the wire.
    pub fn code(self) -> u16 {
        match self {
            Type::A => 1,
            Type::Aaaa => 28,
            Type::Srv => 33,
            Type::Any => 255,
            Type::Ns => 2,
            Type::Soa => 6,
            Type::Txt => 16,
            Type::Ptr => 12,
            Type::Cname => 5,
            Type::Opt => 41,
            Type::Axfr => 252,
            Type::Other(v) => v,
        }
    }
}

/// A record class.
#[derive(Arbitrary, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// IN.
    In,
    /// CH.
    Ch,
    /// NONE.
    None,
    /// ANY.
    Any,
    /// Any value.
    Other(u16),
}

impl Class {
    /// The value on the wire.
    pub fn code(self) -> u16 {
        match self {
            Class::In => 1,
            Class::Ch => 3,
            Class::None => 254,
            Class::Any => 255,
            Class::Other(v) => v,
        }
    }
}

/// A resource record, RDATA as bytes.
#[derive(Arbitrary, Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Owner name.
    pub name: Name,
    /// TYPE.
    pub rtype: Type,
    /// CLASS.
    pub class: Class,
    /// TTL.
    pub ttl: u32,
    /// RDATA.
    pub rdata: Vec<u8>,
    /// RDLENGTH as sent; `None`: the true length.
    pub rdlength: Option<u16>,
}

/// A record of the additional section.
#[derive(Arbitrary, Debug, Clone, PartialEq, Eq)]
pub enum Additional {
    /// An OPT pseudo-record (RFC 6891).
    Opt(Opt),
    /// Anything else.
    Record(Record),
}

/// An OPT record.
#[derive(Arbitrary, Debug, Clone, PartialEq, Eq)]
pub struct Opt {
    /// Owner: the root unless the fuzzer says otherwise.
    pub owner: Option<Name>,
    /// The requestor's UDP payload size (the CLASS field).
    pub payload: Payload,
    /// EXTENDED-RCODE (TTL bits 24..32).
    pub ext_rcode: u8,
    /// VERSION: mostly 0.
    pub version: Version,
    /// DO and Z (TTL bits 0..16).
    pub flags: u16,
    /// The options, in order.
    pub options: Vec<EdnsOption>,
    /// RDLENGTH as sent; `None`: the true length.
    pub rdlength: Option<u16>,
}

/// A UDP payload size: the common ones, or any.
#[derive(Arbitrary, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Payload {
    /// 512.
    P512,
    /// 1232 (our cap).
    P1232,
    /// 4096 (what many resolvers send).
    P4096,
    /// Any value, 0..512 included.
    Any(u16),
}

impl Payload {
    /// The value on the wire.
    pub fn size(self) -> u16 {
        match self {
            Payload::P512 => 512,
            Payload::P1232 => 1232,
            Payload::P4096 => 4096,
            Payload::Any(v) => v,
        }
    }
}

/// An EDNS version.
#[derive(Arbitrary, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// 0, the only one there is.
    Zero,
    /// Any value.
    Any(u8),
}

/// One EDNS option.
#[derive(Arbitrary, Debug, Clone, PartialEq, Eq)]
pub struct EdnsOption {
    /// OPTION-CODE.
    pub code: OptionCode,
    /// OPTION-DATA.
    pub data: OptionData,
    /// OPTION-LENGTH as sent; `None`: the true length.
    pub length: Option<u16>,
}

/// An OPTION-CODE: every one a server may meet, and any.
#[derive(Arbitrary, Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptionCode {
    /// NSID (RFC 5001).
    Nsid,
    /// EDNS Client Subnet (RFC 7871).
    Subnet,
    /// EXPIRE (RFC 7314).
    Expire,
    /// COOKIE (RFC 7873).
    Cookie,
    /// edns-tcp-keepalive (RFC 7828).
    Keepalive,
    /// Padding (RFC 7830).
    Padding,
    /// CHAIN (RFC 7901).
    Chain,
    /// edns-key-tag (RFC 8145).
    KeyTag,
    /// Extended DNS Error (RFC 8914).
    Ede,
    /// Any value, unknown ones included.
    Other(u16),
}

impl OptionCode {
    /// The value on the wire.
    pub fn code(self) -> u16 {
        match self {
            OptionCode::Nsid => 3,
            OptionCode::Subnet => 8,
            OptionCode::Expire => 9,
            OptionCode::Cookie => 10,
            OptionCode::Keepalive => 11,
            OptionCode::Padding => 12,
            OptionCode::Chain => 13,
            OptionCode::KeyTag => 14,
            OptionCode::Ede => 15,
            OptionCode::Other(v) => v,
        }
    }
}

/// OPTION-DATA: shaped like an option's data, or any bytes.
#[derive(Arbitrary, Debug, Clone, PartialEq, Eq)]
pub enum OptionData {
    /// Any bytes.
    Bytes(Vec<u8>),
    /// This many zero bytes (as padding sends).
    Zeros(u8),
    /// Client Subnet fields: FAMILY, SOURCE and SCOPE PREFIX-LENGTH, ADDRESS.
    Subnet {
        /// FAMILY.
        family: Family,
        /// SOURCE PREFIX-LENGTH.
        source: u8,
        /// SCOPE PREFIX-LENGTH.
        scope: u8,
        /// ADDRESS bytes as sent.
        address: Vec<u8>,
    },
    /// A client cookie and a server cookie of any length.
    Cookie {
        /// The 8-byte client cookie.
        client: [u8; 8],
        /// The server cookie (8 to 32 bytes when valid).
        server: Vec<u8>,
    },
}

/// An address family of Client Subnet.
#[derive(Arbitrary, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// 1.
    V4,
    /// 2.
    V6,
    /// Any value.
    Other(u16),
}

impl Query {
    /// Whether QR is set.
    pub fn is_response(&self) -> bool {
        self.response == 0xFF
    }

    /// The message in wire form.
    pub fn wire(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(128);
        out.extend_from_slice(&self.id.to_be_bytes());
        let opcode = match self.opcode {
            Opcode::Query => 0,
            Opcode::Other(v) => u16::from(v & 0xF),
        };
        let qr = if self.is_response() { 0x8000 } else { 0 };
        out.extend_from_slice(&(qr | opcode << 11 | (self.flags & 0x07FF)).to_be_bytes());
        let real = [self.questions.len(), self.answers.len(), self.authority.len(), self.additional.len()];
        for (sent, real) in self.counts.iter().zip(real) {
            out.extend_from_slice(&sent.unwrap_or(real as u16).to_be_bytes());
        }
        for q in &self.questions {
            q.name.wire(&mut out);
            out.extend_from_slice(&q.qtype.code().to_be_bytes());
            out.extend_from_slice(&q.qclass.code().to_be_bytes());
        }
        for r in self.answers.iter().chain(&self.authority) {
            r.wire(&mut out);
        }
        for a in &self.additional {
            match a {
                Additional::Opt(o) => o.wire(&mut out),
                Additional::Record(r) => r.wire(&mut out),
            }
        }
        out.extend_from_slice(&self.trailing);
        out
    }
}

impl Name {
    /// Appends the name in wire form.
    pub fn wire(&self, out: &mut Vec<u8>) {
        let word = |i: &u8| WORDS[usize::from(*i) % WORDS.len()];
        for label in &self.labels {
            match label {
                Label::Word(i) => push_label(out, word(i).as_bytes()),
                Label::Upper(i) => push_label(out, word(i).to_ascii_uppercase().as_bytes()),
                Label::Bytes(b) => push_label(out, b),
                Label::Lying(len, b) => {
                    out.push(*len);
                    out.extend_from_slice(b);
                }
            }
        }
        let tail: &[&str] = match self.end {
            NameEnd::Services => &["svc", "clusterset", "local", ""],
            NameEnd::Apex => &["clusterset", "local", ""],
            NameEnd::Root => &[""],
            NameEnd::Outside => &["example", "com", ""],
            NameEnd::Pointer(p) => {
                out.extend_from_slice(&(0xC000 | (p & 0x3FFF)).to_be_bytes());
                &[]
            }
            NameEnd::Cut => &[],
        };
        for l in tail {
            push_label(out, l.as_bytes());
        }
    }
}

/// A label: its length (as a byte, whatever it is) and its bytes.
fn push_label(out: &mut Vec<u8>, label: &[u8]) {
    out.push(label.len() as u8);
    out.extend_from_slice(label);
}

impl Record {
    fn wire(&self, out: &mut Vec<u8>) {
        self.name.wire(out);
        out.extend_from_slice(&self.rtype.code().to_be_bytes());
        out.extend_from_slice(&self.class.code().to_be_bytes());
        out.extend_from_slice(&self.ttl.to_be_bytes());
        out.extend_from_slice(&self.rdlength.unwrap_or(self.rdata.len() as u16).to_be_bytes());
        out.extend_from_slice(&self.rdata);
    }
}

impl Opt {
    /// Appends the record in wire form.
    pub fn wire(&self, out: &mut Vec<u8>) {
        match &self.owner {
            None => out.push(0),
            Some(name) => name.wire(out),
        }
        out.extend_from_slice(&41u16.to_be_bytes());
        out.extend_from_slice(&self.payload.size().to_be_bytes());
        let version = match self.version {
            Version::Zero => 0,
            Version::Any(v) => v,
        };
        out.extend_from_slice(&[self.ext_rcode, version]);
        out.extend_from_slice(&self.flags.to_be_bytes());
        let mut rdata = Vec::new();
        for o in &self.options {
            o.wire(&mut rdata);
        }
        out.extend_from_slice(&self.rdlength.unwrap_or(rdata.len() as u16).to_be_bytes());
        out.extend_from_slice(&rdata);
    }
}

impl EdnsOption {
    fn wire(&self, out: &mut Vec<u8>) {
        let mut data = Vec::new();
        match &self.data {
            OptionData::Bytes(b) => data.extend_from_slice(b),
            OptionData::Zeros(n) => data.resize(usize::from(*n), 0),
            OptionData::Subnet { family, source, scope, address } => {
                let family = match family {
                    Family::V4 => 1,
                    Family::V6 => 2,
                    Family::Other(v) => *v,
                };
                data.extend_from_slice(&family.to_be_bytes());
                data.extend_from_slice(&[*source, *scope]);
                data.extend_from_slice(address);
            }
            OptionData::Cookie { client, server } => {
                data.extend_from_slice(client);
                data.extend_from_slice(server);
            }
        }
        out.extend_from_slice(&self.code.code().to_be_bytes());
        out.extend_from_slice(&self.length.unwrap_or(data.len() as u16).to_be_bytes());
        out.extend_from_slice(&data);
    }
}
