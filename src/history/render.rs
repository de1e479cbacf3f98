//! The budget rule and the three renderings of API.md.

use std::borrow::Cow;

use super::tokens::{HEADER, assistant_line, user_line};
use super::{AnswerTokens, Encoding, QueryTokens};
use crate::turn::FinalizedTurn;

/// Per-message overhead of the `messages` rendering, in tokens.
pub const MESSAGE_OVERHEAD: u32 = 4;
pub const TRUNCATION_MARK: &str = " [truncated]";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Text,
    Messages,
    Turns,
}

impl Format {
    pub fn name(self) -> &'static str {
        match self {
            Format::Text => "text",
            Format::Messages => "messages",
            Format::Turns => "turns",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        [Format::Text, Format::Messages, Format::Turns]
            .into_iter()
            .find(|f| f.name() == name)
    }
}

/// What one rendering asks for; every field already validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    pub limit: usize,
    pub max_tokens: u32,
    pub format: Format,
    pub encoding: Encoding,
    pub max_query_chars: Option<usize>,
    pub max_answer_chars: Option<usize>,
    pub keep_first: bool,
}

/// A turn as it goes into the prompt: its contents may be truncated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IncludedTurn<'a> {
    pub turn: &'a FinalizedTurn,
    pub user_query: Cow<'a, str>,
    pub final_answer: Cow<'a, str>,
    pub truncated: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message<'a> {
    pub role: &'static str,
    pub content: Cow<'a, str>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RenderedBody<'a> {
    Text(String),
    Messages(Vec<Message<'a>>),
    Turns(Vec<IncludedTurn<'a>>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered<'a> {
    /// Exact count of what is returned, under `Options::encoding`.
    pub token_count: u32,
    pub included_turns: usize,
    pub body: RenderedBody<'a>,
}

/// Keeps the first `max_chars` Unicode scalar values and marks the cut.
fn truncate(text: &str, max_chars: Option<usize>) -> (Cow<'_, str>, bool) {
    let Some(max) = max_chars else {
        return (Cow::Borrowed(text), false);
    };
    match text.char_indices().nth(max) {
        None => (Cow::Borrowed(text), false),
        Some((cut, _)) => {
            let mut s = String::with_capacity(cut + TRUNCATION_MARK.len());
            s.push_str(&text[..cut]);
            s.push_str(TRUNCATION_MARK);
            (Cow::Owned(s), true)
        }
    }
}

/// A candidate with what it costs in each position.
struct Candidate<'a> {
    turn: IncludedTurn<'a>,
    /// Followed by another block (`text`), or its two messages (`messages`).
    cost_inner: u32,
    /// As the newest block (`text`); same as `cost_inner` for `messages`.
    cost_newest: u32,
}

impl<'a> Candidate<'a> {
    fn new(turn: &'a FinalizedTurn, opts: &Options) -> Self {
        let (user_query, query_cut) = truncate(&turn.start.user_query, opts.max_query_chars);
        let (final_answer, answer_cut) = truncate(&turn.end.final_answer, opts.max_answer_chars);
        let enc = opts.encoding;
        // Stored counts hold for untouched text under the same encoding;
        // anything else is counted now.
        let q = match turn.start.tokens {
            t if t.encoding == enc && !query_cut => t,
            _ => QueryTokens::count(enc, &user_query),
        };
        let a = match turn.end.tokens {
            t if t.encoding == enc && !answer_cut => t,
            _ => AnswerTokens::count(enc, &final_answer),
        };
        let (cost_inner, cost_newest) = match opts.format {
            Format::Text | Format::Turns => (
                q.user_line + a.assistant_sep,
                q.user_line + a.assistant_last,
            ),
            Format::Messages => {
                let both = q.query + a.answer + 2 * MESSAGE_OVERHEAD;
                (both, both)
            }
        };
        Candidate {
            turn: IncludedTurn {
                turn,
                user_query,
                final_answer,
                truncated: query_cut || answer_cut,
            },
            cost_inner,
            cost_newest,
        }
    }
}

/// Running cost of a selection: every chosen turn at its inner cost, except
/// the newest at its newest cost, plus the header for `text`/`turns`.
struct Budget {
    base: u32,
    inner_sum: u64,
    newest: Option<(u64, u32, u32)>, // (seq, cost_inner, cost_newest)
    max: u32,
}

impl Budget {
    fn total_with(&self, c: &Candidate<'_>) -> u64 {
        let seq = c.turn.turn.seq();
        let inner_sum = self.inner_sum + u64::from(c.cost_inner);
        let newest = match self.newest {
            Some(n) if n.0 > seq => n,
            _ => (seq, c.cost_inner, c.cost_newest),
        };
        u64::from(self.base) + inner_sum - u64::from(newest.1) + u64::from(newest.2)
    }

    /// Adds `c` if the whole still fits.
    fn try_add(&mut self, c: &Candidate<'_>) -> bool {
        if self.total_with(c) > u64::from(self.max) {
            return false;
        }
        self.inner_sum += u64::from(c.cost_inner);
        let seq = c.turn.turn.seq();
        if self.newest.is_none_or(|n| n.0 < seq) {
            self.newest = Some((seq, c.cost_inner, c.cost_newest));
        }
        true
    }

    fn total(&self) -> u32 {
        match self.newest {
            None => 0,
            Some((_, inner, newest)) => {
                let t =
                    u64::from(self.base) + self.inner_sum - u64::from(inner) + u64::from(newest);
                u32::try_from(t).unwrap_or(u32::MAX)
            }
        }
    }
}

/// Selects and renders. `newest_first` holds the most recent finalized turns
/// (at least `opts.limit` of them when the session has that many), newest
/// first; `first` is the session's oldest kept turn, needed for `keep_first`.
///
/// Turns are taken newest first and kept whole; the first that does not fit
/// stops the selection. With `keep_first`, the first turn is reserved before
/// the others and is the only turn allowed to stand apart from the run.
pub fn render<'a>(
    newest_first: &'a [FinalizedTurn],
    first: Option<&'a FinalizedTurn>,
    opts: &Options,
) -> Rendered<'a> {
    let base = match opts.format {
        Format::Text | Format::Turns => opts.encoding.header_count(),
        Format::Messages => 0,
    };
    let mut budget = Budget {
        base,
        inner_sum: 0,
        newest: None,
        max: opts.max_tokens,
    };
    let mut chosen: Vec<Candidate<'a>> = Vec::new();
    let mut room = opts.limit;

    let first = first.filter(|_| opts.keep_first && room > 0);
    if let Some(f) = first {
        let c = Candidate::new(f, opts);
        if !budget.try_add(&c) {
            return empty(opts.format);
        }
        chosen.push(c);
        room -= 1;
    }
    let first_seq = first.map(FinalizedTurn::seq);
    for turn in newest_first {
        if room == 0 {
            break;
        }
        if Some(turn.seq()) == first_seq {
            continue; // already reserved
        }
        let c = Candidate::new(turn, opts);
        if !budget.try_add(&c) {
            break;
        }
        chosen.push(c);
        room -= 1;
    }
    if chosen.is_empty() {
        return empty(opts.format);
    }
    chosen.sort_by_key(|c| c.turn.turn.seq());
    let token_count = budget.total();
    let included_turns = chosen.len();
    let turns = chosen.into_iter().map(|c| c.turn);
    let body = match opts.format {
        Format::Text => RenderedBody::Text(render_text(turns)),
        Format::Turns => RenderedBody::Turns(turns.collect()),
        Format::Messages => RenderedBody::Messages(
            turns
                .flat_map(|t| {
                    [
                        Message {
                            role: "user",
                            content: t.user_query,
                        },
                        Message {
                            role: "assistant",
                            content: t.final_answer,
                        },
                    ]
                })
                .collect(),
        ),
    };
    Rendered {
        token_count,
        included_turns,
        body,
    }
}

