//! Traces: the binary exports to an OTLP/HTTP receiver the test starts,
//! which decodes what arrives. A request's server span continues the
//! caller's `traceparent`; each Redis script call and each summarizer model
//! call is a client span inside it; no byte sent holds a question, an
//! answer, a session id or a key; without an endpoint, nothing is sent.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message;
use serde_json::json;

use super::client;
use super::fake_llm::FakeLlm;
use super::harness::{ClosedPort, Redis, Turnstore};

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

/// An OTLP/HTTP receiver: every body posted to `/v1/traces`, raw.
struct Receiver {
    bodies: Arc<Mutex<Vec<Bytes>>>,
    port: u16,
}

/// A span as the tests look at it.
#[derive(Debug, Clone)]
struct Seen {
    name: String,
    kind: SpanKind,
    trace_id: String,
    span_id: String,
    parent: String,
    attributes: Vec<(String, String)>,
    /// The attributes sent as integers.
    integers: Vec<String>,
    error: bool,
    start: u64,
}

impl Seen {
    fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

impl Receiver {
    async fn start() -> Self {
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let kept = bodies.clone();
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |body: Bytes| {
                let kept = kept.clone();
                async move {
                    kept.lock().unwrap().push(body);
                    // An empty ExportTraceServiceResponse.
                    (
                        [("content-type", "application/x-protobuf")],
                        Vec::<u8>::new(),
                    )
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Receiver { bodies, port }
    }

    fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Every byte received so far.
    fn bytes(&self) -> Vec<u8> {
        self.bodies.lock().unwrap().concat()
    }

    /// The spans received so far, and each request's service name.
    fn spans(&self) -> (Vec<Seen>, Vec<String>) {
        let mut spans = Vec::new();
        let mut services = Vec::new();
        for body in self.bodies.lock().unwrap().iter() {
            let request = ExportTraceServiceRequest::decode(body.as_ref())
                .expect("an OTLP protobuf ExportTraceServiceRequest");
            for resource in request.resource_spans {
                let attributes = resource.resource.map(|r| r.attributes).unwrap_or_default();
                services.extend(
                    attributes
                        .iter()
                        .filter(|a| a.key == "service.name")
                        .map(|a| text(a.value.as_ref().and_then(|v| v.value.as_ref()))),
                );
                for scope in resource.scope_spans {
                    for s in scope.spans {
                        spans.push(Seen {
                            kind: SpanKind::try_from(s.kind).unwrap(),
                            trace_id: hex(&s.trace_id),
                            span_id: hex(&s.span_id),
                            parent: hex(&s.parent_span_id),
                            attributes: s
                                .attributes
                                .iter()
                                .map(|a| {
                                    (
                                        a.key.clone(),
                                        text(a.value.as_ref().and_then(|v| v.value.as_ref())),
                                    )
                                })
                                .collect(),
                            integers: s
                                .attributes
                                .iter()
                                .filter(|a| {
                                    matches!(
                                        a.value.as_ref().and_then(|v| v.value.as_ref()),
                                        Some(Any::IntValue(_))
                                    )
                                })
                                .map(|a| a.key.clone())
                                .collect(),
                            // STATUS_CODE_ERROR
                            error: s.status.is_some_and(|st| st.code == 2),
                            start: s.start_time_unix_nano,
                            name: s.name,
                        });
                    }
                }
            }
        }
        (spans, services)
    }

    /// Waits (up to 15 s) until the spans received satisfy `done`.
    async fn until(&self, what: &str, done: impl Fn(&[Seen]) -> bool) -> Vec<Seen> {
        for _ in 0..300 {
            let (spans, _) = self.spans();
            if done(&spans) {
                return spans;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("never received: {what}\n{:#?}", self.spans().0);
    }
}

/// The spans under `parent`, as a tree: each with its kind, and its status
/// code or its database; children in the order they started.
fn tree(spans: &[Seen], parent: &str) -> String {
    fn below(spans: &[Seen], parent: &str, indent: &str, out: &mut String) {
        let mut children: Vec<&Seen> = spans.iter().filter(|s| s.parent == parent).collect();
        children.sort_by_key(|s| s.start);
        for (i, span) in children.iter().enumerate() {
            let last = i + 1 == children.len();
            let detail = span
                .attribute("http.response.status_code")
                .or(span.attribute("db.system.name"))
                .unwrap_or("");
            let kind = format!("{:?}", span.kind).to_lowercase();
            out.push_str(&format!(
                "{indent}{} {}  [{kind} {detail}]\n",
                if last { "└─" } else { "├─" },
                span.name
            ));
            let deeper = format!("{indent}{}", if last { "   " } else { "│  " });
            below(spans, &span.span_id, &deeper, out);
        }
    }
    let mut out = format!("your span {parent}\n");
    below(spans, parent, "", &mut out);
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn text(value: Option<&Any>) -> String {
    match value {
        Some(Any::StringValue(s)) => s.clone(),
        Some(Any::IntValue(i)) => i.to_string(),
        Some(Any::BoolValue(b)) => b.to_string(),
        Some(Any::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

/// Exporting to `receiver`, in batches sent every 100 ms.
fn traced<'a>(receiver: &Receiver, more: &[(&'a str, String)]) -> Vec<(&'a str, String)> {
    let mut env = vec![
        ("TURNSTORE_OTLP_ENDPOINT", receiver.base()),
        ("OTEL_BSP_SCHEDULE_DELAY", "100".to_owned()),
    ];
    env.extend_from_slice(more);
    env
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_continues_the_callers_trace_and_its_script_calls_are_its_children() {
    let receiver = Receiver::start().await;
    let mut redis = Redis::unix();
    let ts = Turnstore::spawn(&traced(&receiver, &[("TURNSTORE_REDIS_URL", redis.url())]));
    let http = client();
    let (session, question, answer) = (
        "sess-traced-7d1c",
        "QUESTION-never-in-a-span",
        "ANSWER-never-in-a-span",
    );

    let started = http
        .post(format!("{}/v1/turns", ts.base()))
        .header("traceparent", format!("00-{TRACE_ID}-{CALLER_SPAN}-01"))
        .json(&json!({"session_id": session, "user_query": question}))
        .send()
        .await
        .unwrap();
    assert_eq!(started.status(), 201, "{}", ts.log());
    let turn: serde_json::Value = started.json().await.unwrap();
    let finalized = http
        .post(format!(
            "{}/v1/sessions/{session}/turns/{}/finalize",
            ts.base(),
            turn["turn_id"].as_str().unwrap()
        ))
        // Sampled and random (Trace Context Level 2), as OpenTelemetry's
        // Python SDK sends it.
        .header("traceparent", format!("00-{TRACE_ID}-{CALLER_SPAN}-03"))
        .json(&json!({"final_answer": answer}))
        .send()
        .await
        .unwrap();
    assert_eq!(finalized.status(), 200, "{}", ts.log());
    let missing = http
        .get(format!("{}/v1/sessions/nobody-here", ts.base()))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);

    let spans = receiver
        .until("the three requests' spans and their scripts'", |spans| {
            let servers = spans.iter().filter(|s| s.kind == SpanKind::Server).count();
            servers >= 3 && spans.iter().filter(|s| s.kind == SpanKind::Client).count() >= 2
        })
        .await;

    // The start: the caller's trace, the caller's span its parent.
    let start = spans
        .iter()
        .find(|s| s.name == "POST /v1/turns")
        .unwrap_or_else(|| panic!("{spans:#?}"));
    assert_eq!(start.kind, SpanKind::Server);
    assert_eq!(start.trace_id, TRACE_ID);
    assert_eq!(start.parent, CALLER_SPAN);
    assert_eq!(start.attribute("http.route"), Some("/v1/turns"));
    assert_eq!(start.attribute("http.request.method"), Some("POST"));
    assert_eq!(start.attribute("http.response.status_code"), Some("201"));
    assert!(
        start
            .integers
            .contains(&"http.response.status_code".to_owned())
    );
    assert_eq!(start.attribute("target"), None);
    assert!(!start.error);
    // Its script call: a client span, its child.
    let script = spans
        .iter()
        .find(|s| s.name == "start_turn" && s.parent == start.span_id)
        .unwrap_or_else(|| panic!("no script span under the start\n{spans:#?}"));
    assert_eq!(script.kind, SpanKind::Client);
    assert_eq!(script.trace_id, TRACE_ID);
    assert_eq!(script.attribute("db.system.name"), Some("redis"));

    // The finalize: the same trace, its script call its child.
    let finalize = spans
        .iter()
        .find(|s| s.name == "POST /v1/sessions/{session_id}/turns/{turn_id}/finalize")
        .unwrap_or_else(|| panic!("{spans:#?}"));
    assert_eq!(finalize.trace_id, TRACE_ID);
    assert_eq!(finalize.parent, CALLER_SPAN);
    assert!(
        spans
            .iter()
            .any(|s| s.name == "finalize_turn" && s.parent == finalize.span_id),
        "{spans:#?}"
    );
    // docs/deployment.md shows this trace as it arrives.
    let shown = tree(&spans, CALLER_SPAN);
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/deployment.md"))
        .unwrap();
    assert!(
        page.contains(&shown),
        "docs/deployment.md's \"Traces\" section should show this trace:\n{shown}"
    );
    // A request without traceparent: a trace of its own.
    // A 404 is the caller's error, not the server's.
    let history = spans
        .iter()
        .find(|s| s.name == "GET /v1/sessions/{session_id}")
        .unwrap_or_else(|| panic!("{spans:#?}"));
    assert_ne!(history.trace_id, TRACE_ID);
    assert_eq!(history.parent, "");
    assert_eq!(history.attribute("http.response.status_code"), Some("404"));
    assert!(!history.error);

    // Redis gone: the 503 is the server's failure, and says so.
    redis.stop();
    let failed = http
        .post(format!("{}/v1/turns", ts.base()))
        .json(&json!({"user_query": question}))
        .send()
        .await
        .unwrap();
    assert_eq!(failed.status(), 503);
    let spans = receiver
        .until("the failed start's span", |spans| {
            spans
                .iter()
                .any(|s| s.attribute("http.response.status_code") == Some("503"))
        })
        .await;
    let failed = spans
        .iter()
        .find(|s| s.attribute("http.response.status_code") == Some("503"))
        .unwrap();
    assert!(failed.error, "{failed:#?}");
    assert!(
        spans
            .iter()
            .any(|s| s.name == "start_turn" && s.parent == failed.span_id && s.error),
        "the script call failed too\n{spans:#?}"
    );

    let (_, services) = receiver.spans();
    assert!(services.iter().all(|s| s == "turnstore"), "{services:?}");
    // Not one byte of the texts or ids, anywhere in what was sent.
    let sent = receiver.bytes();
    for secret in [question, answer, session, "nobody-here"] {
        assert!(
            !sent.windows(secret.len()).any(|w| w == secret.as_bytes()),
            "{secret} was sent"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_model_call_of_the_summarizer_is_a_span_under_the_write_that_started_it() {
    let receiver = Receiver::start().await;
    let fake = FakeLlm::start();
    let ts = Turnstore::spawn(&traced(
        &receiver,
        &[
            ("TURNSTORE_SUMMARIZER_URL", fake.url("mode=ok")),
            ("TURNSTORE_SUMMARIZER_MODEL", "fake-model".to_owned()),
            ("TURNSTORE_SUMMARIZER_MAX_RETRIES", "0".to_owned()),
            ("TURNSTORE_HISTORY_LIMIT", "1".to_owned()),
            ("TURNSTORE_SUMMARIZE_AFTER_TOKENS", "1".to_owned()),
        ],
    ));
    let http = client();
    for i in 0..3 {
        let turn: serde_json::Value = http
            .post(format!("{}/v1/turns", ts.base()))
            .json(&json!({"session_id": "sess-summarized", "user_query": format!("question {i}")}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let done = http
            .post(format!(
                "{}/v1/sessions/sess-summarized/turns/{}/finalize",
                ts.base(),
                turn["turn_id"].as_str().unwrap()
            ))
            .json(&json!({"final_answer": format!("answer {i}")}))
            .send()
            .await
            .unwrap();
        assert_eq!(done.status(), 200, "{}", ts.log());
    }

    let spans = receiver
        .until("a model call, its summarization and its request", |spans| {
            let by_id = |id: &str| spans.iter().find(|s| s.span_id == id);
            spans.iter().any(|chat| {
                chat.name == "chat fake-model"
                    && by_id(&chat.parent)
                        .is_some_and(|summarize| by_id(&summarize.parent).is_some())
            })
        })
        .await;
    let chat = spans.iter().find(|s| s.name == "chat fake-model").unwrap();
    assert_eq!(chat.kind, SpanKind::Client);
    assert_eq!(chat.attribute("gen_ai.request.model"), Some("fake-model"));
    let summarize = spans
        .iter()
        .find(|s| s.span_id == chat.parent)
        .unwrap_or_else(|| panic!("the chat span's parent\n{spans:#?}"));
    assert_eq!(summarize.name, "summarize");
    let request = spans
        .iter()
        .find(|s| s.span_id == summarize.parent)
        .unwrap_or_else(|| panic!("the summarization's parent\n{spans:#?}"));
    assert_eq!(
        request.name,
        "POST /v1/sessions/{session_id}/turns/{turn_id}/finalize"
    );
    assert_eq!(chat.trace_id, request.trace_id);
    let sent = receiver.bytes();
    for secret in ["question 0", "answer 0", "sess-summarized", "SUMMARY("] {
        assert!(
            !sent.windows(secret.len()).any(|w| w == secret.as_bytes()),
            "{secret} was sent"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standard_variables_turn_traces_on_and_off() {
    let receiver = Receiver::start().await;
    let standard = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.base()),
        ("OTEL_BSP_SCHEDULE_DELAY", "100".to_owned()),
        ("OTEL_SERVICE_NAME", "history-east".to_owned()),
    ];
    // Disabled: not one request reaches the receiver.
    let mut disabled = standard.to_vec();
    disabled.push(("OTEL_SDK_DISABLED", "true".to_owned()));
    let off = Turnstore::spawn(&disabled);
    let http = client();
    for _ in 0..3 {
        let res = http
            .get(format!("{}/healthz", off.base()))
            .header("traceparent", format!("00-{TRACE_ID}-{CALLER_SPAN}-01"))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    off.sigterm();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(receiver.bytes().is_empty(), "sent while disabled");

    // The standard endpoint alone: traces, under the service's name.
    let on = Turnstore::spawn(&standard);
    let res = http
        .get(format!("{}/healthz", on.base()))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    receiver
        .until("the health check's span", |spans| {
            spans.iter().any(|s| s.name == "GET /healthz")
        })
        .await;
    let (_, services) = receiver.spans();
    assert!(services.iter().all(|s| s == "history-east"), "{services:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_still_buffered_are_sent_at_shutdown() {
    let receiver = Receiver::start().await;
    // Batches every minute: only the exit's flush can send this one.
    let ts = Turnstore::spawn(&[
        ("TURNSTORE_OTLP_ENDPOINT", receiver.base()),
        ("OTEL_BSP_SCHEDULE_DELAY", "60000".to_owned()),
    ]);
    let res = client()
        .get(format!("{}/readyz", ts.base()))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert!(receiver.bytes().is_empty());
    ts.sigterm();
    receiver
        .until("the readiness check's span, at exit", |spans| {
            spans.iter().any(|s| s.name == "GET /readyz")
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_is_down_fails_no_request() {
    let closed = ClosedPort::new();
    let ts = Turnstore::spawn(&[
        (
            "TURNSTORE_OTLP_ENDPOINT",
            format!(
                "http://otel:s3cret@127.0.0.1:{}/?token=t0k3n",
                closed.port()
            ),
        ),
        ("OTEL_BSP_SCHEDULE_DELAY", "10".to_owned()),
        // A batch or two, then the queue is full: spans are dropped.
        ("OTEL_BSP_MAX_QUEUE_SIZE", "16".to_owned()),
        ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "8".to_owned()),
    ]);
    let http = client();
    for i in 0..200 {
        let res = http
            .post(format!("{}/v1/turns", ts.base()))
            .json(&json!({"session_id": format!("down-{}", i % 7), "user_query": "q"}))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 201, "request {i}\n{}", ts.log());
    }
    let log = ts.log();
    assert!(
        log.contains(&format!("collector=http://127.0.0.1:{}", closed.port())),
        "{log}"
    );
    for secret in ["s3cret", "t0k3n"] {
        assert!(!log.contains(secret), "{secret} logged\n{log}");
    }
}

#[test]
fn an_endpoint_that_is_not_a_url_stops_the_start() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_turnstore"))
        .env_clear()
        .env("TURNSTORE_LISTEN", "127.0.0.1:0")
        .env("TURNSTORE_OTLP_ENDPOINT", "collector:4318")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("is not an OTLP/HTTP endpoint like http://collector:4318"),
        "{stderr}"
    );
}
