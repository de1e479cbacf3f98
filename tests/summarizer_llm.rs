//! The summarizer's client against a fake OpenAI-compatible endpoint
//! (`tests/fixtures/fake_llm.py`), started as a real process per test: what
//! it sends, what it retries and how long it waits, what it refuses, and that
//! no error or config shows the key or the conversation.

#[path = "fixtures/fake_llm.rs"]
mod fake_llm;

use std::net::TcpListener;
use std::time::{Duration, Instant};

use fake_llm::FakeLlm;

use serde_json::{Value, json};
use turnstore::summarizer::llm::{
    DEFAULT_PROMPT, Garbage, LlmClient, LlmConfig, LlmError, Summary,
};

/// What these tests ask of their fake.
trait Calls {
    fn client(&self, query: &str, change: impl FnOnce(&mut LlmConfig)) -> LlmClient;
    async fn summarize(&self, client: &LlmClient, previous: Option<&str>) -> Summary;
    async fn fail(&self, client: &LlmClient) -> LlmError;
}

impl Calls for FakeLlm {
    /// A client of this fake's `query` endpoint: quick timeouts and backoff
    /// so retry tests stay short.
    fn client(&self, query: &str, change: impl FnOnce(&mut LlmConfig)) -> LlmClient {
        let mut config = LlmConfig::new(self.url(query), "fake-model");
        config.timeout = Duration::from_secs(5);
        config.backoff = Duration::from_millis(20);
        config.max_retries = 2;
        change(&mut config);
        LlmClient::new(config).unwrap()
    }

    async fn summarize(&self, client: &LlmClient, previous: Option<&str>) -> Summary {
        client
            .summarize(previous, &turns())
            .await
            .unwrap_or_else(|e| panic!("summarize failed: {e:?}\n{}", self.log()))
    }

    async fn fail(&self, client: &LlmClient) -> LlmError {
        match client.summarize(Some("previous"), &turns()).await {
            Ok(summary) => panic!("summarize succeeded: {summary:?}\n{}", self.log()),
            Err(e) => e,
        }
    }
}

fn turns() -> Vec<(String, String)> {
    vec![
        ("Where is Bob this week?".into(), "Bob is in Paris.".into()),
        ("And Carol?".into(), "Carol stays in Oslo.".into()),
    ]
}

#[tokio::test]
async fn a_good_call_sends_model_prompt_previous_summary_turns_and_key() {
    // Arrange
    let fake = FakeLlm::start();
    let client = fake.client("mode=ok", |c| {
        c.api_key = Some("sk-test-123".into());
        c.prompt = "Summarize, please.".into();
    });

    // Act
    let summary = fake.summarize(&client, Some("Alice likes tea.")).await;

    // Assert
    assert_eq!(
        summary.text,
        "SUMMARY(2 turns, previous=yes): Where is Bob this week?"
    );
    assert!(summary.prompt_tokens.is_some() && summary.completion_tokens == Some(8));
    let stats = fake.stats().await;
    assert_eq!(stats["requests"], 1);
    assert_eq!(stats["last_authorization"], "Bearer sk-test-123");
    let body = &stats["last_body"];
    assert_eq!(body["model"], "fake-model");
    assert_eq!(body["temperature"], 0);
    assert_eq!(
        body["messages"][0],
        json!({"role": "system", "content": "Summarize, please."})
    );
    assert_eq!(body["messages"][1]["role"], "user");
    let user = body["messages"][1]["content"].as_str().unwrap();
    let at = |s: &str| {
        user.find(s)
            .unwrap_or_else(|| panic!("{s:?} not in {user:?}"))
    };
    assert!(at("Alice likes tea.") < at("Where is Bob this week?"));
    assert!(at("Bob is in Paris.") < at("And Carol?"));
    assert!(at("And Carol?") < at("Carol stays in Oslo."));
}

#[tokio::test]
async fn without_key_or_previous_summary_neither_is_sent() {
    let fake = FakeLlm::start();
    let client = fake.client("mode=ok", |_| {});

    let summary = fake.summarize(&client, None).await;

    assert_eq!(
        summary.text,
        "SUMMARY(2 turns, previous=no): Where is Bob this week?"
    );
    let stats = fake.stats().await;
    assert_eq!(stats["last_authorization"], Value::Null);
    assert_eq!(stats["last_body"]["messages"][0]["content"], DEFAULT_PROMPT);
}

