//! Reads cost what they return (API.md v1.1): `stopped_by`, the history
//! byte cap, range reads, and reads that cross the Redis walk's pages (its
//! own budget, and turns it hands over to be counted) or must not load the
//! turns they do not return.

use std::sync::Arc;

use reqwest::StatusCode;
use serde_json::{Value, json};
use turnstore::domain::{SessionId, TurnId};
use turnstore::store::{StartTurn, Store};
use turnstore::tokens::{AnswerTokens, Encoding, QueryTokens};
use turnstore::turn::{Finalization, NewPendingTurn, now_millis};

use crate::support::{Backend, TestApp, count, ok_json, problem, seqs, sid};

conformance!(
    stopped_by_names_the_bound_that_left_turns_out,
    the_byte_cap_stops_at_whole_turns_as_rendered,
    range_reads_page_through_a_session,
    a_start_reads_its_history_with_the_same_options,
    reads_cross_the_walks_pages,
    a_read_loads_only_what_it_returns,
    unreadable_data_is_an_internal_error_not_an_outage,
);

async fn stopped_by_names_the_bound_that_left_turns_out(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let s = sid();
    for i in 1..=3 {
        app.complete(&s, &format!("q{i}"), &format!("a{i}")).await;
    }

    let all = app.history_ok(&s, "").await;
    let limited = app.history_ok(&s, "limit=2").await;
    let budget = app.history_ok(&s, "max_tokens=20").await;
    let nothing = app.history_ok(&s, "max_tokens=0").await;
    let none_asked = app.history_ok(&s, "limit=0&max_tokens=0").await;
    let exactly = app.history_ok(&s, "limit=3").await;
    let unknown = app.history_ok(&sid(), "").await;

    assert_eq!(all["stopped_by"], Value::Null);
    assert_eq!(
        (
            limited["stopped_by"].clone(),
            limited["included_turns"].clone()
        ),
        (json!("limit"), json!(2))
    );
    assert_eq!(budget["stopped_by"], "max_tokens");
    assert!(budget["token_count"].as_u64().unwrap() <= 20);
    assert_eq!(
        (nothing["stopped_by"].clone(), nothing["rendered"].clone()),
        (json!("max_tokens"), json!(""))
    );
    assert_eq!(none_asked["stopped_by"], "limit", "limit is named first");
    assert_eq!(exactly["stopped_by"], Value::Null, "every turn is in");
    assert_eq!(unknown["stopped_by"], Value::Null);
}

async fn the_byte_cap_stops_at_whole_turns_as_rendered(backend: Backend) {
    // Each turn's contents: 2 + 10 bytes; the cap holds two of them.
    let app = TestApp::spawn_with(backend, |s| s.max_history_bytes = 25).await;
    let s = sid();
    for i in 1..=3 {
        app.complete(&s, &format!("q{i}"), &"é".repeat(5)).await;
    }

    let capped = app.history_ok(&s, "format=turns").await;
    let truncated = app.history_ok(&s, "format=turns&max_answer_chars=1").await;
    let messages = app.history_ok(&s, "format=messages").await;

    assert_eq!(seqs(&capped), [2, 3]);
    assert_eq!(capped["stopped_by"], "max_bytes");
    assert_eq!(capped["omitted_turns"], 1);
    // "é [truncated]" is 14 bytes: with the question, 16 per turn.
    assert_eq!(seqs(&truncated), [3]);
    assert_eq!(truncated["turns"][0]["final_answer"], "é [truncated]");
    assert_eq!(messages["messages"].as_array().unwrap().len(), 4);
    assert_eq!(messages["stopped_by"], "max_bytes");
}

