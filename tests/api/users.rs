//! A user's sessions (API.md v1.1): the list is paged, the index is never
//! behind the data whatever requests race or fail, and erasure finishes
//! for any number of sessions, over as many calls as it takes.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;
use turnstore::domain::{SessionId, TurnId, UserId};
use turnstore::store::{Erased, MemoryStore, StartTurn, Store};
use turnstore::tokens::{Encoding, QueryTokens};
use turnstore::turn::{NewPendingTurn, now_millis};
use turnstore::{Settings, app};

use crate::harness::Redis;
use crate::support::{Backend, TestApp, ok_json, problem, sid};

conformance!(
    the_list_pages_with_cursors,
    a_clear_racing_starts_leaves_every_live_session_listed,
    a_start_whose_reply_is_lost_is_listed_if_it_was_written,
    the_list_puts_the_latest_question_first,
    an_erased_user_leaves_no_trace,
);

fn user() -> String {
    format!("u-{}", uuid::Uuid::new_v4().simple())
}

async fn the_list_pages_with_cursors(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let u = user();
    let mut made = Vec::new();
    for _ in 0..7 {
        let s = sid();
        app.started(json!({"session_id": s, "user_id": u, "user_query": "q"}))
            .await;
        made.push(s);
    }

    let first = app.user_sessions_page(&u, "limit=3").await;
    let all = app.all_user_sessions(&u, 3).await;
    let default = app.user_sessions(&u).await;

    assert_eq!(first["sessions"].as_array().unwrap().len(), 3);
    assert!(first["next_cursor"].is_string());
    made.reverse();
    assert_eq!(all, made, "most recently active first, each once");
    assert_eq!(default["sessions"].as_array().unwrap().len(), 7);
    assert_eq!(default["next_cursor"], json!(null));
    for bad in [
        "cursor=abc",
        "cursor=-5",
        "cursor=",
        "limit=0",
        "limit=1001",
        "limit=x",
        "page=2",
    ] {
        let res = app
            .http
            .get(app.url(&format!("/v1/users/{u}/sessions?{bad}")))
            .send()
            .await
            .unwrap();
        problem(res, 422, "validation_failed").await;
    }
}

/// Every session the user owns is listed, and the list holds nothing else.
async fn assert_listed_exactly_the_live(app: &TestApp, user: &str, sessions: &[String]) {
    let mut live = BTreeSet::new();
    for s in sessions {
        let res = app.session(s).await;
        if res.status() == 200 {
            let info: serde_json::Value = res.json().await.unwrap();
            if info["user_id"] == user {
                live.insert(s.clone());
            }
        }
    }
    let listed: BTreeSet<String> = app.all_user_sessions(user, 7).await.into_iter().collect();
    assert_eq!(listed, live, "{}", app.store_log());
}

async fn a_clear_racing_starts_leaves_every_live_session_listed(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let u = user();
    let sessions: Vec<String> = (0..60).map(|_| sid()).collect();

    // Act: per session, two starts by the user and two clears, at once.
    let mut tasks = Vec::new();
    for (i, s) in sessions.iter().enumerate() {
        for op in 0..4 {
            let (http, base, s, u) = (app.http.clone(), app.base.clone(), s.clone(), u.clone());
            tasks.push(tokio::spawn(async move {
                if (op + i) % 2 == 0 {
                    http.post(format!("{base}/v1/turns"))
                        .json(&json!({"session_id": s, "user_id": u, "user_query": "q"}))
                        .send()
                        .await
                        .unwrap()
                        .status()
                } else {
                    http.delete(format!("{base}/v1/sessions/{s}"))
                        .send()
                        .await
                        .unwrap()
                        .status()
                }
            }));
        }
    }
    for t in tasks {
        let status = t.await.unwrap();
        assert!([201, 204].contains(&status.as_u16()), "{status}");
    }

    // Assert: listed iff alive; then an erasure leaves nothing.
    assert_listed_exactly_the_live(&app, &u, &sessions).await;
    let (_, _calls) = app.erase_user_fully(&u).await;
    for s in &sessions {
        problem(app.session(s).await, 404, "session_not_found").await;
    }
    assert!(app.all_user_sessions(&u, 100).await.is_empty());
}

