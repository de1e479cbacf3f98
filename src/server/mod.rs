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
//!
//! What each connection does, and so when it is due to close, is its
//! `Activity` (see `activity`).

mod activity;
pub mod threads;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::HttpBody;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Handle;
use tokio::sync::{Notify, watch};
use tower::ServiceExt;

pub use self::activity::ConnLimits;
use self::activity::{Activity, Busy, Streaming, Watched};
use crate::metrics::Metrics;

/// Files the process keeps for other uses than client connections: Redis
/// connections, the listener, logs, the API keys file.
pub const FILE_RESERVE: u64 = 64;

/// Serves `router` on `listener` until `shutdown` completes; then stops
/// accepting, lets each connection finish its requests in flight, and
/// returns once all are closed. Each connection is served on the runtime
/// of `threads` whose turn it is (see `threads`), or on this one when
/// there are none.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnLimits,
    metrics: Arc<Metrics>,
    threads: Vec<Handle>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let open = Arc::new(Open::default());
    let (stopping_tx, stopping) = watch::channel(false);
    // No timer for hyper: its own header timeout would also cut idle
    // keep-alive connections short, and arm a timer for every request.
    let builder = Arc::new(auto::Builder::new(TokioExecutor::new()));
    let mut last_accept_error: Option<Instant> = None;
    let mut accepted_count = 0usize;
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
        accepted_count += 1;
        task.start(tcp, threads.get(accepted_count % threads.len().max(1)));
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
    /// Serves the connection on `thread` (here when `None`, or when it is
    /// this runtime); there, it is moved to that runtime's reactor.
    fn start(self, tcp: TcpStream, thread: Option<&Handle>) {
        let Some(h) = thread.filter(|h| h.id() != Handle::current().id()) else {
            drop(tokio::spawn(self.run(tcp)));
            return;
        };
        match tcp.into_std() {
            Ok(tcp) => drop(h.spawn(async move {
                match TcpStream::from_std(tcp) {
                    Ok(tcp) => self.run(tcp).await,
                    Err(e) => self.abandon(&e),
                }
            })),
            Err(e) => self.abandon(&e),
        }
    }

    /// A connection that could not be moved to its thread: closed.
    fn abandon(self, e: &std::io::Error) {
        tracing::debug!(error = %e, "could not move a connection to its thread");
        self.metrics.connection_gone();
        self.open.remove(self.conn.id);
    }

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
mod tests;
