//! The one error type of the API, mapped once to RFC 9457 problem+json.
//! Internal causes are logged here, with context, and never sent.

use std::fmt::Display;

use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use crate::store::StoreError;

/// One invalid input.
#[derive(Debug, Clone, Serialize, ToSchema, PartialEq, Eq)]
pub struct FieldError {
    /// Where: a body field (`history.limit`), a query parameter, a path
    /// segment, a header, or `body` for the document as a whole.
    pub field: String,
    pub message: String,
}

#[derive(Debug)]
pub enum ApiError {
    /// 422 `validation_failed`
    Validation(Vec<FieldError>),
    /// 413 `payload_too_large`
    PayloadTooLarge(String),
    /// 401 `unauthorized`
    Unauthorized,
    /// 403 `session_owner_mismatch`
    SessionOwnerMismatch,
    /// 404 `session_not_found`
    SessionNotFound,
    /// 404 `turn_not_found`
    TurnNotFound,
    /// 409 `turn_already_finalized`
    TurnAlreadyFinalized,
    /// 422 `idempotency_key_reused`
    IdempotencyKeyReused,
    /// 429 `too_many_pending_turns`, with `Retry-After`.
    TooManyPendingTurns { retry_after: std::time::Duration },
    /// 503 `store_unavailable`
    StoreUnavailable,
    /// 503 `store_unavailable` from `/readyz`, saying why (never a URL).
    StoreUnready(String),
    /// 500 `internal`
    Internal,
    /// 404 `not_found`: no such route.
    RouteNotFound,
    /// 405 `method_not_allowed`
    MethodNotAllowed,
    /// 406 `not_acceptable`: `Accept` rules out every type the route serves.
    NotAcceptable,
    /// 503 `request_timeout`: the request took longer than `TURNSTORE_REQUEST_TIMEOUT`.
    RequestTimeout,
    /// 503 `overloaded`: `TURNSTORE_MAX_CONCURRENCY` requests are in flight.
    Overloaded,
}

/// RFC 9457 problem document.
#[derive(Debug, Serialize, ToSchema)]
pub struct Problem {
    /// `urn:turnstore:problem:<code>`
    #[serde(rename = "type")]
    pub kind: String,
    pub title: &'static str,
    pub status: u16,
    pub detail: String,
    /// Stable, machine-readable: `validation_failed`, `payload_too_large`,
    /// `unauthorized`, `session_not_found`, `turn_not_found`,
    /// `turn_already_finalized`, `session_owner_mismatch`,
    /// `idempotency_key_reused`, `too_many_pending_turns`,
    /// `store_unavailable`, `internal`,
    /// `not_found`, `method_not_allowed`, `not_acceptable`,
    /// `request_timeout`, `overloaded`.
    pub code: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub errors: Option<Vec<FieldError>>,
}

impl ApiError {
    pub fn field(field: impl Into<String>, message: impl Display) -> Self {
        ApiError::Validation(vec![FieldError {
            field: field.into(),
            message: message.to_string(),
        }])
    }

