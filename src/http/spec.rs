//! The OpenAPI 3.1 document. utoipa derives it from the handlers; this
//! module adds what is declared once elsewhere: each problem code's status,
//! title and example (`ProblemCode`), the problems each operation answers
//! with, the identifier schemas, and the bounds and defaults the settings
//! and constants hold, so the document describes this server as configured.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde_json::{Value, json};
use utoipa::openapi::schema::{ObjectBuilder, Schema, SchemaFormat, Type};
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::openapi::{KnownFormat, RefOr};
use utoipa::{Modify, OpenApi, PartialSchema, ToSchema};

use super::error::{ApiError, ProblemCode};
use super::history::{MAX_CHARS, MAX_LIMIT, MAX_MODEL_CHARS, MAX_SEQ, MAX_TOKENS};
use super::users::{DEFAULT_PAGE, MAX_PAGE};
use crate::config::Settings;
use crate::domain::{IDENTIFIER_PATTERN, IdempotencyKey, SessionId, TextError, TurnId, UserId};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "turnstore",
        description = "Conversation history for LLM and RAG backends. Start a turn with the user's question (the reply carries the history for the prompt), then finalize it with the final answer; only those question/answer pairs are kept. Histories are bounded by turns and by exact tiktoken counts, rendered as text, chat messages or turns.\n\nErrors are RFC 9457 problem documents (`application/problem+json`) with a stable `code`. When API keys are configured, every `/v1` route needs `Authorization: Bearer <key>`. Every response carries `x-request-id`."
    ),
    servers(
        (url = "/", description = "The server this document is served from"),
        (url = "http://127.0.0.1:8080", description = "A local turnstore (`cargo run --release`)"),
    ),
    components(schemas(IdempotencyKey, super::exports::ExportedTranscript)),
    modifiers(&BearerAuth),
    tags(
        (name = "turns", description = "A RAG request's two calls: start a turn with the user's question (getting the history for the prompt), then finalize it with the answer, or abort it when the pipeline fails."),
        (name = "sessions", description = "A session's history, rendered and budgeted for a prompt; its details; clearing it."),
        (name = "summaries", description = "A session's rolling summary of its older turns: written by a client (compare-and-set on what it covers) or the server's summarizer; histories with `summary=true` begin with it."),
        (name = "import-export", description = "Transcripts made elsewhere, appended as finalized turns (all or nothing); a user's sessions exported as NDJSON (session replay, data portability)."),
        (name = "users", description = "A user's sessions, listed page by page, and their erasure (right to erasure)."),
        (name = "operations", description = "Liveness, readiness and metrics, for probes and scrapers; never behind authentication."),
    )
)]
pub struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
        );
    }
}

/// A client-given identifier's schema.
fn identifier(description: &str, example: &str) -> RefOr<Schema> {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .description(Some(description))
        .pattern(Some(IDENTIFIER_PATTERN))
        .min_length(Some(1))
        .max_length(Some(128))
        .examples([example])
        .into()
}

macro_rules! identifier_schema {
    ($ty:ty, $description:expr, $example:expr) => {
        impl PartialSchema for $ty {
            fn schema() -> RefOr<Schema> {
                identifier($description, $example)
            }
        }

        impl ToSchema for $ty {
            fn name() -> Cow<'static, str> {
                Cow::Borrowed(stringify!($ty))
            }
        }
    };
}

identifier_schema!(
    SessionId,
    "A conversation: client-chosen, or a UUID v4 the server made.",
    "chat-42"
);
identifier_schema!(UserId, "The owner of sessions.", "alice");
identifier_schema!(
    IdempotencyKey,
    "Makes a retried start return the turn the first try made.",
    "start-7f3e9c1a"
);

impl PartialSchema for TurnId {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::Uuid)))
            .description(Some(
                "A turn: a UUID v7 the server made (ids sort by start time).",
            ))
            .examples(["0193a6f4-5c2e-7b1a-9a41-2f6d8e0c4b7a"])
            .into()
    }
}

impl ToSchema for TurnId {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("TurnId")
    }
}

/// The problems every API operation may answer with.
const EVERY_OPERATION: &[ProblemCode] = &[
    ProblemCode::Unauthorized,
    ProblemCode::ValidationFailed,
    ProblemCode::Internal,
    ProblemCode::StoreUnavailable,
    ProblemCode::RequestTimeout,
    ProblemCode::Overloaded,
];

