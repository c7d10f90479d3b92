//! A client-side rate limit for one API server's client: a token bucket in
//! front of every request, as a tower layer on kube's client stack
//! ([`kube::client::ClientBuilder::with_layer`]).
//!
//! Why our own layer rather than `tower::limit::RateLimit`: that one is a
//! fixed window (`num` requests per `per`, all allowed at the window's start),
//! which lets twice the rate through across a window boundary and has no
//! burst separate from the rate; client-go's `--kube-api-qps`/`--kube-api-burst`,
//! which operators know, are a token bucket. Why not `governor`: a bucket is
//! forty lines and this crate has one ([`TokenBucket`], the probes' too);
//! governor would add a dependency tree for them.
//!
//! The wait happens in `poll_ready`: kube puts its whole stack behind a
//! `tower::buffer::Buffer`, whose worker asks readiness before each call, so
//! requests queue in the buffer in arrival order while one waits for its
//! token, and a long watch holds nothing once started. Retries of a 429 or
//! 503 wrap it (`client::connect_limited`), so each attempt takes a token.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};
use tower::{Layer, Service};
use tracing::info;

use crate::pace::TokenBucket;

/// How fast one client may send requests.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// Requests per second, sustained (> 0).
    pub qps: f64,
    /// Requests sent at once after a quiet spell (≥ 1).
    pub burst: u32,
}

/// What the limit did to one client's requests, for `/metrics`.
#[derive(Debug, Default)]
pub struct ThrottleStats {
    /// Requests that had to wait for a token.
    pub throttled: AtomicU64,
    /// Their total wait, in microseconds.
    pub waited_us: AtomicU64,
}

impl ThrottleStats {
    /// Total wait, in seconds.
    pub fn waited_seconds(&self) -> f64 {
        self.waited_us.load(Ordering::Relaxed) as f64 / 1e6
    }
}

/// The layer: one bucket per client it is applied to.
#[derive(Debug, Clone)]
pub struct ThrottleLayer {
    limits: Limits,
    name: String,
    stats: Arc<ThrottleStats>,
}

impl ThrottleLayer {
    /// A layer for the client of `name` (for the log), counting into `stats`.
    pub fn new(limits: Limits, name: impl Into<String>, stats: Arc<ThrottleStats>) -> Self {
        Self { limits, name: name.into(), stats }
    }
}

impl<S> Layer<S> for ThrottleLayer {
    type Service = Throttle<S>;

    fn layer(&self, inner: S) -> Throttle<S> {
        Throttle {
            inner,
            // Lends (`reserve`): queued requests are spaced exactly 1/qps apart.
            bucket: TokenBucket::new(self.limits.qps, f64::from(self.limits.burst), Instant::now()),
            limits: self.limits,
            state: State::Idle,
            name: self.name.clone(),
            stats: self.stats.clone(),
            last_log: None,
            since_log: 0,
        }
    }
}

/// How often a throttled client says so in the log.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// The service [`ThrottleLayer`] makes.
pub struct Throttle<S> {
    inner: S,
    bucket: TokenBucket,
    limits: Limits,
    state: State,
    name: String,
    stats: Arc<ThrottleStats>,
    last_log: Option<Instant>,
    /// Requests throttled since the last log line.
    since_log: u64,
}

enum State {
    /// No token taken for the next request.
    Idle,
    /// A token taken, usable at the sleep's deadline.
    Waiting(Pin<Box<Sleep>>),
    /// A token usable now: the next `call` spends it.
    Ready,
}

impl<S> Throttle<S> {
    fn note_wait(&mut self, wait: Duration) {
        self.stats.throttled.fetch_add(1, Ordering::Relaxed);
        let us = u64::try_from(wait.as_micros()).unwrap_or(u64::MAX);
        self.stats.waited_us.fetch_add(us, Ordering::Relaxed);
        self.since_log += 1;
        let now = Instant::now();
        if self.last_log.is_none_or(|t| now.duration_since(t) >= LOG_EVERY) {
            info!(
                client = %self.name,
                throttled = self.since_log,
                wait_ms = wait.as_millis() as u64,
                qps = self.limits().qps,
                burst = self.limits().burst,
                "client-side rate limit: requests wait (--kube-qps, --kube-burst)"
            );
            self.last_log = Some(now);
            self.since_log = 0;
        }
    }

    fn limits(&self) -> Limits {
        self.limits
    }
}

impl<S, R> Service<R> for Throttle<S>
where
    S: Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        loop {
            match &mut self.state {
                State::Idle => {
                    let wait = self.bucket.reserve(Instant::now());
                    if wait.is_zero() {
                        self.state = State::Ready;
                    } else {
                        self.note_wait(wait);
                        self.state = State::Waiting(Box::pin(tokio::time::sleep(wait)));
                    }
                }
                State::Waiting(sleep) => {
                    if sleep.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    self.state = State::Ready;
                }
                // The token is ours; the inner service may still be busy.
                State::Ready => return self.inner.poll_ready(cx),
            }
        }
    }

    fn call(&mut self, request: R) -> S::Future {
        // The next request takes a token of its own.
        self.state = State::Idle;
        self.inner.call(request)
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::future::{Ready, ready};

    use super::*;

    fn limits(qps: f64, burst: u32) -> Limits {
        Limits { qps, burst }
    }

    /// Counts calls; always ready.
    struct Count(u32);

    impl Service<()> for Count {
        type Response = u32;
        type Error = Infallible;
        type Future = Ready<Result<u32, Infallible>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, (): ()) -> Self::Future {
            self.0 += 1;
            ready(Ok(self.0))
        }
    }

    // On a paused clock: each sleep ends exactly at its deadline, so the
    // figures do not depend on how busy the machine is (a late wake-up on
    // a loaded CI machine let tokens pile up between requests).
    #[tokio::test(start_paused = true)]
    async fn requests_past_the_burst_wait_for_tokens_and_are_counted() {
        let stats = Arc::new(ThrottleStats::default());
        let mut svc = ThrottleLayer::new(limits(100.0, 5), "test", stats.clone()).layer(Count(0));
        let start = Instant::now();
        for _ in 0..25 {
            std::future::poll_fn(|cx| svc.poll_ready(cx)).await.unwrap();
            svc.call(()).await.unwrap();
        }
        let took = start.elapsed();
        // 5 at once, then 20 at 100/s: at least 200 ms (less a timer tick).
        assert!(took >= Duration::from_millis(190), "25 requests in {took:?}");
        assert!(took < Duration::from_secs(2), "25 requests in {took:?}");
        assert_eq!(svc.inner.0, 25);
        assert_eq!(stats.throttled.load(Ordering::Relaxed), 20);
        // Each waited ~10 ms for its own token: ~0.2 s in all.
        let waited = stats.waited_seconds();
        assert!((0.15..0.3).contains(&waited), "waited {waited} s");
    }

    #[tokio::test]
    async fn readiness_asked_twice_takes_one_token() {
        let stats = Arc::new(ThrottleStats::default());
        let mut svc = ThrottleLayer::new(limits(1.0, 1), "test", stats.clone()).layer(Count(0));
        for _ in 0..3 {
            std::future::poll_fn(|cx| svc.poll_ready(cx)).await.unwrap();
        }
        svc.call(()).await.unwrap();
        assert_eq!(stats.throttled.load(Ordering::Relaxed), 0, "one token, taken once");
    }
}
