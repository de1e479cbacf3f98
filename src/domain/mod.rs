//! Validated values. A request becomes these at the edge; inside, nothing re-validates.

pub mod distill;
mod ids;
mod text;

pub use ids::{
    IDENTIFIER_PATTERN, IdempotencyKey, SessionId, TurnId, UserId, is_file_name, is_identifier,
};
pub use text::{FinalAnswer, SummaryText, TextError, UserQuery};
