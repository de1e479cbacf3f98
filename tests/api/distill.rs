//! Distilled imports (`mode: "distill"`): transcripts as OpenAI and
//! Anthropic agent loops write them (fixtures written by hand from the two
//! API references), each exchange kept as its question and final answer,
//! what was dropped reported, timestamps kept, all or nothing; and an
//! export as messages (`format=messages`), which imports back unchanged.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::{Backend, TestApp, error_fields, ok_json, problem, sid};

conformance!(
    an_openai_agent_loop_keeps_its_questions_and_final_answers,
    an_anthropic_tool_loop_keeps_its_questions_and_final_answers,
    timestamps_become_the_turns_times,
    bad_transcripts_are_named_by_index_and_write_nothing,
    a_distilled_import_replays_with_its_report,
    an_export_as_messages_imports_back_as_it_was,
);

const OPENAI: &str = include_str!("../fixtures/transcripts/openai_agent_loop.json");
const ANTHROPIC: &str = include_str!("../fixtures/transcripts/anthropic_tool_loop.json");

fn fixture(text: &str) -> Value {
    serde_json::from_str(text).unwrap()
}

fn distill(messages: Value) -> Value {
    json!({"user_id": "ivy", "mode": "distill", "messages": messages})
}

impl TestApp {
    /// Every turn of `session`: (question, answer, started_at, finalized_at).
    async fn kept(&self, session: &str) -> Vec<(String, String, String, String)> {
        let h = self
            .history_ok(session, "format=turns&limit=1000&max_tokens=10000000")
            .await;
        h["turns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                let s = |k: &str| t[k].as_str().unwrap().to_owned();
                (
                    s("user_query"),
                    s("final_answer"),
                    s("started_at"),
                    s("finalized_at"),
                )
            })
            .collect()
    }
}

fn pairs(kept: &[(String, String, String, String)]) -> Vec<(&str, &str)> {
    kept.iter()
        .map(|(q, a, _, _)| (q.as_str(), a.as_str()))
        .collect()
}

async fn an_openai_agent_loop_keeps_its_questions_and_final_answers(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let s = sid();
    let res = app.import(&s, distill(fixture(OPENAI))).await;
    let body = ok_json(res, StatusCode::CREATED).await;
    assert_eq!(
        body,
        json!({
            "session_id": s, "user_id": "ivy", "imported_turns": 3, "first_seq": 1, "last_seq": 3,
            "dropped": [
                {"reason": "instructions", "count": 2, "first_indexes": [0, 1]},
                {"reason": "tool_result", "count": 4, "first_indexes": [4, 9, 10, 14]},
                {"reason": "tool_call", "count": 2, "first_indexes": [3, 8]},
                {"reason": "refusal", "count": 1, "first_indexes": [13]},
                {"reason": "non_text", "count": 3, "first_indexes": [2, 7, 16]},
                {"reason": "unanswered", "count": 1, "first_indexes": [16]}
            ]
        })
    );
    let kept = app.kept(&s).await;
    assert_eq!(
        pairs(&kept),
        [
            (
                "How do I rotate an API key?",
                "Open Settings > API keys and choose Rotate; the old key keeps working for 24 hours."
            ),
            (
                "And if it leaked?\n\nIt was in a public repository.",
                "Revoke it at once (done),\n\nthen audit the usage log for the last 24 hours."
            ),
            (
                "Can you show me the key?",
                "I can't show secrets; rotate it again to get a new one."
            ),
        ]
    );
    // Without timestamps, the turns are as old as the import.
    let (_, _, started, finalized) = &kept[0];
    assert_eq!(started, finalized);
    // Nothing else was kept: no pending turn, the next start is seq 4.
    let info = ok_json(app.session(&s).await, StatusCode::OK).await;
    assert_eq!(
        (&info["turn_count"], &info["pending_count"]),
        (&json!(3), &json!(0)),
        "{info}"
    );
    let t = app
        .started(json!({"session_id": s, "user_query": "q"}))
        .await;
    assert_eq!(t["seq"], 4);
}

