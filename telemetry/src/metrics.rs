//! Prometheus metrics for every binary, through `prometheus-client`.
//!
//! A binary registers the metrics it updates as events happen (counters, gauges,
//! histograms, and their labelled families) in its own [`Registry`] once, with
//! [`register_counter`] and friends; values it only knows when scraped (sizes read
//! from a store, the breakers' states) go into a [`ScrapeValues`] built per scrape.
//! [`render`] writes both in the OpenMetrics text format ([`CONTENT_TYPE`]).
//!
//! Names are the series names dashboards query, `_total` included: the library writes
//! a counter's samples as `<family>_total` and its `# TYPE` line under the family name,
//! so the helpers take the full series name and register the family without the
//! suffix. A counter named without `_total` (none of ours) would gain one.

use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::TypedMetric;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::{Metric, Registry};

pub use prometheus_client;

/// `Content-Type` of [`render`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Labels of a sample read at scrape time: `(name, value)` pairs in order.
pub type Labels = Vec<(&'static str, String)>;

/// The family name a counter series is registered under (`x_total` -> `x`).
fn counter_family(series: &str) -> &str {
    series.strip_suffix("_total").unwrap_or(series)
}

/// Registers a counter (or a family of them) whose samples are named `series`.
pub fn register_counter(
    registry: &mut Registry,
    series: &str,
    help: &str,
    metric: impl Metric + TypedMetric,
) {
    declare(counter_family(series), help, metric.metric_type().as_str());
    registry.register(counter_family(series), registry_help(help), metric);
}

/// The registry ends every help text with a full stop: one given is not doubled.
fn registry_help(help: &str) -> &str {
    help.strip_suffix('.').unwrap_or(help)
}

/// Registers a gauge or histogram (or a family of them) named `name`.
pub fn register(registry: &mut Registry, name: &str, help: &str, metric: impl Metric) {
    declare(name, help, metric.metric_type().as_str());
    registry.register(name, registry_help(help), metric);
}

/// A family a registry was given: what its `# HELP` and `# TYPE` lines say once it has
/// a sample (an empty family is not written at all).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Declared {
    /// The family's name (a counter's without `_total`).
    pub name: String,
    /// Its help text.
    pub help: String,
    /// `counter`, `gauge`, `histogram`, ...
    pub kind: String,
}

thread_local! {
    /// Set while [`declarations_of`] runs on this thread.
    static DECLARED: std::cell::RefCell<Option<Vec<Declared>>> = const { std::cell::RefCell::new(None) };
}

fn declare(name: &str, help: &str, kind: &str) {
    DECLARED.with(|d| {
        if let Some(list) = d.borrow_mut().as_mut() {
            list.push(Declared {
                name: name.to_owned(),
                help: format!("{}.", registry_help(help)),
                kind: kind.to_owned(),
            });
        }
    });
}

/// Runs `f` and returns it with every family it registered on this thread, in order:
/// the complete list of what a binary's registry can export, samples or not (the
/// reference pages are written from it).
pub fn declarations_of<T>(f: impl FnOnce() -> T) -> (T, Vec<Declared>) {
    DECLARED.with(|d| *d.borrow_mut() = Some(Vec::new()));
    let value = f();
    let list = DECLARED.with(|d| d.borrow_mut().take()).unwrap_or_default();
    (value, list)
}

/// A value read at scrape time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    /// A count or size.
    Int(i64),
    /// A ratio or an average.
    Float(f64),
}

impl From<usize> for Value {
    fn from(v: usize) -> Self {
        Self::Int(i64::try_from(v).unwrap_or(i64::MAX))
    }
}

impl From<u64> for Value {
    fn from(v: u64) -> Self {
        Self::Int(i64::try_from(v).unwrap_or(i64::MAX))
    }
}

impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Self::Int(v)
    }
}

impl From<f64> for Value {
    fn from(v: f64) -> Self {
        Self::Float(v)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Gauge,
    Counter,
}

#[derive(Debug)]
struct ConstFamily {
    name: String,
    help: String,
    kind: Kind,
    /// `None`: one unlabelled sample.
    samples: Vec<(Option<Labels>, Value)>,
}

/// Metrics whose values are read when scraped, written after the registry's.
#[derive(Debug, Default)]
pub struct ScrapeValues {
    families: Vec<ConstFamily>,
}

impl ScrapeValues {
    /// An unlabelled gauge.
    pub fn gauge(&mut self, name: &str, help: &str, value: impl Into<Value>) {
        self.push(name, help, Kind::Gauge, vec![(None, value.into())]);
    }

    /// A gauge per label set (written with its `# TYPE` line even when empty).
    pub fn gauge_family<V: Into<Value>>(
        &mut self,
        name: &str,
        help: &str,
        samples: impl IntoIterator<Item = (Labels, V)>,
    ) {
        let samples = samples
            .into_iter()
            .map(|(l, v)| (Some(l), v.into()))
            .collect();
        self.push(name, help, Kind::Gauge, samples);
    }

    /// An unlabelled counter whose samples are named `series` (`..._total`).
    pub fn counter(&mut self, series: &str, help: &str, value: u64) {
        self.push(
            counter_family(series),
            help,
            Kind::Counter,
            vec![(None, value.into())],
        );
    }

