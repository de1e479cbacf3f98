//! Templates (API.md v1.1): a history rendered by a named template (the
//! built-ins `xml` and `markdown`, or the server's own files), under the
//! budget rule, with an exact `token_count`, sandboxed.

use reqwest::StatusCode;
use serde_json::json;

use crate::support::{Backend, TestApp, count, ok_json, problem, sid};

conformance!(
    built_in_templates_render_exactly_and_count_exactly,
    a_template_keeps_whole_turns_within_the_budget,
    templates_render_the_summary_first,
    operators_templates_render_and_fail_cleanly,
    an_operators_template_renders_no_more_than_its_cap,
    unknown_templates_and_other_formats_are_refused,
    a_templated_read_that_takes_every_turn_is_one_script_call,
    the_cache_of_rendered_turns_is_measured,
);

/// A session of three turns, one with text that XML must escape.
async fn three_turns(app: &TestApp) -> String {
    let s = sid();
    app.complete(&s, "What is 1 < 2?", "True & \"obvious\".")
        .await;
    app.complete(&s, "And 'this'?", "Also.").await;
    app.complete(&s, "Bye", "See you.").await;
    s
}

async fn built_in_templates_render_exactly_and_count_exactly(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let s = three_turns(&app).await;

    let xml = app.history_ok(&s, "template=xml").await;
    let expected = "<history>\
        <turn role=\"user\">What is 1 &lt; 2?</turn><turn role=\"assistant\">True &amp; &quot;obvious&quot;.</turn>\
        <turn role=\"user\">And &apos;this&apos;?</turn><turn role=\"assistant\">Also.</turn>\
        <turn role=\"user\">Bye</turn><turn role=\"assistant\">See you.</turn>\
        </history>";
    assert_eq!(xml["rendered"], expected);
    assert_eq!(xml["format"], "text");
    for encoding in ["o200k_base", "cl100k_base", "p50k_base"] {
        let h = app
            .history_ok(&s, &format!("template=xml&encoding={encoding}"))
            .await;
        assert_eq!(h["token_count"], count(encoding, expected), "{encoding}");
    }

    let md = app.history_ok(&s, "template=markdown&limit=2").await;
    let expected = "## Conversation history\n\n\
        **User:** And 'this'?\n\n**Assistant:** Also.\n\n\
        **User:** Bye\n\n**Assistant:** See you.";
    assert_eq!(md["rendered"], expected);
    assert_eq!(md["token_count"], count("o200k_base", expected));
    assert_eq!(md["stopped_by"], "limit");
    // As text/plain, and in a start's history.
    let res = app
        .http
        .get(app.url(&format!(
            "/v1/sessions/{s}/history?template=markdown&limit=2"
        )))
        .header("accept", "text/plain")
        .send()
        .await
        .unwrap();
    assert_eq!(
        res.headers()["x-token-count"].to_str().unwrap(),
        count("o200k_base", expected).to_string()
    );
    assert_eq!(res.text().await.unwrap(), expected);
    let started = app
        .started(json!({"session_id": s, "user_query": "q",
                        "history": {"template": "markdown", "limit": 2}}))
        .await;
    assert_eq!(started["history"]["rendered"], expected);
}

