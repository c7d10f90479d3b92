//! How often to try again and how fast to go: one exponential [`Backoff`]
//! with [`Jitter`], and one [`TokenBucket`]. A leaf: the layers that retry
//! (supervision, API discovery, the controller's queue, `setup-dns
//! --watch`) or pace themselves (the API clients' rate limit, probes) use
//! these instead of each writing its own.

mod backoff;
mod bucket;

pub use backoff::{Backoff, Jitter};
pub use bucket::TokenBucket;