async fn a_start_whose_reply_is_lost_is_listed_if_it_was_written(backend: Backend) {
    if backend == Backend::Memory {
        return; // no reply to lose
    }
    let app = TestApp::spawn(backend).await;
    let u = user();
    let known = sid();
    app.started(json!({"session_id": known, "user_query": "q"}))
        .await;
    let fresh = sid();

    // Act: Redis holds every write for longer than the store timeout, so
    // the starts answer 503; the commands already sent run afterwards.
    app.on_every_redis(&["CLIENT", "PAUSE", "2500", "WRITE"]);
    let (claim, create, generated) = tokio::join!(
        app.start(json!({"session_id": known, "user_id": u, "user_query": "claim"})),
        app.start(json!({"session_id": fresh, "user_id": u, "user_query": "new"})),
        app.start(json!({"user_id": u, "user_query": "made here"})),
    );
    let statuses = [claim.status(), create.status(), generated.status()];
    tokio::time::sleep(Duration::from_millis(3000)).await;

    // Assert
    assert!(
        statuses
            .iter()
            .all(|s| *s == StatusCode::SERVICE_UNAVAILABLE),
        "{statuses:?}"
    );
    assert_listed_exactly_the_live(&app, &u, &[known, fresh]).await;
    let again = app.all_user_sessions(&u, 10).await;
    for s in &again {
        ok_json(app.session(s).await, StatusCode::OK).await;
    }
}

async fn start_owned(store: &Arc<dyn Store>, session: &SessionId, user: &UserId) {
    let (id, now) = (TurnId::generate(), now_millis());
    let tokens = QueryTokens::count(Encoding::O200kBase, "q");
    store
        .start_turn(StartTurn {
            session_id: session,
            user_id: Some(user),
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
            new_session: true,
            now,
        })
        .await
        .unwrap();
}

