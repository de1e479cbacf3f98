//! The lens page (`TURNSTORE_LENS`): served only when enabled, its files
//! built in, its configuration (mode and redaction rules) written into the
//! page, nothing loaded from elsewhere. What the page does in a browser
//! is tested in `lens/test` (headless Chromium).

use reqwest::StatusCode;
use reqwest::redirect::Policy;
use turnstore::config::LensMode;

use crate::support::{Backend, TestApp, problem};

const FILES: [(&str, &str); 4] = [
    ("/lens/", "text/html; charset=utf-8"),
    ("/lens/lens.js", "text/javascript; charset=utf-8"),
    ("/lens/redact.js", "text/javascript; charset=utf-8"),
    ("/lens/lens.css", "text/css; charset=utf-8"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lens_is_off_unless_enabled() {
    let app = TestApp::spawn(Backend::Memory).await;
    for path in ["/lens", "/lens/", "/lens/lens.js", "/lens/redact.js"] {
        let res = app.http.get(app.url(path)).send().await.unwrap();
        problem(res, 404, "not_found").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lens_serves_its_files_without_a_key() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.txt");
    std::fs::write(&rules, "# ours\nticket = TCK-[0-9]{6}\n").unwrap();
    let app = TestApp::spawn_with(Backend::Memory, |s| {
        s.lens = LensMode::Redacted;
        s.redact_patterns = Some(rules);
        s.api_keys = vec!["k1".into()];
    })
    .await;
    // `/lens` sends the browser to `lens/`, relative: behind a path
    // prefix it stays under it.
    let plain = reqwest::Client::builder()
        .redirect(Policy::none())
        .build()
        .unwrap();
    let res = plain.get(app.url("/lens")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::SEE_OTHER);
    assert_eq!(res.headers()["location"], "lens/");

    for (path, kind) in FILES {
        let res = app.http.get(app.url(path)).send().await.unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{path}");
        let h = res.headers();
        assert_eq!(h["content-type"], kind, "{path}");
        let policy = h["content-security-policy"].to_str().unwrap();
        assert!(
            policy.starts_with("default-src 'none'; script-src 'self';"),
            "{policy}"
        );
        assert_eq!(h["x-content-type-options"], "nosniff");
        assert_eq!(h["cache-control"], "no-store");
        let body = res.text().await.unwrap();
        // Nothing from elsewhere: no absolute URL the page would load.
        for absolute in [
            "src=\"http",
            "href=\"http",
            "src=\"//",
            "href=\"//",
            "import(\"http",
            "from \"http",
            "url(http",
            "@import",
        ] {
            assert!(!body.contains(absolute), "{path} holds {absolute}");
        }
        if path == "/lens/" {
            assert!(
                !body.contains("__LENS_CONFIG__"),
                "the configuration is written in"
            );
            assert!(body.contains(r#"{"mode":"redacted","rules":[{"name":"url_password""#));
            assert!(body.contains(r#"{"name":"ticket","pattern":"TCK-[0-9]{6}","check":null}"#));
        }
    }
    // The page holds no data: the API still wants its key.
    let res = app
        .http
        .get(app.url("/v1/users/u1/sessions"))
        .send()
        .await
        .unwrap();
    problem(res, 401, "unauthorized").await;
    // Read-only: no other method.
    let res = app.http.post(app.url("/lens/")).send().await.unwrap();
    problem(res, 405, "method_not_allowed").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_mode_says_so() {
    let app = TestApp::spawn_with(Backend::Memory, |s| s.lens = LensMode::Full).await;
    let body = app
        .http
        .get(app.url("/lens/"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(body.contains(r#"{"mode":"full","rules":["#), "{body}");
}

#[test]
fn broken_redaction_rules_stop_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.txt");
    for text in ["x = (?=lookahead)", "no equals sign", "empty = a*"] {
        std::fs::write(&rules, text).unwrap();
        let settings = turnstore::config::Settings {
            lens: LensMode::Redacted,
            redact_patterns: Some(rules.clone()),
            ..Default::default()
        };
        let err = turnstore::http::lens::Page::load(&settings).unwrap_err();
        assert!(err.starts_with("cannot load the redaction rules"), "{err}");
    }
    let off = turnstore::config::Settings::default();
    assert!(turnstore::http::lens::Page::load(&off).unwrap().is_none());
}
