//! The HTTP edge against odd and hostile clients (issue 10): the bearer
//! scheme in any case, bounded request ids, metric labels from a closed
//! set. The store plays no part: memory only.

use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::support::{Backend, TestApp, problem, sid};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bearer_scheme_is_case_insensitive() {
    let app = TestApp::spawn_with(Backend::Memory, |s| s.api_keys = vec!["k1".into()]).await;
    let start = |auth: &'static str| {
        app.http
            .post(app.url("/v1/turns"))
            .header("authorization", auth)
            .json(&json!({"session_id": sid(), "user_query": "q"}))
            .send()
    };
    for auth in ["Bearer k1", "bearer k1", "BEARER k1", "bEaReR  k1 "] {
        assert_eq!(start(auth).await.unwrap().status(), 201, "{auth}");
    }
    for auth in [
        "Bearer",
        "Bearer k2",
        "Bearerk1",
        "Basic k1",
        "k1",
        "Bearer k1 k1",
    ] {
        problem(start(auth).await.unwrap(), 401, "unauthorized").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_ids_are_kept_only_when_short_and_visible() {
    let app = TestApp::spawn(Backend::Memory).await;
    let echoed = |id: String| {
        let req = app.http.get(app.url("/healthz")).header("x-request-id", id);
        async move {
            let res = req.send().await.unwrap();
            assert_eq!(res.status(), StatusCode::OK);
            let ids: Vec<String> = res
                .headers()
                .get_all("x-request-id")
                .iter()
                .map(|v| v.to_str().unwrap().to_owned())
                .collect();
            assert_eq!(ids.len(), 1, "{ids:?}");
            ids[0].clone()
        }
    };
    let longest = "r".repeat(128);
    assert_eq!(echoed(longest.clone()).await, longest);
    assert_eq!(echoed("a-b_c.1~!".into()).await, "a-b_c.1~!");
    for odd in [
        "r".repeat(129),
        "r".repeat(390_000),
        "two words".into(),
        "tab\there".into(),
    ] {
        let made = echoed(odd.clone()).await;
        assert_ne!(made, odd);
        assert!(uuid::Uuid::parse_str(&made).is_ok(), "{made}");
    }
    // Two ids in one request: neither is kept.
    let res = app
        .http
        .get(app.url("/healthz"))
        .header("x-request-id", "one")
        .header("x-request-id", "two")
        .send()
        .await
        .unwrap();
    let made = res.headers()["x-request-id"].to_str().unwrap();
    assert!(uuid::Uuid::parse_str(made).is_ok(), "{made}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn made_up_methods_and_paths_share_one_label_each() {
    let app = TestApp::spawn(Backend::Memory).await;
    let made_up = |i: usize| {
        let method = Method::from_bytes(format!("MADEUP{i}").as_bytes()).unwrap();
        let req = app
            .http
            .request(method, app.url(&format!("/v1/turns/x{i}")));
        async move {
            let res = req.send().await.unwrap();
            assert!(res.status().is_client_error(), "{}", res.status());
        }
    };
    made_up(0).await;
    app.metrics().await;
    let before = app.metrics().await.len();
    for i in 1..200 {
        made_up(i).await;
    }
    let text = app.metrics().await;
    assert!(!text.contains("MADEUP"), "a made-up method became a label");
    assert!(!text.contains("/x1"), "a raw path became a label");
    assert!(text.contains(r#"method="other""#), "{text}");
    assert!(text.contains(r#"route="unmatched""#), "{text}");
    // No new series: only the counts grew (a few digits).
    assert!(text.len() < before + 100, "{} -> {}", before, text.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accept_is_negotiated_with_q_values() {
    let app = TestApp::spawn(Backend::Memory).await;
    let s = sid();
    app.complete(&s, "q1", "a1").await;
    let read = |accept: &'static str| {
        app.http
            .get(app.url(&format!("/v1/sessions/{s}/history")))
            .header("accept", accept)
            .send()
    };
    let kind = |res: &reqwest::Response| {
        let t = res.headers()["content-type"].to_str().unwrap();
        t.split(';').next().unwrap().to_owned()
    };
    for (accept, expected) in [
        ("text/plain", "text/plain"),
        ("TEXT/PLAIN; charset=utf-8", "text/plain"),
        ("application/json", "application/json"),
        ("*/*", "application/json"),
        ("text/plain, */*", "text/plain"),
        ("text/plain, application/json", "application/json"),
        ("application/json;q=0, text/plain", "text/plain"),
        ("application/json;q=0.5, text/plain;q=0.9", "text/plain"),
        ("text/plain;q=0.4, application/*;q=0.5", "application/json"),
        ("text/plain;q=0, */*", "application/json"),
        ("text/*", "text/plain"),
        ("text/plain;q=bad, application/json", "application/json"),
    ] {
        let res = read(accept).await.unwrap();
        assert_eq!(res.status(), 200, "{accept}");
        assert_eq!(kind(&res), expected, "{accept}");
    }
    for accept in [
        "text/plain;q=0",
        "image/png",
        "text/plain;q=0, application/json;q=0",
        "*/*;q=0",
    ] {
        let res = read(accept).await.unwrap();
        problem(res, 406, "not_acceptable").await;
    }
}
