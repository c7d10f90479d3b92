//! How often to try again: one exponential [`Backoff`] with [`Jitter`]. A
//! leaf: the layers that retry (supervision, API discovery, the
//! controller's queue, `setup-dns --watch`) or spread periodic work (probes)
//! use it instead of each writing its own.

mod backoff;

pub use backoff::{Backoff, Jitter};
