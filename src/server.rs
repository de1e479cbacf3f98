//! The accept loop. Each connection is served by hyper (HTTP/1.1, and
//! HTTP/2 with prior knowledge) and watched:
//!
//! - **header timeout**: a request's head must arrive within it, counted
//!   from its first byte, or from the connection's start for the first
//!   request (a client that connects and sends nothing, or one header line
//!   a second, is closed);
//! - **idle timeout**: a keep-alive connection with no request in flight
//!   is closed once it has been idle that long (a response whose body is
//!   still being written, a streaming export, counts as in flight);
//! - **write timeout**: a connection whose client accepts no byte of a
//!   response for that long is closed, in flight or not (a reader that
//!   stalls an export frees it);
//! - **connection cap**: at most `max_connections` are kept open (never
//!   more than the process' file limit allows, less a reserve for Redis and
//!   files). One more closes the connection idle the longest, preferring
//!   one that never sent a whole request; with none idle, the new one is
//!   closed at once. Real requests keep being served when slow or idle
//!   clients pile up.
//!
//! Accept errors (out of file descriptors, say) close an idle connection
//! and pause the loop briefly instead of spinning.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::HttpBody;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, watch};
use tower::ServiceExt;

use crate::metrics::Metrics;

/// Files the process keeps for other uses than client connections: Redis
/// connections, the listener, logs, the API keys file.
pub const FILE_RESERVE: u64 = 64;

#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
    pub write_timeout: Duration,
    pub max_connections: usize,
}

/// Serves `router` on `listener` until `shutdown` completes; then stops
/// accepting, lets each connection finish its requests in flight, and
/// returns once all are closed.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnLimits,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let open = Arc::new(Open::default());
    let (stopping_tx, stopping) = watch::channel(false);
    // No timer for hyper: its own header timeout would also cut idle
    // keep-alive connections short, and arm a timer for every request.
    let builder = Arc::new(auto::Builder::new(TokioExecutor::new()));
    let mut last_accept_error: Option<Instant> = None;
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let tcp = match accepted {
            Ok((tcp, _)) => tcp,
            Err(e) if is_connection_error(&e) => continue,
            Err(e) => {
                // Out of file descriptors, most likely: make room, and
                // give closing connections a moment.
                if last_accept_error.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                    tracing::warn!(error = %e, open = open.len(), "accepting a connection failed: closing an idle one");
                    last_accept_error = Some(Instant::now());
                }
                open.evict_idle(&metrics);
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        // Responses go out as soon as they are written, not held back by
        // Nagle's algorithm waiting for the previous segment's ACK.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "could not set TCP_NODELAY");
        }
        if open.len() >= limits.max_connections && !open.evict_idle(&metrics) {
            metrics.connection_closed("refused");
            drop(tcp);
            continue;
        }
        let conn = open.add();
        metrics.connection_opened();
        let task = Connection {
            conn,
            open: open.clone(),
            router: router.clone(),
            builder: builder.clone(),
            limits,
            metrics: metrics.clone(),
            stopping: stopping.clone(),
        };
        tokio::spawn(task.run(tcp));
    }
    drop(listener);
    let _ = stopping_tx.send(true);
    open.wait_empty().await;
}

fn is_connection_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset
    )
}

/// The open connections, oldest first.
#[derive(Default)]
struct Open {
    conns: Mutex<BTreeMap<u64, Arc<Conn>>>,
    next_id: AtomicU64,
    emptied: Notify,
}

impl Open {
    fn len(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Arc<Conn>>> {
        self.conns.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn add(&self) -> Arc<Conn> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn {
            id,
            activity: Activity::new(),
            evicted: Notify::new(),
        });
        self.lock().insert(id, conn.clone());
        conn
    }

    fn remove(&self, id: u64) {
        let mut conns = self.lock();
        conns.remove(&id);
        if conns.is_empty() {
            self.emptied.notify_waiters();
        }
    }

