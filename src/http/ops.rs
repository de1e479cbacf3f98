//! Operations endpoints: liveness, readiness, metrics. Never behind auth.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::AppState;
use super::error::ApiError;
use crate::store::StoreError;

/// The process is alive.
pub async fn healthz() -> Json<serde_json::Value> {
    Json(json!({"status": "ok"}))
}

/// The store answers; 503 `store_unavailable` while it does not.
pub async fn readyz(State(app): State<AppState>) -> Result<Json<serde_json::Value>, ApiError> {
    match app.store.ping().await {
        Ok(()) => Ok(Json(json!({"status": "ready"}))),
        Err(StoreError::Unavailable(cause)) => {
            tracing::warn!(%cause, "not ready");
            Err(ApiError::StoreUnready(cause))
        }
        Err(e) => Err(e.into()),
    }
}

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