    /// A counter per label set, samples named `series`.
    pub fn counter_family(
        &mut self,
        series: &str,
        help: &str,
        samples: impl IntoIterator<Item = (Labels, u64)>,
    ) {
        let samples = samples
            .into_iter()
            .map(|(l, v)| (Some(l), v.into()))
            .collect();
        self.push(counter_family(series), help, Kind::Counter, samples);
    }

    fn push(&mut self, name: &str, help: &str, kind: Kind, samples: Vec<(Option<Labels>, Value)>) {
        self.families.push(ConstFamily {
            name: name.to_owned(),
            help: help.to_owned(),
            kind,
            samples,
        });
    }
}

fn encode_value(
    encoder: prometheus_client::encoding::MetricEncoder<'_>,
    kind: Kind,
    value: Value,
) -> std::fmt::Result {
    match (kind, value) {
        (Kind::Gauge, Value::Int(v)) => ConstGauge::new(v).encode(encoder),
        (Kind::Gauge, Value::Float(v)) => ConstGauge::new(v).encode(encoder),
        (Kind::Counter, Value::Int(v)) => {
            ConstCounter::new(u64::try_from(v).unwrap_or(0)).encode(encoder)
        }
        (Kind::Counter, Value::Float(v)) => ConstCounter::new(v).encode(encoder),
    }
}

impl prometheus_client::collector::Collector for ScrapeValues {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> std::fmt::Result {
        for family in &self.families {
            let metric_type = match family.kind {
                Kind::Gauge => ConstGauge::<i64>::TYPE,
                Kind::Counter => ConstCounter::<u64>::TYPE,
            };
            let mut metric =
                encoder.encode_descriptor(&family.name, &family.help, None, metric_type)?;
            match family.samples.as_slice() {
                [(None, value)] => encode_value(metric, family.kind, *value)?,
                samples => {
                    for (labels, value) in samples {
                        if let Some(labels) = labels {
                            encode_value(metric.encode_family(labels)?, family.kind, *value)?;
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// The exposition: `registry`'s metrics, then `scraped`, then `# EOF`.
pub fn render(registry: &Registry, scraped: ScrapeValues) -> String {
    let mut out = String::new();
    let mut extra = Registry::default();
    extra.register_collector(Box::new(scraped));
    // Writing into a String cannot fail.
    let _ = encode_registry(&mut out, registry);
    let _ = encode_registry(&mut out, &extra);
    let _ = encode_eof(&mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::family::Family;
    use prometheus_client::metrics::histogram::Histogram;

    #[test]
    fn counters_keep_their_series_names_and_scrape_values_follow() {
        let mut registry = Registry::default();
        let picks: Family<Labels, Counter> = Family::default();
        register_counter(
            &mut registry,
            "fixture_picks_total",
            "Picks.",
            picks.clone(),
        );
        picks
            .get_or_create(&vec![("role", "mixed".to_owned())])
            .inc_by(2);
        let mut scraped = ScrapeValues::default();
        scraped.gauge("fixture_size_bytes", "Size.", 7usize);
        scraped.gauge("fixture_ratio", "Ratio.", 0.5);
        scraped.counter("fixture_gets_total", "Gets.", 3);
        scraped.gauge_family(
            "fixture_view",
            "View.",
            [(vec![("worker_id", "a:1".to_owned())], 4usize)],
        );
        scraped.gauge_family("fixture_empty", "Empty.", Vec::<(Labels, i64)>::new());
        let text = render(&registry, scraped);
        assert_eq!(
            text,
            "# HELP fixture_picks Picks.\n\
             # TYPE fixture_picks counter\n\
             fixture_picks_total{role=\"mixed\"} 2\n\
             # HELP fixture_size_bytes Size.\n\
             # TYPE fixture_size_bytes gauge\n\
             fixture_size_bytes 7\n\
             # HELP fixture_ratio Ratio.\n\
             # TYPE fixture_ratio gauge\n\
             fixture_ratio 0.5\n\
             # HELP fixture_gets Gets.\n\
             # TYPE fixture_gets counter\n\
             fixture_gets_total 3\n\
             # HELP fixture_view View.\n\
             # TYPE fixture_view gauge\n\
             fixture_view{worker_id=\"a:1\"} 4\n\
             # HELP fixture_empty Empty.\n\
             # TYPE fixture_empty gauge\n\
             # EOF\n"
        );
    }

    #[test]
    fn histograms_write_bounds_as_the_python_client_did() {
        fn histogram() -> Histogram {
            Histogram::new([0.005, 1.0, 2048.0])
        }
        let mut registry = Registry::default();
        let h: Family<Labels, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(histogram);
        register(&mut registry, "fixture_seconds", "Seconds.", h.clone());
        h.get_or_create(&vec![("role", "mixed".to_owned())])
            .observe(0.5);
        let text = render(&registry, ScrapeValues::default());
        for line in [
            "fixture_seconds_bucket{le=\"0.005\",role=\"mixed\"} 0",
            "fixture_seconds_bucket{le=\"1.0\",role=\"mixed\"} 1",
            "fixture_seconds_bucket{le=\"2048.0\",role=\"mixed\"} 1",
            "fixture_seconds_bucket{le=\"+Inf\",role=\"mixed\"} 1",
            "fixture_seconds_count{role=\"mixed\"} 1",
            "fixture_seconds_sum{role=\"mixed\"} 0.5",
        ] {
            assert!(text.lines().any(|l| l == line), "{line}\n{text}");
        }
    }
}
