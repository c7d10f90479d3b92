//! The write fence: a gate that is open only until a deadline, and the
//! client layer that checks it at the wire.
//!
//! A writer that holds a tenure (the sync controller leading a shard on a
//! Lease) marks each of its write requests with the tenure's fence
//! ([`WriteFence`], a request extension). [`FenceLayer`] is the innermost
//! layer of every member client's stack (`client::connect_limited`): it
//! checks the fence after the rate limit's wait and before each attempt
//! (kube's retry clones the request, extensions included, and sends it down
//! the stack again), once when the request is handed to it and once more
//! when it is first polled, which is when the HTTP client starts sending.
//! A request that waited in the token bucket past the end of the tenure, or
//! whose process was frozen with it queued, is refused there, never sent.
//!
//! The deadline is on the monotonic clock (`tokio::time::Instant`), not the
//! wall clock: a step of the wall clock (NTP, an operator, a VM's clock
//! set back) neither opens nor closes it. How the deadline is chosen, so
//! that it falls before any other writer may start, is the election's rule
//! (`controller::election`).
//!
//! Every write that passes carries an `Audit-ID` header
//! (`fence-<shard>-<unix µs>-<n>`): kube-apiserver records a client's
//! Audit-ID as the audit event's `auditID`, so its audit log says, for each
//! write, which shard's fence it passed and when. A write checked while
//! the tenure was ours but received after another writer took over (sent
//! just before the sender was frozen, or held by a frozen or partitioned
//! API server) is told apart from a fence that failed by that time.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderValue, Request};
use tokio::time::Instant;
use tower::{BoxError, Layer, Service};

/// Lead time kept between the fence and the end of the tenure: a write
/// checked just before the fence closes still reaches its API server
/// before another writer may start.
pub const MARGIN: Duration = Duration::from_millis(500);

/// The header kube-apiserver takes as the audit event's ID.
pub const AUDIT_ID: &str = "Audit-ID";

const CLOSED: u64 = 0;
const OPEN: u64 = u64::MAX;

/// The fence of one tenure.
#[derive(Debug)]
pub struct Fence {
    /// The instant `until_ns` counts from.
    base: Instant,
    /// Writes are allowed while the time since `base` is below this many
    /// nanoseconds ([`CLOSED`]: never, [`OPEN`]: always).
    until_ns: AtomicU64,
    /// Woken when the fence is closed before its time ([`Fence::close`]).
    closed: tokio::sync::Notify,
}

impl Fence {
    /// Always open: no tenure to lose (one writer by configuration).
    pub fn open() -> Self {
        Self { base: Instant::now(), until_ns: AtomicU64::new(OPEN), closed: tokio::sync::Notify::new() }
    }

    /// Closed until a tenure is held.
    pub fn closed() -> Self {
        Self { base: Instant::now(), until_ns: AtomicU64::new(CLOSED), closed: tokio::sync::Notify::new() }
    }

    fn now_ns(&self) -> u64 {
        u64::try_from(Instant::now().saturating_duration_since(self.base).as_nanos()).unwrap_or(OPEN - 1)
    }

    /// True while a write may be sent.
    pub fn may_write(&self) -> bool {
        self.now_ns() < self.until_ns.load(Ordering::Acquire)
    }

    /// How long writes may still be sent: `None` when always open, zero
    /// when closed. A call's deadline is never later than this.
    pub fn remaining(&self) -> Option<Duration> {
        match self.until_ns.load(Ordering::Acquire) {
            OPEN => None,
            until => Some(Duration::from_nanos(until.saturating_sub(self.now_ns()))),
        }
    }

    /// The tenure was confirmed by a request sent at `sent` (before the
    /// request, not when its answer came) for `duration`: open until then
    /// plus the duration, less [`MARGIN`].
    pub fn held(&self, sent: Instant, duration: Duration) {
        let until = sent.checked_add(duration.saturating_sub(MARGIN)).unwrap_or(sent);
        let ns = u64::try_from(until.saturating_duration_since(self.base).as_nanos()).unwrap_or(OPEN - 1);
        // Zero is "closed"; a tenure that ended before `base` is closed too.
        self.until_ns.store(ns, Ordering::Release);
    }

