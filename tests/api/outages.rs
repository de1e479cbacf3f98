//! Store failures as clients and probes see them (issue 19): each 503
//! names its class in our words (never Redis' own text), readiness follows
//! writes (a Redis out of memory answers PING and refuses every write),
//! and a restarted Redis costs no request.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;

use crate::support::{Backend, TestApp, ok_json, problem, seqs, sid};

/// Redis' words for a write refused out of memory.
const REDIS_OOM_TEXT: &str = "command not allowed";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_out_of_memory_is_named_and_unready() {
    let app = TestApp::spawn(Backend::Redis).await;
    let Some(redis) = app.redis.as_ref() else {
        return; // an external Redis is not the test's to fill
    };
    let (s, cleared, erased) = (sid(), sid(), sid());
    app.complete(&s, "q", "a").await;
    app.complete(&cleared, "q", "a").await;
    app.complete_as(&erased, "oom-user", "q", "a").await;

    redis.cli(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    redis.cli(&["CONFIG", "SET", "maxmemory", "1"]);
    let start = app
        .start(json!({"session_id": s, "user_query": "q2"}))
        .await;
    let ready = app.http.get(app.url("/readyz")).send().await.unwrap();

    let p = problem(start, 503, "store_unavailable").await;
    let detail = p["detail"].as_str().unwrap();
    assert!(detail.contains("out of memory"), "{p}");
    assert!(detail.contains("nothing was written"), "{p}");
    assert!(
        !detail.contains(REDIS_OOM_TEXT) && !detail.contains("OOM"),
        "{p}"
    );
    let p = problem(ready, 503, "store_unavailable").await;
    assert!(
        p["detail"].as_str().unwrap().contains("out of memory"),
        "{p}"
    );
    assert!(
        !p["detail"].as_str().unwrap().contains(REDIS_OOM_TEXT),
        "{p}"
    );
    let metrics = app.metrics().await;
    assert!(metrics.contains(r#"kind="out_of_memory""#), "{metrics}");
    // Reads and erasure are not refused: a full Redis still frees memory.
    let h = ok_json(app.history(&s, "format=turns").await, StatusCode::OK).await;
    assert_eq!(seqs(&h), [1]);
    assert_eq!(app.clear(&cleared).await.status(), StatusCode::NO_CONTENT);
    assert_eq!(app.erase_user("oom-user").await.status(), StatusCode::OK);
    for gone in [&cleared, &erased] {
        let h = ok_json(app.history(gone, "").await, StatusCode::OK).await;
        assert_eq!(h["total_turns"], 0, "{h}");
    }

    redis.cli(&["CONFIG", "SET", "maxmemory", "0"]);
    let ready = app.http.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), StatusCode::OK);
    let h = app.history_ok(&s, "format=turns").await;
    assert_eq!(seqs(&h), [1], "the refused start wrote nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_redis_costs_no_request() {
    let mut app = TestApp::spawn(Backend::Redis).await;
    if app.redis.is_none() {
        return; // an external Redis is not the test's to restart
    }
    // Every pooled connection has served a request.
    let warm = sid();
    for _ in 0..16 {
        ok_json(app.history(&warm, "").await, StatusCode::OK).await;
    }

    app.redis.as_mut().unwrap().restart();
    tokio::time::sleep(Duration::from_millis(100)).await;

    // Starts (no idempotency key: a second run would make a second turn)
    // and reads, each on the pool's next connection, all answered.
    let s = sid();
    for i in 1..=16 {
        let res = app
            .start(json!({"session_id": s, "user_query": format!("q{i}")}))
            .await;
        assert_eq!(
            res.status(),
            StatusCode::CREATED,
            "{}",
            res.text().await.unwrap()
        );
        ok_json(app.history(&s, "").await, StatusCode::OK).await;
    }
    let info = ok_json(app.session(&s).await, StatusCode::OK).await;
    assert_eq!(info["pending_count"], 16, "one turn a start: {info}");
}

/// What makes a second run of a write harmless, where the Redis store
/// tries a call again after its connection died: a start or an import run
/// twice (the same turn ids: the same request) makes its turns once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_or_import_run_twice_writes_once() {
    use turnstore::domain::{SessionId, TurnId};
    use turnstore::store::{Import, ImportedTurn, StartTurn};
    use turnstore::tokens::{AnswerTokens, Encoding, QueryTokens};
    use turnstore::turn::{NewPendingTurn, now_millis};

    for backend in [Backend::Redis, Backend::Cluster] {
        let app = TestApp::spawn(backend).await;
        let store = app.redis_store().unwrap();
        let s = SessionId::parse(sid()).unwrap();
        let (id, now) = (TurnId::generate(), now_millis());
        let tokens = QueryTokens::count(Encoding::O200kBase, "q");
        let start = || StartTurn {
            session_id: &s,
            user_id: None,
            turn: NewPendingTurn {
                turn_id: &id,
                user_query: "q",
                started_at: now,
                idempotency_key: None,
                tokens: &tokens,
                english: None,
            },
            idempotency: None,
            history: None,
            new_session: false,
            now,
        };
        let first = store.start_turn(start()).await.unwrap();
        let second = store.start_turn(start()).await.unwrap();
        assert_eq!((second.turn_id, second.seq), (first.turn_id, first.seq));
        assert!(
            !second.replayed,
            "answered as the first run would have been"
        );

        let turns: Vec<ImportedTurn> = (0..3)
            .map(|_| ImportedTurn {
                turn_id: TurnId::generate(),
                user_query: "q".into(),
                final_answer: "a".into(),
                query_tokens: QueryTokens::count(Encoding::O200kBase, "q"),
                answer_tokens: AnswerTokens::count(Encoding::O200kBase, "a"),
                times: None,
            })
            .collect();
        let import = || Import {
            session_id: &s,
            user_id: None,
            turns: &turns,
            idempotency: None,
            now,
        };
        let first = store.import(import()).await.unwrap();
        let second = store.import(import()).await.unwrap();
        assert_eq!((first.first_seq, first.last_seq), (2, 4));
        assert_eq!((second.first_seq, second.last_seq), (2, 4));

        let info = ok_json(app.session(s.as_str()).await, StatusCode::OK).await;
        assert_eq!(
            (info["turn_count"].clone(), info["pending_count"].clone()),
            (json!(3), json!(1))
        );
    }
}
