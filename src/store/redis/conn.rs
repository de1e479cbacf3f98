//! Connections: a few multiplexed connections to one Redis, or one
//! multiplexed cluster connection; every call bounded by the store timeout.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::{
    Client, ConnectionAddr, IntoConnectionInfo, RedisError, RedisFuture, TlsCertificates, Value,
};

use crate::store::{Outage, OutageClass, PoolStatus, StoreError};

/// Where commands go. A cluster connection keeps a connection per node and
/// follows MOVED/ASK by itself; it is made on first use and again after a
/// failure it cannot recover from.
pub(super) enum Target {
    Standalone(Box<Standalone>),
    Cluster(Box<ClusterTarget>),
}

/// `TURNSTORE_REDIS_POOL_SIZE` multiplexed connections, each connecting on
/// first use and reconnecting by itself; requests take them in turn. Unlike
/// a checkout pool, there is no health check per request: one operation is
/// one round trip.
pub(super) struct Standalone {
    conns: Vec<ConnectionManager>,
    /// Host, port and whether the URL asks for TLS, for [`Connections::explain`];
    /// `None` for a Unix socket.
    probe: Option<(String, u16, bool)>,
    /// Requests in flight on each connection, for the pool metrics.
    in_flight: Vec<Arc<AtomicUsize>>,
    next: AtomicUsize,
}

impl Standalone {
    /// The connection a request takes, in turn. On a serving thread (see
    /// `server::threads`), among that thread's own: connection `i` belongs
    /// to thread `i` modulo their number, so that its task (which writes
    /// the commands and reads the replies, started on its first use) runs
    /// on the thread of the requests it carries, and a round trip wakes no
    /// other thread. With fewer connections than threads, threads share.
    fn pick(&self) -> usize {
        let turn = self.next.fetch_add(1, Ordering::Relaxed);
        conn_for(turn, self.conns.len(), crate::server::threads::place())
    }
}

/// Which of `n` connections the `turn`th request takes on the serving
/// thread at `place` (see [`Standalone::pick`]).
fn conn_for(turn: usize, n: usize, place: Option<(usize, usize)>) -> usize {
    match place {
        Some((i, count)) if count > 1 && n >= count => {
            let own = (n - i).div_ceil(count);
            i + count * (turn % own)
        }
        Some((i, count)) if count > 1 => i % n,
        _ => turn % n,
    }
}

pub(super) struct ClusterTarget {
    client: ClusterClient,
    conn: tokio::sync::Mutex<Option<ClusterConnection>>,
}

