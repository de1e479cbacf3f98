//! The texts turnstore keeps: the user's question, the final answer, and a
//! session's summary.

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextError {
    /// Empty or only whitespace: 422.
    Empty,
    /// Longer than the configured maximum: 413.
    TooLarge { max_bytes: usize },
}

impl fmt::Display for TextError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TextError::Empty => f.write_str("must not be empty or whitespace only"),
            TextError::TooLarge { max_bytes } => {
                write!(f, "must be at most {max_bytes} bytes of UTF-8")
            }
        }
    }
}

fn check(s: &str, max_bytes: usize) -> Result<(), TextError> {
    if s.trim().is_empty() {
        Err(TextError::Empty)
    } else if s.len() > max_bytes {
        Err(TextError::TooLarge { max_bytes })
    } else {
        Ok(())
    }
}

macro_rules! text {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct $name(String);

        impl $name {
            /// Kept exactly as given (no trimming): the history shows what was said.
            pub fn parse(s: String, max_bytes: usize) -> Result<Self, TextError> {
                check(&s, max_bytes).map(|()| Self(s))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }

            pub fn into_string(self) -> String {
                self.0
            }
        }
    };
}

text!(
    /// The user's question.
    UserQuery
);
text!(
    /// The answer the pipeline finally gave.
    FinalAnswer
);
text!(
    /// A session's rolling summary of its older turns.
    SummaryText
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blank_text_is_refused() {
        for blank in ["", " ", "\n\t ", "\u{3000}"] {
            assert_eq!(UserQuery::parse(blank.into(), 100), Err(TextError::Empty));
        }
    }

    #[test]
    fn size_is_counted_in_bytes() {
        assert!(UserQuery::parse("ééé".into(), 6).is_ok());
        assert_eq!(
            FinalAnswer::parse("éééé".into(), 6),
            Err(TextError::TooLarge { max_bytes: 6 })
        );
    }

    #[test]
    fn text_is_kept_verbatim() {
        let q = UserQuery::parse("  hi \n".into(), 100).unwrap();
        assert_eq!(q.as_str(), "  hi \n");
    }
}
