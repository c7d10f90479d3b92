//! [`TokenBucket`]: `rate` tokens a second, up to a capacity, for work
//! that may burst and must keep a rate on average (the API clients'
//! `--kube-qps`/`--kube-burst`, probes started per second).

use std::time::Duration;

use tokio::time::Instant;

/// A token bucket, full at the start: the first `capacity` takes go at
/// once, then one per `1/rate` seconds. Taken one of two ways: a caller
/// that can skip work asks [`TokenBucket::try_take`]; a caller that must
/// wait [`TokenBucket::reserve`]s, which lends (as Go's
/// `rate.Limiter.Reserve`): the token is always taken and the wait is the
/// debt, so queued callers are spaced exactly `1/rate` apart.
///
/// On tokio's clock, so tests may pause it.
#[derive(Debug)]
pub struct TokenBucket {
    tokens: f64,
    /// Tokens per second (> 0).
    rate: f64,
    /// Most tokens held (≥ 1).
    capacity: f64,
    at: Instant,
}

impl TokenBucket {
    /// A full bucket at `now` of `rate` tokens a second (> 0), holding at
    /// most `capacity`.
    pub fn new(rate: f64, capacity: f64, now: Instant) -> Self {
        Self { tokens: capacity, rate, capacity, at: now }
    }

    /// Adds what accrued since the last take, up to the capacity.
    fn refill(&mut self, now: Instant) {
        let accrued = now.saturating_duration_since(self.at).as_secs_f64() * self.rate;
        self.tokens = (self.tokens + accrued).min(self.capacity);
        self.at = now.max(self.at);
    }

    /// Takes a token at `now` if one is there.
    pub fn try_take(&mut self, now: Instant) -> bool {
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Takes a token at `now`, lending when there is none: how long the
    /// caller must wait before using it.
    pub fn reserve(&mut self, now: Instant) -> Duration {
        self.refill(now);
        self.tokens -= 1.0;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::try_from_secs_f64(-self.tokens / self.rate).unwrap_or(Duration::MAX)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_bucket_lets_a_burst_through_then_spaces_requests_by_one_over_qps() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(10.0, 3.0, t0);
        let waits: Vec<Duration> = (0..6).map(|_| b.reserve(t0)).collect();
        let ms: Vec<u128> = waits.iter().map(|w| w.as_millis()).collect();
        assert_eq!(ms, [0, 0, 0, 100, 200, 300], "three at once, then 100 ms apart");
    }

    #[test]
    fn a_quiet_spell_refills_the_bucket_up_to_the_burst_only() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(10.0, 2.0, t0);
        b.reserve(t0);
        b.reserve(t0);
        // 10 s at 10/s would be 100 tokens; the bucket holds 2.
        let later = t0 + Duration::from_secs(10);
        assert_eq!(b.reserve(later), Duration::ZERO);
        assert_eq!(b.reserve(later), Duration::ZERO);
        assert_eq!(b.reserve(later).as_millis(), 100);
        // Half a token's time later: the debt is 1.5 tokens.
        assert_eq!(b.reserve(later + Duration::from_millis(50)).as_millis(), 150);
    }

    #[test]
    fn try_take_skips_when_empty_and_never_lends() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(2.0, 2.0, t0);
        assert!(b.try_take(t0) && b.try_take(t0));
        assert!(!b.try_take(t0), "empty");
        assert!(!b.try_take(t0 + Duration::from_millis(400)), "0.8 of a token");
        assert!(b.try_take(t0 + Duration::from_millis(500)), "a whole token: the refusals took nothing");
        assert!(!b.try_take(t0 + Duration::from_millis(500)));
    }
}
