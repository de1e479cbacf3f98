//! Masking secrets in text before a person sees it (the lens page; later
//! exports): API keys and bearer tokens, passwords in URLs, e-mail
//! addresses, card and IBAN numbers, and an operator's own patterns
//! (`TURNSTORE_REDACT_PATTERNS`). Pure: rules in, text in, text out.
//!
//! A rule is a regular expression in the syntax both Rust's `regex` and
//! JavaScript's `RegExp` (flags `gu`) read alike, so that the lens page
//! (`lens/redact.js`) applies the very rules this module does: no
//! lookaround, no backreferences, named groups as `(?<name>…)`, and
//! case-insensitivity only as a leading `(?i)`. Rules apply in order, each
//! to what the ones before left, in passes until one masks nothing; a
//! match is masked whole, or only its `secret` group when the rule has
//! one (an empty one is left alone); a card or IBAN rule masks only
//! matches that pass their checksum. The mask is `[redacted:NAME]`; a
//! match (or `secret` group) that is a mask already is left alone.

use std::borrow::Cow;
use std::path::Path;

use regex::Regex;
use serde::Serialize;

/// A check a match must pass to be masked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Check {
    /// A card number: 13 to 19 digits that pass the Luhn check.
    Luhn,
    /// An IBAN that passes the ISO 13616 mod-97 check.
    Iban,
}

/// One rule, as the lens page receives it.
#[derive(Debug, Clone, Serialize)]
pub struct RuleSpec {
    pub name: String,
    pub pattern: String,
    pub check: Option<Check>,
}

/// The built-in rules, in the order they apply: tokens with a known shape
/// first, so that an e-mail rule does not take a URL's credentials apart.
pub const BUILT_IN: &[(&str, &str, Option<Check>)] = &[
    (
        "url_password",
        r"[A-Za-z][A-Za-z0-9+.-]*://[^\s/:@]*:(?<secret>[^\s/@]+)@",
        None,
    ),
    (
        "bearer_token",
        r"(?i)bearer\s+(?<secret>[A-Za-z0-9._~+/=-]{8,})",
        None,
    ),
    (
        "api_key",
        r"\b(?:sk|pk|rk)-[A-Za-z0-9_-]{16,}|\bAKIA[0-9A-Z]{16}\b|\bgh[pousr]_[A-Za-z0-9]{30,}|\bxox[abprs]-[A-Za-z0-9-]{10,}|\bAIza[0-9A-Za-z_-]{35}|\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]+",
        None,
    ),
    (
        "email",
        r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}",
        None,
    ),
    (
        "iban",
        r"\b[A-Z]{2}[0-9]{2}(?: ?[A-Z0-9]){11,30}\b",
        Some(Check::Iban),
    ),
    ("card", r"\b[0-9](?:[ -]?[0-9]){12,18}\b", Some(Check::Luhn)),
];

#[derive(Debug, Clone)]
struct Rule {
    spec: RuleSpec,
    regex: Regex,
    /// The rule masks its `secret` group rather than the whole match.
    secret: Option<usize>,
}

/// The rules, compiled.
#[derive(Debug, Clone)]
pub struct Redactor {
    rules: Vec<Rule>,
}

/// The text with its secrets masked, and how many masks were made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redacted<'a> {
    pub text: Cow<'a, str>,
    pub masked: usize,
}

impl Redactor {
    /// The built-in rules, then `operator`'s (name, pattern), in order.
    pub fn new(operator: &[(String, String)]) -> Result<Self, String> {
        let built_in = BUILT_IN.iter().map(|(name, pattern, check)| RuleSpec {
            name: (*name).to_owned(),
            pattern: (*pattern).to_owned(),
            check: *check,
        });
        let theirs = operator.iter().map(|(name, pattern)| RuleSpec {
            name: name.clone(),
            pattern: pattern.clone(),
            check: None,
        });
        let rules = built_in
            .chain(theirs)
            .map(Rule::compile)
            .collect::<Result<_, _>>()?;
        Ok(Redactor { rules })
    }