    /// The tenure is someone else's, or nobody's: closed at once, and
    /// every call waiting in [`Fence::closing`] ends.
    pub fn close(&self) {
        self.until_ns.store(CLOSED, Ordering::Release);
        self.closed.notify_waiters();
    }

    /// Resolves once the fence is closed by [`Fence::close`] (at once when
    /// it is closed already); running out of time is the caller's deadline.
    /// A write still waiting for its turn is dropped then, which frees its
    /// place in the client's queue and rate limit for the writes of tenures
    /// that still hold.
    pub async fn closing(&self) {
        loop {
            let notified = self.closed.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            if self.until_ns.load(Ordering::Acquire) == CLOSED {
                return;
            }
            notified.await;
        }
    }
}

/// A request extension: this request is a write under `fence`, the fence
/// of shard `shard` (named in its Audit-ID).
#[derive(Debug, Clone)]
pub struct WriteFence {
    /// The fence.
    pub fence: Arc<Fence>,
    /// The shard whose tenure it is.
    pub shard: u32,
}

impl WriteFence {
    /// A write of shard `shard` under `fence`.
    pub fn new(fence: Arc<Fence>, shard: u32) -> Self {
        Self { fence, shard }
    }
}

/// A write refused at the wire: its fence was closed.
#[derive(Debug, thiserror::Error)]
#[error("not sent: the write fence of shard {shard} is closed (the tenure may have run out)")]
pub struct Fenced {
    /// The shard.
    pub shard: u32,
}

/// True when `e`, an error of a client whose stack has a [`FenceLayer`],
/// is a refusal at the wire.
pub fn is_fenced(e: &kube::Error) -> bool {
    match e {
        kube::Error::Service(e) => e.downcast_ref::<Fenced>().is_some(),
        _ => false,
    }
}

/// The layer; one counter for the Audit-IDs of every clone of its client.
#[derive(Debug, Clone, Default)]
pub struct FenceLayer {
    sent: Arc<AtomicU64>,
}

impl<S> Layer<S> for FenceLayer {
    type Service = FenceCheck<S>;

    fn layer(&self, inner: S) -> FenceCheck<S> {
        FenceCheck { inner, sent: self.sent.clone() }
    }
}

/// The service [`FenceLayer`] makes.
#[derive(Debug, Clone)]
pub struct FenceCheck<S> {
    inner: S,
    sent: Arc<AtomicU64>,
}

type Checked<R> = Pin<Box<dyn Future<Output = Result<R, BoxError>> + Send>>;

