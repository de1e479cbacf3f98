//! The cost bounds of API.md v1.1, measured against a running turnstore and
//! its Redis (bench/limits runs it; see there). Each mode prints one line
//! per figure.
//!
//! - `reads <base> <redis> <turns>`: fills one session with `turns` turns
//!   of the largest question and answer the default limits allow (32 KiB,
//!   128 KiB), then reads it: with max_tokens=10, in another encoding,
//!   truncated, and four maximal reads at once; for each, the response
//!   time, bytes, the longest Redis command (SLOWLOG) and the worst PING a
//!   second client saw meanwhile.
//! - `replay <base> <redis>`: a session with 1,000 finalized and 63
//!   pending turns, each with an idempotency key (the service's limits
//!   must allow 1,063 turns and 63 pending); times replays.
//! - `pending <base> <redis>`: a session of 20 finalized turns and 63
//!   pending ones of the largest question (32 KiB): reads, summary writes
//!   and starts each look for the oldest pending turn (a summary may not
//!   cover it); times them, with the longest Redis command.
//! - `erase <base> <redis> <sessions>`: one user with that many sessions;
//!   times `DELETE /v1/users/{id}` until `complete`, and a full listing.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use turnstore::Settings;
use turnstore::domain::{IdempotencyKey, SessionId, TurnId, UserId};
use turnstore::metrics::Metrics;
use turnstore::store::{StartTurn, Store};
use turnstore::tokens::{AnswerTokens, Encoding, QueryTokens};
use turnstore::turn::{Finalization, NewPendingTurn, now_millis};

type Fail = Box<dyn std::error::Error>;

fn store(redis: &str) -> Arc<dyn Store> {
    let settings = Settings {
        redis_url: Some(redis.to_owned()),
        store_timeout: Duration::from_secs(30),
        max_turns: 100_000,
        max_pending_turns: 1024,
        ..Settings::default()
    };
    Arc::new(turnstore::app::redis_store(&settings, &Metrics::new()).expect("a Redis store"))
}

/// Starts (and unless `pending`, finalizes) one turn through the store.
async fn turn(
    store: &dyn Store,
    session: &SessionId,
    user: Option<&UserId>,
    texts: (&str, &str, &QueryTokens, &AnswerTokens),
    key: Option<&IdempotencyKey>,
    pending: bool,
) -> TurnId {
    let (query, answer, q, a) = texts;
    let id = TurnId::generate();
    let now = now_millis();
    store
        .start_turn(StartTurn {
            session_id: session,
            user_id: user,
            turn: NewPendingTurn {
                turn_id: &id,
                user_query: query,
                started_at: now,
                idempotency_key: key.map(IdempotencyKey::as_str),
                tokens: q,
                english: None,
            },
            idempotency: key.map(|k| (k, "bench")),
            history: None,
            new_session: user.is_some(),
            now,
        })
        .await
        .expect("start");
    if !pending {
        let end = Finalization {
            final_answer: answer.to_owned(),
            finalized_at: now,
            tokens: *a,
            english: None,
        };
        store
            .finalize_turn(session, id, &end)
            .await
            .expect("finalize");
    }
    id
}

/// Redis' longest command since the last reset, in ms, and its name (a
/// function's for FCALL), but SLOWLOG's own: the reset frees the log
/// before it, and is logged.
fn slowest_named(redis: &mut redis::Connection) -> (f64, String) {
    let text = |v: Option<&redis::Value>| match v {
        Some(redis::Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
        _ => String::new(),
    };
    let name = |args: Option<&redis::Value>| match args {
        Some(redis::Value::Array(args)) => {
            let command = text(args.first()).to_ascii_lowercase();
            match command.as_str() {
                // turnstore_<library hash>_<script>
                "fcall" => text(args.get(1))
                    .splitn(3, '_')
                    .nth(2)
                    .map_or(command.clone(), str::to_owned),
                _ => command,
            }
        }
        _ => String::new(),
    };
    redis::cmd("SLOWLOG")
        .arg("GET")
        .arg(100_000)
        .query::<Vec<redis::Value>>(redis)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|e| match e {
            redis::Value::Array(f) => match (f.get(2), name(f.get(3))) {
                (_, n) if n == "slowlog" => None,
                (Some(redis::Value::Int(us)), n) => Some((*us as f64 / 1000.0, n)),
                _ => None,
            },
            _ => None,
        })
        .fold((0.0, String::new()), |a, b| if b.0 > a.0 { b } else { a })
}

