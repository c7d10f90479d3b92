//! Over-the-wire tests: a real server on loopback, queried with real
//! clients. One test binary (see `autotests = false`), one module per area.

mod support;

mod binary;
mod contract;
mod readiness;
