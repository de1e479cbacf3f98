//! Turns as the stores keep them. Field names are short on purpose: they are
//! written once per turn into Redis, and Redis memory is paid per byte.

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};

use crate::domain::TurnId;
use crate::history::{AnswerTokens, QueryTokens};

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
///
/// Stored records leave out the turn id: it is the hash field they are
/// stored under (records of layout 2 and older still carry it as `"id"`).
/// Read them with [`PendingTurn::parse`] and [`FinalizedTurn::parse`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingTurn {
    #[serde(rename = "s")]
    pub seq: u64,
    #[serde(rename = "id", default = "TurnId::nil", skip_serializing)]
    pub turn_id: TurnId,
    #[serde(rename = "q")]
    pub user_query: String,
    #[serde(rename = "t")]
    pub started_at: Millis,
    /// So that removing the turn also frees its key.
    #[serde(rename = "k", default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    #[serde(rename = "n")]
    pub tokens: QueryTokens,
}

/// A pending turn before the store gives it its `seq`: the Redis script
/// splices `"s":<seq>,` in front of these fields.
#[derive(Debug, Serialize)]
pub struct NewPendingTurn<'a> {
    #[serde(skip)]
    pub turn_id: &'a TurnId,
    #[serde(rename = "q")]
    pub user_query: &'a str,
    #[serde(rename = "t")]
    pub started_at: Millis,
    #[serde(rename = "k", skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<&'a str>,
    #[serde(rename = "n")]
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finalization {
    #[serde(rename = "a")]
    pub final_answer: String,
    #[serde(rename = "t")]
    pub finalized_at: Millis,
    #[serde(rename = "n")]
    pub tokens: AnswerTokens,
}

/// A complete turn: `{"p": pending, "f": finalization}`, so the Redis script
/// can build it from the two JSON texts without parsing either.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinalizedTurn {
    #[serde(rename = "p")]
    pub start: PendingTurn,
    #[serde(rename = "f")]
    pub end: Finalization,
}

impl FinalizedTurn {
    pub fn seq(&self) -> u64 {
        self.start.seq
    }

    /// A stored record, and the id it is stored under.
    pub fn parse(turn_id: TurnId, json: &str) -> serde_json::Result<Self> {
        let mut turn: Self = serde_json::from_str(json)?;
        turn.start.turn_id = turn_id;
        Ok(turn)
    }
}

impl PendingTurn {
    /// A stored record, and the id it is stored under.
    pub fn parse(turn_id: TurnId, json: &str) -> serde_json::Result<Self> {
        let mut turn: Self = serde_json::from_str(json)?;
        turn.turn_id = turn_id;
        Ok(turn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::Encoding;

    #[test]
    fn timestamps_are_rfc3339_utc_millis() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(1_795_000_000_123), "2026-11-18T11:06:40.123Z");
    }

    #[test]
    fn spliced_pending_json_parses_as_pending_turn() {
        let id = TurnId::generate();
        let tokens = QueryTokens::count(Encoding::O200kBase, "hi");
        let new = NewPendingTurn {
            turn_id: &id,
            user_query: "hi",
            started_at: 5,
            idempotency_key: None,
            tokens: &tokens,
        };
        let json = serde_json::to_string(&new).unwrap();
        let spliced = format!("{{\"s\":7,{}", &json[1..]);
        let parsed = PendingTurn::parse(id, &spliced).unwrap();
        assert_eq!(parsed, new.with_seq(7));
    }

    #[test]
    fn records_leave_out_the_id_and_the_default_encoding() {
        let id = TurnId::generate();
        let turn = FinalizedTurn {
            start: PendingTurn {
                seq: 3,
                turn_id: id,
                user_query: "hi".into(),
                started_at: 5,
                idempotency_key: None,
                tokens: QueryTokens::count(Encoding::O200kBase, "hi"),
            },
            end: Finalization {
                final_answer: "yo".into(),
                finalized_at: 6,
                tokens: AnswerTokens::count(Encoding::O200kBase, "yo"),
            },
        };
        let json = serde_json::to_string(&turn).unwrap();
        assert_eq!(
            json,
            r#"{"p":{"s":3,"q":"hi","t":5,"n":{"q":1,"u":4}},"f":{"a":"yo","t":6,"n":{"a":1,"s":4,"l":3}}}"#
        );
        assert_eq!(FinalizedTurn::parse(id, &json).unwrap(), turn);

        let mut cl100k = turn.clone();
        cl100k.start.tokens.encoding = Encoding::Cl100kBase;
        let json = serde_json::to_string(&cl100k).unwrap();
        assert!(json.contains(r#""n":{"e":"cl100k_base","q":1"#), "{json}");
        assert_eq!(FinalizedTurn::parse(id, &json).unwrap(), cl100k);
    }

    #[test]
    fn layout_2_records_still_parse() {
        let id = TurnId::generate();
        let json = format!(
            r#"{{"p":{{"s":3,"id":"{id}","q":"hi","t":5,"n":{{"e":"o200k_base","q":1,"u":4}}}},"f":{{"a":"yo","t":6,"n":{{"e":"o200k_base","a":1,"s":4,"l":3}}}}}}"#
        );
        let turn = FinalizedTurn::parse(id, &json).unwrap();
        assert_eq!((turn.start.turn_id, turn.seq()), (id, 3));
        assert_eq!(turn.end.tokens.encoding, Encoding::O200kBase);
    }
}
