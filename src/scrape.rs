//! Metric families computed at each scrape from state the process keeps
//! anyway (atomics, health records), each declared together with the
//! function that reads its samples: a family's name, help, type and label
//! names are written once, next to its values, so no list of names is
//! paired with a list of values by position. Also the text exposition of a
//! registry, which every command's `/metrics` serves.
//!
//! A leaf module: `ops` declares the answering side's families with it, the
//! controller its own beside the counters they read.

use std::sync::atomic::{AtomicU64, Ordering};

use prometheus::core::{Collector, Desc};
use prometheus::proto::{self, LabelPair, Metric, MetricFamily, MetricType};
use prometheus::{Encoder, Registry, TextEncoder};

/// The text exposition of `registry`; every value computed at scrape time
/// is read now.
pub fn render(registry: &Registry) -> String {
    let mut out = Vec::new();
    // Encoding into a Vec cannot fail for the text format.
    let _ = TextEncoder::new().encode(&registry.gather(), &mut out);
    String::from_utf8(out).unwrap_or_default()
}

/// One series of a counter or gauge family: its labels and its value.
#[derive(Debug, Clone)]
pub struct Sample {
    labels: Vec<LabelPair>,
    value: f64,
}

impl Sample {
    /// A series labelled `pairs` with `value`.
    pub fn new(pairs: &[(&str, &str)], value: f64) -> Self {
        Self { labels: labels(pairs), value }
    }

    /// A series labelled `pairs` counting `n`.
    pub fn count(pairs: &[(&str, &str)], n: u64) -> Self {
        Self::new(pairs, n as f64)
    }
}

/// One series of a histogram family.
#[derive(Debug, Clone)]
pub struct HistogramSample {
    labels: Vec<LabelPair>,
    histogram: proto::Histogram,
}

impl HistogramSample {
    /// A series labelled `pairs` from per-bucket counts (not cumulative):
    /// one count per bound in `bounds`, then the count above the last
    /// bound; `sum` is the sum of the observations.
    pub fn new(pairs: &[(&str, &str)], bounds: &[f64], counts: &[AtomicU64], sum: f64) -> Self {
        let mut cumulative = 0;
        let buckets = bounds
            .iter()
            .zip(counts)
            .map(|(bound, count)| {
                cumulative += count.load(Ordering::Relaxed);
                let mut b = proto::Bucket::default();
                b.set_upper_bound(*bound);
                b.set_cumulative_count(cumulative);
                b
            })
            .collect();
        let total = cumulative + counts.last().map_or(0, |c| c.load(Ordering::Relaxed));
        let mut histogram = proto::Histogram::default();
        histogram.set_bucket(buckets);
        histogram.set_sample_count(total);
        histogram.set_sample_sum(sum);
        Self { labels: labels(pairs), histogram }
    }
}

/// Label pairs sorted by name, as Go's client (and so CoreDNS) writes them.
fn labels(pairs: &[(&str, &str)]) -> Vec<LabelPair> {
    let mut pairs = pairs.to_vec();
    pairs.sort_unstable_by_key(|(name, _)| *name);
    pairs
        .iter()
        .map(|(n, v)| {
            let mut l = LabelPair::default();
            l.set_name((*n).to_owned());
            l.set_value((*v).to_owned());
            l
        })
        .collect()
}

type ReadSamples = Box<dyn Fn() -> Vec<Sample> + Send + Sync>;
type ReadHistograms = Box<dyn Fn() -> Vec<HistogramSample> + Send + Sync>;

/// How a family's samples are read: the type says which sample it gives,
/// so a counter cannot be handed a histogram.
enum Read {
    Counter(ReadSamples),
    Gauge(ReadSamples),
    Histogram(ReadHistograms),
}

/// One family: what it is, and how its samples are read.
struct Family {
    name: &'static str,
    help: &'static str,
    labels: &'static [&'static str],
    read: Read,
}

