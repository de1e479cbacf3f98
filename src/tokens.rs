//! Tokenizers, and the counts taken once when a turn is written.
//!
//! The `text` rendering is `header` + block₁ + "\n\n" + block₂ … + blockₙ where
//! block = "User: q\nAssistant: a". Cut it just before each "User:" and each
//! "Assistant:": every cut is a newline followed by a letter, and no piece of
//! the tiktoken pre-tokenizer (o200k, cl100k, p50k, r50k) spans such a pair,
//! so the count of the rendering is the sum of the counts of its parts, each
//! part counted *as it tokenizes when a letter follows*. That is not always
//! its count alone: under p50k and r50k, `\s+(?!\S)` leaves a whitespace run
//! before a letter in two pieces ("\n\n" then "User" is "\n", "\n", "User"),
//! where at the end of a string it is one ("\n\n"). So a part followed by
//! another is counted with a letter after it, less that letter's count
//! (`LETTER`). The parts are counted when the turn is
//! written: `"User: q\n"` at start, `"Assistant: a\n\n"` and `"Assistant: a"`
//! (the newest block, followed by nothing) at finalize. Property tests here
//! and in `history::render` check sums against fresh counts, in every
//! encoding.

use std::sync::OnceLock;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

mod apart;
mod counter;
mod kinds;
mod loaded;
mod models;
mod parts;

pub use apart::apart;
pub use loaded::{Counting, LoadedTokenizer, Tokenizers};
pub use models::{Models, Resolved, UnknownModel};

/// An encoding, by its name: tiktoken's, built in; on a server with
/// `TURNSTORE_TOKENIZERS_DIR`, also the tokenizers it loaded (its
/// document lists them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
pub enum Encoding {
    #[default]
    #[serde(rename = "o200k_base")]
    O200kBase,
    #[serde(rename = "o200k_harmony")]
    O200kHarmony,
    #[serde(rename = "cl100k_base")]
    Cl100kBase,
    #[serde(rename = "p50k_base")]
    P50kBase,
    #[serde(rename = "p50k_edit")]
    P50kEdit,
    #[serde(rename = "r50k_base")]
    R50kBase,
}

pub const HEADER: &str = "### Conversation history:\n";
/// What a summary's block begins with in the `text` rendering.
pub const SUMMARY_HEADER: &str = "### Conversation summary:\n";
/// What a summary's system message begins with in the `messages` rendering.
pub const SUMMARY_MESSAGE: &str = "Summary of the conversation so far:\n";

impl Encoding {
    pub const ALL: [Encoding; 6] = [
        Encoding::O200kBase,
        Encoding::O200kHarmony,
        Encoding::Cl100kBase,
        Encoding::P50kBase,
        Encoding::P50kEdit,
        Encoding::R50kBase,
    ];

    /// One letter per encoding, as the Redis store records the encoding of
    /// stored counts. p50k and r50k counts taken before the joints were
    /// counted before a letter (see the module's doc) are wrong by a token
    /// per joint: they were recorded as 'p', 'e' and 'r', so these counts
    /// take new letters, and [`Encoding::from_legacy_code`] tells the old
    /// ones apart for a recount.
    pub fn code(self) -> u8 {
        match self {
            Encoding::O200kBase => b'o',
            Encoding::O200kHarmony => b'h',
            Encoding::Cl100kBase => b'c',
            Encoding::P50kBase => b'P',
            Encoding::P50kEdit => b'E',
            Encoding::R50kBase => b'R',
        }
    }

