//! What starts, imports and forks share for retries: the `Idempotency-Key`
//! header, the hash a replay's body is compared by, and the answer (201,
//! or 200 with `Idempotent-Replayed: true` for a replay).

use axum::Json;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::domain::IdempotencyKey;

pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

/// The request's `Idempotency-Key`, if it sent one (its validation for
/// `optional("Idempotency-Key", …)`).
pub fn key(headers: &HeaderMap) -> Option<Result<IdempotencyKey, &'static str>> {
    headers.get(IDEMPOTENCY_KEY).map(|v| {
        v.to_str()
            .map_err(|_| "must be visible ASCII")
            .and_then(IdempotencyKey::parse)
    })
}

/// What "the same body" means for a replay: the parsed request as JSON
/// (key order and white space do not matter), hashed.
pub fn request_hash(body: &impl Serialize) -> String {
    let canonical = serde_json::to_vec(body).unwrap_or_default();
    Sha256::digest(&canonical)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// 201 with `body`, or 200 and `Idempotent-Replayed: true` for a replay.
pub fn created(body: impl Serialize, replayed: bool) -> Response {
    if !replayed {
        return (StatusCode::CREATED, Json(body)).into_response();
    }
    let mut res = (StatusCode::OK, Json(body)).into_response();
    res.headers_mut()
        .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    res
}
