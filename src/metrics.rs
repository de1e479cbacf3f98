//! Prometheus metrics, one registry per application (tests run many at once).

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

use crate::history::template::Caches;
use crate::store::PoolStatus;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    pub method: String,
    /// The route template (`/v1/sessions/{session_id}/history`), never the raw path.
    pub route: String,
    pub status: u16,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StoreLabels {
    /// The store operation: `start_turn`, `finalize_turn`, `history`, …
    pub op: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StoreErrorLabels {
    pub op: &'static str,
    /// `unavailable` (no answer in time, connection refused) or `corrupt`.
    pub kind: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClosedLabels {
    /// `header_timeout`, `idle_timeout`, `evicted` or `refused` (the cap).
    pub reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TokenizerLabels {
    pub tokenizer: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelLabels {
    /// `default` (counted with the default encoding) or `refused`.
    pub outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// `written`, `conflict` (another writer came first), `locked` (another
    /// instance was at it), `failed`.
    pub outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    /// Why: `timeout`, `connection`, `http_status`, `garbage`, `store`, …
    pub kind: &'static str,
}

type HistogramFamily = Family<HttpLabels, Histogram, fn() -> Histogram>;
type StoreHistogramFamily = Family<StoreLabels, Histogram, fn() -> Histogram>;

pub struct Metrics {
    registry: Registry,
    requests: Family<HttpLabels, Counter>,
    latency: HistogramFamily,
    turns_started: Counter,
    turns_replayed: Counter,
    turns_finalized: Counter,
    turns_aborted: Counter,
    /// Pending turns removed because their TTL passed (counted where swept).
    pub expired_pending: Counter,
    store_latency: StoreHistogramFamily,
    store_errors: Family<StoreErrorLabels, Counter>,
    pool_size: Gauge,
    pool_available: Gauge,
    pool_waiting: Gauge,
    load_shed: Counter,
    timeouts: Counter,
    unknown_models: Family<ModelLabels, Counter>,
    connections_open: Gauge,
    connections_closed: Family<ClosedLabels, Counter>,
    summarizer_runs: Family<OutcomeLabels, Counter>,
    summarizer_failures: Family<KindLabels, Counter>,
    summarizer_duration: Histogram,
    summarizer_turns: Counter,
    summarizer_tokens: Counter,
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
        let expired_pending = Counter::default();
        registry.register(
            "turns_expired_pending",
            "Pending turns removed because their TTL passed, as this instance swept them",
            expired_pending.clone(),
        );
        let store_latency: StoreHistogramFamily = Family::new_with_constructor(latency_histogram);
        registry.register(
            "store_duration_seconds",
            "Store round-trip latency by operation",
            store_latency.clone(),
        );
        let store_errors = Family::<StoreErrorLabels, Counter>::default();
        registry.register(
            "store_errors",
            "Store operations that failed, by operation and kind",
            store_errors.clone(),
        );
        let pool_size = Gauge::default();
        let pool_available = Gauge::default();
        let pool_waiting = Gauge::default();
        registry.register(
            "store_pool_connections",
            "Redis connections open",
            pool_size.clone(),
        );
        registry.register(
            "store_pool_idle",
            "Redis connections open and idle",
            pool_available.clone(),
        );
        registry.register(
            "store_pool_waiters",
            "Requests waiting for a Redis connection",
            pool_waiting.clone(),
        );
        let load_shed = Counter::default();
        registry.register(
            "requests_shed",
            "API requests refused with 503 overloaded",
            load_shed.clone(),
        );
        let timeouts = Counter::default();
        registry.register(
            "requests_timed_out",
            "Requests answered 503 request_timeout",
            timeouts.clone(),
        );
        let unknown_models = Family::<ModelLabels, Counter>::default();
        registry.register(
            "unknown_models",
            "Reads whose model is in no model table: counted with the default encoding, or refused",
            unknown_models.clone(),
        );
        let connections_open = Gauge::default();
        registry.register(
            "connections_open",
            "Client connections open",
            connections_open.clone(),
        );
        let connections_closed = Family::<ClosedLabels, Counter>::default();
        registry.register(
            "connections_closed",
            "Client connections the server closed: header_timeout, idle_timeout, write_timeout (a client that took no byte of a response), evicted or refused (the connection cap)",
            connections_closed.clone(),
        );
        let summarizer_runs = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "summarizer_runs",
            "Server-side summarizations begun after a finalize or an import, by outcome",
            summarizer_runs.clone(),
        );
        let summarizer_failures = Family::<KindLabels, Counter>::default();
        registry.register(
            "summarizer_failures",
            "Summarizations that failed, by why",
            summarizer_failures.clone(),
        );
        let summarizer_duration = Histogram::new(exponential_buckets(0.01, 2.0, 16));
        registry.register(
            "summarizer_duration_seconds",
            "How long a summarization took, its model call included",
            summarizer_duration.clone(),
        );
        let summarizer_turns = Counter::default();
        registry.register(
            "summarizer_turns_folded",
            "Turns folded into summaries",
            summarizer_turns.clone(),
        );
        let summarizer_tokens = Counter::default();
        registry.register(
            "summarizer_tokens_folded",
            "Tokens of the turns folded into summaries (their text blocks, in the server's encoding)",
            summarizer_tokens.clone(),
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
            expired_pending,
            store_latency,
            store_errors,
            pool_size,
            pool_available,
            pool_waiting,
            load_shed,
            timeouts,
            unknown_models,
            connections_open,
            connections_closed,
            summarizer_runs,
            summarizer_failures,
            summarizer_duration,
            summarizer_turns,
            summarizer_tokens,
        }
    }

    /// A summarization ended so, after `seconds` (failures: why).
    pub fn summarized(&self, outcome: &'static str, failure: Option<&'static str>, seconds: f64) {
        self.summarizer_runs
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
        if let Some(kind) = failure {
            self.summarizer_failures
                .get_or_create(&KindLabels { kind })
                .inc();
        }
        self.summarizer_duration.observe(seconds);
    }

    pub fn folded(&self, turns: u64, tokens: u64) {
        self.summarizer_turns.inc_by(turns);
        self.summarizer_tokens.inc_by(tokens);
    }

    pub fn connection_opened(&self) {
        self.connections_open.inc();
    }

    pub fn connection_gone(&self) {
        self.connections_open.dec();
    }

    pub fn connection_closed(&self, reason: &'static str) {
        self.connections_closed
            .get_or_create(&ClosedLabels { reason })
            .inc();
    }

    pub fn observe_store(&self, op: &'static str, seconds: f64, error: Option<&'static str>) {
        self.store_latency
            .get_or_create(&StoreLabels { op })
            .observe(seconds);
        if let Some(kind) = error {
            self.store_errors
                .get_or_create(&StoreErrorLabels { op, kind })
                .inc();
        }
    }

    /// What each loaded tokenizer took of the process's memory at start.
    pub fn report_tokenizers(&mut self, tokenizers: &crate::tokens::Tokenizers) {
        if tokenizers.is_empty() {
            return;
        }
        let memory = Family::<TokenizerLabels, Gauge>::default();
        for t in tokenizers.all() {
            memory
                .get_or_create(&TokenizerLabels {
                    tokenizer: t.name().to_owned(),
                })
                .set(i64::try_from(t.memory()).unwrap_or(i64::MAX));
        }
        self.registry.register(
            "tokenizer_memory_bytes",
            "Resident memory each loaded tokenizer (TURNSTORE_TOKENIZERS_DIR) took at start",
            memory,
        );
        self.registry
            .register_collector(Box::new(TokenizerPartsCollector(
                tokenizers.all().cloned().collect(),
            )));
    }

    /// Reports `caches` at each scrape: the cache of rendered turns' hits,
    /// misses and bytes, to size `TURNSTORE_TEMPLATE_CACHE_MB` by.
    pub fn watch_template_caches(&mut self, caches: Caches) {
        self.registry
            .register_collector(Box::new(TemplateCacheCollector(caches)));
    }

    pub fn set_pool(&self, status: PoolStatus) {
        self.pool_size.set(status.size as i64);
        self.pool_available.set(status.available as i64);
        self.pool_waiting.set(status.waiting as i64);
    }

    pub fn request_shed(&self) {
        self.load_shed.inc();
    }

    pub fn request_timed_out(&self) {
        self.timeouts.inc();
    }

    /// A read named a model in no model table (`refused`: 422 `unknown_model`).
    pub fn unknown_model(&self, refused: bool) {
        let outcome = if refused { "refused" } else { "default" };
        self.unknown_models
            .get_or_create(&ModelLabels { outcome })
            .inc();
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

/// Each loaded tokenizer's counts of the parts of renderings: how many it
/// keeps, and how many it counted (more than it keeps when some were let
/// go for room, and counted again).
#[derive(Debug)]
struct TokenizerPartsCollector(Vec<std::sync::Arc<crate::tokens::LoadedTokenizer>>);

impl Collector for TokenizerPartsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let labels = |t: &crate::tokens::LoadedTokenizer| TokenizerLabels {
            tokenizer: t.name().to_owned(),
        };
        {
            let mut family = encoder.encode_descriptor(
                "tokenizer_parts",
                "Counts of parts of renderings a loaded tokenizer keeps (at most 262,144)",
                None,
                prometheus_client::metrics::MetricType::Gauge,
            )?;
            for t in &self.0 {
                let kept = ConstGauge::new(i64::try_from(t.parts_kept()).unwrap_or(i64::MAX));
                kept.encode(family.encode_family(&labels(t))?)?;
            }
        }
        let mut family = encoder.encode_descriptor(
            "tokenizer_parts_counted",
            "Parts of renderings a loaded tokenizer counted (a part it kept is not counted again)",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for t in &self.0 {
            ConstCounter::new(t.parts_counted()).encode(family.encode_family(&labels(t))?)?;
        }
        Ok(())
    }
}

#[derive(Debug)]
struct TemplateCacheCollector(Caches);

impl Collector for TemplateCacheCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let turns = &self.0.turns;
        for (name, help, value) in [
            (
                "template_cache_hits",
                "Turns a templated read found rendered",
                turns.hits(),
            ),
            (
                "template_cache_misses",
                "Turns a templated read did not find rendered, and rendered",
                turns.misses(),
            ),
        ] {
            let counter = ConstCounter::new(value);
            counter.encode(encoder.encode_descriptor(
                name,
                help,
                None,
                counter.metric_type(),
            )?)?;
        }
        let bytes = ConstGauge::new(turns.bytes() as i64);
        bytes.encode(encoder.encode_descriptor(
            "template_cache_bytes",
            "Bytes of rendered turns kept (at most TURNSTORE_TEMPLATE_CACHE_MB)",
            None,
            bytes.metric_type(),
        )?)
    }
}