    pub fn from_code(code: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|e| e.code() == code)
    }

    /// The encoding of counts recorded under a retired letter: they may be
    /// short and are taken again from the texts.
    pub fn from_legacy_code(code: u8) -> Option<Self> {
        match code {
            b'p' => Some(Encoding::P50kBase),
            b'e' => Some(Encoding::P50kEdit),
            b'r' => Some(Encoding::R50kBase),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Encoding::O200kBase => "o200k_base",
            Encoding::O200kHarmony => "o200k_harmony",
            Encoding::Cl100kBase => "cl100k_base",
            Encoding::P50kBase => "p50k_base",
            Encoding::P50kEdit => "p50k_edit",
            Encoding::R50kBase => "r50k_base",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|e| e.name() == name)
    }

    /// The encoding a model uses, per tiktoken's table; `None` for an unknown model.
    pub fn for_model(model: &str) -> Option<Self> {
        use tiktoken_rs::tokenizer::Tokenizer;
        Some(match tiktoken_rs::tokenizer::get_tokenizer(model)? {
            Tokenizer::O200kBase => Encoding::O200kBase,
            Tokenizer::O200kHarmony => Encoding::O200kHarmony,
            Tokenizer::Cl100kBase => Encoding::Cl100kBase,
            Tokenizer::P50kBase => Encoding::P50kBase,
            Tokenizer::P50kEdit => Encoding::P50kEdit,
            Tokenizer::R50kBase | Tokenizer::Gpt2 => Encoding::R50kBase,
        })
    }

    /// Builds the encoding's ranks now, so the first request does not pay for them.
    pub fn warm_up(self) {
        counter::warm_up(self);
    }

    /// Builds the encoding's ranks on the blocking pool if they are not
    /// built yet: the first read in an encoding other than the default
    /// would otherwise hold its serving thread for their build (~0.1 s;
    /// the default's are built at start).
    pub async fn ready(self) {
        if counter::is_built(self) {
            return;
        }
        if let Err(e) = tokio::task::spawn_blocking(move || self.warm_up()).await
            && e.is_panic()
        {
            std::panic::resume_unwind(e.into_panic());
        }
    }

    /// Exact count of `text` as ordinary text: special-token strings a user
    /// typed count as the text they are, as chat APIs treat them.
    pub fn count(self, text: &str) -> u32 {
        u32::try_from(counter::count(self, text)).unwrap_or(u32::MAX)
    }

    /// Its place in [`Encoding::ALL`]: a slot in a per-encoding array.
    pub fn slot(self) -> usize {
        Self::ALL.iter().position(|e| *e == self).unwrap_or(0)
    }

    /// Count of the `text` rendering's header (followed by "User:"),
    /// cached per encoding.
    pub fn header_count(self) -> u32 {
        static CACHE: [OnceLock<u32>; 6] = [const { OnceLock::new() }; 6];
        *CACHE[self.slot()]
            .get_or_init(|| self.count(&format!("{HEADER}{LETTER}")) - self.count(LETTER))
    }
}

/// Counts of a session's summary, taken when it is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SummaryTokens {
    pub encoding: Encoding,
    /// The summary alone.
    pub text: u32,
    /// Its `text` block with no turns after it: `SUMMARY_HEADER` + summary.
    pub alone: u32,
    /// Its block followed by the history: with "\n\n" after it, counted as
    /// it tokenizes before the history's header (no pre-tokenizer piece
    /// spans a newline and the "#" after it, so the rest counts apart).
    pub joined: u32,
    /// Its system message's content: `SUMMARY_MESSAGE` + summary.
    pub message: u32,
}

impl SummaryTokens {
    pub fn count(encoding: Encoding, summary: &str) -> Self {
        let header = format!("{HEADER}{LETTER}");
        SummaryTokens {
            encoding,
            text: encoding.count(summary),
            alone: encoding.count(&format!("{SUMMARY_HEADER}{summary}")),
            joined: encoding.count(&format!("{SUMMARY_HEADER}{summary}\n\n{header}"))
                - encoding.count(&header),
            message: encoding.count(&format!("{SUMMARY_MESSAGE}{summary}")),
        }
    }
}

/// Counts of a question, taken at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueryTokens {
    pub encoding: Encoding,
    /// `q` alone (the `messages` rendering).
    pub query: u32,
    /// `"User: q\n"`, followed by "Assistant:".
    pub user_line: u32,
}

/// Counts of an answer, taken at finalize.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AnswerTokens {
    pub encoding: Encoding,
    /// `a` alone (the `messages` rendering).
    pub answer: u32,
    /// `"Assistant: a\n\n"`: a block followed by another ("User:").
    pub assistant_sep: u32,
    /// `"Assistant: a"`: the newest block.
    pub assistant_last: u32,
}

/// What the budget rule needs of a finalized turn: its counts and sizes.
/// Stores keep it beside the turn, so that a read can budget without
/// loading the turns it does not return.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TurnCosts {
    pub query: QueryTokens,
    pub answer: AnswerTokens,
    /// UTF-8 bytes of the question and of the answer.
    pub query_bytes: u32,
    pub answer_bytes: u32,
}

impl TurnCosts {
    pub fn new(
        query: &str,
        tokens: QueryTokens,
        answer: &str,
        answer_tokens: AnswerTokens,
    ) -> Self {
        TurnCosts {
            query: tokens,
            answer: answer_tokens,
            query_bytes: u32::try_from(query.len()).unwrap_or(u32::MAX),
            answer_bytes: u32::try_from(answer.len()).unwrap_or(u32::MAX),
        }
    }
}

