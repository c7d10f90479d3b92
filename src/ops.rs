//! Operating the server: the HTTP endpoints every command serves
//! (`/health`, `/ready`, `/metrics`; `serve`'s `/debug/`), and the
//! metrics themselves, and the export of spans to an OpenTelemetry
//! collector (`traces`, `--otlp-endpoint`). Reads the store and the
//! sources' health; never touches the answer path.

pub mod debug;
pub mod explain;
pub mod http;
pub mod memory;
pub mod metrics;
pub mod traces;
