//! The HTTP edge of the real binary under heavy, slow and idle clients:
//! reads that count millions of tokens, connections that send nothing or
//! one byte at a time, and more of them than the service will keep.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::client;
use crate::harness::{Redis, Turnstore};

/// A session of `n` maximal turns (answers of 128 KiB).
async fn fill_maximal(http: &reqwest::Client, base: &str, session: &str, n: usize) {
    // 128 KiB of 20-letter words of random letters (a fixed sequence).
    let mut seed = 7u64;
    let answer: String = (0..128 * 1024 / 21)
        .flat_map(|_| {
            let word: Vec<char> = (0..20)
                .map(|_| {
                    seed = seed
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1_442_695_040_888_963_407);
                    char::from(b'a' + ((seed >> 33) % 26) as u8)
                })
                .collect();
            word.into_iter().chain([' '])
        })
        .collect();
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
/// encoding; `TURNSTORE_MAX_HISTORY_BYTES` raised to let them), most of a
/// second of CPU each, run on a service with two workers. (The answers are
/// words of random letters, which count about 3.5 times slower than
/// English: English text of this size took seconds with tiktoken-rs, and
/// now ends before the timeout.) They must not hold the
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

/// Eight finalizes whose answers take the tokenizer longest (128 KiB, one
/// whitespace run: about 100 ms each) at once, on two workers: a probe
/// sent meanwhile is answered before the first of them ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_texts_are_counted_off_the_workers() {
    long_texts_leave_probes_answering("2").await;
}

/// More serving threads than cores are lowered to one per core (each
/// would only wait its turn on the cores), with a log line; the service
/// serves as usual.
#[tokio::test]
async fn serving_threads_are_at_most_one_per_core() {
    let cores = std::thread::available_parallelism().unwrap().get();
    let ts = Turnstore::spawn(&[("TURNSTORE_WORKER_THREADS", (cores + 7).to_string())]);
    let res = client()
        .get(format!("{}/healthz", ts.base()))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let log = ts.log();
    assert!(
        log.contains("TURNSTORE_WORKER_THREADS lowered to one thread per core"),
        "{log}"
    );
    assert!(log.contains(&format!("threads={cores}")), "{log}");
}

/// The same on one thread, which the service runs as a current-thread
/// runtime: the counts go to the blocking pool there too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_thread_counts_long_texts_off_its_runtime() {
    long_texts_leave_probes_answering("1").await;
}

