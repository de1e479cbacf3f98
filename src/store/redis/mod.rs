//! The Redis store. Every key of a session carries the hash tag
//! `{session_id}`, so each operation is one Lua script on one slot: atomic,
//! and one round trip. Key formats and scripts live here and nowhere else.
//!
//! Layout 3 (prefix `P`, session `S`, user `U`; see `layout.rs` and `migrations/`):
//! - `P:{S}:m` (meta), `P:{S}:t` (turns), `P:{S}:o` (order), `P:{S}:p`
//!   (pending), `P:{S}:d` (deadlines), `P:{S}:i` (idempotency): see `common.lua`.
//!   Turn records are JSON without their turn id (the hash field they are
//!   stored under), and without `"e"` when the encoding is `o200k_base`.
//! - `P:layout`: the layout version.
//! - `P:user:U`: zset of the user's session ids (another slot). It is only a
//!   hint: listings check each session, and drop the dead ones.

mod layout;
mod reply;

pub use self::layout::{LAYOUT, LayoutError, MigrateReport, MigrateStep};

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use prometheus_client::metrics::counter::Counter;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::{Client, IntoConnectionInfo, RedisFuture, Script, TlsCertificates, Value};

use self::reply::{Reply, corrupt};
use super::{
    Finalized, Limits, PoolStatus, SessionInfo, SessionSummary, StartTurn, Started, Store,
    StoreError, StoredHistory, Window, index_refresh_interval, most_recent_first,
};
use crate::domain::{SessionId, TurnId, UserId};
use crate::turn::{Finalization, FinalizedTurn, Millis, PendingTurn};

/// Script arguments, each as Redis would send it.
macro_rules! args {
    ($($a:expr),* $(,)?) => {{
        let mut v: Vec<Vec<u8>> = Vec::new();
        $( v.extend(redis::ToRedisArgs::to_redis_args(&$a)); )*
        v
    }};
}

macro_rules! script {
    ($file:literal) => {
        Script::new(concat!(
            include_str!("common.lua"),
            "\n",
            include_str!($file)
        ))
    };
}

struct Scripts {
    start_turn: Script,
    finalize_turn: Script,
    delete_turn: Script,
    history: Script,
    session_info: Script,
    clear_session: Script,
}

/// Where commands go: a few multiplexed connections to one Redis, or one
/// multiplexed cluster connection (it keeps a connection per node and
/// follows MOVED/ASK by itself), made on first use and again after failure.
enum Target {
    Standalone(Box<Standalone>),
    Cluster(Box<ClusterTarget>),
}

/// `TURNSTORE_REDIS_POOL_SIZE` multiplexed connections, each connecting on
/// first use and reconnecting by itself; requests take them in turn. Unlike
/// a checkout pool, there is no health check per request: one operation is
/// one round trip.
struct Standalone {
    conns: Vec<ConnectionManager>,
    /// Requests in flight on each connection, for the pool metrics.
    in_flight: Vec<Arc<AtomicUsize>>,
    next: AtomicUsize,
}

/// Counts a request in flight on a connection while it lives.
struct InFlight(Arc<AtomicUsize>);

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

struct ClusterTarget {
    client: ClusterClient,
    conn: tokio::sync::Mutex<Option<ClusterConnection>>,
}

