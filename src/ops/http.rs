//! `/health` (alive), `/ready` (every source synced: safe to send queries)
//! and `/metrics` (Prometheus text), on one HTTP listener.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::routing::get;
use tokio::net::TcpListener;
use tracing::warn;

use super::metrics::Metrics;
use crate::store::Reader;

#[derive(Clone)]
struct Ops {
    reader: Reader,
    metrics: Arc<Metrics>,
    draining: Arc<AtomicBool>,
}

/// Serves the endpoints on `listener` until the task is dropped. While
/// `draining` is set (lameduck after SIGTERM), `/ready` fails.
pub async fn serve(listener: TcpListener, reader: Reader, metrics: Arc<Metrics>, draining: Arc<AtomicBool>) {
    let app = Router::new()
        .route("/health", get(|| async { "OK\n" }))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics_text))
        .with_state(Ops { reader, metrics, draining });
    if let Err(e) = axum::serve(listener, app).await {
        warn!(error = %e, "HTTP endpoint stopped");
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
