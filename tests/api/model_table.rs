//! `model=`: the operator's model table (`TURNSTORE_MODELS`), tiktoken's
//! table of OpenAI models, and what becomes of a model in neither.

use reqwest::StatusCode;
use serde_json::json;
use turnstore::tokens::UnknownModel;

use crate::support::{Backend, TestApp, count, ok_json, problem, sid};

conformance!(
    the_model_table_decides_the_encoding,
    an_unknown_model_is_refused_where_the_server_says_so,
);

/// A server with this model table, and how it treats unknown models.
async fn with_table(
    backend: Backend,
    table: &str,
    unknown: UnknownModel,
) -> (TestApp, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("models.txt");
    std::fs::write(&path, table).unwrap();
    let app = TestApp::spawn_with(backend, |s| {
        s.models = Some(path);
        s.unknown_model = unknown;
    })
    .await;
    (app, dir)
}

async fn the_model_table_decides_the_encoding(backend: Backend) {
    let (app, _dir) = with_table(
        backend,
        "# open models\nllama-3* = cl100k_base\nMistral* = p50k_base\ngpt-4o = r50k_base\n",
        UnknownModel::Default,
    )
    .await;
    let s = sid();
    app.complete(&s, "Count me: 12345 tokens?!", "Sure — 😀 here.\n")
        .await;

    for (model, encoding) in [
        ("llama-3-70b", "cl100k_base"),
        ("mistral-7b-instruct", "p50k_base"),
        ("gpt-4o", "r50k_base"),             // the operator's table first
        ("gpt-4", "cl100k_base"),            // then tiktoken's
        ("claude-3-5-sonnet", "o200k_base"), // unknown: the default
    ] {
        let h = app.history_ok(&s, &format!("model={model}")).await;
        assert_eq!(h["encoding"], encoding, "{model}: {h}");
        assert_eq!(
            h["token_count"],
            count(encoding, h["rendered"].as_str().unwrap()),
            "{model}: {h}"
        );
    }
    let started = app
        .started(json!({"session_id": s, "user_query": "q2",
                        "history": {"model": "Llama-3.1-8B-Instruct"}}))
        .await;
    assert_eq!(started["history"]["encoding"], "cl100k_base", "{started}");
    let h = app
        .history_ok(&s, "model=llama-3-70b&encoding=o200k_base")
        .await;
    assert_eq!(h["encoding"], "o200k_base", "encoding wins: {h}");

    let metrics = app.metrics().await;
    assert!(
        metrics.contains(r#"turnstore_unknown_models_total{outcome="default"} 1"#),
        "{metrics}"
    );
}

async fn an_unknown_model_is_refused_where_the_server_says_so(backend: Backend) {
    let (app, _dir) = with_table(backend, "llama-3* = cl100k_base\n", UnknownModel::Reject).await;
    let s = sid();
    app.complete(&s, "q1", "a1").await;

    let read = app.history(&s, "model=claude-3-5-sonnet").await;
    let start = app
        .start(json!({"session_id": s, "user_query": "q2",
                      "history": {"model": "claude-3-5-sonnet"}}))
        .await;

    let p = problem(read, 422, "unknown_model").await;
    let detail = p["detail"].as_str().unwrap();
    assert!(detail.contains("`claude-3-5-sonnet`"), "{p}");
    assert!(detail.contains("TURNSTORE_MODELS"), "{p}");
    problem(start, 422, "unknown_model").await;
    let info = ok_json(app.session(&s).await, StatusCode::OK).await;
    assert_eq!(
        (info["turn_count"].clone(), info["pending_count"].clone()),
        (json!(1), json!(0)),
        "the refused start wrote nothing: {info}"
    );
    for (query, encoding) in [
        ("model=llama-3-8b", "cl100k_base"),
        ("model=gpt-4o", "o200k_base"),
        ("model=claude-3-5-sonnet&encoding=p50k_base", "p50k_base"),
    ] {
        let h = app.history_ok(&s, query).await;
        assert_eq!(h["encoding"], encoding, "{query}: {h}");
    }
    let metrics = app.metrics().await;
    assert!(
        metrics.contains(r#"turnstore_unknown_models_total{outcome="refused"} 2"#),
        "{metrics}"
    );
}
