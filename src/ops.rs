//! Operating the server: the HTTP endpoints every command serves
//! (`/health`, `/ready`, `/metrics`; `serve`'s `/debug/`), and the
//! metrics themselves. Reads the store and the sources' health; never
//! touches the answer path.

pub mod debug;
pub mod explain;
pub mod http;
pub mod memory;
pub mod metrics;
