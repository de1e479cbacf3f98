//! Translations (API.md v1.1): English copies of questions and answers,
//! kept beside the originals and rendered by `lang=en`.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::{Backend, TestApp, count, ok_json, problem, sid};

conformance!(
    english_copies_are_kept_and_shown_beside_the_originals,
    lang_en_renders_the_copies_where_there_are_and_counts_them_exactly,
    lang_en_turns_carry_the_english_copies,
    copies_have_the_limits_of_their_originals,
    a_finalize_retry_must_repeat_the_copy,
    copies_leave_with_their_turns,
);

/// Starts and finalizes a turn with these copies; returns the finalized turn.
async fn complete_en(
    app: &TestApp,
    session: &str,
    (q, q_en): (&str, Option<&str>),
    (a, a_en): (&str, Option<&str>),
) -> Value {
    let mut start = json!({"session_id": session, "user_query": q});
    if let Some(q_en) = q_en {
        start["user_query_en"] = json!(q_en);
    }
    let t = app.started(start).await;
    let mut end = json!({"final_answer": a});
    if let Some(a_en) = a_en {
        end["final_answer_en"] = json!(a_en);
    }
    let res = app
        .http
        .post(app.url(&format!(
            "/v1/sessions/{session}/turns/{}/finalize",
            t["turn_id"].as_str().unwrap()
        )))
        .json(&end)
        .send()
        .await
        .unwrap();
    ok_json(res, StatusCode::OK).await["turn"].clone()
}

async fn english_copies_are_kept_and_shown_beside_the_originals(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let s = sid();

    let both = complete_en(
        &app,
        &s,
        ("Was ist ein Vektorindex?", Some("What is a vector index?")),
        ("Ein Index über Vektoren.", Some("An index over vectors.")),
    )
    .await;
    let plain = complete_en(&app, &s, ("Danke", None), ("Bitte", None)).await;

    assert_eq!(both["user_query"], "Was ist ein Vektorindex?");
    assert_eq!(both["user_query_en"], "What is a vector index?");
    assert_eq!(both["final_answer_en"], "An index over vectors.");
    assert!(plain.get("user_query_en").is_none(), "{plain}");
    assert!(plain.get("final_answer_en").is_none(), "{plain}");
    let h = app.history_ok(&s, "format=turns").await;
    let turns = h["turns"].as_array().unwrap();
    assert_eq!(turns[0]["user_query_en"], "What is a vector index?");
    assert_eq!(turns[0]["final_answer"], "Ein Index über Vektoren.");
    assert!(turns[1].get("user_query_en").is_none());
    // Copies are cut like the originals, and marked.
    let h = app.history_ok(&s, "format=turns&max_answer_chars=5").await;
    let first = &h["turns"][0];
    assert_eq!(first["final_answer_en"], "An in [truncated]");
    assert_eq!(first["truncated"], true);
}

async fn lang_en_renders_the_copies_where_there_are_and_counts_them_exactly(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let s = sid();
    complete_en(
        &app,
        &s,
        ("Frage eins", Some("Question one")),
        ("Antwort eins", None),
    )
    .await;
    complete_en(
        &app,
        &s,
        ("Frage zwei", None),
        ("Antwort zwei", Some("Answer two\n\n")),
    )
    .await;
    complete_en(&app, &s, ("Frage drei", None), ("Antwort drei", None)).await;

    let expected = "### Conversation history:\n\
        User: Question one\nAssistant: Antwort eins\n\n\
        User: Frage zwei\nAssistant: Answer two\n\n\n\n\
        User: Frage drei\nAssistant: Antwort drei";
    for encoding in ["o200k_base", "cl100k_base", "p50k_base", "r50k_base"] {
        let h = app
            .history_ok(&s, &format!("lang=en&encoding={encoding}"))
            .await;
        assert_eq!(h["rendered"], expected);
        assert_eq!(h["token_count"], count(encoding, expected), "{encoding}");
    }
    let m = app.history_ok(&s, "lang=en&format=messages").await;
    let contents: Vec<&str> = m["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(
        contents,
        [
            "Question one",
            "Antwort eins",
            "Frage zwei",
            "Answer two\n\n",
            "Frage drei",
            "Antwort drei"
        ]
    );
    // A budget that fits the English rendering's newest two turns only.
    let two = "### Conversation history:\n\
        User: Frage zwei\nAssistant: Answer two\n\n\n\n\
        User: Frage drei\nAssistant: Antwort drei";
    let budget = count("o200k_base", two);
    let h = app
        .history_ok(&s, &format!("lang=en&max_tokens={budget}"))
        .await;
    assert_eq!(h["rendered"], two);
    assert_eq!(h["stopped_by"], "max_tokens");
    // In lang=en, Turn objects hold what was rendered, and the copies.
    let t = app.history_ok(&s, "lang=en&format=turns").await;
    assert_eq!(t["turns"][0]["user_query"], "Question one");
    assert_eq!(t["turns"][0]["user_query_en"], "Question one");
    assert!(t["turns"][0].get("final_answer_en").is_none());
    assert_eq!(t["token_count"], count("o200k_base", expected));
    // Plain text and a start's history take lang too.
    let res = app
        .http
        .get(app.url(&format!("/v1/sessions/{s}/history?lang=en")))
        .header("accept", "text/plain")
        .send()
        .await
        .unwrap();
    assert_eq!(res.text().await.unwrap(), expected);
    let started = app
        .started(json!({"session_id": s, "user_query": "vier", "history": {"lang": "en"}}))
        .await;
    assert_eq!(started["history"]["rendered"], expected);
    problem(app.history(&s, "lang=de").await, 422, "validation_failed").await;
}

