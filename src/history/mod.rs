//! History for prompts: exact token counts, the budget rule and the three
//! renderings. Pure functions, no I/O.

mod render;
mod tokens;

pub use render::{Format, IncludedTurn, Message, Options, Rendered, RenderedBody, render};
pub use tokens::{AnswerTokens, Encoding, QueryTokens};
