//! A Redis the service cannot use: the start (unready) and `/readyz` say
//! what is wrong, in words an operator can act on.

use serde_json::Value;

use crate::client;
use crate::harness::{ClosedPort, Redis, TestCa, Turnstore, free_port};

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
    let closed = ClosedPort::new();
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
            format!("redis://127.0.0.1:{}", closed.port()),
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
        // Our words only: never Redis' (or the client library's) own text.
        for theirs in [
            "WRONGPASS",
            "NOAUTH",
            "invalid username-password",
            "Password authentication failed",
            "os error",
        ] {
            assert!(!detail.contains(theirs), "{url}: /readyz said {detail:?}");
        }
    }
}

/// A template that does not compile stops the start, naming its file and
/// line; the process exits without serving.
#[test]
fn a_broken_template_stops_the_start_with_its_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("good.jinja"),
        "{% macro turn(turn) %}{{ turn.user_query }}{% endmacro %}",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("bad.jinja"),
        "{% macro turn(turn) %}\n{{ turn.user_query }\n{% endmacro %}",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_turnstore"))
        .arg("serve")
        .env("TURNSTORE_LISTEN", format!("127.0.0.1:{}", free_port()))
        .env("TURNSTORE_TEMPLATES_DIR", dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let at = format!("{}:2:", dir.path().join("bad.jinja").display());
    assert!(stderr.contains(&at), "{stderr}");
}

/// The cache of rendered turns is sized in MiB, 1 to 65536: another size
/// stops the start, naming the setting.
#[test]
fn a_template_cache_size_out_of_range_stops_the_start() {
    for size in ["0", "65537", "lots"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_turnstore"))
            .arg("serve")
            .env("TURNSTORE_LISTEN", format!("127.0.0.1:{}", free_port()))
            .env("TURNSTORE_TEMPLATE_CACHE_MB", size)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{size}: {stderr}");
        assert!(stderr.contains("template-cache-mb"), "{size}: {stderr}");
    }
}

/// A model table that names an encoding the server lacks stops the start,
/// naming the file, the line and the encodings it has; so does a setting
/// for unknown models that is neither `default` nor `reject`.
#[test]
fn a_broken_model_table_stops_the_start_naming_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("models.txt");
    std::fs::write(
        &path,
        "# open models\nllama-3* = cl100k_base\nqwen* = qwen2\n",
    )
    .unwrap();
    let serve = |env: &[(&str, &str)]| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_turnstore"));
        cmd.arg("serve")
            .env("TURNSTORE_LISTEN", format!("127.0.0.1:{}", free_port()));
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };

    let stderr = serve(&[("TURNSTORE_MODELS", path.to_str().unwrap())]);
    let at = format!("{}: line 3: `qwen2`: unknown encoding", path.display());
    assert!(stderr.contains(&at), "{stderr}");
    assert!(stderr.contains("cl100k_base"), "{stderr}");

    let stderr = serve(&[("TURNSTORE_UNKNOWN_MODEL", "fallback")]);
    assert!(stderr.contains("unknown-model"), "{stderr}");
}

/// A tokenizer file that is not a tokenizer stops the start, naming the
/// file and why; a good one is loaded and its memory logged.
#[test]
fn a_broken_tokenizer_stops_the_start_naming_its_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("llama")).unwrap();
    std::fs::write(dir.path().join("llama/tokenizer.json"), r#"{"model": 3}"#).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_turnstore"))
        .arg("serve")
        .env("TURNSTORE_LISTEN", format!("127.0.0.1:{}", free_port()))
        .env("TURNSTORE_TOKENIZERS_DIR", dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let at = format!(
        "cannot load a tokenizer: {}: not a tokenizer.json",
        dir.path().join("llama/tokenizer.json").display()
    );
    assert!(stderr.contains(&at), "{stderr}");
}