/// A connection of either kind.
enum Conn {
    Standalone {
        conn: ConnectionManager,
        /// Held, not read: it counts the request while the connection is used.
        _in_flight: InFlight,
    },
    Cluster(ClusterConnection),
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

pub struct RedisStore {
    target: Target,
    prefix: String,
    limits: Limits,
    /// Bounds waiting for a connection plus the round trip.
    timeout: Duration,
    scripts: Scripts,
    expired_pending: Counter,
    /// The stored layout was found to be `LAYOUT`: session scripts may run.
    layout_ok: std::sync::atomic::AtomicBool,
}

pub struct RedisOptions {
    /// Standalone Redis; ignored when `cluster_nodes` is not empty.
    pub url: String,
    /// Seed nodes of a Redis Cluster.
    pub cluster_nodes: Vec<String>,
    /// PEM roots for `rediss://` with a private CA.
    pub ca_pem: Option<Vec<u8>>,
    pub key_prefix: String,
    pub pool_size: usize,
    pub timeout: Duration,
    pub expired_pending: Counter,
}

impl RedisStore {
    /// Builds the pool; connects lazily, so the service starts (unready)
    /// while Redis is still down. Errors never include the URL (it may hold
    /// a password).
    pub fn new(opts: RedisOptions, limits: Limits) -> Result<Self, String> {
        let invalid =
            |e: redis::RedisError| format!("invalid Redis configuration ({:?})", e.kind());
        let certs = opts.ca_pem.map(|pem| TlsCertificates {
            client_tls: None,
            root_cert: Some(pem),
        });
        let target = if opts.cluster_nodes.is_empty() {
            let info = match certs {
                None => opts.url.as_str().into_connection_info().map_err(invalid)?,
                Some(certs) => Client::build_with_tls(opts.url.as_str(), certs)
                    .map_err(invalid)?
                    .get_connection_info()
                    .clone(),
            };
            let client = Client::open(info).map_err(invalid)?;
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(opts.timeout))
                .set_response_timeout(Some(opts.timeout))
                .set_number_of_retries(1)
                .set_min_delay(Duration::from_millis(50))
                .set_max_delay(opts.timeout);
            let conns = (0..opts.pool_size.max(1))
                .map(|_| ConnectionManager::new_lazy_with_config(client.clone(), config.clone()))
                .collect::<Result<Vec<_>, _>>()
                .map_err(invalid)?;
            Target::Standalone(Box::new(Standalone {
                in_flight: conns.iter().map(|_| Arc::default()).collect(),
                conns,
                next: AtomicUsize::new(0),
            }))
        } else {
            let mut builder = ClusterClientBuilder::new(opts.cluster_nodes)
                .connection_timeout(opts.timeout)
                .response_timeout(opts.timeout);
            if let Some(certs) = certs {
                builder = builder.certs(certs);
            }
            Target::Cluster(Box::new(ClusterTarget {
                client: builder.build().map_err(invalid)?,
                conn: tokio::sync::Mutex::new(None),
            }))
        };
        Ok(RedisStore {
            target,
            prefix: opts.key_prefix,
            limits,
            timeout: opts.timeout,
            expired_pending: opts.expired_pending,
            layout_ok: std::sync::atomic::AtomicBool::new(false),
            scripts: Scripts {
                start_turn: script!("start_turn.lua"),
                finalize_turn: script!("finalize_turn.lua"),
                delete_turn: script!("delete_turn.lua"),
                history: script!("history.lua"),
                session_info: script!("session_info.lua"),
                clear_session: script!("clear_session.lua"),
            },
        })
    }

    fn session_keys(&self, session: &SessionId) -> [String; 6] {
        let base = format!("{}:{{{}}}:", self.prefix, session);
        layout::session_suffixes(LAYOUT).map(|k| format!("{base}{k}"))
    }

    fn user_key(&self, user: &str) -> String {
        format!("{}:user:{}", self.prefix, user)
    }