/// With `lang=en`, Turn objects hold the texts rendered (the English
/// copies where there are) and carry the copies too, as every Turn does.
async fn lang_en_turns_carry_the_english_copies(backend: Backend) {
    // Arrange: a turn translated both ways, one with an English answer
    // only, one untranslated; long enough texts for a truncation to cut.
    let app = TestApp::spawn(backend).await;
    let s = sid();
    complete_en(
        &app,
        &s,
        ("Was ist ein Vektorindex?", Some("What is a vector index?")),
        ("Ein Index über Vektoren.", Some("An index over vectors.")),
    )
    .await;
    complete_en(
        &app,
        &s,
        ("Und jetzt?", None),
        ("Jetzt wählen wir HNSW.", Some("Now we pick HNSW.")),
    )
    .await;
    complete_en(&app, &s, ("Danke", None), ("Bitte", None)).await;
    let english = "### Conversation history:\n\
        User: What is a vector index?\nAssistant: An index over vectors.\n\n\
        User: Und jetzt?\nAssistant: Now we pick HNSW.\n\n\
        User: Danke\nAssistant: Bitte";
    let texts = |h: &Value| -> Vec<[Value; 4]> {
        h["turns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                [
                    "user_query",
                    "user_query_en",
                    "final_answer",
                    "final_answer_en",
                ]
                .map(|f| t.get(f).cloned().unwrap_or(Value::Null))
            })
            .collect()
    };

    // Act
    let h = app.history_ok(&s, "lang=en&format=turns").await;
    let cut = app
        .history_ok(
            &s,
            "lang=en&format=turns&max_query_chars=5&max_answer_chars=6",
        )
        .await;
    let started = app
        .started(json!({"session_id": s, "user_query": "q",
                        "history": {"lang": "en", "format": "turns"}}))
        .await;

    // Assert: the copies where set, absent where not; the count is the
    // English rendering's.
    let (q1, a1, a2) = (
        json!("What is a vector index?"),
        json!("An index over vectors."),
        json!("Now we pick HNSW."),
    );
    assert_eq!(
        texts(&h),
        [
            [q1.clone(), q1, a1.clone(), a1],
            [json!("Und jetzt?"), Value::Null, a2.clone(), a2],
            [json!("Danke"), Value::Null, json!("Bitte"), Value::Null],
        ],
        "{h}"
    );
    assert!(h["turns"][2].get("user_query_en").is_none(), "{h}");
    assert_eq!(h["token_count"], count("o200k_base", english));
    assert_eq!(started["history"], h);
    // Cut alike, and counted as the English rendering cut.
    let (q1, a1) = (json!("What  [truncated]"), json!("An ind [truncated]"));
    assert_eq!(texts(&cut)[0], [q1.clone(), q1, a1.clone(), a1], "{cut}");
    assert_eq!(cut["turns"][0]["truncated"], true);
    assert_eq!(cut["turns"][2]["truncated"], false);
    let english_cut = app
        .history_ok(&s, "lang=en&max_query_chars=5&max_answer_chars=6")
        .await;
    assert_eq!(
        cut["token_count"],
        count("o200k_base", english_cut["rendered"].as_str().unwrap())
    );
    // A budget of the English rendering's newest two turns takes them.
    let two = "### Conversation history:\n\
        User: Und jetzt?\nAssistant: Now we pick HNSW.\n\n\
        User: Danke\nAssistant: Bitte";
    let budget = count("o200k_base", two);
    let two_turns = app
        .history_ok(&s, &format!("lang=en&format=turns&max_tokens={budget}"))
        .await;
    assert_eq!(texts(&two_turns), texts(&h)[1..]);
    assert_eq!(two_turns["token_count"], budget);
    assert_eq!(two_turns["stopped_by"], "max_tokens");
}

