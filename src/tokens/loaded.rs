//! Tokenizers from Hugging Face `tokenizer.json` files
//! (`TURNSTORE_TOKENIZERS_DIR`), loaded and checked at start: `NAME.json`,
//! or `NAME/tokenizer.json` with an optional `tokenizer_config.json`
//! beside it (whose `chat_template` is kept). A read names one by
//! `encoding=NAME` (or through the model table); it counts with the
//! `tokenizers` crate, Hugging Face's own implementation.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use turnstore_bpe::{Pattern, Ranks, Splitter};

use super::Encoding;
use super::kinds::{adds_up, tiktoken_kind};
use super::parts::PartCounts;
use crate::domain::is_file_name;
use crate::history::template::ChatTemplate;

/// A tokenizer file is at most this large (Llama 3's is 9 MB, Qwen 2.5's 7).
const MAX_FILE_BYTES: u64 = 64 << 20;
/// At most this many tokenizers a server loads.
const MAX_TOKENIZERS: usize = 64;

/// Texts every tokenizer counts at load (one that cannot is broken), and
/// on which tiktoken's counter must agree with a tokenizer of its kind.
const PROBES: [&str; 8] = [
    "Hello, world! 12345 héllo 😀\n\n  code() {}",
    "What does the retriever return? The top 20 chunks, re-ranked.",
    "Größenänderung, ça marche ; 東京の天気は晴れです。 Привет! مرحبا שלום 👍🏽🎉",
    "   leading\tand\ttabs\n\n\n trailing   \n    indented\n\t\tmore  ",
    "fn main() {\n    println!(\"{}\", 42);\n}\n```python\ndef f(x):\n    return x ** 2\n```",
    "<|begin_of_text|><|eot_id|> [INST] typed [/INST] <s></s> <|im_start|>user",
    "1234567890 3.14159 -42 1e10 0xFF https://example.com/a?b=c&d=e#f it's we'll I'M",
    "",
];

thread_local! {
    /// This thread's pre-tokenizer for tokenizers of tiktoken's kind.
    static CL100K: Splitter = Splitter::new(Pattern::Cl100k);
}

/// What a read counts with: a built-in encoding, or a loaded tokenizer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Counting {
    Builtin(Encoding),
    Loaded(Arc<LoadedTokenizer>),
}

impl Counting {
    /// Its name, as `encoding=` takes it and responses report it.
    pub fn name(&self) -> std::borrow::Cow<'static, str> {
        match self {
            Counting::Builtin(e) => e.name().into(),
            Counting::Loaded(t) => t.name().to_owned().into(),
        }
    }

    pub fn count(&self, text: &str) -> u32 {
        match self {
            Counting::Builtin(e) => e.count(text),
            Counting::Loaded(t) => t.count(text),
        }
    }
}

/// A loaded tokenizer.
pub struct LoadedTokenizer {
    name: String,
    tokenizer: tokenizers::Tokenizer,
    /// Its `tokenizer_config.json`'s `chat_template`, if any, compiled.
    chat_template: Option<ChatTemplate>,
    /// Its added tokens, special ones recognised (a chat template's
    /// prompt holds them; a user's text counts them as text).
    specials: tokenizers::AddedVocabulary,
    /// Its added tokens as the tokenizer finds them in a text (leftmost
    /// longest), when it cuts a text at them and nowhere else: none is
    /// matched after normalizing, or strips the spaces beside it, or
    /// needs a word of its own. A prompt whose pieces between them are all
    /// kept is then counted without normalizing it.
    cuts: Option<aho_corasick::AhoCorasick>,
    /// What loading it took of the process's memory (resident set).
    memory: u64,
    /// Bytes of the longest token's text: a rendering longer than this
    /// many bytes a token counts more than that many tokens.
    longest: u64,
    /// tiktoken's counter (`turnstore_bpe`) for a tokenizer of tiktoken's
    /// kind (see [`tiktoken_kind`]): the same counts, about 8x faster.
    ranks: Option<Ranks>,
    /// Whether its counts add up at the joints of a `text` rendering (see
    /// [`adds_up`]), checked on the probes.
    adds_up: bool,
    /// Its count of "\n" alone.
    newline: u32,
    /// Counts of the parts of renderings it counted.
    parts: PartCounts,
}

