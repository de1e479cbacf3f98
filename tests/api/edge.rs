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

/// Every route refuses a query parameter it does not take, naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_query_parameters_are_422_on_every_route() {
    let app = TestApp::spawn(Backend::Memory).await;
    let s = sid();
    let t = app
        .started(json!({"session_id": s, "user_query": "q"}))
        .await;
    let turn = t["turn_id"].as_str().unwrap();
    let routes = [
        (Method::POST, "/v1/turns".to_owned()),
        (
            Method::POST,
            format!("/v1/sessions/{s}/turns/{turn}/finalize"),
        ),
        (Method::DELETE, format!("/v1/sessions/{s}/turns/{turn}")),
        (Method::GET, format!("/v1/sessions/{s}/history")),
        (Method::GET, format!("/v1/sessions/{s}")),
        (Method::DELETE, format!("/v1/sessions/{s}")),
        (Method::PUT, format!("/v1/sessions/{s}/summary")),
        (Method::GET, format!("/v1/sessions/{s}/summary")),
        (Method::DELETE, format!("/v1/sessions/{s}/summary")),
        (Method::POST, format!("/v1/sessions/{s}/import")),
        (Method::GET, "/v1/users/u1/export".to_owned()),
        (Method::GET, "/v1/users/u1/sessions".to_owned()),
        (Method::DELETE, "/v1/users/u1".to_owned()),
    ];
    for (method, path) in routes {
        let res = app
            .http
            .request(method.clone(), app.url(&format!("{path}?colour=blue")))
            .json(&json!({}))
            .send()
            .await
            .unwrap();
        let p = problem(res, 422, "validation_failed").await;
        assert_eq!(p["errors"][0]["field"], "colour", "{method} {path}: {p}");
    }
    // Nothing was written: the turn is still pending.
    let info = app
        .session(&s)
        .await
        .json::<serde_json::Value>()
        .await
        .unwrap();
    assert_eq!(info["pending_count"], 1, "{info}");
}

