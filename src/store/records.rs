//! Records as the answer path copies them: each record encoded on its own
//! (see `snapshot`'s module docs for why any subset in any order is a valid
//! answer), grouped into RRsets and names. `encode` builds them; snapshots
//! hold them.

use std::sync::Arc;

/// Records of one section, each encoded independently (see module docs).
///
/// One allocation holds them all, shared by reference count: a snapshot
/// holds hundreds of thousands of these, so each costs one heap block, and
/// the same records (a service name's SRV answer and a single named
/// port's; a ClusterSetIP service's A answer and its SRV additional
/// records: `names::share_additional`) are shared between names and
/// snapshots without a copy. The
/// layout is the record count (u32), the end offset of each record (u32
/// each), then the records' bytes; all little-endian. Empty records
/// allocate nothing.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Records {
    data: Option<Arc<[u8]>>,
}

impl Records {
    /// Records from their concatenated `bytes` and each one's end offset.
    pub(crate) fn new(bytes: &[u8], ends: &[u32]) -> Self {
        if ends.is_empty() {
            return Self::default();
        }
        let mut data = Vec::with_capacity(4 + 4 * ends.len() + bytes.len());
        data.extend_from_slice(&(ends.len() as u32).to_le_bytes());
        for end in ends {
            data.extend_from_slice(&end.to_le_bytes());
        }
        data.extend_from_slice(bytes);
        Self { data: Some(data.into()) }
    }

    fn data(&self) -> &[u8] {
        self.data.as_deref().unwrap_or(&[])
    }

    /// The u32 at index `i` of the header (0: the count; 1..: the ends).
    fn word(&self, i: usize) -> usize {
        let d = self.data();
        let at = 4 * i;
        match d.get(at..at + 4) {
            Some(w) => u32::from_le_bytes([w[0], w[1], w[2], w[3]]) as usize,
            None => 0,
        }
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        self.word(0)
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.data.is_none()
    }

    /// Where record `i` starts in [`Records::bytes`].
    pub fn start(&self, i: usize) -> usize {
        if i == 0 { 0 } else { self.word(i) }
    }

    /// The wire bytes of record `i`.
    pub fn get(&self, i: usize) -> &[u8] {
        let body = 4 + 4 * self.len();
        &self.data()[body + self.start(i)..body + self.word(i + 1)]
    }

    /// Appends record `i` to `out` with the pointer that ends its owner
    /// (into the question: see `snapshot`) moved `shift` bytes on: the
    /// record as it is encoded behind a question with `shift` more bytes
    /// in front of the name it points into. An owner without a pointer
    /// (none is encoded so) is copied as it is.
    pub fn push_shifted(&self, i: usize, shift: u16, out: &mut Vec<u8>) {
        let r = self.get(i);
        let start = out.len();
        out.extend_from_slice(r);
        let mut at = 0;
        while let Some(&len) = r.get(at) {
            if len == 0 {
                return;
            }
            if len >= 0xC0 {
                if let Some(&[hi, lo]) = r.get(at..at + 2) {
                    let moved = (u16::from_be_bytes([hi, lo]) & 0x3FFF) + shift;
                    out[start + at..start + at + 2].copy_from_slice(&(0xC000 | moved).to_be_bytes());
                }
                return;
            }
            at += 1 + usize::from(len);
        }
    }

    /// All records' bytes, in order.
    pub fn bytes(&self) -> &[u8] {
        let d = self.data();
        d.get(4 + 4 * self.len()..).unwrap_or(&[])
    }

    /// True when both are one allocation (shared, not equal by chance).
    #[cfg(test)]
    pub(crate) fn same_allocation(&self, other: &Self) -> bool {
        match (&self.data, &other.data) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }

    /// Heap bytes held (shared ones counted whole), for the memory figures.
    pub fn heap_bytes(&self) -> usize {
        self.data.as_ref().map_or(0, |d| d.len() + 16)
    }
}

/// One RRset of a name and the additional records that go with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RRset {
    /// The record type (A = 1, AAAA = 28, SRV = 33, …).
    pub rtype: u16,
    /// Answer records.
    pub answer: Records,
    /// Additional records (A/AAAA of SRV targets, NS glue).
    pub additional: Records,
    /// `additional` is the service name's own, encoded behind a question
    /// for the service name (a `_<port>._<proto>` name whose targets are
    /// the service name's): each owner's pointer into the question moves
    /// by where the service name starts in the question asked.
    pub shifted: bool,
    /// The records are written per query from the service's endpoint names
    /// (`Hosts::srv`, a headless service's SRV RRsets): `answer` and
    /// `additional` are empty.
    pub from_hosts: bool,
    /// For the second zone (`--also-zone`), when this RRset holds names (SRV
    /// targets) that must be in it: its own answer and additional records.
    /// Address records hold no name and serve both zones as they are.
    pub also: Option<Box<(Records, Records)>>,
}

/// A name that exists in the zone. An empty node is an empty non-terminal.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NameNode {
    /// Its RRsets, at most one per type.
    pub sets: Box<[RRset]>,
}

impl NameNode {
    /// The RRset of `rtype`, if the name has one.
    pub fn get(&self, rtype: u16) -> Option<&RRset> {
        self.sets.iter().find(|s| s.rtype == rtype)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_keep_their_boundaries() {
        let a = Records::new(b"abcde", &[2, 5]);
        assert_eq!((a.len(), a.get(0), a.get(1), a.bytes()), (2, &b"ab"[..], &b"cde"[..], &b"abcde"[..]));
        assert_eq!(a.start(1), 2);
        let empty = Records::new(b"", &[]);
        assert!(empty.is_empty() && empty.bytes().is_empty());
        assert_eq!(empty.len(), 0);
        assert_eq!(empty.heap_bytes(), 0);
    }
}
