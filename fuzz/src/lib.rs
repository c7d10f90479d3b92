//! Shared by the fuzz targets and the seed generator (`examples/seeds.rs`):
//! the structure-aware query model ([`query`]), the byte encoding that makes
//! a chosen model value a seed ([`seed`]), and the embedded zone answered
//! over both transports ([`server`]).

pub mod query;
pub mod seed;
pub mod server;
