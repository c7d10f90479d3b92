//! `--otlp-endpoint`: the process's spans (the controller's reconciles,
//! their member lanes and writes) exported to an OpenTelemetry collector
//! over OTLP/HTTP, protobuf bodies. Off unless the flag is given: without
//! it nothing here runs and no span leaves the process.
//!
//! The SDK batches spans on a thread of its own and sends each batch from
//! there, waiting for it (`futures_executor::block_on`); the client here
//! sends it on a one-thread tokio runtime of its own, so the export never
//! depends on, nor waits in, the runtime that runs the controller, and
//! works from any thread. HTTP/1 over hyper-util's client (kube's), plain
//! `http://` only: a collector in the cluster, or a sidecar.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_http::{HttpClient, HttpError};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::registry::LookupSpan;

/// How long one export may take before it is given up (the batch is
/// dropped; the SDK says so in its own log).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// The most of a collector's answer read (it is a few bytes).
const ANSWER_LIMIT: usize = 64 * 1024;

/// Why the exporter could not start.
#[derive(Debug, thiserror::Error)]
pub enum TracesError {
    /// Its client's runtime (a thread) could not start.
    #[error("--otlp-endpoint: cannot start the exporter's client: {0}")]
    Runtime(#[source] std::io::Error),
    /// The SDK refused the configuration.
    #[error("--otlp-endpoint {endpoint}: {problem}")]
    Exporter {
        /// The endpoint.
        endpoint: Uri,
        /// What the SDK said.
        problem: String,
    },
}

/// The exporter, while it runs: its spans are flushed and it stops when
/// this is dropped (at the end of `main`).
pub struct Traces {
    provider: SdkTracerProvider,
}

impl Traces {
    /// Exports spans to `endpoint` (the full URL, `…/v1/traces`), as
    /// service `clusterset-dns`.
    pub fn new(endpoint: &Uri) -> Result<Self, TracesError> {
        let client = Sender::new()?;
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(client)
            .with_endpoint(endpoint.to_string())
            .with_timeout(EXPORT_TIMEOUT)
            .build()
            .map_err(|e| TracesError::Exporter { endpoint: endpoint.clone(), problem: e.to_string() })?;
        let resource = Resource::builder()
            .with_service_name("clusterset-dns")
            .with_attribute(opentelemetry::KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
            .build();
        let provider =
            SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build();
        Ok(Self { provider })
    }

    /// The layer that hands every span (and the events inside it) to the
    /// exporter.
    pub fn layer<S>(&self) -> tracing_opentelemetry::OpenTelemetryLayer<S, opentelemetry_sdk::trace::Tracer>
    where
        S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    {
        tracing_opentelemetry::layer().with_tracer(self.provider.tracer("clusterset-dns"))
    }
}

impl Drop for Traces {
    fn drop(&mut self) {
        // Sends what is batched; an error here has nowhere left to go.
        let _ = self.provider.shutdown();
    }
}

/// The exporter's HTTP client: requests run on a runtime of their own.
#[derive(Debug)]
struct Sender {
    runtime: tokio::runtime::Runtime,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Sender {
    fn new() -> Result<Self, TracesError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("otlp-export")
            .enable_all()
            .build()
            .map_err(TracesError::Runtime)?;
        let client = Client::builder(TokioExecutor::new()).build_http();
        Ok(Self { runtime, client })
    }
}

impl HttpClient for Sender {
    fn send_bytes<'s, 'f>(
        &'s self,
        request: Request<Bytes>,
    ) -> Pin<Box<dyn Future<Output = Result<Response<Bytes>, HttpError>> + Send + 'f>>
    where
        's: 'f,
        Self: 'f,
    {
        let client = self.client.clone();
        let sent = self.runtime.spawn(async move {
            let (parts, body) = request.into_parts();
            let request = Request::from_parts(parts, Full::new(body));
            let answer = tokio::time::timeout(EXPORT_TIMEOUT, client.request(request))
                .await
                .map_err(|_| format!("no answer within {EXPORT_TIMEOUT:?}"))??;
            let (parts, body) = answer.into_parts();
            let body = Limited::new(body, ANSWER_LIMIT).collect().await?.to_bytes();
            Ok::<_, HttpError>(Response::from_parts(parts, body))
        });
        Box::pin(async move { sent.await? })
    }
}
