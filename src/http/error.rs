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
    #[schema(example = "history.limit")]
    pub field: String,
    #[schema(example = "must be at most 10000")]
    pub message: String,
}

/// Every problem's stable, machine-readable code, with its status and title
/// (one place: the responses and the OpenAPI document both read them here).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ProblemCode {
    ValidationFailed,
    PayloadTooLarge,
    Unauthorized,
    SessionOwnerMismatch,
    SessionNotFound,
    TurnNotFound,
    TurnAlreadyFinalized,
    IdempotencyKeyReused,
    TooManyPendingTurns,
    StoreUnavailable,
    Internal,
    NotFound,
    MethodNotAllowed,
    NotAcceptable,
    RequestTimeout,
    Overloaded,
    SummaryConflict,
    SummaryNotFound,
    TemplateNotFound,
    TemplateError,
    TooManyExports,
    UnknownModel,
    TurnPending,
    TurnSummarized,
    SessionExists,
}

impl ProblemCode {
    pub const ALL: [ProblemCode; 25] = [
        ProblemCode::ValidationFailed,
        ProblemCode::PayloadTooLarge,
        ProblemCode::Unauthorized,
        ProblemCode::SessionOwnerMismatch,
        ProblemCode::SessionNotFound,
        ProblemCode::TurnNotFound,
        ProblemCode::TurnAlreadyFinalized,
        ProblemCode::IdempotencyKeyReused,
        ProblemCode::TooManyPendingTurns,
        ProblemCode::StoreUnavailable,
        ProblemCode::Internal,
        ProblemCode::NotFound,
        ProblemCode::MethodNotAllowed,
        ProblemCode::NotAcceptable,
        ProblemCode::RequestTimeout,
        ProblemCode::Overloaded,
        ProblemCode::SummaryConflict,
        ProblemCode::SummaryNotFound,
        ProblemCode::TemplateNotFound,
        ProblemCode::TemplateError,
        ProblemCode::TooManyExports,
        ProblemCode::UnknownModel,
        ProblemCode::TurnPending,
        ProblemCode::TurnSummarized,
        ProblemCode::SessionExists,
    ];