impl Family {
    /// The family as scraped now; `None` without a sample (no family is
    /// written without series, as before any value exists).
    fn collect(&self) -> Option<MetricFamily> {
        let (kind, metrics): (_, Vec<Metric>) = match &self.read {
            Read::Counter(read) => (
                MetricType::COUNTER,
                self.numbers(read(), |m, value| {
                    let mut c = proto::Counter::default();
                    c.set_value(value);
                    m.set_counter(c);
                }),
            ),
            Read::Gauge(read) => (
                MetricType::GAUGE,
                self.numbers(read(), |m, value| {
                    let mut g = proto::Gauge::default();
                    g.set_value(value);
                    m.set_gauge(g);
                }),
            ),
            Read::Histogram(read) => (
                MetricType::HISTOGRAM,
                read()
                    .into_iter()
                    .map(|s| {
                        self.check(&s.labels);
                        let mut m = Metric::default();
                        m.set_label(s.labels);
                        m.set_histogram(s.histogram);
                        m
                    })
                    .collect(),
            ),
        };
        if metrics.is_empty() {
            return None;
        }
        let mut f = MetricFamily::default();
        f.set_name(self.name.to_owned());
        f.set_help(self.help.to_owned());
        f.set_field_type(kind);
        f.set_metric(metrics);
        Some(f)
    }

    fn numbers(&self, samples: Vec<Sample>, set: fn(&mut Metric, f64)) -> Vec<Metric> {
        samples
            .into_iter()
            .map(|s| {
                self.check(&s.labels);
                let mut m = Metric::default();
                m.set_label(s.labels);
                set(&mut m, s.value);
                m
            })
            .collect()
    }

    /// A sample labelled otherwise than its family declares is a defect
    /// of this build: caught by every test that scrapes.
    fn check(&self, labels: &[LabelPair]) {
        debug_assert!(
            same_names(self.labels, labels),
            "{}: a sample labelled {:?}, the family declares {:?}",
            self.name,
            labels.iter().map(LabelPair::name).collect::<Vec<_>>(),
            self.labels
        );
    }
}

/// Whether `labels` (sorted by name) are exactly the names `declared`.
fn same_names(declared: &[&str], labels: &[LabelPair]) -> bool {
    let mut declared = declared.to_vec();
    declared.sort_unstable();
    declared.len() == labels.len() && declared.iter().zip(labels).all(|(d, l)| *d == l.name())
}

/// Families read at every scrape, each declared with its reader; one
/// collector once registered.
#[derive(Default)]
pub struct Families {
    families: Vec<Family>,
}

impl Families {
    /// No family yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// A counter family: `read` gives its series, labelled with `labels`.
    pub fn counter(
        &mut self,
        name: &'static str,
        help: &'static str,
        labels: &'static [&'static str],
        read: impl Fn() -> Vec<Sample> + Send + Sync + 'static,
    ) -> &mut Self {
        self.add(name, help, labels, Read::Counter(Box::new(read)))
    }

    /// A gauge family: `read` gives its series, labelled with `labels`.
    pub fn gauge(
        &mut self,
        name: &'static str,
        help: &'static str,
        labels: &'static [&'static str],
        read: impl Fn() -> Vec<Sample> + Send + Sync + 'static,
    ) -> &mut Self {
        self.add(name, help, labels, Read::Gauge(Box::new(read)))
    }

    /// A histogram family: `read` gives its series, labelled with `labels`.
    pub fn histogram(
        &mut self,
        name: &'static str,
        help: &'static str,
        labels: &'static [&'static str],
        read: impl Fn() -> Vec<HistogramSample> + Send + Sync + 'static,
    ) -> &mut Self {
        self.add(name, help, labels, Read::Histogram(Box::new(read)))
    }

    fn add(
        &mut self,
        name: &'static str,
        help: &'static str,
        labels: &'static [&'static str],
        read: Read,
    ) -> &mut Self {
        self.families.push(Family { name, help, labels, read });
        self
    }

    /// Registers the families into `registry`, as one collector. Fails
    /// when a name or a label is not one Prometheus takes, or a family of
    /// that name is registered already.
    pub fn register(self, registry: &Registry) -> Result<(), prometheus::Error> {
        let descs = self
            .families
            .iter()
            .map(|f| {
                let labels = f.labels.iter().map(|l| (*l).to_owned()).collect();
                Desc::new(f.name.to_owned(), f.help.to_owned(), labels, Default::default())
            })
            .collect::<Result<_, _>>()?;
        registry.register(Box::new(Collected { descs, families: self.families }))
    }
}

