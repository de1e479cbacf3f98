//! History for prompts: the budget rule and the renderings. Pure functions,
//! no I/O (but `template::Templates::load`, once at start); the exact counts
//! they sum live in `tokens`.

mod candidate;
pub mod exact;
mod format;
mod pick;
mod render;
mod select;
pub mod template;
mod window;

pub use candidate::{Candidate, Content, Copies, SelectedTurn, TRUNCATION_MARK, needed_bytes};
pub use format::{Format, MESSAGE_OVERHEAD, Rendering, Shape};
pub use pick::{Picked, Picker};
pub use render::{
    AnthropicHistory, AnthropicMessage, BlockType, CacheControl, CacheType, Message, Role, Speaker,
    TextBlock, chat_messages, chat_system, messages, messages_with, render_text, render_text_with,
};
pub use select::{BudgetState, Cost, Options, Prelude, Selection, Selector, StoppedBy, select};
pub use window::{Window, WindowKind, boundary_from};
