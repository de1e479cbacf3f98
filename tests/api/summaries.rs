//! Rolling summaries (API.md v1.1): written with compare-and-set on what
//! they cover, rendered first with `summary=true`, and the `unsummarized`
//! hint that tells a client which turns to fold next.

use reqwest::{Response, StatusCode};
use serde_json::{Value, json};

use crate::support::{Backend, TestApp, count, error_fields, ok_json, problem, seqs, sid};

conformance!(
    a_summary_is_written_read_and_deleted,
    summary_writes_never_overwrite_each_other,
    bad_summary_writes_change_nothing,
    histories_begin_with_the_summary_when_asked,
    the_summary_counts_first_and_alone_when_nothing_else_fits,
    unsummarized_names_exactly_what_to_fold_next,
    a_summary_never_covers_a_pending_turn,
    pending_seqs_are_read_without_loading_questions,
    many_turns_waiting_behind_a_pending_turn_are_not_summed,
    a_client_folds_its_history_into_a_rolling_summary,
    clearing_and_erasing_delete_the_summary,
    a_summary_lands_only_on_the_generation_it_was_folded_from,
);

impl TestApp {
    async fn get_summary(&self, session: &str) -> Response {
        self.http
            .get(self.url(&format!("/v1/sessions/{session}/summary")))
            .send()
            .await
            .unwrap()
    }

    async fn delete_summary(&self, session: &str) -> Response {
        self.http
            .delete(self.url(&format!("/v1/sessions/{session}/summary")))
            .send()
            .await
            .unwrap()
    }
}

/// A session of `n` finalized turns "q<i>" / "a<i>".
async fn session_of(app: &TestApp, n: usize) -> String {
    let s = sid();
    for i in 1..=n {
        app.complete(&s, &format!("q{i}"), &format!("a{i}")).await;
    }
    s
}

async fn a_summary_is_written_read_and_deleted(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let s = session_of(&app, 3).await;

    problem(app.get_summary(&s).await, 404, "summary_not_found").await;
    let put = ok_json(
        app.put_summary(&s, json!({"summary": "Two greetings.", "through_seq": 2}))
            .await,
        StatusCode::OK,
    )
    .await;
    let got = ok_json(app.get_summary(&s).await, StatusCode::OK).await;

    assert_eq!(put, got);
    assert_eq!(got["summary"], "Two greetings.");
    assert_eq!(got["through_seq"], 2);
    assert_eq!(got["token_count"], count("o200k_base", "Two greetings."));
    assert!(chrono::DateTime::parse_from_rfc3339(got["updated_at"].as_str().unwrap()).is_ok());
    assert_eq!(app.delete_summary(&s).await.status(), 204);
    assert_eq!(app.delete_summary(&s).await.status(), 204);
    problem(app.get_summary(&s).await, 404, "summary_not_found").await;
    // The turns are untouched.
    assert_eq!(app.history_ok(&s, "").await["total_turns"], 3);
}

async fn summary_writes_never_overwrite_each_other(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let s = session_of(&app, 4).await;
    let put = |body: Value| app.put_summary(&s, body);

    // Two summarizers both saw no summary; the second loses.
    let first = json!({"summary": "one", "through_seq": 2, "expected_through_seq": 0});
    assert_eq!(put(first.clone()).await.status(), 200);
    let p = problem(put(first).await, 409, "summary_conflict").await;
    assert!(
        p["detail"].as_str().unwrap().contains("through seq 2"),
        "{p}"
    );
    // Extending it, with the right expectation.
    let ok = put(json!({"summary": "two", "through_seq": 3, "expected_through_seq": 2})).await;
    assert_eq!(ok.status(), 200);
    // Backwards: refused; the same coverage: a rewrite.
    problem(
        put(json!({"summary": "back", "through_seq": 2})).await,
        409,
        "summary_conflict",
    )
    .await;
    let rewrite = put(json!({"summary": "three, better", "through_seq": 3})).await;
    assert_eq!(rewrite.status(), 200);
    let got = ok_json(app.get_summary(&s).await, StatusCode::OK).await;
    assert_eq!(
        (got["summary"].clone(), got["through_seq"].clone()),
        (json!("three, better"), json!(3))
    );
}

