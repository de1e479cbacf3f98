//! The renderings of API.md, of a selection already budgeted.

use serde::Serialize;
use utoipa::ToSchema;

use super::candidate::SelectedTurn;
use crate::tokens::{HEADER, SUMMARY_HEADER, SUMMARY_MESSAGE, assistant_line, user_line};

/// The `text` rendering of turns in order; "" when there are none.
pub fn render_text(turns: &[SelectedTurn]) -> String {
    let size: usize = turns
        .iter()
        .map(|t| t.turn.user_query.len() + t.turn.final_answer.len() + 21)
        .sum();
    let mut out = String::with_capacity(HEADER.len() + size);
    for t in turns {
        if out.is_empty() {
            out.push_str(HEADER);
        } else {
            out.push_str("\n\n");
        }
        out.push_str(&user_line(&t.turn.user_query));
        out.push_str(&assistant_line(&t.turn.final_answer, false));
    }
    out
}

/// Who says a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The summary of earlier turns, first (`summary=true`).
    System,
    User,
    Assistant,
}

impl Role {
    /// As chat APIs and chat templates name it.
    pub fn name(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }
}

/// One message of the `messages` rendering, as chat APIs take it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
#[schema(example = json!({"role": "user", "content": "What is a vector index?"}))]
pub struct Message {
    pub role: Role,
    pub content: String,
}

/// The `text` rendering of a summary and the turns after it: the summary's
/// block alone when no turn follows.
pub fn render_text_with(summary: Option<&str>, turns: &[SelectedTurn]) -> String {
    let Some(summary) = summary else {
        return render_text(turns);
    };
    let mut out = format!("{SUMMARY_HEADER}{summary}");
    if !turns.is_empty() {
        out.push_str("\n\n");
        out.push_str(&render_text(turns));
    }
    out
}

/// The `messages` rendering of a summary (a system message) and the turns.
pub fn messages_with(summary: Option<&str>, turns: Vec<SelectedTurn>) -> Vec<Message> {
    let mut out: Vec<Message> = summary
        .map(|s| Message {
            role: Role::System,
            content: format!("{SUMMARY_MESSAGE}{s}"),
        })
        .into_iter()
        .collect();
    out.extend(messages(turns));
    out
}

/// The `anthropic` rendering: the `system` and `messages` of a request
/// to Anthropic's Messages API, content as text blocks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
#[schema(example = json!({
    "system": [{"type": "text", "text": "Summary of earlier turns: Alice is choosing a vector index."}],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "What is a vector index?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "An index that finds the stored vectors nearest to a query vector.", "cache_control": {"type": "ephemeral"}}]}
    ]
}))]
pub struct AnthropicHistory {
    /// The summary's block, when the history begins with one (absent
    /// otherwise: prepend your own system blocks to it).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub system: Option<Vec<TextBlock>>,
    /// A user and an assistant message per turn, oldest first.
    pub messages: Vec<AnthropicMessage>,
}

/// A message of the Messages API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct AnthropicMessage {
    pub role: Speaker,
    /// One text block.
    pub content: Vec<TextBlock>,
}

/// Who says a message of the Messages API (the summary is in `system`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Speaker {
    User,
    Assistant,
}

/// A text content block.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct TextBlock {
    #[serde(rename = "type")]
    pub kind: BlockType,
    pub text: String,
    /// A prompt-cache breakpoint (`cache_control=true`).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub cache_control: Option<CacheControl>,
}

/// The type of a text block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum BlockType {
    Text,
}

/// A prompt-cache breakpoint: the prefix through this block is cached.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct CacheControl {
    #[serde(rename = "type")]
    pub kind: CacheType,
}

/// The kind of cache a breakpoint asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum CacheType {
    Ephemeral,
}

impl TextBlock {
    fn text(text: String) -> Self {
        TextBlock {
            kind: BlockType::Text,
            text,
            cache_control: None,
        }
    }