async fn a_template_keeps_whole_turns_within_the_budget(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let s = three_turns(&app).await;
    let newest =
        "<history><turn role=\"user\">Bye</turn><turn role=\"assistant\">See you.</turn></history>";
    let two = "<history><turn role=\"user\">And &apos;this&apos;?</turn><turn role=\"assistant\">Also.</turn>\
        <turn role=\"user\">Bye</turn><turn role=\"assistant\">See you.</turn></history>";
    let (n1, n2) = (count("o200k_base", newest), count("o200k_base", two));

    for budget in [n1, n2 - 1] {
        let h = app
            .history_ok(&s, &format!("template=xml&max_tokens={budget}"))
            .await;
        assert_eq!(h["rendered"], newest, "{budget}");
        assert_eq!(h["token_count"], n1);
        assert_eq!(h["stopped_by"], "max_tokens");
    }
    let h = app
        .history_ok(&s, &format!("template=xml&max_tokens={n2}"))
        .await;
    assert_eq!(h["rendered"], two);
    let none = app
        .history_ok(&s, &format!("template=xml&max_tokens={}", n1 - 1))
        .await;
    assert_eq!(
        (none["rendered"].clone(), none["token_count"].clone()),
        (json!(""), json!(0))
    );
    // keep_first: the first turn, then the newest that fit.
    let h = app
        .history_ok(&s, "template=xml&keep_first=true&limit=2")
        .await;
    assert!(
        h["rendered"]
            .as_str()
            .unwrap()
            .starts_with("<history><turn role=\"user\">What is 1 &lt; 2?")
    );
    assert!(
        h["rendered"]
            .as_str()
            .unwrap()
            .ends_with("See you.</turn></history>")
    );
    assert_eq!(
        h["token_count"],
        count("o200k_base", h["rendered"].as_str().unwrap())
    );
    // unsummarized is described for templated reads too.
    assert_eq!(h["unsummarized"]["turns"], 1);
}

