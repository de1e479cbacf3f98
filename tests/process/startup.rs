//! A Redis the service cannot use: the start (unready) and `/readyz` say
//! what is wrong, in words an operator can act on.

use serde_json::Value;

use crate::client;
use crate::harness::{Redis, TestCa, Turnstore, free_port};

/// Starts turnstore on `url`; returns what its log and `/readyz` say.
async fn causes(url: String) -> (String, String) {
    let ts = Turnstore::spawn(&[("TURNSTORE_REDIS_URL", url)]);
    let res = client()
        .get(format!("{}/readyz", ts.base()))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 503);
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["code"], "store_unavailable");
    (
        ts.log(),
        body["detail"].as_str().unwrap_or_default().to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_and_readiness_name_what_is_wrong_with_redis() {
    let ca = TestCa::new();
    let plain = Redis::tcp(&["--requirepass", "s3cret-pw"]);
    let tls = Redis::tls(&ca);
    let cases = [
        (
            format!("redis://:wrong@127.0.0.1:{}", plain.port()),
            "authentication failed",
        ),
        (
            format!("redis://127.0.0.1:{}", plain.port()),
            "authentication required",
        ),
        (
            format!("rediss://:s3cret-pw@127.0.0.1:{}", plain.port()),
            "TLS expected by the URL (rediss://), but the server speaks plain Redis",
        ),
        (
            format!("redis://127.0.0.1:{}", tls.port()),
            "if it expects TLS, use rediss://",
        ),
        (
            format!("rediss://localhost:{}", tls.port()),
            "TLS handshake failed",
        ),
        (
            "redis://no-such-host.invalid:6379".to_string(),
            "unknown host",
        ),
        (
            format!("redis://127.0.0.1:{}", free_port()),
            "connection refused: nothing listens",
        ),
    ];
    for (url, cause) in cases {
        let (log, detail) = causes(url.clone()).await;
        assert!(detail.contains(cause), "{url}: /readyz said {detail:?}");
        assert!(
            log.contains("Redis is not usable yet") && log.contains(cause),
            "{url}: the log said\n{log}"
        );
        assert!(!log.contains("s3cret-pw") && !detail.contains("s3cret-pw"));
    }
}