    fn parts(&self) -> (StatusCode, &'static str, &'static str, String) {
        use ApiError::*;
        match self {
            Validation(errors) => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "validation_failed",
                "Invalid request",
                match errors.as_slice() {
                    [one] => format!("{}: {}", one.field, one.message),
                    many => format!("{} fields are invalid", many.len()),
                },
            ),
            PayloadTooLarge(detail) => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                "Payload too large",
                detail.clone(),
            ),
            Unauthorized => (
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "Unauthorized",
                "send `Authorization: Bearer <key>` with a configured API key".into(),
            ),
            SessionOwnerMismatch => (
                StatusCode::FORBIDDEN,
                "session_owner_mismatch",
                "Session belongs to another user",
                "the session was started by another user_id; nothing was written".into(),
            ),
            SessionNotFound => (
                StatusCode::NOT_FOUND,
                "session_not_found",
                "Session not found",
                "no live session has this id (it may have expired or been cleared)".into(),
            ),
            TurnNotFound => (
                StatusCode::NOT_FOUND,
                "turn_not_found",
                "Turn not found",
                "no pending or finalized turn has this id in this session (a pending turn may have expired)".into(),
            ),
            TurnAlreadyFinalized => (
                StatusCode::CONFLICT,
                "turn_already_finalized",
                "Turn already finalized",
                "the turn was finalized with another answer".into(),
            ),
            IdempotencyKeyReused => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "idempotency_key_reused",
                "Idempotency key reused",
                "this Idempotency-Key was used with a different request body".into(),
            ),
            TooManyPendingTurns { .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_pending_turns",
                "Too many pending turns",
                "the session holds as many started, unfinished turns as allowed; finalize or abort one, or retry after Retry-After seconds; nothing was written".into(),
            ),
            StoreUnavailable => (
                StatusCode::SERVICE_UNAVAILABLE,
                "store_unavailable",
                "Store unavailable",
                "the store did not answer in time; retry later".into(),
            ),
            StoreUnready(cause) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "store_unavailable",
                "Store unavailable",
                cause.clone(),
            ),
            Internal => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "Internal error",
                "an unexpected error occurred; it was logged".into(),
            ),
            RouteNotFound => (
                StatusCode::NOT_FOUND,
                "not_found",
                "Not found",
                "no such route; see /openapi.json".into(),
            ),
            RequestTimeout => (
                StatusCode::SERVICE_UNAVAILABLE,
                "request_timeout",
                "Request timed out",
                "the request took longer than the configured timeout; retry later".into(),
            ),
            Overloaded => (
                StatusCode::SERVICE_UNAVAILABLE,
                "overloaded",
                "Overloaded",
                "too many requests in flight; retry later".into(),
            ),
            MethodNotAllowed => (
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "Method not allowed",
                "this route does not take this method; see /openapi.json".into(),
            ),
            NotAcceptable => (
                StatusCode::NOT_ACCEPTABLE,
                "not_acceptable",
                "Not acceptable",
                "this route serves application/json or text/plain; Accept rules out both".into(),
            ),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code, title, detail) = self.parts();
        let retry_after = match &self {
            ApiError::TooManyPendingTurns { retry_after } => {
                Some(retry_after.as_millis().div_ceil(1000).max(1) as u64)
            }
            _ => None,
        };
        let problem = Problem {
            kind: format!("urn:turnstore:problem:{code}"),
            title,
            status: status.as_u16(),
            detail,
            code,
            errors: match self {
                ApiError::Validation(errors) => Some(errors),
                _ => None,
            },
        };
        let body = serde_json::to_vec(&problem).unwrap_or_default();
        let mut res = (status, body).into_response();
        res.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(secs) = retry_after {
            res.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        res
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::OwnerMismatch => ApiError::SessionOwnerMismatch,
            StoreError::IdempotencyKeyReused => ApiError::IdempotencyKeyReused,
            StoreError::TurnNotFound => ApiError::TurnNotFound,
            StoreError::TooManyPendingTurns { retry_after } => {
                ApiError::TooManyPendingTurns { retry_after }
            }
            StoreError::Unavailable(cause) => {
                tracing::warn!(%cause, "store unavailable");
                ApiError::StoreUnavailable
            }
            StoreError::Corrupt(cause) => {
                tracing::error!(%cause, "unreadable store data");
                ApiError::Internal
            }
        }
    }
}

impl From<BytesRejection> for ApiError {
    fn from(rej: BytesRejection) -> Self {
        if rej.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::PayloadTooLarge(
                "the request body is larger than the configured maximum".into(),
            )
        } else {
            ApiError::field("body", rej.body_text())
        }
    }
}

impl From<PathRejection> for ApiError {
    fn from(rej: PathRejection) -> Self {
        ApiError::field("path", rej.body_text())
    }
}