#[tokio::test]
async fn no_turns_is_refused_without_a_request() {
    let fake = FakeLlm::start();
    let client = fake.client("mode=ok", |_| {});

    let error = client.summarize(Some("only this"), &[]).await.unwrap_err();

    assert_eq!(error.kind(), "no_turns");
    assert_eq!(fake.stats().await["requests"], 0);
}

#[tokio::test]
async fn server_errors_are_retried_until_one_succeeds() {
    let fake = FakeLlm::start();
    let client = fake.client("mode=flaky&fail=2&status=500", |_| {});

    let summary = fake.summarize(&client, None).await;

    assert!(summary.text.starts_with("SUMMARY(2 turns"), "{summary:?}");
    assert_eq!(fake.stats().await["requests"], 3);
}

#[tokio::test]
async fn retries_are_bounded_and_the_last_status_is_reported() {
    let fake = FakeLlm::start();
    let client = fake.client("mode=fail&status=503", |c| c.max_retries = 3);

    let error = fake.fail(&client).await;

    assert!(
        matches!(error, LlmError::Status { status: 503, .. }),
        "{error:?}"
    );
    assert_eq!((error.kind(), error.status()), ("http_status", Some(503)));
    assert_eq!(fake.stats().await["requests"], 4);
}

#[tokio::test]
async fn client_errors_are_not_retried_and_keep_only_the_error_code() {
    let fake = FakeLlm::start();
    for (status, code) in [(400, "context_length_exceeded"), (401, "invalid_api_key")] {
        let client = fake.client(&format!("mode=fail&status={status}&code={code}"), |_| {});

        let error = fake.fail(&client).await;

        assert!(
            matches!(&error, LlmError::Status { status: s, code: Some(c) } if *s == status && c == code),
            "{error:?}"
        );
        assert_eq!(
            error.to_string(),
            format!("the summarizer endpoint answered HTTP {status} ({code})")
        );
    }
    assert_eq!(fake.stats().await["requests"], 2);
}

#[tokio::test]
async fn garbage_answers_are_refused_without_retry() {
    let fake = FakeLlm::start();
    let cases = [
        ("text", Garbage::NotJson),
        ("missing", Garbage::NoChoices),
        ("no_choices", Garbage::NoChoices),
        ("null", Garbage::EmptyContent),
        ("empty", Garbage::EmptyContent),
        ("blank", Garbage::EmptyContent),
        ("truncated", Garbage::Truncated),
        (
            "long&bytes=101",
            Garbage::TooLong {
                bytes: 101,
                max: 100,
            },
        ),
        (
            "long&bytes=2000000",
            Garbage::TooLarge {
                max: 600 + 1024 * 1024,
            },
        ),
    ];
    for (kind, expected) in &cases {
        let client = fake.client(&format!("mode=garbage&kind={kind}"), |c| {
            c.max_summary_bytes = 100
        });

        let error = fake.fail(&client).await;

        assert_eq!(error.kind(), "garbage");
        assert!(
            matches!(&error, LlmError::Garbage(g) if g == expected),
            "{kind}: {error:?}"
        );
    }
    assert_eq!(fake.stats().await["requests"], cases.len());
}

#[tokio::test]
async fn a_slow_endpoint_times_out_each_attempt_within_the_bound() {
    let fake = FakeLlm::start();
    let client = fake.client("mode=slow&ms=5000", |c| {
        c.timeout = Duration::from_millis(300);
        c.max_retries = 1;
    });
    let started = Instant::now();

    let error = fake.fail(&client).await;

    let elapsed = started.elapsed();
    assert!(
        matches!(error, LlmError::Timeout(t) if t == Duration::from_millis(300)),
        "{error:?}"
    );
    assert_eq!(error.kind(), "timeout");
    assert!(elapsed >= Duration::from_millis(600), "{elapsed:?}");
    assert!(elapsed < Duration::from_millis(1500), "{elapsed:?}");
    assert!(elapsed < client.max_duration());
    assert_eq!(fake.stats().await["requests"], 2);
}

#[tokio::test]
async fn an_endpoint_just_in_time_succeeds() {
    let fake = FakeLlm::start();
    let client = fake.client("mode=slow&ms=200", |c| c.timeout = Duration::from_secs(2));

    let summary = fake.summarize(&client, None).await;

    assert!(summary.text.starts_with("SUMMARY"));
}