async fn bad_summary_writes_change_nothing(backend: Backend) {
    let app = TestApp::spawn_with(backend, |s| s.max_summary_bytes = 64).await;
    let s = sid();
    app.complete(&s, "q1", "a1").await;
    app.started(json!({"session_id": s, "user_id": "alice", "user_query": "q2"}))
        .await;
    let put = |body: Value| app.put_summary(&s, body);

    for (body, field) in [
        (json!({"summary": "x", "through_seq": 2}), "through_seq"),
        (json!({"summary": "x", "through_seq": 0}), "through_seq"),
        (json!({"summary": " \n", "through_seq": 1}), "summary"),
        (json!({"summary": "x"}), "through_seq"),
        (
            json!({"summary": "x", "through_seq": 1, "extra": 1}),
            "extra",
        ),
        (json!({"summary": "x", "through_seq": -1}), "through_seq"),
        (
            json!({"summary": "x", "through_seq": 1, "user_id": "a b"}),
            "user_id",
        ),
    ] {
        let p = problem(put(body.clone()).await, 422, "validation_failed").await;
        assert!(error_fields(&p).contains(&field), "{body}: {p}");
    }
    problem(
        put(json!({"summary": "x".repeat(65), "through_seq": 1})).await,
        413,
        "payload_too_large",
    )
    .await;
    problem(
        put(json!({"summary": "x", "through_seq": 1, "user_id": "bob"})).await,
        403,
        "session_owner_mismatch",
    )
    .await;
    // An unknown session has no turn to summarize.
    problem(
        app.put_summary(&sid(), json!({"summary": "x", "through_seq": 1}))
            .await,
        422,
        "validation_failed",
    )
    .await;
    problem(app.get_summary(&s).await, 404, "summary_not_found").await;
    let ok = put(json!({"summary": "x", "through_seq": 1, "user_id": "alice"})).await;
    assert_eq!(ok.status(), 200);
}

