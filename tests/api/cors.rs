//! CORS (`TURNSTORE_CORS_ORIGINS`): exact origins only, preflights answered
//! without an API key, nothing at all when unset. The store plays no part:
//! memory only.

use reqwest::header::HeaderMap;
use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::support::{Backend, TestApp, problem, sid};

const APP: &str = "https://app.example.com";

async fn with_origins() -> TestApp {
    TestApp::spawn_with(Backend::Memory, |s| {
        s.cors_origins = vec![
            APP.parse().unwrap(),
            "http://localhost:3000".parse().unwrap(),
        ];
        s.api_keys = vec!["k1".into()];
    })
    .await
}

async fn preflight(app: &TestApp, origin: &str) -> (StatusCode, HeaderMap) {
    let res = app
        .http
        .request(Method::OPTIONS, app.url("/v1/turns"))
        .header("origin", origin)
        .header("access-control-request-method", "POST")
        .header(
            "access-control-request-headers",
            "authorization, content-type, idempotency-key",
        )
        .send()
        .await
        .unwrap();
    (res.status(), res.headers().clone())
}

fn cors_headers(headers: &HeaderMap) -> Vec<String> {
    headers
        .keys()
        .map(|k| k.as_str().to_owned())
        .filter(|k| k.starts_with("access-control-"))
        .collect()
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> &'a str {
    headers
        .get(name)
        .map(|v| v.to_str().unwrap())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preflights_from_a_listed_origin_are_answered_without_a_key() {
    let app = with_origins().await;
    for origin in [APP, "http://localhost:3000"] {
        let (status, h) = preflight(&app, origin).await;
        assert_eq!(status, 200, "{origin}");
        assert_eq!(header(&h, "access-control-allow-origin"), origin);
        let methods = header(&h, "access-control-allow-methods");
        // PUT too: a browser writes a summary with it.
        for m in ["GET", "POST", "PUT", "DELETE"] {
            assert!(methods.contains(m), "{methods}");
        }
        let allowed = header(&h, "access-control-allow-headers");
        for name in ["authorization", "content-type", "idempotency-key"] {
            assert!(allowed.contains(name), "{allowed}");
        }
        assert_eq!(header(&h, "access-control-max-age"), "600");
        assert!(header(&h, "vary").contains("origin"), "{h:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_origins_get_no_cors_headers() {
    let app = with_origins().await;
    for origin in [
        "https://evil.example.com",
        "https://app.example.com.evil.com",
        "http://app.example.com",
        "https://app.example.com:8443",
        "null",
    ] {
        let (_, h) = preflight(&app, origin).await;
        assert_eq!(header(&h, "access-control-allow-origin"), "", "{origin}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_from_a_listed_origin_may_read_the_answer_and_its_headers() {
    let app = with_origins().await;
    let res = app
        .http
        .post(app.url("/v1/turns"))
        .header("origin", APP)
        .header("authorization", "Bearer k1")
        .json(&json!({"session_id": sid(), "user_query": "q"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 201);
    let h = res.headers();
    assert_eq!(header(h, "access-control-allow-origin"), APP);
    let exposed = header(h, "access-control-expose-headers");
    for name in [
        "x-request-id",
        "idempotent-replayed",
        "retry-after",
        "x-token-count",
    ] {
        assert!(exposed.contains(name), "{exposed}");
    }
    // CORS is no way around the key.
    let res = app
        .http
        .post(app.url("/v1/turns"))
        .header("origin", APP)
        .json(&json!({"session_id": sid(), "user_query": "q"}))
        .send()
        .await
        .unwrap();
    assert_eq!(header(res.headers(), "access-control-allow-origin"), APP);
    problem(res, 401, "unauthorized").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_origins_there_is_no_cors_at_all() {
    let app = TestApp::spawn(Backend::Memory).await;
    let (status, h) = preflight(&app, APP).await;
    assert_eq!(status, 405);
    assert_eq!(cors_headers(&h), Vec::<String>::new());
    let res = app
        .http
        .get(app.url("/v1/sessions/s1/history"))
        .header("origin", APP)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(cors_headers(res.headers()), Vec::<String>::new());
    assert_eq!(header(res.headers(), "vary"), "");
}