    /// Closes the connection idle the longest, preferring one that never
    /// sent a whole request; `false` if none is idle.
    fn evict_idle(&self, metrics: &Metrics) -> bool {
        let mut conns = self.lock();
        let mut victim: Option<(bool, u64, u64)> = None; // (sent a request, idle since, id)
        for (id, c) in conns.iter() {
            let a = &c.activity;
            if a.in_flight.load(Ordering::Acquire) > 0 {
                continue;
            }
            let key = (
                a.requests.load(Ordering::Relaxed) > 0,
                a.idle_since.load(Ordering::Relaxed),
                *id,
            );
            if victim.is_none_or(|v| key < v) {
                victim = Some(key);
            }
            if !key.0 {
                break; // the oldest that never sent a request
            }
        }
        let Some((_, _, id)) = victim else {
            return false;
        };
        if let Some(c) = conns.remove(&id) {
            c.evicted.notify_one();
            metrics.connection_closed("evicted");
        }
        true
    }

    async fn wait_empty(&self) {
        loop {
            let emptied = self.emptied.notified();
            if self.len() == 0 {
                return;
            }
            emptied.await;
        }
    }
}

struct Conn {
    id: u64,
    activity: Arc<Activity>,
    evicted: Notify,
}

/// What a connection is doing, as its reads and its requests tell.
/// Times are milliseconds since `base`.
struct Activity {
    base: Instant,
    in_flight: AtomicU32,
    /// Requests handed to the service so far.
    requests: AtomicU64,
    /// Since when no request is in flight (the connection's start first).
    idle_since: AtomicU64,
    /// When the first byte of the next request's head came, plus one; 0
    /// while none has.
    head_since: AtomicU64,
    /// Since when a write waits for the client to take bytes, plus one; 0
    /// while none does.
    stalled_since: AtomicU64,
}

impl Activity {
    fn new() -> Arc<Self> {
        Arc::new(Activity {
            base: Instant::now(),
            in_flight: AtomicU32::new(0),
            requests: AtomicU64::new(0),
            idle_since: AtomicU64::new(0),
            head_since: AtomicU64::new(0),
            stalled_since: AtomicU64::new(0),
        })
    }

    /// A write took bytes (`true`) or waits for the client (`false`).
    fn wrote(&self, progressed: bool) {
        if progressed {
            self.stalled_since.store(0, Ordering::Relaxed);
        } else if self.stalled_since.load(Ordering::Relaxed) == 0 {
            self.stalled_since.store(self.now() + 1, Ordering::Relaxed);
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn read_some(&self) {
        if self.in_flight.load(Ordering::Acquire) == 0
            && self.head_since.load(Ordering::Relaxed) == 0
        {
            self.head_since.store(self.now() + 1, Ordering::Relaxed);
        }
    }

    fn request_started(&self) {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.head_since.store(0, Ordering::Relaxed);
    }

    fn request_done(&self) {
        self.idle_since.store(self.now(), Ordering::Relaxed);
        self.head_since.store(0, Ordering::Relaxed);
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
    }

    /// When the connection is to be closed if nothing changes, and why;
    /// `None` while a request is in flight and its client takes what is
    /// written.
    fn deadline(&self, limits: &ConnLimits) -> Option<(u64, &'static str)> {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let stalled = self.stalled_since.load(Ordering::Relaxed);
        if stalled > 0 {
            return Some((
                (stalled - 1).saturating_add(ms(limits.write_timeout)),
                "write_timeout",
            ));
        }
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        let head = self.head_since.load(Ordering::Relaxed);
        let idle = self.idle_since.load(Ordering::Relaxed);
        Some(if head > 0 {
            (
                (head - 1).saturating_add(ms(limits.header_timeout)),
                "header_timeout",
            )
        } else if self.requests.load(Ordering::Relaxed) == 0 {
            (
                idle.saturating_add(ms(limits.header_timeout)),
                "header_timeout",
            )
        } else {
            (idle.saturating_add(ms(limits.idle_timeout)), "idle_timeout")
        })
    }

    /// Completes when the connection is due to close; says why.
    async fn expired(&self, limits: &ConnLimits) -> &'static str {
        loop {
            match self.deadline(limits) {
                None => tokio::time::sleep(Duration::from_secs(1)).await,
                Some((at, why)) => {
                    let now = self.now();
                    if now >= at {
                        return why;
                    }
                    tokio::time::sleep(Duration::from_millis(at - now)).await;
                }
            }
        }
    }
}

/// One connection's task.
struct Connection {
    conn: Arc<Conn>,
    open: Arc<Open>,
    router: Router,
    builder: Arc<auto::Builder<TokioExecutor>>,
    limits: ConnLimits,
    metrics: Arc<Metrics>,
    stopping: watch::Receiver<bool>,
}

impl Connection {
    async fn run(self, tcp: TcpStream) {
        let activity = self.conn.activity.clone();
        let io = TokioIo::new(Watched {
            io: tcp,
            activity: activity.clone(),
        });
        let router = self.router.clone();
        let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
            let busy = Busy::new(activity.clone());
            let router = router.clone();
            async move {
                let res = router.oneshot(req.map(axum::body::Body::new)).await;
                // A body of known size is written at once; a stream (an
                // export) keeps the request in flight until it ends.
                Ok::<_, std::convert::Infallible>(match res {
                    Ok(res) if res.body().size_hint().exact().is_none() => {
                        res.map(|body| axum::body::Body::new(Streaming { body, _busy: busy }))
                    }
                    Ok(res) => res,
                    Err(never) => match never {},
                })
            }
        });
        let served = self.builder.serve_connection_with_upgrades(io, service);
        tokio::pin!(served);
        // The watchdog waits on the timers, an eviction and the server's
        // stop in a task of its own: a request's wake-ups poll only the
        // connection and one channel.
        let (tx, mut closing) = tokio::sync::mpsc::channel(2);
        let watchdog = tokio::spawn(watchdog(
            self.conn.clone(),
            self.limits,
            self.stopping.clone(),
            tx,
        ));
        let closed_by = loop {
            tokio::select! {
                result = served.as_mut() => {
                    if let Err(e) = result {
                        tracing::debug!(error = %e, "connection ended with an error");
                    }
                    break None;
                }
                close = closing.recv() => match close {
                    Some(Close::Gracefully) => served.as_mut().graceful_shutdown(),
                    Some(Close::Now(why)) => break why,
                    None => {}
                },
            }
        };
        watchdog.abort();
        if let Some(why) = closed_by {
            self.metrics.connection_closed(why);
        }
        self.metrics.connection_gone();
        self.open.remove(self.conn.id);
    }
}

