//! The one HTTP router every command serves ([`Endpoints`]): `/health`
//! (alive: fails once a task that cannot be restarted died), `/ready` (the
//! command's own readiness, failing with its reason), `/metrics` (the
//! process's registry, Prometheus text), and the routes a command adds
//! (`serve`'s `/debug/`, [`super::debug`]). A request whose handler
//! panics gets 500 and is counted; the server and its other connections
//! go on.

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
    registry: Registry,
    failures: Arc<Failures>,
    unready: Readiness,
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
            common: Common { registry, failures, unready: Arc::new(unready) },
            faults,
            routes: Router::new(),
        }
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

async fn metrics(State(c): State<Common>) -> ([(header::HeaderName, &'static str); 1], String) {
    ([(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)], crate::scrape::render(&c.registry))
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
}
