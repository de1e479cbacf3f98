//! `TestApp`: the service in this process on port 0, on the store under test,
//! with typed helpers that talk HTTP to it.

use std::time::Duration;

use reqwest::{Response, StatusCode};
use serde_json::{Value, json};
use turnstore::{Application, Settings};

use crate::harness::{Redis, RedisCluster};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Memory,
    Redis,
    Cluster,
}

pub struct TestApp {
    pub base: String,
    pub http: reqwest::Client,
    /// What the app was built with.
    pub settings: Settings,
    /// The test's own redis-server; `None` for the memory store and for an
    /// external Redis (`TURNSTORE_TEST_REDIS_URL`).
    pub redis: Option<Redis>,
    pub cluster: Option<RedisCluster>,
}

impl TestApp {
    pub async fn spawn(backend: Backend) -> Self {
        Self::spawn_with(backend, |_| {}).await
    }

    pub async fn spawn_with(backend: Backend, tweak: impl FnOnce(&mut Settings)) -> Self {
        let mut settings = Settings {
            listen: "127.0.0.1:0".parse().unwrap(),
            key_prefix: format!("t-{}", uuid::Uuid::new_v4().simple()),
            ..Settings::default()
        };
        let cluster = (backend == Backend::Cluster).then(|| RedisCluster::start(3));
        if let Some(c) = &cluster {
            settings.redis_cluster_nodes = c.urls();
        }
        let redis = match backend {
            Backend::Memory | Backend::Cluster => None,
            Backend::Redis => match std::env::var("TURNSTORE_TEST_REDIS_URL") {
                Ok(url) if !url.is_empty() => {
                    settings.redis_url = Some(url);
                    None
                }
                _ => {
                    let redis = Redis::unix();
                    settings.redis_url = Some(redis.url());
                    Some(redis)
                }
            },
        };
        tweak(&mut settings);
        TestApp {
            base: launch(&settings).await,
            settings,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap(),
            redis,
            cluster,
        }
    }