impl std::fmt::Debug for LoadedTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedTokenizer")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl PartialEq for LoadedTokenizer {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}

impl Eq for LoadedTokenizer {}

impl LoadedTokenizer {
    /// From the bytes of a `tokenizer.json`; `name` for errors.
    pub fn from_json(
        name: &str,
        json: &[u8],
        chat_template: Option<ChatTemplate>,
    ) -> Result<Self, String> {
        let mut tokenizer = tokenizers::Tokenizer::from_bytes(json)
            .map_err(|e| format!("not a tokenizer.json: {e}"))?;
        // Counts are of whole texts: no truncation, no padding; special
        // tokens a user typed count as the text they are (as tiktoken's
        // ordinary text, and as chat APIs treat them).
        tokenizer
            .with_truncation(None)
            .map_err(|e| format!("cannot turn its truncation off: {e}"))?;
        tokenizer.with_padding(None);
        let mut specials = tokenizer.get_added_vocabulary().clone();
        specials.set_encode_special_tokens(false);
        let added = tokenizer.get_added_tokens_decoder();
        let cuts = added
            .values()
            .all(|t| !(t.normalized || t.lstrip || t.rstrip || t.single_word))
            .then(|| {
                aho_corasick::AhoCorasickBuilder::new()
                    .match_kind(aho_corasick::MatchKind::LeftmostLongest)
                    .build(added.values().map(|t| t.content.as_str()))
                    .ok()
            })
            .flatten();
        tokenizer.set_encode_special_tokens(true);
        // A token's text (its vocabulary entry) is at least as long as
        // what it stands for: a byte-level token has a character a byte,
        // a SentencePiece one three bytes ("▁") for a space.
        let longest = tokenizer
            .get_vocab(true)
            .keys()
            .map(|t| t.len() as u64)
            .max()
            .unwrap_or(1)
            .max(1);
        let ranks = tiktoken_kind(&tokenizer);
        let adds_up = adds_up(&tokenizer);
        let mut loaded = LoadedTokenizer {
            name: name.to_owned(),
            tokenizer,
            chat_template,
            specials,
            cuts,
            memory: 0,
            longest,
            ranks: None,
            adds_up: false,
            newline: 0,
            parts: PartCounts::default(),
        };
        // A tokenizer that cannot count a plain text is broken.
        let mut counts = Vec::with_capacity(PROBES.len());
        for probe in PROBES {
            counts.push(
                loaded
                    .try_count(probe)
                    .map_err(|e| format!("cannot count a text: {e}"))?,
            );
        }
        // tiktoken's counter only where it counts as the tokenizer does.
        loaded.ranks = ranks.filter(|ranks| {
            PROBES
                .iter()
                .zip(&counts)
                .all(|(p, n)| CL100K.with(|s| ranks.count(s, p)) == *n)
        });
        loaded.newline = loaded.count("\n");
        loaded.adds_up = adds_up && loaded.sums_hold();
        Ok(loaded)
    }

    /// Whether its counts of the probes, and of a rendering of them, cut
    /// at every joint (after a "\n", before a letter or a "#"), add
    /// up to its counts of them whole.
    fn sums_hold(&self) -> bool {
        let mut rendering = String::from(super::HEADER);
        for pair in PROBES.chunks(2) {
            rendering.push_str(&format!("User: {}\nAssistant: {}\n\n", pair[0], pair[1]));
        }
        PROBES.iter().chain([&rendering.as_str()]).all(|text| {
            let mut sum = 0;
            let mut from = 0;
            for (i, _) in text.match_indices('\n') {
                let next = text[i + 1..].chars().next();
                if next.is_some_and(|c| c.is_alphabetic() || c == '#') {
                    sum += self.count_after(&text[from..=i], from > 0);
                    from = i + 1;
                }
            }
            sum += self.count_after(&text[from..], from > 0);
            sum == self.count(text)
        })
    }