    pub fn name(self) -> &'static str {
        use ProblemCode::*;
        match self {
            ValidationFailed => "validation_failed",
            PayloadTooLarge => "payload_too_large",
            Unauthorized => "unauthorized",
            SessionOwnerMismatch => "session_owner_mismatch",
            SessionNotFound => "session_not_found",
            TurnNotFound => "turn_not_found",
            TurnAlreadyFinalized => "turn_already_finalized",
            IdempotencyKeyReused => "idempotency_key_reused",
            TooManyPendingTurns => "too_many_pending_turns",
            StoreUnavailable => "store_unavailable",
            Internal => "internal",
            NotFound => "not_found",
            MethodNotAllowed => "method_not_allowed",
            NotAcceptable => "not_acceptable",
            RequestTimeout => "request_timeout",
            Overloaded => "overloaded",
            SummaryConflict => "summary_conflict",
            SummaryNotFound => "summary_not_found",
            TemplateNotFound => "template_not_found",
            TemplateError => "template_error",
            TooManyExports => "too_many_exports",
            UnknownModel => "unknown_model",
            TurnPending => "turn_pending",
            TurnSummarized => "turn_summarized",
            SessionExists => "session_exists",
        }
    }

    /// `(status, title, the detail every such problem carries unless it says more)`.
    pub fn describe(self) -> (StatusCode, &'static str, &'static str) {
        use ProblemCode::*;
        match self {
            ValidationFailed => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "Invalid request",
                "a field is invalid; `errors` names each one",
            ),
            PayloadTooLarge => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "Payload too large",
                "the request body is larger than the configured maximum",
            ),
            Unauthorized => (
                StatusCode::UNAUTHORIZED,
                "Unauthorized",
                "send `Authorization: Bearer <key>` with a configured API key",
            ),
            SessionOwnerMismatch => (
                StatusCode::FORBIDDEN,
                "Session belongs to another user",
                "the session was started by another user_id; nothing was written",
            ),
            SessionNotFound => (
                StatusCode::NOT_FOUND,
                "Session not found",
                "no live session has this id (it may have expired or been cleared)",
            ),
            TurnNotFound => (
                StatusCode::NOT_FOUND,
                "Turn not found",
                "no pending or finalized turn has this id in this session (a pending turn may have expired)",
            ),
            TurnAlreadyFinalized => (
                StatusCode::CONFLICT,
                "Turn already finalized",
                "the turn was finalized with another answer",
            ),
            IdempotencyKeyReused => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "Idempotency key reused",
                "this Idempotency-Key was used with a different request body",
            ),
            TooManyPendingTurns => (
                StatusCode::TOO_MANY_REQUESTS,
                "Too many pending turns",
                "the session holds as many started, unfinished turns as allowed; finalize or abort one, or retry after Retry-After seconds; nothing was written",
            ),
            StoreUnavailable => (
                StatusCode::SERVICE_UNAVAILABLE,
                "Store unavailable",
                "the store did not answer in time; retry later",
            ),
            Internal => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "Internal error",
                "an unexpected error occurred; it was logged",
            ),
            NotFound => (
                StatusCode::NOT_FOUND,
                "Not found",
                "no such route; see /openapi.json",
            ),
            MethodNotAllowed => (
                StatusCode::METHOD_NOT_ALLOWED,
                "Method not allowed",
                "this route does not take this method; see /openapi.json",
            ),
            NotAcceptable => (
                StatusCode::NOT_ACCEPTABLE,
                "Not acceptable",
                "this route serves application/json or text/plain; Accept rules out both",
            ),
            RequestTimeout => (
                StatusCode::SERVICE_UNAVAILABLE,
                "Request timed out",
                "the request took longer than the configured timeout; retry later",
            ),
            Overloaded => (
                StatusCode::SERVICE_UNAVAILABLE,
                "Overloaded",
                "too many requests in flight; retry later",
            ),
            SummaryConflict => (
                StatusCode::CONFLICT,
                "Summary conflict",
                "the stored summary does not cover what this write expects (or covers more); read it, fold what it does not cover, and write again; nothing was written",
            ),
            SummaryNotFound => (
                StatusCode::NOT_FOUND,
                "Summary not found",
                "the session has no summary (or no live session has this id)",
            ),
            TemplateNotFound => (
                StatusCode::NOT_FOUND,
                "Template not found",
                "no template has this name: the built-ins are xml and markdown, others come from TURNSTORE_TEMPLATES_DIR",
            ),
            TemplateError => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "Template failed",
                "the template failed while rendering this history",
            ),
            TooManyExports => (
                StatusCode::TOO_MANY_REQUESTS,
                "Too many exports",
                "this instance streams as many exports as allowed (TURNSTORE_MAX_EXPORTS); retry after Retry-After seconds",
            ),
            UnknownModel => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "Unknown model",
                "the model is in no model table and this server refuses such models (TURNSTORE_UNKNOWN_MODEL=reject): send `encoding`, or add the model to the file TURNSTORE_MODELS names; nothing was written",
            ),
            TurnPending => (
                StatusCode::CONFLICT,
                "Turn pending",
                "the turn has no answer yet: finalize it (a regenerate replaces a finalized turn's answer); nothing was written",
            ),
            TurnSummarized => (
                StatusCode::CONFLICT,
                "Turn summarized",
                "the session's summary covers this turn, so its answer is part of the summary: delete the summary (or write one that covers less) first; nothing was written",
            ),
            SessionExists => (
                StatusCode::CONFLICT,
                "Session exists",
                "a live session has the id a fork would make: choose another (or clear that one); nothing was written",
            ),
        }
    }

    pub fn status(self) -> StatusCode {
        self.describe().0
    }
}

