//! Turns as the stores keep them, and timestamps. How a store lays them out
//! (the Redis records) is the store's own business.

use chrono::{DateTime, SecondsFormat, Utc};

use crate::domain::TurnId;
use crate::tokens::{AnswerTokens, QueryTokens, TurnCosts};

/// Milliseconds since the Unix epoch, UTC.
pub type Millis = i64;

pub fn now_millis() -> Millis {
    Utc::now().timestamp_millis()
}

/// RFC 3339, UTC, millisecond precision: `2026-11-22T15:31:01.123Z`.
pub fn rfc3339(ms: Millis) -> String {
    DateTime::<Utc>::from_timestamp_millis(ms)
        .unwrap_or_default()
        .to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// A started turn. Until finalized it is not in the history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingTurn {
    pub seq: u64,
    pub turn_id: TurnId,
    pub user_query: String,
    pub started_at: Millis,
    /// So that removing the turn also frees its key.
    pub idempotency_key: Option<String>,
    pub tokens: QueryTokens,
}

/// A pending turn before the store gives it its `seq`.
#[derive(Debug)]
pub struct NewPendingTurn<'a> {
    pub turn_id: &'a TurnId,
    pub user_query: &'a str,
    pub started_at: Millis,
    pub idempotency_key: Option<&'a str>,
    pub tokens: &'a QueryTokens,
}

impl NewPendingTurn<'_> {
    pub fn with_seq(&self, seq: u64) -> PendingTurn {
        PendingTurn {
            seq,
            turn_id: *self.turn_id,
            user_query: self.user_query.to_owned(),
            started_at: self.started_at,
            idempotency_key: self.idempotency_key.map(str::to_owned),
            tokens: *self.tokens,
        }
    }
}

/// What finalize adds to a pending turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finalization {
    pub final_answer: String,
    pub finalized_at: Millis,
    pub tokens: AnswerTokens,
}

/// A complete turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FinalizedTurn {
    pub start: PendingTurn,
    pub end: Finalization,
}

impl FinalizedTurn {
    pub fn seq(&self) -> u64 {
        self.start.seq
    }

    pub fn costs(&self) -> TurnCosts {
        TurnCosts::new(
            &self.start.user_query,
            self.start.tokens,
            &self.end.final_answer,
            self.end.tokens,
        )
    }

    pub fn view(&self) -> TurnView {
        TurnView {
            turn_id: self.start.turn_id,
            seq: self.start.seq,
            user_query: self.start.user_query.clone(),
            final_answer: self.end.final_answer.clone(),
            started_at: self.start.started_at,
            finalized_at: self.end.finalized_at,
        }
    }
}

/// A finalized turn as an answer shows it: without its counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnView {
    pub turn_id: TurnId,
    pub seq: u64,
    pub user_query: String,
    pub final_answer: String,
    pub started_at: Millis,
    pub finalized_at: Millis,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_rfc3339_utc_millis() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(1_795_000_000_123), "2026-11-18T11:06:40.123Z");
    }
}
