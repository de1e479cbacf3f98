//! The server-side summarizer (API.md v1.1, Summaries), against
//! `tests/fixtures/fake_llm.py` started as a real process: it folds what a
//! default history leaves out, incrementally, off the request's path, one
//! run a session at a time across instances sharing a store, and a failing,
//! slow or garbage-answering endpoint changes nothing a client sees.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use turnstore::domain::SessionId;
use turnstore::store::{MemoryStore, Store};
use turnstore::{Application, Settings};

use crate::fake_llm::FakeLlm;
use crate::harness::ClosedPort;
use crate::support::{Backend, TestApp, ok_json, sid};

conformance!(
    the_summarizer_folds_what_a_default_history_leaves_out,
    a_failing_endpoint_changes_nothing_and_is_counted,
    a_slow_endpoint_holds_no_request_up,
    the_summarizer_lock_expires_and_only_its_holder_releases_it,
    a_long_backlog_is_folded_over_several_runs,
    a_fold_never_lands_on_a_session_started_again,
    a_summary_over_its_share_of_a_history_is_refused,
);

mod shared {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis() {
        super::instances_racing_on_one_session_call_the_model_one_at_a_time(super::Backend::Redis)
            .await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cluster() {
        super::instances_racing_on_one_session_call_the_model_one_at_a_time(super::Backend::Cluster)
            .await
    }
}

/// An app summarizing through `url`: default histories of `limit` turns,
/// summarizing from `after_tokens`, no retries.
async fn summarizing(backend: Backend, url: String, limit: u32, after_tokens: u32) -> TestApp {
    TestApp::spawn_with(backend, |s| summarize_with(s, url, limit, after_tokens)).await
}

fn summarize_with(s: &mut Settings, url: String, limit: u32, after_tokens: u32) {
    s.summarizer_url = Some(url);
    s.summarizer_model = Some("fake-model".into());
    s.summarizer_max_retries = 0;
    s.history_limit = limit;
    s.summarize_after_tokens = after_tokens;
}

/// Waits (up to 30 s) until `check` gives `Some`.
async fn eventually<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    match within_30s(check).await {
        Some(v) => v,
        None => panic!("never happened: {what}"),
    }
}

