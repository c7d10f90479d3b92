//! `/health` (alive: fails once a task that cannot be restarted died),
//! `/ready` (every source synced: safe to send queries),
//! `/metrics` (Prometheus text) and `/debug/explain`, on one HTTP listener.
//! The first three answer everyone (probes, Prometheus); `/debug/` answers
//! only the peers `--allow-debug` lets in, by the rule the DNS debug names
//! follow ([`DebugAnswers::allows`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use std::panic::AssertUnwindSafe;

use axum::Router;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures::FutureExt;
use tokio::net::TcpListener;
use tracing::{debug, warn};

use super::metrics::Metrics;
use crate::fault::{Failures, Faults, Point, Task};
use crate::store::Reader;
use crate::wire::DebugAnswers;

/// What the endpoints read.
#[derive(Clone)]
pub struct Ops {
    reader: Reader,
    metrics: Arc<Metrics>,
    draining: Arc<AtomicBool>,
    failures: Arc<Failures>,
    faults: Faults,
    debug: Option<Arc<DebugAnswers>>,
}

impl Ops {
    /// The endpoints' view of a server. While `draining` is set (lameduck
    /// after SIGTERM) `/ready` fails; once `failures` holds a fatal
    /// failure, `/health` fails. `/debug/` answers the peers `debug`
    /// allows (the DNS path's `--allow-debug`); with `None`, nobody.
    pub fn new(
        reader: Reader,
        metrics: Arc<Metrics>,
        draining: Arc<AtomicBool>,
        failures: Arc<Failures>,
        faults: Faults,
        debug: Option<Arc<DebugAnswers>>,
    ) -> Self {
        Self { reader, metrics, draining, failures, faults, debug }
    }
}

/// Serves the endpoints on `listener` until the task is dropped or the
/// listener fails.
pub async fn serve(listener: TcpListener, ops: Ops) {
    // The check is a route layer of the debug routes themselves, not a
    // test of the path: whatever spelling of a path the router takes to a
    // debug handler, the check runs before it.
    let debug = Router::new()
        .route("/debug/explain", get(explain))
        .route_layer(axum::middleware::from_fn_with_state(ops.clone(), debug_access));
    let app = Router::new()
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics_text))
        .merge(debug)
        .layer(axum::middleware::from_fn_with_state(ops.clone(), catch_panics))
        .with_state(ops);
    // The peer's address (`ConnectInfo`) is what `/debug/` is allowed by.
    let app = app.into_make_service_with_connect_info::<SocketAddr>();
    if let Err(e) = axum::serve(listener, app).await {
        warn!(error = %e, "HTTP endpoint stopped");
    }
}

/// The endpoints of a command that serves no DNS (`sync`, `setup-dns
/// --watch`) on `listener`: `/health` fails once a task that cannot be
/// restarted died; `/ready` fails with the reason `unready` gives (`None`:
/// ready); `/metrics` renders `registry`. Until the listener fails.
pub async fn serve_probes(
    listener: TcpListener,
    registry: prometheus::Registry,
    failures: Arc<Failures>,
    unready: impl Fn() -> Option<String> + Clone + Send + Sync + 'static,
) {
    let health = move || {
        let reason = failures.fatal_reason().map(str::to_owned);
        async move {
            match reason {
                None => (StatusCode::OK, "OK".to_owned()),
                Some(r) => (StatusCode::INTERNAL_SERVER_ERROR, format!("failed: {r}\n")),
            }
        }
    };
    let ready = move || {
        let why = unready();
        async move {
            match why {
                None => (StatusCode::OK, "OK".to_owned()),
                Some(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
            }
        }
    };
    let metrics = move || {
        let registry = registry.clone();
        async move { crate::scrape::render(&registry) }
    };
    let app = Router::new()
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics));
    if let Err(e) = axum::serve(listener, app).await {
        warn!(error = %e, "HTTP server stopped");
    }
}

/// `/debug/` answers only peers in `--allow-debug`, like the DNS debug
/// names: the report tells how a name is answered and to whom, which is
/// not for every client of a listener that probes and Prometheus reach.
/// Others get 403 naming the flag; both are counted.
async fn debug_access(State(ops): State<Ops>, request: Request, next: Next) -> Response {
    let peer = request.extensions().get::<ConnectInfo<SocketAddr>>().map(|ConnectInfo(a)| a.ip());
    // No peer (served without connection information) or no rule: refused,
    // never answered by default.
    let allowed = matches!((&ops.debug, peer), (Some(debug), Some(ip)) if debug.allows(ip));
    ops.metrics.http_debug(allowed);
    if allowed {
        return next.run(request).await;
    }
    let peer = peer.map_or_else(|| "this client".to_owned(), |ip| ip.to_string());
    debug!(%peer, path = request.uri().path(), "HTTP /debug/ refused: not in --allow-debug");
    let body = format!("forbidden: /debug/ answers only clients in --allow-debug, and {peer} is not\n");
    (StatusCode::FORBIDDEN, body).into_response()
}

/// A request whose handler panics gets 500 and is counted (task `http`);
/// the server and its other connections go on.
async fn catch_panics(State(ops): State<Ops>, request: Request, next: Next) -> Response {
    let run = AssertUnwindSafe(async {
        ops.faults.point(Point::Http, &[]);
        next.run(request).await
    });
    match run.catch_unwind().await {
        Ok(response) => response,
        Err(_) => {
            ops.failures.panicked(Task::Http);
            (StatusCode::INTERNAL_SERVER_ERROR, "internal error\n").into_response()
        }
    }
}

async fn health(State(ops): State<Ops>) -> (StatusCode, String) {
    match ops.failures.fatal_reason() {
        None => (StatusCode::OK, "OK\n".into()),
        Some(reason) => (StatusCode::INTERNAL_SERVER_ERROR, format!("failed: {reason}\n")),
    }
}

async fn ready(State(ops): State<Ops>) -> (StatusCode, &'static str) {
    if ops.draining.load(Ordering::Relaxed) {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n")
    } else if ops.reader.load().is_ready() {
        (StatusCode::OK, "OK\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready: waiting for the first complete list of every source\n")
    }
}

async fn metrics_text(State(ops): State<Ops>) -> ([(header::HeaderName, &'static str); 1], String) {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], ops.metrics.render())
}

/// Decodes a `%XX`-encoded query parameter value.
fn unescape(v: &str) -> String {
    let mut out = Vec::with_capacity(v.len());
    let b = v.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match (
            b[i],
            b.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok()),
        ) {
            (b'%', Some(x)) => {
                out.push(x);
                i += 3;
            }
            (b'+', _) => {
                out.push(b' ');
                i += 1;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

async fn explain(State(ops): State<Ops>, uri: axum::http::Uri) -> (StatusCode, String) {
    let mut name = None;
    let mut qtype = "A".to_owned();
    let mut cluster = None;
    for pair in uri.query().unwrap_or("").split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "name" => name = Some(unescape(v)),
            "type" => qtype = unescape(v),
            "cluster" if !v.is_empty() => cluster = Some(unescape(v)),
            _ => {}
        }
    }
    let Some(name) = name else {
        return (StatusCode::BAD_REQUEST, "name= is required\n".into());
    };
    let snap = ops.reader.load_full();
    match super::explain::report(&snap, &name, &qtype, cluster.as_deref()) {
        Ok(text) => (StatusCode::OK, text),
        Err(e) => (StatusCode::BAD_REQUEST, format!("{e}\n")),
    }
}
