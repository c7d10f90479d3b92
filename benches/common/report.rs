//! The benches' report: Markdown tables of latency percentiles, durations
//! in ms and s, rates.

use std::time::Duration;

/// The `q` quantile (0.5, 0.99) of sorted durations, in ms; NaN when empty.
pub fn percentile(sorted: &[Duration], q: f64) -> f64 {
    let at = ((q * sorted.len() as f64).ceil() as usize).saturating_sub(1);
    sorted.get(at).map_or(f64::NAN, |d| ms(*d))
}

/// One table row of latency percentiles in ms.
pub fn row(what: &str, v: &mut [Duration], goal: &str) {
    v.sort();
    let p = |q: f64| percentile(v, q);
    println!(
        "| {what} | {} | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} ms | {goal} |",
        v.len(),
        p(0.50),
        p(0.90),
        p(0.99),
        v.last().map_or(f64::NAN, |d| ms(*d))
    );
}

/// A duration in milliseconds.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// A duration in seconds.
pub fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// `n` per second over `d`.
pub fn rate(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}