/// Every series of a text exposition as `name{labels}` → value, for tests
/// that check which value each name carries.
#[cfg(test)]
pub(crate) fn series(text: &str) -> std::collections::BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// Fails naming every series whose value is not the one wanted, and every
/// series missing or not wanted.
#[cfg(test)]
pub(crate) fn assert_series(
    got: &std::collections::BTreeMap<String, f64>,
    want: &std::collections::BTreeMap<String, f64>,
) {
    let mut wrong = Vec::new();
    for (series, value) in want {
        match got.get(series) {
            Some(v) if v == value => {}
            Some(v) => wrong.push(format!("{series} is {v}, want {value}")),
            None => wrong.push(format!("{series} is missing, want {value}")),
        }
    }
    for (series, value) in got.iter().filter(|(s, _)| !want.contains_key(*s)) {
        wrong.push(format!("{series} is {value}, not wanted"));
    }
    assert!(wrong.is_empty(), "scraped:\n{}", wrong.join("\n"));
}

/// [`Families`] as registered.
struct Collected {
    descs: Vec<Desc>,
    families: Vec<Family>,
}

impl Collector for Collected {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        self.families.iter().filter_map(Family::collect).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scrape(families: Families) -> String {
        let registry = Registry::new();
        families.register(&registry).expect("valid families");
        render(&registry)
    }

    #[test]
    fn each_family_is_written_with_its_own_type_and_samples() {
        let mut f = Families::new();
        f.counter("t_requests_total", "Requests.", &["code", "path"], || {
            vec![Sample::count(&[("path", "/x"), ("code", "200")], 3)]
        })
        .gauge("t_up", "Up.", &[], || vec![Sample::new(&[], 0.5)])
        .histogram("t_seconds", "Time.", &["path"], || {
            let counts = [AtomicU64::new(1), AtomicU64::new(2), AtomicU64::new(4)];
            vec![HistogramSample::new(&[("path", "/x")], &[0.1, 1.0], &counts, 9.5)]
        })
        .gauge("t_none", "Nothing yet.", &["x"], Vec::new);
        let text = scrape(f);
        for line in [
            "# TYPE t_requests_total counter",
            "t_requests_total{code=\"200\",path=\"/x\"} 3",
            "# TYPE t_up gauge",
            "t_up 0.5",
            "# TYPE t_seconds histogram",
            "t_seconds_bucket{path=\"/x\",le=\"0.1\"} 1",
            "t_seconds_bucket{path=\"/x\",le=\"1\"} 3",
            "t_seconds_bucket{path=\"/x\",le=\"+Inf\"} 7",
            "t_seconds_sum{path=\"/x\"} 9.5",
            "t_seconds_count{path=\"/x\"} 7",
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} not in\n{text}");
        }
        assert!(!text.contains("t_none"), "a family without samples is left out:\n{text}");
    }

    #[test]
    fn a_name_prometheus_does_not_take_fails_the_registration() {
        let mut f = Families::new();
        f.gauge("not a name", "Bad.", &[], Vec::new);
        assert!(f.register(&Registry::new()).is_err());
    }

    #[test]
    fn label_names_are_compared_as_sets() {
        let l = labels(&[("b", "1"), ("a", "2")]);
        assert!(same_names(&["b", "a"], &l));
        assert!(!same_names(&["a"], &l));
        assert!(!same_names(&["a", "c"], &l));
        assert!(!same_names(&["a", "b", "c"], &l));
        assert!(same_names(&[], &[]));
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "t_wrong: a sample labelled [\"member\"], the family declares [\"shard\"]")]
    fn a_sample_labelled_otherwise_than_its_family_is_caught() {
        let mut f = Families::new();
        f.gauge("t_wrong", "Wrong labels.", &["shard"], || vec![Sample::new(&[("member", "a")], 1.0)]);
        scrape(f);
    }
}
