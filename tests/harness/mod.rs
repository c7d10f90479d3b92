//! The fleet harness shared by the over-the-wire tests (`tests/it`) and the
//! benchmarks (`benches/*.rs`): real Kubernetes clusters
//! (`scripts/clusters.sh`), the `clusterset-dns` binary as `serve` or `sync`,
//! its HTTP endpoints, stock CoreDNS, and what `/proc` says about a process.
//!
//! Not a crate: each consumer includes this directory with
//! `#[path = "…/tests/harness/mod.rs"] mod harness;`, so the binary they
//! run is their own `CARGO_BIN_EXE_clusterset-dns` (a debug build for the
//! tests, the release build for `cargo bench`). It is a `mod.rs` (as the
//! Rust book's `tests/common/mod.rs`) so that its modules resolve beside it
//! from any includer.
//!
//! The tests stop at the first failure, so the harness panics with the
//! process's output instead of returning errors; a bench that hits one
//! fails the same way, and the `Drop`s stop what it started.

// Every consumer uses a part of the harness; tests/it and each bench are
// separate crates in which these items are `pub` for their sibling modules.
#![allow(dead_code, unreachable_pub)]

pub mod clusters;
pub mod coredns;
pub mod dataplane;
pub mod http;
pub mod process;
pub mod procfs;
pub mod served;
pub mod syncing;
pub mod tenure;

use std::path::Path;
use std::str::FromStr;
use std::time::{Duration, Instant};

/// The `clusterset-dns` binary cargo built for this test or bench target.
pub const BIN: &str = env!("CARGO_BIN_EXE_clusterset-dns");

/// Polls `f` every 20 ms until it is true (then true) or `timeout` has
/// passed (then false).
pub fn within(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// Polls until `f` is true (a bounded wait for asynchronous reloads); panics
/// after 20 s. Returns how long it took.
pub fn eventually(what: &str, mut f: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(20) {
        if f() {
            return start.elapsed();
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("{what}: not within 20 s");
}

/// Waits until the wall clock is in a later second than the RFC 3339
/// time `t` (an object's `creationTimestamp`, a condition's
/// `lastTransitionTime`: whole seconds), so that whatever is created or
/// stamped from now on is strictly later than `t` (the API servers and
/// the controller stamp from this machine's clock). At most a second.
pub fn past_second_of(t: &str) {
    use k8s_openapi::jiff::Timestamp;
    let t: Timestamp = t.parse().unwrap_or_else(|e| panic!("{t:?}: {e}"));
    eventually(&format!("the clock past {t}"), || Timestamp::now().as_second() > t.as_second());
}

/// One line of a `DIR/state` file the scripts write (`scripts/clusters.sh`,
/// `scripts/dataplane.sh`): `key=value` words.
pub struct StateLine<'a> {
    path: &'a Path,
    line: &'a str,
}

impl<'a> StateLine<'a> {
    /// The value of `key`; panics naming the file and line without one.
    pub fn get(&self, key: &str) -> &'a str {
        self.line
            .split_whitespace()
            .find_map(|word| word.strip_prefix(key)?.strip_prefix('='))
            .unwrap_or_else(|| panic!("{}: no {key} in {:?}", self.path.display(), self.line))
    }

    /// The value of `key` parsed; panics naming the file, line and error.
    pub fn parse<T: FromStr>(&self, key: &str) -> T
    where
        T::Err: std::fmt::Display,
    {
        self.get(key)
            .parse()
            .unwrap_or_else(|e| panic!("{}: {key} in {:?}: {e}", self.path.display(), self.line))
    }
}

/// Reads `dir/state`, one record per non-empty line.
pub fn read_state<T>(dir: &Path, record: impl Fn(&StateLine<'_>) -> T) -> Vec<T> {
    let path = dir.join("state");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| record(&StateLine { path: &path, line }))
        .collect()
}