    /// The built-in rules and the operator's of `file` (`TURNSTORE_REDACT_PATTERNS`):
    /// a rule a line, `name = pattern`; blank lines and `#` comments skipped.
    pub fn load(file: Option<&Path>) -> Result<Self, String> {
        let Some(file) = file else {
            return Redactor::new(&[]);
        };
        let text = std::fs::read_to_string(file)
            .map_err(|e| format!("reading {}: {e}", file.display()))?;
        let rules = parse_rules(&text).map_err(|e| format!("{}: {e}", file.display()))?;
        Redactor::new(&rules)
    }

    /// Every rule, as the lens page applies them.
    pub fn specs(&self) -> Vec<RuleSpec> {
        self.rules.iter().map(|r| r.spec.clone()).collect()
    }

    /// `text` with every rule's matches masked, in order.
    /// Passes over the rules until one masks nothing: a mask can open a
    /// match a rule did not see (`…uvsk-proj-…` once the key before it is
    /// masked begins at a word boundary). Each mask takes text that was
    /// not a mask, so the passes end.
    pub fn redact<'a>(&self, text: &'a str) -> Redacted<'a> {
        let mut out = Cow::Borrowed(text);
        let mut masked = 0;
        loop {
            let mut pass = 0;
            for rule in &self.rules {
                if let Some((next, n)) = rule.apply(&out) {
                    out = Cow::Owned(next);
                    pass += n;
                }
            }
            if pass == 0 {
                return Redacted { text: out, masked };
            }
            masked += pass;
        }
    }
}

impl Rule {
    fn compile(spec: RuleSpec) -> Result<Rule, String> {
        if !is_rule_name(&spec.name) {
            return Err(format!(
                "rule name {:?}: letters, digits, _ and - only",
                spec.name
            ));
        }
        let portable = spec.pattern.strip_prefix("(?i)").unwrap_or(&spec.pattern);
        if portable.contains("(?") && !only_named_groups(portable) {
            return Err(format!(
                "rule {}: only (?<name>…) and (?:…) groups, and a leading (?i), read alike in Rust and JavaScript",
                spec.name
            ));
        }
        // JavaScript's `\b` (with `u`) is ASCII's; Rust's would be Unicode's.
        let rust = spec.pattern.replace(r"\b", r"(?-u:\b)");
        let regex = Regex::new(&rust).map_err(|e| format!("rule {}: {e}", spec.name))?;
        if regex.is_match("") {
            return Err(format!("rule {}: matches the empty text", spec.name));
        }
        let secret = regex.capture_names().position(|n| n == Some("secret"));
        Ok(Rule {
            spec,
            regex,
            secret,
        })
    }

    /// The text with this rule's matches masked, and how many; `None`
    /// when nothing is masked.
    fn apply(&self, text: &str) -> Option<(String, usize)> {
        let mask = format!("[redacted:{}]", self.spec.name);
        let mut out = String::new();
        let (mut at, mut n) = (0, 0);
        for caps in self.regex.captures_iter(text) {
            let whole = caps.get(0).expect("group 0 is the match");
            if !self.passes(whole.as_str()) {
                continue;
            }
            let span = match self.secret.and_then(|i| caps.get(i)) {
                Some(secret) => secret.range(),
                None => whole.range(),
            };
            if span.is_empty() || is_mask(&text[span.clone()]) {
                continue;
            }
            out.push_str(&text[at..span.start]);
            out.push_str(&mask);
            at = span.end;
            n += 1;
        }
        if n == 0 {
            return None;
        }
        out.push_str(&text[at..]);
        Some((out, n))
    }

    fn passes(&self, found: &str) -> bool {
        match self.spec.check {
            None => true,
            Some(Check::Luhn) => luhn(found),
            Some(Check::Iban) => iban(found),
        }
    }
}

