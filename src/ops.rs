//! Operating the server: HTTP `/health`, `/ready` and `/metrics`, and the
//! metrics themselves. Reads the store and the sources' health; never
//! touches the answer path.

pub mod explain;
pub mod http;
pub mod memory;
pub mod metrics;