/// What went wrong with a request; each variant's code names its status.
#[derive(Debug)]
pub enum ApiError {
    /// 422 `validation_failed`, naming every invalid field.
    Validation(Vec<FieldError>),
    /// 413 `payload_too_large`, saying which text or body.
    PayloadTooLarge(String),
    /// 503 `store_unavailable` from `/readyz`, saying why (never a URL).
    StoreUnready(String),
    /// 503 `store_unavailable` of a request, saying what kind of failure.
    StoreUnavailable(&'static str),
    /// 429 `too_many_pending_turns`, with `Retry-After`.
    TooManyPendingTurns { retry_after: std::time::Duration },
    /// 429 `too_many_exports`, with `Retry-After`.
    TooManyExports { retry_after: std::time::Duration },
    /// 409 `summary_conflict`, saying what the stored summary covers.
    SummaryConflict { stored: u64 },
    /// 409 `summary_conflict`: the session is not the generation the
    /// write expected.
    SessionReplaced,
    /// 422 `template_error`, saying where and why.
    Template(String),
    /// 422 `unknown_model`, naming the model.
    UnknownModel(String),
    /// 409 `turn_summarized`, saying what the summary covers.
    TurnSummarized { through: u64 },
    /// 409 `session_exists`: a fork's new id is taken, or (with
    /// `Retry-After`) another fork into it is under way.
    SessionExists { busy: Option<std::time::Duration> },
    /// Any other problem, with its code's own detail.
    Code(ProblemCode),
}

/// RFC 9457 problem document.
#[derive(Debug, Serialize, ToSchema)]
pub struct Problem {
    /// `urn:turnstore:problem:<code>`
    #[serde(rename = "type")]
    #[schema(format = "uri", example = "urn:turnstore:problem:turn_not_found")]
    pub kind: String,
    /// Short and the same for every problem of a code.
    #[schema(example = "Turn not found")]
    pub title: &'static str,
    /// The HTTP status, repeated.
    #[schema(minimum = 400, maximum = 599, example = 404)]
    pub status: u16,
    /// What happened, for a human; never an internal error's text.
    pub detail: String,
    /// Stable and machine-readable: branch on this.
    pub code: ProblemCode,
    /// With `validation_failed`: every invalid field.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub errors: Option<Vec<FieldError>>,
}

impl ApiError {
    pub const UNAUTHORIZED: ApiError = ApiError::Code(ProblemCode::Unauthorized);
    pub const INTERNAL: ApiError = ApiError::Code(ProblemCode::Internal);

    pub fn field(field: impl Into<String>, message: impl Display) -> Self {
        ApiError::Validation(vec![FieldError {
            field: field.into(),
            message: message.to_string(),
        }])
    }

    pub fn code(&self) -> ProblemCode {
        match self {
            ApiError::Validation(_) => ProblemCode::ValidationFailed,
            ApiError::PayloadTooLarge(_) => ProblemCode::PayloadTooLarge,
            ApiError::StoreUnready(_) | ApiError::StoreUnavailable(_) => {
                ProblemCode::StoreUnavailable
            }
            ApiError::TooManyPendingTurns { .. } => ProblemCode::TooManyPendingTurns,
            ApiError::TooManyExports { .. } => ProblemCode::TooManyExports,
            ApiError::SummaryConflict { .. } | ApiError::SessionReplaced => {
                ProblemCode::SummaryConflict
            }
            ApiError::Template(_) => ProblemCode::TemplateError,
            ApiError::UnknownModel(_) => ProblemCode::UnknownModel,
            ApiError::TurnSummarized { .. } => ProblemCode::TurnSummarized,
            ApiError::SessionExists { .. } => ProblemCode::SessionExists,
            ApiError::Code(code) => *code,
        }
    }