async fn copies_have_the_limits_of_their_originals(backend: Backend) {
    let app = TestApp::spawn_with(backend, |s| {
        s.max_query_bytes = 64;
        s.max_answer_bytes = 64;
    })
    .await;
    let s = sid();
    for (body, field) in [
        (
            json!({"session_id": s, "user_query": "q", "user_query_en": "  \n"}),
            "user_query_en",
        ),
        (
            json!({"session_id": s, "user_query": "q", "user_query_en": 5}),
            "user_query_en",
        ),
    ] {
        let p = problem(app.start(body).await, 422, "validation_failed").await;
        assert_eq!(p["errors"][0]["field"], field, "{p}");
    }
    let long = "x".repeat(65);
    problem(
        app.start(json!({"session_id": s, "user_query": "q", "user_query_en": long}))
            .await,
        413,
        "payload_too_large",
    )
    .await;
    let t = app
        .started(json!({"session_id": s, "user_query": "q"}))
        .await;
    let finalize = |body: Value| {
        app.http
            .post(app.url(&format!(
                "/v1/sessions/{s}/turns/{}/finalize",
                t["turn_id"].as_str().unwrap()
            )))
            .json(&body)
            .send()
    };
    problem(
        finalize(json!({"final_answer": "a", "final_answer_en": ""}))
            .await
            .unwrap(),
        422,
        "validation_failed",
    )
    .await;
    problem(
        finalize(json!({"final_answer": "a", "final_answer_en": long}))
            .await
            .unwrap(),
        413,
        "payload_too_large",
    )
    .await;
    // Nothing was written by the refusals.
    let h = app.history_ok(&s, "").await;
    assert_eq!(
        (h["total_turns"].clone(), h["pending_turns"].clone()),
        (json!(0), json!(1))
    );
}

async fn a_finalize_retry_must_repeat_the_copy(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let s = sid();
    let t = app
        .started(json!({"session_id": s, "user_query": "q"}))
        .await;
    let url = app.url(&format!(
        "/v1/sessions/{s}/turns/{}/finalize",
        t["turn_id"].as_str().unwrap()
    ));
    let send = |body: Value| app.http.post(&url).json(&body).send();
    let first = json!({"final_answer": "a", "final_answer_en": "a-en"});
    let done = ok_json(send(first.clone()).await.unwrap(), StatusCode::OK).await;
    let again = ok_json(send(first).await.unwrap(), StatusCode::OK).await;
    assert_eq!(done, again);
    for other in [
        json!({"final_answer": "a"}),
        json!({"final_answer": "a", "final_answer_en": "other"}),
    ] {
        problem(send(other).await.unwrap(), 409, "turn_already_finalized").await;
    }
}

/// On Redis, a turn's copies are fields of its own: trimmed, aborted and
/// deleted turns take them along (no field is left behind).
async fn copies_leave_with_their_turns(backend: Backend) {
    let app = TestApp::spawn_with(backend, |s| s.max_turns = 2).await;
    let s = sid();
    for i in 1..=4 {
        complete_en(
            &app,
            &s,
            ("q", Some("q-en")),
            (&format!("a{i}"), Some("a-en")),
        )
        .await;
    }
    let pending = app
        .started(json!({"session_id": s, "user_query": "q", "user_query_en": "q-en"}))
        .await;
    let kept = app.history_ok(&s, "format=turns").await;
    let newest = kept["turns"][1]["turn_id"].as_str().unwrap().to_owned();
    assert_eq!(app.abort(&s, &newest).await.status(), 204);
    assert_eq!(
        app.abort(&s, pending["turn_id"].as_str().unwrap())
            .await
            .status(),
        204
    );

    let h = app.history_ok(&s, "format=turns&lang=en").await;
    assert_eq!(h["total_turns"], 1);
    assert_eq!(h["turns"][0]["final_answer"], "a-en");
    assert_eq!(h["turns"][0]["final_answer_en"], "a-en");
    let key = format!("{}:{{{s}}}:r", app.settings.key_prefix);
    // Counted by HLEN: a field's name is a turn id's bytes, which may hold
    // a newline (HKEYS's lines would split it). A node that does not serve
    // the key answers MOVED.
    let fields: u64 = app
        .on_every_redis(&["HLEN", &key])
        .iter()
        .filter_map(|out| out.trim().parse::<u64>().ok())
        .sum();
    if backend != Backend::Memory {
        // One turn left: its record and its copies.
        assert_eq!(fields, 2, "{:?}", app.on_every_redis(&["HKEYS", &key]));
    }
}