/// The problems of each API operation besides those of every one.
const OPERATIONS: &[(&str, &[ProblemCode])] = &[
    (
        "start_turn",
        &[
            ProblemCode::SessionOwnerMismatch,
            ProblemCode::PayloadTooLarge,
            ProblemCode::IdempotencyKeyReused,
            ProblemCode::TooManyPendingTurns,
            ProblemCode::TemplateNotFound,
            ProblemCode::TemplateError,
            ProblemCode::UnknownModel,
        ],
    ),
    (
        "finalize_turn",
        &[
            ProblemCode::TurnNotFound,
            ProblemCode::TurnAlreadyFinalized,
            ProblemCode::PayloadTooLarge,
        ],
    ),
    (
        "regenerate_turn",
        &[
            ProblemCode::TurnNotFound,
            ProblemCode::TurnPending,
            ProblemCode::TurnSummarized,
            ProblemCode::PayloadTooLarge,
        ],
    ),
    ("abort_turn", &[ProblemCode::TurnNotFound]),
    (
        "fork",
        &[
            ProblemCode::SessionNotFound,
            ProblemCode::SessionOwnerMismatch,
            ProblemCode::SessionExists,
            ProblemCode::IdempotencyKeyReused,
        ],
    ),
    (
        "get_history",
        &[
            ProblemCode::NotAcceptable,
            ProblemCode::TemplateNotFound,
            ProblemCode::TemplateError,
            ProblemCode::UnknownModel,
        ],
    ),
    ("get_session", &[ProblemCode::SessionNotFound]),
    ("clear_session", &[]),
    (
        "put_summary",
        &[
            ProblemCode::SessionOwnerMismatch,
            ProblemCode::SummaryConflict,
            ProblemCode::PayloadTooLarge,
        ],
    ),
    ("get_summary", &[ProblemCode::SummaryNotFound]),
    (
        "import",
        &[
            ProblemCode::SessionOwnerMismatch,
            ProblemCode::PayloadTooLarge,
            ProblemCode::IdempotencyKeyReused,
        ],
    ),
    ("delete_summary", &[]),
    ("list_user_sessions", &[]),
    ("export", &[ProblemCode::TooManyExports]),
    ("erase_user", &[]),
];

/// The document as this server serves it, for `settings`; `keyed`: the
/// server has API keys. The second value lists the places a bound was meant
/// for and not found (empty unless the derived document changed shape; a
/// test keeps it empty).
///
/// The document is written for code generators run with their defaults
/// (openapi-python-client, openapi-typescript; `scripts/check-openapi` and
/// the TypeScript client's `check-generated` run them and fail on any
/// warning): see `security`, `export_for_generators` and `bounds`.
pub fn document(
    derived: utoipa::openapi::OpenApi,
    settings: &Settings,
    keyed: bool,
) -> (Value, Vec<String>) {
    let mut doc = serde_json::to_value(derived).unwrap_or_else(|_| json!({}));
    let mut missed = Vec::new();
    problem_responses(&mut doc, &mut missed);
    security(&mut doc, keyed);
    links(&mut doc, &mut missed);
    export_for_generators(&mut doc, &mut missed);
    bounds(&mut doc, settings, &mut missed);
    (doc, missed)
}

/// `doc` with the names of the tokenizers this server loaded among the
/// encodings it takes (and reports).
pub fn with_tokenizers<'a>(mut doc: Value, names: impl Iterator<Item = &'a str>) -> Value {
    if let Some(Value::Array(known)) = doc.pointer_mut("/components/schemas/Encoding/enum") {
        known.extend(names.map(|n| Value::String(n.to_owned())));
    }
    doc
}

