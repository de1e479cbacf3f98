//! A store wrapper that times every operation and counts its failures.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::{
    Erased, Finalized, Fork, Forked, Import, Imported, PoolStatus, SessionInfo, SessionsPage,
    StartTurn, Started, Store, StoreError, StoredHistory, StoredSummary, SummaryWrite,
};
use crate::domain::{SessionId, TurnId, UserId};
use crate::history::Options;
use crate::metrics::Metrics;
use crate::turn::{Finalization, Millis, TurnView};

pub struct Metered {
    inner: Arc<dyn Store>,
    metrics: Arc<Metrics>,
}

impl Metered {
    pub fn new(inner: Arc<dyn Store>, metrics: Arc<Metrics>) -> Self {
        Metered { inner, metrics }
    }

    async fn time<T>(
        &self,
        op: &'static str,
        work: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let start = Instant::now();
        let result = work.await;
        // Outcomes of the contract (not found, owner mismatch…) are answers, not failures.
        let error = match &result {
            Err(StoreError::Unavailable(o)) => Some(o.class.label()),
            Err(StoreError::Corrupt(_)) => Some("corrupt"),
            _ => None,
        };
        self.metrics
            .observe_store(op, start.elapsed().as_secs_f64(), error);
        result
    }
}

#[async_trait]
impl Store for Metered {
    async fn start_turn(&self, req: StartTurn<'_>) -> Result<Started, StoreError> {
        self.time("start_turn", self.inner.start_turn(req)).await
    }

    async fn finalize_turn(
        &self,
        session: &SessionId,
        turn: TurnId,
        end: &Finalization,
    ) -> Result<Finalized, StoreError> {
        self.time(
            "finalize_turn",
            self.inner.finalize_turn(session, turn, end),
        )
        .await
    }

    async fn regenerate(
        &self,
        session: &SessionId,
        turn: TurnId,
        end: &Finalization,
    ) -> Result<TurnView, StoreError> {
        self.time("regenerate", self.inner.regenerate(session, turn, end))
            .await
    }

    async fn fork(&self, req: Fork<'_>) -> Result<Forked, StoreError> {
        self.time("fork", self.inner.fork(req)).await
    }

    async fn delete_turn(&self, session: &SessionId, turn: TurnId) -> Result<(), StoreError> {
        self.time("delete_turn", self.inner.delete_turn(session, turn))
            .await
    }

    async fn history(
        &self,
        session: &SessionId,
        read: &Options,
        now: Millis,
    ) -> Result<StoredHistory, StoreError> {
        self.time("history", self.inner.history(session, read, now))
            .await
    }

    async fn session_info(
        &self,
        session: &SessionId,
        now: Millis,
    ) -> Result<Option<SessionInfo>, StoreError> {
        self.time("session_info", self.inner.session_info(session, now))
            .await
    }

    async fn clear_session(&self, session: &SessionId) -> Result<(), StoreError> {
        self.time("clear_session", self.inner.clear_session(session))
            .await
    }

    async fn user_sessions(
        &self,
        user: &UserId,
        limit: usize,
        cursor: Option<Millis>,
        now: Millis,
    ) -> Result<SessionsPage, StoreError> {
        self.time(
            "user_sessions",
            self.inner.user_sessions(user, limit, cursor, now),
        )
        .await
    }

    async fn erase_user(&self, user: &UserId, budget: Duration) -> Result<Erased, StoreError> {
        self.time("erase_user", self.inner.erase_user(user, budget))
            .await
    }

    async fn turns_page(
        &self,
        session: &SessionId,
        after_seq: u64,
        max_turns: usize,
        max_bytes: u64,
    ) -> Result<Vec<TurnView>, StoreError> {
        self.time(
            "turns_page",
            self.inner
                .turns_page(session, after_seq, max_turns, max_bytes),
        )
        .await
    }

    async fn import(&self, req: Import<'_>) -> Result<Imported, StoreError> {
        self.time("import", self.inner.import(req)).await
    }

    async fn lock_summarizing(
        &self,
        session: &SessionId,
        token: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        self.time(
            "lock_summarizing",
            self.inner.lock_summarizing(session, token, ttl),
        )
        .await
    }

    async fn unlock_summarizing(&self, session: &SessionId, token: &str) -> Result<(), StoreError> {
        self.time(
            "unlock_summarizing",
            self.inner.unlock_summarizing(session, token),
        )
        .await
    }

    async fn put_summary(&self, write: SummaryWrite<'_>) -> Result<StoredSummary, StoreError> {
        self.time("put_summary", self.inner.put_summary(write))
            .await
    }

    async fn summary(&self, session: &SessionId) -> Result<Option<StoredSummary>, StoreError> {
        self.time("summary", self.inner.summary(session)).await
    }

    async fn delete_summary(&self, session: &SessionId) -> Result<(), StoreError> {
        self.time("delete_summary", self.inner.delete_summary(session))
            .await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.time("ping", self.inner.ping()).await
    }

    fn pool_status(&self) -> Option<PoolStatus> {
        self.inner.pool_status()
    }
}