enum Close {
    /// The server stops: finish the requests in flight, then close.
    Gracefully,
    /// At once; with the reason to count, if not counted already.
    Now(Option<&'static str>),
}

/// Tells a connection when to close: at a timeout, on eviction, or
/// gracefully when the server stops (and keeps watching the timers then).
async fn watchdog(
    conn: Arc<Conn>,
    limits: ConnLimits,
    mut stopping: watch::Receiver<bool>,
    tx: tokio::sync::mpsc::Sender<Close>,
) {
    let mut told = false;
    if *stopping.borrow() {
        let _ = tx.send(Close::Gracefully).await;
        told = true;
    }
    loop {
        tokio::select! {
            why = conn.activity.expired(&limits) => {
                let _ = tx.send(Close::Now(Some(why))).await;
                return;
            }
            () = conn.evicted.notified() => {
                let _ = tx.send(Close::Now(None)).await;
                return;
            }
            changed = stopping.changed(), if !told => {
                if changed.is_err() || *stopping.borrow() {
                    told = true;
                    let _ = tx.send(Close::Gracefully).await;
                }
            }
        }
    }
}

/// Marks a request in flight on its connection while it lives.
struct Busy(Arc<Activity>);

impl Busy {
    fn new(activity: Arc<Activity>) -> Self {
        activity.request_started();
        Busy(activity)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.request_done();
    }
}

/// A streaming response's body, holding its request in flight until it
/// is written (or dropped with its connection).
struct Streaming {
    body: axum::body::Body,
    _busy: Busy,
}

impl HttpBody for Streaming {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// A connection's stream, telling its activity when bytes arrive and
/// whether the client takes what is written.
struct Watched {
    io: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.read_some();
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write(cx, buf);
        self.activity.wrote(polled.is_ready());
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.activity.wrote(polled.is_ready());
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// Raises the process' open-file limit to its hard limit; returns the
/// limit now in force (`None` where it cannot be read).
pub fn raise_file_limit() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write `lim`.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return None;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim = raised;
            }
        }
    }
    Some(lim.rlim_cur)
}

/// The connection cap in force: the configured one, within what the file
/// limit leaves after [`FILE_RESERVE`].
pub fn connection_cap(configured: usize, file_limit: Option<u64>) -> usize {
    match file_limit {
        Some(n) => configured.min(
            usize::try_from(n.saturating_sub(FILE_RESERVE))
                .unwrap_or(usize::MAX)
                .max(1),
        ),
        None => configured,
    }
}

#[cfg(test)]
mod tests {
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
}