/// Validation messages speak of the request, not of the parser: no Rust
/// type names, no "invalid digit", and a syntax error is the body's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validation_messages_are_in_the_apis_terms() {
    let app = TestApp::spawn(Backend::Memory).await;
    let read = |query: &'static str| {
        app.http
            .get(app.url(&format!("/v1/sessions/s1/history?{query}")))
            .send()
    };
    for (query, field, message) in [
        ("limit=-1", "limit", "must be a whole number, 0 or more"),
        ("limit=abc", "limit", "must be a whole number, 0 or more"),
        ("max_tokens=99999999999", "max_tokens", "is too large"),
        ("summary=yes", "summary", "must be true or false"),
        (
            "format=xml",
            "format",
            "must be one of text, messages, turns, anthropic",
        ),
        ("colour=blue", "colour", "unknown field"),
    ] {
        let p = problem(read(query).await.unwrap(), 422, "validation_failed").await;
        assert_eq!(p["errors"][0]["field"], field, "{query}: {p}");
        assert_eq!(p["errors"][0]["message"], message, "{query}: {p}");
    }
    let start = |body: &'static str| {
        app.http
            .post(app.url("/v1/turns"))
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    for (body, field, message) in [
        (r#"{"user_query": 5}"#, "user_query", "must be a string"),
        (
            r#"{"user_query": "q", "history": 5}"#,
            "history",
            "must be an object",
        ),
        (
            r#"{"user_query": "q", "history": {"limit": "x"}}"#,
            "history.limit",
            "must be a whole number, 0 or more",
        ),
        (
            r#"{"user_query": "q", "history": {"keep_first": "maybe"}}"#,
            "history.keep_first",
            "must be true or false",
        ),
        (
            r#"{"user_query": "q", "colour": 1}"#,
            "colour",
            "unknown field",
        ),
        (r#"{}"#, "user_query", "is required"),
        (r#"[1]"#, "body", "must be a JSON object"),
        (
            r#"{"user_query": "q",}"#,
            "body",
            "is not valid JSON: trailing comma at line 1 column 20",
        ),
        (
            r#"{"user_query": "q"} x"#,
            "body",
            "is not valid JSON: trailing characters at line 1 column 21",
        ),
    ] {
        let p = problem(start(body).await.unwrap(), 422, "validation_failed").await;
        assert_eq!(p["errors"][0]["field"], field, "{body}: {p}");
        assert_eq!(p["errors"][0]["message"], message, "{body}: {p}");
        let text = p.to_string();
        for parser_word in ["u32", "u64", "struct", "invalid digit", "expected"] {
            assert!(!text.contains(parser_word), "{body}: {text}");
        }
    }
    let import = app
        .import(
            &sid(),
            json!({"messages": [{"role": "user", "content": "q"}, {"content": "a"}]}),
        )
        .await;
    let p = problem(import, 422, "validation_failed").await;
    assert_eq!(p["errors"][0]["field"], "messages[1].role", "{p}");
}

/// Booleans in a query as Python's requests (`True`) and others (`1`)
/// write them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_booleans_take_the_usual_spellings() {
    let app = TestApp::spawn(Backend::Memory).await;
    let s = sid();
    for i in 1..=3 {
        app.complete(&s, &format!("q{i}"), &format!("a{i}")).await;
    }
    for (yes, no) in [("true", "false"), ("True", "False"), ("1", "0")] {
        let kept = app
            .history_ok(&s, &format!("limit=1&keep_first={yes}&format=turns"))
            .await;
        assert_eq!(crate::support::seqs(&kept), [1], "{yes}");
        let not = app
            .history_ok(&s, &format!("limit=1&keep_first={no}&format=turns"))
            .await;
        assert_eq!(crate::support::seqs(&not), [3], "{no}");
    }
}

/// `/docs` reaches its files and its document by relative URLs only, so
/// that it works under a proxy's path prefix: `/docs` redirects to
/// `docs/`, whose page loads `../openapi.json`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_docs_page_follows_relative_urls_only() {
    // Arrange: a client that shows redirects instead of following them.
    let app = TestApp::spawn(Backend::Memory).await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let get = |path: &str| http.get(app.url(path)).send();

    // Act
    let redirect = get("/docs").await.unwrap();
    let page = get("/docs/").await.unwrap();
    let init = get("/docs/swagger-initializer.js").await.unwrap();
    let missing = get("/docs/nothing.js").await.unwrap();

    // Assert: each URL, resolved as a browser resolves it, stays under
    // the prefix the page was reached by ("" here, or a proxy's).
    assert_eq!(redirect.status(), StatusCode::SEE_OTHER);
    let location = redirect.headers()["location"].to_str().unwrap().to_owned();
    assert_eq!(location, "docs/");
    assert_eq!(page.status(), StatusCode::OK);
    let html = page.text().await.unwrap();
    for attr in html
        .split(['"', '\''])
        .filter(|a| a.contains(".js") || a.contains(".css"))
    {
        assert!(!attr.starts_with('/') && !attr.contains("//"), "{attr}");
    }
    assert_eq!(init.status(), StatusCode::OK);
    let init = init.text().await.unwrap();
    let document = r#""url": "../openapi.json""#;
    assert!(init.contains(document), "{init}");
    assert_eq!(init.matches("openapi.json").count(), 1, "{init}");
    problem(missing, 404, "not_found").await;
    for prefix in ["", "/turnstore", "/a/b"] {
        let reached = reqwest::Url::parse(&app.url(&format!("{prefix}/docs"))).unwrap();
        let page = reached.join(&location).unwrap();
        let document = page.join("../openapi.json").unwrap();
        assert_eq!(page.path(), format!("{prefix}/docs/"));
        assert_eq!(document.path(), format!("{prefix}/openapi.json"));
    }
    let document = reqwest::Url::parse(&app.url("/docs/"))
        .unwrap()
        .join("../openapi.json")
        .unwrap();
    let served = http.get(document).send().await.unwrap();
    assert_eq!(served.status(), StatusCode::OK);
    assert_eq!(served.headers()["content-type"], "application/json");
    let doc: serde_json::Value = served.json().await.unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
}
