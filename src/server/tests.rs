use super::*;

#[test]
fn the_cap_leaves_room_for_other_files() {
    assert_eq!(connection_cap(10_000, Some(1_048_576)), 10_000);
    assert_eq!(connection_cap(10_000, Some(128)), 64);
    assert_eq!(connection_cap(10_000, Some(10)), 1);
    assert_eq!(connection_cap(500, None), 500);
}

#[test]
fn deadlines_follow_what_the_connection_does() {
    let limits = ConnLimits {
        header_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(60),
        write_timeout: Duration::from_secs(30),
        max_connections: 1,
    };
    let a = Activity::new();
    assert_eq!(a.deadline(&limits), Some((10_000, "header_timeout")));
    a.request_started();
    assert_eq!(a.deadline(&limits), None);
    a.read_some(); // a body, not a head
    a.request_done();
    let idle = a.idle_since.load(Ordering::Relaxed);
    assert_eq!(a.deadline(&limits), Some((idle + 60_000, "idle_timeout")));
    a.read_some();
    let (at, why) = a.deadline(&limits).unwrap();
    assert_eq!(why, "header_timeout");
    assert!(at >= idle + 10_000 && at < idle + 60_000);
    // A write the client does not take: due at the write timeout, in
    // flight or not; taking bytes again lifts it.
    a.request_started();
    a.wrote(false);
    let stalled = a.stalled_since.load(Ordering::Relaxed) - 1;
    assert_eq!(
        a.deadline(&limits),
        Some((stalled + 30_000, "write_timeout"))
    );
    a.wrote(false);
    assert_eq!(
        a.deadline(&limits),
        Some((stalled + 30_000, "write_timeout"))
    );
    a.wrote(true);
    assert_eq!(a.deadline(&limits), None);
}

/// A response still streaming is a request in flight: a body whose
/// chunks come every 300 ms for 2 s gets through a 500 ms idle
/// timeout whole (it was cut at the first idle check once its head
/// was sent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_response_is_not_idle() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let slow = || async {
        let chunks = futures_util::stream::unfold(0u32, |i| async move {
            if i == 7 {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
            Some((Ok::<_, std::io::Error>(format!("chunk {i}\n")), i + 1))
        });
        axum::body::Body::from_stream(chunks)
    };
    let router = Router::new().route("/slow", axum::routing::get(slow));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // A short header timeout: the watchdog sleeps towards the first
    // deadline it sees (the head's, before the request) before it looks
    // again, and the idle close below is checked within seconds.
    let limits = ConnLimits {
        header_timeout: Duration::from_secs(1),
        idle_timeout: Duration::from_millis(500),
        write_timeout: Duration::from_secs(30),
        max_connections: 8,
    };
    let metrics = Arc::new(Metrics::new());
    tokio::spawn(serve(
        listener,
        router,
        limits,
        metrics,
        Vec::new(),
        std::future::pending(),
    ));

    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(b"GET /slow HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut body = Vec::new();
    let mut buf = [0u8; 1024];
    let began = Instant::now();
    while !body.ends_with(b"\r\n0\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(5), tcp.read(&mut buf))
            .await
            .expect("the server answers")
            .unwrap();
        if n == 0 {
            break;
        }
        body.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&body);
    for i in 0..7 {
        assert!(text.contains(&format!("chunk {i}\n")), "{text}");
    }
    // The chunked body's end: the response came whole.
    assert!(text.ends_with("\r\n0\r\n\r\n"), "{text}");
    assert!(began.elapsed() > Duration::from_secs(2));
    // Then the connection is idle, and closed at the idle timeout.
    let n = tokio::time::timeout(Duration::from_secs(3), tcp.read(&mut buf))
        .await
        .expect("closed once idle");
    assert_eq!(n.unwrap_or(0), 0);
}

/// Connections are handed to the serving threads in turn, and each is
/// served whole on its thread; a server stopping waits for those too.
#[test]
fn connections_are_served_on_each_thread_in_turn() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let threads::Threads { main, handles } = threads::Threads::start(3).unwrap();
    assert_eq!(threads::place(), Some((0, 3)));
    main.block_on(async move {
        let router = Router::new().route(
            "/where",
            axum::routing::get(|| async {
                let (i, n) = threads::place().expect("on a serving thread");
                format!("{i}/{n}")
            }),
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let limits = ConnLimits {
            header_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(5),
            write_timeout: Duration::from_secs(5),
            max_connections: 8,
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(
            listener,
            router,
            limits,
            Arc::new(Metrics::new()),
            handles,
            async move {
                let _ = stopped.await;
            },
        ));
        let mut seen = Vec::new();
        let mut conns = Vec::new();
        for _ in 0..6 {
            let mut tcp = TcpStream::connect(addr).await.unwrap();
            // Twice on one connection: the same thread both times.
            let mut answers = Vec::new();
            for _ in 0..2 {
                tcp.write_all(b"GET /where HTTP/1.1\r\nhost: x\r\n\r\n")
                    .await
                    .unwrap();
                let mut buf = [0u8; 1024];
                let n = tcp.read(&mut buf).await.unwrap();
                let text = String::from_utf8_lossy(&buf[..n]).to_string();
                answers.push(text.rsplit("\r\n").next().unwrap().to_owned());
            }
            assert_eq!(answers[0], answers[1]);
            seen.push(answers[0].clone());
            conns.push(tcp);
        }
        assert_eq!(seen, ["1/3", "2/3", "0/3", "1/3", "2/3", "0/3"]);
        let _ = stop.send(());
        drop(conns);
        tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .expect("the server stops once its connections close")
            .unwrap();
    });
}
