//! History for prompts: the budget rule and the renderings. Pure functions,
//! no I/O (but `template::Templates::load`, once at start); the exact counts
//! they sum live in `tokens`.

mod render;
mod select;
pub mod template;

pub use render::{Message, Role, messages, render_text};
pub use select::{
    BudgetState, Candidate, Content, Cost, Format, MESSAGE_OVERHEAD, Options, SelectedTurn,
    Selection, Selector, StoppedBy, TRUNCATION_MARK, needed_bytes, select,
};