async fn histories_begin_with_the_summary_when_asked(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let s = session_of(&app, 3).await;
    app.put_summary(
        &s,
        json!({"summary": "The user said hello twice.", "through_seq": 2}),
    )
    .await;

    let text = app.history_ok(&s, "summary=true").await;
    let expected = "### Conversation summary:\nThe user said hello twice.\n\n\
        ### Conversation history:\nUser: q3\nAssistant: a3";
    assert_eq!(text["rendered"], expected);
    assert_eq!(text["token_count"], count("o200k_base", expected));
    assert_eq!(
        (text["total_turns"].clone(), text["included_turns"].clone()),
        (json!(1), json!(1))
    );
    for encoding in ["cl100k_base", "p50k_base"] {
        let h = app
            .history_ok(&s, &format!("summary=true&encoding={encoding}"))
            .await;
        assert_eq!(h["token_count"], count(encoding, expected), "{encoding}");
    }
    // Without summary=true, the history is as it always was.
    let plain = app.history_ok(&s, "").await;
    assert!(
        plain["rendered"]
            .as_str()
            .unwrap()
            .starts_with("### Conversation history:")
    );
    assert_eq!(plain["included_turns"], 3);

    let m = app.history_ok(&s, "summary=true&format=messages").await;
    assert_eq!(
        m["messages"][0],
        json!({"role": "system", "content": "Summary of the conversation so far:\nThe user said hello twice."})
    );
    assert_eq!(m["messages"].as_array().unwrap().len(), 3);
    let overhead = 4;
    let tokens: usize = m["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| count("o200k_base", m["content"].as_str().unwrap()) + overhead)
        .sum();
    assert_eq!(m["token_count"], tokens);

    let t = app.history_ok(&s, "summary=true&format=turns").await;
    assert_eq!(t["summary"]["summary"], "The user said hello twice.");
    assert_eq!(t["summary"]["through_seq"], 2);
    assert_eq!(t["turns"].as_array().unwrap().len(), 1);

    // limit counts turns only: the summary alone.
    let alone = app.history_ok(&s, "summary=true&limit=0").await;
    assert_eq!(
        alone["rendered"],
        "### Conversation summary:\nThe user said hello twice."
    );
    assert_eq!(alone["stopped_by"], "limit");
    // A start's history takes it too.
    let started = app
        .started(json!({"session_id": s, "user_query": "q4", "history": {"summary": true}}))
        .await;
    assert_eq!(started["history"]["rendered"], expected);
}

async fn the_summary_counts_first_and_alone_when_nothing_else_fits(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let s = session_of(&app, 2).await;
    let summary = "A summary of some length, to be budgeted first.";
    app.put_summary(&s, json!({"summary": summary, "through_seq": 1}))
        .await;
    let alone = format!("### Conversation summary:\n{summary}");
    let alone_tokens = count("o200k_base", &alone);

    // Not even the summary fits: nothing is returned.
    let none = app
        .history_ok(&s, &format!("summary=true&max_tokens={}", alone_tokens - 1))
        .await;
    assert_eq!(
        (none["rendered"].clone(), none["token_count"].clone()),
        (json!(""), json!(0))
    );
    assert_eq!(none["stopped_by"], "max_tokens");
    // The summary fits, the turn after it does not.
    let only = app
        .history_ok(&s, &format!("summary=true&max_tokens={alone_tokens}"))
        .await;
    assert_eq!(only["rendered"], alone);
    assert_eq!(only["token_count"], alone_tokens);
    assert_eq!(only["stopped_by"], "max_tokens");
    // Its bytes count towards the byte cap.
    let capped =
        TestApp::spawn_with(backend, |c| c.max_history_bytes = summary.len() as u64 + 3).await;
    let s2 = session_of(&capped, 2).await;
    capped
        .put_summary(&s2, json!({"summary": summary, "through_seq": 1}))
        .await;
    let h = capped.history_ok(&s2, "summary=true").await;
    assert_eq!(
        (h["rendered"].clone(), h["stopped_by"].clone()),
        (json!(alone), json!("max_bytes"))
    );
}

async fn unsummarized_names_exactly_what_to_fold_next(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let s = session_of(&app, 5).await;

    // Everything returned: nothing to fold.
    assert_eq!(app.history_ok(&s, "").await["unsummarized"], Value::Null);
    // The newest two returned: turns 1 to 3 are neither returned nor covered.
    let h = app.history_ok(&s, "limit=2").await;
    let blocks = "User: q1\nAssistant: a1\n\nUser: q2\nAssistant: a2\n\nUser: q3\nAssistant: a3";
    assert_eq!(
        h["unsummarized"],
        json!({"after_seq": 0, "through_seq": 3, "turns": 3, "tokens": count("o200k_base", blocks)})
    );
    // In another encoding than the stored counts': counted in that one
    // (the response's), from the turns' texts.
    let other = app.history_ok(&s, "limit=2&encoding=cl100k_base").await;
    assert_eq!(
        other["unsummarized"],
        json!({"after_seq": 0, "through_seq": 3, "turns": 3, "tokens": count("cl100k_base", blocks)})
    );
    let kept = app
        .history_ok(&s, "limit=2&keep_first=true&encoding=cl100k_base")
        .await;
    assert_eq!(
        kept["unsummarized"]["tokens"],
        count(
            "cl100k_base",
            "User: q2\nAssistant: a2\n\nUser: q3\nAssistant: a3\n\nUser: q4\nAssistant: a4"
        ),
        "{kept}"
    );
    let started = app
        .started(json!({"session_id": s, "user_query": "q?",
                        "history": {"limit": 2, "encoding": "p50k_base"}}))
        .await;
    assert_eq!(
        started["history"]["unsummarized"]["tokens"],
        count("p50k_base", blocks)
    );
    let t = started["turn_id"].as_str().unwrap();
    assert_eq!(app.abort(&s, t).await.status(), 204);
    // Past the history byte cap, the texts are not read: no tokens.
    let capped = TestApp::spawn_with(backend, |c| c.max_history_bytes = 10).await;
    let c = session_of(&capped, 5).await;
    let h = capped.history_ok(&c, "limit=2&encoding=cl100k_base").await;
    assert_eq!(h["unsummarized"]["turns"], 3);
    assert_eq!(h["unsummarized"]["tokens"], Value::Null);
    // A summary of turns 1 and 2: turn 3 is left, with or without summary=true.
    app.put_summary(&s, json!({"summary": "s", "through_seq": 2}))
        .await;
    for query in ["limit=2", "limit=2&summary=true"] {
        let h = app.history_ok(&s, query).await;
        assert_eq!(
            h["unsummarized"],
            json!({"after_seq": 2, "through_seq": 3, "turns": 1,
                   "tokens": count("o200k_base", "User: q3\nAssistant: a3")}),
            "{query}"
        );
    }
    // keep_first returns turn 1 (covered, so not counted) and the newest.
    let h = app.history_ok(&s, "limit=2&keep_first=true").await;
    assert_eq!(h["unsummarized"]["turns"], 2);
    assert_eq!(h["unsummarized"]["through_seq"], 4);
    // Truncating reads are described as well (the turns whole).
    let h = app.history_ok(&s, "limit=2&max_answer_chars=1").await;
    assert_eq!(
        h["unsummarized"]["tokens"],
        count("o200k_base", "User: q3\nAssistant: a3")
    );
    // A start describes the turns before it.
    let started = app
        .started(json!({"session_id": s, "user_query": "q6", "history": {"limit": 1}}))
        .await;
    assert_eq!(started["history"]["unsummarized"]["through_seq"], 4);
}

/// A pending turn may yet be finalized: a summary covering it would leave
/// it in neither the summary nor any history. So the unsummarized turns end
/// below the oldest pending turn, and a write past it is refused.
async fn a_summary_never_covers_a_pending_turn(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let s = session_of(&app, 1).await;
    let slow = app
        .started(json!({"session_id": s, "user_query": "q2"}))
        .await;
    app.complete(&s, "q3", "a3").await;
    app.complete(&s, "q4", "a4").await;

    let h = app.history_ok(&s, "limit=1").await;
    assert_eq!(
        h["unsummarized"],
        json!({"after_seq": 0, "through_seq": 1, "turns": 1,
               "tokens": count("o200k_base", "User: q1\nAssistant: a1")})
    );
    for through in [2, 3] {
        let p = problem(
            app.put_summary(&s, json!({"summary": "s", "through_seq": through}))
                .await,
            422,
            "validation_failed",
        )
        .await;
        assert_eq!(p["errors"][0]["field"], "through_seq", "{p}");
        assert!(
            p["errors"][0]["message"]
                .as_str()
                .unwrap()
                .contains("turn 2 is still pending"),
            "{p}"
        );
    }
    problem(app.get_summary(&s).await, 404, "summary_not_found").await;
    ok_json(
        app.put_summary(&s, json!({"summary": "one", "through_seq": 1}))
            .await,
        StatusCode::OK,
    )
    .await;

    // Turn 2 finalized late: nothing lost, and it is next to fold.
    let res = app
        .finalize(&s, slow["turn_id"].as_str().unwrap(), "a2")
        .await;
    assert_eq!(res.status(), 200);
    let h = app.history_ok(&s, "summary=true&format=turns").await;
    assert_eq!(seqs(&h), [2, 3, 4]);
    let h = app.history_ok(&s, "summary=true&limit=1").await;
    assert_eq!(
        h["unsummarized"],
        json!({"after_seq": 1, "through_seq": 3, "turns": 2,
               "tokens": count("o200k_base", "User: q2\nAssistant: a2\n\nUser: q3\nAssistant: a3")})
    );
    ok_json(
        app.put_summary(
            &s,
            json!({"summary": "three", "through_seq": 3, "expected_through_seq": 1}),
        )
        .await,
        StatusCode::OK,
    )
    .await;

    // An aborted turn waits for nothing.
    let gone = app
        .started(json!({"session_id": s, "user_query": "q5"}))
        .await;
    app.complete(&s, "q6", "a6").await;
    assert_eq!(
        app.history_ok(&s, "summary=true&limit=1").await["unsummarized"]["through_seq"],
        4
    );
    assert_eq!(
        app.abort(&s, gone["turn_id"].as_str().unwrap())
            .await
            .status(),
        204
    );
    let h = app.history_ok(&s, "summary=true&limit=0").await;
    assert_eq!(h["unsummarized"]["through_seq"], 6, "{h}");
    ok_json(
        app.put_summary(&s, json!({"summary": "all", "through_seq": 6}))
            .await,
        StatusCode::OK,
    )
    .await;
}

/// Redis keeps each pending turn's seq in a short field of its own, so
/// that finding the oldest pending turn loads no question: the field
/// leaves with its turn (finalized, aborted, expired), and a turn started
/// before such fields existed is still found (from its record).
async fn pending_seqs_are_read_without_loading_questions(backend: Backend) {
    if backend == Backend::Memory {
        return; // no records
    }
    let app = TestApp::spawn_with(backend, |s| {
        s.pending_ttl = std::time::Duration::from_millis(800)
    })
    .await;
    let s = session_of(&app, 1).await;
    // The marks: fields of 16 bytes (a turn id) and a 'p'. Counted, or
    // deleted, by a script on the node that holds the session.
    let key = format!("{}:{{{s}}}:r", app.settings.key_prefix);
    let marks = |app: &TestApp, delete: bool| -> usize {
        let script = "local n = 0 \
            for _, f in ipairs(redis.call('HKEYS', KEYS[1])) do \
              if #f == 17 and string.sub(f, 17) == 'p' then \
                n = n + 1 \
                if ARGV[1] == '1' then redis.call('HDEL', KEYS[1], f) end \
              end \
            end return n";
        let flag = if delete { "1" } else { "0" };
        let counts: Vec<usize> = app
            .on_every_redis(&["EVAL", script, "1", &key, flag])
            .iter()
            .filter_map(|out| out.trim().parse().ok())
            .collect();
        assert_eq!(counts.len(), 1, "one node holds the session: {counts:?}");
        counts[0]
    };
    // An old pending turn: its mark removed, as if started before marks.
    let old = app
        .started(json!({"session_id": s, "user_query": "q2"}))
        .await;
    assert_eq!(marks(&app, true), 1);
    assert_eq!(marks(&app, false), 0);
    app.complete(&s, "q3", "a3").await;

    let h = app.history_ok(&s, "limit=1").await;
    let p = problem(
        app.put_summary(&s, json!({"summary": "s", "through_seq": 2}))
            .await,
        422,
        "validation_failed",
    )
    .await;

    assert_eq!(h["unsummarized"]["through_seq"], 1, "{h}");
    assert!(p.to_string().contains("turn 2 is still pending"), "{p}");
    // Marks leave with their turns: finalized, aborted, expired.
    let aborted = app
        .started(json!({"session_id": s, "user_query": "q4"}))
        .await;
    let expiring = app
        .started(json!({"session_id": s, "user_query": "q5"}))
        .await;
    assert_eq!(marks(&app, false), 2);
    let res = app
        .finalize(&s, old["turn_id"].as_str().unwrap(), "a2")
        .await;
    assert_eq!(res.status(), 200);
    let res = app.abort(&s, aborted["turn_id"].as_str().unwrap()).await;
    assert_eq!(res.status(), 204);
    assert_eq!(marks(&app, false), 1);
    tokio::time::sleep(std::time::Duration::from_millis(1000)).await;
    app.complete(&s, "q6", "a6").await; // its start purges the expired one
    assert_eq!(marks(&app, false), 0, "{expiring}");
}

/// Summing what waits behind a pending turn costs a walk over it: past
/// MAX_WAITING (256) turns the tokens are not summed, the turns still named.
async fn many_turns_waiting_behind_a_pending_turn_are_not_summed(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    // The read returns the newest imported turn: the others wait. Up to
    // 256 the store sums stored counts; past it, the turns' texts are
    // counted instead (bounded by the read's budget): the same tokens.
    for waiting in [256, 257] {
        let s = session_of(&app, 2).await;
        app.started(json!({"session_id": s, "user_query": "pending"}))
            .await;
        let messages: Vec<Value> = (0..=waiting)
            .flat_map(|_| {
                [
                    json!({"role": "user", "content": "q"}),
                    json!({"role": "assistant", "content": "a"}),
                ]
            })
            .collect();
        let res = app.import(&s, json!({ "messages": messages })).await;
        assert_eq!(res.status(), 201);
        let h = app.history_ok(&s, "limit=1").await;
        let blocks = "User: q1\nAssistant: a1\n\nUser: q2\nAssistant: a2";
        assert_eq!(
            h["unsummarized"],
            json!({"after_seq": 0, "through_seq": 2, "turns": 2,
                   "tokens": count("o200k_base", blocks)}),
            "{waiting} waiting"
        );
    }
}

/// The loop of API.md: read with summary=true, fold what `unsummarized`
/// names (a range read) into the previous summary, write it with the
/// coverage it extends; the prompt then holds the summary and recent turns.
async fn a_client_folds_its_history_into_a_rolling_summary(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let s = session_of(&app, 6).await;
    let mut summary = String::new();
    let mut covered = 0;
    for _ in 0..3 {
        let h = app.history_ok(&s, "summary=true&limit=2").await;
        let Some(u) = h["unsummarized"].as_object().cloned() else {
            break;
        };
        assert_eq!(u["after_seq"], covered);
        let through = u["through_seq"].as_u64().unwrap();
        let range = app
            .history_ok(
                &s,
                &format!("format=turns&limit=10000&after_seq={covered}&through_seq={through}"),
            )
            .await;
        let folded: Vec<String> = range["turns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["user_query"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(folded.len() as u64, u["turns"].as_u64().unwrap());
        summary = format!("{summary}{}", folded.join(","));
        let res = app
            .put_summary(
                &s,
                json!({"summary": summary, "through_seq": through, "expected_through_seq": covered}),
            )
            .await;
        assert_eq!(res.status(), 200);
        covered = through;
    }
    let h = app.history_ok(&s, "summary=true&limit=2").await;
    assert_eq!(h["unsummarized"], Value::Null);
    assert_eq!(
        h["rendered"],
        "### Conversation summary:\nq1,q2,q3,q4\n\n### Conversation history:\n\
         User: q5\nAssistant: a5\n\nUser: q6\nAssistant: a6"
    );
}

async fn clearing_and_erasing_delete_the_summary(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let s = session_of(&app, 1).await;
    app.put_summary(&s, json!({"summary": "s", "through_seq": 1}))
        .await;
    assert_eq!(app.clear(&s).await.status(), 204);
    problem(app.get_summary(&s).await, 404, "summary_not_found").await;

    let owned = sid();
    let t = app
        .started(json!({"session_id": owned, "user_id": "erin", "user_query": "q"}))
        .await;
    app.finalize(&owned, t["turn_id"].as_str().unwrap(), "a")
        .await;
    let put = app
        .put_summary(
            &owned,
            json!({"summary": "s", "through_seq": 1, "user_id": "erin"}),
        )
        .await;
    assert_eq!(put.status(), 200);
    let (deleted, _) = app.erase_user_fully("erin").await;
    assert_eq!(deleted, 1);
    problem(app.get_summary(&owned).await, 404, "summary_not_found").await;
}

async fn a_summary_lands_only_on_the_generation_it_was_folded_from(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let s = session_of(&app, 3).await;
    let unknown = app.history_ok(&sid(), "").await;
    assert_eq!(unknown["generation"], Value::Null, "{unknown}");

    // Every read of one incarnation names the same generation.
    let read = app.history_ok(&s, "limit=1&summary=true").await;
    let generation = read["generation"]
        .as_str()
        .expect("a generation")
        .to_owned();
    let info = ok_json(app.session(&s).await, StatusCode::OK).await;
    assert_eq!(info["generation"], generation.as_str());
    let started = app
        .started(json!({"session_id": s, "user_query": "q4", "history": {}}))
        .await;
    assert_eq!(started["history"]["generation"], generation.as_str());

    // The session is cleared and made again with as many turns: a fold of
    // the old one is refused with 409 and writes nothing.
    let folded = json!({"summary": "The first conversation.", "through_seq": 2,
                        "expected_through_seq": 0, "expected_generation": generation});
    assert_eq!(app.clear(&s).await.status(), 204);
    for i in 1..=3 {
        app.complete(&s, &format!("new q{i}"), &format!("new a{i}"))
            .await;
    }
    let p = problem(
        app.put_summary(&s, folded.clone()).await,
        409,
        "summary_conflict",
    )
    .await;
    assert!(p["detail"].as_str().unwrap().contains("generation"), "{p}");
    problem(app.get_summary(&s).await, 404, "summary_not_found").await;
    let again = app.history_ok(&s, "limit=1&summary=true").await;
    let new_generation = again["generation"].as_str().unwrap();
    assert_ne!(new_generation, generation);

    // A session gone (cleared, not made again) refuses it too.
    assert_eq!(app.clear(&s).await.status(), 204);
    problem(app.put_summary(&s, folded).await, 409, "summary_conflict").await;

    // The new generation's own fold lands; so does one that names none.
    app.complete(&s, "q", "a").await;
    let now = app.history_ok(&s, "limit=1").await["generation"].clone();
    ok_json(
        app.put_summary(
            &s,
            json!({"summary": "S", "through_seq": 1, "expected_generation": now}),
        )
        .await,
        StatusCode::OK,
    )
    .await;
    problem(
        app.put_summary(
            &s,
            json!({"summary": "S", "through_seq": 1, "expected_generation": ""}),
        )
        .await,
        422,
        "validation_failed",
    )
    .await;
}
