//! `serve`'s `/debug/` routes, mounted on the command's endpoints
//! ([`super::http::Endpoints::with`]): `/debug/explain` (how a name is
//! answered, [`super::explain`]) and `/debug/metrics` (the per-service
//! families, [`Metrics::per_service`], which `/metrics` leaves out unless
//! `--metrics-per-service`). They answer only the peers `--allow-debug`
//! lets in, by the rule the DNS debug names follow
//! ([`DebugAnswers::allows`]).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tracing::debug;

use super::http::Exposition;
use super::metrics::Metrics;
use crate::store::Reader;
use crate::wire::DebugAnswers;

/// What the debug routes read.
#[derive(Clone)]
struct DebugState {
    reader: Reader,
    metrics: Arc<Metrics>,
    allowed: Option<Arc<DebugAnswers>>,
    exposition: Exposition,
}

/// The routes, answering the peers `allowed` allows (the DNS path's
/// `--allow-debug`; with `None`, nobody), each request counted in
/// `metrics`; `/debug/metrics` rendered in `exposition`'s turn (the
/// endpoints' `/metrics`).
pub fn routes(
    reader: Reader,
    metrics: Arc<Metrics>,
    allowed: Option<Arc<DebugAnswers>>,
    exposition: Exposition,
) -> Router {
    let state = DebugState { reader, metrics, allowed, exposition };
    // The check is a route layer of the debug routes themselves, not a
    // test of the path: whatever spelling of a path the router takes to a
    // debug handler, the check runs before it.
    Router::new()
        .route("/debug/explain", get(explain))
        .route("/debug/metrics", get(per_service_metrics))
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), access))
        .with_state(state)
}

/// `/debug/` answers only peers in `--allow-debug`, like the DNS debug
/// names: the report tells how a name is answered and to whom, which is
/// not for every client of a listener that probes and Prometheus reach.
/// Others get 403 naming the flag; both are counted.
async fn access(State(d): State<DebugState>, request: Request, next: Next) -> Response {
    let peer = request.extensions().get::<ConnectInfo<SocketAddr>>().map(|ConnectInfo(a)| a.ip());
    // No peer (served without connection information) or no rule: refused,
    // never answered by default.
    let allowed = matches!((&d.allowed, peer), (Some(rule), Some(ip)) if rule.allows(ip));
    d.metrics.http_debug(allowed);
    if allowed {
        return next.run(request).await;
    }
    let peer = peer.map_or_else(|| "this client".to_owned(), |ip| ip.to_string());
    debug!(%peer, path = request.uri().path(), "HTTP /debug/ refused: not in --allow-debug");
    let body = format!("forbidden: /debug/ answers only clients in --allow-debug, and {peer} is not\n");
    (StatusCode::FORBIDDEN, body).into_response()
}

async fn explain(State(d): State<DebugState>, uri: axum::http::Uri) -> (StatusCode, String) {
    let mut name = None;
    let mut qtype = "A".to_owned();
    let mut cluster = None;
    for (k, v) in form_urlencoded::parse(uri.query().unwrap_or("").as_bytes()) {
        match &*k {
            "name" => name = Some(v.into_owned()),
            "type" => qtype = v.into_owned(),
            "cluster" if !v.is_empty() => cluster = Some(v.into_owned()),
            _ => {}
        }
    }
    let Some(name) = name else {
        return (StatusCode::BAD_REQUEST, "name= is required\n".into());
    };
    let snap = d.reader.load_full();
    match super::explain::report(&snap, &name, &qtype, cluster.as_deref()) {
        Ok(text) => (StatusCode::OK, text),
        Err(e) => (StatusCode::BAD_REQUEST, format!("{e}\n")),
    }
}

/// The per-service families as Prometheus text.
async fn per_service_metrics(State(d): State<DebugState>) -> Response {
    d.exposition.of(d.metrics.per_service()).await
}