    /// Another instance on the same store (the same Redis and key prefix),
    /// with its settings tweaked: as a second replica behind a load
    /// balancer. On the memory store it has a store of its own.
    pub async fn another(&self, tweak: impl FnOnce(&mut Settings)) -> TestApp {
        let mut settings = self.settings.clone();
        tweak(&mut settings);
        TestApp {
            base: launch(&settings).await,
            settings,
            http: self.http.clone(),
            redis: None,
            cluster: None,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub async fn start(&self, body: Value) -> Response {
        self.http
            .post(self.url("/v1/turns"))
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    pub async fn start_with_key(&self, key: &str, body: Value) -> Response {
        self.http
            .post(self.url("/v1/turns"))
            .header("idempotency-key", key)
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    /// Starts a turn that must succeed; returns its body.
    pub async fn started(&self, body: Value) -> Value {
        let res = self.start(body).await;
        ok_json(res, StatusCode::CREATED).await
    }

    pub async fn finalize(&self, session: &str, turn: &str, answer: &str) -> Response {
        self.http
            .post(self.url(&format!("/v1/sessions/{session}/turns/{turn}/finalize")))
            .json(&json!({ "final_answer": answer }))
            .send()
            .await
            .unwrap()
    }

    pub async fn abort(&self, session: &str, turn: &str) -> Response {
        self.http
            .delete(self.url(&format!("/v1/sessions/{session}/turns/{turn}")))
            .send()
            .await
            .unwrap()
    }

    /// Starts and finalizes a turn; returns the finalized turn.
    pub async fn complete(&self, session: &str, q: &str, a: &str) -> Value {
        let t = self
            .started(json!({"session_id": session, "user_query": q}))
            .await;
        let res = self
            .finalize(session, t["turn_id"].as_str().unwrap(), a)
            .await;
        ok_json(res, StatusCode::OK).await["turn"].clone()
    }

    /// `GET /metrics`, as text.
    /// A finalized turn in a session the user owns (or claims).
    pub async fn complete_as(&self, session: &str, user: &str, q: &str, a: &str) -> Value {
        let t = self
            .started(json!({"session_id": session, "user_id": user, "user_query": q}))
            .await;
        let res = self
            .finalize(session, t["turn_id"].as_str().unwrap(), a)
            .await;
        ok_json(res, StatusCode::OK).await
    }

    pub async fn metrics(&self) -> String {
        let res = self.http.get(self.url("/metrics")).send().await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        res.text().await.unwrap()
    }

    /// The value of the series `name` (with its labels) in `/metrics`; 0
    /// when absent.
    pub async fn metric(&self, name: &str) -> f64 {
        self.metrics()
            .await
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .map_or(0.0, |v| v.trim().parse().unwrap())
    }

    pub async fn import(&self, session: &str, body: Value) -> Response {
        self.http
            .post(self.url(&format!("/v1/sessions/{session}/import")))
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    pub async fn put_summary(&self, session: &str, body: Value) -> Response {
        self.http
            .put(self.url(&format!("/v1/sessions/{session}/summary")))
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    pub async fn history(&self, session: &str, query: &str) -> Response {
        self.http
            .get(self.url(&format!("/v1/sessions/{session}/history?{query}")))
            .send()
            .await
            .unwrap()
    }

    pub async fn history_ok(&self, session: &str, query: &str) -> Value {
        ok_json(self.history(session, query).await, StatusCode::OK).await
    }

    pub async fn session(&self, session: &str) -> Response {
        self.http
            .get(self.url(&format!("/v1/sessions/{session}")))
            .send()
            .await
            .unwrap()
    }

    pub async fn clear(&self, session: &str) -> Response {
        self.http
            .delete(self.url(&format!("/v1/sessions/{session}")))
            .send()
            .await
            .unwrap()
    }

    pub async fn user_sessions(&self, user: &str) -> Value {
        self.user_sessions_page(user, "").await
    }

    pub async fn user_sessions_page(&self, user: &str, query: &str) -> Value {
        let res = self
            .http
            .get(self.url(&format!("/v1/users/{user}/sessions?{query}")))
            .send()
            .await
            .unwrap();
        ok_json(res, StatusCode::OK).await
    }

    /// Every page of a user's sessions, following `next_cursor`: the
    /// session ids, in order.
    pub async fn all_user_sessions(&self, user: &str, limit: usize) -> Vec<String> {
        let mut out = Vec::new();
        let mut query = format!("limit={limit}");
        loop {
            let page = self.user_sessions_page(user, &query).await;
            for s in page["sessions"].as_array().unwrap() {
                out.push(s["session_id"].as_str().unwrap().to_owned());
            }
            match page["next_cursor"].as_str() {
                Some(c) => query = format!("limit={limit}&cursor={c}"),
                None => return out,
            }
        }
    }

    /// Erases a user, calling again while the answer is `complete: false`;
    /// returns the sessions deleted in all and how many calls it took.
    pub async fn erase_user_fully(&self, user: &str) -> (u64, usize) {
        let (mut deleted, mut calls) = (0, 0);
        loop {
            let e = ok_json(self.erase_user(user).await, StatusCode::OK).await;
            deleted += e["deleted_sessions"].as_u64().unwrap();
            calls += 1;
            if e["complete"] == true {
                return (deleted, calls);
            }
            assert!(calls < 1000, "the erasure does not end");
        }
    }

    /// The Redis store the app uses, for filling it faster than over HTTP
    /// (`None` for the memory store).
    pub fn redis_store(&self) -> Option<std::sync::Arc<dyn turnstore::store::Store>> {
        if self.settings.redis_url.is_none() && self.settings.redis_cluster_nodes.is_empty() {
            return None;
        }
        let metrics = turnstore::metrics::Metrics::new();
        Some(std::sync::Arc::new(
            turnstore::app::redis_store(&self.settings, &metrics).unwrap(),
        ))
    }

    /// Runs `redis-cli` with `args` on every Redis the app uses.
    pub fn on_every_redis(&self, args: &[&str]) -> Vec<String> {
        let single = self.redis.iter().map(|r| r.cli(args));
        let cluster = self
            .cluster
            .iter()
            .flat_map(|c| c.nodes.iter().map(|n| n.cli(args)));
        single.chain(cluster).collect()
    }

    /// The sum, over every line of `INFO <section>` of every Redis node,
    /// of what `value` reads in a line (lines it reads nothing in add 0).
    pub fn redis_info_sum(&self, section: &str, value: impl Fn(&str) -> Option<u64>) -> u64 {
        self.on_every_redis(&["INFO", section])
            .iter()
            .flat_map(|info| info.lines().filter_map(&value).collect::<Vec<_>>())
            .sum()
    }

    pub async fn erase_user(&self, user: &str) -> Response {
        self.http
            .delete(self.url(&format!("/v1/users/{user}")))
            .send()
            .await
            .unwrap()
    }

    /// The redis-server log, for failure messages.
    pub fn store_log(&self) -> String {
        let single = self.redis.as_ref().map(Redis::log);
        let cluster = self.cluster.as_ref().map(RedisCluster::log);
        single.or(cluster).unwrap_or_default()
    }
}

/// Builds the service and serves it in the background; returns its base URL.
async fn launch(settings: &Settings) -> String {
    let app = Application::build(settings.clone())
        .await
        .expect("the app builds");
    let base = format!("http://127.0.0.1:{}", app.port());
    tokio::spawn(app.run_until_stopped(std::future::pending::<()>()));
    base
}

pub async fn ok_json(res: Response, status: StatusCode) -> Value {
    let got = res.status();
    let body = res.text().await.unwrap();
    assert_eq!(got, status, "body: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

/// Asserts a problem+json answer with this status and code; returns its body.
pub async fn problem(res: Response, status: u16, code: &str) -> Value {
    let got = res.status().as_u16();
    let content_type = res
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let body = res.text().await.unwrap();
    assert_eq!(got, status, "body: {body}");
    assert_eq!(content_type, "application/problem+json", "body: {body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["code"], code, "body: {body}");
    assert_eq!(v["status"], status);
    for field in ["type", "title", "detail"] {
        assert!(v[field].is_string(), "no {field}: {body}");
    }
    v
}

/// The fields a 422 `validation_failed` names, in its order.
pub fn error_fields(p: &Value) -> Vec<&str> {
    p["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["field"].as_str().unwrap())
        .collect()
}

/// The seqs of a `turns` history, in its order.
pub fn seqs(h: &Value) -> Vec<u64> {
    h["turns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["seq"].as_u64().unwrap())
        .collect()
}

pub fn sid() -> String {
    format!("s-{}", uuid::Uuid::new_v4().simple())
}

pub fn count(encoding: &str, text: &str) -> usize {
    let bpe = match encoding {
        "o200k_base" => tiktoken_rs::o200k_base_singleton(),
        "o200k_harmony" => tiktoken_rs::o200k_harmony_singleton(),
        "cl100k_base" => tiktoken_rs::cl100k_base_singleton(),
        "p50k_base" => tiktoken_rs::p50k_base_singleton(),
        "p50k_edit" => tiktoken_rs::p50k_edit_singleton(),
        "r50k_base" => tiktoken_rs::r50k_base_singleton(),
        other => panic!("no tokenizer for {other} in the tests"),
    };
    bpe.encode_ordinary(text).len()
}