async fn range_reads_page_through_a_session(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let s = sid();
    for i in 1..=7 {
        app.complete(&s, &format!("q{i}"), &format!("a{i}")).await;
    }

    let middle = app
        .history_ok(&s, "format=turns&after_seq=2&through_seq=5")
        .await;
    let first_of_range = app
        .history_ok(&s, "format=turns&after_seq=2&limit=2&keep_first=true")
        .await;
    let empty = app.history_ok(&s, "after_seq=5&through_seq=5").await;
    let mut paged = Vec::new();
    let mut after = 0;
    loop {
        // Oldest first: each page is the range's newest, so walk down.
        let h = app
            .history_ok(
                &s,
                &format!(
                    "format=turns&limit=3&after_seq={after}&through_seq={}",
                    after + 3
                ),
            )
            .await;
        if h["included_turns"] == 0 {
            break;
        }
        paged.extend(seqs(&h));
        after += 3;
    }

    assert_eq!(seqs(&middle), [3, 4, 5]);
    assert_eq!(
        (middle["total_turns"].clone(), middle["stopped_by"].clone()),
        (json!(3), json!(null))
    );
    assert_eq!(
        seqs(&first_of_range),
        [3, 7],
        "the range's first turn is kept"
    );
    assert_eq!(
        (empty["total_turns"].clone(), empty["rendered"].clone()),
        (json!(0), json!(""))
    );
    assert_eq!(paged, (1..=7).collect::<Vec<u64>>());
    let bad = problem(
        app.history(&s, "after_seq=-1").await,
        422,
        "validation_failed",
    )
    .await;
    assert_eq!(bad["errors"][0]["field"], "after_seq");
}

async fn a_start_reads_its_history_with_the_same_options(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let s = sid();
    for i in 1..=4 {
        app.complete(&s, &format!("q{i}"), &format!("a{i}")).await;
    }

    let t = app
        .started(json!({"session_id": s, "user_query": "q5",
                        "history": {"format": "turns", "after_seq": 1, "limit": 2}}))
        .await;

    let h = &t["history"];
    assert_eq!(seqs(h), [3, 4]);
    assert_eq!(
        (h["total_turns"].clone(), h["stopped_by"].clone()),
        (json!(3), json!("limit"))
    );
}