impl QueryTokens {
    pub fn count(encoding: Encoding, query: &str) -> Self {
        let query_count = encoding.count(query);
        let head = format!("{USER}{query}");
        let head_count = count_with_prefix(encoding, USER, query, query_count);
        let line = count_with_suffix(encoding, &head, head_count, NEWLINE_LETTER);
        QueryTokens {
            encoding,
            query: query_count,
            user_line: line - encoding.count(LETTER),
        }
    }
}

impl AnswerTokens {
    pub fn count(encoding: Encoding, answer: &str) -> Self {
        let answer_count = encoding.count(answer);
        let last = assistant_line(answer, false);
        let assistant_last = count_with_prefix(encoding, ASSISTANT, answer, answer_count);
        let sep = count_with_suffix(encoding, &last, assistant_last, BLANK_LINE_LETTER);
        AnswerTokens {
            encoding,
            answer: answer_count,
            assistant_sep: sep - encoding.count(LETTER),
            assistant_last,
        }
    }
}

/// `count(prefix + text)`, given `count(text)`, tokenizing only `prefix`
/// and the head of `text` when that is exact: no pre-tokenizer piece spans
/// an ASCII letter followed by a space (a piece holding a letter ends with
/// a letter; the space can only begin one), whatever comes before or after.
/// So cut at the first such pair, the pieces after the cut are the same
/// with or without `prefix`, and the pieces before it are those of the head
/// alone. With no such pair the whole of `prefix + text` is counted.
fn count_with_prefix(encoding: Encoding, prefix: &str, text: &str, text_count: u32) -> u32 {
    let cut = text
        .as_bytes()
        .windows(2)
        .position(|w| w[0].is_ascii_alphabetic() && w[1] == b' ');
    let Some(cut) = cut.map(|i| i + 1) else {
        return encoding.count(&format!("{prefix}{text}"));
    };
    let head = &text[..cut];
    text_count - encoding.count(head) + encoding.count(&format!("{prefix}{head}"))
}

/// `count(text + suffix)`, given `count(text)`, without tokenizing `text`
/// again when that is exact: if `text` ends in a run `T` of ASCII
/// non-alphanumerics right after an ASCII letter or digit, no
/// pre-tokenizer piece spans the start of `T` (with or without a suffix of
/// newlines, and a letter after them: no piece spans a newline and a
/// letter), so only `T` and `T + suffix` need counting. Otherwise the
/// whole text is counted again.
fn count_with_suffix(encoding: Encoding, text: &str, text_count: u32, suffix: &str) -> u32 {
    let tail_start = text
        .bytes()
        .rposition(|b| !b.is_ascii() || b.is_ascii_alphanumeric())
        .map_or(0, |i| i + 1);
    let before_tail = text.as_bytes()[..tail_start].last();
    if !before_tail.is_some_and(u8::is_ascii_alphanumeric) {
        return encoding.count(&format!("{text}{suffix}"));
    }
    let tail = &text[tail_start..];
    text_count - encoding.count(tail) + encoding.count(&format!("{tail}{suffix}"))
}

/// What follows every cut of the `text` rendering: the "U" of "User:" or
/// the "A" of "Assistant:" (either gives the same pieces before it).
const LETTER: &str = "U";
/// The suffixes a user line and an inner assistant block are counted with:
/// their newlines, and the letter after them.
const NEWLINE_LETTER: &str = "\nU";
const BLANK_LINE_LETTER: &str = "\n\nU";

pub(crate) const USER: &str = "User: ";
pub(crate) const ASSISTANT: &str = "Assistant: ";

pub(crate) fn user_line(query: &str) -> String {
    let mut s = String::with_capacity(query.len() + 7);
    s.push_str(USER);
    s.push_str(query);
    s.push('\n');
    s
}