    /// The problem document this error answers with.
    pub fn problem(self) -> Problem {
        let code = self.code();
        let (status, title, detail) = code.describe();
        let (detail, errors) = match self {
            ApiError::Validation(errors) => (
                match errors.as_slice() {
                    [one] => format!("{}: {}", one.field, one.message),
                    many => format!("{} fields are invalid", many.len()),
                },
                Some(errors),
            ),
            ApiError::PayloadTooLarge(detail) | ApiError::StoreUnready(detail) => (detail, None),
            ApiError::Template(detail) => (detail, None),
            ApiError::UnknownModel(model) => (
                format!(
                    "model `{model}` is in no model table: send `encoding`, or add a line \
                     `{model} = <encoding>` to the file TURNSTORE_MODELS names; nothing was written"
                ),
                None,
            ),
            ApiError::StoreUnavailable(detail) => (detail.to_owned(), None),
            ApiError::SummaryConflict { stored } => (
                format!(
                    "the stored summary covers through seq {stored} (0: there is none); nothing was written"
                ),
                None,
            ),
            ApiError::TurnSummarized { through } => (
                format!(
                    "the session's summary covers through seq {through}, this turn included: \
                     delete the summary (or write one that covers less) first; nothing was written"
                ),
                None,
            ),
            ApiError::SessionExists { busy: Some(_) } => (
                "another fork into this session id is under way; retry after Retry-After \
                 seconds (with the same Idempotency-Key, a retry completes an attempt \
                 that stopped); nothing was written"
                    .to_owned(),
                None,
            ),
            ApiError::SessionExists { busy: None } => (detail.to_owned(), None),
            ApiError::SessionReplaced => (
                "the session is not the generation this write expected: it was cleared, \
                 erased or expired since it was read (and may have been started again); \
                 nothing was written"
                    .to_owned(),
                None,
            ),
            ApiError::TooManyPendingTurns { .. }
            | ApiError::TooManyExports { .. }
            | ApiError::Code(_) => (detail.to_owned(), None),
        };
        Problem {
            kind: format!("urn:turnstore:problem:{}", code.name()),
            title,
            status: status.as_u16(),
            detail,
            code,
            errors,
        }
    }
}

impl From<ProblemCode> for ApiError {
    fn from(code: ProblemCode) -> Self {
        ApiError::Code(code)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let retry_after = match &self {
            ApiError::TooManyPendingTurns { retry_after }
            | ApiError::TooManyExports { retry_after }
            | ApiError::SessionExists {
                busy: Some(retry_after),
            } => Some(retry_after.as_millis().div_ceil(1000).max(1) as u64),
            _ => None,
        };
        let problem = self.problem();
        let status =
            StatusCode::from_u16(problem.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
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
            StoreError::OwnerMismatch => ProblemCode::SessionOwnerMismatch.into(),
            StoreError::IdempotencyKeyReused => ProblemCode::IdempotencyKeyReused.into(),
            StoreError::TurnNotFound => ProblemCode::TurnNotFound.into(),
            StoreError::TurnPending => ProblemCode::TurnPending.into(),
            StoreError::SessionNotFound => ProblemCode::SessionNotFound.into(),
            StoreError::SessionExists { busy } => ApiError::SessionExists { busy },
            StoreError::ForkBeyond { newest } => ApiError::field(
                "through_seq",
                format!("must be at most the newest finalized seq ({newest})"),
            ),
            StoreError::ForkEmpty { oldest } => ApiError::field(
                "through_seq",
                match oldest {
                    0 => "the session has no finalized turn to fork".to_owned(),
                    _ => format!(
                        "must be at least the oldest finalized seq ({oldest}): a fork copies a turn at least"
                    ),
                },
            ),
            StoreError::TurnSummarized { through } => ApiError::TurnSummarized { through },
            StoreError::TooManyPendingTurns { retry_after } => {
                ApiError::TooManyPendingTurns { retry_after }
            }
            StoreError::SummaryConflict { stored } => ApiError::SummaryConflict { stored },
            StoreError::SessionReplaced => ApiError::SessionReplaced,
            StoreError::Template(e) => ApiError::Template(format!("the template failed: {e}")),
            StoreError::SummaryBeyond { newest } => ApiError::field(
                "through_seq",
                format!("must be at most the newest finalized seq ({newest})"),
            ),
            StoreError::SummaryOverPending { pending } => ApiError::field(
                "through_seq",
                format!(
                    "must be below {pending}: turn {pending} is still pending, and a summary \
                     may not cover a turn that may yet be finalized"
                ),
            ),
            StoreError::Unavailable(outage) => {
                tracing::warn!(cause = %outage.said, class = outage.class.label(), "store unavailable");
                ApiError::StoreUnavailable(outage.class.detail())
            }
            StoreError::Corrupt(cause) => {
                tracing::error!(%cause, "unreadable store data");
                ApiError::INTERNAL
            }
        }
    }
}

impl From<BytesRejection> for ApiError {
    fn from(rej: BytesRejection) -> Self {
        if rej.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ProblemCode::PayloadTooLarge.into()
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
