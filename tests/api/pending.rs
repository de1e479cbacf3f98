//! The pending-turn cap (API.md v1.1): one start more than
//! `TURNSTORE_MAX_PENDING_TURNS` is a 429 with `Retry-After`, writes
//! nothing, and comes after the owner and idempotency checks.

use reqwest::StatusCode;
use serde_json::json;

use crate::support::{Backend, TestApp, ok_json, problem, sid};

conformance!(
    one_start_past_the_pending_cap_is_429_and_writes_nothing,
    the_default_cap_holds_under_concurrent_starts,
);

async fn one_start_past_the_pending_cap_is_429_and_writes_nothing(backend: Backend) {
    let app = TestApp::spawn_with(backend, |s| s.max_pending_turns = 3).await;
    let s = sid();
    let keyed = ok_json(
        app.start_with_key(
            "k-1",
            json!({"session_id": s, "user_id": "cap-user", "user_query": "q1"}),
        )
        .await,
        StatusCode::CREATED,
    )
    .await;
    for i in 2..=3 {
        app.started(json!({"session_id": s, "user_query": format!("q{i}")}))
            .await;
    }

    let refused = app
        .start(json!({"session_id": s, "user_query": "one too many"}))
        .await;
    let retry_after: u64 = refused.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let replay = app
        .start_with_key(
            "k-1",
            json!({"session_id": s, "user_id": "cap-user", "user_query": "q1"}),
        )
        .await;
    let stranger = app
        .start(json!({"session_id": s, "user_id": "someone-else", "user_query": "q"}))
        .await;

    problem(refused, 429, "too_many_pending_turns").await;
    assert!((1..=15 * 60).contains(&retry_after), "{retry_after}");
    assert_eq!(replay.status(), 200, "a replay at the cap still answers");
    problem(stranger, 403, "session_owner_mismatch").await;
    let info = ok_json(app.session(&s).await, StatusCode::OK).await;
    assert_eq!(info["pending_count"], 3, "nothing was written");
    // Finalizing one frees a place; the refused start took no seq.
    let res = app
        .finalize(&s, keyed["turn_id"].as_str().unwrap(), "a1")
        .await;
    ok_json(res, StatusCode::OK).await;
    let next = app
        .started(json!({"session_id": s, "user_query": "q4"}))
        .await;
    assert_eq!(next["seq"], 4);
}

async fn the_default_cap_holds_under_concurrent_starts(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let s = sid();

    let tasks: Vec<_> = (0..80)
        .map(|i| {
            let (http, url, s) = (app.http.clone(), app.url("/v1/turns"), s.clone());
            tokio::spawn(async move {
                http.post(url)
                    .json(&json!({"session_id": s, "user_query": format!("q{i}")}))
                    .send()
                    .await
                    .unwrap()
                    .status()
                    .as_u16()
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.unwrap());
    }

    statuses.sort_unstable();
    assert_eq!(statuses.iter().filter(|s| **s == 201).count(), 64);
    assert_eq!(statuses.iter().filter(|s| **s == 429).count(), 16);
    let info = ok_json(app.session(&s).await, StatusCode::OK).await;
    assert_eq!(info["pending_count"], 64);
}