pub(crate) fn assistant_line(answer: &str, separated: bool) -> String {
    let mut s = String::with_capacity(answer.len() + 13);
    s.push_str(ASSISTANT);
    s.push_str(answer);
    if separated {
        s.push_str("\n\n");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh count of `text` as it tokenizes with a letter after it.
    fn before_letter(enc: Encoding, text: &str) -> u32 {
        enc.count(&format!("{text}{LETTER}")) - enc.count(LETTER)
    }

    #[test]
    fn a_blank_line_before_a_letter_is_two_pieces_in_p50k_and_r50k() {
        // The joint that summing counts of parts alone got wrong.
        for enc in [Encoding::P50kBase, Encoding::P50kEdit, Encoding::R50kBase] {
            assert_eq!(enc.count("\n\n"), 1, "{enc:?}");
            assert_eq!(before_letter(enc, "\n\n"), 2, "{enc:?}");
            let a = AnswerTokens::count(enc, "Done.");
            assert_eq!(a.assistant_sep, a.assistant_last + 2, "{enc:?}");
        }
        for enc in [Encoding::O200kBase, Encoding::Cl100kBase] {
            assert_eq!(before_letter(enc, "\n\n"), enc.count("\n\n"), "{enc:?}");
        }
    }

    #[test]
    fn header_counts_as_it_is_followed() {
        for enc in Encoding::ALL {
            assert_eq!(enc.header_count(), before_letter(enc, HEADER), "{enc:?}");
        }
    }

    #[test]
    fn names_round_trip() {
        for e in Encoding::ALL {
            assert_eq!(Encoding::from_name(e.name()), Some(e));
            let json = serde_json::to_string(&e).unwrap();
            assert_eq!(json, format!("\"{}\"", e.name()));
        }
        assert_eq!(Encoding::from_name("gpt-4o"), None);
        for e in Encoding::ALL {
            assert_eq!(Encoding::from_code(e.code()), Some(e));
            assert_eq!(Encoding::from_legacy_code(e.code()), None);
        }
    }

    proptest::proptest! {
        /// A summary's block counts as it tokenizes in the rendering, alone
        /// or followed by the history, in every encoding.
        #[test]
        fn summary_blocks_count_as_rendered(
            summary in "[a-z .!\\n#\u{1F642}]{1,40}",
            turns in proptest::collection::vec(("[a-z ?\\n]{1,12}", "[a-z .\\n]{1,12}"), 1..3),
            encoding in 0..Encoding::ALL.len(),
        ) {
            let enc = Encoding::ALL[encoding];
            let t = SummaryTokens::count(enc, &summary);
            proptest::prop_assert_eq!(t.alone, enc.count(&format!("{SUMMARY_HEADER}{summary}")));
            let mut blocks = String::new();
            let mut sum = 0;
            for (i, (q, a)) in turns.iter().enumerate() {
                let last = i + 1 == turns.len();
                blocks.push_str(&user_line(q));
                blocks.push_str(&assistant_line(a, !last));
                let (qt, at) = (QueryTokens::count(enc, q), AnswerTokens::count(enc, a));
                sum += qt.user_line + if last { at.assistant_last } else { at.assistant_sep };
            }
            let rendered = format!("{SUMMARY_HEADER}{summary}\n\n{HEADER}{blocks}");
            proptest::prop_assert_eq!(t.joined + enc.header_count() + sum, enc.count(&rendered));
        }
    }

    #[test]
    fn models_map_to_their_encodings() {
        assert_eq!(Encoding::for_model("gpt-4o"), Some(Encoding::O200kBase));
        assert_eq!(Encoding::for_model("gpt-4"), Some(Encoding::Cl100kBase));
        assert_eq!(Encoding::for_model("no-such-model"), None);
    }

    #[test]
    fn counts_are_tiktokens() {
        assert_eq!(Encoding::Cl100kBase.count("hello world"), 2);
        assert_eq!(Encoding::O200kBase.count(""), 0);
    }

    #[test]
    fn every_ordinary_token_is_ranked() {
        for (enc, n) in [
            (Encoding::O200kBase, 199_998),
            (Encoding::O200kHarmony, 199_998),
            (Encoding::Cl100kBase, 100_256),
            (Encoding::P50kBase, 50_280),
            (Encoding::P50kEdit, 50_280),
            (Encoding::R50kBase, 50_256),
        ] {
            assert_eq!(counter::ranked(enc), n, "{enc:?}");
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(6000))]

        /// The per-thread counter counts as tiktoken-rs' encoder does:
        /// texts of every kind, and texts dense with whitespace, where the
        /// pattern's lookahead was.
        #[test]
        fn counts_equal_tiktoken_rs(
            text in proptest::prop_oneof![
                "[ \t\n\r\u{a0}\u{2003}\u{3000}\u{85}abC1.'!漢]{0,40}",
                "( |\n|\r\n|\t|  \n|\n\n| [a-z]+|[a-z]+|[0-9]+|[.!?]|'s)*",
                "([a-zA-Z0-9 .,!?'\"()\\-:;\t\r\n/éÉß漢字🙂…\u{301}\u{a0}]|\n\n\n|   \
                 |<\\|endoftext\\|>|'ll|'S|1234567|[a-zé]{100,130}|[ \n]{100,120})*",
            ],
            encoding in 0..Encoding::ALL.len(),
        ) {
            static TIKTOKEN: [OnceLock<tiktoken_rs::CoreBPE>; 6] = [const { OnceLock::new() }; 6];
            let enc = Encoding::ALL[encoding];
            let bpe = TIKTOKEN[enc.slot()].get_or_init(|| counter::tiktoken(enc));
            proptest::prop_assert_eq!(enc.count(&text) as usize, bpe.encode_ordinary(&text).len());
        }
    }

    #[test]
    fn special_token_text_counts_as_text() {
        assert!(Encoding::Cl100kBase.count("<|endoftext|>") > 1);
    }

    #[test]
    fn suffix_counts_match_a_fresh_count() {
        for enc in Encoding::ALL {
            for text in [
                "Assistant: Done.",
                "Assistant: Done",
                "Assistant: 2024",
                "Assistant: it's",
                "Assistant: (see above)  \n",
                "Assistant: ok!\r\n\t ",
                "Assistant: 漢字。",
                "Assistant: café…",
                "Assistant: 🙂",
                "Assistant: x'",
            ] {
                for suffix in ["\n\n", NEWLINE_LETTER, BLANK_LINE_LETTER] {
                    let whole = enc.count(&format!("{text}{suffix}"));
                    assert_eq!(
                        count_with_suffix(enc, text, enc.count(text), suffix),
                        whole,
                        "{enc:?} {text:?} {suffix:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn prefix_counts_match_a_fresh_count() {
        for enc in Encoding::ALL {
            for text in [
                "The answer is 42.",
                "it's here",
                "Done",
                "  leading spaces then words",
                "\nnewline first, then words",
                "2024 was a year",
                "漢字 and words",
                "café au lait",
                "a b",
                "x",
                "",
                "ÉTÉ chaud",
                "ab\u{301} combining",
            ] {
                for prefix in [USER, ASSISTANT] {
                    let whole = enc.count(&format!("{prefix}{text}"));
                    assert_eq!(
                        count_with_prefix(enc, prefix, text, enc.count(text)),
                        whole,
                        "{enc:?} {prefix:?} {text:?}"
                    );
                }
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]

        #[test]
        fn write_time_counts_are_exact(
            text in "([a-zA-Z0-9 .,!?'\"()\\-:;\t\r\n/é漢🙂…\u{301}]|\n\n\n|   |<\\|endoftext\\|>| \\[truncated\\])*",
            encoding in 0..Encoding::ALL.len(),
        ) {
            let enc = Encoding::ALL[encoding];
            let q = QueryTokens::count(enc, &text);
            proptest::prop_assert_eq!(q.query, enc.count(&text));
            proptest::prop_assert_eq!(q.user_line, before_letter(enc, &user_line(&text)));
            let a = AnswerTokens::count(enc, &text);
            proptest::prop_assert_eq!(a.answer, enc.count(&text));
            proptest::prop_assert_eq!(a.assistant_last, enc.count(&assistant_line(&text, false)));
            proptest::prop_assert_eq!(a.assistant_sep, before_letter(enc, &assistant_line(&text, true)));
        }

        #[test]
        fn suffix_count_is_exact(
            body in "[a-zA-Z0-9 .,!?'\"()\\-:;\t\r\n/é漢🙂…]{0,40}",
            encoding in 0..Encoding::ALL.len(),
        ) {
            let enc = Encoding::ALL[encoding];
            let text = format!("Assistant: {body}");
            for suffix in ["\n\n", NEWLINE_LETTER, BLANK_LINE_LETTER] {
                let fresh = enc.count(&format!("{text}{suffix}"));
                proptest::prop_assert_eq!(count_with_suffix(enc, &text, enc.count(&text), suffix), fresh);
            }
        }
    }

    #[test]
    fn huge_whitespace_runs_do_not_panic() {
        for (enc, text) in [
            (Encoding::O200kBase, format!("a{}b", " \n".repeat(300_000))),
            (Encoding::Cl100kBase, " ".repeat(1_000_000)),
        ] {
            let fresh = counter::tiktoken(enc).encode_ordinary(&text).len();
            assert_eq!(enc.count(&text) as usize, fresh, "{enc:?}");
        }
    }
}
