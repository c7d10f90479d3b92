//! When the change an EndpointSlice carries began: its
//! `endpoints.kubernetes.io/last-change-trigger-time`, which
//! kube-controller-manager's EndpointSlice controller writes (the Pod
//! condition or Service change it acted on) and `sync` carries onto the
//! MCS slices it writes. `serve` measures from it how long a change took to
//! be answered (`store::programming`).

use std::time::{SystemTime, UNIX_EPOCH};

/// A slice's trigger time, as read from its annotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ChangeTrigger {
    /// No annotation: a slice no EndpointSlice controller wrote (a user's,
    /// a file's), or one written for no change (a resync).
    #[default]
    Missing,
    /// An annotation that is not an RFC 3339 time.
    Unparsable,
    /// The time the change was triggered, on the clock of the cluster
    /// whose controller wrote it.
    At(SystemTime),
}

impl ChangeTrigger {
    /// A 32-bit fingerprint of the time: equal times give equal ones, and
    /// a new trigger time gives another but once in 2^31. 0 without a time.
    /// The store keeps this, not the time, for each slice (it fits in the
    /// padding of its record): enough to tell whether a change came with a
    /// trigger time of its own.
    pub fn fingerprint(self) -> u32 {
        let Self::At(at) = self else { return 0 };
        let (secs, nanos) = match at.duration_since(UNIX_EPOCH) {
            Ok(d) => (d.as_secs(), d.subsec_nanos()),
            Err(before) => (before.duration().as_secs().wrapping_neg(), before.duration().subsec_nanos()),
        };
        let h =
            secs.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ u64::from(nanos).wrapping_mul(0xff51_afd7_ed55_8ccd);
        ((h ^ (h >> 32)) as u32) | 1
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn fingerprints_tell_trigger_times_apart_and_none_is_zero() {
        assert_eq!(ChangeTrigger::Missing.fingerprint(), 0);
        assert_eq!(ChangeTrigger::Unparsable.fingerprint(), 0);
        let t = UNIX_EPOCH + Duration::from_secs(1_795_000_000);
        let at = |d: Duration| ChangeTrigger::At(t + d).fingerprint();
        assert_eq!(at(Duration::ZERO), ChangeTrigger::At(t).fingerprint(), "stable");
        assert_ne!(at(Duration::ZERO), 0);
        // kube-controller-manager's times are whole seconds (a Pod
        // condition's); sync's and tests' may have nanoseconds.
        let mut seen = std::collections::HashSet::new();
        for s in 0..10_000 {
            assert!(seen.insert(at(Duration::from_secs(s))), "whole second {s} collides");
        }
        for n in 1..1_000 {
            assert!(seen.insert(at(Duration::from_nanos(n * 1_000_003))), "fraction {n} collides");
        }
        let before = ChangeTrigger::At(UNIX_EPOCH - Duration::from_secs(5)).fingerprint();
        assert_ne!(before, 0);
    }
}
