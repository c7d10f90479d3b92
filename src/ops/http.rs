//! The one HTTP router every command serves ([`Endpoints`]): `/health`
//! (alive: fails once a task that cannot be restarted died), `/ready` (the
//! command's own readiness, failing with its reason), `/metrics` (the
//! process's registry, Prometheus text), and the routes a command adds
//! (`serve`'s `/debug/`, [`super::debug`]). A request whose handler
//! panics gets 500 and is counted; the server and its other connections
//! go on.
//!
//! A scrape is rendered on tokio's blocking pool, one at a time
//! ([`Exposition`]): the runtime's two threads also answer DNS over TCP,
//! and a registry read at scrape time is as slow as what it reads (the
//! per-service view at 100,000 services took 0.5 s).

use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures::FutureExt;
use prometheus::Registry;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tracing::warn;

use crate::fault::{Failures, Faults, Point, Task};

/// Why a command is not ready now (`None`: ready), as `/ready` says it.
type Readiness = Arc<dyn Fn() -> Option<String> + Send + Sync>;

/// The endpoints of one command, built before they are served.
pub struct Endpoints {
    common: Common,
    faults: Faults,
    routes: Router,
}

/// What `/health`, `/ready` and `/metrics` read.
#[derive(Clone)]
struct Common {
    exposition: Exposition,
    failures: Arc<Failures>,
    unready: Readiness,
}

/// Renders registries as Prometheus text off the runtime's threads, one
/// at a time: a second scrape waits for the first (holding no thread
/// meanwhile) rather than render beside it. Clones share the turn, so
/// every route of one server renders in the same line.
#[derive(Clone)]
pub struct Exposition {
    registry: Registry,
    turn: Arc<Semaphore>,
}

impl Exposition {
    /// Renders `registry` (and others given to [`Exposition::of`]).
    pub fn new(registry: Registry) -> Self {
        Self { registry, turn: Arc::new(Semaphore::new(1)) }
    }

    /// The response to a scrape of the registry.
    pub async fn render(&self) -> Response {
        self.of(&self.registry).await
    }

    /// The response to a scrape of `registry`, in this exposition's turn.
    /// A panic while rendering is resumed here, so the route's panic layer
    /// counts it as any handler's.
    pub async fn of(&self, registry: &Registry) -> Response {
        let Ok(_turn) = self.turn.acquire().await else {
            return (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n").into_response();
        };
        let registry = registry.clone();
        match tokio::task::spawn_blocking(move || crate::scrape::render(&registry)).await {
            Ok(text) => ([(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)], text).into_response(),
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n").into_response(),
        }
    }
}

impl Endpoints {
    /// `/health` fails once `failures` holds a fatal failure; `/ready`
    /// fails with the reason `unready` gives (`None`: ready); `/metrics`
    /// renders `registry`. `faults` may make a request panic (tests).
    pub fn new(
        registry: Registry,
        failures: Arc<Failures>,
        faults: Faults,
        unready: impl Fn() -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        Self {
            common: Common { exposition: Exposition::new(registry), failures, unready: Arc::new(unready) },
            faults,
            routes: Router::new(),
        }
    }

    /// The renderer of `/metrics`, for routes that render another registry
    /// in its turn (`/debug/metrics`).
    pub fn exposition(&self) -> Exposition {
        self.common.exposition.clone()
    }

    /// Adds `routes` (their state given) beside the common ones; a panic
    /// in them is caught as in the others.
    pub fn with(mut self, routes: Router) -> Self {
        self.routes = self.routes.merge(routes);
        self
    }

    /// Every route, each request's panic caught.
    fn router(self) -> Router {
        let panics = Panics { failures: self.common.failures.clone(), faults: self.faults };
        Router::new()
            .route("/health", get(health))
            .route("/ready", get(ready))
            .route("/metrics", get(metrics))
            .with_state(self.common)
            .merge(self.routes)
            .layer(axum::middleware::from_fn_with_state(panics, catch_panics))
    }

