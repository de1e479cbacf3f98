//! The Redis store. Every key of a session carries the hash tag
//! `{session_id}`, so each operation on a session is one Lua script on one
//! slot: atomic, and one round trip. Key names (`keys.rs`), scripts
//! (`lua/`, `scripts.rs`) and record formats (`record.rs`) live here and
//! nowhere else.
//!
//! - `conn.rs`: connections, standalone or cluster, and the store timeout.
//! - `turns.rs`: start, finalize, delete; `imports.rs`: transcripts
//!   appended at once; `reads.rs`: history pages and
//!   session info; `summaries.rs`: a session's summary, and what reads
//!   leave unsummarized; `users.rs`: the user index, listings and erasure.
//! - `layout.rs`: the layout version, and migrations between versions.

mod conn;
mod fork;
mod imports;
mod keys;
mod layout;
mod reads;
mod record;
mod reply;
mod scripts;
mod summaries;
mod turns;
#[cfg(test)]
mod twins;
mod users;

pub use self::layout::{LAYOUT, LayoutError, MigrateReport, MigrateStep};

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use prometheus_client::metrics::counter::Counter;

use self::conn::Connections;
use self::keys::Keys;
use self::scripts::Scripts;
use super::{
    Erased, Finalized, Fork, Forked, Import, Imported, Limits, Outage, OutageClass, PoolStatus,
    SessionInfo, SessionsPage, StartTurn, Started, Store, StoreError, StoredHistory, StoredSummary,
    SummaryWrite,
};
use crate::domain::{SessionId, TurnId, UserId};
use crate::history::Options;
use crate::turn::{Finalization, Millis, TurnView};

pub struct RedisStore {
    conn: Connections,
    keys: Keys,
    limits: Limits,
    scripts: Scripts,
    expired_pending: Counter,
    /// The stored layout was found to be `LAYOUT`: session scripts may run.
    layout_ok: AtomicBool,
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
    /// Builds the connections; they connect lazily, so the service starts
    /// (unready) while Redis is still down.
    pub fn new(opts: RedisOptions, limits: Limits) -> Result<Self, String> {
        Ok(RedisStore {
            conn: Connections::new(
                &opts.url,
                opts.cluster_nodes,
                opts.ca_pem,
                opts.pool_size,
                opts.timeout,
            )?,
            keys: Keys::new(opts.key_prefix),
            limits,
            scripts: Scripts::new(),
            expired_pending: opts.expired_pending,
            layout_ok: AtomicBool::new(false),
        })
    }

    /// `e`, with what a probe of the Redis address finds when `e` only
    /// says it did not answer in time (see `Connections::explain`).
    pub async fn explain(&self, e: StoreError) -> StoreError {
        self.conn.explain(e).await
    }

    /// Checks the layout once before the first script (Redis may have been
    /// down when the service started).
    async fn layout_checked(&self) -> Result<(), StoreError> {
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
                Err(StoreError::Unavailable(Outage::new(
                    OutageClass::Layout,
                    e.to_string(),
                )))
            }
        }
    }
}

#[async_trait]
impl Store for RedisStore {
    async fn start_turn(&self, req: StartTurn<'_>) -> Result<Started, StoreError> {
        self.start(req).await
    }

    async fn finalize_turn(
        &self,
        session: &SessionId,
        turn: TurnId,
        end: &Finalization,
    ) -> Result<Finalized, StoreError> {
        self.finalize(session, turn, end).await
    }

    async fn regenerate(
        &self,
        session: &SessionId,
        turn: TurnId,
        end: &Finalization,
    ) -> Result<TurnView, StoreError> {
        self.replace_answer(session, turn, end).await
    }

    async fn fork(&self, req: Fork<'_>) -> Result<Forked, StoreError> {
        self.fork_session(req).await
    }

    async fn delete_turn(&self, session: &SessionId, turn: TurnId) -> Result<(), StoreError> {
        self.delete(session, turn).await
    }

    async fn history(
        &self,
        session: &SessionId,
        read: &Options,
        now: Millis,
    ) -> Result<StoredHistory, StoreError> {
        self.read_history(session, read, now).await
    }

    async fn session_info(
        &self,
        session: &SessionId,
        now: Millis,
    ) -> Result<Option<SessionInfo>, StoreError> {
        self.read_session_info(session, now).await
    }

    async fn clear_session(&self, session: &SessionId) -> Result<(), StoreError> {
        self.clear(session).await
    }

    async fn user_sessions(
        &self,
        user: &UserId,
        limit: usize,
        cursor: Option<Millis>,
        _now: Millis,
    ) -> Result<SessionsPage, StoreError> {
        self.list(user, limit, cursor).await
    }

    async fn erase_user(&self, user: &UserId, budget: Duration) -> Result<Erased, StoreError> {
        self.erase(user, budget).await
    }

    async fn turns_page(
        &self,
        session: &SessionId,
        after_seq: u64,
        max_turns: usize,
        max_bytes: u64,
    ) -> Result<Vec<TurnView>, StoreError> {
        self.read_turns_page(session, after_seq, max_turns, max_bytes)
            .await
    }

    async fn import(&self, req: Import<'_>) -> Result<Imported, StoreError> {
        self.import_turns(req).await
    }

    async fn lock_summarizing(
        &self,
        session: &SessionId,
        token: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        self.summarizer_lock(session, token, Some(ttl)).await
    }

    async fn unlock_summarizing(&self, session: &SessionId, token: &str) -> Result<(), StoreError> {
        self.summarizer_lock(session, token, None).await.map(|_| ())
    }

    async fn put_summary(&self, write: SummaryWrite<'_>) -> Result<StoredSummary, StoreError> {
        self.write_summary(write).await
    }

    async fn summary(&self, session: &SessionId) -> Result<Option<StoredSummary>, StoreError> {
        self.read_summary(session).await
    }

    async fn delete_summary(&self, session: &SessionId) -> Result<(), StoreError> {
        self.remove_summary(session).await
    }

    fn pool_status(&self) -> Option<PoolStatus> {
        self.conn.pool_status()
    }

    /// Readiness: Redis answers, holds our layout, and takes a write (a
    /// Redis out of memory answers a PING and refuses every write).
    async fn ping(&self) -> Result<(), StoreError> {
        let pinged = async {
            self.layout_checked().await?;
            self.conn.query::<()>(redis::cmd("PING")).await?;
            let probe = redis::cmd("SET")
                .arg(self.keys.ready())
                .arg(crate::turn::now_millis())
                .arg("PX")
                .arg(10_000)
                .clone();
            self.conn.query::<()>(probe).await
        };
        match pinged.await {
            Err(e) => Err(self.explain(e).await),
            Ok(()) => Ok(()),
        }
    }
}
