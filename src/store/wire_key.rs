//! A service's key in the snapshot: the lower-case wire bytes of
//! `<svc>.<ns>`, kept inside the map's slot when short.
//!
//! Every query for a service compares its key once it has found the slot.
//! A key on the heap made that a dependent read of a block of its own (and
//! a 48-byte block per service at fleet scale); most `<svc>.<ns>` keys are
//! under [`INLINE`] bytes and are compared where the slot is.

use std::borrow::Borrow;
use std::hash::{Hash, Hasher};
use std::ops::Deref;

/// Bytes kept in the slot; with the length and the tag the key is 32 bytes.
const INLINE: usize = 30;

/// The wire bytes of a service's `<svc>.<ns>` labels.
#[derive(Clone)]
pub(crate) enum WireKey {
    /// Up to [`INLINE`] bytes, in place.
    Inline { len: u8, bytes: [u8; INLINE] },
    /// Longer keys.
    Heap(Box<[u8]>),
}

impl WireKey {
    /// The key of these bytes.
    pub(crate) fn new(key: &[u8]) -> Self {
        match u8::try_from(key.len()) {
            Ok(len) if key.len() <= INLINE => {
                let mut bytes = [0; INLINE];
                bytes[..key.len()].copy_from_slice(key);
                Self::Inline { len, bytes }
            }
            _ => Self::Heap(key.into()),
        }
    }
}

impl Deref for WireKey {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            // `len` was checked against INLINE when the key was made.
            Self::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Self::Heap(b) => b,
        }
    }
}

/// Maps keyed by `WireKey` are looked up with the query's bytes, so hash
/// and equality are the bytes' own.
impl Borrow<[u8]> for WireKey {
    fn borrow(&self) -> &[u8] {
        self
    }
}

impl Hash for WireKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (**self).hash(state);
    }
}

impl PartialEq for WireKey {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Eq for WireKey {}

impl std::fmt::Debug for WireKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", String::from_utf8_lossy(self))
    }
}

#[cfg(test)]
mod tests {
    use std::hash::BuildHasher;

    use rustc_hash::{FxBuildHasher, FxHashMap};

    use super::*;

    #[test]
    fn short_keys_stay_in_place_and_every_key_is_found_by_its_bytes() {
        assert_eq!(size_of::<WireKey>(), 32);
        let short = b"\x03web\x04shop".as_slice();
        let edge = [b'a'; INLINE];
        let long = [b'b'; INLINE + 1];
        let mut map = FxHashMap::default();
        for (i, k) in [short, &edge, &long].into_iter().enumerate() {
            let key = WireKey::new(k);
            assert_eq!(&*key, k);
            assert_eq!(matches!(key, WireKey::Inline { .. }), k.len() <= INLINE, "{key:?}");
            assert_eq!(FxBuildHasher.hash_one(&key), FxBuildHasher.hash_one(k), "hashed as its bytes");
            map.insert(key, i);
        }
        assert_eq!((map.get(short), map.get(&edge[..]), map.get(&long[..])), (Some(&0), Some(&1), Some(&2)));
        assert_eq!(map.get(&b"\x03web"[..]), None);
        assert_eq!(map.get(&b""[..]), None);
        assert_ne!(WireKey::new(b"\x03web"), WireKey::new(short));
    }
}