fn empty<'a>(format: Format) -> Rendered<'a> {
    let body = match format {
        Format::Text => RenderedBody::Text(String::new()),
        Format::Messages => RenderedBody::Messages(Vec::new()),
        Format::Turns => RenderedBody::Turns(Vec::new()),
    };
    Rendered {
        token_count: 0,
        included_turns: 0,
        body,
    }
}

/// The `text` rendering of turns in order; "" when there are none.
pub fn render_text<'a>(turns: impl IntoIterator<Item = IncludedTurn<'a>>) -> String {
    let mut out = String::new();
    for t in turns {
        if out.is_empty() {
            out.push_str(HEADER);
        } else {
            out.push_str("\n\n");
        }
        out.push_str(&user_line(&t.user_query));
        out.push_str(&assistant_line(&t.final_answer, false));
    }
    out
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::domain::TurnId;
    use crate::turn::{Finalization, PendingTurn};

    fn turn(seq: u64, q: &str, a: &str) -> FinalizedTurn {
        let enc = Encoding::O200kBase;
        FinalizedTurn {
            start: PendingTurn {
                seq,
                turn_id: TurnId::generate(),
                user_query: q.into(),
                started_at: 1,
                idempotency_key: None,
                tokens: QueryTokens::count(enc, q),
            },
            end: Finalization {
                final_answer: a.into(),
                finalized_at: 2,
                tokens: AnswerTokens::count(enc, a),
            },
        }
    }

    fn opts(format: Format, max_tokens: u32) -> Options {
        Options {
            limit: 20,
            max_tokens,
            format,
            encoding: Encoding::O200kBase,
            max_query_chars: None,
            max_answer_chars: None,
            keep_first: false,
        }
    }

    fn newest_first(turns: &[FinalizedTurn]) -> Vec<FinalizedTurn> {
        turns.iter().rev().cloned().collect()
    }

    fn text(r: &Rendered<'_>) -> String {
        match &r.body {
            RenderedBody::Text(s) => s.clone(),
            other => panic!("not text: {other:?}"),
        }
    }

    fn fresh_count(r: &Rendered<'_>, enc: Encoding) -> u32 {
        match &r.body {
            RenderedBody::Text(s) => enc.count(s),
            RenderedBody::Turns(ts) => enc.count(&render_text(ts.iter().cloned())),
            RenderedBody::Messages(ms) => ms
                .iter()
                .map(|m| enc.count(&m.content) + MESSAGE_OVERHEAD)
                .sum(),
        }
    }

    #[test]
    fn text_renders_exactly_as_the_contract() {
        let turns = [turn(1, "q1", "a1"), turn(2, "q2", "a2")];
        let nf = newest_first(&turns);
        let r = render(&nf, None, &opts(Format::Text, 4096));
        assert_eq!(
            text(&r),
            "### Conversation history:\nUser: q1\nAssistant: a1\n\nUser: q2\nAssistant: a2"
        );
        assert_eq!(r.token_count, Encoding::O200kBase.count(&text(&r)));
        assert_eq!(r.included_turns, 2);
    }

    #[test]
    fn empty_history_renders_empty_string_and_zero_tokens() {
        let r = render(&[], None, &opts(Format::Text, 4096));
        assert_eq!(text(&r), "");
        assert_eq!(r.token_count, 0);
    }

    #[test]
    fn first_turn_that_does_not_fit_stops_the_selection() {
        let big = "word ".repeat(200);
        let turns = [
            turn(1, "tiny", "tiny"),
            turn(2, "q", &big),
            turn(3, "q3", "a3"),
        ];
        let nf = newest_first(&turns);
        let r = render(&nf, None, &opts(Format::Text, 60));
        assert_eq!(
            r.included_turns, 1,
            "turn 1 fits but must not skip over turn 2"
        );
        assert!(text(&r).contains("q3") && !text(&r).contains("tiny"));
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
        let nf = newest_first(&turns);
        let mut o = opts(Format::Text, 60);
        o.keep_first = true;
        let r = render(&nf, turns.first(), &o);
        let t = text(&r);
        assert_eq!(r.included_turns, 3);
        assert!(
            t.starts_with("### Conversation history:\nUser: goal\n"),
            "{t}"
        );
        assert!(t.ends_with("User: q3\nAssistant: a3\n\nUser: q4\nAssistant: a4"));
        assert_eq!(r.token_count, Encoding::O200kBase.count(&t));
    }

    #[test]
    fn keep_first_with_no_room_for_the_first_turn_keeps_nothing() {
        let big = "word ".repeat(200);
        let turns = [turn(1, "goal", &big), turn(2, "q2", "a2")];
        let nf = newest_first(&turns);
        let mut o = opts(Format::Text, 60);
        o.keep_first = true;
        let r = render(&nf, turns.first(), &o);
        assert_eq!(r.included_turns, 0);
        assert_eq!(r.token_count, 0);
    }

    #[test]
    fn limit_counts_the_kept_first_turn() {
        let turns: Vec<_> = (1..=5).map(|i| turn(i, "q", "a")).collect();
        let nf = newest_first(&turns);
        let mut o = opts(Format::Turns, 4096);
        o.keep_first = true;
        o.limit = 2;
        let r = render(&nf, turns.first(), &o);
        let RenderedBody::Turns(ts) = &r.body else {
            panic!()
        };
        assert_eq!(ts.iter().map(|t| t.turn.seq()).collect::<Vec<_>>(), [1, 5]);
    }

    #[test]
    fn truncation_cuts_chars_and_marks_the_turn() {
        let turns = [turn(1, "héllo wörld", "ünïcode ✓ answer")];
        let mut o = opts(Format::Turns, 4096);
        o.max_answer_chars = Some(9);
        o.max_query_chars = Some(50);
        let r = render(&turns, None, &o);
        let RenderedBody::Turns(ts) = &r.body else {
            panic!()
        };
        assert_eq!(ts[0].final_answer, "ünïcode ✓ [truncated]");
        assert_eq!(ts[0].user_query, "héllo wörld");
        assert!(ts[0].truncated);
        assert_eq!(r.token_count, fresh_count(&r, Encoding::O200kBase));
    }

    #[test]
    fn messages_count_contents_plus_overhead() {
        let turns = [
            turn(1, "What is Rust?", "A language."),
            turn(2, "And Redis?", "A store."),
        ];
        let nf = newest_first(&turns);
        let r = render(&nf, None, &opts(Format::Messages, 4096));
        let RenderedBody::Messages(ms) = &r.body else {
            panic!()
        };
        assert_eq!(ms.len(), 4);
        assert_eq!((ms[0].role, &*ms[0].content), ("user", "What is Rust?"));
        assert_eq!((ms[3].role, &*ms[3].content), ("assistant", "A store."));
        assert_eq!(r.token_count, fresh_count(&r, Encoding::O200kBase));
    }

    #[test]
    fn other_encodings_are_counted_fresh() {
        let turns = [turn(1, "q1!\n", "a1.  "), turn(2, "q2", "a2?\n\n")];
        let nf = newest_first(&turns);
        let mut o = opts(Format::Text, 4096);
        o.encoding = Encoding::Cl100kBase;
        let r = render(&nf, None, &o);
        assert_eq!(r.token_count, Encoding::Cl100kBase.count(&text(&r)));
    }

    fn content() -> impl Strategy<Value = String> {
        // Words, punctuation, digits, newlines, spaces, tabs, CJK, emoji:
        // the characters that change where the pre-tokenizer cuts.
        proptest::collection::vec(
            prop_oneof![
                "[a-zA-Z]{1,8}",
                "[ \t\n\r]{1,4}",
                "[.,!?;:'\"()\\-/]{1,3}",
                "[0-9]{1,5}",
                "[é漢字🙂ß]{1,3}",
                Just("'s".to_string()),
                Just("User:".to_string()),
                Just("<|endoftext|>".to_string()),
            ],
            1..12,
        )
        .prop_map(|parts| parts.concat())
        .prop_filter("non-blank", |s| !s.trim().is_empty())
    }

    fn format() -> impl Strategy<Value = Format> {
        prop_oneof![
            Just(Format::Text),
            Just(Format::Messages),
            Just(Format::Turns)
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        #[test]
        fn token_count_is_exact_and_within_budget(
            pairs in proptest::collection::vec((content(), content()), 0..8),
            max_tokens in 0u32..200,
            format in format(),
            cl100k in any::<bool>(),
            keep_first in any::<bool>(),
            limit in 0usize..10,
            max_query_chars in proptest::option::of(1usize..20),
            max_answer_chars in proptest::option::of(1usize..20),
        ) {
            let turns: Vec<_> = pairs.iter().enumerate()
                .map(|(i, (q, a))| turn(i as u64 + 1, q, a)).collect();
            let nf = newest_first(&turns);
            let encoding = if cl100k { Encoding::Cl100kBase } else { Encoding::O200kBase };
            let o = Options { limit, max_tokens, format, encoding, max_query_chars, max_answer_chars, keep_first };
            let r = render(&nf, turns.first(), &o);
            prop_assert!(r.token_count <= max_tokens);
            prop_assert_eq!(r.token_count, fresh_count(&r, encoding));
            prop_assert!(r.included_turns <= limit);
        }

        #[test]
        fn selection_is_a_contiguous_newest_run(
            pairs in proptest::collection::vec((content(), content()), 1..8),
            max_tokens in 0u32..150,
        ) {
            let turns: Vec<_> = pairs.iter().enumerate()
                .map(|(i, (q, a))| turn(i as u64 + 1, q, a)).collect();
            let nf = newest_first(&turns);
            let r = render(&nf, None, &opts(Format::Turns, max_tokens));
            let RenderedBody::Turns(ts) = &r.body else { panic!() };
            let seqs: Vec<u64> = ts.iter().map(|t| t.turn.seq()).collect();
            let n = turns.len() as u64;
            let expected: Vec<u64> = (n + 1 - seqs.len() as u64..=n).collect();
            prop_assert_eq!(seqs, expected);
        }
    }
}
