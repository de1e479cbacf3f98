//! The HTTP API: each resource module declares its handlers; `router` merges
//! them, adds auth, request ids, tracing, metrics and panic safety.

mod accept;
mod docs;
pub mod error;
mod exports;
mod extract;
mod forks;
mod history;
mod idempotency;
mod imports;
pub mod lens;
mod ops;
mod reading;
mod sessions;
mod spec;
mod summaries;
mod turns;
mod users;
mod valid;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{HeaderName, HeaderValue, Method, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio::sync::Semaphore;
use tower::util::option_layer;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::cors::{AllowOrigin, CorsLayer};
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use self::error::{ApiError, ProblemCode};
use crate::config::Settings;
use crate::history::template::Templates;
use crate::metrics::{HttpLabels, Metrics};
use crate::store::Store;
use crate::summarizer::Summarizer;
use crate::telemetry;
use crate::tokens::{Models, Tokenizers};

/// What every handler can reach: one reference-counted value, so that
/// each middleware and handler clones one pointer, not each part (the
/// parts' reference counts, bumped and dropped four times a request, cost
/// 3 % of a question's CPU).
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

pub struct Shared {
    pub store: Arc<dyn Store>,
    pub settings: Arc<Settings>,
    pub metrics: Arc<Metrics>,
    /// SHA-256 of each API key: compared in constant time, whatever their lengths.
    api_key_digests: Vec<[u8; 32]>,
    /// Permits for API requests in flight; none left means shed the request.
    in_flight: Arc<Semaphore>,
    /// Permits for exports streaming (`TURNSTORE_MAX_EXPORTS`): a stream
    /// outlives its handler, and takes one of these instead.
    exports: Arc<Semaphore>,
    /// The built-in templates and the operator's, loaded at start.
    pub templates: Arc<Templates>,
    /// Which encoding counts for a model (`TURNSTORE_MODELS`).
    pub models: Arc<Models>,
    /// The tokenizers loaded from `TURNSTORE_TOKENIZERS_DIR`.
    pub tokenizers: Arc<Tokenizers>,
    /// The server-side summarizer, when configured.
    pub summarizer: Option<Arc<Summarizer>>,
    /// The lens page, when `TURNSTORE_LENS` serves it.
    pub lens: Option<Arc<lens::Page>>,
}

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

impl AppState {
    pub fn new(
        store: Arc<dyn Store>,
        settings: Settings,
        api_keys: &[String],
        metrics: Arc<Metrics>,
        templates: Templates,
        (models, tokenizers): (Models, Tokenizers),
        (summarizer, lens): (Option<Arc<Summarizer>>, Option<lens::Page>),
    ) -> Self {
        let api_key_digests = api_keys.iter().map(|k| digest(k.as_bytes())).collect();
        AppState(Arc::new(Shared {
            store,
            in_flight: Arc::new(Semaphore::new(settings.max_concurrency as usize)),
            exports: Arc::new(Semaphore::new(settings.max_exports as usize)),
            settings: Arc::new(settings),
            metrics,
            api_key_digests,
            templates: Arc::new(templates),
            models: Arc::new(models),
            tokenizers: Arc::new(tokenizers),
            summarizer,
            lens: lens.map(Arc::new),
        }))
    }
}

fn digest(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// The API routes (behind auth and load shedding), the operations routes
/// (open), and the document utoipa derives from both.
fn routes() -> (Router<AppState>, Router<AppState>, utoipa::openapi::OpenApi) {
    let (v1, mut doc) = OpenApiRouter::with_openapi(spec::ApiDoc::openapi())
        .routes(routes!(turns::start_turn))
        .routes(routes!(turns::finalize_turn))
        .routes(routes!(turns::regenerate_turn))
        .routes(routes!(forks::fork))
        .routes(routes!(turns::abort_turn))
        .routes(routes!(history::get_history))
        .routes(routes!(sessions::get_session, sessions::clear_session))
        .routes(routes!(
            summaries::put_summary,
            summaries::get_summary,
            summaries::delete_summary
        ))
        .routes(routes!(imports::import))
        .routes(routes!(exports::export))
        .routes(routes!(users::list_user_sessions))
        .routes(routes!(users::erase_user))
        .split_for_parts();
    let (ops, ops_doc) = OpenApiRouter::new()
        .routes(routes!(ops::healthz))
        .routes(routes!(ops::readyz))
        .split_for_parts();
    doc.merge(ops_doc);
    (v1, ops, doc)
}

/// The OpenAPI 3.1 document for these settings, as served at `/openapi.json`
/// (`keyed`: the server has API keys, which its operations then require).
pub fn openapi(settings: &Settings, keyed: bool) -> serde_json::Value {
    let (doc, missed) = spec::document(routes().2, settings, keyed);
    if !missed.is_empty() {
        tracing::error!(
            ?missed,
            "the OpenAPI document lacks places the settings describe"
        );
    }
    doc
}

/// The whole application; tests drive it without a socket.
pub fn router(state: AppState) -> Router {
    let (v1, ops, _) = routes();
    let v1 = v1
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            require_api_key,
        ))
        .route_layer(middleware::from_fn_with_state(state.clone(), shed_load));
    let body_limit = state.settings.max_body_bytes;
    let app = Router::new()
        .merge(v1)
        .merge(ops)
        // Prometheus' text, for scrapers: not in the OpenAPI document.
        .route("/metrics", axum::routing::get(ops::metrics))
        .merge(docs::router(&spec::with_tokenizers(
            openapi(&state.settings, !state.api_key_digests.is_empty()),
            state.tokenizers.names(),
        )))
        .merge(lens::router(state.lens.clone()))
        .fallback(|| async { ApiError::from(ProblemCode::NotFound) })
        .method_not_allowed_fallback(|| async { ApiError::from(ProblemCode::MethodNotAllowed) })
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(middleware::from_fn_with_state(state.clone(), time_limit))
        .layer(CatchPanicLayer::custom(|_| {
            tracing::error!("a request handler panicked");
            ApiError::INTERNAL.into_response()
        }))
        .layer(option_layer(cors(&state.settings.cors_origins)))
        .layer(middleware::from_fn_with_state(state.clone(), observe));
    // The request's span: the log's, or (traces on) also the trace's server
    // span; chosen here, once, so that without traces a request runs
    // exactly the code it always did.
    let app = if telemetry::on() {
        app.layer(
            TraceLayer::new_for_http()
                .make_span_with(|req: &Request| {
                    let (method, route, request_id) = span_fields(req);
                    telemetry::request_span(method, route, request_id, req.headers())
                })
                .on_response(|res: &Response, _: Duration, span: &tracing::Span| {
                    telemetry::record_status(span, res.status().as_u16());
                }),
        )
    } else {
        app.layer(
            TraceLayer::new_for_http()
                .make_span_with(|req: &Request| {
                    let (method, route, request_id) = span_fields(req);
                    tracing::info_span!("request", method, route, request_id)
                })
                // `observe` logs the response, with its fields at the top level.
                .on_response(()),
        )
    };
    app.layer(PropagateRequestIdLayer::x_request_id())
        .layer(SetRequestIdLayer::x_request_id(MakeRequestUuid))
        .layer(middleware::map_request(drop_odd_request_id))
        .with_state(state)
}