#[tokio::test]
async fn retry_after_is_honoured() {
    let fake = FakeLlm::start();
    let client = fake.client("mode=flaky&fail=1&status=429&retry_after=1", |_| {});

    fake.summarize(&client, None).await;

    let stats = fake.stats().await;
    let times: Vec<u64> = serde_json::from_value(stats["times_ms"].clone()).unwrap();
    assert_eq!(times.len(), 2);
    assert!(
        times[1] - times[0] >= 1000,
        "retried after {:?}",
        times[1] - times[0]
    );
}

#[tokio::test]
async fn a_retry_after_beyond_the_cap_gives_up_at_once() {
    let fake = FakeLlm::start();
    let client = fake.client("mode=flaky&fail=1&status=429&retry_after=3600", |_| {});
    let started = Instant::now();

    let error = fake.fail(&client).await;

    assert_eq!(error.status(), Some(429));
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(fake.stats().await["requests"], 1);
}

#[tokio::test]
async fn an_unreachable_endpoint_is_a_connection_error_after_retries() {
    let port = {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let config = LlmConfig {
        backoff: Duration::from_millis(20),
        ..LlmConfig::new(format!("http://127.0.0.1:{port}/v1/chat/completions"), "m")
    };
    let client = LlmClient::new(config).unwrap();

    let error = client.summarize(None, &turns()).await.unwrap_err();

    assert_eq!(error.kind(), "connection", "{error:?}");
    assert!(!error.to_string().contains(&port.to_string()), "{error}");
}

#[tokio::test]
async fn neither_errors_nor_config_show_the_key_or_the_conversation() {
    // Arrange: the fake echoes the Authorization header and the request in
    // its error bodies, as real endpoints do.
    let fake = FakeLlm::start();
    let key = "sk-SECRET-key-4242";
    let secrets = [
        key,
        "PROMPT-SECRET",
        "QUESTION-SECRET",
        "ANSWER-SECRET",
        "SUMMARY-SECRET",
    ];
    let client_for = |query: &str| {
        fake.client(query, |c| {
            c.api_key = Some(key.into());
            c.prompt = "PROMPT-SECRET".into();
            c.timeout = Duration::from_millis(200);
            c.max_retries = 0;
        })
    };
    let turns = [("QUESTION-SECRET".to_string(), "ANSWER-SECRET".to_string())];
    let mut shown = vec![];

    // Act
    for query in [
        "mode=fail&status=401&code=invalid_api_key",
        "mode=fail&status=500",
        "mode=garbage&kind=text",
        "mode=garbage&kind=blank",
        "mode=slow&ms=2000",
    ] {
        let client = client_for(query);
        let error = client
            .summarize(Some("SUMMARY-SECRET"), &turns)
            .await
            .unwrap_err();
        shown.extend([
            format!("{error}"),
            format!("{error:?}"),
            format!("{client:?}"),
        ]);
    }
    let mut config = LlmConfig::new(fake.url(""), "m");
    config.api_key = Some(key.into());
    shown.push(format!("{config:?}"));

    // Assert
    assert!(
        fake.stats().await["last_body"]
            .to_string()
            .contains("QUESTION-SECRET")
    );
    for text in &shown {
        for secret in secrets {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
        assert!(!text.contains("4242"), "part of the key in {text}");
    }
}

#[tokio::test]
async fn the_fake_counts_concurrent_requests_and_takes_a_default_mode() {
    let fake = FakeLlm::start();
    let client = fake.client("mode=slow&ms=300", |_| {});

    let turns = turns();

    let (a, b, c) = tokio::join!(
        client.summarize(None, &turns),
        client.summarize(None, &turns),
        client.summarize(None, &turns),
    );
    fake.set_mode(json!({"mode": "fail", "status": "502"}))
        .await;
    let error = fake.fail(&fake.client("", |c| c.max_retries = 0)).await;

    assert!(a.is_ok() && b.is_ok() && c.is_ok());
    assert_eq!(error.status(), Some(502));
    let stats = fake.stats().await;
    assert_eq!(stats["max_in_flight"], 3);
    assert_eq!(stats["requests"], 4);
}