async fn templates_render_the_summary_first(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let s = three_turns(&app).await;
    let put = app
        .http
        .put(app.url(&format!("/v1/sessions/{s}/summary")))
        .json(&json!({"summary": "Numbers & quotes.", "through_seq": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);

    let h = app.history_ok(&s, "template=xml&summary=true").await;
    let expected = "<summary>Numbers &amp; quotes.</summary>\
        <history><turn role=\"user\">Bye</turn><turn role=\"assistant\">See you.</turn></history>";
    assert_eq!(h["rendered"], expected);
    assert_eq!(h["token_count"], count("o200k_base", expected));
    let alone = app
        .history_ok(&s, "template=markdown&summary=true&limit=0")
        .await;
    assert_eq!(
        alone["rendered"],
        "## Conversation summary\n\nNumbers & quotes.\n\n"
    );
}

async fn operators_templates_render_and_fail_cleanly(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, source: &str| std::fs::write(dir.path().join(name), source).unwrap();
    write(
        "plain.jinja",
        "{% macro turn(turn) %}[{{ turn.seq }}] {{ turn.user_query }} -> {{ turn.final_answer }}{% endmacro %}\
         {% macro separator() %}\n{% endmacro %}",
    );
    write(
        "broken.jinja",
        "{% macro turn(turn) %}\n{{ turn.no_such_field }}\n{% endmacro %}",
    );
    write(
        "endless.jinja",
        "{% macro turn(turn) %}{% for i in range(1000000) %}{% for j in range(1000000) %}x{% endfor %}{% endfor %}{% endmacro %}",
    );
    let path = dir.path().to_owned();
    let app = TestApp::spawn_with(backend, |s| s.templates_dir = Some(path)).await;
    let s = three_turns(&app).await;

    let h = app.history_ok(&s, "template=plain&limit=2").await;
    assert_eq!(
        h["rendered"],
        "[2] And 'this'? -> Also.\n[3] Bye -> See you."
    );
    assert_eq!(
        h["token_count"],
        count("o200k_base", h["rendered"].as_str().unwrap())
    );

    let p = problem(
        app.history(&s, "template=broken").await,
        422,
        "template_error",
    )
    .await;
    assert!(p["detail"].as_str().unwrap().contains("line 2"), "{p}");
    let p = problem(
        app.history(&s, "template=endless").await,
        422,
        "template_error",
    )
    .await;
    assert!(p["detail"].as_str().unwrap().contains("line 1"), "{p}");
    // A template failing in a start: nothing is written. Not the turn, not
    // an owner for the unowned session, not its activity, not a seq.
    let before = ok_json(app.session(&s).await, StatusCode::OK).await;
    let res = app
        .start(
            json!({"session_id": s, "user_id": "mallory", "user_query": "q",
                      "history": {"template": "broken"}}),
        )
        .await;
    problem(res, 422, "template_error").await;
    let mut after = ok_json(app.session(&s).await, StatusCode::OK).await;
    // (expires_at is read as now + the TTL left: it moves by the ms.)
    after["expires_at"] = before["expires_at"].clone();
    assert_eq!(after, before);
    assert_eq!(app.user_sessions("mallory").await["sessions"], json!([]));
    let h = app.history_ok(&s, "").await;
    assert_eq!(
        (h["total_turns"].clone(), h["pending_turns"].clone()),
        (json!(3), json!(0))
    );
    let next = app
        .started(json!({"session_id": s, "user_query": "q4"}))
        .await;
    assert_eq!(next["seq"], 4);
    // On another owner's session, the start is refused as such.
    let owned = sid();
    app.started(json!({"session_id": owned, "user_id": "alice", "user_query": "q"}))
        .await;
    app.complete(&owned, "q2", "a2").await;
    let res = app
        .start(
            json!({"session_id": owned, "user_id": "mallory", "user_query": "q",
                      "history": {"template": "broken"}}),
        )
        .await;
    problem(res, 403, "session_owner_mismatch").await;

    // A working template in a start, and its replay: the history as it
    // stood before the turn, both times.
    let body = json!({"session_id": s, "user_query": "q5", "history": {"template": "plain"}});
    let first = ok_json(
        app.start_with_key("k5", body.clone()).await,
        StatusCode::CREATED,
    )
    .await;
    app.complete(&s, "q6", "a6").await;
    let again = ok_json(app.start_with_key("k5", body).await, StatusCode::OK).await;
    assert_eq!(first["seq"], again["seq"]);
    assert_eq!(first["history"], again["history"]);
    assert!(
        first["history"]["rendered"]
            .as_str()
            .unwrap()
            .ends_with("[3] Bye -> See you."),
        "{first}"
    );
}

/// A template may add to its contents, not without bound: past twice
/// `TURNSTORE_MAX_HISTORY_BYTES` and 1 MiB, a rendering is a 422.
async fn an_operators_template_renders_no_more_than_its_cap(backend: Backend) {
    // Arrange: a turn macro that renders 500 KB whatever its turn, under
    // a history cap of 1,000 bytes: two turns fit the cap (1 MiB and
    // 2,000 bytes), three do not.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("bloat.jinja"),
        "{% macro turn(turn) %}\n{{ turn.seq }}{{ 'word ' * 100000 }}{% endmacro %}",
    )
    .unwrap();
    let path = dir.path().to_owned();
    let app = TestApp::spawn_with(backend, |s| {
        s.templates_dir = Some(path);
        s.max_history_bytes = 1000;
    })
    .await;
    let s = three_turns(&app).await;
    let query = "template=bloat&max_tokens=10000000";

    // Act
    let two = app.history(&s, &format!("{query}&limit=2")).await;
    let three = app.history(&s, query).await;
    let plain = app
        .http
        .get(app.url(&format!("/v1/sessions/{s}/history?{query}")))
        .header("accept", "text/plain")
        .send()
        .await
        .unwrap();
    let start = app
        .start(json!({"session_id": s, "user_query": "q",
                      "history": {"template": "bloat", "max_tokens": 10_000_000}}))
        .await;

    // Assert
    let two = ok_json(two, StatusCode::OK).await;
    assert_eq!(two["rendered"].as_str().unwrap().len(), 2 * 500_002);
    for res in [three, plain, start] {
        let p = problem(res, 422, "template_error").await;
        let detail = p["detail"].as_str().unwrap();
        assert!(
            detail.contains("line 1: the rendering is larger than 1050576 bytes"),
            "{detail}"
        );
    }
    let h = app.history_ok(&s, "").await;
    assert_eq!(
        (h["total_turns"].clone(), h["pending_turns"].clone()),
        (json!(3), json!(0))
    );
}

async fn unknown_templates_and_other_formats_are_refused(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let s = three_turns(&app).await;
    problem(
        app.history(&s, "template=nope").await,
        404,
        "template_not_found",
    )
    .await;
    let p = problem(
        app.history(&s, "template=xml&format=messages").await,
        422,
        "validation_failed",
    )
    .await;
    assert_eq!(p["errors"][0]["field"], "format");
    problem(
        app.history(&s, "template=a%20b").await,
        404,
        "template_not_found",
    )
    .await;
    let res = app
        .start(json!({"session_id": s, "user_query": "q", "history": {"template": "nope"}}))
        .await;
    problem(res, 404, "template_not_found").await;
    let h = ok_json(app.history(&s, "").await, StatusCode::OK).await;
    assert_eq!(h["pending_turns"], 0);
}

/// Scripts run so far (FCALL, EVAL and EVALSHA), over every Redis node.
fn script_calls(app: &TestApp) -> u64 {
    app.on_every_redis(&["INFO", "commandstats"])
        .iter()
        .flat_map(|info| info.lines())
        .filter(|l| {
            ["cmdstat_fcall:", "cmdstat_eval:", "cmdstat_evalsha:"]
                .iter()
                .any(|c| l.starts_with(c))
        })
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

async fn a_templated_read_that_takes_every_turn_is_one_script_call(backend: Backend) {
    if backend == Backend::Memory {
        return; // no scripts
    }
    let app = TestApp::spawn(backend).await;
    let s = sid();
    for i in 1..=5 {
        app.complete(&s, &format!("question {i}"), &format!("answer {i}"))
            .await;
    }
    let calls = |query: &'static str| {
        let (app, s) = (&app, &s);
        async move {
            app.history_ok(s, query).await; // its scripts are loaded
            let before = script_calls(app);
            let h = app.history_ok(s, query).await;
            (h, script_calls(app) - before)
        }
    };
    // Every turn handed over is taken: the walk's own description of what
    // lies below them holds.
    let (h, n) = calls("template=xml&limit=3").await;
    assert_eq!(h["included_turns"], 3, "{h}");
    assert_eq!(h["unsummarized"]["through_seq"], 2, "{h}");
    assert_eq!(n, 1);
    // The template's budget stops before the walk does: what lies below
    // the turns taken is asked for.
    let two = app.history_ok(&s, "template=xml&limit=2").await["token_count"]
        .as_u64()
        .unwrap();
    let query: &'static str = format!("template=xml&limit=3&max_tokens={two}").leak();
    let (h, n) = calls(query).await;
    assert_eq!(h["included_turns"], 2, "{h}");
    assert_eq!(h["stopped_by"], "max_tokens", "{h}");
    assert_eq!(h["unsummarized"]["through_seq"], 3, "{h}");
    assert_eq!(n, 2);
}

/// `/metrics` tells how the cache of rendered turns does (what
/// `TURNSTORE_TEMPLATE_CACHE_MB` is sized by): each turn a templated read
/// renders is a miss, each it finds again a hit, and the bytes kept show.
async fn the_cache_of_rendered_turns_is_measured(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let s = three_turns(&app).await;
    let hits = "turnstore_template_cache_hits_total";
    let misses = "turnstore_template_cache_misses_total";
    assert_eq!(app.metric(hits).await, 0.0);
    assert_eq!(app.metric(misses).await, 0.0);
    assert_eq!(app.metric("turnstore_template_cache_bytes").await, 0.0);

    let first = app.history_ok(&s, "template=markdown").await;
    assert_eq!(app.metric(misses).await, 3.0);
    assert_eq!(app.metric(hits).await, 0.0);
    let kept = app.metric("turnstore_template_cache_bytes").await;
    assert!(kept > 0.0);

    let again = app.history_ok(&s, "template=markdown").await;
    assert_eq!(again["rendered"], first["rendered"]);
    assert_eq!(app.metric(hits).await, 3.0);
    assert_eq!(app.metric(misses).await, 3.0);
    assert_eq!(app.metric("turnstore_template_cache_bytes").await, kept);
}