async fn an_anthropic_tool_loop_keeps_its_questions_and_final_answers(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let s = sid();
    let res = app.import(&s, distill(fixture(ANTHROPIC))).await;
    let body = ok_json(res, StatusCode::CREATED).await;
    assert_eq!(body["imported_turns"], 2, "{body}");
    assert_eq!(
        body["dropped"],
        json!([
            {"reason": "tool_result", "count": 2, "first_indexes": [2, 5]},
            {"reason": "tool_call", "count": 2, "first_indexes": [1, 5]},
            {"reason": "thinking", "count": 2, "first_indexes": [1, 5]},
            {"reason": "non_text", "count": 1, "first_indexes": [4]},
            {"reason": "superseded", "count": 1, "first_indexes": [1]}
        ])
    );
    assert_eq!(
        pairs(&app.kept(&s).await),
        [
            (
                "What's the weather like in San Francisco?",
                "It's 15 °C in San Francisco, with fog."
            ),
            (
                "Is this the Golden Gate Bridge?",
                "Yes: the Golden Gate Bridge, seen from the Marin side."
            ),
        ]
    );
    // Strict pairs distil to themselves, and nothing is dropped.
    let s2 = sid();
    let strict = json!([
        {"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"}
    ]);
    let body = ok_json(app.import(&s2, distill(strict)).await, StatusCode::CREATED).await;
    assert_eq!(body["dropped"], json!([]));
    // A strict import says nothing of drops.
    let s3 = sid();
    let strict = json!({"messages": [
        {"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"}
    ]});
    let body = ok_json(app.import(&s3, strict).await, StatusCode::CREATED).await;
    assert!(body.get("dropped").is_none(), "{body}");
}

async fn timestamps_become_the_turns_times(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let s = sid();
    let messages = json!([
        {"role": "system", "content": "Be brief.", "timestamp": "2026-11-20T08:59:00Z"},
        {"role": "user", "content": "Hello?", "timestamp": "2026-11-20T09:00:00Z"},
        {"role": "orchestrator", "content": "Routing to the docs agent.", "timestamp": "2026-11-20T09:00:01Z"},
        {"role": "assistant", "content": "Hello! How can I help?", "timestamp": "2026-11-20T10:00:04.250+01:00"},
        {"role": "user", "content": "Bye.", "timestamp": "2026-11-20T09:05:00Z"},
        {"role": "assistant", "content": "Goodbye.", "timestamp": "2026-11-20T09:05:00.5Z"}
    ]);
    let body = ok_json(app.import(&s, distill(messages)).await, StatusCode::CREATED).await;
    assert_eq!(
        body["dropped"],
        json!([
            {"reason": "instructions", "count": 1, "first_indexes": [0]},
            {"reason": "superseded", "count": 1, "first_indexes": [2]}
        ])
    );
    let kept = app.kept(&s).await;
    let times: Vec<(&str, &str)> = kept
        .iter()
        .map(|(_, _, a, b)| (a.as_str(), b.as_str()))
        .collect();
    assert_eq!(
        times,
        [
            ("2026-11-20T09:00:00.000Z", "2026-11-20T09:00:04.250Z"),
            ("2026-11-20T09:05:00.000Z", "2026-11-20T09:05:00.500Z"),
        ]
    );
    // Times going back, in the future, or given for one exchange only:
    // named, and nothing is written.
    let s2 = sid();
    for (messages, field) in [
        (
            json!([
                {"role": "user", "content": "q", "timestamp": "2026-11-20T09:00:00Z"},
                {"role": "assistant", "content": "a", "timestamp": "2026-11-20T08:00:00Z"}
            ]),
            "messages[1].timestamp",
        ),
        (
            json!([
                {"role": "user", "content": "q", "timestamp": "2999-01-01T00:00:00Z"},
                {"role": "assistant", "content": "a", "timestamp": "2999-01-01T00:00:01Z"}
            ]),
            "messages[0].timestamp",
        ),
        (
            json!([
                {"role": "user", "content": "q", "timestamp": "20 Nov 2026"},
                {"role": "assistant", "content": "a"}
            ]),
            "messages[0].timestamp",
        ),
        (
            json!([
                {"role": "user", "content": "q1", "timestamp": "2026-11-20T09:00:00Z"},
                {"role": "assistant", "content": "a1", "timestamp": "2026-11-20T09:00:01Z"},
                {"role": "user", "content": "q2"},
                {"role": "assistant", "content": "a2"}
            ]),
            "messages[2].timestamp",
        ),
    ] {
        let p = problem(
            app.import(&s2, distill(messages.clone())).await,
            422,
            "validation_failed",
        )
        .await;
        assert!(error_fields(&p).contains(&field), "{messages}: {p}");
    }
    assert_eq!(app.session(&s2).await.status(), 404);
}