/// [`slowest_named`], as the report prints it: "2.64 (history)".
fn slowest(redis: &mut redis::Connection) -> String {
    let (ms, name) = slowest_named(redis);
    format!("{ms:.2}({name})")
}

fn reset_slowlog(redis: &mut redis::Connection) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("slowlog-log-slower-than")
        .arg(0)
        .query(redis)
        .unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("slowlog-max-len")
        .arg(100_000)
        .query(redis)
        .unwrap();
    let _: () = redis::cmd("SLOWLOG").arg("RESET").query(redis).unwrap();
}

/// PINGs Redis in a loop until stopped; returns the worst round trip in ms.
fn pinger(url: &str, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<f64> {
    let mut c = redis::Client::open(url).unwrap().get_connection().unwrap();
    std::thread::spawn(move || {
        let mut worst = Duration::ZERO;
        while !stop.load(Ordering::Relaxed) {
            let t = Instant::now();
            let _: String = redis::cmd("PING").query(&mut c).unwrap();
            worst = worst.max(t.elapsed());
            std::thread::sleep(Duration::from_millis(1));
        }
        worst.as_secs_f64() * 1000.0
    })
}

/// GETs /healthz and /readyz in turn until stopped; returns the worst
/// answer time in ms.
fn prober(base: &str, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<f64> {
    let (http, base) = (reqwest::Client::new(), base.to_owned());
    tokio::spawn(async move {
        let mut worst = Duration::ZERO;
        for probe in ["/healthz", "/readyz"].iter().cycle() {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let t = Instant::now();
            let res = http.get(format!("{base}{probe}")).send().await;
            assert!(res.is_ok_and(|r| r.status() == 200), "{probe} failed");
            worst = worst.max(t.elapsed());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        worst.as_secs_f64() * 1000.0
    })
}

async fn reads(base: &str, url: &str, turns: usize) -> Result<(), Fail> {
    let store = store(url);
    let session = SessionId::parse(format!("big-{}", uuid::Uuid::new_v4().simple()))?;
    let (query, answer) = ("q".repeat(32 * 1024), "a ".repeat(64 * 1024));
    let enc = Encoding::O200kBase;
    let (q, a) = (
        QueryTokens::count(enc, &query),
        AnswerTokens::count(enc, &answer),
    );
    let filled = Instant::now();
    let done = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let (store, session, done) = (store.clone(), session.clone(), done.clone());
            let (query, answer) = (query.clone(), answer.clone());
            tokio::spawn(async move {
                for _ in 0..(turns / 8 + usize::from(i < turns % 8)) {
                    turn(
                        &*store,
                        &session,
                        None,
                        (&query, &answer, &q, &a),
                        None,
                        false,
                    )
                    .await;
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await?;
    }
    println!(
        "# one session of {turns} turns of 32 KiB + 128 KiB ({} MB of text), written in {:.1} s",
        turns * (32 + 128) / 1024,
        filled.elapsed().as_secs_f64()
    );

    let http = reqwest::Client::new();
    let mut redis = redis::Client::open(url)?.get_connection()?;
    let read = |query: &'static str| {
        let req = http.get(format!("{base}/v1/sessions/{session}/history?{query}"));
        async move {
            let t = Instant::now();
            let res = req.send().await.expect("a response");
            let status = res.status().as_u16();
            let body = res.bytes().await.expect("a body");
            let v: Value = serde_json::from_slice(&body).unwrap_or_default();
            (t.elapsed().as_secs_f64() * 1000.0, status, body.len(), v)
        }
    };
    let cases: [(&str, &'static str); 7] = [
        ("max_tokens=10", "limit=10000&max_tokens=10"),
        (
            "max_tokens=10, cl100k_base",
            "limit=10000&max_tokens=10&encoding=cl100k_base",
        ),
        (
            "every turn truncated to 5 chars",
            "limit=10000&max_tokens=10000000&max_query_chars=5&max_answer_chars=5&format=turns",
        ),
        ("maximal (4 MiB cap)", "limit=10000&max_tokens=10000000"),
        // Loaded tokenizers (bench/limits loads them): SentencePiece
        // (Llama 2) and byte-level (Mistral Nemo); each part is counted
        // once, then kept.
        (
            "maximal, llama2 (parts)",
            "limit=10000&max_tokens=1000000&encoding=llama2",
        ),
        (
            "maximal, mistral_nemo",
            "limit=10000&max_tokens=1000000&encoding=mistral_nemo",
        ),
        // The prompt through Llama 3's chat template, returned.
        (
            "maximal, llama3 chat template",
            "limit=10000&max_tokens=1000000&encoding=llama3&chat_template=true&prompt=true",
        ),
    ];
    for (name, query) in cases {
        reset_slowlog(&mut redis);
        let stop = Arc::new(AtomicBool::new(false));
        let ping = pinger(url, stop.clone());
        let (ms, status, bytes, v) = read(query).await;
        stop.store(true, Ordering::Relaxed);
        let worst_ping = ping.join().unwrap_or(f64::NAN);
        println!(
            "read {name:32} status={status} time_ms={ms:.1} bytes={bytes} turns={} stopped_by={} redis_slowest_ms={} ping_worst_ms={worst_ping:.2}",
            v["included_turns"],
            v["stopped_by"],
            slowest(&mut redis)
        );
    }
    // Four at once, stored counts applying or not (another encoding: each
    // read tokenizes its 4 MiB), with the probes answering meanwhile.
    for (name, query) in [
        ("4 maximal at once", "limit=10000&max_tokens=10000000"),
        (
            "4 maximal at once, cl100k_base",
            "limit=10000&max_tokens=10000000&encoding=cl100k_base",
        ),
        (
            "4 maximal at once, mistral_nemo",
            "limit=10000&max_tokens=1000000&encoding=mistral_nemo",
        ),
        (
            "4 maximal at once, qwen2_5 chat",
            "limit=10000&max_tokens=1000000&encoding=qwen2_5&chat_template=true",
        ),
    ] {
        reset_slowlog(&mut redis);
        let stop = Arc::new(AtomicBool::new(false));
        let ping = pinger(url, stop.clone());
        let probe = prober(base, stop.clone());
        let t = Instant::now();
        let four = futures_util::future::join_all((0..4).map(|_| read(query))).await;
        stop.store(true, Ordering::Relaxed);
        let worst = four.iter().map(|r| r.0).fold(0.0, f64::max);
        println!(
            "read {name:32} all_in_ms={:.1} slowest_ms={worst:.1} statuses={:?} redis_slowest_ms={} ping_worst_ms={:.2} probe_worst_ms={:.2}",
            t.elapsed().as_secs_f64() * 1000.0,
            four.iter().map(|r| r.1).collect::<Vec<_>>(),
            slowest(&mut redis),
            ping.join().unwrap_or(f64::NAN),
            probe.await.unwrap_or(f64::NAN)
        );
    }
    // A fork of the whole session: copied a megabyte a call, then made the
    // new session at once; retried with its key past the request timeout.
    reset_slowlog(&mut redis);
    let stop = Arc::new(AtomicBool::new(false));
    let ping = pinger(url, stop.clone());
    let probe = prober(base, stop.clone());
    let fork = format!("{session}-fork");
    let t = Instant::now();
    let mut tries = 0;
    let (status, made) = loop {
        tries += 1;
        let res = http
            .post(format!("{base}/v1/sessions/{session}/fork"))
            .header("idempotency-key", "bench-fork")
            .json(&json!({"new_session_id": fork}))
            .send()
            .await?;
        let status = res.status().as_u16();
        if (status != 503 && status != 409) || tries >= 20 {
            break (status, res.json::<Value>().await.unwrap_or_default());
        }
    };
    stop.store(true, Ordering::Relaxed);
    println!(
        "fork of the session               status={status} time_ms={:.1} tries={tries} copied_turns={} redis_slowest_ms={} ping_worst_ms={:.2} probe_worst_ms={:.2}",
        t.elapsed().as_secs_f64() * 1000.0,
        made["copied_turns"],
        slowest(&mut redis),
        ping.join().unwrap_or(f64::NAN),
        probe.await.unwrap_or(f64::NAN)
    );
    http.delete(format!("{base}/v1/sessions/{fork}"))
        .send()
        .await?;
    Ok(())
}

async fn replay(base: &str, url: &str) -> Result<(), Fail> {
    // Over HTTP, so that each key holds the hash of the very body replayed.
    let session = format!("keys-{}", uuid::Uuid::new_v4().simple());
    let query = "What changed?";
    let http = reqwest::Client::new();
    let body = json!({"session_id": session, "user_query": query});
    for i in 0..1063 {
        let started: Value = http
            .post(format!("{base}/v1/turns"))
            .header("idempotency-key", format!("key-{i}"))
            .json(&body)
            .send()
            .await?
            .json()
            .await?;
        if i < 1000 {
            let turn = started["turn_id"].as_str().ok_or("no turn id")?;
            http.post(format!(
                "{base}/v1/sessions/{session}/turns/{turn}/finalize"
            ))
            .json(&json!({"final_answer": "Nothing much."}))
            .send()
            .await?
            .error_for_status()?;
        }
    }
    let mut redis = redis::Client::open(url)?.get_connection()?;
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query(&mut redis)?;
    let (n, mut worst) = (500, 0.0f64);
    let t = Instant::now();
    for i in 0..n {
        // Alternately a finalized turn's key and a pending one's.
        let key = if i % 2 == 0 {
            format!("key-{}", i % 1000)
        } else {
            format!("key-{}", 1000 + i % 63)
        };
        let started = Instant::now();
        let res = http
            .post(format!("{base}/v1/turns"))
            .header("idempotency-key", &key)
            .json(&body)
            .send()
            .await?;
        assert_eq!(res.status().as_u16(), 200, "a replay");
        worst = worst.max(started.elapsed().as_secs_f64() * 1000.0);
    }
    let stats: String = redis::cmd("INFO").arg("commandstats").query(&mut redis)?;
    // Scripts run as functions (FCALL), or by EVALSHA where Redis has none.
    let scripts = stats
        .lines()
        .filter(|l| l.starts_with("cmdstat_fcall:") || l.starts_with("cmdstat_evalsha:"))
        .collect::<Vec<_>>()
        .join(" ");
    println!(
        "replay on a session of 1,000 finalized + 63 pending keyed turns: {n} replays, mean_ms={:.2} worst_ms={worst:.2}; redis {scripts}",
        t.elapsed().as_secs_f64() * 1000.0 / f64::from(n)
    );
    Ok(())
}

async fn pending(base: &str, url: &str) -> Result<(), Fail> {
    let session = format!("pending-{}", uuid::Uuid::new_v4().simple());
    let http = reqwest::Client::new();
    let start = |query: String| {
        http.post(format!("{base}/v1/turns"))
            .json(&json!({"session_id": session, "user_query": query,
                          "history": {"summary": true, "limit": 1}}))
            .send()
    };
    for i in 0..20 {
        let started: Value = start(format!("question {i}")).await?.json().await?;
        let turn = started["turn_id"].as_str().ok_or("no turn id")?;
        http.post(format!(
            "{base}/v1/sessions/{session}/turns/{turn}/finalize"
        ))
        .json(&json!({"final_answer": "an answer"}))
        .send()
        .await?
        .error_for_status()?;
    }
    let largest = "x ".repeat(16 * 1024);
    for _ in 0..63 {
        start(largest.clone()).await?.error_for_status()?;
    }
    let mut redis = redis::Client::open(url)?.get_connection()?;
    reset_slowlog(&mut redis);
    let (n, mut worst) = (200, 0.0f64);
    let t = Instant::now();
    for i in 0..n {
        let started = Instant::now();
        let res = if i % 2 == 0 {
            http.get(format!(
                "{base}/v1/sessions/{session}/history?summary=true&limit=1"
            ))
            .send()
            .await?
        } else {
            http.put(format!("{base}/v1/sessions/{session}/summary"))
                .json(&json!({"summary": "so far", "through_seq": (1 + i / 2).min(20)}))
                .send()
                .await?
        };
        res.error_for_status()?;
        worst = worst.max(started.elapsed().as_secs_f64() * 1000.0);
    }
    println!(
        "reads and summary writes beside 63 pending turns of 32 KiB: {n}, mean_ms={:.2} worst_ms={worst:.2} longest_redis_ms={}",
        t.elapsed().as_secs_f64() * 1000.0 / f64::from(n),
        slowest(&mut redis)
    );
    reset_slowlog(&mut redis);
    let started = Instant::now();
    let res = start("one more".into()).await?;
    println!(
        "the 64th pending start, with its history: status={} ms={:.2} longest_redis_ms={}",
        res.status().as_u16(),
        started.elapsed().as_secs_f64() * 1000.0,
        slowest(&mut redis)
    );
    Ok(())
}

async fn erase(base: &str, url: &str, sessions: usize) -> Result<(), Fail> {
    let store = store(url);
    let user = UserId::parse(format!("big-user-{}", uuid::Uuid::new_v4().simple()))?;
    let enc = Encoding::O200kBase;
    let (q, a) = (QueryTokens::count(enc, "q"), AnswerTokens::count(enc, "a"));
    let t = Instant::now();
    let tasks: Vec<_> = (0..32)
        .map(|i| {
            let (store, user) = (store.clone(), user.clone());
            tokio::spawn(async move {
                for j in (i..sessions).step_by(32) {
                    let s = SessionId::parse(format!("{}-{j}", user.as_str())).unwrap();
                    turn(&*store, &s, Some(&user), ("q", "a", &q, &a), None, true).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await?;
    }
    println!(
        "# {sessions} sessions of one user written in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let http = reqwest::Client::new();
    let t = Instant::now();
    let (mut listed, mut pages, mut cursor) = (0, 0, None::<String>);
    loop {
        let mut url = format!("{base}/v1/users/{user}/sessions?limit=1000");
        if let Some(c) = &cursor {
            url.push_str(&format!("&cursor={c}"));
        }
        let page: Value = http.get(url).send().await?.json().await?;
        listed += page["sessions"].as_array().map_or(0, Vec::len);
        pages += 1;
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
    }
    let list_s = t.elapsed().as_secs_f64();
    println!(
        "list {listed} sessions in {pages} pages of 1,000: {list_s:.2} s ({:.0} ms per page)",
        list_s * 1000.0 / f64::from(pages)
    );
    let t = Instant::now();
    let (mut deleted, mut calls) = (0, Vec::new());
    loop {
        let call = Instant::now();
        let res = http
            .delete(format!("{base}/v1/users/{user}"))
            .send()
            .await?;
        let status = res.status().as_u16();
        let v: Value = res.json().await?;
        calls.push(format!("{:.2}s", call.elapsed().as_secs_f64()));
        deleted += v["deleted_sessions"].as_u64().unwrap_or(0);
        if status != 200 || v["complete"] == true || calls.len() > 100 {
            break;
        }
    }
    let secs = t.elapsed().as_secs_f64();
    println!(
        "erase {deleted} sessions: {secs:.2} s in {} call(s) [{}], {:.0} ms per 10,000 sessions",
        calls.len(),
        calls.join(" "),
        secs * 1000.0 * 10_000.0 / deleted.max(1) as f64
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Fail> {
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize| args.get(i).map(String::as_str).unwrap_or("");
    match (arg(1), arg(2), arg(3)) {
        ("reads", base, url) => reads(base, url, arg(4).parse().unwrap_or(1000)).await,
        ("replay", base, url) => replay(base, url).await,
        ("pending", base, url) => pending(base, url).await,
        ("erase", base, url) => erase(base, url, arg(4).parse().unwrap_or(100_000)).await,
        _ => {
            eprintln!(
                "usage: limits reads|replay|pending|erase <turnstore base url> <redis url> [count]"
            );
            std::process::exit(2);
        }
    }
}
