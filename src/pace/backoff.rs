//! [`Backoff`]: a first wait, doubled per failure up to a cap, spread by a
//! [`Jitter`] so that many clients failing together do not retry together.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

/// How far a wait is spread: a fifth of it, the spread every caller used.
const SPREAD: f64 = 0.2;

/// How a wait is spread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Jitter {
    /// Not at all: a schedule tests pin, or one process's own restarts.
    None,
    /// Up to a fifth more, never less: a retry never comes before its
    /// backoff, and servers that failed together drift apart.
    Add,
    /// Within a fifth either way (× [0.8, 1.2)): periodic work whose
    /// average must stay its period (probes of many endpoints).
    Around,
    /// Anywhere from zero to the whole wait: the first run of many things
    /// spread over one period.
    Full,
}

impl Jitter {
    /// `d`, spread.
    pub fn apply(self, d: Duration) -> Duration {
        match self {
            Self::None => d,
            Self::Add => d.saturating_add(scale(d, SPREAD * fraction())),
            Self::Around => scale(d, 1.0 - SPREAD + 2.0 * SPREAD * fraction()),
            Self::Full => scale(d, fraction()),
        }
    }
}

/// `d × factor` (≥ 0), saturating where `Duration::mul_f64` would panic.
fn scale(d: Duration, factor: f64) -> Duration {
    Duration::try_from_secs_f64(d.as_secs_f64() * factor).unwrap_or(Duration::MAX)
}

/// A fraction in [0, 1), different at every call: jitter needs spread, not
/// secrecy. Each `RandomState` has new SipHash keys (std seeds them once
/// per thread from the OS and steps them per value), so this needs no
/// dependency, no shared state and no lock, and two processes started
/// together still differ (the clock's nanoseconds, used before, can agree).
fn fraction() -> f64 {
    let mut h = RandomState::new().build_hasher();
    h.write_u8(0);
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

/// Exponential backoff: `first`, doubled after each failure up to `max`,
/// each wait spread by its [`Jitter`]. Used as a running state
/// ([`Backoff::next_wait`], [`Backoff::reset`]) by a loop that retries, or
/// as a rule ([`Backoff::after`]) by a caller that counts failures itself.
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    jitter: Jitter,
    /// The next wait, before jitter.
    next: Duration,
}

impl Backoff {
    /// Waits from `first` doubling to `max`, spread by `jitter`.
    pub const fn new(first: Duration, max: Duration, jitter: Jitter) -> Self {
        Self { first, max, jitter, next: first }
    }

    /// The wait before the next attempt; the one after it is twice as long,
    /// up to the cap.
    pub fn next_wait(&mut self) -> Duration {
        let wait = self.next;
        self.next = wait.saturating_mul(2).min(self.max);
        self.jitter.apply(wait)
    }

    /// Back to the first wait: the thing retried worked.
    pub fn reset(&mut self) {
        self.next = self.first;
    }

    /// The wait after `failures` failures in a row (1: the first, which
    /// waits `first`): `first` × 2^(failures − 1), at most `max`, spread.
    pub fn after(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(31);
        self.jitter.apply(self.first.saturating_mul(1 << doublings).min(self.max))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn waits_double_up_to_the_cap_and_start_over_after_a_reset() {
        let mut b = Backoff::new(S, 10 * S, Jitter::None);
        let waits: Vec<u64> = (0..6).map(|_| b.next_wait().as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 10, 10]);
        b.reset();
        assert_eq!(b.next_wait(), S);
    }

    #[test]
    fn the_wait_after_n_failures_is_the_same_rule() {
        let b = Backoff::new(S, 300 * S, Jitter::None);
        for (failures, secs) in
            [(0, 1), (1, 1), (2, 2), (3, 4), (9, 256), (10, 300), (40, 300), (u32::MAX, 300)]
        {
            assert_eq!(b.after(failures), secs * S, "after {failures}");
        }
        let huge = Backoff::new(Duration::MAX / 2, Duration::MAX, Jitter::None);
        assert_eq!(huge.after(3), Duration::MAX, "saturates instead of overflowing");
    }

    #[test]
    fn added_jitter_is_up_to_a_fifth_more_and_never_less() {
        let b = Backoff::new(S, S, Jitter::Add);
        let waits: Vec<Duration> = (0..200).map(|_| b.after(1)).collect();
        assert!(waits.iter().all(|w| *w >= S && *w <= S + S / 5), "{waits:?}");
        assert!(waits.iter().any(|w| *w != waits[0]), "spread: {waits:?}");
    }

    #[test]
    fn jitter_around_stays_within_a_fifth_either_way_and_full_within_the_wait() {
        let around: Vec<Duration> = (0..200).map(|_| Jitter::Around.apply(S)).collect();
        assert!(around.iter().all(|w| *w >= S * 4 / 5 && *w <= S * 6 / 5), "{around:?}");
        assert!(around.iter().any(|w| *w < S) && around.iter().any(|w| *w > S), "both sides: {around:?}");
        let full: Vec<Duration> = (0..200).map(|_| Jitter::Full.apply(S)).collect();
        assert!(full.iter().all(|w| *w <= S), "{full:?}");
        assert_eq!(Jitter::Add.apply(Duration::MAX), Duration::MAX, "saturates");
        assert!(full.iter().any(|w| *w < S / 2) && full.iter().any(|w| *w > S / 2), "{full:?}");
        assert_eq!(Jitter::None.apply(S), S);
    }
}