/// `n` sessions of one user, written through the store, 32 at a time.
async fn sessions_of(store: &Arc<dyn Store>, user: &UserId, n: usize) {
    let tasks: Vec<_> = (0..32)
        .map(|i| {
            let (store, user) = (store.clone(), user.clone());
            tokio::spawn(async move {
                for j in (i..n).step_by(32) {
                    let s = SessionId::parse(format!("{}-{j}", user.as_str())).unwrap();
                    start_owned(&store, &s, &user).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
}

/// An erasure with no time left deletes one batch (1,000 sessions) and
/// says it is not complete; the next calls go on from there.
async fn erasure_continues_where_it_stopped(store: Arc<dyn Store>) {
    let u = UserId::parse(user()).unwrap();
    sessions_of(&store, &u, 2500).await;

    let mut calls = Vec::new();
    loop {
        let e = store.erase_user(&u, Duration::ZERO).await.unwrap();
        calls.push(e);
        if e.complete {
            break;
        }
    }

    let done = |deleted_sessions, complete| Erased {
        deleted_sessions,
        complete,
    };
    assert_eq!(
        calls,
        [done(1000, false), done(1000, false), done(500, true)]
    );
    let page = store
        .user_sessions(&u, 10, None, now_millis())
        .await
        .unwrap();
    assert!(page.sessions.is_empty() && page.next_cursor.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_erasure_continues_where_it_stopped() {
    let settings = Settings::default();
    let limits = app::limits(&settings);
    let metrics = turnstore::metrics::Metrics::new();
    erasure_continues_where_it_stopped(Arc::new(MemoryStore::new(limits, metrics.expired_pending)))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_erasure_continues_where_it_stopped() {
    let redis = Redis::unix();
    let settings = Settings {
        redis_url: Some(redis.url()),
        ..Settings::default()
    };
    let metrics = turnstore::metrics::Metrics::new();
    erasure_continues_where_it_stopped(Arc::new(app::redis_store(&settings, &metrics).unwrap()))
        .await;
}

/// The largest user this suite makes: 100,000 sessions, listed page by
/// page and erased over HTTP (as many calls as the request timeout needs;
/// `bench/erase` measures how long they take).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_with_100000_sessions_is_listed_and_erased() {
    let app = TestApp::spawn(Backend::Redis).await;
    let store = app.redis_store().unwrap();
    let u = user();
    let user_id = UserId::parse(u.clone()).unwrap();
    sessions_of(&store, &user_id, 100_000).await;

    let listed = app.all_user_sessions(&u, 1000).await;
    let (deleted, calls) = app.erase_user_fully(&u).await;

    assert_eq!(listed.len(), 100_000);
    assert_eq!(
        listed.iter().collect::<BTreeSet<_>>().len(),
        100_000,
        "each once"
    );
    assert_eq!(deleted, 100_000, "in {calls} calls");
    eprintln!("100,000 sessions erased in {calls} call(s)");
    assert!(app.all_user_sessions(&u, 1000).await.is_empty());
    // Nothing of the sessions is left but their fences, which expire.
    let prefix = &app.settings.key_prefix;
    for kind in ["h", "r", "s"] {
        let left = app.on_every_redis(&["KEYS", &format!("{prefix}:{{*}}:{kind}")]);
        assert!(left[0].trim().is_empty(), "{kind}: {left:?}");
    }
    let index = app.on_every_redis(&["EXISTS", &format!("{prefix}:u:{u}")]);
    assert_eq!(index[0].trim(), "0");
}

async fn the_list_puts_the_latest_question_first(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let u = user();
    let (a, b, c) = (sid(), sid(), sid());
    for s in [&a, &b, &c] {
        app.complete_as(s, &u, "q", "a").await;
    }
    assert_eq!(
        app.all_user_sessions(&u, 10).await,
        [c.as_str(), b.as_str(), a.as_str()]
    );

    // A question in the oldest conversation (without its user id: the
    // owner's list still follows) puts it first; an import puts another
    // first; a finalize changes nothing (the question was the activity).
    // Order is kept to the second: each step waits one.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let t = app
        .started(json!({"session_id": a, "user_query": "back to this one"}))
        .await;
    assert_eq!(
        app.all_user_sessions(&u, 10).await,
        [a.as_str(), c.as_str(), b.as_str()]
    );
    assert_eq!(
        app.all_user_sessions(&u, 1).await,
        [a.as_str(), c.as_str(), b.as_str()],
        "paged alike"
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let res = app
        .import(
            &b,
            json!({"messages": [{"role": "user", "content": "q"},
                                        {"role": "assistant", "content": "a"}]}),
        )
        .await;
    assert_eq!(res.status(), StatusCode::CREATED);
    assert_eq!(
        app.all_user_sessions(&u, 10).await,
        [b.as_str(), a.as_str(), c.as_str()]
    );
    let res = app
        .finalize(&a, t["turn_id"].as_str().unwrap(), "done")
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(
        app.all_user_sessions(&u, 10).await,
        [b.as_str(), a.as_str(), c.as_str()]
    );

    // Within the same second, the order holds still (no index write).
    app.started(json!({"session_id": c, "user_query": "quick"}))
        .await;
    app.started(json!({"session_id": c, "user_query": "quicker"}))
        .await;
    let listed = app.all_user_sessions(&u, 10).await;
    assert_eq!(
        listed[0], c,
        "a question a second after the last move: {listed:?}"
    );
}

/// Every key the app's Redis holds under its prefix, with its contents,
/// as text (hashes, sorted sets and strings: the types turnstore writes).
fn everything_stored(app: &TestApp) -> String {
    let pattern = format!("{}*", app.settings.key_prefix);
    let mut out = String::new();
    for keys in app.on_every_redis(&["--scan", "--pattern", &pattern]) {
        for key in keys.lines().filter(|k| !k.is_empty()) {
            out.push_str(&format!("{key}:\n"));
            for cmd in [
                &["HGETALL", key][..],
                &["ZRANGE", key, "0", "-1", "WITHSCORES"],
                &["GET", key],
            ] {
                for reply in app.on_every_redis(cmd) {
                    if !reply.contains("WRONGTYPE") && !reply.contains("MOVED") {
                        out.push_str(&reply);
                    }
                }
            }
        }
    }
    out
}

async fn an_erased_user_leaves_no_trace(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let u = user();
    let sessions: Vec<String> = (0..40).map(|_| sid()).collect();
    for s in &sessions {
        app.complete_as(s, &u, "q", "a").await;
    }
    if backend != Backend::Memory {
        assert!(
            everything_stored(&app).contains(&u),
            "the probe sees the user id"
        );
    }

    // Questions race the erasure (without a user id: those that come after
    // it make sessions of nobody's). Each moves its entry up, a second
    // after the last move, so entries move while the erasure removes them.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let mut racing = Vec::new();
    for s in sessions.clone() {
        let (http, base) = (app.http.clone(), app.base.clone());
        racing.push(tokio::spawn(async move {
            http.post(format!("{base}/v1/turns"))
                .json(&json!({"session_id": s, "user_query": "q"}))
                .send()
                .await
                .unwrap()
                .status()
        }));
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    app.erase_user_fully(&u).await;
    for r in racing {
        assert_eq!(r.await.unwrap(), StatusCode::CREATED);
    }

    assert!(app.all_user_sessions(&u, 100).await.is_empty());
    if backend != Backend::Memory {
        let stored = everything_stored(&app);
        assert!(
            !stored.contains(&u),
            "the user id is still stored:\n{stored}"
        );
    }
}