    async fn connection(&self) -> Result<Conn, StoreError> {
        match &self.target {
            Target::Standalone(pool) => {
                let i = pool.next.fetch_add(1, Ordering::Relaxed) % pool.conns.len();
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
                    StoreError::Unavailable(format!("no Redis Cluster connection: {e}"))
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

    /// Runs `f` on a connection, bounded by the store timeout.
    async fn with_conn<T, F, Fut>(&self, f: F) -> Result<T, StoreError>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let work = async {
            let conn = self.connection().await?;
            f(conn).await.map_err(|e| {
                if e.is_unrecoverable_error() {
                    self.forget_cluster_connection();
                }
                StoreError::Unavailable(format!("Redis: {e}"))
            })
        };
        tokio::time::timeout(self.timeout, work)
            .await
            .unwrap_or_else(|_| {
                Err(StoreError::Unavailable(format!(
                    "Redis did not answer within {:?}",
                    self.timeout
                )))
            })
    }

    /// Checks the layout once before the first session script (Redis may
    /// have been down when the service started).
    async fn layout_checked(&self) -> Result<(), StoreError> {
        use std::sync::atomic::Ordering;
        if self.layout_ok.load(Ordering::Relaxed) {
            return Ok(());
        }
        match self.ensure_layout().await {
            Ok(()) => {
                self.layout_ok.store(true, Ordering::Relaxed);
                Ok(())
            }
            Err(LayoutError::Store(e)) => Err(e),
            Err(e) => {
                tracing::error!(error = %e, "cannot serve this Redis data");
                Err(StoreError::Unavailable(e.to_string()))
            }
        }
    }

    async fn run(
        &self,
        script: &Script,
        session: &SessionId,
        args: Vec<Vec<u8>>,
    ) -> Result<Value, StoreError> {
        self.layout_checked().await?;
        let mut inv = script.prepare_invoke();
        for key in self.session_keys(session) {
            inv.key(key);
        }
        for arg in args {
            inv.arg(arg);
        }
        self.with_conn(|mut conn| async move { inv.invoke_async(&mut conn).await })
            .await
    }

    async fn index(&self, user: &str, session: &SessionId, now: Millis) -> Result<(), StoreError> {
        let key = self.user_key(user);
        let ttl = self.limits.session_ttl + index_refresh_interval(&self.limits);
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        let member = session.to_string();
        self.with_conn(|mut conn| async move {
            redis::pipe()
                .zadd(&key, member, now)
                .ignore()
                .cmd("PEXPIRE")
                .arg(&key)
                .arg(ttl_ms)
                .ignore()
                .query_async::<()>(&mut conn)
                .await
        })
        .await
    }

    async fn unindex(&self, user: &str, sessions: Vec<String>) -> Result<(), StoreError> {
        if sessions.is_empty() {
            return Ok(());
        }
        let key = self.user_key(user);
        self.with_conn(|mut conn| async move {
            redis::cmd("ZREM")
                .arg(&key)
                .arg(sessions)
                .query_async::<()>(&mut conn)
                .await
        })
        .await
    }

    async fn indexed_sessions(&self, user: &UserId) -> Result<Vec<String>, StoreError> {
        let key = self.user_key(user.as_str());
        self.with_conn(|mut conn| async move {
            redis::cmd("ZRANGE")
                .arg(&key)
                .arg(0)
                .arg(-1)
                .query_async::<Vec<String>>(&mut conn)
                .await
        })
        .await
    }

    /// Deletes a session's keys (only if `owner` owns it, when given); returns
    /// whether it existed, and its owner.
    async fn delete_session(
        &self,
        session: &SessionId,
        owner: Option<&str>,
    ) -> Result<(bool, Option<String>), StoreError> {
        let mut r = Reply::array(
            self.run(
                &self.scripts.clear_session,
                session,
                args![owner.unwrap_or("")],
            )
            .await?,
        )?;
        Ok((r.int()? == 1, r.owner()?))
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn turn_id(id: &str) -> Result<TurnId, StoreError> {
    TurnId::parse(id).map_err(|_| corrupt(format!("turn id {id:?}")))
}

fn finalized(id: TurnId, json: &str) -> Result<FinalizedTurn, StoreError> {
    FinalizedTurn::parse(id, json).map_err(|e| corrupt(format!("turn record: {e}")))
}

fn pending(id: TurnId, json: &str) -> Result<PendingTurn, StoreError> {
    PendingTurn::parse(id, json).map_err(|e| corrupt(format!("turn record: {e}")))
}

/// `{total, ids newest first, their records, first id, its record}` from
/// `read_history`. A record missing under its id (never, short of manual
/// edits) is skipped.
fn stored_history(
    v: Value,
    user_id: Option<String>,
    pending_turns: u64,
) -> Result<StoredHistory, StoreError> {
    let mut h = Reply::array(v)?;
    let total_turns = h.uint()?;
    let ids = h.list()?;
    let recs = h.list()?;
    let mut newest_first = Vec::with_capacity(recs.len());
    for (id, rec) in ids.into_iter().zip(recs) {
        if let Some(rec) = Reply::opt_string_of(rec)? {
            newest_first.push(finalized(turn_id(&Reply::string_of(id)?)?, &rec)?);
        }
    }
    let first_id = h.opt_string()?;
    let first = match (first_id, h.opt_string()?) {
        (Some(id), Some(rec)) => Some(finalized(turn_id(&id)?, &rec)?),
        _ => None,
    };
    Ok(StoredHistory {
        user_id,
        total_turns,
        pending_turns,
        newest_first,
        first,
    })
}

#[async_trait]
impl Store for RedisStore {
    async fn start_turn(&self, req: StartTurn<'_>) -> Result<Started, StoreError> {
        let pending_json = serde_json::to_string(&req.turn)
            .map_err(|e| corrupt(format!("encoding a pending turn: {e}")))?;
        let (key, hash) = req
            .idempotency
            .map(|(k, h)| (k.as_str(), h))
            .unwrap_or(("", ""));
        let (limit, keep_first) = match req.window {
            Some(w) => (i64::try_from(w.limit).unwrap_or(i64::MAX), w.keep_first),
            None => (-1, false),
        };
        let v = self
            .run(
                &self.scripts.start_turn,
                req.session_id,
                args![
                    req.now,
                    ms(self.limits.session_ttl),
                    ms(self.limits.pending_ttl),
                    req.user_id.map(UserId::as_str).unwrap_or(""),
                    req.turn.turn_id.to_string(),
                    pending_json,
                    key,
                    hash,
                    limit,
                    if keep_first { "1" } else { "0" },
                    ms(index_refresh_interval(&self.limits)),
                ],
            )
            .await?;
        let mut r = Reply::array(v)?;
        let status = r.string()?;
        match status.as_str() {
            "owner_mismatch" => return Err(StoreError::OwnerMismatch),
            "idem_reused" => return Err(StoreError::IdempotencyKeyReused),
            "ok" | "replay" => {}
            other => return Err(corrupt(format!("start_turn status {other}"))),
        }
        let user_id = r.owner()?;
        let kind = r.string()?;
        let id = turn_id(&r.string()?)?;
        let json = r.string()?;
        let turn = if kind == "f" {
            finalized(id, &json)?.start
        } else {
            pending(id, &json)?
        };
        let history_value = r.next()?;
        let pending_before = r.uint()?;
        self.expired_pending.inc_by(r.uint()?);
        let reindex = r.uint()? == 1;
        let history = match history_value {
            Value::Nil => None,
            v => Some(stored_history(v, user_id.clone(), pending_before)?),
        };
        if reindex && let Some(owner) = &user_id {
            // The turn is written; a failed index write only delays the
            // session's appearance in its user's list until the next start.
            if let Err(e) = self.index(owner, req.session_id, req.now).await {
                tracing::warn!(error = %e, "could not update the user index");
            }
        }
        Ok(Started {
            user_id,
            turn,
            replayed: status == "replay",
            history,
        })
    }

    async fn finalize_turn(
        &self,
        session: &SessionId,
        turn: TurnId,
        end: &Finalization,
    ) -> Result<Finalized, StoreError> {
        let end_json = serde_json::to_string(end)
            .map_err(|e| corrupt(format!("encoding a finalization: {e}")))?;
        let v = self
            .run(
                &self.scripts.finalize_turn,
                session,
                args![
                    end.finalized_at,
                    ms(self.limits.session_ttl),
                    turn.to_string(),
                    end_json,
                    self.limits.max_turns,
                ],
            )
            .await?;
        let mut r = Reply::array(v)?;
        match r.string()?.as_str() {
            "ok" => {
                let done = finalized(turn, &r.string()?)?;
                self.expired_pending.inc_by(r.uint()?);
                Ok(Finalized::Now(done))
            }
            "already" => Ok(Finalized::Already(finalized(turn, &r.string()?)?)),
            "not_found" => Err(StoreError::TurnNotFound),
            other => Err(corrupt(format!("finalize_turn status {other}"))),
        }
    }

    async fn delete_turn(&self, session: &SessionId, turn: TurnId) -> Result<(), StoreError> {
        let v = self
            .run(
                &self.scripts.delete_turn,
                session,
                args![crate::turn::now_millis(), turn.to_string()],
            )
            .await?;
        match Reply::string_of(v)?.as_str() {
            "pending" | "finalized" => Ok(()),
            _ => Err(StoreError::TurnNotFound),
        }
    }

    async fn history(
        &self,
        session: &SessionId,
        window: Window,
        now: Millis,
    ) -> Result<StoredHistory, StoreError> {
        let limit = i64::try_from(window.limit).unwrap_or(i64::MAX);
        let keep_first = if window.keep_first { "1" } else { "0" };
        let v = self
            .run(
                &self.scripts.history,
                session,
                args![now, limit, keep_first],
            )
            .await?;
        if v == Value::Nil {
            return Ok(StoredHistory::default());
        }
        let mut r = Reply::array(v)?;
        let owner = r.owner()?;
        let h = r.next()?;
        let pending = r.uint()?;
        stored_history(h, owner, pending)
    }

    async fn session_info(
        &self,
        session: &SessionId,
        now: Millis,
    ) -> Result<Option<SessionInfo>, StoreError> {
        let v = self
            .run(&self.scripts.session_info, session, args![now])
            .await?;
        if v == Value::Nil {
            return Ok(None);
        }
        let mut r = Reply::array(v)?;
        let user_id = r.owner()?;
        let created_at = r.int()?;
        let last_active_at = r.int()?;
        let turn_count = r.uint()?;
        let pending_count = r.uint()?;
        let pttl = r.int()?;
        Ok(Some(SessionInfo {
            user_id,
            created_at,
            last_active_at,
            expires_at: now + pttl.max(0),
            turn_count,
            pending_count,
        }))
    }

    async fn clear_session(&self, session: &SessionId) -> Result<(), StoreError> {
        let (_, owner) = self.delete_session(session, None).await?;
        if let Some(owner) = owner {
            self.unindex(&owner, vec![session.to_string()]).await?;
        }
        Ok(())
    }

    async fn user_sessions(
        &self,
        user: &UserId,
        now: Millis,
    ) -> Result<Vec<SessionSummary>, StoreError> {
        let mut live = Vec::new();
        let mut dead = Vec::new();
        for id in self.indexed_sessions(user).await? {
            let info = match SessionId::parse(id.as_str()) {
                Ok(session) => self.session_info(&session, now).await?,
                Err(_) => None,
            };
            match info {
                Some(i) if i.user_id.as_deref() == Some(user.as_str()) => {
                    live.push(SessionSummary {
                        session_id: id,
                        last_active_at: i.last_active_at,
                        turn_count: i.turn_count,
                    })
                }
                _ => dead.push(id),
            }
        }
        self.unindex(user.as_str(), dead).await?;
        most_recent_first(&mut live);
        Ok(live)
    }

    async fn erase_user(&self, user: &UserId) -> Result<u64, StoreError> {
        let mut deleted = 0;
        for id in self.indexed_sessions(user).await? {
            if let Ok(session) = SessionId::parse(id.as_str())
                && self.delete_session(&session, Some(user.as_str())).await?.0
            {
                deleted += 1;
            }
        }
        let key = self.user_key(user.as_str());
        self.with_conn(|mut conn| async move {
            redis::cmd("DEL")
                .arg(&key)
                .query_async::<()>(&mut conn)
                .await
        })
        .await?;
        Ok(deleted)
    }

    fn pool_status(&self) -> Option<PoolStatus> {
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

    async fn ping(&self) -> Result<(), StoreError> {
        self.layout_checked().await?;
        self.with_conn(
            |mut conn| async move { redis::cmd("PING").query_async::<()>(&mut conn).await },
        )
        .await
    }
}