    /// Its count of `text` as it stands after a newline (`after_newline`)
    /// or at the start of a text.
    fn count_after(&self, text: &str, after_newline: bool) -> u32 {
        if !after_newline {
            return self.count(text);
        }
        self.count(&format!("\n{text}"))
            .saturating_sub(self.newline)
    }

    /// How many counts of parts it keeps, and how many it took.
    pub fn parts_kept(&self) -> usize {
        self.parts.len()
    }

    pub fn parts_counted(&self) -> u64 {
        self.parts.counted()
    }

    /// Whether its counts of the parts of a rendering in `format` add up
    /// to its count of the rendering: always for `messages` (its count is
    /// of each message alone), for the others when [`adds_up`].
    pub fn adds_up_in(&self, format: crate::history::Format) -> bool {
        self.adds_up || format.shape() == crate::history::Shape::Messages
    }

    /// Its count of the text `pieces` make, as it stands at the start of
    /// a text or (`after_newline`) after a newline ending what is before
    /// it, from the counts kept of parts counted before; a part not kept
    /// is counted (and kept) when `count`, else `None`.
    pub fn count_part(&self, pieces: &[&str], after_newline: bool, count: bool) -> Option<u32> {
        let key = self.parts.key(after_newline, pieces);
        if let Some(n) = self.parts.get(key) {
            return Some(n);
        }
        if !count {
            return None;
        }
        let n = self.count_after(&pieces.concat(), after_newline);
        self.parts.put(key, n);
        Some(n)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat_template.as_ref()
    }

    /// Exact count of a chat template's `prompt`, as a completion
    /// endpoint counts it: its special tokens recognised (a token each),
    /// no BOS added (the template writes its own). The pieces between
    /// special tokens are counted apart (as the tokenizer does), each
    /// once: later prompts holding one find its count kept. A piece not
    /// kept is counted (and kept) when `count`, else `None`.
    pub fn count_prompt(&self, prompt: &str, count: bool) -> Option<u32> {
        match &self.cuts {
            Some(cuts) => self.count_cut_prompt(cuts, prompt, count),
            None => self.count_whole_prompt(prompt, count),
        }
    }

    /// [`LoadedTokenizer::count_prompt`] of a prompt cut where the
    /// tokenizer cuts it (`cuts`), without normalizing it: each piece's
    /// count kept, or counted alone (when `count`) in a prompt of its own
    /// where it stands as here: first, or after the token before it (the
    /// pieces of a tokenizer with a Metaspace "first" pre-tokenizer count
    /// differently there). A token for each added token.
    fn count_cut_prompt(
        &self,
        cuts: &aho_corasick::AhoCorasick,
        prompt: &str,
        count: bool,
    ) -> Option<u32> {
        // The count of the piece `from..to` after the token `before`.
        let piece = |before: Option<&str>, from: usize, to: usize| {
            let text = &prompt[from..to];
            if text.is_empty() {
                return Some(0);
            }
            if let Some(n) = self
                .parts
                .get(self.parts.prompt_key(before.is_none(), text))
            {
                return Some(n);
            }
            if !count {
                return None;
            }
            // Counted (and kept) as the tokenizer counts it there.
            match before {
                None => self.count_whole_prompt(text, true),
                Some(token) => Some(
                    self.count_whole_prompt(&format!("{token}{text}"), true)?
                        .saturating_sub(1),
                ),
            }
        };
        let mut total: u32 = 0;
        let (mut from, mut before) = (0, None);
        for m in cuts.find_iter(prompt) {
            total = total.saturating_add(piece(before, from, m.start())?);
            total = total.saturating_add(1);
            (from, before) = (m.end(), Some(&prompt[m.start()..m.end()]));
        }
        Some(total.saturating_add(piece(before, from, prompt.len())?))
    }

