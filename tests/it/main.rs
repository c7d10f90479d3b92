//! Over-the-wire tests: a real server on loopback, queried with real
//! clients. One test binary (see `autotests = false`), one module per area.

#![allow(unreachable_pub)] // items are shared between the modules of this test binary

// The fleet harness (clusters, the binary as serve and sync), shared with benches/.
#[path = "../harness/mod.rs"]
mod harness;
mod support;

mod abuse;
mod binary;
mod chart;
mod client;
mod conformance;
mod contract;
mod coredns;
mod dataplane;
mod deploy;
mod dig_debug;
mod doctor;
mod fleet;
mod harness_smoke;
mod hostile;
mod hub;
mod hub_faults;
mod image;
mod incumbent;
mod interop;
mod list_mode;
mod memory_budget;
mod metrics;
mod monitoring;
mod policy;
mod programming;
mod protobuf;
mod readiness;
mod reverse;
mod same_name;
mod setup_dns;
mod setup_dns_watch;
mod supervise;
mod sync;
mod sync_clock;
mod sync_faults;
mod sync_kep;
mod sync_profiles;
mod sync_shards;
mod sync_tenure;
mod sync_throttle;
mod traces;
mod transfer;
mod watch;
mod workload;
