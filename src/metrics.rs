//! Prometheus metrics, one registry per application (tests run many at once).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    pub method: String,
    /// The route template (`/v1/sessions/{session_id}/history`), never the raw path.
    pub route: String,
    pub status: u16,
}

type HistogramFamily = Family<HttpLabels, Histogram, fn() -> Histogram>;

pub struct Metrics {
    registry: Registry,
    requests: Family<HttpLabels, Counter>,
    latency: HistogramFamily,
    turns_started: Counter,
    turns_replayed: Counter,
    turns_finalized: Counter,
    turns_aborted: Counter,
}

fn latency_histogram() -> Histogram {
    // 100 µs .. ~3.3 s
    Histogram::new(exponential_buckets(0.0001, 2.0, 16))
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("turnstore");
        let requests = Family::<HttpLabels, Counter>::default();
        let latency: HistogramFamily = Family::new_with_constructor(latency_histogram);
        let turns_started = Counter::default();
        let turns_replayed = Counter::default();
        let turns_finalized = Counter::default();
        let turns_aborted = Counter::default();
        registry.register(
            "http_requests",
            "HTTP requests by route, method and status",
            requests.clone(),
        );
        registry.register(
            "http_request_duration_seconds",
            "HTTP request latency by route, method and status",
            latency.clone(),
        );
        registry.register("turns_started", "Turns started", turns_started.clone());
        registry.register(
            "turns_replayed",
            "Starts answered by an idempotent replay",
            turns_replayed.clone(),
        );
        registry.register(
            "turns_finalized",
            "Turns finalized",
            turns_finalized.clone(),
        );
        registry.register(
            "turns_aborted",
            "Turns aborted or deleted",
            turns_aborted.clone(),
        );
        registry.register(
            "build",
            "Build information",
            Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
        );
        Metrics {
            registry,
            requests,
            latency,
            turns_started,
            turns_replayed,
            turns_finalized,
            turns_aborted,
        }
    }

    pub fn observe_request(&self, labels: HttpLabels, seconds: f64) {
        self.latency.get_or_create(&labels).observe(seconds);
        self.requests.get_or_create(&labels).inc();
    }

    pub fn turn_started(&self, replayed: bool) {
        if replayed {
            self.turns_replayed.inc();
        } else {
            self.turns_started.inc();
        }
    }

    pub fn turn_finalized(&self) {
        self.turns_finalized.inc();
    }

    pub fn turn_aborted(&self) {
        self.turns_aborted.inc();
    }

    /// OpenMetrics text.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
