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

/// An English copy of a text, made by a pipeline that translates, with its
/// counts (taken in the same encoding as the original's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct English<T> {
    pub text: String,
    pub tokens: T,
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
    pub english: Option<English<QueryTokens>>,
}

/// A pending turn before the store gives it its `seq`.
#[derive(Debug)]
pub struct NewPendingTurn<'a> {
    pub turn_id: &'a TurnId,
    pub user_query: &'a str,
    pub started_at: Millis,
    pub idempotency_key: Option<&'a str>,
    pub tokens: &'a QueryTokens,
    pub english: Option<&'a English<QueryTokens>>,
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
            english: self.english.cloned(),
        }
    }
}

/// What finalize adds to a pending turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finalization {
    pub final_answer: String,
    pub finalized_at: Millis,
    pub tokens: AnswerTokens,
    pub english: Option<English<AnswerTokens>>,
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

    /// Whether the turn has an English copy of either text.
    pub fn is_translated(&self) -> bool {
        self.start.english.is_some() || self.end.english.is_some()
    }

    /// The texts `lang=en` renders: the English copies where there are.
    pub fn english_texts(&self) -> (&str, &str) {
        (
            self.start
                .english
                .as_ref()
                .map_or(&self.start.user_query, |e| &e.text),
            self.end
                .english
                .as_ref()
                .map_or(&self.end.final_answer, |e| &e.text),
        )
    }

    /// The costs of what `lang=en` renders.
    pub fn english_costs(&self) -> TurnCosts {
        let (query, answer) = self.english_texts();
        TurnCosts::new(
            query,
            self.start
                .english
                .as_ref()
                .map_or(self.start.tokens, |e| e.tokens),
            answer,
            self.end
                .english
                .as_ref()
                .map_or(self.end.tokens, |e| e.tokens),
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
            user_query_en: self.start.english.as_ref().map(|e| e.text.clone()),
            final_answer_en: self.end.english.as_ref().map(|e| e.text.clone()),
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
    /// English copies, when the turn has them (and the texts above are the
    /// originals).
    pub user_query_en: Option<String>,
    pub final_answer_en: Option<String>,
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
