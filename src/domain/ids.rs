//! Identifiers: the ones clients give (`SessionId`, `UserId`, `IdempotencyKey`)
//! and the one the server makes (`TurnId`).

use std::fmt;

use uuid::Uuid;

/// `^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$`: keeps `{`/`}` out of Redis keys,
/// so a client cannot forge a hash tag.
pub fn is_identifier(s: &str) -> bool {
    let bytes = s.as_bytes();
    match bytes.split_first() {
        Some((first, rest)) => {
            bytes.len() <= 128
                && first.is_ascii_alphanumeric()
                && rest
                    .iter()
                    .all(|b| b.is_ascii_alphanumeric() || b".\x5f:@-".contains(b))
        }
        None => false,
    }
}

/// `^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`: the name of an operator's file
/// (a template's, a tokenizer's), as requests name it.
pub fn is_file_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes.next().is_some_and(|b| b.is_ascii_alphanumeric())
        && name.len() <= 64
        && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

macro_rules! identifier_pattern {
    () => {
        "^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$"
    };
}

/// What `is_identifier` accepts, as a regular expression (for documents).
pub const IDENTIFIER_PATTERN: &str = identifier_pattern!();
pub const IDENTIFIER_RULE: &str = concat!("must match ", identifier_pattern!());

macro_rules! identifier {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(String);

        impl $name {
            pub fn parse(s: impl Into<String>) -> Result<Self, &'static str> {
                let s = s.into();
                if is_identifier(&s) { Ok(Self(s)) } else { Err(IDENTIFIER_RULE) }
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }

            pub fn into_string(self) -> String {
                self.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

identifier!(
    /// A conversation. Client-chosen, or a server-made UUID v4 (unguessable).
    SessionId
);
identifier!(
    /// The owner of sessions.
    UserId
);
identifier!(
    /// Makes a retried start_turn return the turn the first try made.
    IdempotencyKey
);

impl SessionId {
    /// A fresh, unguessable id (UUID v4).
    pub fn generate() -> Self {
        Self(Uuid::new_v4().to_string())
    }
}

/// A turn, made by the server: UUID v7, so ids sort by creation time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TurnId(Uuid);

impl TurnId {
    pub fn generate() -> Self {
        Self(Uuid::now_v7())
    }

    pub fn from_bytes(bytes: [u8; 16]) -> Self {
        Self(Uuid::from_bytes(bytes))
    }

    pub fn parse(s: &str) -> Result<Self, &'static str> {
        Uuid::try_parse(s)
            .map(Self)
            .map_err(|_| "must be a UUID like 0192f0c1-7a4e-7cc3-9d2a-3b1f5e6a7c8d")
    }

    pub fn as_uuid(&self) -> Uuid {
        self.0
    }
}

impl fmt::Display for TurnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.hyphenated().fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_follow_the_contract_pattern() {
        for ok in ["a", "A9", "user@example.com", "s:1.2_3-4", &"x".repeat(128)] {
            assert!(SessionId::parse(ok).is_ok(), "{ok} was refused");
        }
        let too_long = "x".repeat(129);
        for bad in [
            "", "-a", ".a", "a b", "a{b}", "{a}", "é", "a/b", "a\n", &too_long,
        ] {
            assert!(SessionId::parse(bad).is_err(), "{bad:?} was accepted");
        }
    }

    proptest::proptest! {
        /// The documented pattern accepts exactly what the server does.
        #[test]
        fn the_pattern_is_the_rule(s in "[A-Za-z0-9._:@{} /é-]{0,130}") {
            let pattern = regex::Regex::new(IDENTIFIER_PATTERN).unwrap();
            proptest::prop_assert_eq!(pattern.is_match(&s), is_identifier(&s));
        }
    }

    #[test]
    fn generated_ids_are_valid_and_versioned() {
        let s = SessionId::generate();
        assert!(is_identifier(s.as_str()));
        assert_eq!(Uuid::parse_str(s.as_str()).unwrap().get_version_num(), 4);
        assert_eq!(TurnId::generate().as_uuid().get_version_num(), 7);
    }

    #[test]
    fn turn_ids_parse_only_uuids() {
        assert!(TurnId::parse("not-a-uuid").is_err());
        let id = TurnId::generate();
        assert_eq!(TurnId::parse(&id.to_string()), Ok(id));
    }
}
