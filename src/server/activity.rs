//! What a connection is doing, and when it is due to close: its
//! `Activity` against its `ConnLimits`, as its stream (`Watched`: bytes
//! read, writes the client takes or not) and its requests (`Busy` while
//! one is in flight, held by a `Streaming` body until it is written) tell.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::HttpBody;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
    pub write_timeout: Duration,
    pub max_connections: usize,
}

/// What a connection is doing, as its reads and its requests tell.
/// Times are milliseconds since `base`.
pub(super) struct Activity {
    base: Instant,
    pub(super) in_flight: AtomicU32,
    /// Requests handed to the service so far.
    pub(super) requests: AtomicU64,
    /// Since when no request is in flight (the connection's start first).
    pub(super) idle_since: AtomicU64,
    /// When the first byte of the next request's head came, plus one; 0
    /// while none has.
    head_since: AtomicU64,
    /// Since when a write waits for the client to take bytes, plus one; 0
    /// while none does.
    pub(super) stalled_since: AtomicU64,
}

impl Activity {
    pub(super) fn new() -> Arc<Self> {
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
    pub(super) fn wrote(&self, progressed: bool) {
        if progressed {
            self.stalled_since.store(0, Ordering::Relaxed);
        } else if self.stalled_since.load(Ordering::Relaxed) == 0 {
            self.stalled_since.store(self.now() + 1, Ordering::Relaxed);
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    pub(super) fn read_some(&self) {
        if self.in_flight.load(Ordering::Acquire) == 0
            && self.head_since.load(Ordering::Relaxed) == 0
        {
            self.head_since.store(self.now() + 1, Ordering::Relaxed);
        }
    }

    pub(super) fn request_started(&self) {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.head_since.store(0, Ordering::Relaxed);
    }

    pub(super) fn request_done(&self) {
        self.idle_since.store(self.now(), Ordering::Relaxed);
        self.head_since.store(0, Ordering::Relaxed);
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
    }

    /// When the connection is to be closed if nothing changes, and why;
    /// `None` while a request is in flight and its client takes what is
    /// written.
    pub(super) fn deadline(&self, limits: &ConnLimits) -> Option<(u64, &'static str)> {
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
    pub(super) async fn expired(&self, limits: &ConnLimits) -> &'static str {
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

/// Marks a request in flight on its connection while it lives.
pub(super) struct Busy(Arc<Activity>);

impl Busy {
    pub(super) fn new(activity: Arc<Activity>) -> Self {
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
pub(super) struct Streaming {
    pub(super) body: axum::body::Body,
    pub(super) _busy: Busy,
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
pub(super) struct Watched {
    pub(super) io: TcpStream,
    pub(super) activity: Arc<Activity>,
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