async fn within_30s<T, F, Fut>(mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    for _ in 0..600 {
        if let Some(v) = check().await {
            return Some(v);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

async fn summary(app: &TestApp, session: &str) -> Option<Value> {
    let res = app
        .http
        .get(app.url(&format!("/v1/sessions/{session}/summary")))
        .send()
        .await
        .unwrap();
    match res.status() {
        StatusCode::NOT_FOUND => None,
        _ => Some(ok_json(res, StatusCode::OK).await),
    }
}

/// The session's summary once it covers `through` turns.
async fn summary_through(app: &TestApp, session: &str, through: u64) -> Value {
    eventually(&format!("a summary through {through}"), || async {
        summary(app, session)
            .await
            .filter(|s| s["through_seq"] == through)
    })
    .await
}

/// Questions and answers whose text blocks count alike, turn to turn.
fn q(i: usize) -> String {
    format!("question number {i}")
}

fn a(i: usize) -> String {
    format!("answer number {i}")
}

async fn complete(app: &TestApp, session: &str, turns: std::ops::RangeInclusive<usize>) {
    for i in turns {
        app.complete(session, &q(i), &a(i)).await;
    }
}

/// The user message the fake was last sent.
async fn last_user_message(fake: &FakeLlm) -> String {
    let body = &fake.stats().await["last_body"];
    let messages = body["messages"].as_array().unwrap();
    messages
        .iter()
        .find(|m| m["role"] == "user")
        .and_then(|m| m["content"].as_str())
        .unwrap()
        .to_owned()
}

async fn the_summarizer_folds_what_a_default_history_leaves_out(backend: Backend) {
    // The threshold: exactly the tokens of the first two turns' blocks, as
    // `unsummarized` counts them on a store without a summarizer.
    let probe = TestApp::spawn_with(Backend::Memory, |s| s.history_limit = 1).await;
    let p = sid();
    complete(&probe, &p, 1..=3).await;
    let two = probe.history_ok(&p, "limit=1").await["unsummarized"]["tokens"]
        .as_u64()
        .unwrap();
    let one = probe.history_ok(&p, "limit=2").await["unsummarized"]["tokens"]
        .as_u64()
        .unwrap();
    assert!(one < two, "{one} {two}");

    let fake = FakeLlm::start();
    let prompt = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(prompt.path(), "Summarize like a pirate.").unwrap();
    let app = TestApp::spawn_with(backend, |s| {
        summarize_with(s, fake.url("mode=ok"), 2, two as u32);
        s.summarizer_api_key = Some("sk-fake".into());
        s.summarizer_prompt_file = Some(prompt.path().to_owned());
    })
    .await;
    let s = sid();

    // Three turns: the default history shows two, one (below the
    // threshold) is left out; a fourth makes two left out: folded.
    complete(&app, &s, 1..=3).await;
    complete(&app, &s, 4..=4).await;
    let first = summary_through(&app, &s, 2).await;
    let text = first["summary"].as_str().unwrap();
    assert!(
        text.starts_with("SUMMARY(2 turns, previous=no): question number 1"),
        "{text}\n{}",
        fake.log()
    );
    let stats = fake.stats().await;
    assert_eq!(stats["requests"], 1, "turn 3 alone was below the threshold");
    assert_eq!(stats["last_authorization"], "Bearer sk-fake");
    assert_eq!(stats["last_body"]["model"], "fake-model");
    assert_eq!(
        stats["last_body"]["messages"][0],
        json!({"role": "system", "content": "Summarize like a pirate."})
    );

    // Prompts now begin with it, and nothing is left unsummarized.
    let h = app.history_ok(&s, "summary=true").await;
    let rendered = h["rendered"].as_str().unwrap();
    assert!(
        rendered.starts_with(&format!("### Conversation summary:\n{text}\n\n")),
        "{h}"
    );
    assert_eq!(h["included_turns"], 2, "{h}");
    assert_eq!(h["unsummarized"], Value::Null, "{h}");

    // Two more: the next fold sends the previous summary and turns 3 and 4
    // only, never the summary alone, never turns 1 and 2 again.
    complete(&app, &s, 5..=6).await;
    let second = summary_through(&app, &s, 4).await;
    let text = second["summary"].as_str().unwrap();
    assert!(text.contains("previous=yes"), "{text}");
    let sent = last_user_message(&fake).await;
    assert!(
        sent.contains(&format!(
            "<previous_summary>\n{}",
            first["summary"].as_str().unwrap()
        )),
        "{sent}"
    );
    assert!(sent.contains(&q(3)) && sent.contains(&a(4)), "{sent}");
    assert!(!sent.contains(&q(2)) && !sent.contains(&q(5)), "{sent}");
    assert_eq!(fake.stats().await["requests"], 2);

    assert_eq!(
        app.metric(r#"turnstore_summarizer_runs_total{outcome="written"}"#)
            .await,
        2.0
    );
    assert_eq!(
        app.metric("turnstore_summarizer_turns_folded_total").await,
        4.0
    );
    assert_eq!(
        app.metric("turnstore_summarizer_tokens_folded_total").await,
        (2 * two) as f64,
        "the tokens of turns 1 to 4"
    );
    assert_eq!(
        app.metric("turnstore_summarizer_duration_seconds_count")
            .await,
        2.0
    );
}

async fn a_failing_endpoint_changes_nothing_and_is_counted(backend: Backend) {
    let fake = FakeLlm::start();
    // The endpoint as /mode sets it, changed between runs.
    let url = fake.url("").trim_end_matches('?').to_owned();
    let app = summarizing(backend, url, 1, 1).await;
    let s = sid();
    let failures = [
        (json!({"mode": "fail", "status": 500}), "http_status"),
        (
            json!({"mode": "fail", "status": 401, "code": "invalid_api_key"}),
            "http_status",
        ),
        (json!({"mode": "garbage", "kind": "text"}), "garbage"),
        (json!({"mode": "garbage", "kind": "no_choices"}), "garbage"),
        (json!({"mode": "garbage", "kind": "empty"}), "garbage"),
        (json!({"mode": "garbage", "kind": "truncated"}), "garbage"),
        (
            json!({"mode": "garbage", "kind": "long", "bytes": 64 * 1024}),
            "garbage",
        ),
    ];
    complete(&app, &s, 1..=1).await;
    let before = app.history_ok(&s, "").await;
    // A write's run may look late, after the next write: then that write
    // makes it look again, and one write is followed by two failed runs,
    // the second under the next mode. So each mode is shown to add to its
    // kind of failure, and the runs that failed are the failures counted.
    for (i, (mode, kind)) in failures.iter().enumerate() {
        fake.set_mode(mode.clone()).await;
        let name = format!(r#"turnstore_summarizer_failures_total{{kind="{kind}"}}"#);
        let earlier = app.metric(&name).await;
        // Each finalize answers as ever, and asks for a run: which fails.
        let t = app
            .started(json!({"session_id": s, "user_query": q(i + 2)}))
            .await;
        let res = app
            .finalize(&s, t["turn_id"].as_str().unwrap(), &a(i + 2))
            .await;
        assert_eq!(res.status(), 200, "{mode}");
        eventually(&format!("{mode} counted"), || async {
            (app.metric(&name).await > earlier).then_some(())
        })
        .await;
        assert!(summary(&app, &s).await.is_none(), "{mode}");
    }
    let failed = eventually("every failed run counted by its kind", || async {
        let metrics = app.metrics().await;
        let value = |name: &str| {
            metrics
                .lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
                .map_or(0.0, |v| v.trim().parse::<f64>().unwrap())
        };
        let failed = value(r#"turnstore_summarizer_runs_total{outcome="failed"}"#);
        let kinds = value(r#"turnstore_summarizer_failures_total{kind="http_status"}"#)
            + value(r#"turnstore_summarizer_failures_total{kind="garbage"}"#);
        (failed == kinds).then_some(failed)
    })
    .await;
    assert!(failed >= failures.len() as f64, "{failed}");
    // The turns are all there, the first one's history unchanged by it all.
    let after = app.history_ok(&s, "limit=1000").await;
    assert_eq!(after["total_turns"], 1 + failures.len());
    assert_eq!(before["turns"][0], after["turns"][0]);

    // The lock was released each time: once the endpoint answers, the next
    // finalize folds everything the default history leaves out.
    fake.set_mode(json!({"mode": "ok"})).await;
    let n = 2 + failures.len();
    complete(&app, &s, n..=n).await;
    let done = summary_through(&app, &s, (n - 1) as u64).await;
    assert!(
        done["summary"].as_str().unwrap().starts_with("SUMMARY("),
        "{done}"
    );

    // An endpoint nobody listens on: a connection failure, counted.
    let port = ClosedPort::new();
    let closed = format!("http://127.0.0.1:{}/v1/chat/completions", port.port());
    let app = summarizing(backend, closed, 1, 1).await;
    let s = sid();
    complete(&app, &s, 1..=2).await;
    // One run fails or two: the first finalize's run may look only after
    // the second turn is in, and then both writes find a backlog to fold.
    // Every failed run is that one kind of failure.
    let counted = within_30s(|| async {
        let n = app
            .metric(r#"turnstore_summarizer_failures_total{kind="connection"}"#)
            .await;
        let failed = app
            .metric(r#"turnstore_summarizer_runs_total{outcome="failed"}"#)
            .await;
        (n >= 1.0 && failed == n).then_some(n)
    })
    .await;
    if let Some(n) = counted {
        assert!(n <= 2.0, "{n} connection failures from two writes");
    } else {
        let metrics = app.metrics().await;
        let summarizer: Vec<_> = metrics
            .lines()
            .filter(|l| l.starts_with("turnstore_summarizer"))
            .collect();
        panic!(
            "no connection failure counted; the summarizer's metrics:\n{}",
            summarizer.join("\n")
        );
    }
    assert!(summary(&app, &s).await.is_none());
}

async fn a_slow_endpoint_holds_no_request_up(backend: Backend) {
    let fake = FakeLlm::start();
    let app = summarizing(backend, fake.url("mode=slow&ms=20000"), 1, 1).await;
    let s = sid();
    complete(&app, &s, 1..=2).await;
    // The finalize has answered; the model call it began goes on.
    eventually("the model is being called", || async {
        (fake.stats().await["in_flight"] == 1).then_some(())
    })
    .await;
    assert!(summary(&app, &s).await.is_none());

    // Requests on that very session answer meanwhile, and ask for no second
    // run of it.
    complete(&app, &s, 3..=5).await;
    assert_eq!(app.history_ok(&s, "summary=true").await["total_turns"], 5);
    let stats = fake.stats().await;
    assert_eq!(stats["in_flight"], 1, "{stats}");
    assert_eq!(stats["requests"], 1, "{stats}");
}

async fn instances_racing_on_one_session_call_the_model_one_at_a_time(backend: Backend) {
    let fake = FakeLlm::start();
    let first = summarizing(backend, fake.url("mode=slow&ms=300"), 1, 1).await;
    let mut apps = vec![first];
    for _ in 0..2 {
        apps.push(apps[0].another(|_| {}).await);
    }
    let s = sid();
    let n = 12;
    for i in 1..=n {
        let (starter, finalizer) = (&apps[i % 3], &apps[(i + 1) % 3]);
        let t = starter
            .started(json!({"session_id": s, "user_query": q(i)}))
            .await;
        let res = finalizer
            .finalize(&s, t["turn_id"].as_str().unwrap(), &a(i))
            .await;
        assert_eq!(res.status(), 200);
    }
    summary_through(&apps[0], &s, (n - 1) as u64).await;
    let stats = fake.stats().await;
    assert_eq!(stats["max_in_flight"], 1, "{stats}\n{}", fake.log());

    // Every turn folded exactly once, between them.
    let mut folded = 0.0;
    for app in &apps {
        folded += app.metric("turnstore_summarizer_turns_folded_total").await;
    }
    assert_eq!(folded, (n - 1) as f64);
    let text = summary(&apps[1], &s).await.unwrap()["summary"].clone();
    assert!(text.as_str().unwrap().starts_with("SUMMARY("), "{text}");
}

/// The store under test, as the app uses it.
fn store_of(app: &TestApp) -> Arc<dyn Store> {
    app.redis_store().unwrap_or_else(|| {
        let metrics = turnstore::metrics::Metrics::new();
        Arc::new(MemoryStore::new(
            turnstore::app::limits(&app.settings),
            metrics.expired_pending.clone(),
        ))
    })
}

async fn the_summarizer_lock_expires_and_only_its_holder_releases_it(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let store = store_of(&app);
    let s = SessionId::parse(sid()).unwrap();
    let short = Duration::from_millis(300);
    let long = Duration::from_secs(60);

    assert!(store.lock_summarizing(&s, "a", short).await.unwrap());
    assert!(!store.lock_summarizing(&s, "b", long).await.unwrap());
    store.unlock_summarizing(&s, "b").await.unwrap();
    assert!(
        !store.lock_summarizing(&s, "b", long).await.unwrap(),
        "b cannot release a's lock"
    );
    // An instance that died holding it delays the session's summaries, no
    // more: the lock expires.
    tokio::time::sleep(short + Duration::from_millis(100)).await;
    assert!(store.lock_summarizing(&s, "b", long).await.unwrap());
    store.unlock_summarizing(&s, "a").await.unwrap();
    assert!(!store.lock_summarizing(&s, "a", long).await.unwrap());
    store.unlock_summarizing(&s, "b").await.unwrap();
    assert!(store.lock_summarizing(&s, "a", long).await.unwrap());
    // Another session's lock is its own.
    let other = SessionId::parse(sid()).unwrap();
    assert!(store.lock_summarizing(&other, "b", long).await.unwrap());
}

async fn a_long_backlog_is_folded_over_several_runs(backend: Backend) {
    let fake = FakeLlm::start();
    let app = summarizing(backend, fake.url("mode=ok"), 1, 1).await;
    let s = sid();
    // 40 turns of 16 KiB: 640 KiB to fold, more than one run takes
    // (FOLD_BYTES, 256 KiB). Words: the fake's summary quotes the first
    // five, which must stay within a summary's share of a history.
    let big = "word ".repeat(8 * 1024 / 5);
    let messages: Vec<Value> = (1..=40)
        .flat_map(|i| {
            [
                json!({"role": "user", "content": format!("q{i} {big}")}),
                json!({"role": "assistant", "content": format!("a{i} {big}")}),
            ]
        })
        .collect();
    let res = app.import(&s, json!({ "messages": messages })).await;
    ok_json(res, StatusCode::CREATED).await;
    summary_through(&app, &s, 39).await;
    let requests = fake.stats().await["requests"].as_u64().unwrap();
    assert_eq!(requests, 3, "16 turns a run: 16, 16 and 7");
    assert_eq!(
        app.metric("turnstore_summarizer_turns_folded_total").await,
        39.0
    );
}

#[tokio::test]
async fn a_summarizer_needs_a_model_and_a_readable_prompt() {
    let fake = FakeLlm::start();
    let mut settings = Settings {
        listen: "127.0.0.1:0".parse().unwrap(),
        summarizer_url: Some(fake.url("mode=ok")),
        ..Settings::default()
    };
    let e = Application::build(settings.clone()).await.err().unwrap();
    assert!(e.to_string().contains("TURNSTORE_SUMMARIZER_MODEL"), "{e}");

    settings.summarizer_model = Some("m".into());
    settings.summarizer_prompt_file = Some("/nonexistent/prompt.txt".into());
    let e = Application::build(settings.clone()).await.err().unwrap();
    assert!(
        e.to_string()
            .contains("TURNSTORE_SUMMARIZER_PROMPT_FILE /nonexistent/prompt.txt"),
        "{e}"
    );

    settings.summarizer_prompt_file = None;
    settings.summarizer_url = Some("not a url".into());
    let e = Application::build(settings).await.err().unwrap();
    assert!(e.to_string().contains("TURNSTORE_SUMMARIZER_URL"), "{e}");
}

/// A user's turns: long (so that two of them reach the summarizer's
/// threshold), each naming `word`.
async fn owned_turns(app: &TestApp, session: &str, user: &str, word: &str, n: usize) {
    let long = format!("{word} ").repeat(60);
    for i in 1..=n {
        let t = app
            .started(json!({"session_id": session, "user_id": user,
                            "user_query": format!("{word} question {i} {long}")}))
            .await;
        let res = app
            .finalize(
                session,
                t["turn_id"].as_str().unwrap(),
                &format!("{word} answer {i} {long}"),
            )
            .await;
        assert_eq!(res.status(), StatusCode::OK);
    }
}

/// What a user can read of a session: its summary, a `summary=true`
/// history and the owner's export, as one string.
async fn everything_readable(app: &TestApp, session: &str, owner: &str) -> String {
    let summary = summary(app, session).await.unwrap_or(Value::Null);
    let history = app
        .history_ok(session, "summary=true&format=messages")
        .await;
    let export = app
        .http
        .get(app.url(&format!("/v1/users/{owner}/export")))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    format!("{summary}\n{history}\n{export}")
}

async fn a_fold_never_lands_on_a_session_started_again(backend: Backend) {
    // The model takes 2 s; the first user's session is erased (or cleared)
    // and made again under the same id meanwhile. The fold of the old
    // conversation must not become the new one's summary. (Short turns:
    // the new conversation alone stays below the threshold.)
    let fake = FakeLlm::start();
    let threshold = 2 * count_block("zebra ", 60);
    let app = summarizing(backend, fake.url("mode=slow&ms=2000"), 1, threshold).await;
    for (round, replace) in ["erase", "clear"].into_iter().enumerate() {
        let s = sid();
        let first = format!("first-{}", sid());
        let second = if replace == "erase" {
            format!("second-{}", sid())
        } else {
            first.clone()
        };
        owned_turns(&app, &s, &first, "zebra", 3).await;
        eventually(
            "the model is asked to fold the first conversation",
            || async {
                (fake.stats().await["requests"].as_u64().unwrap_or(0) > round as u64).then_some(())
            },
        )
        .await;

        match replace {
            "erase" => {
                let (deleted, _) = app.erase_user_fully(&first).await;
                assert_eq!(deleted, 1);
            }
            _ => assert_eq!(app.clear(&s).await.status(), StatusCode::NO_CONTENT),
        }
        let messages: Vec<Value> = (1..=5)
            .flat_map(|i| {
                [
                    json!({"role": "user", "content": format!("otter question {i}")}),
                    json!({"role": "assistant", "content": format!("otter answer {i}")}),
                ]
            })
            .collect();
        let res = app
            .import(&s, json!({"user_id": second, "messages": messages}))
            .await;
        assert_eq!(res.status(), StatusCode::CREATED);

        // The fold's write is refused (a conflict), never written.
        eventually("the fold ends", || async {
            let conflicts = app
                .metric(r#"turnstore_summarizer_runs_total{outcome="conflict"}"#)
                .await;
            let written = app
                .metric(r#"turnstore_summarizer_runs_total{outcome="written"}"#)
                .await;
            (conflicts + written > round as f64).then_some(())
        })
        .await;
        let seen = everything_readable(&app, &s, &second).await;
        assert!(
            !seen.contains("zebra"),
            "{replace}: the old conversation leaked:\n{seen}"
        );
        assert!(seen.contains("otter question 5"), "{seen}");
        assert_eq!(
            app.metric(r#"turnstore_summarizer_runs_total{outcome="written"}"#)
                .await,
            0.0
        );
    }
}

/// The tokens of a `text` block of a turn whose texts repeat `word` `n`
/// times (about: the test's threshold needs no more).
fn count_block(word: &str, n: usize) -> u32 {
    crate::support::count("o200k_base", &word.repeat(n)) as u32
}

async fn a_summary_over_its_share_of_a_history_is_refused(backend: Backend) {
    // A model answering 24 KB (about 5,000 tokens) where a default history
    // holds 4,096 tokens and a summary may take a quarter.
    let fake = FakeLlm::start();
    let url = fake.url("mode=garbage&kind=long&bytes=24000&unit=Summary+words+");
    let app = summarizing(backend, url, 1, 1).await;
    let s = sid();
    complete(&app, &s, 1..=3).await;

    eventually("the long answer is counted as a failure", || async {
        let failed = app
            .metric(r#"turnstore_summarizer_failures_total{kind="garbage"}"#)
            .await;
        (failed >= 1.0).then_some(())
    })
    .await;
    assert!(summary(&app, &s).await.is_none(), "nothing is written");
    let h = app.history_ok(&s, "summary=true").await;
    assert_eq!(
        h["included_turns"], 1,
        "a default read keeps its turns: {h}"
    );
    assert_eq!(
        app.metric(r#"turnstore_summarizer_runs_total{outcome="written"}"#)
            .await,
        0.0
    );
    // The prompt asked for what fits: 1,024 tokens, half a word each.
    let sent = last_user_message(&fake).await;
    assert!(sent.ends_with("at most about 512 words."), "{sent}");
}