    fn mark(&mut self) {
        self.cache_control = Some(CacheControl {
            kind: CacheType::Ephemeral,
        });
    }
}

impl AnthropicHistory {
    /// The summary (in `system`, as the `messages` rendering's system
    /// message says it) and the turns.
    pub fn of(summary: Option<&str>, turns: Vec<SelectedTurn>) -> Self {
        let message = |role, text| AnthropicMessage {
            role,
            content: vec![TextBlock::text(text)],
        };
        AnthropicHistory {
            system: summary.map(|s| vec![TextBlock::text(format!("{SUMMARY_MESSAGE}{s}"))]),
            messages: turns
                .into_iter()
                .flat_map(|t| {
                    [
                        message(Speaker::User, t.turn.user_query),
                        message(Speaker::Assistant, t.turn.final_answer),
                    ]
                })
                .collect(),
        }
    }

    /// Every text, in order: each counts as a message of `messages` does.
    pub fn texts(&self) -> impl Iterator<Item = &str> {
        let system = self.system.iter().flatten();
        let messages = self.messages.iter().flat_map(|m| &m.content);
        system.chain(messages).map(|b| b.text.as_str())
    }

    /// Marks the prompt-cache breakpoints: the end of `system` and of the
    /// last message.
    pub fn mark_breakpoints(&mut self) {
        let last = |b: &mut Vec<TextBlock>| b.last_mut().map(TextBlock::mark);
        self.system.as_mut().map(last);
        self.messages.last_mut().map(|m| last(&mut m.content));
    }
}

/// The system message a chat template's prompt begins with: the caller's
/// `system` text, then (after a blank line) the summary's message.
pub fn chat_system(system: Option<&str>, summary: Option<&str>) -> Option<String> {
    let summary = summary.map(|s| format!("{SUMMARY_MESSAGE}{s}"));
    match (system, summary) {
        (Some(system), Some(summary)) => Some(format!("{system}\n\n{summary}")),
        (Some(system), None) => Some(system.to_owned()),
        (None, summary) => summary,
    }
}

/// The messages a chat template renders: [`chat_system`], then a user and
/// an assistant message per turn.
pub fn chat_messages(
    system: Option<&str>,
    summary: Option<&str>,
    turns: Vec<SelectedTurn>,
) -> Vec<Message> {
    let mut out: Vec<Message> = chat_system(system, summary)
        .map(|content| Message {
            role: Role::System,
            content,
        })
        .into_iter()
        .collect();
    out.extend(messages(turns));
    out
}