/// Whether `text` is a mask this module wrote (`[redacted:NAME]`): a
/// rule leaves it as it is, so that redacting twice masks nothing more.
fn is_mask(text: &str) -> bool {
    text.strip_prefix("[redacted:")
        .and_then(|rest| rest.strip_suffix(']'))
        .is_some_and(is_rule_name)
}

/// A rule's name, as its mask holds it: letters, digits, `_` and `-`.
fn is_rule_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// Whether every `(?` in `pattern` opens a `(?<name>` or `(?:` group.
fn only_named_groups(pattern: &str) -> bool {
    pattern.match_indices("(?").all(|(i, _)| {
        matches!(pattern.as_bytes().get(i + 2), Some(b':' | b'<'))
            && !pattern[i..].starts_with("(?<=")
            && !pattern[i..].starts_with("(?<!")
    })
}

/// `name = pattern` lines.
pub fn parse_rules(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut rules = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, pattern) = line
            .split_once('=')
            .ok_or_else(|| format!("line {}: expected `name = pattern`", i + 1))?;
        rules.push((name.trim().to_owned(), pattern.trim().to_owned()));
    }
    Ok(rules)
}

/// The Luhn check of a card number's 13 to 19 digits (separators skipped).
pub fn luhn(number: &str) -> bool {
    let digits: Vec<u32> = number.chars().filter_map(|c| c.to_digit(10)).collect();
    if !(13..=19).contains(&digits.len()) {
        return false;
    }
    let sum: u32 = digits
        .iter()
        .rev()
        .enumerate()
        .map(|(i, &d)| match i % 2 {
            0 => d,
            _ if d * 2 > 9 => d * 2 - 9,
            _ => d * 2,
        })
        .sum();
    sum.is_multiple_of(10)
}