    /// Serves on `listener` until the task is dropped or the listener
    /// fails.
    pub async fn serve(self, listener: TcpListener) {
        // Each request carries its peer's address (`ConnectInfo`): what
        // `/debug/` is allowed by.
        let app = self.router().into_make_service_with_connect_info::<SocketAddr>();
        if let Err(e) = axum::serve(listener, app).await {
            warn!(error = %e, "HTTP endpoint stopped");
        }
    }
}

async fn health(State(c): State<Common>) -> (StatusCode, String) {
    match c.failures.fatal_reason() {
        None => (StatusCode::OK, "OK\n".into()),
        Some(reason) => (StatusCode::INTERNAL_SERVER_ERROR, format!("failed: {reason}\n")),
    }
}

async fn ready(State(c): State<Common>) -> (StatusCode, String) {
    match (c.unready)() {
        None => (StatusCode::OK, "OK\n".into()),
        Some(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
    }
}

async fn metrics(State(c): State<Common>) -> Response {
    c.exposition.render().await
}

/// What a caught panic is counted in, and the test-only fault point.
#[derive(Clone)]
struct Panics {
    failures: Arc<Failures>,
    faults: Faults,
}

/// A request whose handler panics gets 500 and is counted (task `http`);
/// the server and its other connections go on.
async fn catch_panics(State(p): State<Panics>, request: Request, next: Next) -> Response {
    let run = AssertUnwindSafe(async {
        p.faults.point(Point::Http, &[]);
        next.run(request).await
    });
    match run.catch_unwind().await {
        Ok(response) => response,
        Err(_) => {
            p.failures.panicked(Task::Http);
            (StatusCode::INTERNAL_SERVER_ERROR, "internal error\n").into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// Serves `endpoints` on a port of loopback's.
    async fn start(endpoints: Endpoints) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(endpoints.serve(listener));
        addr
    }

    /// `GET path` over HTTP/1.0: status, content type, body.
    async fn fetch(addr: SocketAddr, path: &str) -> (u16, String, String) {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes()).await.unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).await.unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
        let kind = head
            .lines()
            .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-type: ").map(str::to_owned))
            .unwrap_or_default();
        (status, kind, body.to_owned())
    }

    #[tokio::test]
    async fn health_ready_and_metrics_answer_for_the_command() {
        let registry = Registry::new();
        let failures = Failures::new();
        crate::ops::metrics::register_panics(&registry, failures.clone()).unwrap();
        let waiting = Arc::new(AtomicBool::new(true));
        let w = waiting.clone();
        let addr = start(Endpoints::new(registry, failures.clone(), Faults::default(), move || {
            w.load(Ordering::Relaxed).then(|| "not yet".to_owned())
        }))
        .await;

        let (status, _, body) = fetch(addr, "/health").await;
        assert_eq!((status, body.as_str()), (200, "OK\n"));
        let (status, _, body) = fetch(addr, "/ready").await;
        assert_eq!((status, body.as_str()), (503, "not yet\n"));
        waiting.store(false, Ordering::Relaxed);
        let (status, _, body) = fetch(addr, "/ready").await;
        assert_eq!((status, body.as_str()), (200, "OK\n"));

        let (status, kind, body) = fetch(addr, "/metrics").await;
        assert_eq!((status, kind.as_str()), (200, "text/plain; version=0.0.4"));
        assert!(body.contains("clusterset_dns_panics_total{task=\"http\"} 0"), "{body}");

        failures.fatal("the writer died".into());
        let (status, _, body) = fetch(addr, "/health").await;
        assert_eq!((status, body.as_str()), (500, "failed: the writer died\n"));
    }

    #[tokio::test]
    async fn a_panicking_route_gets_500_is_counted_and_the_server_goes_on() {
        let failures = Failures::new();
        async fn boom() -> &'static str {
            panic!("a handler's bug")
        }
        let boom = Router::new().route("/boom", get(boom));
        let addr =
            start(Endpoints::new(Registry::new(), failures.clone(), Faults::default(), || None).with(boom))
                .await;
        let (status, _, body) = fetch(addr, "/boom").await;
        assert_eq!((status, body.as_str()), (500, "internal error\n"));
        assert_eq!(failures.panics(Task::Http), 1);
        assert_eq!(fetch(addr, "/health").await.0, 200);
        // The common routes are under the same layer.
        let faults = Faults::parse("http").unwrap();
        let addr = start(Endpoints::new(Registry::new(), failures.clone(), faults, || None)).await;
        assert_eq!(fetch(addr, "/health").await.0, 500, "the request that panicked");
        assert_eq!(failures.panics(Task::Http), 2);
        assert_eq!(fetch(addr, "/health").await.0, 200);
    }

    /// A family whose read blocks its thread for `hold` and records the
    /// thread it ran on and how many reads ran at once.
    fn slow_family(
        registry: &Registry,
        hold: std::time::Duration,
        threads: Arc<std::sync::Mutex<Vec<std::thread::ThreadId>>>,
        at_once: Arc<(std::sync::atomic::AtomicUsize, std::sync::atomic::AtomicUsize)>,
    ) {
        let mut f = crate::scrape::Families::new();
        f.gauge("t_slow", "A read that takes a while.", &[], move || {
            threads.lock().unwrap().push(std::thread::current().id());
            let now = at_once.0.fetch_add(1, Ordering::SeqCst) + 1;
            at_once.1.fetch_max(now, Ordering::SeqCst);
            std::thread::sleep(hold);
            at_once.0.fetch_sub(1, Ordering::SeqCst);
            vec![crate::scrape::Sample::new(&[], 1.0)]
        });
        f.register(registry).unwrap();
    }

    /// A scrape is rendered off the runtime's threads (they answer DNS over
    /// TCP meanwhile), and scrapes are rendered one at a time.
    #[tokio::test(flavor = "current_thread")]
    async fn scrapes_render_off_the_runtime_one_at_a_time() {
        let registry = Registry::new();
        let threads = Arc::new(std::sync::Mutex::new(Vec::new()));
        let at_once =
            Arc::new((std::sync::atomic::AtomicUsize::new(0), std::sync::atomic::AtomicUsize::new(0)));
        slow_family(&registry, std::time::Duration::from_millis(200), threads.clone(), at_once.clone());
        let addr = start(Endpoints::new(registry, Failures::new(), Faults::default(), || None)).await;
        // The runtime's only thread runs this test and the server.
        let runtime = std::thread::current().id();
        let (a, b) = tokio::join!(fetch(addr, "/metrics"), fetch(addr, "/metrics"));
        for (status, _, body) in [a, b] {
            assert_eq!(status, 200);
            assert!(body.contains("t_slow 1"), "{body}");
        }
        let threads = threads.lock().unwrap();
        assert_eq!(threads.len(), 2);
        assert!(threads.iter().all(|t| *t != runtime), "a scrape rendered on the runtime's thread");
        assert_eq!(at_once.1.load(Ordering::SeqCst), 1, "two scrapes rendered at once");
    }
}
