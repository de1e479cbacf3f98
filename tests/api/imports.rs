//! Import and export (API.md v1.1): transcripts appended all or nothing,
//! with index-qualified errors and idempotency; a user's sessions streamed
//! as NDJSON.

use std::time::Duration;

use reqwest::{Response, StatusCode};
use serde_json::{Value, json};

use crate::support::{Backend, TestApp, count, error_fields, ok_json, problem, seqs, sid};

conformance!(
    a_transcript_becomes_finalized_turns,
    bad_transcripts_name_the_message_and_write_nothing,
    imports_are_retry_safe_with_a_key,
    an_import_replay_counts_an_empty_user_id_as_absent,
    imports_append_claim_and_trim_like_turns,
    a_users_sessions_are_exported_in_order_with_their_turns,
    an_import_frees_what_it_trims_a_page_at_a_time,
);

impl TestApp {
    pub(crate) async fn import_with_key(&self, session: &str, key: &str, body: Value) -> Response {
        self.http
            .post(self.url(&format!("/v1/sessions/{session}/import")))
            .header("idempotency-key", key)
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    /// The export of a user: each line parsed.
    async fn export(&self, user: &str) -> Vec<Value> {
        let res = self
            .http
            .get(self.url(&format!("/v1/users/{user}/export")))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
        assert_eq!(res.headers()["content-type"], "application/x-ndjson");
        let body = res.text().await.unwrap();
        assert!(body.is_empty() || body.ends_with('\n'), "{body}");
        body.lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    }
}

/// `n` user/assistant pairs "q<i>" / "a<i>".
fn transcript(n: usize) -> Vec<Value> {
    (1..=n)
        .flat_map(|i| {
            [
                json!({"role": "user", "content": format!("q{i}")}),
                json!({"role": "assistant", "content": format!("a{i}")}),
            ]
        })
        .collect()
}

async fn a_transcript_becomes_finalized_turns(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let s = sid();

    let res = app
        .import(&s, json!({"user_id": "ivy", "messages": transcript(3)}))
        .await;
    let body = ok_json(res, StatusCode::CREATED).await;

    assert_eq!(
        body,
        json!({"session_id": s, "user_id": "ivy", "imported_turns": 3, "first_seq": 1, "last_seq": 3})
    );
    let h = app.history_ok(&s, "").await;
    let expected = "### Conversation history:\nUser: q1\nAssistant: a1\n\n\
        User: q2\nAssistant: a2\n\nUser: q3\nAssistant: a3";
    assert_eq!(h["rendered"], expected);
    assert_eq!(h["token_count"], count("o200k_base", expected));
    assert_eq!(h["user_id"], "ivy");
    let listed = app.all_user_sessions("ivy", 10).await;
    assert_eq!(listed, std::slice::from_ref(&s));
    // The next start continues the seqs.
    let t = app
        .started(json!({"session_id": s, "user_query": "q4"}))
        .await;
    assert_eq!(t["seq"], 4);
}

async fn bad_transcripts_name_the_message_and_write_nothing(backend: Backend) {
    let app = TestApp::spawn_with(backend, |s| {
        s.max_turns = 3;
        s.max_query_bytes = 16;
    })
    .await;
    let s = sid();
    let user = |c: &str| json!({"role": "user", "content": c});
    let assistant = |c: &str| json!({"role": "assistant", "content": c});
    for (messages, field) in [
        (vec![user("q"), user("q")], "messages[1].role"),
        (vec![assistant("a"), user("q")], "messages[0].role"),
        (
            vec![user("q"), json!({"role": "system", "content": "s"})],
            "messages[1].role",
        ),
        (
            vec![json!({"role": "tool", "content": "t"}), assistant("a")],
            "messages[0].role",
        ),
        (vec![user("q"), assistant("a"), user("q")], "messages[2]"),
        (vec![user(" "), assistant("a")], "messages[0].content"),
        (vec![user("q"), assistant("")], "messages[1].content"),
        (vec![], "messages"),
        (
            serde_json::from_value(json!(transcript(4))).unwrap(),
            "messages",
        ),
    ] {
        let body = json!({"messages": messages});
        let p = problem(app.import(&s, body.clone()).await, 422, "validation_failed").await;
        assert!(error_fields(&p).contains(&field), "{body}: {p}");
    }
    // An odd transcript ending on an assistant message: its role is wrong,
    // and nothing else is said of it.
    let p = problem(
        app.import(
            &s,
            json!({"messages": [user("q"), assistant("a"), assistant("b")]}),
        )
        .await,
        422,
        "validation_failed",
    )
    .await;
    assert_eq!(p["errors"].as_array().unwrap().len(), 1, "{p}");
    assert_eq!(p["errors"][0]["field"], "messages[2].role", "{p}");
    // Every wrong message is named, not only the first.
    let p = problem(
        app.import(&s, json!({"messages": [assistant("a"), user("q")]}))
            .await,
        422,
        "validation_failed",
    )
    .await;
    assert_eq!(p["errors"].as_array().unwrap().len(), 2, "{p}");
    let p = problem(
        app.import(
            &s,
            json!({"messages": [user(&"x".repeat(17)), assistant("a")]}),
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
    problem(
        app.import(&s, json!({"messages": [{"role": "user"}]}))
            .await,
        422,
        "validation_failed",
    )
    .await;
    // Nothing was written.
    assert_eq!(app.session(&s).await.status(), 404);
}

async fn imports_are_retry_safe_with_a_key(backend: Backend) {
    let app = TestApp::spawn_with(backend, |s| s.max_turns = 2).await;
    let s = sid();
    let body = json!({"messages": transcript(2)});

    let first = ok_json(
        app.import_with_key(&s, "imp-1", body.clone()).await,
        StatusCode::CREATED,
    )
    .await;
    let again = app.import_with_key(&s, "imp-1", body.clone()).await;
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(ok_json(again, StatusCode::OK).await, first);
    assert_eq!(app.history_ok(&s, "").await["total_turns"], 2);
    problem(
        app.import_with_key(&s, "imp-1", json!({"messages": transcript(1)}))
            .await,
        422,
        "idempotency_key_reused",
    )
    .await;
    // A start may not take an import's key, nor an import a start's.
    problem(
        app.start_with_key("imp-1", json!({"session_id": s, "user_query": "q"}))
            .await,
        422,
        "idempotency_key_reused",
    )
    .await;
    app.start_with_key("st-1", json!({"session_id": s, "user_query": "q"}))
        .await;
    problem(
        app.import_with_key(&s, "st-1", body.clone()).await,
        422,
        "idempotency_key_reused",
    )
    .await;
    // The key outlives the turns it made (trimmed by a later import).
    app.import(&s, json!({"messages": transcript(2)})).await;
    let replay = app.import_with_key(&s, "imp-1", body).await;
    assert_eq!(ok_json(replay, StatusCode::OK).await, first);
}

/// `"user_id": ""` counts as absent, like `null`, in an import's replay too.
async fn an_import_replay_counts_an_empty_user_id_as_absent(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let s = sid();
    let body = |user_id: Option<Value>| {
        let mut b = json!({"messages": transcript(2)});
        if let Some(u) = user_id {
            b["user_id"] = u;
        }
        b
    };
    let first = ok_json(
        app.import_with_key(&s, "imp-absent", body(None)).await,
        StatusCode::CREATED,
    )
    .await;
    let other = ok_json(
        app.import_with_key(&s, "imp-empty", body(Some(json!(""))))
            .await,
        StatusCode::CREATED,
    )
    .await;

    let replays = [
        ("imp-absent", first.clone(), Some(json!(""))),
        ("imp-absent", first.clone(), Some(Value::Null)),
        ("imp-empty", other.clone(), None),
        ("imp-empty", other.clone(), Some(Value::Null)),
    ];
    for (key, made, user_id) in replays {
        let replay = app.import_with_key(&s, key, body(user_id.clone())).await;
        assert_eq!(replay.status(), 200, "{key} {user_id:?}");
        assert_eq!(replay.headers()["idempotent-replayed"], "true");
        assert_eq!(
            ok_json(replay, StatusCode::OK).await,
            made,
            "{key} {user_id:?}"
        );
    }
    let named = app
        .import_with_key(&s, "imp-absent", body(Some(json!("alice"))))
        .await;
    problem(named, 422, "idempotency_key_reused").await;
    assert_eq!(app.history_ok(&s, "").await["total_turns"], 4);
}

async fn imports_append_claim_and_trim_like_turns(backend: Backend) {
    let app = TestApp::spawn_with(backend, |s| s.max_turns = 4).await;
    let s = sid();
    app.complete(&s, "before", "answer").await;
    let pending = app
        .started(json!({"session_id": s, "user_query": "pending"}))
        .await;

    let res = app.import(&s, json!({"messages": transcript(4)})).await;
    let body = ok_json(res, StatusCode::CREATED).await;
    assert_eq!(
        (body["first_seq"].clone(), body["last_seq"].clone()),
        (json!(3), json!(6))
    );
    let h = app.history_ok(&s, "format=turns").await;
    assert_eq!(seqs(&h), [3, 4, 5, 6], "the oldest went first");
    assert_eq!(h["pending_turns"], 1);
    // The pending turn finalizes at its own seq, older than the imported.
    let res = app
        .finalize(&s, pending["turn_id"].as_str().unwrap(), "late")
        .await;
    assert_eq!(res.status(), 200);
    // Ownership as in a start.
    let owned = sid();
    app.import(&owned, json!({"user_id": "uma", "messages": transcript(1)}))
        .await;
    problem(
        app.import(
            &owned,
            json!({"user_id": "other", "messages": transcript(1)}),
        )
        .await,
        403,
        "session_owner_mismatch",
    )
    .await;
    let res = app.import(&owned, json!({"messages": transcript(1)})).await;
    assert_eq!(ok_json(res, StatusCode::CREATED).await["user_id"], "uma");
}

async fn a_users_sessions_are_exported_in_order_with_their_turns(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    assert_eq!(app.export("nobody").await, Vec::<Value>::new());
    let (old, big, new) = (sid(), sid(), sid());
    app.import(&old, json!({"user_id": "eve", "messages": transcript(2)}))
        .await;
    // More turns than an export reads a call, and English copies.
    app.import(&big, json!({"user_id": "eve", "messages": transcript(300)}))
        .await;
    let t = app
        .started(
            json!({"session_id": new, "user_id": "eve", "user_query": "Wie?",
                        "user_query_en": "How?"}),
        )
        .await;
    app.finalize(&new, t["turn_id"].as_str().unwrap(), "So.")
        .await;
    app.http
        .put(app.url(&format!("/v1/sessions/{old}/summary")))
        .json(&json!({"summary": "two turns", "through_seq": 2}))
        .send()
        .await
        .unwrap();
    app.started(json!({"session_id": new, "user_query": "pending, not exported"}))
        .await;

    let lines = app.export("eve").await;

    let listed = app.all_user_sessions("eve", 10).await;
    let exported: Vec<&str> = lines
        .iter()
        .map(|l| l["session_id"].as_str().unwrap())
        .collect();
    assert_eq!(exported, listed);
    let by_id = |id: &str| lines.iter().find(|l| l["session_id"] == id).unwrap();
    let big_turns = by_id(&big)["turns"].as_array().unwrap();
    assert_eq!(big_turns.len(), 300);
    assert!(
        big_turns
            .iter()
            .enumerate()
            .all(|(i, t)| t["seq"] == i as u64 + 1 && t["user_query"] == format!("q{}", i + 1))
    );
    assert_eq!(by_id(&old)["summary"]["summary"], "two turns");
    assert!(by_id(&big).get("summary").is_none());
    let new_line = by_id(&new);
    assert_eq!(new_line["turns"].as_array().unwrap().len(), 1);
    assert_eq!(new_line["turns"][0]["user_query_en"], "How?");
    assert!(chrono::DateTime::parse_from_rfc3339(new_line["created_at"].as_str().unwrap()).is_ok());

    // An export that outlives TURNSTORE_EXPORT_TIMEOUT ends cut: the client
    // sees an error, not a short export. The client stalls, and the export
    // (16 MiB) is more than the channel and the sockets' buffers hold, so
    // it cannot end in time.
    let slow =
        TestApp::spawn_with(backend, |s| s.export_timeout = Duration::from_millis(200)).await;
    let answer = "a".repeat(16 * 1024);
    let messages: Vec<Value> = (0..48)
        .flat_map(|_| {
            [
                json!({"role": "user", "content": "q"}),
                json!({"role": "assistant", "content": answer}),
            ]
        })
        .collect();
    for _ in 0..22 {
        let res = slow
            .import(&sid(), json!({"user_id": "zed", "messages": messages}))
            .await;
        assert_eq!(res.status(), 201);
    }
    let res = slow
        .http
        .get(slow.url("/v1/users/zed/export"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        res.text().await.is_err(),
        "a cut export must not read as complete"
    );
}

/// `n` user/assistant pairs "q<i>" / "a<i>" from `from`.
fn pairs(from: usize, n: usize) -> Vec<Value> {
    (from..from + n)
        .flat_map(|i| {
            [
                json!({"role": "user", "content": format!("q{i}")}),
                json!({"role": "assistant", "content": format!("a{i}")}),
            ]
        })
        .collect()
}

async fn an_import_frees_what_it_trims_a_page_at_a_time(backend: Backend) {
    let app = TestApp::spawn_with(backend, |s| s.max_turns = 300).await;
    let s = sid();
    let first = app.import(&s, json!({"messages": pairs(1, 300)})).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let old = app
        .history_ok(&s, "format=turns&limit=1&through_seq=1")
        .await;
    let oldest = old["turns"][0]["turn_id"].as_str().unwrap().to_owned();
    let monitor = app.redis.as_ref().map(|r| r.monitor());

    // 300 more: the 300 oldest go.
    let res = app.import(&s, json!({"messages": pairs(301, 300)})).await;
    assert_eq!(res.status(), StatusCode::CREATED);

    let h = app
        .history_ok(&s, "format=turns&limit=1000&max_tokens=10000000")
        .await;
    assert_eq!(h["total_turns"], 300);
    assert_eq!(seqs(&h).first(), Some(&301));
    assert_eq!(app.abort(&s, &oldest).await.status(), StatusCode::NOT_FOUND);
    if backend != Backend::Memory {
        // Every trimmed record is freed: one field a turn is left.
        let key = format!("{}:{{{s}}}:r", app.settings.key_prefix);
        let fields: u64 = app
            .on_every_redis(&["HLEN", &key])
            .iter()
            .filter_map(|n| n.trim().parse::<u64>().ok())
            .sum();
        assert_eq!(fields, 300);
    }
    if let Some(monitor) = monitor {
        // No call freed more than 128 turns' records (4 fields each).
        let widest = monitor
            .lines()
            .iter()
            .filter(|l| l.contains("lua]") && l.contains(r#""HDEL""#))
            .map(|l| l.matches(r#"" ""#).count())
            .max()
            .unwrap_or(0);
        assert!(widest <= 1 + 4 * 128, "an HDEL of {widest} arguments");
    }
}
