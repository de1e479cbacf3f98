//! Streaming responses (exports) and the connections that carry them: a
//! slow reader gets everything, however long it takes; a reader that takes
//! nothing is cut off after TURNSTORE_WRITE_TIMEOUT, which frees its
//! export; exports in flight are capped with a 429, and hold no place of
//! other requests.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::{Backend, TestApp, ok_json, problem, sid};

conformance!(
    a_slow_reader_gets_the_whole_export,
    a_stalled_reader_is_cut_off_and_frees_its_export,
);

/// Sessions of `user` holding about 15 MB of texts (more than loopback
/// socket buffers hold), imported 1.3 MB at a time.
async fn a_large_user(app: &TestApp, user: &str) -> usize {
    let words = "Some words of an answer, as a model writes them. ";
    let (query, answer) = (words.repeat(640), words.repeat(2600));
    let sessions = 12;
    for _ in 0..sessions {
        let messages: Vec<Value> = (0..8)
            .flat_map(|_| {
                [
                    json!({"role": "user", "content": query}),
                    json!({"role": "assistant", "content": answer}),
                ]
            })
            .collect();
        let res = app
            .import(&sid(), json!({"user_id": user, "messages": messages}))
            .await;
        assert_eq!(res.status(), StatusCode::CREATED);
    }
    sessions
}

fn with_stream_limits(s: &mut turnstore::Settings) {
    s.max_body_bytes = 4 * 1024 * 1024;
    s.idle_timeout = Duration::from_secs(1);
    s.write_timeout = Duration::from_secs(1);
    s.max_exports = 1;
}

/// On the memory store and on Redis (whose pages an export reads
/// otherwise); the transport is the same for a cluster.
fn transport_only(backend: Backend) -> bool {
    if backend == Backend::Cluster {
        eprintln!("the transport is tested on memory and Redis: skipped");
        return true;
    }
    false
}

async fn a_slow_reader_gets_the_whole_export(backend: Backend) {
    if transport_only(backend) {
        return;
    }
    let app = TestApp::spawn_with(backend, |s| {
        with_stream_limits(s);
        s.write_timeout = Duration::from_secs(5);
    })
    .await;
    let user = format!("u-{}", sid());
    let sessions = a_large_user(&app, &user).await;

    // Read at about 5 MB/s: three seconds, thrice the idle timeout.
    let began = std::time::Instant::now();
    let mut res = app
        .http
        .get(app.url(&format!("/v1/users/{user}/export")))
        .timeout(Duration::from_secs(60))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let mut body = Vec::new();
    let mut pause_at = 512 * 1024;
    while let Some(chunk) = res.chunk().await.expect("the export is not cut") {
        body.extend_from_slice(&chunk);
        if body.len() >= pause_at {
            tokio::time::sleep(Duration::from_millis(100)).await;
            pause_at += 512 * 1024;
        }
    }

    let lines: Vec<Value> = body
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).unwrap())
        .collect();
    assert_eq!(lines.len(), sessions);
    assert!(
        lines
            .iter()
            .all(|l| l["turns"].as_array().unwrap().len() == 8)
    );
    assert!(
        began.elapsed() > Duration::from_secs(2),
        "the read took longer than the idle timeout, twice"
    );
}

async fn a_stalled_reader_is_cut_off_and_frees_its_export(backend: Backend) {
    if transport_only(backend) {
        return;
    }
    let app = TestApp::spawn_with(backend, with_stream_limits).await;
    let user = format!("u-{}", sid());
    a_large_user(&app, &user).await;
    let export = || {
        app.http
            .get(app.url(&format!("/v1/users/{user}/export")))
            .send()
    };

    // A client asks for the export and never reads past its head.
    let addr = app.base.trim_start_matches("http://").to_owned();
    let mut stalled = tokio::net::TcpStream::connect(&addr).await.unwrap();
    stalled
        .write_all(format!("GET /v1/users/{user}/export HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut head = [0u8; 12];
    stalled.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");

    // Another export waits for its place (429 with Retry-After); other
    // requests do not.
    let res = export().await.unwrap();
    let retry_after = res.headers().get("retry-after").cloned();
    problem(res, 429, "too_many_exports").await;
    assert!(retry_after.is_some());
    ok_json(app.history(&sid(), "").await, StatusCode::OK).await;

    // Once the stalled client has taken nothing for a second, it is cut
    // off and the next export streams.
    let mut freed = false;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let res = export().await.unwrap();
        if res.status() == StatusCode::OK {
            freed = true;
            break;
        }
    }
    assert!(freed, "the stalled export kept its place");
    let cut = app
        .metric(r#"turnstore_connections_closed_total{reason="write_timeout"}"#)
        .await;
    assert!(cut >= 1.0, "{cut}");
}
