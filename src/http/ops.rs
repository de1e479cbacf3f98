//! Operations endpoints: liveness, readiness, metrics. Never behind auth.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use super::AppState;
use super::error::ApiError;
use crate::store::StoreError;

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ProbeStatus {
    Ok,
    Ready,
}

/// A probe's answer.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({"status": "ready"}))]
pub struct Probe {
    /// `ok` from `/healthz`, `ready` from `/readyz`.
    pub status: ProbeStatus,
}

/// Liveness
///
/// The process is alive (for a liveness probe); never touches the store.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "operations",
    responses((status = 200, description = "Alive", body = Probe,
        example = json!({"status": "ok"}))),
)]
pub async fn healthz() -> Json<Probe> {
    Json(Probe {
        status: ProbeStatus::Ok,
    })
}

/// Readiness
///
/// The store answers (for a readiness probe): 503 `store_unavailable` while
/// it does not, its `detail` naming the cause (never a URL or password).
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "operations",
    responses(
        (status = 200, description = "Ready", body = Probe),
        (status = 503, description = "`store_unavailable`: the store cannot be used; `detail` says why",
         body = super::error::Problem, content_type = "application/problem+json",
         example = json!({
             "type": "urn:turnstore:problem:store_unavailable",
             "title": "Store unavailable",
             "status": 503,
             "detail": "Redis refused the connection (is it running, on this host and port?)",
             "code": "store_unavailable"
         })),
    ),
)]
pub async fn readyz(State(app): State<AppState>) -> Result<Json<Probe>, ApiError> {
    match app.store.ping().await {
        Ok(()) => Ok(Json(Probe {
            status: ProbeStatus::Ready,
        })),
        Err(StoreError::Unavailable(outage)) => {
            tracing::warn!(cause = %outage.said, "not ready");
            Err(ApiError::StoreUnready(outage.said))
        }
        Err(e) => Err(e.into()),
    }
}

/// Prometheus metrics, in the OpenMetrics text format.
pub async fn metrics(State(app): State<AppState>) -> Response {
    if let Some(pool) = app.store.pool_status() {
        app.metrics.set_pool(pool);
    }
    let mut res = app.metrics.encode().into_response();
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    res
}