/// A request's method, route template and request id, as spans name them.
fn span_fields(req: &Request) -> (&'static str, &str, &str) {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(MatchedPath::as_str)
        .unwrap_or("unmatched");
    let request_id = req
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    (method_label(req.method()), route, request_id)
}

/// CORS for exactly these origins (`TURNSTORE_CORS_ORIGINS`); none: no CORS
/// headers at all, and an `OPTIONS` is a 405 like any other unknown method.
/// A preflight needs no API key (browsers never send one with it).
fn cors(origins: &[HeaderValue]) -> Option<CorsLayer> {
    if origins.is_empty() {
        return None;
    }
    let header = HeaderName::from_static;
    Some(
        CorsLayer::new()
            .allow_origin(AllowOrigin::list(origins.iter().cloned()))
            .allow_methods([Method::GET, Method::POST, Method::PUT, Method::DELETE])
            .allow_headers([
                header::AUTHORIZATION,
                header::CONTENT_TYPE,
                header::ACCEPT,
                header(idempotency::IDEMPOTENCY_KEY),
                header("x-request-id"),
                // W3C trace context, from pages that trace their calls.
                header("traceparent"),
                header("tracestate"),
            ])
            .expose_headers([
                header("x-request-id"),
                header(idempotency::IDEMPOTENT_REPLAYED),
                header::RETRY_AFTER,
                header("x-token-count"),
                header("x-encoding"),
            ])
            .max_age(Duration::from_secs(600)),
    )
}

