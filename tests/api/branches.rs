//! Branches of a conversation: regenerating an answer (a finalized turn's
//! answer replaced, its seq and question kept), and forks (a new session
//! made of another's turns through a seq, whole or not at all).

use reqwest::{Response, StatusCode};
use serde_json::{Value, json};

use crate::support::{Backend, TestApp, count, ok_json, problem, sid};

conformance!(
    a_regenerated_answer_replaces_the_old_one_in_place,
    a_regenerate_keeps_the_questions_english_copy_only,
    a_regenerate_refuses_summarized_pending_and_unknown_turns,
    regenerate_and_a_summary_write_race_to_one_order,
    a_fork_copies_the_turns_through_a_seq,
    a_fork_refuses_what_it_cannot_make_and_makes_nothing,
    a_fork_is_retry_safe_with_a_key,
    a_fork_of_many_pages_is_whole,
    a_fork_too_long_for_one_request_completes_over_retries,
    a_fork_and_a_clear_of_its_source_race_to_one_order,
);

impl TestApp {
    async fn regenerate(&self, session: &str, turn: &str, body: Value) -> Response {
        self.http
            .post(self.url(&format!("/v1/sessions/{session}/turns/{turn}/regenerate")))
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    async fn fork(&self, session: &str, body: Value, key: Option<&str>) -> Response {
        let mut req = self
            .http
            .post(self.url(&format!("/v1/sessions/{session}/fork")))
            .json(&body);
        if let Some(key) = key {
            req = req.header("idempotency-key", key);
        }
        req.send().await.unwrap()
    }

    /// Every finalized turn of `session`, whole.
    async fn all_turns(&self, session: &str) -> Vec<Value> {
        self.history_ok(session, EVERYTHING).await["turns"]
            .as_array()
            .unwrap()
            .clone()
    }

    async fn regenerated(&self, session: &str, turn: &Value, answer: &str) -> Value {
        let res = self
            .regenerate(
                session,
                turn["turn_id"].as_str().unwrap(),
                json!({"final_answer": answer}),
            )
            .await;
        ok_json(res, StatusCode::OK).await["turn"].clone()
    }
}

const EVERYTHING: &str = "format=turns&limit=1000&max_tokens=10000000";

async fn a_regenerated_answer_replaces_the_old_one_in_place(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let s = sid();
    let long_old = format!("Old answer two. {}", "old ".repeat(3000));
    let t1 = app.complete(&s, "Question one?", "Answer one.").await;
    let t2 = app.complete(&s, "Question two?", &long_old).await;
    let t3 = app.complete(&s, "Question three?", "Answer three.").await;
    let _ = t1;

    // An older turn (seq 2, a 12 KB answer for a short one) and the newest
    // (a short answer for a 16 KB one); each slides the session's TTL.
    let before = ok_json(app.session(&s).await, StatusCode::OK).await["expires_at"].clone();
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let new_three = format!("New three. {}", "new ".repeat(4000));
    let r2 = app.regenerated(&s, &t2, "New answer two.").await;
    let after = ok_json(app.session(&s).await, StatusCode::OK).await["expires_at"].clone();
    assert!(after.as_str() > before.as_str(), "the TTL did not slide");
    let r3 = app.regenerated(&s, &t3, &new_three).await;
    for (before, after) in [(&t2, &r2), (&t3, &r3)] {
        assert_eq!(after["seq"], before["seq"]);
        assert_eq!(after["turn_id"], before["turn_id"]);
        assert_eq!(after["user_query"], before["user_query"]);
        assert_eq!(after["started_at"], before["started_at"]);
        assert!(after["finalized_at"].as_str() >= before["finalized_at"].as_str());
    }
    assert_eq!(r2["final_answer"], "New answer two.");
    assert_eq!(r3["final_answer"], new_three.as_str());

    let h = app.history_ok(&s, EVERYTHING).await;
    let answers: Vec<&str> = h["turns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["final_answer"].as_str().unwrap())
        .collect();
    assert_eq!(
        answers,
        ["Answer one.", "New answer two.", new_three.as_str()]
    );
    // Counted exactly, whole and under a budget that cuts at the new costs.
    let text = format!(
        "### Conversation history:\nUser: Question one?\nAssistant: Answer one.\n\n\
         User: Question two?\nAssistant: New answer two.\n\nUser: Question three?\nAssistant: {new_three}"
    );
    let h = app.history_ok(&s, "limit=10").await;
    assert_eq!(h["rendered"], text.as_str());
    assert_eq!(h["token_count"], count("o200k_base", &text));
    let all = count("o200k_base", &text);
    let h = app
        .history_ok(&s, &format!("limit=10&max_tokens={all}"))
        .await;
    assert_eq!(h["stopped_by"], Value::Null);
    let h = app
        .history_ok(&s, &format!("limit=10&max_tokens={}", all - 1))
        .await;
    // One token short: the oldest turn is left out, at the new costs.
    assert_eq!(
        (&h["stopped_by"], &h["included_turns"]),
        (&json!("max_tokens"), &json!(2))
    );
    // The old answers are nowhere in the store.
    if backend != Backend::Memory {
        let key = format!("{}:{{{s}}}:r", app.settings.key_prefix);
        let stored = app.on_every_redis(&["HGETALL", &key]).join("\n");
        assert!(stored.contains("New answer two."));
        assert!(
            !stored.contains("Old answer two."),
            "the old answer is kept"
        );
        assert!(!stored.contains("Answer three."), "the old answer is kept");
    }
    // The session goes on: the next start is seq 4.
    let t = app
        .started(json!({"session_id": s, "user_query": "Four?"}))
        .await;
    assert_eq!(t["seq"], 4);
}

async fn a_regenerate_keeps_the_questions_english_copy_only(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let s = sid();
    let t = app
        .started(json!({"session_id": s, "user_query": "¿Qué es un índice?", "user_query_en": "What is an index?"}))
        .await;
    let turn = t["turn_id"].as_str().unwrap();
    let res = app
        .http
        .post(app.url(&format!("/v1/sessions/{s}/turns/{turn}/finalize")))
        .json(&json!({"final_answer": "Una estructura.", "final_answer_en": "A structure."}))
        .send()
        .await
        .unwrap();
    ok_json(res, StatusCode::OK).await;
    // Without a copy: the old answer's copy goes with it.
    let r = ok_json(
        app.regenerate(&s, turn, json!({"final_answer": "Un árbol."}))
            .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(r["turn"]["user_query_en"], "What is an index?", "{r}");
    assert!(
        r["turn"].get("final_answer_en").is_none_or(Value::is_null),
        "{r}"
    );
    let en = app.history_ok(&s, "lang=en").await;
    let text = "### Conversation history:\nUser: What is an index?\nAssistant: Un árbol.";
    assert_eq!(en["rendered"], text);
    assert_eq!(en["token_count"], count("o200k_base", text));
    // With one: the new answer's.
    let r = ok_json(
        app.regenerate(
            &s,
            turn,
            json!({"final_answer": "Un grafo.", "final_answer_en": "A graph."}),
        )
        .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(r["turn"]["final_answer_en"], "A graph.", "{r}");
    let en = app.history_ok(&s, "lang=en").await;
    let text = "### Conversation history:\nUser: What is an index?\nAssistant: A graph.";
    assert_eq!(en["rendered"], text);
    assert_eq!(en["token_count"], count("o200k_base", text));
    let original = app.history_ok(&s, "").await;
    assert_eq!(
        original["rendered"],
        "### Conversation history:\nUser: ¿Qué es un índice?\nAssistant: Un grafo."
    );
}

async fn a_regenerate_refuses_summarized_pending_and_unknown_turns(backend: Backend) {
    let app = TestApp::spawn_with(backend, |s| s.max_answer_bytes = 64).await;
    let s = sid();
    let t1 = app.complete(&s, "q1", "a1").await;
    let t2 = app.complete(&s, "q2", "a2").await;
    let t3 = app.complete(&s, "q3", "a3").await;
    ok_json(
        app.put_summary(&s, json!({"summary": "q1 and q2.", "through_seq": 2}))
            .await,
        StatusCode::OK,
    )
    .await;
    let id = |t: &Value| t["turn_id"].as_str().unwrap().to_owned();
    let answer = |a: &str| json!({"final_answer": a});
    let p = problem(
        app.regenerate(&s, &id(&t2), answer("b2")).await,
        409,
        "turn_summarized",
    )
    .await;
    assert!(
        p["detail"].as_str().unwrap().contains("through seq 2"),
        "{p}"
    );
    problem(
        app.regenerate(&s, &id(&t1), answer("b1")).await,
        409,
        "turn_summarized",
    )
    .await;
    let pending = app
        .started(json!({"session_id": s, "user_query": "q4"}))
        .await;
    problem(
        app.regenerate(&s, &id(&pending), answer("b4")).await,
        409,
        "turn_pending",
    )
    .await;
    let unknown = "0193a6f4-5c2e-7b1a-9a41-2f6d8e0c4b7a";
    problem(
        app.regenerate(&s, unknown, answer("b")).await,
        404,
        "turn_not_found",
    )
    .await;
    problem(
        app.regenerate(&sid(), &id(&t3), answer("b")).await,
        404,
        "turn_not_found",
    )
    .await;
    problem(
        app.regenerate(&s, &id(&t3), answer(" ")).await,
        422,
        "validation_failed",
    )
    .await;
    problem(
        app.regenerate(&s, &id(&t3), answer(&"x".repeat(65))).await,
        413,
        "payload_too_large",
    )
    .await;
    problem(
        app.regenerate(&s, &id(&t3), json!({"answer": "b3"})).await,
        422,
        "validation_failed",
    )
    .await;
    // Nothing changed.
    let h = app.history_ok(&s, EVERYTHING).await;
    let answers: Vec<&str> = h["turns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["final_answer"].as_str().unwrap())
        .collect();
    assert_eq!(answers, ["a1", "a2", "a3"]);
    // Without the summary, seq 2 may change.
    let res = app
        .http
        .delete(app.url(&format!("/v1/sessions/{s}/summary")))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    app.regenerated(&s, &t2, "b2").await;
    // A deleted turn is unknown.
    assert_eq!(
        app.abort(&s, &id(&t3)).await.status(),
        StatusCode::NO_CONTENT
    );
    problem(
        app.regenerate(&s, &id(&t3), answer("b3")).await,
        404,
        "turn_not_found",
    )
    .await;
}

async fn regenerate_and_a_summary_write_race_to_one_order(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    for round in 0..12 {
        let s = sid();
        app.complete(&s, "q1", "a1").await;
        let t2 = app.complete(&s, "q2", "a2").await;
        let turn = t2["turn_id"].as_str().unwrap().to_owned();
        let summary = json!({"summary": "both", "through_seq": 2, "expected_through_seq": 0});
        let (regenerated, summarized) = tokio::join!(
            app.regenerate(&s, &turn, json!({"final_answer": "b2"})),
            app.put_summary(&s, summary),
        );
        assert_eq!(summarized.status(), StatusCode::OK, "round {round}");
        let answer = app.history_ok(&s, EVERYTHING).await["turns"][1]["final_answer"].clone();
        match regenerated.status() {
            // Before the summary: the summary covers the new answer.
            StatusCode::OK => assert_eq!(answer, "b2", "round {round}"),
            // After: the summary covers the old one, which stays.
            StatusCode::CONFLICT => {
                problem(regenerated, 409, "turn_summarized").await;
                assert_eq!(answer, "a2", "round {round}");
            }
            other => panic!("round {round}: regenerate answered {other}"),
        }
    }
}

async fn a_fork_copies_the_turns_through_a_seq(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let (s, user) = (sid(), format!("u{}", &sid()[2..12]));
    for i in 1..=6 {
        let q = format!("Question {i}?");
        // A long answer (head and tail in Redis) and an English copy.
        let a = if i == 2 {
            format!("Long {}", "word ".repeat(2000))
        } else {
            format!("Answer {i}.")
        };
        let t = app
            .started(json!({"session_id": s, "user_id": user, "user_query": q, "user_query_en": format!("Q{i} in English")}))
            .await;
        let res = app
            .http
            .post(app.url(&format!(
                "/v1/sessions/{s}/turns/{}/finalize",
                t["turn_id"].as_str().unwrap()
            )))
            .json(&json!({"final_answer": a, "final_answer_en": format!("A{i} in English")}))
            .send()
            .await
            .unwrap();
        ok_json(res, StatusCode::OK).await;
    }
    ok_json(
        app.put_summary(&s, json!({"summary": "The first three.", "through_seq": 3}))
            .await,
        StatusCode::OK,
    )
    .await;
    // A pending turn is not copied.
    app.started(json!({"session_id": s, "user_query": "Pending?"}))
        .await;

    let f = sid();
    let res = app
        .fork(
            &s,
            json!({"new_session_id": f, "through_seq": 4, "user_id": user}),
            None,
        )
        .await;
    let body = ok_json(res, StatusCode::CREATED).await;
    assert_eq!(
        body,
        json!({"session_id": f, "forked_from": s, "user_id": user, "through_seq": 4,
               "copied_turns": 4, "summary": true})
    );
    let (source, fork) = (app.all_turns(&s).await, app.all_turns(&f).await);
    assert_eq!(fork, source[..4], "the same turns, ids, times and copies");
    for query in [
        "summary=true",
        "summary=true&lang=en",
        "format=messages&summary=true",
    ] {
        let a = app.history_ok(&s, &format!("{query}&through_seq=4")).await;
        let b = app.history_ok(&f, query).await;
        for field in [
            "rendered",
            "messages",
            "token_count",
            "summary",
            "unsummarized",
        ] {
            assert_eq!(a[field], b[field], "{query}: {field}");
        }
    }
    // Its own session: owned, listed, another generation; it goes on at 5.
    let info = ok_json(app.session(&f).await, StatusCode::OK).await;
    let source_info = ok_json(app.session(&s).await, StatusCode::OK).await;
    assert_eq!(
        (
            &info["user_id"],
            &info["turn_count"],
            &info["pending_count"]
        ),
        (&json!(user), &json!(4), &json!(0))
    );
    assert_ne!(info["generation"], source_info["generation"]);
    assert!(app.all_user_sessions(&user, 10).await.contains(&f));
    let t = app
        .started(json!({"session_id": f, "user_id": user, "user_query": "Fifth, edited?"}))
        .await;
    assert_eq!(t["seq"], 5);
    // The source is as it was.
    assert_eq!(app.all_turns(&s).await, source);
    assert_eq!(source_info["pending_count"], 1);

    // Through 2: the summary (through 3) stays behind. No through: all.
    let f2 = sid();
    let body = ok_json(
        app.fork(&s, json!({"new_session_id": f2, "through_seq": 2}), None)
            .await,
        StatusCode::CREATED,
    )
    .await;
    assert_eq!(
        (&body["copied_turns"], &body["summary"], &body["user_id"]),
        (&json!(2), &json!(false), &json!(user))
    );
    assert_eq!(
        app.history_ok(&f2, "summary=true").await["summary"],
        Value::Null
    );
    let f3 = sid();
    let body = ok_json(
        app.fork(&s, json!({"new_session_id": f3}), None).await,
        StatusCode::CREATED,
    )
    .await;
    assert_eq!(
        (&body["through_seq"], &body["copied_turns"]),
        (&json!(6), &json!(6))
    );
    assert_eq!(app.all_turns(&f3).await, source);
    // An unowned session's fork goes to the user who asks for it.
    let (u, f4) = (sid(), sid());
    app.complete(&u, "q", "a").await;
    let body = ok_json(
        app.fork(&u, json!({"new_session_id": f4, "user_id": "zoe"}), None)
            .await,
        StatusCode::CREATED,
    )
    .await;
    assert_eq!(body["user_id"], "zoe");
    let info = ok_json(app.session(&u).await, StatusCode::OK).await;
    assert_eq!(info["user_id"], Value::Null);
}

async fn a_fork_refuses_what_it_cannot_make_and_makes_nothing(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let s = sid();
    app.complete_as(&s, "ann", "q1", "a1").await;
    app.complete_as(&s, "ann", "q2", "a2").await;
    let taken = sid();
    app.complete(&taken, "q", "a").await;
    let f = sid();
    let fork = |body: Value| app.fork(&s, body, None);
    problem(
        app.fork(&sid(), json!({"new_session_id": f}), None).await,
        404,
        "session_not_found",
    )
    .await;
    problem(
        fork(json!({"new_session_id": f, "user_id": "bob"})).await,
        403,
        "session_owner_mismatch",
    )
    .await;
    problem(
        fork(json!({"new_session_id": taken})).await,
        409,
        "session_exists",
    )
    .await;
    for (body, field) in [
        (json!({"new_session_id": s}), "new_session_id"),
        (json!({"new_session_id": "bad id!"}), "new_session_id"),
        (
            json!({"new_session_id": f, "through_seq": 0}),
            "through_seq",
        ),
        (
            json!({"new_session_id": f, "through_seq": 3}),
            "through_seq",
        ),
        (json!({"new_session_id": f, "seq": 1}), "seq"),
        (json!({}), "new_session_id"),
    ] {
        let p = problem(fork(body.clone()).await, 422, "validation_failed").await;
        assert!(
            crate::support::error_fields(&p).contains(&field),
            "{body}: {p}"
        );
    }
    // Nothing to copy: only a pending turn, or every turn deleted.
    let (p1, p2) = (sid(), sid());
    app.started(json!({"session_id": p1, "user_query": "q"}))
        .await;
    let p = problem(
        app.fork(&p1, json!({"new_session_id": f}), None).await,
        422,
        "validation_failed",
    )
    .await;
    assert!(
        p["detail"].as_str().unwrap().contains("no finalized turn"),
        "{p}"
    );
    let t = app.complete(&p2, "q", "a").await;
    app.complete(&p2, "q2", "a2").await;
    app.abort(&p2, t["turn_id"].as_str().unwrap()).await;
    let p = problem(
        app.fork(&p2, json!({"new_session_id": f, "through_seq": 1}), None)
            .await,
        422,
        "validation_failed",
    )
    .await;
    assert!(
        p["detail"]
            .as_str()
            .unwrap()
            .contains("oldest finalized seq (2)"),
        "{p}"
    );
    // None of these made the fork, nor left anything a start would see.
    assert_eq!(app.session(&f).await.status(), 404);
    let t = app
        .started(json!({"session_id": f, "user_query": "q"}))
        .await;
    assert_eq!(t["seq"], 1);
    assert_eq!(app.history_ok(&f, EVERYTHING).await["total_turns"], 0);
}

async fn a_fork_is_retry_safe_with_a_key(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let s = sid();
    for i in 1..=3 {
        app.complete_as(&s, "ann", &format!("q{i}"), &format!("a{i}"))
            .await;
    }
    let f = sid();
    let body = json!({"new_session_id": f, "through_seq": 2});
    let first = ok_json(
        app.fork(&s, body.clone(), Some("k1")).await,
        StatusCode::CREATED,
    )
    .await;
    let again = app.fork(&s, body.clone(), Some("k1")).await;
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(ok_json(again, StatusCode::OK).await, first);
    // Even once the source is gone, a replay answers what was made.
    assert_eq!(app.clear(&s).await.status(), StatusCode::NO_CONTENT);
    let again = app.fork(&s, body.clone(), Some("k1")).await;
    assert_eq!(ok_json(again, StatusCode::OK).await, first);
    // Another body with the key, or another key: the id is taken.
    problem(
        app.fork(
            &s,
            json!({"new_session_id": f, "through_seq": 1}),
            Some("k1"),
        )
        .await,
        422,
        "idempotency_key_reused",
    )
    .await;
    problem(
        app.fork(&s, body.clone(), Some("k2")).await,
        409,
        "session_exists",
    )
    .await;
    problem(app.fork(&s, body, None).await, 409, "session_exists").await;
    if backend == Backend::Memory {
        return;
    }
    // An attempt that stopped half way (a killed instance) left staging:
    // while it may still be writing, another is told to wait; once it is
    // stale, a retry starts again and completes, and nothing of the old
    // staging remains.
    let s2 = sid();
    for i in 1..=3 {
        app.complete(&s2, &format!("q{i}"), &format!("a{i}")).await;
    }
    let f2 = sid();
    let prefix = format!("{}:{{{f2}}}:", app.settings.key_prefix);
    let now = turnstore::turn::now_millis();
    let stage = |touched: i64| {
        app.on_every_redis(&[
            "HSET",
            &format!("{prefix}fk"),
            "token",
            "dead",
            "touched",
            &touched.to_string(),
            "n",
            "7",
            "top",
            "99",
        ]);
        app.on_every_redis(&["HSET", &format!("{prefix}fr"), "junk", "x"]);
        app.on_every_redis(&["ZADD", &format!("{prefix}fs"), "99", "junk"]);
    };
    stage(now);
    let res = app
        .fork(&s2, json!({"new_session_id": f2}), Some("k3"))
        .await;
    assert!(
        res.headers().contains_key("retry-after"),
        "{:?}",
        res.headers()
    );
    problem(res, 409, "session_exists").await;
    assert_eq!(app.session(&f2).await.status(), 404);
    stage(now - 10_000);
    let res = app
        .fork(&s2, json!({"new_session_id": f2}), Some("k3"))
        .await;
    let body = ok_json(res, StatusCode::CREATED).await;
    assert_eq!(body["copied_turns"], 3);
    assert_eq!(app.all_turns(&f2).await, app.all_turns(&s2).await);
    let info = ok_json(app.session(&f2).await, StatusCode::OK).await;
    assert_eq!(info["turn_count"], 3);
    let left = app.on_every_redis(&[
        "EXISTS",
        &format!("{prefix}fk"),
        &format!("{prefix}fs"),
        &format!("{prefix}fr"),
    ]);
    assert!(
        left.iter()
            .all(|n| n.trim() != "1" && n.trim() != "2" && n.trim() != "3"),
        "{left:?}"
    );
}

/// Turns of about `bytes` each: a session of many fork pages.
async fn long_session(app: &TestApp, s: &str, turns: usize, bytes: usize) -> Vec<Value> {
    let messages: Vec<Value> = (0..turns)
        .flat_map(|i| {
            [
                json!({"role": "user", "content": format!("Question {i} {}", "q".repeat(bytes / 8))}),
                json!({"role": "assistant", "content": format!("Answer {i} {}", "a".repeat(bytes))}),
            ]
        })
        .collect();
    for chunk in messages.chunks(4) {
        let res = app.import(s, json!({"messages": chunk})).await;
        assert_eq!(res.status(), StatusCode::CREATED);
    }
    app.all_turns(s).await
}

async fn a_fork_of_many_pages_is_whole(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let s = sid();
    // 40 turns of 110 KB: more than four pages of a megabyte.
    let source = long_session(&app, &s, 40, 100_000).await;
    let f = sid();
    // Every call logged, to count the pages.
    let log = |args: &[&str]| app.on_every_redis(args);
    log(&[
        "CONFIG",
        "SET",
        "slowlog-log-slower-than",
        "0",
        "slowlog-max-len",
        "10000",
    ]);
    log(&["SLOWLOG", "RESET"]);
    let body = ok_json(
        app.fork(&s, json!({"new_session_id": f}), None).await,
        StatusCode::CREATED,
    )
    .await;
    let calls = log(&["SLOWLOG", "GET", "10000"]).join("\n");
    log(&["CONFIG", "SET", "slowlog-log-slower-than", "10000"]);
    if backend != Backend::Memory {
        // The first call, then a page a megabyte or so: four of them.
        let writes = calls.matches("fork_write").count();
        assert!(writes >= 5, "{writes} fork_write calls");
        assert_eq!(calls.matches("fork_publish").count(), 1);
    }
    assert_eq!(body["copied_turns"], 40);
    assert_eq!(app.all_turns(&f).await, source);
    let a = app.history_ok(&s, "limit=1000&max_tokens=10000000").await;
    let b = app.history_ok(&f, "limit=1000&max_tokens=10000000").await;
    assert_eq!(
        (&a["rendered"], &a["token_count"]),
        (&b["rendered"], &b["token_count"])
    );
    // Under a budget, the fork selects as the source does (its sums and
    // costs came along).
    let a = app.history_ok(&s, "limit=1000&max_tokens=100000").await;
    let b = app.history_ok(&f, "limit=1000&max_tokens=100000").await;
    assert_eq!(
        (&a["included_turns"], &a["token_count"]),
        (&b["included_turns"], &b["token_count"])
    );
}

async fn a_fork_and_a_clear_of_its_source_race_to_one_order(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    for round in 0..6 {
        let s = sid();
        let source = long_session(&app, &s, 12, 100_000).await;
        let f = sid();
        let (forked, cleared) =
            tokio::join!(app.fork(&s, json!({"new_session_id": f}), None), async {
                tokio::time::sleep(std::time::Duration::from_millis(3 * round)).await;
                app.clear(&s).await
            },);
        assert_eq!(cleared.status(), StatusCode::NO_CONTENT);
        match forked.status() {
            // Before the clear (or copied before it): all of it.
            StatusCode::CREATED => assert_eq!(app.all_turns(&f).await, source, "round {round}"),
            // After, or during: nothing.
            StatusCode::NOT_FOUND => {
                problem(forked, 404, "session_not_found").await;
                assert_eq!(app.session(&f).await.status(), 404, "round {round}");
            }
            other => panic!("round {round}: the fork answered {other}"),
        }
    }
}

async fn a_fork_too_long_for_one_request_completes_over_retries(backend: Backend) {
    if backend == Backend::Memory {
        return; // one lock: the memory store forks at once
    }
    let app = TestApp::spawn(backend).await;
    let s = sid();
    let source = long_session(&app, &s, 40, 100_000).await;
    // An instance whose requests end after 4 ms: a page or two each. On a
    // machine too slow to copy one page in that time no try gets further
    // than the last: every 25 tries, the time doubles.
    let mut allowed = std::time::Duration::from_millis(4);
    let mut hasty = app.another(|s| s.request_timeout = allowed).await;
    let f = sid();
    let body = json!({"new_session_id": f});
    let mut tries = 0;
    let made = loop {
        tries += 1;
        assert!(tries <= 200, "the fork never completed");
        let res = hasty.fork(&s, body.clone(), Some("long")).await;
        match res.status() {
            status @ (StatusCode::CREATED | StatusCode::OK) => break ok_json(res, status).await,
            StatusCode::SERVICE_UNAVAILABLE | StatusCode::CONFLICT => {
                // Cut off by the request's time (or told its own stopped
                // try is still writing). A reader sees no fork or all of
                // it: a 503 `request_timeout` may still have written (its
                // last script ran after the answer, as docs/API.md says of
                // such 503s), and the next try with the key then replays.
                let seen = app.session(&f).await;
                match seen.status() {
                    StatusCode::NOT_FOUND => {}
                    StatusCode::OK => {
                        let info = ok_json(seen, StatusCode::OK).await;
                        assert_eq!(info["turn_count"], 40, "a fork seen in part");
                    }
                    other => panic!("the fork's session answered {other}"),
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                if tries % 25 == 0 {
                    allowed *= 2;
                    hasty = app.another(|s| s.request_timeout = allowed).await;
                }
            }
            other => panic!("the fork answered {other}"),
        }
    };
    assert_eq!(made["copied_turns"], 40);
    assert!(tries > 1, "one request was enough: the test proves nothing");
    assert_eq!(app.all_turns(&f).await, source);
    let info = ok_json(app.session(&f).await, StatusCode::OK).await;
    assert_eq!(info["turn_count"], 40);
}
