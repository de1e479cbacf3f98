//! The checked-in spec is what the server serves, and says what it does.
//! Regenerate it with `cargo run -q -- openapi > openapi/openapi.json`.
//! (`scripts/check-openapi` validates it, checks every example against its
//! schema and generates a Python client from it.)

use serde_json::{Value, json};
use turnstore::tokens::Encoding;
use turnstore::{Application, Settings};

const CHECKED_IN: &str = include_str!("../openapi/openapi.json");

async fn served(settings: Settings) -> Value {
    let settings = Settings {
        listen: "127.0.0.1:0".parse().unwrap(),
        ..settings
    };
    let app = Application::build(settings).await.expect("build");
    let url = format!("http://127.0.0.1:{}/openapi.json", app.port());
    tokio::spawn(app.run_until_stopped(std::future::pending::<()>()));
    reqwest::get(&url).await.unwrap().json().await.unwrap()
}

fn checked_in() -> Value {
    serde_json::from_str(CHECKED_IN).unwrap()
}

#[tokio::test]
async fn served_spec_matches_the_checked_in_file() {
    assert!(
        served(Settings::default()).await == checked_in(),
        "openapi/openapi.json is stale: run `cargo run -q -- openapi > openapi/openapi.json`"
    );
}

#[tokio::test]
async fn served_spec_states_this_servers_bounds_and_defaults() {
    let spec = served(Settings {
        max_query_bytes: 1000,
        max_answer_bytes: 5000,
        max_summary_bytes: 700,
        history_limit: 7,
        history_max_tokens: 999,
        encoding: Encoding::Cl100kBase,
        ..Settings::default()
    })
    .await;
    let schemas = &spec["components"]["schemas"];
    // Every text a client sends states its bound.
    for (schema, field, bound) in [
        ("StartTurnRequest", "user_query", 1000),
        ("StartTurnRequest", "user_query_en", 1000),
        ("FinalizeTurnRequest", "final_answer", 5000),
        ("FinalizeTurnRequest", "final_answer_en", 5000),
        ("PutSummaryRequest", "summary", 700),
    ] {
        assert_eq!(
            schemas[schema]["properties"][field]["maxLength"], bound,
            "{schema}.{field}"
        );
    }
    // An imported message's content, when a string (a question or an answer).
    assert_eq!(
        schemas["TranscriptContent"]["oneOf"][0]["maxLength"], 5000,
        "TranscriptContent"
    );
    for schema in ["StartTurnRequest", "ImportRequest", "PutSummaryRequest"] {
        let user = &schemas[schema]["properties"]["user_id"];
        assert_eq!(user["maxLength"], 128, "{schema}");
        assert!(user["pattern"].is_string(), "{schema}");
    }
    // Configurable defaults are stated in words: a `default` would be sent
    // by generated clients, overriding the setting of another server.
    let history = &schemas["HistoryParams"]["properties"];
    let described = |v: &Value| v["description"].as_str().unwrap().to_owned();
    assert!(
        described(&history["limit"])
            .ends_with("Default on this server: 7 (`TURNSTORE_HISTORY_LIMIT`).")
    );
    assert!(described(&history["max_tokens"]).contains(": 999 ("));
    assert!(described(&history["encoding"]).contains("`cl100k_base`"));
    let params = spec["paths"]["/v1/sessions/{session_id}/history"]["get"]["parameters"]
        .as_array()
        .unwrap();
    let limit = params.iter().find(|p| p["name"] == "limit").unwrap();
    assert!(described(limit).contains(": 7 ("));
    assert_eq!(limit["schema"]["maximum"], 10_000);
    assert!(limit["schema"].get("default").is_none());
}

