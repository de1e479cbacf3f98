//! Exactly what a template sees: the globals, and the arguments of `turn`
//! and `summary`. Nothing else of the service reaches a template.

use minijinja::{Value, context};

use super::{Globals, Summary};
use crate::history::candidate::SelectedTurn;
use crate::turn::rfc3339;

/// `session_id` and `user_id` (none when the session has no user).
pub(super) fn globals(g: &Globals<'_>) -> Value {
    context! {
        session_id => g.session_id,
        user_id => g.user_id,
    }
}

/// The argument of `turn`, with its contents as the read renders them
/// (maybe truncated).
pub(super) fn turn(t: &SelectedTurn) -> Value {
    let v = &t.turn;
    context! {
        seq => v.seq,
        turn_id => v.turn_id.to_string(),
        user_query => v.user_query.as_str(),
        final_answer => v.final_answer.as_str(),
        started_at => rfc3339(v.started_at),
        finalized_at => rfc3339(v.finalized_at),
        truncated => t.truncated,
    }
}

/// The argument of `summary`.
pub(super) fn summary(s: &Summary) -> Value {
    context! {
        text => s.text.as_str(),
        through_seq => s.through_seq,
    }
}
