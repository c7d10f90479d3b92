//! Metrics, registered in a [`Registry`] owned by [`Metrics`] (no globals).
//! Names follow Prometheus conventions under the `clusterset_dns_` prefix;
//! the DNS request metrics with CoreDNS's names come with the query path's
//! counters.

use std::sync::Arc;
use std::time::Duration;

use prometheus::{
    Encoder, GaugeVec, Histogram, HistogramOpts, IntCounterVec, IntGauge, Opts, Registry, TextEncoder,
};

use crate::source::kube::WatchHealth;
use crate::store::Snapshot;

/// The server's metrics.
pub struct Metrics {
    registry: Registry,
    services: IntGauge,
    serial: IntGauge,
    ready: IntGauge,
    publish_seconds: Histogram,
    watch_stale_seconds: GaugeVec,
    watch_errors: IntCounterVec,
    watches: Vec<Arc<WatchHealth>>,
}

impl Metrics {
    /// Registers every metric; `watches` are read at each scrape.
    pub fn new(watches: Vec<Arc<WatchHealth>>) -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let services = IntGauge::new("clusterset_dns_services", "Services with names in the zone.")?;
        let serial =
            IntGauge::new("clusterset_dns_snapshot_serial", "SOA serial of the snapshot being served.")?;
        let ready = IntGauge::new(
            "clusterset_dns_ready",
            "1 once every source has delivered its first complete state, else 0.",
        )?;
        let publish_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "clusterset_dns_snapshot_publish_seconds",
                "Time to apply a batch of source updates and publish the next snapshot.",
            )
            .buckets(prometheus::exponential_buckets(0.0001, 2.0, 16)?),
        )?;
        let watch_stale_seconds = GaugeVec::new(
            Opts::new(
                "clusterset_dns_watch_stale_seconds",
                "Seconds since a Kubernetes watch started failing (0 while healthy): the served data is at least this old.",
            ),
            &["watch"],
        )?;
        let watch_errors = IntCounterVec::new(
            Opts::new("clusterset_dns_watch_errors_total", "Errors seen by a Kubernetes watch."),
            &["watch"],
        )?;
        registry.register(Box::new(services.clone()))?;
        registry.register(Box::new(serial.clone()))?;
        registry.register(Box::new(ready.clone()))?;
        registry.register(Box::new(publish_seconds.clone()))?;
        registry.register(Box::new(watch_stale_seconds.clone()))?;
        registry.register(Box::new(watch_errors.clone()))?;
        Ok(Self {
            registry,
            services,
            serial,
            ready,
            publish_seconds,
            watch_stale_seconds,
            watch_errors,
            watches,
        })
    }

    /// Records a published snapshot and how long the batch took.
    pub fn published(&self, snap: &Snapshot, took: Duration) {
        self.services.set(snap.service_count() as i64);
        self.serial.set(i64::from(snap.serial()));
        self.ready.set(i64::from(snap.is_ready()));
        self.publish_seconds.observe(took.as_secs_f64());
    }

    /// The text exposition, with the watches' health read now.
    pub fn render(&self) -> String {
        for w in &self.watches {
            self.watch_stale_seconds.with_label_values(&[&w.name]).set(w.stale_seconds());
            let counter = self.watch_errors.with_label_values(&[&w.name]);
            counter.inc_by(w.errors().saturating_sub(counter.get()));
        }
        let mut out = Vec::new();
        // Encoding into a Vec cannot fail for the text format.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}