/// What the `/v1` operations require: the bearer key when this server has
/// keys (`[{"bearer": []}]`), nothing otherwise (no `security`), as the
/// server enforces it. Not `[{}, {"bearer": []}]` ("optional") for both:
/// generators read any `security` as required (openapi-python-client then
/// demands an `AuthenticatedClient` for every call), so a keyless server
/// would need a key to be called. The `bearer` scheme stays described in
/// `components` either way. The checked-in `openapi/openapi.json` is the
/// default settings' document: no keys.
fn security(doc: &mut Value, keyed: bool) {
    for (id, _) in OPERATIONS {
        let Some(op) = operation(doc, id).and_then(Value::as_object_mut) else {
            continue; // problem_responses reported it
        };
        if keyed {
            op.insert("security".into(), json!([{"bearer": []}]));
        } else {
            op.remove("security");
        }
    }
}

/// The export streams `application/x-ndjson`, a media type
/// openapi-python-client does not know: with that key alone it leaves the
/// export's response out of the client it generates (with a warning). The
/// 200 also lists `application/octet-stream`, a binary string of that same
/// NDJSON, which it reads as bytes; the description says the server sends
/// `application/x-ndjson` whatever the `Accept`.
fn export_for_generators(doc: &mut Value, missed: &mut Vec<String>) {
    let Some(ok) = operation(doc, "export").map(|op| &mut op["responses"]["200"]) else {
        missed.push("operation export".into());
        return;
    };
    let Some(content) = ok["content"].as_object_mut() else {
        missed.push("export 200 content".into());
        return;
    };
    // A line is an `ExportedSession`, or with `format=messages` an
    // `ExportedTranscript`.
    match content.get_mut("application/x-ndjson") {
        Some(ndjson) => {
            ndjson["schema"] = json!({"oneOf": [
                {"$ref": "#/components/schemas/ExportedSession"},
                {"$ref": "#/components/schemas/ExportedTranscript"},
            ]});
        }
        None => missed.push("export 200 application/x-ndjson".into()),
    }
    content.insert(
        "application/octet-stream".into(),
        json!({"schema": {
            "type": "string",
            "format": "binary",
            "contentMediaType": "application/x-ndjson",
            "description": "The same body, as bytes: one `ExportedSession` (or, with `format=messages`, `ExportedTranscript`) a line.",
        }}),
    );
    let said = ok["description"].as_str().unwrap_or_default();
    ok["description"] = json!(format!(
        "{said}. Sent as `application/x-ndjson` whatever the request's `Accept`; \
         `application/octet-stream` describes the same bytes for generators that \
         know no NDJSON (openapi-python-client reads them as a file)."
    ));
}

/// Each operation's error responses, grouped by status, as references to
/// shared responses under `components/responses`, with an example of each
/// code.
fn problem_responses(doc: &mut Value, missed: &mut Vec<String>) {
    let mut shared = BTreeMap::new();
    for (id, own) in OPERATIONS {
        let Some(op) = operation(doc, id) else {
            missed.push(format!("operation {id}"));
            continue;
        };
        let mut by_status: BTreeMap<u16, Vec<ProblemCode>> = BTreeMap::new();
        for code in EVERY_OPERATION.iter().chain(own.iter()) {
            by_status
                .entry(code.status().as_u16())
                .or_default()
                .push(*code);
        }
        for (status, mut codes) in by_status {
            codes.sort();
            let name = codes
                .iter()
                .map(|c| pascal_case(c.name()))
                .collect::<Vec<_>>()
                .join("Or");
            op["responses"][status.to_string()] =
                json!({"$ref": format!("#/components/responses/{name}")});
            shared
                .entry(name)
                .or_insert_with(|| shared_response(&codes));
        }
    }
    doc["components"]["responses"] = json!(shared);
}

/// What a started turn leads to: its finalize or abort, and its session.
fn links(doc: &mut Value, missed: &mut Vec<String>) {
    let session = json!({"session_id": "$response.body#/session_id"});
    let turn = json!({
        "session_id": "$response.body#/session_id",
        "turn_id": "$response.body#/turn_id",
    });
    let links = json!({
        "finalize_turn": {
            "operationId": "finalize_turn",
            "parameters": turn,
            "description": "Finalize the started turn with the final answer.",
        },
        "abort_turn": {
            "operationId": "abort_turn",
            "parameters": turn,
            "description": "Abort the started turn when the pipeline fails.",
        },
        "get_history": {
            "operationId": "get_history",
            "parameters": session,
            "description": "Read the session's history.",
        },
        "get_session": {
            "operationId": "get_session",
            "parameters": session,
            "description": "Read the session's details.",
        },
    });
    match operation(doc, "start_turn") {
        Some(start) => {
            for status in ["200", "201"] {
                start["responses"][status]["links"] = links.clone();
            }
        }
        None => missed.push("operation start_turn".into()),
    }
}