    /// [`LoadedTokenizer::count_prompt`] by the tokenizer's own cut of the
    /// prompt (it normalizes the whole prompt).
    fn count_whole_prompt(&self, prompt: &str, count: bool) -> Option<u32> {
        use tokenizers::PreTokenizer;
        let mut pieces = self
            .specials
            .extract_and_normalize(self.tokenizer.get_normalizer(), prompt);
        let mut total: usize = 0;
        let mut missing = false;
        pieces
            .split(|_, piece| {
                let first = piece.offsets_original().0 == 0;
                // Known by its text (see `count_cut_prompt`), or else by
                // its text normalized (a piece is a part of a cut piece).
                let text = match self.cuts {
                    Some(_) => piece.get_original(),
                    None => piece.get(),
                };
                let key = self.parts.prompt_key(first, text);
                let n = match self.parts.get(key) {
                    Some(n) => n as usize,
                    None if count => {
                        let n = match &self.ranks {
                            // tiktoken's counter counts as the tokenizer
                            // does (no normalizer, a pre-tokenizer that
                            // reads no offset).
                            Some(ranks) => CL100K.with(|s| ranks.count(s, piece.get())),
                            None => {
                                let mut words = tokenizers::PreTokenizedString::from(piece);
                                if let Some(pre) = self.tokenizer.get_pre_tokenizer() {
                                    pre.pre_tokenize(&mut words)?;
                                }
                                let model = self.tokenizer.get_model();
                                words.tokenize(|w| tokenizers::Model::tokenize(model, w.get()))?;
                                tokens_in(&words)
                            }
                        };
                        self.parts.put(key, u32::try_from(n).unwrap_or(u32::MAX));
                        n
                    }
                    None => {
                        missing = true;
                        0
                    }
                };
                total += n;
                Ok(Vec::<tokenizers::NormalizedString>::new())
            })
            .ok()?;
        if missing {
            return None;
        }
        // What is left are the special tokens.
        total += tokens_in(&pieces);
        Some(u32::try_from(total).unwrap_or(u32::MAX))
    }

    pub fn memory(&self) -> u64 {
        self.memory
    }

    /// At most how many bytes of text `tokens` tokens hold (twice what
    /// the longest token's text says, for normalizers that shorten).
    pub fn bytes_within(&self, tokens: u32) -> u64 {
        u64::from(tokens)
            .saturating_mul(self.longest)
            .saturating_mul(2)
    }

    fn try_count(&self, text: &str) -> Result<usize, String> {
        self.tokenizer
            .encode_fast(text, false)
            .map(|e| e.len())
            .map_err(|e| e.to_string())
    }

    /// Whether it counts with tiktoken's counter (see [`tiktoken_kind`]).
    pub fn counts_as_tiktoken(&self) -> bool {
        self.ranks.is_some()
    }

    /// Exact count of `text` as ordinary text, without the special tokens
    /// the tokenizer's template adds (a BOS, say). A text it cannot
    /// encode (none was found) counts as its bytes, an upper bound.
    pub fn count(&self, text: &str) -> u32 {
        let n = match &self.ranks {
            Some(ranks) => CL100K.with(|s| ranks.count(s, text)),
            None => self.try_count(text).unwrap_or(text.len()),
        };
        u32::try_from(n).unwrap_or(u32::MAX)
    }
}

/// The tokens the splits of `pre` hold (those tokenized: an added token's
/// split, or every split once the model tokenized them).
fn tokens_in(pre: &tokenizers::PreTokenizedString) -> usize {
    use tokenizers::{OffsetReferential, OffsetType};
    pre.get_splits(OffsetReferential::Original, OffsetType::Byte)
        .iter()
        .map(|(_, _, tokens)| tokens.as_ref().map_or(0, |t| t.len()))
        .sum()
}

/// The tokenizers a server loaded, by name.
#[derive(Debug, Default)]
pub struct Tokenizers {
    by_name: BTreeMap<String, Arc<LoadedTokenizer>>,
}

