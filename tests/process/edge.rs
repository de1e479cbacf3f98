//! The HTTP edge of the real binary under heavy, slow and idle clients:
//! reads that count millions of tokens, connections that send nothing or
//! one byte at a time, and more of them than the service will keep.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::client;
use crate::harness::{Redis, Turnstore};

/// A session of `n` maximal turns (answers of 128 KiB).
async fn fill_maximal(http: &reqwest::Client, base: &str, session: &str, n: usize) {
    let answer = include_str!("../../bench/answer.txt").repeat(128 * 1024 / 601);
    for _ in 0..n {
        let res = http
            .post(format!("{base}/v1/turns"))
            .json(&json!({"session_id": session, "user_query": "Tell me everything."}))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 201);
        let turn: Value = res.json().await.unwrap();
        let res = http
            .post(format!(
                "{base}/v1/sessions/{session}/turns/{}/finalize",
                turn["turn_id"].as_str().unwrap()
            ))
            .json(&json!({ "final_answer": answer }))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
    }
}

/// Four reads that each tokenize a whole session of 15 MiB again (another
/// encoding; `TURNSTORE_MAX_HISTORY_BYTES` raised to let them), seconds of
/// work each, run on a service with two workers. They must not hold the
/// workers: the probes answer while they run, and each read ends at the
/// request timeout with 503 `request_timeout` instead of running on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_that_count_leave_probes_answering_and_end_at_the_timeout() {
    let redis = Redis::unix();
    for store in [vec![], vec![("TURNSTORE_REDIS_URL", redis.url())]] {
        // Arrange
        let mut env = vec![
            ("TURNSTORE_WORKER_THREADS", "2".to_string()),
            ("TURNSTORE_REQUEST_TIMEOUT", "500ms".to_string()),
            ("TURNSTORE_MAX_HISTORY_BYTES", (16 << 20).to_string()),
        ];
        env.extend(store);
        let ts = Turnstore::spawn(&env);
        let (http, base) = (client(), ts.base());
        fill_maximal(&http, &base, "heavy", 120).await;

        // Act: the reads, then the probes while they run.
        let read_url = format!(
            "{base}/v1/sessions/heavy/history?encoding=cl100k_base&limit=1000&max_tokens=10000000"
        );
        let reads: Vec<_> = (0..4)
            .map(|_| {
                let (http, url) = (http.clone(), read_url.clone());
                tokio::spawn(async move {
                    let res = http.get(&url).send().await.unwrap();
                    let status = res.status().as_u16();
                    let body: Value = res.json().await.unwrap();
                    (status, body["code"].clone(), Instant::now())
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut probes = vec![];
        for probe in ["/healthz", "/readyz", "/healthz"] {
            let res = http.get(format!("{base}{probe}")).send().await.unwrap();
            probes.push((probe, res.status().as_u16(), Instant::now()));
        }

        // Assert: every probe answered before any read ended; every read
        // ended at the timeout.
        let mut ends = vec![];
        for r in reads {
            let (status, code, end) = r.await.unwrap();
            assert_eq!(
                (status, code),
                (503, json!("request_timeout")),
                "{}",
                ts.log()
            );
            ends.push(end);
        }
        let first_end = ends.into_iter().min().unwrap();
        for (probe, status, at) in probes {
            assert_eq!(status, 200, "{probe}");
            assert!(at < first_end, "{probe} answered only after a read ended");
        }
    }
}
