//! The inverse of `arbitrary`'s decoding for the query model: the bytes a
//! fuzz target must be given to build a chosen [`Query`], so the committed
//! seeds of the structure-aware targets are written from readable values
//! (`examples/seeds.rs`). It follows arbitrary 1.x's format: integers little
//! endian, `bool` as a byte's low bit, `Option` as a bool then the value,
//! `Vec` as (true, element)… then false, an enum variant as a `u32` `v` with
//! `v * variants >> 32` its index. [`bytes`] checks the round trip, so a
//! change of that format fails the generator instead of writing seeds that
//! decode to something else.

use arbitrary::{Arbitrary, Unstructured};

use crate::query::*;

/// Writes a value as the bytes `arbitrary` decodes it from.
pub trait Seed {
    /// Appends the encoding of `self`.
    fn seed(&self, out: &mut Vec<u8>);
}

/// The input that makes a structure-aware target build `q`.
///
/// # Panics
/// When the bytes do not decode back to `q` (the format changed).
pub fn bytes(q: &Query) -> Vec<u8> {
    let mut out = Vec::new();
    q.seed(&mut out);
    let back = Query::arbitrary_take_rest(Unstructured::new(&out)).expect("decodes");
    assert_eq!(&back, q, "the seed encoding no longer matches arbitrary's format");
    out
}

/// An enum variant: the smallest `u32` that selects `index` of `count`.
fn variant(out: &mut Vec<u8>, index: u32, count: u32) {
    let v = ((u64::from(index) << 32).div_ceil(u64::from(count))) as u32;
    debug_assert_eq!((u64::from(v) * u64::from(count)) >> 32, u64::from(index));
    v.seed(out);
}