impl Tokenizers {
    /// Every tokenizer in `dir` (none without one). Errors name the file
    /// and why.
    pub fn load(dir: Option<&Path>) -> Result<Self, String> {
        let Some(dir) = dir else {
            return Ok(Tokenizers::default());
        };
        let entries =
            std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
        let mut found: Vec<(String, std::path::PathBuf)> = Vec::new();
        for entry in entries {
            let path = entry
                .map_err(|e| format!("cannot read {}: {e}", dir.display()))?
                .path();
            let file_name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default()
                .to_owned();
            if file_name.starts_with('.') {
                continue;
            }
            if path.is_dir() {
                found.push((file_name, path.join("tokenizer.json")));
            } else if let Some(name) = file_name.strip_suffix(".json") {
                found.push((name.to_owned(), path));
            }
        }
        found.sort();
        if found.len() > MAX_TOKENIZERS {
            return Err(format!(
                "{}: {} tokenizers; a server loads at most {MAX_TOKENIZERS}",
                dir.display(),
                found.len()
            ));
        }
        let mut by_name = BTreeMap::new();
        for (name, file) in found {
            let at = file.display().to_string();
            check_name(&name).map_err(|e| format!("{at}: {e}"))?;
            let before = resident();
            let mut loaded = read_one(&name, &file).map_err(|e| format!("{at}: {e}"))?;
            loaded.memory = resident().saturating_sub(before);
            tracing::info!(
                tokenizer = %name,
                memory_bytes = loaded.memory,
                chat_template = loaded.chat_template.is_some(),
                tiktoken_kind = loaded.counts_as_tiktoken(),
                adds_up = loaded.adds_up,
                "tokenizer loaded"
            );
            by_name.insert(name, Arc::new(loaded));
        }
        Ok(Tokenizers { by_name })
    }

    pub fn get(&self, name: &str) -> Option<&Arc<LoadedTokenizer>> {
        self.by_name.get(name)
    }

    /// What `encoding=name` counts with: a built-in encoding or a loaded
    /// tokenizer; the error names what the server has.
    pub fn counting(&self, name: &str) -> Result<Counting, String> {
        if let Some(e) = Encoding::from_name(name) {
            return Ok(Counting::Builtin(e));
        }
        self.get(name)
            .cloned()
            .map(Counting::Loaded)
            .ok_or_else(|| {
                let known: Vec<&str> = Encoding::ALL
                    .iter()
                    .map(|e| e.name())
                    .chain(self.names())
                    .collect();
                format!("unknown encoding; this server has {}", known.join(", "))
            })
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.by_name.keys().map(String::as_str)
    }

    pub fn all(&self) -> impl Iterator<Item = &Arc<LoadedTokenizer>> {
        self.by_name.values()
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    #[cfg(test)]
    pub fn of(loaded: Vec<LoadedTokenizer>) -> Self {
        Tokenizers {
            by_name: loaded
                .into_iter()
                .map(|t| (t.name.clone(), Arc::new(t)))
                .collect(),
        }
    }
}

/// A tokenizer's name: as a template's, and not a built-in encoding's.
fn check_name(name: &str) -> Result<(), String> {
    if !is_file_name(name) {
        return Err(format!(
            "`{name}` is not a tokenizer name: 1 to 64 of A-Z, a-z, 0-9, '.', '_', '-', beginning with a letter or digit"
        ));
    }
    if Encoding::from_name(name).is_some() {
        return Err(format!("`{name}` is a built-in encoding's name"));
    }
    Ok(())
}

fn read_one(name: &str, file: &Path) -> Result<LoadedTokenizer, String> {
    let json = read_capped(file)?;
    let config = file.with_file_name("tokenizer_config.json");
    let chat_template = if file.file_name().is_some_and(|f| f == "tokenizer.json")
        && config.exists()
    {
        let at = config.display();
        let json: serde_json::Value = serde_json::from_slice(&read_capped(&config)?)
            .map_err(|e| format!("{at}: not JSON: {e}"))?;
        match chat_template(&json).map_err(|e| format!("{at}: {e}"))? {
            Some(source) => Some(ChatTemplate::new(&source, &json).map_err(|e| {
                format!("{at}: its chat_template cannot render a conversation ({e}); remove it to load the tokenizer without one")
            })?),
            None => None,
        }
    } else {
        None
    };
    LoadedTokenizer::from_json(name, &json, chat_template)
}

fn read_capped(file: &Path) -> Result<Vec<u8>, String> {
    let size = std::fs::metadata(file)
        .map_err(|e| format!("cannot read it: {e}"))?
        .len();
    if size > MAX_FILE_BYTES {
        return Err(format!(
            "{size} bytes; a tokenizer file is at most {MAX_FILE_BYTES}"
        ));
    }
    std::fs::read(file).map_err(|e| format!("cannot read it: {e}"))
}

/// The `chat_template` of a `tokenizer_config.json`: a string, or the
/// template named `default` of a list of named ones.
fn chat_template(v: &serde_json::Value) -> Result<Option<String>, String> {
    Ok(match v.get("chat_template") {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::String(t)) => Some(t.clone()),
        Some(serde_json::Value::Array(named)) => named
            .iter()
            .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
            .and_then(|t| t.get("template")?.as_str().map(str::to_owned)),
        Some(_) => return Err("`chat_template` is neither a string nor a list".into()),
    })
}