async fn bad_transcripts_are_named_by_index_and_write_nothing(backend: Backend) {
    let app = TestApp::spawn_with(backend, |s| {
        s.max_turns = 2;
        s.max_query_bytes = 16;
    })
    .await;
    let s = sid();
    let user = |c: &str| json!({"role": "user", "content": c});
    let assistant = |c: &str| json!({"role": "assistant", "content": c});
    // Every malformed message is named at once.
    let p = problem(
        app.import(
            &s,
            distill(json!([
                "hello",
                {"content": "no role"},
                {"role": "user", "content": 42},
                {"role": "wizard", "content": "hi"},
                {"role": "user", "content": [{"text": "no type"}]},
                {"role": "user", "content": [{"type": "text"}]}
            ])),
        )
        .await,
        422,
        "validation_failed",
    )
    .await;
    assert_eq!(
        error_fields(&p),
        [
            "messages[0]",
            "messages[1].role",
            "messages[2].content",
            "messages[3].role",
            "messages[4].content",
            "messages[5].content"
        ],
        "{p}"
    );
    for (messages, field) in [
        // Nothing to import: instructions, an unanswered question.
        (
            json!([{"role": "system", "content": "s"}, user("q")]),
            "messages",
        ),
        (json!([]), "messages"),
        // More exchanges than TURNSTORE_MAX_TURNS.
        (
            json!([
                user("1"),
                assistant("1"),
                user("2"),
                assistant("2"),
                user("3"),
                assistant("3")
            ]),
            "messages",
        ),
    ] {
        let p = problem(
            app.import(&s, distill(messages.clone())).await,
            422,
            "validation_failed",
        )
        .await;
        assert_eq!(error_fields(&p), [field], "{messages}: {p}");
    }
    // Two user messages that fit alone make a question too large: a 413
    // naming the first.
    let p = problem(
        app.import(
            &s,
            distill(json!([
                user("0123456789"),
                user("0123456789"),
                assistant("a")
            ])),
        )
        .await,
        413,
        "payload_too_large",
    )
    .await;
    assert!(
        p["detail"]
            .as_str()
            .unwrap()
            .starts_with("messages[0].content"),
        "{p}"
    );
    // An unknown mode; and strict mode still refuses what distill reads.
    let p = problem(
        app.import(
            &s,
            json!({"mode": "fuzzy", "messages": [user("q"), assistant("a")]}),
        )
        .await,
        422,
        "validation_failed",
    )
    .await;
    assert_eq!(error_fields(&p), ["mode"], "{p}");
    let p = problem(
        app.import(&s, json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "q"}]}, assistant("a")]}))
            .await,
        422,
        "validation_failed",
    )
    .await;
    assert_eq!(error_fields(&p), ["messages[0].content"], "{p}");
    let p = problem(
        app.import(&s, json!({"messages": [user("q"), {"role": "assistant", "content": "a", "timestamp": "2026-11-20T09:00:00Z"}]}))
            .await,
        422,
        "validation_failed",
    )
    .await;
    assert_eq!(error_fields(&p), ["messages[1].timestamp"], "{p}");
    assert_eq!(app.session(&s).await.status(), 404);
}

