//! Tests of the real `turnstore` binary: graceful shutdown on SIGTERM, what
//! its logs may never contain, Redis over TLS, the container health check;
//! slow, idle and piled-up connections and heavy reads (`edge`); what the
//! start and `/readyz` say of a Redis it cannot use (`startup`); how the
//! Lua scripts are called (`scripts`); the traces sent to an OTLP
//! receiver (`traces`).

mod edge;
#[path = "../fixtures/fake_llm.rs"]
mod fake_llm;
mod harness;
mod migrate;
mod scale;
mod scripts;
mod startup;
mod traces;

use std::time::Duration;

use harness::{Redis, Turnstore};
use serde_json::{Value, json};

pub(crate) fn client() -> reqwest::Client {
    // A fresh connection per request: each request is either refused or accepted.
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_accepted_requests_finish_then_exits_zero() {
    // Arrange: a Redis that will stall every write, so requests stay in flight.
    let redis = Redis::unix();
    let mut ts = Turnstore::spawn(&[
        ("TURNSTORE_REDIS_URL", redis.url()),
        ("TURNSTORE_STORE_TIMEOUT", "10s".into()),
        ("TURNSTORE_REQUEST_TIMEOUT", "15s".into()),
    ]);
    let http = client();
    let url = format!("{}/v1/turns", ts.base());
    let warm = http
        .post(&url)
        .json(&json!({"user_query": "warm up"}))
        .send()
        .await
        .unwrap();
    assert_eq!(warm.status(), 201, "{}", ts.log());

    // Act: 16 starts stall in Redis; SIGTERM arrives while they are in flight.
    redis.cli(&["CLIENT", "PAUSE", "1500", "WRITE"]);
    let in_flight: Vec<_> = (0..16)
        .map(|i| {
            let (http, url) = (http.clone(), url.clone());
            tokio::spawn(async move {
                http.post(&url)
                    .json(&json!({"session_id": format!("drain-{i}"), "user_query": "q"}))
                    .send()
                    .await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        in_flight.iter().all(|t| !t.is_finished()),
        "the requests were meant to be stalled in Redis"
    );
    ts.sigterm();

    // Assert: every accepted request succeeded, and the process exited 0.
    for task in in_flight {
        let res = task.await.unwrap().expect("an accepted request failed");
        assert_eq!(res.status(), 201, "{}", ts.log());
    }
    let status = ts.wait(Duration::from_secs(10));
    assert!(status.success(), "exit status {status:?}\n{}", ts.log());
    assert!(ts.log().contains("shutting down"), "{}", ts.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_hold_no_content_keys_or_redis_password() {
    // Arrange: Redis with a password, an API key, JSON logs, debug level.
    const PASSWORD: &str = "redis-pw-5f2b9c";
    const KEY: &str = "api-key-8e1d0a";
    const QUESTION: &str = "question-marker-7c3e about quarterly revenue";
    const ANSWER: &str = "answer-marker-2a9f: revenue grew";
    let redis = Redis::tcp(&["--requirepass", PASSWORD]);
    let url = format!("redis://:{PASSWORD}@127.0.0.1:{}", redis.port());
    let keys_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(keys_file.path(), format!("# keys\n{KEY}\n")).unwrap();
    let mut ts = Turnstore::spawn(&[
        ("TURNSTORE_REDIS_URL", url),
        (
            "TURNSTORE_API_KEYS_FILE",
            keys_file.path().display().to_string(),
        ),
        ("TURNSTORE_LOG_FORMAT", "json".into()),
        ("RUST_LOG", "debug".into()),
    ]);
    let http = client();
    let base = ts.base();
    let auth = format!("Bearer {KEY}");

    // Act: a full run, with failures of every kind.
    let start: Value = http
        .post(format!("{base}/v1/turns"))
        .header("authorization", &auth)
        .header("x-request-id", "req-log-test-1")
        .json(&json!({"user_id": "u1", "user_query": QUESTION}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let (sid, tid) = (
        start["session_id"].as_str().unwrap(),
        start["turn_id"].as_str().unwrap(),
    );
    let fin = http
        .post(format!("{base}/v1/sessions/{sid}/turns/{tid}/finalize"))
        .header("authorization", &auth)
        .json(&json!({"final_answer": ANSWER}))
        .send()
        .await
        .unwrap();
    assert_eq!(fin.status(), 200, "{}", ts.log());
    let conflict = http
        .post(format!("{base}/v1/sessions/{sid}/turns/{tid}/finalize"))
        .header("authorization", &auth)
        .json(&json!({"final_answer": format!("{ANSWER} (edited)")}))
        .send()
        .await
        .unwrap();
    assert_eq!(conflict.status(), 409);
    let history = http
        .get(format!("{base}/v1/sessions/{sid}/history"))
        .header("authorization", &auth)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(history.contains(ANSWER));
    let wrong_key = http
        .get(format!("{base}/v1/sessions/{sid}/history"))
        .header("authorization", format!("Bearer {KEY}-wrong"))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong_key.status(), 401);
    let invalid = http
        .post(format!("{base}/v1/turns"))
        .header("authorization", &auth)
        .json(&json!({"user_query": QUESTION, "history": {"limit": "many"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(invalid.status(), 422);
    drop(redis); // store failures get logged with their causes
    let down = http
        .post(format!("{base}/v1/turns"))
        .header("authorization", &auth)
        .json(&json!({"user_query": QUESTION}))
        .send()
        .await
        .unwrap();
    assert_eq!(down.status(), 503);
    ts.sigterm();
    ts.wait(Duration::from_secs(10));

    // Assert
    let log = ts.log();
    for secret in [PASSWORD, KEY, "question-marker-7c3e", "answer-marker-2a9f"] {
        assert!(!log.contains(secret), "the log holds {secret:?}:\n{log}");
    }
    let lines: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let response = lines
        .iter()
        .find(|l| l["message"] == "response" && l["request_id"] == "req-log-test-1")
        .unwrap_or_else(|| panic!("no response line for the request id:\n{log}"));
    assert_eq!(response["route"], "/v1/turns");
    assert_eq!(response["status"], 201);
    assert!(response["latency_ms"].as_f64().is_some(), "{response}");
    assert!(log.contains("store unavailable"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn talks_to_redis_over_tls_with_a_private_ca_as_an_acl_user() {
    // Arrange: a CA and a server certificate made here, Redis with TLS only,
    // and an ACL user that may only touch turnstore's keys.
    let tls = harness::TestCa::new();
    let redis = Redis::tls_with(
        &tls,
        &[
            "--user",
            "ts-app",
            "on",
            ">acl-pw-31",
            "~turnstore:*",
            "&*",
            "+@all",
            "--user",
            "default",
            "off",
        ],
    );
    let url = format!("rediss://ts-app:acl-pw-31@localhost:{}", redis.port());
    let ts = Turnstore::spawn(&[
        ("TURNSTORE_REDIS_URL", url),
        ("TURNSTORE_REDIS_CA_FILE", tls.ca_path()),
    ]);
    let http = client();
    let base = ts.base();

    // Act
    let ready = http.get(format!("{base}/readyz")).send().await.unwrap();
    let start = http
        .post(format!("{base}/v1/turns"))
        .json(&json!({"session_id": "tls-1", "user_query": "over TLS?"}))
        .send()
        .await
        .unwrap();

    // Assert
    assert_eq!(ready.status(), 200, "{}\n{}", ts.log(), redis.log());
    assert_eq!(start.status(), 201, "{}\n{}", ts.log(), redis.log());
    let auth = ["--user", "ts-app", "--pass", "acl-pw-31"];
    let exists = redis.cli_tls(
        &tls,
        &[&auth[..], &["EXISTS", "turnstore:{tls-1}:h"]].concat(),
    );
    assert_eq!(exists.trim(), "1");
    let anonymous = redis.cli_tls(&tls, &["EXISTS", "turnstore:{tls-1}:h"]);
    assert_ne!(anonymous.trim(), "1", "the default user is off");
    assert!(!ts.log().contains("acl-pw-31"), "{}", ts.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_an_unknown_ca_is_refused() {
    // Arrange: the server's certificate is signed by a CA turnstore does not trust.
    let tls = harness::TestCa::new();
    let other = harness::TestCa::new();
    let redis = Redis::tls(&tls);
    let ts = Turnstore::spawn(&[
        (
            "TURNSTORE_REDIS_URL",
            format!("rediss://localhost:{}", redis.port()),
        ),
        ("TURNSTORE_REDIS_CA_FILE", other.ca_path()),
    ]);

    // Act
    let ready = client()
        .get(format!("{}/readyz", ts.base()))
        .send()
        .await
        .unwrap();

    // Assert
    assert_eq!(ready.status(), 503, "{}", ts.log());
}

#[test]
fn healthcheck_command_reports_the_server_state() {
    // Arrange
    let ts = Turnstore::spawn(&[]);

    // Act
    let healthy = ts.run(&["healthcheck"], &[("TURNSTORE_LISTEN", ts.listen())]);
    let nobody = ts.run(&["healthcheck", "--listen", "127.0.0.1:1"], &[]);

    // Assert
    assert!(healthy.success(), "{}", ts.log());
    assert!(!nobody.success());
    assert!(
        ts.log().contains("no API keys configured"),
        "an open API is announced at start:\n{}",
        ts.log()
    );
}

#[test]
fn unreadable_api_keys_file_stops_the_start() {
    // Act
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_turnstore"))
        .env("TURNSTORE_LISTEN", "127.0.0.1:0")
        .env("TURNSTORE_API_KEYS_FILE", "/nonexistent/keys")
        .output()
        .unwrap();

    // Assert
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/keys"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_requests_answer_503_request_timeout() {
    // Arrange: requests may take 300 ms; Redis will stall for longer.
    let redis = Redis::unix();
    let ts = Turnstore::spawn(&[
        ("TURNSTORE_REDIS_URL", redis.url()),
        ("TURNSTORE_STORE_TIMEOUT", "10s".into()),
        ("TURNSTORE_REQUEST_TIMEOUT", "300ms".into()),
    ]);
    let url = format!("{}/v1/turns", ts.base());
    redis.cli(&["CLIENT", "PAUSE", "1500", "WRITE"]);

    // Act
    let res = client()
        .post(&url)
        .json(&json!({"session_id": "slow-1", "user_query": "q"}))
        .send()
        .await
        .unwrap();

    // Assert
    assert_eq!(res.status(), 503);
    assert_eq!(
        res.headers()["content-type"],
        "application/problem+json",
        "{}",
        ts.log()
    );
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["code"], "request_timeout");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_beyond_the_concurrency_limit_are_shed() {
    // Arrange: two requests at a time; Redis stalls, so they stay in flight.
    let redis = Redis::unix();
    let ts = Turnstore::spawn(&[
        ("TURNSTORE_REDIS_URL", redis.url()),
        ("TURNSTORE_STORE_TIMEOUT", "10s".into()),
        ("TURNSTORE_MAX_CONCURRENCY", "2".into()),
    ]);
    let http = client();
    let url = format!("{}/v1/turns", ts.base());
    redis.cli(&["CLIENT", "PAUSE", "1000", "WRITE"]);

    // Act: two stall, then four more arrive.
    let send = |i: usize| {
        let (http, url) = (http.clone(), url.clone());
        tokio::spawn(async move {
            let res = http
                .post(&url)
                .json(&json!({"session_id": format!("shed-{i}"), "user_query": "q"}))
                .send()
                .await
                .unwrap();
            let status = res.status().as_u16();
            let body: Value = res.json().await.unwrap();
            (status, body["code"].as_str().unwrap_or_default().to_owned())
        })
    };
    let first: Vec<_> = (0..2).map(send).collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let more: Vec<_> = (2..6).map(send).collect();
    let health = http
        .get(format!("{}/healthz", ts.base()))
        .send()
        .await
        .unwrap();

    // Assert: the later four are shed at once; the first two complete; probes stay open.
    for t in more {
        assert_eq!(
            t.await.unwrap(),
            (503, "overloaded".to_owned()),
            "{}",
            ts.log()
        );
    }
    assert_eq!(health.status(), 200);
    for t in first {
        assert_eq!(t.await.unwrap().0, 201, "{}", ts.log());
    }
}

/// By default each serving thread gets a Redis connection of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_has_a_connection_per_serving_thread() {
    let redis = Redis::unix();
    let cores = std::thread::available_parallelism().unwrap().get();
    for (threads, set) in [(1, None), (cores, None), (1, Some(3))] {
        let mut env = vec![
            ("TURNSTORE_REDIS_URL", redis.url()),
            ("TURNSTORE_WORKER_THREADS", threads.to_string()),
        ];
        env.extend(set.map(|n: usize| ("TURNSTORE_REDIS_POOL_SIZE", n.to_string())));
        let ts = Turnstore::spawn(&env);
        let text = ts.metrics().await;
        let want = format!(
            "turnstore_store_pool_connections {}\n",
            set.unwrap_or(threads)
        );
        assert!(text.contains(&want), "no {want:?} in\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_cover_requests_store_pool_turns_and_build() {
    // Arrange: Redis, a short pending TTL, one turn of each fate.
    let redis = Redis::unix();
    let ts = Turnstore::spawn(&[
        ("TURNSTORE_REDIS_URL", redis.url()),
        ("TURNSTORE_PENDING_TTL", "200ms".into()),
    ]);
    let http = client();
    let base = ts.base();
    let start = |sid: &'static str| {
        let http = http.clone();
        let url = format!("{base}/v1/turns");
        async move {
            let v: Value = http
                .post(url)
                .json(&json!({"session_id": sid, "user_query": "q"}))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            v["turn_id"].as_str().unwrap().to_owned()
        }
    };
    let done = start("m-1").await;
    http.post(format!("{base}/v1/sessions/m-1/turns/{done}/finalize"))
        .json(&json!({"final_answer": "a"}))
        .send()
        .await
        .unwrap();
    let aborted = start("m-1").await;
    http.delete(format!("{base}/v1/sessions/m-1/turns/{aborted}"))
        .send()
        .await
        .unwrap();
    start("m-1").await; // left to expire
    tokio::time::sleep(Duration::from_millis(400)).await;
    start("m-1").await; // sweeps the expired one

    // Act
    let text = ts.metrics().await;

    // Assert
    for needle in [
        r#"turnstore_http_requests_total{method="POST",route="/v1/turns",status="201"} 4"#,
        r#"turnstore_http_request_duration_seconds_bucket{le="#,
        r#"turnstore_store_duration_seconds_count{op="start_turn"} 4"#,
        "turnstore_store_pool_connections ",
        "turnstore_store_pool_idle ",
        "turnstore_store_pool_waiters 0",
        "turnstore_turns_started_total 4",
        "turnstore_turns_finalized_total 1",
        "turnstore_turns_aborted_total 1",
        "turnstore_turns_expired_pending_total 1",
        "turnstore_build_info{version=",
    ] {
        assert!(text.contains(needle), "no {needle:?} in\n{text}");
    }
    drop(redis);
    http.get(format!("{base}/v1/sessions/m-1"))
        .send()
        .await
        .unwrap();
    let text = ts.metrics().await;
    assert!(
        text.contains(r#"turnstore_store_errors_total{op="session_info",kind="unreachable"} 1"#),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docs_page_is_served_with_its_assets() {
    // Arrange
    let ts = Turnstore::spawn(&[]);
    let http = client();

    // Act
    let page = http
        .get(format!("{}/docs/", ts.base()))
        .send()
        .await
        .unwrap();
    let bundle = http
        .get(format!("{}/docs/swagger-ui-bundle.js", ts.base()))
        .send()
        .await
        .unwrap();
    let init = http
        .get(format!("{}/docs/swagger-initializer.js", ts.base()))
        .send()
        .await
        .unwrap();

    // Assert: everything comes from the binary itself (no network needed).
    assert_eq!(page.status(), 200);
    assert!(page.text().await.unwrap().contains("swagger-ui"));
    assert_eq!(bundle.status(), 200);
    assert!(bundle.bytes().await.unwrap().len() > 100_000);
    assert!(init.text().await.unwrap().contains("\"../openapi.json\""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docs_page_works_behind_a_proxy_under_a_path_prefix() {
    // Arrange: nginx serving the binary under /turnstore (and stripping it).
    let ts = Turnstore::spawn(&[]);
    let nginx = harness::Nginx::under_prefix(&ts.listen(), "/turnstore");
    let http = client();
    let base = reqwest::Url::parse(&nginx.base()).unwrap();

    // Act: what a browser does, from the URL a user types.
    let page = http
        .get(base.join("/turnstore/docs").unwrap())
        .send()
        .await
        .unwrap();
    let page_url = page.url().clone();
    let html = page.text().await.unwrap();
    let init = http
        .get(page_url.join("./swagger-initializer.js").unwrap())
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let url = init
        .split("\"url\": \"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_else(|| panic!("no url in {init}"));
    let document = http.get(page_url.join(url).unwrap()).send().await.unwrap();

    // Assert: the redirect kept the prefix, and so did the document's URL.
    assert_eq!(page_url.path(), "/turnstore/docs/", "{}", nginx.log());
    assert!(html.contains("swagger-ui"));
    assert_eq!(document.url().path(), "/turnstore/openapi.json");
    assert_eq!(document.status(), 200, "{}", nginx.log());
    let doc: Value = document.json().await.unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
}