/// Counts a request in flight on a connection while it lives.
pub(super) struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    fn new(counter: &Arc<AtomicUsize>) -> Self {
        counter.fetch_add(1, Ordering::Relaxed);
        InFlight(counter.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A connection of either kind.
pub(super) enum Conn {
    Standalone {
        conn: ConnectionManager,
        /// Held, not read: it counts the request while the connection is used.
        _in_flight: InFlight,
    },
    Cluster(ClusterConnection),
}

impl Conn {
    /// The same connection for one more call: a standalone connection
    /// that failed is reconnecting, and the call waits for it. A cluster
    /// connection that failed is replaced instead (`None`).
    fn again(&self) -> Option<Conn> {
        match self {
            Conn::Standalone { conn, _in_flight } => Some(Conn::Standalone {
                conn: conn.clone(),
                _in_flight: InFlight::new(&_in_flight.0),
            }),
            Conn::Cluster(_) => None,
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Standalone { conn: c, .. } => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Standalone { conn: c, .. } => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Standalone { conn: c, .. } => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// How a store-timeout error begins.
const NO_ANSWER: &str = "Redis did not answer within";

/// A Redis error as an outage: its class, and what it means in words an
/// operator can act on. Redis' own text is logged (at debug: an outage
/// fails every request), never returned: it may quote the data.
pub(super) fn outage(e: &RedisError) -> Outage {
    use OutageClass::*;
    let text = e.to_string();
    tracing::debug!(error = %text, "a Redis call failed");
    let has = |s: &str| text.contains(s);
    let code = e.code().unwrap_or_default();
    let (class, what) = if e.kind() == redis::ErrorKind::AuthenticationFailed
        || code == "WRONGPASS"
        || has("WRONGPASS")
    {
        (
            Auth,
            "authentication failed: wrong user or password in the Redis URL",
        )
    } else if code == "NOAUTH" || has("NOAUTH") {
        (
            Auth,
            "authentication required: the Redis URL has no password",
        )
    } else if code == "NOPERM" {
        (Auth, "the Redis user lacks a permission turnstore needs")
    } else if code == "OOM" {
        (
            OutOfMemory,
            "out of memory: Redis refuses writes past its maxmemory",
        )
    } else if code == "READONLY" {
        (NotServing, "read-only: the Redis URL names a replica")
    } else if code == "LOADING" {
        (NotServing, "loading: Redis is loading its data set")
    } else if code == "BUSY" {
        (NotServing, "busy: Redis is running a long script")
    } else if ["MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN"].contains(&code) {
        (NotServing, "the Redis cluster is down or failing over")
    } else if has("failed to lookup address") {
        (
            Unreachable,
            "unknown host: the Redis host name does not resolve",
        )
    } else if has("Connection refused") || e.is_connection_refusal() {
        (
            Unreachable,
            "connection refused: nothing listens at the Redis address",
        )
    } else if has("certificate") || has("TLS") || has("tls") || has("handshake") {
        (
            Unreachable,
            "TLS handshake failed (a private CA needs TURNSTORE_REDIS_CA_FILE)",
        )
    } else if has("Connection reset") || has("Broken pipe") || has("end of file") {
        (
            Unreachable,
            "the server closed the connection: if it expects TLS, use rediss://",
        )
    } else if e.kind() == redis::ErrorKind::Parse {
        (
            Unreachable,
            "the server does not speak the Redis protocol: check the address, or use rediss:// if it expects TLS",
        )
    } else if e.is_timeout() {
        (Timeout, "no answer in time")
    } else if e.is_io_error() {
        (Unreachable, "the connection failed")
    } else {
        return Outage::new(Other, format!("Redis answered an error ({})", e.category()));
    };
    Outage::new(class, format!("Redis: {what}"))
}

/// Whether a plain Redis answers a PING at `host:port`.
async fn probe(host: &str, port: u16) -> std::io::Result<bool> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect((host, port)).await?;
    tcp.write_all(b"PING\r\n").await?;
    let mut first = [0u8; 1];
    let n = tcp.read(&mut first).await?;
    Ok(n == 1 && (first[0] == b'+' || first[0] == b'-'))
}

pub(super) struct Connections {
    pub(super) target: Target,
    /// Bounds waiting for a connection plus the round trip.
    timeout: Duration,
}

impl Connections {
    /// Connects lazily, so the service starts (unready) while Redis is
    /// still down. Errors never include the URL (it may hold a password).
    pub fn new(
        url: &str,
        cluster_nodes: Vec<String>,
        ca_pem: Option<Vec<u8>>,
        pool_size: usize,
        timeout: Duration,
    ) -> Result<Self, String> {
        let invalid =
            |e: redis::RedisError| format!("invalid Redis configuration ({:?})", e.kind());
        let certs = ca_pem.map(|pem| TlsCertificates {
            client_tls: None,
            root_cert: Some(pem),
        });
        let target = if cluster_nodes.is_empty() {
            let info = match certs {
                None => url.into_connection_info().map_err(invalid)?,
                Some(certs) => Client::build_with_tls(url, certs)
                    .map_err(invalid)?
                    .get_connection_info()
                    .clone(),
            };
            let probe = match info.addr() {
                ConnectionAddr::Tcp(host, port) => Some((host.clone(), *port, false)),
                ConnectionAddr::TcpTls { host, port, .. } => Some((host.clone(), *port, true)),
                _ => None,
            };
            let client = Client::open(info).map_err(invalid)?;
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(timeout))
                .set_response_timeout(Some(timeout))
                .set_number_of_retries(1)
                .set_min_delay(Duration::from_millis(50))
                .set_max_delay(timeout);
            let conns = (0..pool_size.max(1))
                .map(|_| ConnectionManager::new_lazy_with_config(client.clone(), config.clone()))
                .collect::<Result<Vec<_>, _>>()
                .map_err(invalid)?;
            Target::Standalone(Box::new(Standalone {
                probe,
                in_flight: conns.iter().map(|_| Arc::default()).collect(),
                conns,
                next: AtomicUsize::new(0),
            }))
        } else {
            let mut builder = ClusterClientBuilder::new(cluster_nodes)
                .connection_timeout(timeout)
                .response_timeout(timeout);
            if let Some(certs) = certs {
                builder = builder.certs(certs);
            }
            Target::Cluster(Box::new(ClusterTarget {
                client: builder.build().map_err(invalid)?,
                conn: tokio::sync::Mutex::new(None),
            }))
        };
        Ok(Connections { target, timeout })
    }

    async fn connection(&self) -> Result<Conn, StoreError> {
        match &self.target {
            Target::Standalone(pool) => {
                let i = pool.pick();
                Ok(Conn::Standalone {
                    conn: pool.conns[i].clone(),
                    _in_flight: InFlight::new(&pool.in_flight[i]),
                })
            }
            Target::Cluster(cluster) => {
                let mut slot = cluster.conn.lock().await;
                if let Some(c) = slot.as_ref() {
                    return Ok(Conn::Cluster(c.clone()));
                }
                let c = cluster.client.get_async_connection().await.map_err(|e| {
                    let o = outage(&e);
                    StoreError::Unavailable(Outage::new(
                        o.class,
                        format!("no Redis Cluster connection: {}", o.said),
                    ))
                })?;
                *slot = Some(c.clone());
                Ok(Conn::Cluster(c))
            }
        }
    }

    /// After a failure the cluster connection cannot recover from, the next
    /// request makes a new one.
    fn forget_cluster_connection(&self) {
        if let Target::Cluster(cluster) = &self.target
            && let Ok(mut slot) = cluster.conn.try_lock()
        {
            *slot = None;
        }
    }

    pub fn is_cluster(&self) -> bool {
        matches!(self.target, Target::Cluster(_))
    }

    /// Runs `f` on a connection, bounded by the store timeout. When the
    /// connection turns out dead (Redis restarted, say: a pooled
    /// connection learns it at its next call), `f` runs once more on a
    /// fresh one if `again` (it may run twice: it may have run already).
    pub async fn with_conn<T, F, Fut>(&self, again: bool, f: F) -> Result<T, StoreError>
    where
        F: Fn(Conn) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let work = async {
            let mut tries = if again { 2 } else { 1 };
            let mut next = None;
            loop {
                tries -= 1;
                let conn = match next.take() {
                    Some(conn) => conn,
                    None => self.connection().await?,
                };
                let same = conn.again();
                let e = match f(conn).await {
                    Ok(v) => return Ok(v),
                    Err(e) => e,
                };
                let dead = e.is_unrecoverable_error();
                if dead {
                    self.forget_cluster_connection();
                }
                // A script that fails as it runs is a bug or data it
                // cannot read, not an outage: a retry would fail alike.
                // (A command refused inside a script, OOM say, keeps its
                // own code and stays an outage.)
                if e.detail().is_some_and(|d| {
                    d.starts_with("user_script:") || d.starts_with("user_function:")
                }) {
                    return Err(StoreError::Corrupt(format!("a script failed: {e}")));
                }
                if !(dead && tries > 0) {
                    return Err(StoreError::Unavailable(outage(&e)));
                }
                next = same;
                tracing::debug!(error = %e, "a Redis connection died: trying once more");
            }
        };
        tokio::time::timeout(self.timeout, work)
            .await
            .unwrap_or_else(|_| {
                Err(StoreError::Unavailable(Outage::new(
                    OutageClass::Timeout,
                    format!("{NO_ANSWER} {:?}", self.timeout),
                )))
            })
    }

    /// `error`, or when it only says Redis did not answer in time, what a
    /// plain TCP probe of the address finds: nothing there, a plain Redis
    /// where the URL asks for TLS, or a Redis that answers but slowly.
    pub async fn explain(&self, error: StoreError) -> StoreError {
        let StoreError::Unavailable(Outage { class, said }) = &error else {
            return error;
        };
        let Target::Standalone(pool) = &self.target else {
            return error;
        };
        let (Some((host, port, tls)), true) = (&pool.probe, said.starts_with(NO_ANSWER)) else {
            return error;
        };
        let found = tokio::time::timeout(self.timeout, probe(host, *port)).await;
        let what = match (found, tls) {
            (Ok(Ok(true)), true) => {
                "TLS expected by the URL (rediss://), but the server speaks plain Redis: use redis://"
            }
            (Ok(Ok(true)), false) => {
                "the server answers a plain PING, but not in time: overloaded?"
            }
            (Ok(Ok(false)), true) => "TLS handshake did not complete",
            (Ok(Ok(false)), false) => "the server does not speak the Redis protocol",
            (Ok(Err(_)), _) => "the address refuses connections",
            (Err(_), _) => "nothing answers at the address (a firewall dropping packets?)",
        };
        StoreError::Unavailable(Outage::new(*class, format!("{said}: {what}")))
    }

    pub async fn query<T: redis::FromRedisValue + Send + 'static>(
        &self,
        cmd: redis::Cmd,
    ) -> Result<T, StoreError> {
        // Every command sent so is a read or writes the same again.
        self.with_conn(true, |mut conn| {
            let cmd = cmd.clone();
            async move { cmd.query_async::<T>(&mut conn).await }
        })
        .await
    }

    pub fn pool_status(&self) -> Option<PoolStatus> {
        let Target::Standalone(pool) = &self.target else {
            return None;
        };
        let busy: Vec<usize> = pool
            .in_flight
            .iter()
            .map(|n| n.load(Ordering::Relaxed))
            .collect();
        Some(PoolStatus {
            size: pool.conns.len(),
            available: busy.iter().filter(|n| **n == 0).count(),
            // Requests queued behind another on a multiplexed connection.
            waiting: busy.iter().map(|n| n.saturating_sub(1)).sum(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::conn_for;

    /// Each serving thread takes every connection of its own in turn, and
    /// no other's; every connection has a thread; fewer connections than
    /// threads are shared.
    #[test]
    fn each_thread_takes_its_own_connections_in_turn() {
        for n in 1..9 {
            for count in 1..6 {
                let mut owner = vec![None; n];
                for i in 0..count {
                    let taken: std::collections::BTreeSet<usize> = (0..3 * n)
                        .map(|turn| conn_for(turn, n, Some((i, count))))
                        .collect();
                    assert!(taken.iter().all(|&c| c < n), "n {n} count {count}");
                    if count == 1 {
                        assert_eq!(taken.len(), n);
                    } else if n >= count {
                        for c in &taken {
                            assert_eq!(owner[*c].replace(i), None, "n {n} count {count}");
                        }
                    } else {
                        assert_eq!(taken.into_iter().collect::<Vec<_>>(), [i % n]);
                    }
                }
                if count > 1 && n >= count {
                    assert!(owner.iter().all(Option::is_some), "n {n} count {count}");
                }
            }
        }
        // Off the serving threads: all in turn.
        assert_eq!(
            (0..4).map(|t| conn_for(t, 3, None)).collect::<Vec<_>>(),
            [0, 1, 2, 0]
        );
    }
}
