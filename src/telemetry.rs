//! Traces over OTLP/HTTP: `TURNSTORE_OTLP_ENDPOINT`, or the standard
//! `OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT`, and the other `OTEL_*` variables
//! the OpenTelemetry SDK reads (service name, resource attributes, sampler,
//! batching, exporter headers and timeout).
//!
//! Off unless an endpoint is set, and then free: the log's subscriber is the
//! one it always was, the router's request span too, and none of the spans
//! below is made (a relaxed load of [`on`] decides). On, a layer turns the
//! spans of target [`TARGET`], and only those, into OpenTelemetry spans: a
//! server span per request, whose parent is the request's W3C
//! `traceparent`; a client span per Redis script call and per summarizer
//! model call inside it. No span carries a question, an answer, a key, a
//! session or user id or a URL: routes, status codes, script names and
//! model names only.

use std::future::Future;
use std::pin::Pin;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use http::HeaderMap;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, SpanExporter, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::{Instrument, Level, Span};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::registry::LookupSpan;

/// The target of every span exported; nothing else is.
pub const TARGET: &str = "turnstore::otel";

static ON: AtomicBool = AtomicBool::new(false);
static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

/// Whether traces are exported (set once, at start).
#[inline]
pub fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Where traces go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// `TURNSTORE_OTLP_ENDPOINT`'s, with `/v1/traces`.
    Given(String),
    /// The exporter reads `OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT` itself.
    FromEnvironment,
}

/// Where traces go, if anywhere: `configured` (`TURNSTORE_OTLP_ENDPOINT`)
/// first, then the standard variables; `OTEL_SDK_DISABLED=true` or
/// `OTEL_TRACES_EXPORTER=none` turn them off whatever is set.
pub fn endpoint(configured: Option<&str>) -> Option<Endpoint> {
    let var = |name: &str| {
        std::env::var(name)
            .ok()
            .map(|v| v.trim().to_ascii_lowercase())
            .filter(|v| !v.is_empty())
    };
    if var("OTEL_SDK_DISABLED").as_deref() == Some("true")
        || var("OTEL_TRACES_EXPORTER").as_deref() == Some("none")
    {
        return None;
    }
    if let Some(base) = configured {
        return Some(Endpoint::Given(traces_url(base)));
    }
    (var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_some()
        || var("OTEL_EXPORTER_OTLP_ENDPOINT").is_some())
    .then_some(Endpoint::FromEnvironment)
}

/// A collector's base URL with the traces path OTLP/HTTP gives it.
fn traces_url(base: &str) -> String {
    let base = base.trim_end_matches('/');
    if base.ends_with("/v1/traces") {
        base.to_owned()
    } else {
        format!("{base}/v1/traces")
    }
}

impl Endpoint {
    /// Where spans go, for the log: scheme, host and port, never a path,
    /// query or user info (where a token could be).
    pub fn origin(&self) -> String {
        let url = match self {
            Endpoint::Given(url) => Some(url.clone()),
            Endpoint::FromEnvironment => std::env::var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                .or_else(|_| std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT"))
                .ok(),
        };
        let uri = url.and_then(|u| u.trim().parse::<http::Uri>().ok());
        match uri
            .as_ref()
            .and_then(|u| Some((u.scheme_str()?, u.host()?, u.port_u16())))
        {
            Some((scheme, host, Some(port))) => format!("{scheme}://{host}:{port}"),
            Some((scheme, host, None)) => format!("{scheme}://{host}"),
            None => "an endpoint the exporter could not read".to_owned(),
        }
    }
}

/// The layer that exports [`TARGET`]'s spans to `endpoint`, in batches
/// from a thread of its own. Call before any runtime starts: the exporter
/// has a blocking HTTP client.
pub fn layer<S>(endpoint: Endpoint) -> Result<impl Layer<S>, String>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    let mut exporter = SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary);
    if let Endpoint::Given(url) = endpoint {
        exporter = exporter.with_endpoint(url);
    }
    let exporter = exporter.build().map_err(|e| e.to_string())?;
    // The SDK reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; ours
    // is the name when they give none.
    let named = std::env::var("OTEL_SERVICE_NAME").is_ok_and(|v| !v.trim().is_empty())
        || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|v| v.contains("service.name="));
    let mut resource = Resource::builder();
    if !named {
        resource = resource.with_service_name("turnstore");
    }
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build();
    let tracer = provider.tracer("turnstore");
    let _ = PROVIDER.set(provider);
    ON.store(true, Ordering::Relaxed);
    Ok(tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_location(false)
        .with_threads(false)
        .with_tracked_inactivity(false)
        .with_target(false)
        .with_filter(Targets::new().with_target(TARGET, Level::INFO)))
}

/// Sends the spans still buffered; at exit.
pub fn flush() {
    if let Some(provider) = PROVIDER.get()
        && let Err(e) = provider.shutdown()
    {
        tracing::warn!(error = %e, "traces not all sent at exit");
    }
}

/// A request's headers, as the propagator reads them.
struct Headers<'a> {
    headers: &'a HeaderMap,
    /// `traceparent` with only the flag the propagator knows.
    traceparent: Option<String>,
}

impl<'a> Headers<'a> {
    fn new(headers: &'a HeaderMap) -> Self {
        let traceparent = headers
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .and_then(sampled_flag_only);
        Headers {
            headers,
            traceparent,
        }
    }
}