async fn long_texts_leave_probes_answering(workers: &str) {
    // Arrange
    let ts = Turnstore::spawn(&[("TURNSTORE_WORKER_THREADS", workers.to_string())]);
    let (http, base) = (client(), ts.base());
    let answer = format!("a{}\n", " ".repeat(131_000));
    let mut turns = vec![];
    for i in 0..8 {
        let res = http
            .post(format!("{base}/v1/turns"))
            .json(&json!({"session_id": format!("long-{i}"), "user_query": "q"}))
            .send()
            .await
            .unwrap();
        let t: Value = res.json().await.unwrap();
        turns.push((
            format!("long-{i}"),
            t["turn_id"].as_str().unwrap().to_owned(),
        ));
    }

    // Act
    let finalizes: Vec<_> = turns
        .into_iter()
        .map(|(session, turn)| {
            let (http, base, answer) = (http.clone(), base.clone(), answer.clone());
            tokio::spawn(async move {
                let res = http
                    .post(format!(
                        "{base}/v1/sessions/{session}/turns/{turn}/finalize"
                    ))
                    .json(&json!({ "final_answer": answer }))
                    .send()
                    .await
                    .unwrap();
                (res.status().as_u16(), Instant::now())
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let probe = http.get(format!("{base}/healthz")).send().await.unwrap();
    let probed = Instant::now();

    // Assert
    assert_eq!(probe.status(), 200);
    let mut ends = vec![];
    for f in finalizes {
        let (status, end) = f.await.unwrap();
        assert_eq!(status, 200, "{}", ts.log());
        ends.push(end);
    }
    assert!(
        probed < ends.into_iter().min().unwrap(),
        "the probe waited for a finalize"
    );
}

/// Reads until the server closes the connection; `false` if it is still
/// open after `within`.
async fn closed_within(tcp: &mut tokio::net::TcpStream, within: Duration) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 4096];
    let read_all = async {
        loop {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(within, read_all).await.is_ok()
}

/// Whether the server has closed the connection (without waiting).
fn is_open(tcp: &tokio::net::TcpStream) -> bool {
    let mut buf = [0u8; 1];
    matches!(tcp.try_read(&mut buf), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

/// A head sent a line at a time, a connection that sends nothing, and an
/// idle keep-alive connection: the first two are closed at the header
/// timeout, the last one at the idle timeout (and not before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_heads_silent_and_idle_connections_are_closed() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;
    // Arrange
    let ts = Turnstore::spawn(&[
        ("TURNSTORE_HEADER_TIMEOUT", "1s".into()),
        ("TURNSTORE_IDLE_TIMEOUT", "3s".into()),
    ]);
    let mut slow = TcpStream::connect(ts.listen()).await.unwrap();
    let mut silent = TcpStream::connect(ts.listen()).await.unwrap();
    let mut idle = TcpStream::connect(ts.listen()).await.unwrap();

    // Act: the slow client sends a header line every 250 ms, for 10 s.
    let writer = tokio::spawn(async move {
        let (mut read, mut write) = slow.split();
        let _ = write
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\n")
            .await;
        let sending = async {
            for i in 0..40 {
                tokio::time::sleep(Duration::from_millis(250)).await;
                let line = format!("X-Slow-{i}: 1\r\n");
                if write.write_all(line.as_bytes()).await.is_err() {
                    return;
                }
            }
        };
        let mut buf = [0u8; 64];
        tokio::select! {
            () = sending => false,
            _ = read.read(&mut buf) => true,
        }
    });
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 1024];
    let n = idle.read(&mut buf).await.unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));

    // Assert
    assert!(
        closed_within(&mut silent, Duration::from_secs(5)).await,
        "a silent connection is still open"
    );
    assert!(
        writer.await.unwrap(),
        "a head sent a line at a time was still read after 10 s"
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        is_open(&idle),
        "an idle connection was closed at the header timeout"
    );
    assert!(
        closed_within(&mut idle, Duration::from_secs(8)).await,
        "an idle connection is still open"
    );
    let metrics = ts.metrics().await;
    for reason in ["header_timeout", "idle_timeout"] {
        let line = format!("turnstore_connections_closed_total{{reason=\"{reason}\"}}");
        assert!(metrics.contains(&line), "{line} missing:\n{metrics}");
    }
}

/// 200 connections that send nothing, held by a client, against a
/// service allowed 128 open files: real requests on new connections are
/// still answered (the oldest silent connections make way).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_piling_up_do_not_lock_out_requests() {
    // Arrange: timeouts long enough that only the cap can make room.
    let ts = Turnstore::spawn_with_file_limit(
        &[
            ("TURNSTORE_HEADER_TIMEOUT", "60s".into()),
            ("TURNSTORE_IDLE_TIMEOUT", "60s".into()),
        ],
        Some(128),
    );
    let mut silent = vec![];
    for _ in 0..200 {
        silent.push(tokio::net::TcpStream::connect(ts.listen()).await.unwrap());
    }

    // Act
    let mut statuses = vec![];
    for i in 0..5 {
        statuses.push(start_on_a_new_connection(&ts, &format!("busy-{i}")).await);
    }

    // Assert
    assert!(
        statuses.iter().all(|s| s == &Ok(201)),
        "{statuses:?}\n{}",
        ts.log()
    );
    let still_open = silent.iter().filter(|t| is_open(t)).count();
    assert!(still_open <= 64, "{still_open} silent connections kept");
}

/// A start on a connection of its own: its status, or why it got none.
async fn start_on_a_new_connection(ts: &Turnstore, session: &str) -> Result<u16, String> {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    http.post(format!("{}/v1/turns", ts.base()))
        .json(&json!({"session_id": session, "user_query": "q"}))
        .send()
        .await
        .map(|r| r.status().as_u16())
        .map_err(|e| e.to_string())
}

/// `TURNSTORE_MAX_CONNECTIONS` below the file limit: 40 clients sending a
/// head a line at a time, never finishing it, pile up past a cap of 16.
/// Real requests on new connections are still answered (the slow heads,
/// which never sent a whole request, make way), and no more connections
/// than the cap stay open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connection_cap_makes_slow_heads_piling_up_give_way() {
    use tokio::io::AsyncWriteExt;
    // Arrange: timeouts long enough that only the cap can make room.
    let ts = Turnstore::spawn(&[
        ("TURNSTORE_MAX_CONNECTIONS", "16".into()),
        ("TURNSTORE_HEADER_TIMEOUT", "60s".into()),
        ("TURNSTORE_IDLE_TIMEOUT", "60s".into()),
    ]);
    let mut slow = vec![];
    for _ in 0..40 {
        let mut tcp = tokio::net::TcpStream::connect(ts.listen()).await.unwrap();
        let _ = tcp.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\n").await;
        slow.push(tcp);
    }

    // Act: the slow heads go on, a line each every 100 ms, while five real
    // requests come on connections of their own.
    let mut statuses = vec![];
    for i in 0..5 {
        for (n, tcp) in slow.iter_mut().enumerate() {
            let _ = tcp
                .write_all(format!("X-Slow-{i}-{n}: 1\r\n").as_bytes())
                .await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        statuses.push(start_on_a_new_connection(&ts, &format!("capped-{i}")).await);
    }

    // Assert
    assert!(
        statuses.iter().all(|s| s == &Ok(201)),
        "{statuses:?}\n{}",
        ts.log()
    );
    let still_open = slow.iter().filter(|t| is_open(t)).count();
    assert!(
        still_open < 16,
        "{still_open} slow heads kept past a cap of 16"
    );
}

/// Imports whose texts take the tokenizer seconds (answers of one long
/// whitespace run), cut by a short request timeout: once they have
/// answered 503, the service stops counting them (within a slice) instead
/// of burning CPU for texts nobody will store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn imports_stop_counting_at_the_request_timeout() {
    // Arrange
    let ts = Turnstore::spawn(&[
        ("TURNSTORE_REQUEST_TIMEOUT", "300ms".to_string()),
        ("TURNSTORE_MAX_BODY_BYTES", (8 << 20).to_string()),
    ]);
    let (http, base) = (client(), ts.base());
    let answer = format!("a{}\n", " ".repeat(131_000));
    let messages: Vec<Value> = (0..20)
        .flat_map(|_| {
            [
                json!({"role": "user", "content": "q"}),
                json!({"role": "assistant", "content": answer}),
            ]
        })
        .collect();
    let body = json!({ "messages": messages });

    // Act: four at once, each seconds of counting.
    let imports: Vec<_> = (0..4)
        .map(|i| {
            let (http, base, body) = (http.clone(), base.clone(), body.clone());
            tokio::spawn(async move {
                let res = http
                    .post(format!("{base}/v1/sessions/import-{i}/import"))
                    .json(&body)
                    .send()
                    .await
                    .unwrap();
                let status = res.status().as_u16();
                let body: Value = res.json().await.unwrap();
                (status, body["code"].clone())
            })
        })
        .collect();
    for i in imports {
        assert_eq!(
            i.await.unwrap(),
            (503, json!("request_timeout")),
            "{}",
            ts.log()
        );
    }
    // The slices under way end (each a fraction of a second of CPU);
    // then the process is idle. CPU time, not wall time, so that a busy
    // machine does not change the figure: counted from the 503s until two
    // quarter-seconds in a row pass idle.
    let (mut spent, mut idle, mut windows) = (0.0, 0, vec![]);
    while idle < 2 && windows.len() < 80 {
        let before = ts.cpu_seconds();
        tokio::time::sleep(Duration::from_millis(250)).await;
        let window = ts.cpu_seconds() - before;
        windows.push(window);
        spent += window;
        idle = if window < 0.02 { idle + 1 } else { 0 };
    }

    // Assert: four slices at most (one an import), not the rest of the
    // counting (about 2 s of CPU an import).
    assert!(idle == 2, "the process never went idle ({windows:?})");
    assert!(
        spent < 2.0,
        "{spent:.2} s of CPU after the imports ended ({windows:?})"
    );
    for i in 0..4 {
        let res = http
            .get(format!("{base}/v1/sessions/import-{i}"))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 404, "a timed-out import wrote nothing");
    }
}
