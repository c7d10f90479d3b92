//! clusterset-dns: an authoritative DNS server for Kubernetes Multi-Cluster
//! Services (`clusterset.local`, KEP-1645).
//!
//! Data flows one way: [`source`] → [`store`] → [`answer`] → [`wire`].
//! [`serve`] wires them together. See ARCHITECTURE.md for the map and the
//! invariants.

pub mod answer;
pub mod check;
pub mod cli;
pub mod config;
pub mod controller;
pub mod explain;
pub mod fault;
pub mod fleet;
pub mod health;
pub mod k8s;
pub mod model;
pub mod ops;
pub mod serve;
pub mod source;
pub mod store;
pub mod supervise;
pub mod sync;
pub mod wire;