/// The `messages` rendering: a user and an assistant message per turn.
pub fn messages(turns: Vec<SelectedTurn>) -> Vec<Message> {
    turns
        .into_iter()
        .flat_map(|t| {
            [
                Message {
                    role: Role::User,
                    content: t.turn.user_query,
                },
                Message {
                    role: Role::Assistant,
                    content: t.turn.final_answer,
                },
            ]
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::domain::TurnId;
    use crate::history::candidate::{Candidate, Content, TRUNCATION_MARK};
    use crate::history::format::Format;
    use crate::history::select::{Options, Selection, StoppedBy, select};
    use crate::history::window::Window;
    use crate::tokens::{AnswerTokens, Encoding, QueryTokens, TurnCosts};

    fn turn(seq: u64, q: &str, a: &str) -> Candidate {
        stored_in(Encoding::O200kBase, seq, q, a)
    }

    /// A candidate whose counts were taken under `enc` when it was written.
    fn stored_in(enc: Encoding, seq: u64, q: &str, a: &str) -> Candidate {
        Candidate {
            turn_id: TurnId::generate(),
            seq,
            started_at: 1,
            finalized_at: 2,
            user_query: Content::whole(q),
            final_answer: Content::whole(a),
            recount: false,
            costs: TurnCosts::new(
                q,
                QueryTokens::count(enc, q),
                a,
                AnswerTokens::count(enc, a),
            ),
            copies: Default::default(),
        }
    }

    fn opts(format: Format, max_tokens: u32) -> Options {
        Options {
            limit: 20,
            max_tokens,
            format,
            ..Options::everything(Encoding::O200kBase)
        }
    }

    /// As a store reads them: every candidate truncated as the read needs.
    fn pick(turns: &[Candidate], o: &Options) -> Selection {
        let read = turns.iter().map(|t| Candidate {
            user_query: Content::for_read(&t.user_query.text, o.max_query_chars),
            final_answer: Content::for_read(&t.final_answer.text, o.max_answer_chars),
            ..t.clone()
        });
        select(read, o)
    }

    fn fresh_count(s: &Selection, format: Format, enc: Encoding) -> u32 {
        format.render(None, s.turns.clone()).count(enc, None)
    }

    #[test]
    fn text_renders_exactly_as_the_contract() {
        let turns = [turn(1, "q1", "a1"), turn(2, "q2", "a2")];
        let s = pick(&turns, &opts(Format::Text, 4096));
        let text = render_text(&s.turns);
        assert_eq!(
            text,
            "### Conversation history:\nUser: q1\nAssistant: a1\n\nUser: q2\nAssistant: a2"
        );
        assert_eq!(s.token_count, Encoding::O200kBase.count(&text));
        assert_eq!(s.stopped_by, None);
    }

    #[test]
    fn empty_history_renders_empty_string_and_zero_tokens() {
        let s = pick(&[], &opts(Format::Text, 4096));
        assert_eq!(render_text(&s.turns), "");
        assert_eq!((s.token_count, s.stopped_by), (0, None));
    }

    #[test]
    fn first_turn_that_does_not_fit_stops_the_selection() {
        let big = "word ".repeat(200);
        let turns = [
            turn(1, "tiny", "tiny"),
            turn(2, "q", &big),
            turn(3, "q3", "a3"),
        ];
        let s = pick(&turns, &opts(Format::Text, 60));
        assert_eq!(
            s.turns.len(),
            1,
            "turn 1 fits but must not skip over turn 2"
        );
        assert_eq!(s.turns[0].turn.seq, 3);
        assert_eq!(s.stopped_by, Some(StoppedBy::MaxTokens));
    }

    #[test]
    fn keep_first_reserves_the_first_turn() {
        let big = "word ".repeat(200);
        let turns = [
            turn(1, "goal", "ok"),
            turn(2, "q", &big),
            turn(3, "q3", "a3"),
            turn(4, "q4", "a4"),
        ];
        let mut o = opts(Format::Text, 60);
        o.keep_first = true;
        let s = pick(&turns, &o);
        let t = render_text(&s.turns);
        assert_eq!(s.turns.len(), 3);
        assert!(
            t.starts_with("### Conversation history:\nUser: goal\n"),
            "{t}"
        );
        assert!(t.ends_with("User: q3\nAssistant: a3\n\nUser: q4\nAssistant: a4"));
        assert_eq!(s.token_count, Encoding::O200kBase.count(&t));
    }

    #[test]
    fn keep_first_with_no_room_for_the_first_turn_keeps_nothing() {
        let big = "word ".repeat(200);
        let turns = [turn(1, "goal", &big), turn(2, "q2", "a2")];
        let mut o = opts(Format::Text, 60);
        o.keep_first = true;
        let s = pick(&turns, &o);
        assert!(s.turns.is_empty());
        assert_eq!(
            (s.token_count, s.stopped_by),
            (0, Some(StoppedBy::MaxTokens))
        );
    }

    #[test]
    fn limit_counts_the_kept_first_turn() {
        let turns: Vec<_> = (1..=5).map(|i| turn(i, "q", "a")).collect();
        let mut o = opts(Format::Turns, 4096);
        o.keep_first = true;
        o.limit = 2;
        let s = pick(&turns, &o);
        assert_eq!(
            s.turns.iter().map(|t| t.turn.seq).collect::<Vec<_>>(),
            [1, 5]
        );
        assert_eq!(s.stopped_by, Some(StoppedBy::Limit));
    }

    #[test]
    fn the_byte_cap_stops_like_the_token_budget() {
        let turns = [
            turn(1, "q1", "a1"),
            turn(2, "q2", "aa2"),
            turn(3, "q3", "a3"),
        ];
        let mut o = opts(Format::Text, 4096);
        o.max_bytes = 8;
        let s = pick(&turns, &o);
        assert_eq!(s.turns.iter().map(|t| t.turn.seq).collect::<Vec<_>>(), [3]);
        assert_eq!((s.bytes, s.stopped_by), (4, Some(StoppedBy::MaxBytes)));
        o.max_bytes = 4 + 5 + 4;
        let s = pick(&turns, &o);
        assert_eq!((s.turns.len(), s.bytes, s.stopped_by), (3, 13, None));
    }

    #[test]
    fn limit_is_named_first_when_bounds_stop_at_the_same_turn() {
        let turns = [turn(1, "q1", "a1"), turn(2, "q2", "a2")];
        let mut o = opts(Format::Text, 0);
        o.limit = 0;
        o.max_bytes = 0;
        assert_eq!(pick(&turns, &o).stopped_by, Some(StoppedBy::Limit));
        o.limit = 1;
        assert_eq!(pick(&turns, &o).stopped_by, Some(StoppedBy::MaxTokens));
        o.max_tokens = 4096;
        assert_eq!(pick(&turns, &o).stopped_by, Some(StoppedBy::MaxBytes));
    }

    #[test]
    fn truncation_cuts_chars_and_marks_the_turn() {
        let turns = [turn(1, "héllo wörld", "ünïcode ✓ answer")];
        let mut o = opts(Format::Turns, 4096);
        o.max_answer_chars = Some(9);
        o.max_query_chars = Some(50);
        let s = pick(&turns, &o);
        assert_eq!(s.turns[0].turn.final_answer, "ünïcode ✓ [truncated]");
        assert_eq!(s.turns[0].turn.user_query, "héllo wörld");
        assert!(s.turns[0].truncated);
        assert_eq!(
            s.token_count,
            fresh_count(&s, Format::Turns, Encoding::O200kBase)
        );
        assert_eq!(
            s.bytes,
            ("héllo wörld".len() + "ünïcode ✓ [truncated]".len()) as u64
        );
    }

    #[test]
    fn messages_count_contents_plus_overhead() {
        let turns = [
            turn(1, "What is Rust?", "A language."),
            turn(2, "And Redis?", "A store."),
        ];
        let s = pick(&turns, &opts(Format::Messages, 4096));
        let ms = messages(s.turns.clone());
        assert_eq!(ms.len(), 4);
        assert_eq!(
            (ms[0].role, ms[0].content.as_str()),
            (Role::User, "What is Rust?")
        );
        assert_eq!(
            (ms[3].role, ms[3].content.as_str()),
            (Role::Assistant, "A store.")
        );
        assert_eq!(
            s.token_count,
            fresh_count(&s, Format::Messages, Encoding::O200kBase)
        );
    }

    #[test]
    fn other_encodings_are_counted_fresh() {
        let turns = [turn(1, "q1!\n", "a1.  "), turn(2, "q2", "a2?\n\n")];
        let mut o = opts(Format::Text, 4096);
        o.encoding = Encoding::Cl100kBase;
        let s = pick(&turns, &o);
        assert_eq!(
            s.token_count,
            Encoding::Cl100kBase.count(&render_text(&s.turns))
        );
    }

    fn content() -> impl Strategy<Value = String> {
        // Words, punctuation, digits, newlines, spaces, tabs, CJK, emoji:
        // the characters that change where the pre-tokenizer cuts.
        proptest::collection::vec(
            prop_oneof![
                "[a-zA-Z]{1,8}",
                "[ \t\n\r]{1,4}",
                "[ \n]{2,9}",
                "[.,!?;:'\"()\\-/]{1,3}",
                "[0-9]{1,5}",
                "[é漢字🙂ß]{1,3}",
                Just("'s".to_string()),
                Just("User:".to_string()),
                Just("<|endoftext|>".to_string()),
                Just("<|fim_prefix|>".to_string()),
                Just(TRUNCATION_MARK.to_string()),
                Just("👩‍👩‍👧".to_string()),
            ],
            1..12,
        )
        .prop_map(|parts| parts.concat())
        .prop_filter("non-blank", |s| !s.trim().is_empty())
    }

    fn format() -> impl Strategy<Value = Format> {
        proptest::sample::select(&Format::ALL[..])
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(600))]

        #[test]
        fn token_count_is_exact_and_within_budget(
            pairs in proptest::collection::vec((content(), content()), 0..8),
            max_tokens in 0u32..200,
            max_bytes in 0u64..300,
            format in format(),
            stored in 0..Encoding::ALL.len(),
            read in 0..Encoding::ALL.len(),
            keep_first in any::<bool>(),
            limit in 0usize..10,
            max_query_chars in proptest::option::of(1usize..20),
            max_answer_chars in proptest::option::of(1usize..20),
            stride in proptest::option::of(2u64..5),
        ) {
            // Stored and read in the same encoding half of the time.
            let stored = Encoding::ALL[stored];
            let encoding = if read % 2 == 0 { stored } else { Encoding::ALL[read] };
            let turns: Vec<_> = pairs.iter().enumerate()
                .map(|(i, (q, a))| stored_in(stored, i as u64 + 1, q, a)).collect();
            let o = Options { limit, max_tokens, max_bytes, format, encoding, max_query_chars,
                              max_answer_chars, keep_first, after_seq: 0, through_seq: u64::MAX,
                              english: false, summary: false, template: None,
                              window: Window::Sliding };
            let sliding = pick(&turns, &o);
            let window = stride.map_or(Window::Sliding, |stride| Window::Stable { stride });
            let s = pick(&turns, &Options { window, ..o.clone() });
            // A stable window is the sliding one without its oldest turns
            // (but the reserved first), as `window.rs` says.
            let first = usize::from(keep_first && !sliding.turns.is_empty());
            let run = sliding.turns[first..].iter().map(|t| t.turn.seq);
            let drops = window.drops(run, sliding.stopped_by.is_some());
            let mut expected = sliding.turns.clone();
            expected.drain(first..first + drops);
            prop_assert_eq!(&s.turns, &expected);
            prop_assert_eq!(s.left_out, drops);
            prop_assert_eq!(s.stopped_by, sliding.stopped_by);
            prop_assert!(s.token_count <= max_tokens);
            prop_assert!(s.bytes <= max_bytes);
            prop_assert_eq!(s.token_count, fresh_count(&s, format, encoding));
            let bytes: usize = s.turns.iter().map(|t| t.turn.user_query.len() + t.turn.final_answer.len()).sum();
            prop_assert_eq!(s.bytes, bytes as u64);
            prop_assert!(s.turns.len() <= limit);
            prop_assert_eq!(s.stopped_by.is_none(), s.turns.len() + s.left_out == turns.len());
        }

        #[test]
        fn selection_is_a_contiguous_newest_run(
            pairs in proptest::collection::vec((content(), content()), 1..8),
            max_tokens in 0u32..150,
        ) {
            let turns: Vec<_> = pairs.iter().enumerate()
                .map(|(i, (q, a))| turn(i as u64 + 1, q, a)).collect();
            let s = pick(&turns, &opts(Format::Turns, max_tokens));
            let seqs: Vec<u64> = s.turns.iter().map(|t| t.turn.seq).collect();
            let n = turns.len() as u64;
            let expected: Vec<u64> = (n + 1 - seqs.len() as u64..=n).collect();
            prop_assert_eq!(seqs, expected);
        }
    }
}