/// The ISO 13616 check of an IBAN (spaces skipped): the first four
/// characters moved to the end, letters as 10 to 35, mod 97 is 1.
pub fn iban(text: &str) -> bool {
    let chars: Vec<char> = text.chars().filter(|c| !c.is_whitespace()).collect();
    if !(15..=34).contains(&chars.len()) {
        return false;
    }
    let mut rem = 0u32;
    for c in chars[4..].iter().chain(&chars[..4]) {
        let v = match c.to_digit(36) {
            Some(v) => v,
            None => return false,
        };
        rem = if v >= 10 {
            (rem * 100 + v) % 97
        } else {
            (rem * 10 + v) % 97
        };
    }
    rem == 1
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn redact(text: &str) -> (String, usize) {
        let r = Redactor::new(&[]).unwrap().redact(text);
        (r.text.into_owned(), r.masked)
    }

    #[test]
    fn built_in_rules_mask_secrets() {
        for (text, want) in [
            (
                "key sk-proj-abcdEFGH1234ijklMNOP5678 here",
                "key [redacted:api_key] here",
            ),
            (
                "Authorization: Bearer abc.def-ghi_jkl123",
                "Authorization: Bearer [redacted:bearer_token]",
            ),
            (
                "redis://:hunter2@cache:6379/0",
                "redis://:[redacted:url_password]@cache:6379/0",
            ),
            (
                "postgres://app:s3cr3t@db/x",
                "postgres://app:[redacted:url_password]@db/x",
            ),
            ("mail alice@example.com now", "mail [redacted:email] now"),
            ("card 4111 1111 1111 1111.", "card [redacted:card]."),
            ("card 4111-1111-1111-1111", "card [redacted:card]"),
            ("iban GB82 WEST 1234 5698 7654 32", "iban [redacted:iban]"),
            ("aws AKIAIOSFODNN7EXAMPLE", "aws [redacted:api_key]"),
            // `\b` as JavaScript reads it: ASCII word characters only.
            ("é4111 1111 1111 1111", "é[redacted:card]"),
            // A mask opens a word boundary: the key after it goes too.
            (
                "AIzaSyA1234567890abcdefghijklmnopqrstuvsk-proj-Z9xQabcdEFGH12345678",
                "[redacted:api_key][redacted:api_key]",
            ),
        ] {
            assert_eq!(redact(text).0, want, "{text}");
        }
    }

    #[test]
    fn numbers_that_fail_their_checksum_stay() {
        for text in [
            "order 4111 1111 1111 1112",
            "phone 1234567890123",
            "GB82 WEST 1234 5698 7654 33",
            "seq 20261127 and 12345",
        ] {
            assert_eq!(redact(text), (text.to_owned(), 0), "{text}");
        }
    }

    #[test]
    fn operator_rules_apply_after_the_built_in_ones() {
        let rules =
            parse_rules("# ours\nticket = TCK-[0-9]{6}\n\nemployee = (?i)emp(?<secret>[0-9]{4})\n")
                .unwrap();
        let r = Redactor::new(&rules).unwrap();
        let out = r.redact("TCK-123456 by EMP0042, alice@example.com");
        assert_eq!(
            out.text,
            "[redacted:ticket] by EMP[redacted:employee], [redacted:email]"
        );
        assert_eq!(out.masked, 3);
        assert_eq!(r.specs().len(), BUILT_IN.len() + 2);
    }

    #[test]
    fn unportable_or_empty_rules_are_refused() {
        for (name, pattern) in [
            ("a", "(?=x)y"),
            ("b", "x(?!y)"),
            ("c", "(?<=a)b"),
            ("d", "(?s)a.b"),
            ("e", "a*"),
            ("f g", "x"),
            ("h", "(unclosed"),
        ] {
            let rules = [(name.to_owned(), pattern.to_owned())];
            assert!(Redactor::new(&rules).is_err(), "{name} = {pattern}");
        }
        assert!(parse_rules("no equals sign").is_err());
    }

    #[test]
    fn checksums() {
        assert!(luhn("4111111111111111"));
        assert!(luhn("5500 0000 0000 0004"));
        assert!(!luhn("4111111111111112"));
        assert!(!luhn("411111111111")); // 12 digits
        assert!(iban("DE89370400440532013000"));
        assert!(iban("GB82 WEST 1234 5698 7654 32"));
        assert!(!iban("DE89370400440532013001"));
    }

    /// Texts of prose with secrets of every kind here and there.
    fn text() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            "[a-z ,.]{0,12}",
            Just("sk-proj-abcdEFGH1234ijklMNOP".to_owned()),
            Just("Bearer tok3n.value-xyz".to_owned()),
            Just("https://u:pw@host/".to_owned()),
            Just("bob@mail.example.org".to_owned()),
            Just("4111 1111 1111 1111".to_owned()),
            Just("DE89 3704 0044 0532 0130 00".to_owned()),
            Just("1234 5678 9012 3456".to_owned()),
            "[0-9 @:/.-]{0,8}",
        ];
        prop::collection::vec(piece, 0..8).prop_map(|p| p.concat())
    }

    proptest! {
        /// Masked text holds no match of any rule: redacting it again
        /// masks nothing.
        #[test]
        fn masked_text_holds_no_match(t in text()) {
            let (once, _) = redact(&t);
            prop_assert_eq!(redact(&once), (once.clone(), 0));
        }

        /// Text no rule matches comes back as it is, borrowed.
        #[test]
        fn unmatched_text_is_unchanged(t in "[a-zA-Z ,.;!?]{0,200}") {
            let r = Redactor::new(&[]).unwrap();
            let out = r.redact(&t);
            prop_assert!(matches!(out.text, Cow::Borrowed(_)));
            prop_assert_eq!(out.masked, 0);
        }

        /// What a mask replaced is gone, and the text around it stays.
        #[test]
        fn secrets_are_gone(prose in "[a-z ]{0,20}") {
            let t = format!("{prose} sk-proj-abcdEFGH1234ijklMNOP {prose}");
            let (out, n) = redact(&t);
            prop_assert!(!out.contains("abcdEFGH1234ijklMNOP"));
            prop_assert_eq!(n, 1);
            prop_assert!(out.starts_with(&prose));
        }
    }
}