/// Generators read any `security` as required: a server declares the
/// bearer key exactly when it has keys, and its operations then require it.
#[tokio::test]
async fn served_spec_requires_the_key_only_when_the_server_has_keys() {
    let keyed = served(Settings {
        api_keys: vec!["k1".into()],
        ..Settings::default()
    })
    .await;
    let open = served(Settings::default()).await;
    for spec in [&keyed, &open] {
        assert_eq!(
            spec["components"]["securitySchemes"]["bearer"],
            serde_json::json!({"type": "http", "scheme": "bearer"})
        );
        assert!(spec.get("security").is_none());
    }
    let mut v1 = 0;
    for ((path, with), (_, without)) in operations(&keyed).zip(operations(&open)) {
        if path.starts_with("/v1/") {
            v1 += 1;
            assert_eq!(
                with["security"],
                serde_json::json!([{"bearer": []}]),
                "{path}"
            );
        } else {
            assert!(with.get("security").is_none(), "{path}");
        }
        assert!(without.get("security").is_none(), "{path}");
    }
    assert_eq!(v1, 15);
}

/// The shapes code generators run with their defaults trip on (see
/// scripts/check-openapi and clients/typescript/scripts/generate.mjs).
#[test]
fn spec_suits_generators_defaults() {
    let spec = checked_in();
    // openapi-python-client knows no NDJSON: the export also offers the
    // same bytes as application/octet-stream, which it reads as a file.
    let export = &spec["paths"]["/v1/users/{user_id}/export"]["get"]["responses"]["200"];
    let content = export["content"].as_object().unwrap();
    assert_eq!(
        content.keys().collect::<Vec<_>>(),
        ["application/x-ndjson", "application/octet-stream"]
    );
    // A line: a session with its turns, or (`format=messages`) a transcript.
    assert_eq!(
        content["application/x-ndjson"]["schema"]["oneOf"],
        json!([
            {"$ref": "#/components/schemas/ExportedSession"},
            {"$ref": "#/components/schemas/ExportedTranscript"}
        ])
    );
    let bytes = &content["application/octet-stream"]["schema"];
    assert_eq!(bytes["format"], "binary");
    assert_eq!(bytes["contentMediaType"], "application/x-ndjson");
    assert!(
        export["description"]
            .as_str()
            .unwrap()
            .contains("Sent as `application/x-ndjson` whatever")
    );
    // openapi-typescript makes a schema property with a `default` required:
    // a start's `history` states its defaults in words. The query
    // parameters keep theirs (no generator requires a parameter for it).
    let history = spec["components"]["schemas"]["HistoryParams"]["properties"]
        .as_object()
        .unwrap();
    for (name, property) in history {
        assert!(property.get("default").is_none(), "HistoryParams.{name}");
    }
    assert!(
        history["format"]["description"]
            .as_str()
            .unwrap()
            .ends_with("Default: `text`.")
    );
    let params = spec["paths"]["/v1/sessions/{session_id}/history"]["get"]["parameters"]
        .as_array()
        .unwrap();
    let format = params.iter().find(|p| p["name"] == "format").unwrap();
    assert_eq!(format["schema"]["default"], "text");
}

#[test]
fn spec_names_every_operation() {
    let spec = checked_in();
    assert!(spec["openapi"].as_str().unwrap().starts_with("3.1"));
    let mut ids: Vec<&str> = operations(&spec)
        .map(|(_, op)| op["operationId"].as_str().unwrap())
        .collect();
    ids.sort();
    assert_eq!(
        ids,
        [
            "abort_turn",
            "clear_session",
            "delete_summary",
            "erase_user",
            "export",
            "finalize_turn",
            "fork",
            "get_history",
            "get_session",
            "get_summary",
            "healthz",
            "import",
            "list_user_sessions",
            "put_summary",
            "readyz",
            "regenerate_turn",
            "start_turn",
        ]
    );
}

fn operations(spec: &Value) -> impl Iterator<Item = (&str, &Value)> {
    spec["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, item)| {
            item.as_object()
                .unwrap()
                .values()
                .map(move |op| (path.as_str(), op))
        })
}

