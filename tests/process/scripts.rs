//! How the Lua scripts are called: one FCALL an operation, from a function
//! library loaded on first use and again when Redis has lost it; EVALSHA
//! where Redis has no functions.

use std::time::Duration;

use serde_json::{Value, json};

use super::client;
use super::harness::{Redis, Turnstore};

/// One question on `sid` (a start with its history, then the answer), by
/// `user` if given; returns the seq it got.
async fn ask(http: &reqwest::Client, base: &str, sid: &str, user: Option<&str>) -> u64 {
    let mut body = json!({"session_id": sid, "user_query": "q", "history": {"limit": 20}});
    if let Some(user) = user {
        body["user_id"] = json!(user);
    }
    let res = http
        .post(format!("{base}/v1/turns"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert!(res.status().is_success(), "{}", res.status());
    let started: Value = res.json().await.unwrap();
    let tid = started["turn_id"].as_str().unwrap();
    let res = http
        .post(format!("{base}/v1/sessions/{sid}/turns/{tid}/finalize"))
        .json(&json!({"final_answer": "a"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    started["seq"].as_u64().unwrap()
}

/// Calls of `command` Redis has counted (`INFO commandstats`).
fn calls(redis: &Redis, command: &str) -> u64 {
    let info = redis.cli(&["INFO", "commandstats"]);
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_library_redis_has_lost_is_loaded_again() {
    // Arrange: a question loaded the library; then Redis loses it (as a
    // restart without persistence would).
    let redis = Redis::unix();
    let ts = Turnstore::spawn(&[("TURNSTORE_REDIS_URL", redis.url())]);
    let http = client();
    assert_eq!(ask(&http, &ts.base(), "lost", None).await, 1);
    assert_eq!(calls(&redis, "function|load"), 1);
    redis.cli(&["FUNCTION", "FLUSH"]);

    // Act
    let seq = ask(&http, &ts.base(), "lost", None).await;

    // Assert: the question went through, on the library loaded again.
    assert_eq!(seq, 2);
    assert_eq!(calls(&redis, "function|load"), 2);
    assert!(
        redis.cli(&["FUNCTION", "LIST"]).contains("turnstore_"),
        "{}",
        redis.cli(&["FUNCTION", "LIST"])
    );
    assert_eq!(calls(&redis, "evalsha"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_without_functions_runs_the_scripts_by_evalsha() {
    // Arrange: a Redis that knows neither FCALL nor FUNCTION, as Redis 6
    // (or an ACL user without them).
    let redis = Redis::unix_with(&[
        "--rename-command",
        "FCALL",
        "",
        "--rename-command",
        "FUNCTION",
        "",
    ]);
    let ts = Turnstore::spawn(&[("TURNSTORE_REDIS_URL", redis.url())]);
    let http = client();

    // Act
    for _ in 0..3 {
        ask(&http, &ts.base(), "old", None).await;
    }
    let history: Value = http
        .get(format!(
            "{}/v1/sessions/old/history?format=turns",
            ts.base()
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();

    // Assert: every operation ran; FCALL was tried once, and it is said once.
    assert_eq!(history["included_turns"], 3, "{history}");
    assert!(
        calls(&redis, "evalsha") >= 7,
        "{}",
        redis.cli(&["INFO", "commandstats"])
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        ts.log().matches("Redis runs no functions here").count(),
        1,
        "{}",
        ts.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_hot_path_operation_is_one_redis_command() {
    // Arrange: every script already loaded and the layout checked, so what
    // follows is the steady state; MONITOR sees each command Redis runs.
    let redis = Redis::unix();
    let ts = Turnstore::spawn(&[("TURNSTORE_REDIS_URL", redis.url())]);
    let http = client();
    let base = ts.base();
    let question = |sid: &'static str, user: Option<&'static str>| {
        let (http, base) = (http.clone(), base.clone());
        async move { ask(&http, &base, sid, user).await }
    };
    let history = |sid: &str| {
        let req = http.get(format!("{base}/v1/sessions/{sid}/history"));
        async move { assert_eq!(req.send().await.unwrap().status(), 200) }
    };
    question("warm", Some("warm-user")).await;
    history("warm").await;
    let monitor = redis.monitor();

    // Act: a session's first question (its user claims it), a second one
    // with the history, and a history read.
    question("rt-1", Some("alice")).await;
    question("rt-1", Some("alice")).await;
    history("rt-1").await;

    // Assert: one FCALL per operation, but for the claim: the start
    // script asks for the user's index entry first (writing nothing), the
    // index script writes it, and the start runs again.
    let from_clients = || -> Vec<String> {
        let cmds = monitor.commands();
        cmds.into_iter()
            .filter(|(src, _)| src != "lua")
            .map(|(_, name)| name)
            .collect()
    };
    let expected = ["FCALL"; 7];
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while from_clients().len() < expected.len() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await; // room for any extra
    assert_eq!(from_clients(), expected, "{:?}", monitor.commands());
    assert!(
        monitor
            .commands()
            .iter()
            .any(|(src, name)| src == "lua" && name == "HMGET"),
        "the scripts' own commands are seen too: {:?}",
        monitor.commands()
    );
}