impl<S, B> Service<Request<B>> for FenceCheck<S>
where
    S: Service<Request<B>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Checked<S::Response>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        let Some(write) = request.extensions().get::<WriteFence>().cloned() else {
            let sent = self.inner.call(request);
            return Box::pin(async move { sent.await.map_err(Into::into) });
        };
        if !write.fence.may_write() {
            return Box::pin(std::future::ready(Err(Fenced { shard: write.shard }.into())));
        }
        let n = self.sent.fetch_add(1, Ordering::Relaxed);
        let checked = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros());
        if let Ok(id) = HeaderValue::from_str(&format!("fence-{}-{checked}-{n}", write.shard)) {
            request.headers_mut().insert(AUDIT_ID, id);
        }
        // Lazy below here: nothing is sent until this future is polled,
        // which may be later (the caller's task runs it); checked again then.
        let sent = self.inner.call(request);
        Box::pin(async move {
            if !write.fence.may_write() {
                return Err(Fenced { shard: write.shard }.into());
            }
            sent.await.map_err(Into::into)
        })
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::Mutex;

    use tower::ServiceExt;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn writes_stop_a_margin_before_the_tenure_runs_out() {
        let f = Fence::closed();
        assert!(!f.may_write(), "closed until a tenure is held");
        assert_eq!(f.remaining(), Some(Duration::ZERO));
        f.held(Instant::now(), Duration::from_secs(15));
        assert!(f.may_write());
        assert_eq!(f.remaining(), Some(Duration::from_millis(14_500)));
        tokio::time::advance(Duration::from_millis(14_499)).await;
        assert!(f.may_write());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(!f.may_write(), "inside the margin: closed");
        // Confirmed by a request sent long ago (frozen past the tenure, then
        // woken with its answer): closed.
        f.held(Instant::now() - Duration::from_secs(20), Duration::from_secs(15));
        assert!(!f.may_write());
        f.held(Instant::now(), Duration::from_secs(15));
        f.close();
        assert!(!f.may_write(), "another holder");
        assert!(Fence::open().may_write());
        assert_eq!(Fence::open().remaining(), None);
    }

    /// Records what reaches it: the wire. Lazy as hyper's client is:
    /// nothing is sent until its future is polled.
    #[derive(Clone, Default)]
    struct Wire(Arc<Mutex<Vec<Option<String>>>>);

    impl Service<Request<()>> for Wire {
        type Response = ();
        type Error = Infallible;
        type Future = Pin<Box<dyn Future<Output = Result<(), Infallible>> + Send>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, r: Request<()>) -> Self::Future {
            let sent = self.0.clone();
            Box::pin(async move {
                let id = r.headers().get(AUDIT_ID).and_then(|v| v.to_str().ok()).map(str::to_owned);
                sent.lock().unwrap().push(id);
                Ok(())
            })
        }
    }

    fn write(fence: &Arc<Fence>) -> Request<()> {
        let mut r = Request::new(());
        r.extensions_mut().insert(WriteFence::new(fence.clone(), 3));
        r
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_is_sent_only_through_an_open_fence_and_says_when_it_passed() {
        let wire = Wire::default();
        let svc = FenceLayer::default().layer(wire.clone());
        let fence = Arc::new(Fence::closed());
        let refused = svc.clone().oneshot(write(&fence)).await.unwrap_err();
        assert!(refused.downcast_ref::<Fenced>().is_some_and(|f| f.shard == 3), "{refused}");
        assert!(wire.0.lock().unwrap().is_empty(), "nothing reached the wire");
        // A read carries no fence: sent whatever the fence says, no Audit-ID.
        svc.clone().oneshot(Request::new(())).await.unwrap();
        fence.held(Instant::now(), Duration::from_secs(15));
        svc.clone().oneshot(write(&fence)).await.unwrap();
        let seen = wire.0.lock().unwrap().clone();
        assert_eq!(seen[0], None);
        let id = seen[1].clone().expect("an Audit-ID");
        let parts: Vec<&str> = id.split('-').collect();
        assert_eq!((parts[0], parts[1], parts[3]), ("fence", "3", "0"), "{id}");
        let micros: u128 = parts[2].parse().unwrap();
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_micros();
        assert!(now.abs_diff(micros) < 5_000_000, "{id}: the wall-clock time it passed");
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_that_passed_when_handed_over_is_checked_again_when_it_starts() {
        let wire = Wire::default();
        let mut svc = FenceLayer::default().layer(wire.clone());
        let fence = Arc::new(Fence::closed());
        fence.held(Instant::now(), Duration::from_secs(15));
        svc.ready().await.unwrap();
        let handed = svc.call(write(&fence));
        // The caller's task is frozen with the request handed over (a
        // SIGSTOP, a paused VM): when it resumes, the tenure is gone.
        tokio::time::advance(Duration::from_secs(20)).await;
        assert!(handed.await.is_err());
        assert!(wire.0.lock().unwrap().is_empty(), "sent after the tenure ran out");
    }
}
