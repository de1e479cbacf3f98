//! A turn in a read, below both selections (`select`'s rule and the
//! template selector) and the templates that render it: as a store offers
//! it to a selection (`Candidate`, whose `Content` may be only the
//! beginning a read needs) and as a selection takes it (`SelectedTurn`,
//! its contents cut by `truncate`).

use crate::domain::TurnId;
use crate::tokens::TurnCosts;
use crate::turn::{Millis, TurnView};

pub const TRUNCATION_MARK: &str = " [truncated]";

/// A text as a read sees it: whole, or only its beginning when the read
/// truncates it and the text is longer than the truncation keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Content {
    pub text: String,
    pub whole: bool,
}

/// How many bytes of a text a read truncating it to `max_chars` characters
/// needs: `max_chars + 1` characters take at most four bytes each, and one
/// character past the cut tells that there was a cut.
pub fn needed_bytes(max_chars: usize) -> usize {
    max_chars.saturating_add(1).saturating_mul(4)
}

impl Content {
    pub fn whole(text: impl Into<String>) -> Self {
        Content {
            text: text.into(),
            whole: true,
        }
    }

    /// What a read truncating to `max_chars` needs of `text`.
    pub fn for_read(text: &str, max_chars: Option<usize>) -> Self {
        match max_chars.map(needed_bytes) {
            Some(n) if text.len() > n => {
                let mut cut = n;
                while !text.is_char_boundary(cut) {
                    cut -= 1;
                }
                Content {
                    text: text[..cut].to_owned(),
                    whole: false,
                }
            }
            _ => Content::whole(text),
        }
    }

    /// The first bytes of a text of `full_len` bytes, maybe cut inside a
    /// character (the cut character is dropped). `None` if not UTF-8.
    pub fn from_prefix(mut bytes: Vec<u8>, full_len: usize) -> Option<Self> {
        let whole = bytes.len() >= full_len;
        if !whole && let Err(e) = std::str::from_utf8(&bytes) {
            if e.error_len().is_some() {
                return None;
            }
            bytes.truncate(e.valid_up_to());
        }
        String::from_utf8(bytes)
            .ok()
            .map(|text| Content { text, whole })
    }
}

/// A finalized turn offered to a selection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub turn_id: TurnId,
    pub seq: u64,
    pub started_at: Millis,
    pub finalized_at: Millis,
    pub user_query: Content,
    pub final_answer: Content,
    /// As stored: they hold for whole contents in their own encodings.
    pub costs: TurnCosts,
    /// The stored counts may be short (recorded under a retired rule, see
    /// [`crate::tokens::Encoding::code`]): they are taken again.
    pub recount: bool,
    /// English copies to show beside the texts (a `turns` read; with
    /// `lang=en`, the texts are the copies where there are, and these the
    /// same again); not rendered, so not counted.
    pub copies: Copies,
}

/// The English copies a candidate carries, as the read needs them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Copies {
    pub user_query: Option<Content>,
    pub final_answer: Option<Content>,
}

/// A turn as it goes into the history: its contents may be truncated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelectedTurn {
    pub turn: TurnView,
    /// A content was cut (the stored turn is whole).
    pub truncated: bool,
}

/// Keeps the first `max_chars` Unicode scalar values and marks the cut. A
/// content that is only a beginning holds more than `max_chars` of them.
pub(super) fn truncate(content: Content, max_chars: Option<usize>) -> (String, bool) {
    let Some(max) = max_chars else {
        return (content.text, false);
    };
    match content.text.char_indices().nth(max) {
        None => (content.text, false),
        Some((cut, _)) => {
            let mut s = content.text;
            s.truncate(cut);
            s.push_str(TRUNCATION_MARK);
            (s, true)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_keep_enough_characters_to_see_the_cut() {
        let text = "🙂".repeat(10);
        let c = Content::for_read(&text, Some(3));
        assert!(!c.whole);
        assert_eq!(c.text.chars().count(), 4);
        let (cut, truncated) = truncate(c, Some(3));
        assert!(truncated);
        assert_eq!(cut, format!("🙂🙂🙂{TRUNCATION_MARK}"));

        let short = Content::for_read("abc", Some(3));
        assert!(short.whole);
        assert_eq!(truncate(short, Some(3)), ("abc".into(), false));
    }

    #[test]
    fn a_prefix_cut_inside_a_character_drops_it() {
        let text = "aé🙂b";
        for cut in 0..text.len() {
            let c = Content::from_prefix(text.as_bytes()[..cut].to_vec(), text.len()).unwrap();
            assert!(!c.whole);
            assert!(text.starts_with(&c.text));
            assert!(c.text.len() + 3 >= cut);
        }
        let whole = Content::from_prefix(text.as_bytes().to_vec(), text.len()).unwrap();
        assert!(whole.whole);
        assert_eq!(Content::from_prefix(vec![0xff, b'a'], 5), None);
    }

    #[test]
    fn a_prefix_of_needed_bytes_always_holds_one_character_more() {
        for max in 0..6 {
            for text in [
                "",
                "a",
                "abcdefghijklmnop",
                "🙂🙂🙂🙂🙂🙂🙂🙂",
                "aé漢🙂aé漢🙂aé漢🙂",
            ] {
                let n = needed_bytes(max).min(text.len());
                let mut cut = n;
                while !text.is_char_boundary(cut) {
                    cut -= 1;
                }
                let from_bytes =
                    Content::from_prefix(text.as_bytes()[..n].to_vec(), text.len()).unwrap();
                let for_read = Content::for_read(text, Some(max));
                assert_eq!(from_bytes, for_read, "{text:?} {max}");
                let expected = truncate(Content::whole(text), Some(max));
                assert_eq!(truncate(for_read, Some(max)), expected, "{text:?} {max}");
            }
        }
    }
}