/// A version 00 `traceparent` with its flags reduced to `sampled`. Trace
/// Context Level 2 adds a `random` flag (`03` = sampled and random, as
/// OpenTelemetry's Python SDK sends), and receivers must ignore the flags
/// they do not know; OpenTelemetry's Rust propagator refuses any over 02.
fn sampled_flag_only(value: &str) -> Option<String> {
    let value = value.trim();
    let (rest, flags) = value.rsplit_once('-')?;
    if !value.starts_with("00-") || flags.len() != 2 {
        return None;
    }
    let flags = u8::from_str_radix(flags, 16).ok()?;
    Some(format!("{rest}-{:02x}", flags & 1))
}

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        match (key, &self.traceparent) {
            ("traceparent", Some(traceparent)) => Some(traceparent),
            _ => self.headers.get(key).and_then(|v| v.to_str().ok()),
        }
    }

    fn keys(&self) -> Vec<&str> {
        self.headers.keys().map(|k| k.as_str()).collect()
    }
}

/// The server span of a request: the log's `request` span with OpenTelemetry's
/// names, its parent the caller's `traceparent` (and `tracestate`), if valid.
pub fn request_span(
    method: &'static str,
    route: &str,
    request_id: &str,
    headers: &HeaderMap,
) -> Span {
    let span = tracing::info_span!(
        target: TARGET,
        "request",
        method,
        route,
        request_id,
        otel.name = %format_args!("{method} {route}"),
        otel.kind = "server",
        http.request.method = method,
        http.route = route,
        http.response.status_code = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    );
    let parent = TraceContextPropagator::new().extract(&Headers::new(headers));
    let _ = span.set_parent(parent);
    span
}

/// The answer's status on a request's span; a 5xx is an error.
pub fn record_status(span: &Span, status: u16) {
    // As an integer: the layer records a u64 as its Debug string.
    span.record("http.response.status_code", i64::from(status));
    if status >= 500 {
        span.record("otel.status_code", "error");
    }
}

/// A Redis script call in a client span named after the script. Boxed, and
/// not an `async fn`: an `async fn` would hold `call` itself, so the caller's
/// future would grow by the span and a pointer on the untraced path too; a
/// box is smaller than any call.
pub fn script<'a, T, E>(
    name: &'static str,
    call: impl Future<Output = Result<T, E>> + Send + 'a,
) -> Pin<Box<dyn Future<Output = Result<T, E>> + Send + 'a>>
where
    T: Send + 'a,
    E: Send + 'a,
{
    let span = tracing::info_span!(
        target: TARGET,
        "script",
        otel.name = name,
        otel.kind = "client",
        db.system.name = "redis",
        db.stored_procedure.name = name,
        otel.status_code = tracing::field::Empty,
    );
    Box::pin(async move {
        let result = call.instrument(span.clone()).await;
        if result.is_err() {
            span.record("otel.status_code", "error");
        }
        result
    })
}

/// The span of a summarization, the background work a write may start;
/// its parent is the current span (the request that wrote).
pub fn summarize_span() -> Span {
    tracing::info_span!(target: TARGET, "summarize", otel.kind = "internal")
}

/// The client span of one call of the summarizer's model.
pub fn chat_span(model: &str) -> Span {
    tracing::info_span!(
        target: TARGET,
        "chat",
        otel.name = %format_args!("chat {model}"),
        otel.kind = "client",
        gen_ai.operation.name = "chat",
        gen_ai.request.model = model,
        http.response.status_code = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_traces_path_is_added_once() {
        assert_eq!(traces_url("http://c:4318"), "http://c:4318/v1/traces");
        assert_eq!(traces_url("http://c:4318/"), "http://c:4318/v1/traces");
        assert_eq!(
            traces_url("https://c/otlp/v1/traces"),
            "https://c/otlp/v1/traces"
        );
    }

    #[test]
    fn the_log_names_the_collector_without_secrets() {
        let given = |url: &str| Endpoint::Given(traces_url(url)).origin();
        assert_eq!(given("http://collector:4318"), "http://collector:4318");
        assert_eq!(
            given("https://user:s3cret@otlp.example.com/v1/traces?token=abc"),
            "https://otlp.example.com"
        );
    }

    #[test]
    fn a_request_without_traceparent_has_no_remote_parent() {
        use opentelemetry::trace::TraceContextExt;
        let mut headers = HeaderMap::new();
        let none = TraceContextPropagator::new().extract(&Headers::new(&headers));
        assert!(!none.span().span_context().is_valid());
        headers.insert(
            "traceparent",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
                .parse()
                .unwrap(),
        );
        let cx = TraceContextPropagator::new().extract(&Headers::new(&headers));
        let parent = cx.span().span_context().clone();
        assert!(parent.is_remote());
        assert_eq!(
            parent.trace_id().to_string(),
            "0af7651916cd43dd8448eb211c80319c"
        );
        assert_eq!(parent.span_id().to_string(), "b7ad6b7169203331");
    }

    #[test]
    fn flags_of_trace_context_level_2_are_read_as_sampled_or_not() {
        use opentelemetry::trace::TraceContextExt;
        let parent = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert("traceparent", value.parse().unwrap());
            let cx = TraceContextPropagator::new().extract(&Headers::new(&headers));
            let span = cx.span().span_context().clone();
            (span.is_valid(), span.is_sampled())
        };
        let id = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331";
        assert_eq!(parent(&format!("{id}-03")), (true, true));
        assert_eq!(parent(&format!("{id}-02")), (true, false));
        assert_eq!(parent(&format!("{id}-ff")), (true, true));
        assert_eq!(parent(&format!("{id}-0g")), (false, false));
        assert_eq!(
            parent("00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01"),
            (false, false)
        );
        assert_eq!(parent("garbage"), (false, false));
    }
}