async fn a_distilled_import_replays_with_its_report(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let s = sid();
    let body = distill(fixture(ANTHROPIC));
    let first = app.import_with_key(&s, "k1", body.clone()).await;
    let first = ok_json(first, StatusCode::CREATED).await;
    let again = app.import_with_key(&s, "k1", body.clone()).await;
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(ok_json(again, StatusCode::OK).await, first);
    // The same key with other messages is another request.
    let mut other = body.clone();
    other["messages"].as_array_mut().unwrap().pop();
    let other = app.import_with_key(&s, "k1", other).await;
    problem(other, 422, "idempotency_key_reused").await;
    assert_eq!(app.kept(&s).await.len(), 2);
}

async fn an_export_as_messages_imports_back_as_it_was(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let user = format!("u{}", &sid()[2..10]);
    let s = sid();
    let messages = json!([
        {"role": "user", "content": "Hello?", "timestamp": "2026-11-20T09:00:00Z"},
        {"role": "assistant", "content": "Hi.", "timestamp": "2026-11-20T09:00:04.250Z"},
        {"role": "user", "content": "Bye.", "timestamp": "2026-11-20T09:05:00Z"},
        {"role": "assistant", "content": "Goodbye.", "timestamp": "2026-11-20T09:05:00.5Z"}
    ]);
    let body = json!({"user_id": user, "mode": "distill", "messages": messages});
    ok_json(app.import(&s, body).await, StatusCode::CREATED).await;
    app.put_summary(&s, json!({"summary": "Greetings.", "through_seq": 1}))
        .await;
    let export = |query: &'static str| {
        let url = app.url(&format!("/v1/users/{user}/export{query}"));
        let http = app.http.clone();
        async move { http.get(url).send().await.unwrap() }
    };
    let res = export("?format=messages").await;
    assert_eq!(res.status(), 200);
    let text = res.text().await.unwrap();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1, "{text}");
    let line = &lines[0];
    assert_eq!(line["session_id"], s);
    assert_eq!(line["summary"]["summary"], "Greetings.", "{line}");
    assert!(line.get("turns").is_none(), "{line}");
    assert_eq!(
        line["messages"],
        json!([
            {"role": "user", "content": "Hello?", "timestamp": "2026-11-20T09:00:00.000Z"},
            {"role": "assistant", "content": "Hi.", "timestamp": "2026-11-20T09:00:04.250Z"},
            {"role": "user", "content": "Bye.", "timestamp": "2026-11-20T09:05:00.000Z"},
            {"role": "assistant", "content": "Goodbye.", "timestamp": "2026-11-20T09:05:00.500Z"}
        ])
    );
    // Imported back, the same turns at the same times.
    let s2 = sid();
    let back = json!({"mode": "distill", "messages": line["messages"]});
    let body = ok_json(app.import(&s2, back).await, StatusCode::CREATED).await;
    assert_eq!(body["dropped"], json!([]));
    assert_eq!(app.kept(&s2).await, app.kept(&s).await);
    // The default is `turns`; another format, or parameter, is a 422.
    let res = export("?format=turns").await;
    let line: Value =
        serde_json::from_str(res.text().await.unwrap().lines().next().unwrap()).unwrap();
    assert_eq!(line["turns"].as_array().unwrap().len(), 2);
    for (query, field) in [("?format=csv", "format"), ("?limit=3", "limit")] {
        let p = problem(export(query).await, 422, "validation_failed").await;
        assert_eq!(error_fields(&p), [field], "{query}: {p}");
    }
}