async fn require_api_key(State(app): State<AppState>, req: Request, next: Next) -> Response {
    if app.api_key_digests.is_empty() {
        return next.run(req).await;
    }
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token)
        .map(|k| digest(k.as_bytes()));
    let Some(presented) = presented else {
        return ApiError::UNAUTHORIZED.into_response();
    };
    // Compare with every key, without stopping early.
    let ok = app
        .api_key_digests
        .iter()
        .fold(subtle::Choice::from(0), |acc, k| acc | k.ct_eq(&presented));
    if bool::from(ok) {
        next.run(req).await
    } else {
        ApiError::UNAUTHORIZED.into_response()
    }
}

/// The token of an `Authorization: Bearer <token>` value; the scheme is
/// case-insensitive (RFC 9110, 11.1).
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// The longest `x-request-id` kept from a client.
pub const MAX_REQUEST_ID: usize = 128;

/// Keeps a client's `x-request-id` only when it is one value of 1 to
/// `MAX_REQUEST_ID` visible ASCII characters; otherwise drops it, so that
/// a new one is made (nothing unbounded is echoed or logged).
async fn drop_odd_request_id(mut req: Request) -> Request {
    let headers = req.headers_mut();
    let mut ids = headers.get_all("x-request-id").iter();
    let fine = |v: &HeaderValue| {
        let b = v.as_bytes();
        (1..=MAX_REQUEST_ID).contains(&b.len()) && b.iter().all(u8::is_ascii_graphic)
    };
    let keep = match (ids.next(), ids.next()) {
        (Some(v), None) => fine(v),
        (None, _) => true,
        _ => false,
    };
    if !keep {
        headers.remove("x-request-id");
    }
    req
}

/// The method as a metric label: one of a closed set, so no client can
/// grow the series.
fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        Method::PATCH => "PATCH",
        Method::TRACE => "TRACE",
        Method::CONNECT => "CONNECT",
        _ => "other",
    }
}

/// Sheds API requests beyond `max_concurrency` with 503 rather than queueing them.
async fn shed_load(State(app): State<AppState>, req: Request, next: Next) -> Response {
    match app.in_flight.clone().try_acquire_owned() {
        Ok(_permit) => next.run(req).await,
        Err(_) => {
            app.metrics.request_shed();
            ApiError::from(ProblemCode::Overloaded).into_response()
        }
    }
}

/// Answers 503 `request_timeout` when a request takes longer than allowed.
async fn time_limit(State(app): State<AppState>, req: Request, next: Next) -> Response {
    match tokio::time::timeout(app.settings.request_timeout, next.run(req)).await {
        Ok(res) => res,
        Err(_) => {
            app.metrics.request_timed_out();
            ApiError::from(ProblemCode::RequestTimeout).into_response()
        }
    }
}

/// Counts and times every request, and logs one line per response: request
/// id, method, route template, status, latency. Never bodies or paths'
/// query strings, so no question, answer or key reaches the log.
async fn observe(State(app): State<AppState>, req: Request, next: Next) -> Response {
    let start = Instant::now();
    let method = method_label(req.method());
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "unmatched".to_owned());
    let request_id = req
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let res = next.run(req).await;
    let elapsed = start.elapsed().as_secs_f64();
    let status = res.status().as_u16();
    tracing::info!(
        request_id,
        method,
        route,
        status,
        latency_ms = elapsed * 1000.0,
        "response"
    );
    app.metrics.observe_request(
        HttpLabels {
            method: method.to_owned(),
            route,
            status,
        },
        elapsed,
    );
    res
}
