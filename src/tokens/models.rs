//! Which encoding counts for a model (`model=` on a read): the operator's
//! table (`TURNSTORE_MODELS`), first match wins, then tiktoken's table of
//! OpenAI models. A model in neither is unknown: it counts with the
//! default encoding (the response's `encoding` says so), or is refused
//! when the operator asks (`TURNSTORE_UNKNOWN_MODEL=reject`).

use std::path::Path;

use super::{Counting, Encoding, Tokenizers};

/// At most this many bytes of table: it is read once, at start.
const MAX_FILE_BYTES: u64 = 1 << 20;
/// A pattern is at most this long (a model name is at most 128 characters).
const MAX_PATTERN_CHARS: usize = 256;

/// What becomes of a model in no table.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum UnknownModel {
    /// Count with the default encoding (`TURNSTORE_ENCODING`).
    #[default]
    Default,
    /// 422 `unknown_model`.
    Reject,
}

/// The model table.
#[derive(Debug, Default)]
pub struct Models {
    rules: Vec<Rule>,
    unknown: UnknownModel,
}

#[derive(Debug)]
struct Rule {
    /// Lower case; `*` stands for any run of characters.
    pattern: String,
    counting: Counting,
}

/// How a model was resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolved {
    /// By a table.
    Known(Counting),
    /// In no table, and counted with the default encoding.
    Unknown,
    /// In no table, and refused.
    Refused,
}

impl Models {
    /// The operator's table from `path` (lines `pattern = encoding`, `#`
    /// comments; or a JSON object of pattern to encoding, in order), if
    /// any; an encoding is a built-in one or one of `tokenizers`. Errors
    /// name the file, the line or pattern, and why.
    pub fn load(
        path: Option<&Path>,
        unknown: UnknownModel,
        tokenizers: &Tokenizers,
    ) -> Result<Self, String> {
        let Some(path) = path else {
            return Ok(Models {
                rules: Vec::new(),
                unknown,
            });
        };
        let at = path.display();
        let size = std::fs::metadata(path)
            .map_err(|e| format!("cannot read {at}: {e}"))?
            .len();
        if size > MAX_FILE_BYTES {
            return Err(format!(
                "{at}: {size} bytes; a model table is at most {MAX_FILE_BYTES}"
            ));
        }
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {at}: {e}"))?;
        let rules = Self::parse(&text, tokenizers).map_err(|e| format!("{at}: {e}"))?;
        Ok(Models { rules, unknown })
    }

    fn parse(text: &str, tokenizers: &Tokenizers) -> Result<Vec<Rule>, String> {
        let entries: Vec<(String, String, String)> = if text.trim_start().starts_with('{') {
            let object: serde_json::Map<String, serde_json::Value> = serde_json::from_str(text)
                .map_err(|e| format!("not a JSON object of pattern to encoding: {e}"))?;
            object
                .into_iter()
                .map(|(pattern, v)| {
                    let at = format!("pattern `{pattern}`");
                    match v {
                        serde_json::Value::String(encoding) => Ok((at, pattern, encoding)),
                        other => Err(format!("{at}: {other} is not an encoding name")),
                    }
                })
                .collect::<Result<_, _>>()?
        } else {
            text.lines()
                .enumerate()
                .map(|(i, line)| (i + 1, line.trim()))
                .filter(|(_, line)| !line.is_empty() && !line.starts_with('#'))
                .map(|(n, line)| {
                    let (pattern, encoding) = line.split_once('=').ok_or_else(|| {
                        format!("line {n}: `pattern = encoding` expected, got `{line}`")
                    })?;
                    Ok((
                        format!("line {n}"),
                        pattern.trim().to_owned(),
                        encoding.trim().to_owned(),
                    ))
                })
                .collect::<Result<_, String>>()?
        };
        let mut rules: Vec<Rule> = Vec::with_capacity(entries.len());
        for (at, pattern, encoding) in entries {
            let pattern = pattern.to_lowercase();
            if pattern.is_empty() || pattern.chars().count() > MAX_PATTERN_CHARS {
                return Err(format!(
                    "{at}: a pattern has 1 to {MAX_PATTERN_CHARS} characters"
                ));
            }
            if pattern.chars().any(char::is_control) {
                return Err(format!("{at}: a pattern has no control characters"));
            }
            if rules.iter().any(|r| r.pattern == pattern) {
                return Err(format!("{at}: `{pattern}` is already in the table"));
            }
            let counting = tokenizers
                .counting(&encoding)
                .map_err(|e| format!("{at}: `{encoding}`: {e}"))?;
            rules.push(Rule { pattern, counting });
        }
        Ok(rules)
    }

    /// The operator's entries.
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The encoding `model` counts with.
    pub fn resolve(&self, model: &str) -> Resolved {
        let lower = model.to_lowercase();
        if let Some(rule) = self.rules.iter().find(|r| matches(&r.pattern, &lower)) {
            return Resolved::Known(rule.counting.clone());
        }
        match Encoding::for_model(model) {
            Some(encoding) => Resolved::Known(Counting::Builtin(encoding)),
            None if self.unknown == UnknownModel::Reject => Resolved::Refused,
            None => Resolved::Unknown,
        }
    }
}