/// The process's resident set, in bytes (0 where /proc has none), once
/// the allocator gave back what it holds free (the parse's garbage).
fn resident() -> u64 {
    // SAFETY: mi_collect takes no pointer; it frees nothing in use.
    unsafe { libmimalloc_sys::mi_collect(true) };
    let pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0);
    pages * 4096
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A small byte-level BPE tokenizer (`tests/fixtures`): its merges
    /// make "the", " the", "he" and "ll" tokens, and it adds a space before
    /// a text.
    pub(crate) const TINY_JSON: &str = include_str!("../../tests/fixtures/tiny-tokenizer.json");

    #[test]
    fn a_tiny_tokenizer_counts_its_merges() {
        let t = LoadedTokenizer::from_json("tiny", TINY_JSON.as_bytes(), None).unwrap();
        assert_eq!(t.count("the"), 1);
        assert_eq!(t.count(" the"), 1);
        assert_eq!(t.count("hello"), 4); // Ġ he ll o: a space is added before
        assert_eq!(t.count(""), 0);
        // A space added before each text: its parts do not add up.
        assert!(!t.adds_up);
        assert!(t.adds_up_in(crate::history::Format::Messages));
        assert!(!t.adds_up_in(crate::history::Format::Text));
    }

    /// Parts are counted once, then kept: asked again without counting,
    /// the count is at hand; a part never counted is not.
    #[test]
    fn counts_of_parts_are_kept() {
        let t = LoadedTokenizer::from_json("tiny", TINY_JSON.as_bytes(), None).unwrap();
        assert_eq!(t.count_part(&["the", " the"], false, false), None);
        assert_eq!(
            t.count_part(&["the", " the"], false, true),
            Some(t.count("the the"))
        );
        assert_eq!(
            t.count_part(&["the the"], false, false),
            Some(t.count("the the"))
        );
        assert_eq!(t.count_part(&["the the"], true, false), None);
        let after = t.count("\nthe the") - t.count("\n");
        assert_eq!(t.count_part(&["the the"], true, true), Some(after));
    }

    #[test]
    fn the_byte_level_map_covers_every_byte_once() {
        let map = super::super::kinds::byte_level_bytes();
        assert_eq!(map.len(), 256);
        assert_eq!(map[&'Ġ'], b' ');
        assert_eq!(map[&'Ċ'], b'\n');
        assert_eq!(map[&'a'], b'a');
        let mut bytes: Vec<u8> = map.values().copied().collect();
        bytes.sort();
        bytes.dedup();
        assert_eq!(bytes.len(), 256);
    }

    /// The real tokenizers (`scripts/fetch-tokenizers`; `scripts/test`
    /// names where): Llama 3 counts with tiktoken's counter, exactly as
    /// the `tokenizers` crate; Qwen 2.5 (one digit a piece, NFC) and
    /// Llama 2 (SentencePiece) are not of its kind.
    #[test]
    fn llama3_counts_with_tiktoken_s_counter_exactly() {
        let Some(dir) = std::env::var_os("TURNSTORE_TEST_TOKENIZERS") else {
            eprintln!("TURNSTORE_TEST_TOKENIZERS unset (scripts/test sets it): skipped");
            return;
        };
        let loaded = Tokenizers::load(Some(Path::new(&dir))).unwrap();
        let llama3 = loaded.get("llama3").unwrap();
        assert!(llama3.counts_as_tiktoken());
        assert!(!loaded.get("qwen2_5").unwrap().counts_as_tiktoken());
        assert!(!loaded.get("llama2").unwrap().counts_as_tiktoken());
        // Each adds up at the joints of a rendering (see `kinds::adds_up`).
        for name in ["llama3", "qwen2_5", "llama2"] {
            assert!(loaded.get(name).unwrap().adds_up, "{name}");
        }
        // Gemma's has tokens of runs of newlines, none with anything else:
        // it adds up too.
        assert!(loaded.get("gemma").unwrap().adds_up);
        // Mistral Nemo's pattern (Tekken) is not tiktoken's, but adds up.
        let nemo = loaded.get("mistral_nemo").unwrap();
        assert!(nemo.adds_up && !nemo.counts_as_tiktoken());
        let texts = PROBES.join(" \n");
        for end in (0..texts.len())
            .filter(|&i| texts.is_char_boundary(i))
            .step_by(7)
        {
            let t = &texts[..end];
            assert_eq!(
                llama3.count(t) as usize,
                llama3.try_count(t).unwrap(),
                "{t:?}"
            );
        }
    }

    #[test]
    fn broken_files_and_names_are_refused_naming_why() {
        for (name, json, expected) in [
            ("t", "{", "not a tokenizer.json"),
            ("t", r#"{"version": "1.0"}"#, "not a tokenizer.json"),
        ] {
            let e = LoadedTokenizer::from_json(name, json.as_bytes(), None).unwrap_err();
            assert!(e.contains(expected), "{json}: {e}");
        }
        assert!(check_name("llama-3.1_8b").is_ok());
        for bad in ["", "-x", "a/b", "o200k_base", &"x".repeat(65)] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_directory_loads_files_and_folders_with_their_chat_templates() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tiny.json"), TINY_JSON).unwrap();
        std::fs::create_dir(dir.path().join("chat")).unwrap();
        std::fs::write(dir.path().join("chat/tokenizer.json"), TINY_JSON).unwrap();
        std::fs::write(
            dir.path().join("chat/tokenizer_config.json"),
            r#"{"chat_template": [{"name": "tool_use", "template": "x"}, {"name": "default", "template": "{{ messages|length }}:{{ messages[0].content }}"}]}"#,
        )
        .unwrap();
        std::fs::write(dir.path().join("notes.txt"), "ignored").unwrap();

        let loaded = Tokenizers::load(Some(dir.path())).unwrap();

        assert_eq!(loaded.names().collect::<Vec<_>>(), ["chat", "tiny"]);
        let chat = loaded.get("chat").unwrap().chat_template().unwrap();
        let m = ChatTemplate::message(crate::history::Role::User, "hi");
        assert_eq!(chat.render(vec![m], false, 100).unwrap(), "1:hi");
        assert!(loaded.get("tiny").unwrap().chat_template().is_none());
        assert_eq!(loaded.get("tiny").unwrap().count("the"), 1);

        std::fs::write(dir.path().join("bad.json"), "[1, 2]").unwrap();
        let e = Tokenizers::load(Some(dir.path())).unwrap_err();
        assert!(
            e.starts_with(&dir.path().join("bad.json").display().to_string()),
            "{e}"
        );
        assert!(e.contains("not a tokenizer.json"), "{e}");
        std::fs::remove_file(dir.path().join("bad.json")).unwrap();

        // A chat template that cannot render a conversation stops the load.
        for (template, why) in [
            ("{% for %}", "syntax error"),
            (
                "{{ raise_exception('never') }}",
                "the template raised: never",
            ),
        ] {
            let config = serde_json::json!({ "chat_template": template }).to_string();
            std::fs::write(dir.path().join("chat/tokenizer_config.json"), config).unwrap();
            let e = Tokenizers::load(Some(dir.path())).unwrap_err();
            assert!(
                e.contains("tokenizer_config.json: its chat_template"),
                "{e}"
            );
            assert!(e.contains(why), "{e}");
        }
        std::fs::write(dir.path().join("chat/tokenizer_config.json"), "{").unwrap();
        let e = Tokenizers::load(Some(dir.path())).unwrap_err();
        assert!(e.contains("tokenizer_config.json: not JSON"), "{e}");
    }

    /// The tiny tokenizer with two special tokens, as a chat model's.
    pub(crate) fn tiny_with_specials() -> String {
        let mut t: serde_json::Value = serde_json::from_str(TINY_JSON).unwrap();
        t["added_tokens"] = serde_json::json!([
            {"id": 261, "content": "<|im_start|>", "single_word": false, "lstrip": false,
             "rstrip": false, "normalized": false, "special": true},
            {"id": 262, "content": "<|im_end|>", "single_word": false, "lstrip": false,
             "rstrip": false, "normalized": false, "special": true},
        ]);
        t.to_string()
    }

    /// A prompt counts its special tokens as one each, and the pieces
    /// between them apart (each with the space this tokenizer adds); a
    /// user's text counts them as text. Pieces are kept once counted.
    #[test]
    fn a_prompt_counts_its_special_tokens_and_keeps_its_pieces() {
        let json = tiny_with_specials();
        let t = LoadedTokenizer::from_json("tiny", json.as_bytes(), None).unwrap();
        let mut fresh = tokenizers::Tokenizer::from_bytes(json.as_bytes()).unwrap();
        fresh.set_encode_special_tokens(false);
        let fresh = |text: &str| fresh.encode_fast(text, false).unwrap().len() as u32;
        for prompt in [
            "<|im_start|>user\nthe hello<|im_end|>\n<|im_start|>assistant\n",
            "the the<|im_end|><|im_end|>  hell",
            "",
            "no specials at all",
        ] {
            assert_eq!(
                t.count_prompt(prompt, false),
                if prompt.is_empty() { Some(0) } else { None }
            );
            assert_eq!(
                t.count_prompt(prompt, true),
                Some(fresh(prompt)),
                "{prompt:?}"
            );
            assert_eq!(
                t.count_prompt(prompt, false),
                Some(fresh(prompt)),
                "{prompt:?}"
            );
        }
        assert_eq!(t.count_prompt("<|im_start|><|im_end|>", false), Some(2));
        assert!(t.count("<|im_start|>") > 2);
        // Pieces kept from one prompt count another cut of them, without
        // normalizing it: the first piece as a first one, the others as not.
        assert!(t.cuts.is_some());
        let one = "the<|im_end|>hello  <|im_start|>the";
        let other = "the<|im_start|>the<|im_end|><|im_end|>hello  ";
        assert_eq!(t.count_prompt(other, false), None);
        assert_eq!(t.count_prompt(one, true), Some(fresh(one)));
        assert_eq!(t.count_prompt(other, false), Some(fresh(other)));

        // A token matched after normalizing: prompts are cut by the
        // tokenizer itself, its pieces known by their normalized text.
        let mut normalized: serde_json::Value = serde_json::from_str(&json).unwrap();
        normalized["added_tokens"][1]["normalized"] = true.into();
        let normalized = normalized.to_string();
        let t = LoadedTokenizer::from_json("tiny", normalized.as_bytes(), None).unwrap();
        assert!(t.cuts.is_none());
        let mut fresh = tokenizers::Tokenizer::from_bytes(normalized.as_bytes()).unwrap();
        fresh.set_encode_special_tokens(false);
        for prompt in [one, other] {
            let n = fresh.encode_fast(prompt, false).unwrap().len() as u32;
            assert_eq!(t.count_prompt(prompt, true), Some(n), "{prompt:?}");
            assert_eq!(t.count_prompt(prompt, false), Some(n), "{prompt:?}");
        }
    }
}