/// The problem codes an operation documents for a status, read through the
/// shared responses' examples.
fn codes(spec: &Value, op: &Value, status: &str) -> Vec<String> {
    let reference = op["responses"][status]["$ref"]
        .as_str()
        .unwrap_or_else(|| panic!("{} has no shared {status} response", op["operationId"]));
    let name = reference.rsplit('/').next().unwrap();
    let examples =
        &spec["components"]["responses"][name]["content"]["application/problem+json"]["examples"];
    examples.as_object().unwrap().keys().cloned().collect()
}

#[test]
fn every_api_operation_documents_its_problems() {
    let spec = checked_in();
    for (path, op) in operations(&spec).filter(|(p, _)| p.starts_with("/v1/")) {
        for (status, code) in [
            ("401", "unauthorized"),
            ("422", "validation_failed"),
            ("500", "internal"),
            ("503", "store_unavailable"),
            ("503", "request_timeout"),
            ("503", "overloaded"),
        ] {
            assert!(
                codes(&spec, op, status).contains(&code.to_owned()),
                "{path}: {status} lacks {code}"
            );
        }
        // This document is a keyless server's: nothing to present.
        assert!(op.get("security").is_none(), "{path}: {}", op["security"]);
    }
    let start = &spec["paths"]["/v1/turns"]["post"];
    assert_eq!(codes(&spec, start, "429"), ["too_many_pending_turns"]);
    assert_eq!(codes(&spec, start, "403"), ["session_owner_mismatch"]);
    assert_eq!(
        codes(&spec, start, "422"),
        [
            "idempotency_key_reused",
            "template_error",
            "unknown_model",
            "validation_failed"
        ]
    );
    assert_eq!(codes(&spec, start, "404"), ["template_not_found"]);
    let finalize = &spec["paths"]["/v1/sessions/{session_id}/turns/{turn_id}/finalize"]["post"];
    assert_eq!(codes(&spec, finalize, "404"), ["turn_not_found"]);
    assert_eq!(codes(&spec, finalize, "409"), ["turn_already_finalized"]);
    let history = &spec["paths"]["/v1/sessions/{session_id}/history"]["get"];
    assert_eq!(codes(&spec, history, "406"), ["not_acceptable"]);
    assert_eq!(codes(&spec, history, "404"), ["template_not_found"]);
    assert_eq!(
        codes(&spec, history, "422"),
        ["template_error", "unknown_model", "validation_failed"]
    );
    assert!(history["responses"]["200"]["content"]["text/plain"].is_object());
}

/// Ids carry their pattern or format wherever they appear.
#[test]
fn ids_are_precise() {
    let spec = checked_in();
    let schemas = &spec["components"]["schemas"];
    for id in ["SessionId", "UserId", "IdempotencyKey"] {
        assert_eq!(
            schemas[id]["pattern"], "^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$",
            "{id}"
        );
    }
    assert_eq!(schemas["TurnId"]["format"], "uuid");
    assert_eq!(
        schemas["Turn"]["properties"]["turn_id"]["$ref"],
        "#/components/schemas/TurnId"
    );
    assert_eq!(
        schemas["Turn"]["properties"]["started_at"]["format"],
        "date-time"
    );
    assert_eq!(
        schemas["Role"]["enum"],
        serde_json::json!(["system", "user", "assistant"])
    );
    for (path, op) in operations(&spec) {
        for p in op["parameters"].as_array().into_iter().flatten() {
            if p["in"] == "path" {
                assert!(p["schema"]["$ref"].is_string(), "{path}: {}", p["name"]);
            }
        }
    }
}

/// The examples are what the server would answer: the history example's
/// `token_count` is the exact count of its rendering.
#[test]
fn the_history_example_counts_exactly() {
    let spec = checked_in();
    let example = &spec["components"]["schemas"]["HistoryResponse"]["example"];
    let rendered = example["rendered"].as_str().unwrap();
    assert_eq!(
        example["token_count"],
        Encoding::O200kBase.count(rendered),
        "{rendered}"
    );
}