fn shared_response(codes: &[ProblemCode]) -> Value {
    let description = codes
        .iter()
        .map(|c| format!("`{}`: {}.", c.name(), c.describe().2))
        .collect::<Vec<_>>()
        .join(" ");
    let examples: BTreeMap<&str, Value> = codes
        .iter()
        .map(|c| (c.name(), json!({"value": example_problem(*c)})))
        .collect();
    let mut response = json!({
        "description": description,
        "content": {
            "application/problem+json": {
                "schema": {"$ref": "#/components/schemas/Problem"},
                "examples": examples,
            }
        }
    });
    let retry_after = if codes.contains(&ProblemCode::TooManyPendingTurns) {
        Some(
            "Seconds until the oldest pending turn expires (a finalize or abort frees a place sooner)",
        )
    } else if codes.contains(&ProblemCode::TooManyExports) {
        Some("Seconds to wait before asking again (an export frees its place when it ends)")
    } else {
        None
    };
    if let Some(description) = retry_after {
        response["headers"] = json!({
            "Retry-After": {
                "description": description,
                "schema": {"type": "integer", "minimum": 1},
            }
        });
    }
    response
}

/// A problem of `code` as the server sends it.
fn example_problem(code: ProblemCode) -> Value {
    let error = match code {
        ProblemCode::ValidationFailed => ApiError::field("user_query", TextError::Empty),
        ProblemCode::PayloadTooLarge => ApiError::PayloadTooLarge(format!(
            "user_query {}",
            TextError::TooLarge { max_bytes: 32768 }
        )),
        code => ApiError::from(code),
    };
    serde_json::to_value(error.problem()).unwrap_or_default()
}

fn pascal_case(snake: &str) -> String {
    snake
        .split('_')
        .map(|w| {
            let mut cs = w.chars();
            cs.next()
                .map(|c| c.to_ascii_uppercase().to_string() + cs.as_str())
                .unwrap_or_default()
        })
        .collect()
}

/// The operation with this `operationId`.
fn operation<'a>(doc: &'a mut Value, id: &str) -> Option<&'a mut Value> {
    doc["paths"]
        .as_object_mut()?
        .values_mut()
        .filter_map(Value::as_object_mut)
        .flat_map(|item| item.values_mut())
        .find(|op| op["operationId"] == id)
}

/// A parameter of an operation.
fn parameter_object<'a>(doc: &'a mut Value, id: &str, name: &str) -> Option<&'a mut Value> {
    operation(doc, id)?["parameters"]
        .as_array_mut()?
        .iter_mut()
        .find(|p| p["name"] == name)
}

/// The schema of a parameter of an operation.
fn parameter<'a>(doc: &'a mut Value, id: &str, name: &str) -> Option<&'a mut Value> {
    parameter_object(doc, id, name).map(|p| &mut p["schema"])
}

fn append_description(place: &mut Value, more: &str) {
    if more.is_empty() {
        return;
    }
    let description = place["description"].as_str().unwrap_or_default();
    place["description"] = json!(format!("{description}{more}").trim_start());
}

/// A property of a component schema.
fn property<'a>(doc: &'a mut Value, schema: &str, name: &str) -> Option<&'a mut Value> {
    doc.pointer_mut(&format!("/components/schemas/{schema}/properties/{name}"))
}

