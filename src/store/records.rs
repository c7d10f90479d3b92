//! Records as the answer path copies them: each record encoded on its own
//! (see `snapshot`'s module docs for why any subset in any order is a valid
//! answer), grouped into RRsets and names. `encode` builds them; snapshots
//! hold them.

/// Records of one section, each encoded independently (see module docs).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Records {
    bytes: Box<[u8]>,
    ends: Box<[u32]>,
}

impl Records {
    pub(crate) fn new(bytes: Vec<u8>, ends: Vec<u32>) -> Self {
        Self { bytes: bytes.into(), ends: ends.into() }
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Where record `i` starts in [`Records::bytes`].
    pub fn start(&self, i: usize) -> usize {
        if i == 0 { 0 } else { self.ends[i - 1] as usize }
    }

    /// The wire bytes of record `i`.
    pub fn get(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        &self.bytes[start..self.ends[i] as usize]
    }

    /// All records' bytes, in order.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
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