/// Stores `n` finalized turns of the given texts straight through the
/// store, much faster than over HTTP; for the memory store, over HTTP.
async fn fill(app: &TestApp, session: &str, n: usize, query: &str, answer: &str) {
    let Some(store) = app.redis_store() else {
        for _ in 0..n {
            app.complete(session, query, answer).await;
        }
        return;
    };
    let session = SessionId::parse(session).unwrap();
    let enc = Encoding::O200kBase;
    let (q, a) = (
        QueryTokens::count(enc, query),
        AnswerTokens::count(enc, answer),
    );
    let store: Arc<dyn Store> = store;
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let (store, session) = (store.clone(), session.clone());
            let (query, answer) = (query.to_owned(), answer.to_owned());
            let share = n / 8 + usize::from(i < n % 8);
            tokio::spawn(async move {
                for _ in 0..share {
                    let id = TurnId::generate();
                    let now = now_millis();
                    let start = StartTurn {
                        session_id: &session,
                        user_id: None,
                        turn: NewPendingTurn {
                            turn_id: &id,
                            user_query: &query,
                            started_at: now,
                            idempotency_key: None,
                            tokens: &q,
                            english: None,
                        },
                        idempotency: None,
                        history: None,
                        new_session: false,
                        now,
                    };
                    store.start_turn(start).await.unwrap();
                    let end = Finalization {
                        final_answer: answer.clone(),
                        finalized_at: now,
                        tokens: a,
                        english: None,
                    };
                    store.finalize_turn(&session, id, &end).await.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
}

async fn reads_cross_the_walks_pages(backend: Backend) {
    // 12 turns of 100 KiB answers: more than one page (1 MiB) of records
    // the walk budgets itself; then 100 short turns read in another
    // encoding, handed over to be counted 64 at a time.
    let app = TestApp::spawn(backend).await;
    let (big, many) = (sid(), sid());
    let answer = "All work and no play makes a dull answer. ".repeat(2440);
    fill(&app, &big, 12, "big?", &answer).await;
    fill(
        &app,
        &many,
        100,
        "Short question, 12 words?",
        "Short answer.\n\n",
    )
    .await;

    let whole = app
        .history_ok(&big, "format=messages&limit=100&max_tokens=10000000")
        .await;
    let cut = app
        .history_ok(&big, "limit=100&max_tokens=10000000&max_answer_chars=7")
        .await;
    let o200k = app
        .history_ok(&many, "format=turns&limit=100&max_tokens=10000000")
        .await;
    let cl100k = app
        .history_ok(&many, "limit=100&max_tokens=10000000&encoding=cl100k_base")
        .await;
    let budgeted = app
        .history_ok(
            &many,
            "limit=100&max_tokens=1000&encoding=cl100k_base&format=turns",
        )
        .await;

    let ms = whole["messages"].as_array().unwrap();
    assert_eq!(ms.len(), 24);
    assert!(
        ms.iter()
            .skip(1)
            .step_by(2)
            .all(|m| m["content"] == answer.as_str())
    );
    assert_eq!(whole["stopped_by"], Value::Null);
    let expected: usize = ms
        .iter()
        .map(|m| count("o200k_base", m["content"].as_str().unwrap()) + 4)
        .sum();
    assert_eq!(whole["token_count"], expected);
    let rendered = cut["rendered"].as_str().unwrap();
    assert_eq!(
        rendered.matches("Assistant: All wor [truncated]").count(),
        12
    );
    assert_eq!(cut["token_count"], count("o200k_base", rendered));
    assert_eq!(o200k["included_turns"], 100);
    let text = cl100k["rendered"].as_str().unwrap();
    assert_eq!(text.matches("User: ").count(), 100);
    assert_eq!(cl100k["token_count"], count("cl100k_base", text));
    let n = budgeted["included_turns"].as_u64().unwrap();
    assert!(n > 10 && n < 100, "{budgeted}");
    assert_eq!(seqs(&budgeted), (101 - n..=100).collect::<Vec<u64>>());
    assert_eq!(budgeted["stopped_by"], "max_tokens");
}

/// Bytes Redis sent its clients so far (all nodes).
fn sent(app: &TestApp) -> u64 {
    app.redis_info_sum("stats", |l| {
        l.strip_prefix("total_net_output_bytes:")
            .map(|n| n.trim().parse::<u64>().unwrap())
    })
}

async fn a_read_loads_only_what_it_returns(backend: Backend) {
    // The worst session the limits allow: 1,000 turns of a 32 KiB question
    // and a 128 KiB answer (160 MB). Reads that return little must move
    // little out of Redis, whatever the session holds.
    let app = TestApp::spawn(backend).await;
    let s = sid();
    let query = "q".repeat(32 * 1024);
    let answer = "a ".repeat(64 * 1024);
    // Over HTTP, the memory store gets fewer: its reads move no bytes.
    let turns = if backend == Backend::Memory { 50 } else { 1000 };
    fill(&app, &s, turns, &query, &answer).await;

    let mut moved = Vec::new();
    for read in [
        "limit=10000&max_tokens=10",
        "limit=10000&max_tokens=10&encoding=cl100k_base",
        "limit=10000&max_tokens=10000000&max_query_chars=5&max_answer_chars=5&format=turns",
    ] {
        let before = sent(&app);
        let res = app.history(&s, read).await;
        let h = ok_json(res, StatusCode::OK).await;
        moved.push((read, sent(&app) - before, h));
    }

    let (_, _, tiny) = &moved[0];
    assert_eq!(
        (tiny["included_turns"].clone(), tiny["stopped_by"].clone()),
        (json!(0), json!("max_tokens"))
    );
    assert_eq!(tiny["total_turns"], turns);
    let (_, _, counted) = &moved[1];
    assert_eq!(counted["included_turns"], 0);
    let (_, _, cut) = &moved[2];
    assert_eq!(cut["included_turns"], turns);
    assert_eq!(cut["turns"][0]["final_answer"], "a a a [truncated]");
    if backend != Backend::Memory {
        // One record at most for the first two; 1,000 cut records for the last.
        let bounds = [64 * 1024, 512 * 1024, 512 * 1024];
        for ((read, bytes, _), bound) in moved.iter().zip(bounds) {
            assert!(*bytes < bound, "{read}: Redis sent {bytes} bytes");
        }
    }
}

/// A script that fails on data it cannot read would fail alike on a retry:
/// a 500 `internal` (logged), not a 503 that tells clients to retry, and
/// the store stays ready.
async fn unreadable_data_is_an_internal_error_not_an_outage(backend: Backend) {
    if backend == Backend::Memory {
        return; // its data is typed
    }
    let app = TestApp::spawn(backend).await;
    let s = sid();
    app.complete(&s, "q1", "a1").await;
    let turns = format!("{}:{{{s}}}:s", app.settings.key_prefix);
    app.on_every_redis(&["ZREMRANGEBYSCORE", &turns, "1", "1"]);
    app.on_every_redis(&["ZADD", &turns, "1", "not a member"]);

    let res = app.history(&s, "").await;

    let p = problem(res, 500, "internal").await;
    assert!(!p.to_string().contains("user_script"), "{p}");
    let ready = app.http.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 200);
    let metrics = app.metrics().await;
    assert!(
        metrics.contains("op=\"history\",kind=\"corrupt\""),
        "{metrics}"
    );
}