/// Bounds and defaults from the settings and the constants that enforce them.
fn bounds(doc: &mut Value, settings: &Settings, missed: &mut Vec<String>) {
    let user_id = IDENTIFIER_PATTERN
        .trim_start_matches('^')
        .trim_end_matches('$');
    // Defaults a server's settings may change are stated in words, not as
    // `default`: generated clients would send a `default` explicitly and
    // override another server's setting.
    let configured =
        |value: String, setting: &str| format!(" Default on this server: {value} (`{setting}`).");
    let history = [
        (
            "limit",
            json!({"maximum": MAX_LIMIT}),
            configured(
                settings.history_limit.to_string(),
                "TURNSTORE_HISTORY_LIMIT",
            ),
        ),
        (
            "max_tokens",
            json!({"maximum": MAX_TOKENS}),
            configured(
                settings.history_max_tokens.to_string(),
                "TURNSTORE_HISTORY_MAX_TOKENS",
            ),
        ),
        ("format", json!({"default": "text"}), String::new()),
        (
            "encoding",
            json!({}),
            configured(
                format!("`{}`", settings.encoding.name()),
                "TURNSTORE_ENCODING",
            ),
        ),
        (
            "model",
            json!({"maxLength": MAX_MODEL_CHARS}),
            String::new(),
        ),
        (
            "max_query_chars",
            json!({"maximum": MAX_CHARS}),
            String::new(),
        ),
        (
            "max_answer_chars",
            json!({"maximum": MAX_CHARS}),
            String::new(),
        ),
        ("keep_first", json!({"default": false}), String::new()),
        (
            "after_seq",
            json!({"default": 0, "maximum": MAX_SEQ}),
            String::new(),
        ),
        ("through_seq", json!({"maximum": MAX_SEQ}), String::new()),
    ];
    let mut apply = |place: String, target: Option<&mut Value>, values: Value| match target {
        Some(t) => {
            if let (Some(t), Some(values)) = (t.as_object_mut(), values.as_object()) {
                t.extend(values.clone());
            }
        }
        None => missed.push(place),
    };
    for schema in [
        "StartTurnRequest",
        "ImportRequest",
        "PutSummaryRequest",
        "ForkRequest",
    ] {
        apply(
            format!("{schema}.user_id"),
            property(doc, schema, "user_id"),
            json!({"pattern": format!("^({user_id})?$"), "maxLength": 128}),
        );
    }
    // Texts are limited in UTF-8 bytes: as many characters at most.
    let (query, answer) = (
        settings.max_query_bytes as u64,
        settings.max_answer_bytes as u64,
    );
    let texts = [
        ("StartTurnRequest", "user_query", query),
        ("StartTurnRequest", "user_query_en", query),
        ("FinalizeTurnRequest", "final_answer", answer),
        ("FinalizeTurnRequest", "final_answer_en", answer),
        ("PutSummaryRequest", "summary", settings.max_summary_bytes),
    ];
    for (schema, name, bytes) in texts {
        apply(
            format!("{schema}.{name}"),
            property(doc, schema, name),
            json!({"maxLength": bytes}),
        );
    }
    // A transcript message's content, when a string: a question or an answer.
    apply(
        "TranscriptContent.oneOf[0]".into(),
        doc.pointer_mut("/components/schemas/TranscriptContent/oneOf/0"),
        json!({"maxLength": query.max(answer)}),
    );
    for (name, values, default) in history {
        // The schema (a start's `history`) states even a fixed default in
        // words: openapi-typescript, by default, makes a property with a
        // `default` required, as a response would always carry it, and a
        // start would have to spell out every option. Parameters keep it.
        let mut on_schema = values.clone();
        let fixed = on_schema
            .as_object_mut()
            .and_then(|v| v.remove("default"))
            .map(|v| match v {
                Value::String(s) => format!(" Default: `{s}`."),
                v => format!(" Default: `{v}`."),
            });
        if let Some(p) = property(doc, "HistoryParams", name) {
            append_description(p, fixed.as_deref().unwrap_or(&default));
        }
        apply(
            format!("HistoryParams.{name}"),
            property(doc, "HistoryParams", name),
            on_schema,
        );
        if let Some(p) = parameter_object(doc, "get_history", name) {
            append_description(p, &default);
        }
        apply(
            format!("get_history?{name}"),
            parameter(doc, "get_history", name),
            values,
        );
    }
    apply(
        "list_user_sessions?limit".into(),
        parameter(doc, "list_user_sessions", "limit"),
        json!({"maximum": MAX_PAGE, "default": DEFAULT_PAGE}),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_place_the_document_is_given_exists() {
        for keyed in [false, true] {
            let (_, missed) = document(crate::http::routes().2, &Settings::default(), keyed);
            assert!(missed.is_empty(), "{missed:?}");
        }
    }

    #[test]
    fn names_join_codes() {
        assert_eq!(pascal_case("store_unavailable"), "StoreUnavailable");
    }
}