/// Whether `name` matches `pattern`, where `*` stands for any run of
/// characters (none included). Linear in their lengths times the stars.
fn matches(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = name.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty(); // no star: the whole name
    };
    for part in middle {
        match rest.find(part) {
            Some(i) => rest = &rest[i + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known(e: Encoding) -> Resolved {
        Resolved::Known(Counting::Builtin(e))
    }

    fn table(text: &str) -> Models {
        Models {
            rules: Models::parse(text, &Tokenizers::default()).unwrap(),
            unknown: UnknownModel::Default,
        }
    }

    #[test]
    fn stars_match_any_run_of_characters() {
        for (pattern, name, expected) in [
            ("llama-3*", "llama-3-70b", true),
            ("llama-3*", "llama-3", true),
            ("llama-3*", "llama-2-70b", false),
            ("*-instruct", "qwen2.5-7b-instruct", true),
            ("*-instruct", "qwen2.5-7b", false),
            ("mistral*instruct*", "mistral-7b-instruct-v0.3", true),
            ("a*a", "a", false),
            ("a*a", "aa", true),
            ("exact", "exact", true),
            ("exact", "exactly", false),
            ("*", "", true),
            ("**", "anything", true),
        ] {
            assert_eq!(matches(pattern, name), expected, "{pattern} ~ {name}");
        }
    }

    #[test]
    fn the_first_matching_line_wins_then_tiktoken_then_unknown() {
        let models = table(
            "# open models\nllama-3-8b = p50k_base\nLlama-3* = cl100k_base\n\n  gpt-4o = r50k_base  \n",
        );
        assert_eq!(models.len(), 3);
        assert_eq!(models.resolve("llama-3-8b"), known(Encoding::P50kBase));
        assert_eq!(models.resolve("LLAMA-3-70B"), known(Encoding::Cl100kBase));
        assert_eq!(
            models.resolve("gpt-4o"),
            known(Encoding::R50kBase),
            "the operator's table first"
        );
        assert_eq!(models.resolve("gpt-4"), known(Encoding::Cl100kBase));
        assert_eq!(models.resolve("claude-3-5-sonnet"), Resolved::Unknown);
        let strict = Models {
            unknown: UnknownModel::Reject,
            ..table("")
        };
        assert_eq!(strict.resolve("claude-3-5-sonnet"), Resolved::Refused);
        assert_eq!(strict.resolve("gpt-4o"), known(Encoding::O200kBase));
    }

    #[test]
    fn a_json_object_is_a_table_in_its_order() {
        let models = table(r#"{"qwen2.5-7b": "o200k_base", "qwen*": "cl100k_base"}"#);
        assert_eq!(models.resolve("qwen2.5-7b"), known(Encoding::O200kBase));
        assert_eq!(models.resolve("qwen2-72b"), known(Encoding::Cl100kBase));
    }

    #[test]
    fn a_bad_table_is_refused_naming_where() {
        for (text, expected) in [
            ("llama-3*\n", "line 1: `pattern = encoding` expected"),
            (
                "a = o200k_base\nb = llama3\n",
                "line 2: `llama3`: unknown encoding; this server has o200k_base",
            ),
            (" = o200k_base", "line 1: a pattern has 1 to 256"),
            (
                "a = o200k_base\nA = cl100k_base",
                "line 2: `a` is already in the table",
            ),
            (r#"{"a": 1}"#, "pattern `a`: 1 is not an encoding name"),
            (r#"{"a": "o200k_base""#, "not a JSON object"),
            ("a\u{7}b = o200k_base", "line 1: a pattern has no control"),
        ] {
            let e = Models::parse(text, &Tokenizers::default()).unwrap_err();
            assert!(e.contains(expected), "{text:?}: {e}");
        }
        let long = format!("{} = o200k_base", "x".repeat(257));
        assert!(Models::parse(&long, &Tokenizers::default()).is_err());
    }

    #[test]
    fn load_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("models.txt");
        std::fs::write(&path, "x = nope\n").unwrap();
        let none = Tokenizers::default();
        let e = Models::load(Some(&path), UnknownModel::Default, &none).unwrap_err();
        assert!(e.starts_with(&path.display().to_string()), "{e}");
        assert!(e.contains("line 1: `nope`: unknown encoding"), "{e}");
        let e =
            Models::load(Some(&dir.path().join("none")), UnknownModel::Default, &none).unwrap_err();
        assert!(e.starts_with("cannot read"), "{e}");
        std::fs::write(&path, "x = cl100k_base\n").unwrap();
        let models = Models::load(Some(&path), UnknownModel::Default, &none).unwrap();
        assert_eq!(models.resolve("x"), known(Encoding::Cl100kBase));
        // A loaded tokenizer's name is an encoding too.
        let tiny = super::super::loaded::tests::TINY_JSON;
        let loaded = Tokenizers::of(vec![
            super::super::LoadedTokenizer::from_json("tiny", tiny.as_bytes(), None).unwrap(),
        ]);
        std::fs::write(&path, "llama-3* = tiny\n").unwrap();
        let models = Models::load(Some(&path), UnknownModel::Default, &loaded).unwrap();
        let Resolved::Known(Counting::Loaded(t)) = models.resolve("llama-3-8b") else {
            panic!("not the loaded tokenizer");
        };
        assert_eq!(t.name(), "tiny");
    }
}