macro_rules! ints {
    ($($t:ty),*) => {$(
        impl Seed for $t {
            fn seed(&self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
        }
    )*};
}
ints!(u8, u16, u32);

impl Seed for bool {
    fn seed(&self, out: &mut Vec<u8>) {
        out.push(u8::from(*self));
    }
}

impl<T: Seed> Seed for Option<T> {
    fn seed(&self, out: &mut Vec<u8>) {
        self.is_some().seed(out);
        if let Some(v) = self {
            v.seed(out);
        }
    }
}

impl<T: Seed> Seed for Vec<T> {
    fn seed(&self, out: &mut Vec<u8>) {
        for v in self {
            true.seed(out);
            v.seed(out);
        }
        false.seed(out);
    }
}

impl<T: Seed, const N: usize> Seed for [T; N] {
    fn seed(&self, out: &mut Vec<u8>) {
        for v in self {
            v.seed(out);
        }
    }
}

impl Seed for Query {
    fn seed(&self, out: &mut Vec<u8>) {
        self.id.seed(out);
        self.flags.seed(out);
        self.opcode.seed(out);
        self.response.seed(out);
        self.counts.seed(out);
        self.questions.seed(out);
        self.answers.seed(out);
        self.authority.seed(out);
        self.additional.seed(out);
        self.trailing.seed(out);
    }
}

impl Seed for Opcode {
    fn seed(&self, out: &mut Vec<u8>) {
        match self {
            Opcode::Query => variant(out, 0, 2),
            Opcode::Other(v) => {
                variant(out, 1, 2);
                v.seed(out);
            }
        }
    }
}

impl Seed for Question {
    fn seed(&self, out: &mut Vec<u8>) {
        self.name.seed(out);
        self.qtype.seed(out);
        self.qclass.seed(out);
    }
}

impl Seed for Name {
    fn seed(&self, out: &mut Vec<u8>) {
        self.labels.seed(out);
        self.end.seed(out);
    }
}

impl Seed for Label {
    fn seed(&self, out: &mut Vec<u8>) {
        match self {
            Label::Word(i) => {
                variant(out, 0, 4);
                i.seed(out);
            }
            Label::Upper(i) => {
                variant(out, 1, 4);
                i.seed(out);
            }
            Label::Bytes(b) => {
                variant(out, 2, 4);
                b.seed(out);
            }
            Label::Lying(len, b) => {
                variant(out, 3, 4);
                len.seed(out);
                b.seed(out);
            }
        }
    }
}

impl Seed for NameEnd {
    fn seed(&self, out: &mut Vec<u8>) {
        match self {
            NameEnd::Services => variant(out, 0, 6),
            NameEnd::Apex => variant(out, 1, 6),
            NameEnd::Root => variant(out, 2, 6),
            NameEnd::Outside => variant(out, 3, 6),
            NameEnd::Pointer(p) => {
                variant(out, 4, 6);
                p.seed(out);
            }
            NameEnd::Cut => variant(out, 5, 6),
        }
    }
}

impl Seed for Type {
    fn seed(&self, out: &mut Vec<u8>) {
        let index = match self {
            Type::A => 0,
            Type::Aaaa => 1,
            Type::Srv => 2,
            Type::Any => 3,
            Type::Ns => 4,
            Type::Soa => 5,
            Type::Txt => 6,
            Type::Ptr => 7,
            Type::Cname => 8,
            Type::Opt => 9,
            Type::Axfr => 10,
            Type::Other(_) => 11,
        };
        variant(out, index, 12);
        if let Type::Other(v) = self {
            v.seed(out);
        }
    }
}

impl Seed for Class {
    fn seed(&self, out: &mut Vec<u8>) {
        let index = match self {
            Class::In => 0,
            Class::Ch => 1,
            Class::None => 2,
            Class::Any => 3,
            Class::Other(_) => 4,
        };
        variant(out, index, 5);
        if let Class::Other(v) = self {
            v.seed(out);
        }
    }
}

impl Seed for Record {
    fn seed(&self, out: &mut Vec<u8>) {
        self.name.seed(out);
        self.rtype.seed(out);
        self.class.seed(out);
        self.ttl.seed(out);
        self.rdata.seed(out);
        self.rdlength.seed(out);
    }
}

impl Seed for Additional {
    fn seed(&self, out: &mut Vec<u8>) {
        match self {
            Additional::Opt(o) => {
                variant(out, 0, 2);
                o.seed(out);
            }
            Additional::Record(r) => {
                variant(out, 1, 2);
                r.seed(out);
            }
        }
    }
}

impl Seed for Opt {
    fn seed(&self, out: &mut Vec<u8>) {
        self.owner.seed(out);
        self.payload.seed(out);
        self.ext_rcode.seed(out);
        self.version.seed(out);
        self.flags.seed(out);
        self.options.seed(out);
        self.rdlength.seed(out);
    }
}

impl Seed for Payload {
    fn seed(&self, out: &mut Vec<u8>) {
        match self {
            Payload::P512 => variant(out, 0, 4),
            Payload::P1232 => variant(out, 1, 4),
            Payload::P4096 => variant(out, 2, 4),
            Payload::Any(v) => {
                variant(out, 3, 4);
                v.seed(out);
            }
        }
    }
}

impl Seed for Version {
    fn seed(&self, out: &mut Vec<u8>) {
        match self {
            Version::Zero => variant(out, 0, 2),
            Version::Any(v) => {
                variant(out, 1, 2);
                v.seed(out);
            }
        }
    }
}

impl Seed for EdnsOption {
    fn seed(&self, out: &mut Vec<u8>) {
        self.code.seed(out);
        self.data.seed(out);
        self.length.seed(out);
    }
}

impl Seed for OptionCode {
    fn seed(&self, out: &mut Vec<u8>) {
        let index = match self {
            OptionCode::Nsid => 0,
            OptionCode::Subnet => 1,
            OptionCode::Expire => 2,
            OptionCode::Cookie => 3,
            OptionCode::Keepalive => 4,
            OptionCode::Padding => 5,
            OptionCode::Chain => 6,
            OptionCode::KeyTag => 7,
            OptionCode::Ede => 8,
            OptionCode::Other(_) => 9,
        };
        variant(out, index, 10);
        if let OptionCode::Other(v) = self {
            v.seed(out);
        }
    }
}

impl Seed for OptionData {
    fn seed(&self, out: &mut Vec<u8>) {
        match self {
            OptionData::Bytes(b) => {
                variant(out, 0, 4);
                b.seed(out);
            }
            OptionData::Zeros(n) => {
                variant(out, 1, 4);
                n.seed(out);
            }
            OptionData::Subnet { family, source, scope, address } => {
                variant(out, 2, 4);
                family.seed(out);
                source.seed(out);
                scope.seed(out);
                address.seed(out);
            }
            OptionData::Cookie { client, server } => {
                variant(out, 3, 4);
                client.seed(out);
                server.seed(out);
            }
        }
    }
}

impl Seed for Family {
    fn seed(&self, out: &mut Vec<u8>) {
        match self {
            Family::V4 => variant(out, 0, 3),
            Family::V6 => variant(out, 1, 3),
            Family::Other(v) => {
                variant(out, 2, 3);
                v.seed(out);
            }
        }
    }
}
