//! The history formats of API.md, and all that a read needs to know of
//! one: how its turns and summary are budgeted, whether its Turn objects
//! bring English copies, and what it renders. A format is added here (and
//! its renderer in `render.rs`): the budget rule (`select.rs`), the stores,
//! the Redis walk and the HTTP layer ask these methods and name no format.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::candidate::SelectedTurn;
use super::render::{AnthropicHistory, Message, messages_with, render_text_with};
use super::select::{Cost, Prelude};
use crate::tokens::{AnswerTokens, Encoding, QueryTokens, SummaryTokens};

/// Per-message overhead of the `messages` rendering, in tokens.
pub const MESSAGE_OVERHEAD: u32 = 4;

/// How a history is returned: `text` (the rendering), `messages` (chat
/// messages), `turns` (Turn objects, budgeted as `text`) or `anthropic`
/// (the Messages API's `system` and `messages`, budgeted as `messages`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
#[schema(as = HistoryFormat)]
pub enum Format {
    #[default]
    Text,
    Messages,
    Turns,
    /// The Messages API's `system` and `messages`, budgeted as `messages`.
    Anthropic,
}

/// How a format's turns and summary count, from the counts stores keep
/// with them (`tokens::TurnCosts`, `SummaryTokens`): what lets a read
/// budget turns it does not load. The Redis walk applies the same shapes
/// (`lua/walk.lua`, told which by `Shape::blocks`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// `text` blocks: a header, then "User: q\nAssistant: a" per turn, a
    /// blank line between turns; the summary's block before them.
    Blocks,
    /// A message per text, each [`MESSAGE_OVERHEAD`] tokens more than its
    /// content; the summary a system message.
    Messages,
}

impl Shape {
    /// The Redis walk's flag: 1 for `Blocks`, 0 for `Messages`.
    pub fn blocks(self) -> bool {
        self == Shape::Blocks
    }
}

/// What a history read returns, as its format renders it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rendering {
    Text(String),
    Messages(Vec<Message>),
    /// The turns themselves (the summary, if any, is returned beside them).
    Turns(Vec<SelectedTurn>),
    Anthropic(AnthropicHistory),
}

impl Rendering {
    /// The exact count of what was rendered, as the format budgets it:
    /// what a read's `token_count` must equal (the tests' oracle).
    /// `summary` is the one a `turns` rendering returns beside its turns
    /// (counted as `text` renders it); the others hold theirs.
    pub fn count(&self, encoding: Encoding, summary: Option<&str>) -> u32 {
        self.count_with(|text| encoding.count(text), summary)
    }

    /// [`Rendering::count`] with any tokenizer's count of a text.
    pub fn count_with(&self, count: impl Fn(&str) -> u32, summary: Option<&str>) -> u32 {
        match self {
            Rendering::Text(text) => count(text),
            Rendering::Messages(messages) => messages
                .iter()
                .map(|m| count(&m.content).saturating_add(MESSAGE_OVERHEAD))
                .fold(0, u32::saturating_add),
            Rendering::Turns(turns) => count(&render_text_with(summary, turns)),
            Rendering::Anthropic(h) => h
                .texts()
                .map(|text| count(text).saturating_add(MESSAGE_OVERHEAD))
                .fold(0, u32::saturating_add),
        }
    }
}

impl Format {
    pub const ALL: [Format; 4] = [
        Format::Text,
        Format::Messages,
        Format::Turns,
        Format::Anthropic,
    ];

    /// How its turns and summary count from their stored counts, which
    /// the Redis walk applies too (see [`Shape`]).
    pub fn shape(self) -> Shape {
        match self {
            Format::Text | Format::Turns => Shape::Blocks,
            Format::Messages | Format::Anthropic => Shape::Messages,
        }
    }

    /// Whether its Turn objects show the English copies of translated
    /// turns beside their texts (a store then reads the copies too).
    pub fn shows_copies(self) -> bool {
        self == Format::Turns
    }

    /// What every rendering with a turn in it counts besides its turns and
    /// summary.
    pub fn header(self, encoding: Encoding) -> u32 {
        match self.shape() {
            Shape::Blocks => encoding.header_count(),
            Shape::Messages => 0,
        }
    }

    /// What a turn costs in `encoding`: `query` and `answer` are its texts
    /// as the read renders them, each with its stored counts when they
    /// apply (same encoding, not cut); the others are counted now.
    pub fn cost(
        self,
        encoding: Encoding,
        query: (&str, Option<QueryTokens>),
        answer: (&str, Option<AnswerTokens>),
    ) -> Cost {
        let bytes = (query.0.len() + answer.0.len()) as u64;
        let q = || {
            query
                .1
                .unwrap_or_else(|| QueryTokens::count(encoding, query.0))
        };
        let a = || {
            answer
                .1
                .unwrap_or_else(|| AnswerTokens::count(encoding, answer.0))
        };
        let (inner, last) = match self.shape() {
            Shape::Blocks => {
                let (q, a) = (q(), a());
                (
                    q.user_line + a.assistant_sep,
                    q.user_line + a.assistant_last,
                )
            }
            Shape::Messages => {
                let both = q().query + a().answer + 2 * MESSAGE_OVERHEAD;
                (both, both)
            }
        };
        Cost { inner, last, bytes }
    }

    /// What a summary adds before the turns, from its counts in the read's
    /// encoding.
    pub fn prelude(self, summary: &str, t: &SummaryTokens) -> Prelude {
        let bytes = summary.len() as u64;
        match self.shape() {
            Shape::Blocks => Prelude {
                alone: t.alone,
                joined: t.joined,
                bytes,
            },
            Shape::Messages => Prelude {
                alone: t.message + MESSAGE_OVERHEAD,
                joined: t.message + MESSAGE_OVERHEAD,
                bytes,
            },
        }
    }

    /// The rendering of a selection (oldest first), after the summary it
    /// begins with, if any.
    pub fn render(self, summary: Option<&str>, turns: Vec<SelectedTurn>) -> Rendering {
        match self {
            Format::Text => Rendering::Text(render_text_with(summary, &turns)),
            Format::Messages => Rendering::Messages(messages_with(summary, turns)),
            Format::Turns => Rendering::Turns(turns),
            Format::Anthropic => Rendering::Anthropic(AnthropicHistory::of(summary, turns)),
        }
    }
}
