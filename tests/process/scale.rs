//! Many instances behind a load balancer: simulated RAG clients through
//! nginx in front of three turnstore processes on one Redis, one of which is
//! killed in the middle of the run.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::harness::{Nginx, Redis, Turnstore};

const CLIENTS: usize = 12;

/// Everything a session holds: (seq, final answer) of each turn, oldest
/// first, and how many turns are pending.
async fn stored(base: &str, session: &str) -> (Vec<(u64, String)>, u64) {
    let url = format!(
        "{base}/v1/sessions/{session}/history?limit=10000&max_tokens=10000000&format=turns"
    );
    let h: Value = reqwest::get(url).await.unwrap().json().await.unwrap();
    let turns = h["turns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["seq"].as_u64().unwrap(),
                t["final_answer"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    (turns, h["pending_turns"].as_u64().unwrap())
}
const RUN_FOR: Duration = Duration::from_secs(4);

/// Retries a request until it gets `expected`; transport errors and 5xx
/// (an instance gone, nginx noticing) are retried, anything else is a failure.
async fn until_ok(expected: u16, request: impl Fn() -> reqwest::RequestBuilder) -> (Value, u32) {
    let mut failures = 0;
    loop {
        match request().send().await {
            Ok(res)
                if res.status().as_u16() == expected
                    || (expected == 201 && res.status() == 200) =>
            {
                return (res.json().await.unwrap(), failures);
            }
            Ok(res) if res.status().is_server_error() => failures += 1,
            Err(_) => failures += 1,
            Ok(res) => panic!("unexpected {}: {}", res.status(), res.text().await.unwrap()),
        }
        assert!(failures < 50, "no success after 50 tries");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One simulated RAG client: start with history, finalize, read; returns the
/// answers it finalized, in order, and how many requests had to be retried.
async fn rag_client(base: String, session: String, deadline: Instant) -> (Vec<String>, u32) {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let mut answers = Vec::new();
    let mut retried = 0;
    let mut n = 0;
    while Instant::now() < deadline {
        n += 1;
        let key = format!("{session}-turn-{n}");
        let body = json!({"session_id": session, "user_id": "scale-user", "user_query": format!("question {n}"),
                          "history": {"limit": 5, "max_tokens": 500}});
        let (started, r1) = until_ok(201, || {
            http.post(format!("{base}/v1/turns"))
                .header("idempotency-key", &key)
                .json(&body)
        })
        .await;
        assert_eq!(started["history"]["pending_turns"], 0, "{started}");
        let turn = started["turn_id"].as_str().unwrap().to_owned();
        let answer = format!("answer {n} of {session}");
        let (_, r2) = until_ok(200, || {
            http.post(format!(
                "{base}/v1/sessions/{session}/turns/{turn}/finalize"
            ))
            .json(&json!({"final_answer": answer}))
        })
        .await;
        let (history, r3) = until_ok(200, || {
            http.get(format!(
                "{base}/v1/sessions/{session}/history?limit=1&format=turns"
            ))
        })
        .await;
        assert_eq!(history["turns"][0]["final_answer"], answer.as_str());
        answers.push(answer);
        retried += r1 + r2 + r3;
    }
    (answers, retried)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_behind_nginx_lose_nothing_when_one_dies() {
    // Arrange: one Redis, three instances, nginx in front.
    let redis = Redis::unix();
    let mut instances: Vec<Turnstore> = (0..3)
        .map(|_| {
            Turnstore::spawn(&[
                ("TURNSTORE_REDIS_URL", redis.url()),
                ("TURNSTORE_MAX_TURNS", "100000".into()),
            ])
        })
        .collect();
    let nginx = Nginx::balance(&instances.iter().map(Turnstore::listen).collect::<Vec<_>>());
    let deadline = Instant::now() + RUN_FOR;

    // Act: clients run; halfway through, one instance is killed.
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let session = format!("scale-{i}-{}", uuid::Uuid::new_v4().simple());
            let run = rag_client(nginx.base(), session.clone(), deadline);
            (session, tokio::spawn(run))
        })
        .collect();
    tokio::time::sleep(RUN_FOR / 2).await;
    instances[1].kill();
    let mut results: HashMap<String, Vec<String>> = HashMap::new();
    let mut retried = 0;
    for (session, task) in clients {
        let (answers, r) = task.await.unwrap();
        retried += r;
        results.insert(session, answers);
    }

    // Assert: every session holds seqs 1..n, each finalized answer once, in order.
    let mut total = 0;
    for (session, answers) in &results {
        let (turns, pending) = stored(&nginx.base(), session).await;
        let seqs: Vec<u64> = turns.iter().map(|(seq, _)| *seq).collect();
        let stored: Vec<&str> = turns.iter().map(|(_, a)| a.as_str()).collect();
        assert_eq!(
            seqs,
            (1..=answers.len() as u64).collect::<Vec<_>>(),
            "{session}"
        );
        assert_eq!(
            stored,
            answers.iter().map(String::as_str).collect::<Vec<_>>(),
            "{session}"
        );
        assert_eq!(pending, 0, "{session}");
        total += answers.len();
    }
    assert!(
        total >= CLIENTS * 3,
        "the run did too little: {total} turns"
    );
    eprintln!("{total} turns over {CLIENTS} sessions; {retried} requests retried after the kill");
}

/// What one writer saw: answers acknowledged (with when), and the statuses
/// of the requests that failed.
#[derive(Default)]
struct Writes {
    acknowledged: Vec<(String, String, Instant)>,
    failures: Vec<u16>,
}

async fn writer(base: String, session: String, deadline: Instant) -> Writes {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let mut w = Writes::default();
    let mut n = 0;
    while Instant::now() < deadline {
        n += 1;
        let start = http
            .post(format!("{base}/v1/turns"))
            .json(&json!({"session_id": session, "user_query": format!("q{n}")}))
            .send()
            .await
            .unwrap();
        if start.status() != 201 {
            w.failures.push(start.status().as_u16());
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        let turn: Value = start.json().await.unwrap();
        let answer = format!("{}-a{n}", uuid::Uuid::new_v4().simple());
        let fin = http
            .post(format!(
                "{base}/v1/sessions/{session}/turns/{}/finalize",
                turn["turn_id"].as_str().unwrap()
            ))
            .json(&json!({"final_answer": answer}))
            .send()
            .await
            .unwrap();
        if fin.status() == 200 {
            w.acknowledged
                .push((session.clone(), answer, Instant::now()));
        } else {
            w.failures.push(fin.status().as_u16());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    w
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_crash_under_load_loses_nothing_older_than_a_second() {
    // Arrange: Redis with AOF, fsync every second (as in docker-compose.yml).
    let mut redis = Redis::unix_with(&["--appendonly", "yes", "--appendfsync", "everysec"]);
    let ts = Turnstore::spawn(&[
        ("TURNSTORE_REDIS_URL", redis.url()),
        ("TURNSTORE_MAX_TURNS", "100000".into()),
    ]);
    let deadline = Instant::now() + Duration::from_secs(5);

    // Act: writers run; Redis is killed (no clean shutdown) and started again.
    let writers: Vec<_> = (0..6)
        .map(|i| {
            let session = format!("aof-{i}-{}", uuid::Uuid::new_v4().simple());
            tokio::spawn(writer(ts.base(), session, deadline))
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let crashed_at = Instant::now();
    redis.stop();
    tokio::time::sleep(Duration::from_millis(500)).await;
    redis.restart();
    let mut all = Writes::default();
    for w in writers {
        let w = w.await.unwrap();
        all.acknowledged.extend(w.acknowledged);
        all.failures.extend(w.failures);
    }

    // Assert: failures were 503s (or 404 for a pending turn the crash took);
    // every answer acknowledged over a second before the crash is there.
    assert!(!all.failures.is_empty(), "the outage was not seen");
    assert!(
        all.failures.iter().all(|s| *s == 503 || *s == 404),
        "{:?}",
        all.failures
    );
    let mut checked = 0;
    let mut kept: HashMap<String, Vec<String>> = HashMap::new();
    for (session, answer, at) in &all.acknowledged {
        if *at + Duration::from_secs(1) >= crashed_at {
            continue;
        }
        if !kept.contains_key(session) {
            let (turns, _) = stored(&ts.base(), session).await;
            kept.insert(session.clone(), turns.into_iter().map(|(_, a)| a).collect());
        }
        assert!(
            kept[session].contains(answer),
            "{answer} of {session}, acknowledged {:?} before the crash, is lost",
            crashed_at - *at
        );
        checked += 1;
    }
    assert!(checked > 50, "too few turns before the crash: {checked}");
    let after = all
        .acknowledged
        .iter()
        .filter(|(_, _, at)| *at > crashed_at)
        .count();
    assert!(after > 0, "no write succeeded after the restart");
    eprintln!(
        "{checked} turns acknowledged >1 s before the crash, all kept; {after} after the restart"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moving_a_busy_slot_loses_nothing() {
    // Arrange: a three-master cluster, turnstore on it, a busy session.
    let cluster = crate::harness::RedisCluster::start(3);
    let ts = Turnstore::spawn(&[
        ("TURNSTORE_REDIS_CLUSTER_NODES", cluster.urls().join(",")),
        // Keep every turn of this one busy session: none may be trimmed.
        ("TURNSTORE_MAX_TURNS", "100000".into()),
    ]);
    let session = format!("reshard-{}", uuid::Uuid::new_v4().simple());
    let slot = cluster.keyslot(&format!("turnstore:{{{session}}}:meta"));
    let from = cluster.owner(slot);
    let deadline = Instant::now() + Duration::from_secs(4);
    let writers: Vec<_> = (0..4)
        .map(|_| tokio::spawn(writer(ts.base(), session.clone(), deadline)))
        .collect();

    // Act: halfway, the session's slot moves to another master.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let to = (from + 1) % 3;
    cluster.migrate_slot(slot, to);
    let mut all = Writes::default();
    for w in writers {
        let w = w.await.unwrap();
        all.acknowledged.extend(w.acknowledged);
        all.failures.extend(w.failures);
    }

    // Assert: the slot moved; failures were 503s; every acknowledged answer
    // is in the history once, in seq order.
    assert_eq!(cluster.owner(slot), to);
    assert!(
        all.failures.iter().all(|s| *s == 503),
        "{:?}\n{}",
        all.failures,
        ts.log()
    );
    let (turns, _) = stored(&ts.base(), &session).await;
    let seqs: Vec<u64> = turns.iter().map(|(seq, _)| *seq).collect();
    let stored: Vec<String> = turns.into_iter().map(|(_, a)| a).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    for (_, answer, _) in &all.acknowledged {
        assert_eq!(
            stored.iter().filter(|a| *a == answer).count(),
            1,
            "{answer}"
        );
    }
    let after = all.acknowledged.len();
    assert!(after > 20, "too little traffic: {after}");
    eprintln!(
        "slot {slot} moved from node {from} to {to}; {} turns acknowledged, {} requests answered 503",
        all.acknowledged.len(),
        all.failures.len()
    );
}
