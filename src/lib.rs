//! clusterset-dns: an authoritative DNS server for Kubernetes Multi-Cluster
//! Services (`clusterset.local`, KEP-1645).
//!
//! Data flows one way: [`source`] → [`store`] → [`answer`] → [`wire`].
//! [`cmd`] holds the commands that wire them together. See ARCHITECTURE.md for the map and the
//! invariants.

pub mod answer;
pub mod cli;
pub mod cluster_dns;
pub mod cmd;
pub mod config;
pub mod controller;
pub mod diagnose;
pub mod fault;
pub mod fleet;
pub mod health;
pub mod hub;
pub mod k8s;
pub mod model;
pub mod ops;
pub mod pace;
pub mod scrape;
pub mod source;
pub mod store;
pub mod supervise;
pub mod wire;
