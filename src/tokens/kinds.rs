//! What kind of tokenizer a `tokenizer.json` holds, read from its parts:
//! whether tiktoken's counter counts as it does ([`tiktoken_kind`]), and
//! whether its counts add up where a rendering joins its parts
//! ([`adds_up`]). Either lets a read count less; a tokenizer of no known
//! kind is counted whole, as the `tokenizers` crate counts it.

use std::collections::HashMap;

use serde_json::Value;
use tokenizers::ModelWrapper;
use turnstore_bpe::Ranks;

/// Llama 3's pre-tokenizer pattern as its `tokenizer.json` writes it:
/// tiktoken's cl100k_base pattern (`turnstore_bpe`'s `Pattern::Cl100k`).
pub(super) const CL100K_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Mistral's Tekken (Mistral Nemo's): o200k's without the contractions,
/// one digit a piece.
const TEKKEN_PATTERN: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen 2's (and 2.5's): cl100k's with one digit a piece.
const QWEN2_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The ranks of a tokenizer of tiktoken's kind, which tiktoken's counter
/// counts exactly as the tokenizer does: byte-level BPE over tiktoken's
/// cl100k pattern, no normalizer, a piece found whole in the vocabulary
/// one token (`ignore_merges`), no byte fallback, ids that are ranks
/// (Llama 3's, converted from tiktoken). `None` for any other. The caller
/// still compares the two counters on its probe texts.
pub(super) fn tiktoken_kind(tokenizer: &tokenizers::Tokenizer) -> Option<Ranks> {
    let ModelWrapper::BPE(bpe) = tokenizer.get_model() else {
        return None;
    };
    let kind = tokenizer.get_normalizer().is_none()
        && byte_level_pattern(tokenizer).as_deref() == Some(CL100K_PATTERN)
        && bpe.ignore_merges
        && !bpe.byte_fallback
        && plain(bpe);
    if !kind {
        return None;
    }
    let byte_of = byte_level_bytes();
    let mut tokens: Vec<(Vec<u8>, u32)> = tokenizer
        .get_vocab(false)
        .into_iter()
        .map(|(token, id)| {
            let bytes: Option<Vec<u8>> = token.chars().map(|c| byte_of.get(&c).copied()).collect();
            Some((bytes?, id))
        })
        .collect::<Option<_>>()?;
    tokens.sort_by_key(|(_, id)| *id);
    let mut block = Vec::new();
    let mut lengths = Vec::with_capacity(tokens.len());
    for (bytes, id) in tokens {
        lengths.push((bytes.len() as u32, id));
        block.extend(bytes);
    }
    Some(Ranks::new(block, lengths))
}

/// The byte each character of a byte-level vocabulary stands for (GPT-2's
/// `bytes_to_unicode`, inverted): printable bytes as themselves, the
/// others as U+0100 onwards, in order.
pub(super) fn byte_level_bytes() -> HashMap<char, u8> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut next = 0x100;
    (0..=255u8)
        .map(|b| {
            if printable(b) {
                (char::from(b), b)
            } else {
                next += 1;
                (
                    char::from_u32(next - 1).unwrap_or(char::REPLACEMENT_CHARACTER),
                    b,
                )
            }
        })
        .collect()
}

/// Whether its count of a text cut just after a "\n" that a letter or a
/// "#" follows is the sum of its counts of the two
/// sides, the second counted as it tokenizes after a newline (its count
/// after a "\n", less the "\n"'s). The joints of the `text` rendering are
/// such cuts: before each "User:", "Assistant:" and "###" (see
/// `history::exact::Sums`). It holds, for any vocabulary, of two kinds:
///
/// - Byte-level BPE over the pre-tokenizer pattern of cl100k (Llama 3),
///   Qwen 2 or Tekken (Mistral Nemo), no normalizer or NFC: BPE runs
///   within the pattern's pieces, and no piece spans such a cut: a piece
///   with a "\n" ends at the last of its run of newlines (Tekken's may
///   take a "/" after it), a letter or a "#" begins its own (the pattern
///   looks ahead, never behind, and never past the run). NFC composes
///   nothing across a "\n".
/// - SentencePiece-style BPE (Llama 2, Gemma): spaces made "▁" (and, for
///   some, one "▁" before the text), no pre-tokenizer, no token that holds
///   a newline beside anything else (Llama 2's "\n" is its byte's token,
///   `<0x0A>`; Gemma's has tokens of runs of newlines): no merge joins a
///   newline to what is not one, so a run of newlines and what follows it
///   are counted apart, and only the text's first piece has the "▁"
///   before it.
///
/// Both also need what the `tokenizers` crate splits out before all else,
/// the added tokens that are not special, to hold no "\n" and take no
/// whitespace beside them (special ones are counted as text here). The
/// caller still checks sums against whole counts on probe texts.
pub fn adds_up(tokenizer: &tokenizers::Tokenizer) -> bool {
    let ModelWrapper::BPE(bpe) = tokenizer.get_model() else {
        return false;
    };
    let added = tokenizer
        .get_added_tokens_decoder()
        .values()
        .all(|t| t.special || !(t.content.contains('\n') || t.lstrip || t.rstrip));
    let normalizer = tokenizer
        .get_normalizer()
        .and_then(|n| serde_json::to_value(n).ok());
    let byte_level = || {
        normalizer.as_ref().is_none_or(|n| n["type"] == "NFC")
            && byte_level_pattern(tokenizer).is_some_and(|p| {
                [CL100K_PATTERN, QWEN2_PATTERN, TEKKEN_PATTERN].contains(&p.as_str())
            })
    };
    let sentence_piece = || {
        let steps = match &normalizer {
            Some(n) if n["type"] == "Sequence" => n["normalizers"].as_array().cloned(),
            Some(n) => Some(vec![n.clone()]),
            None => None,
        };
        let spaces = steps.is_some_and(|steps| {
            steps.iter().any(is_space_replace)
                && steps
                    .iter()
                    .all(|s| is_space_replace(s) || (s["type"] == "Prepend" && s["prepend"] == "▁"))
        });
        if !spaces || tokenizer.get_pre_tokenizer().is_some() || bpe.ignore_merges {
            return false;
        }
        // A copy of the vocabulary (Gemma's: 256,000 tokens), only then.
        let vocab = tokenizer.get_vocab(false);
        let newline =
            (bpe.byte_fallback && vocab.contains_key("<0x0A>")) || vocab.contains_key("\n");
        newline
            && vocab.keys().all(|t| {
                (!t.contains('\n') || t.chars().all(|c| c == '\n'))
                    && (t == "<0x0A>" || !t.contains("<0x0A>"))
            })
    };
    added && plain(bpe) && (byte_level() || sentence_piece())
}

/// The pattern of a byte-level pre-tokenizer: one regex whose matches
/// are the pieces, then bytes as characters, no space added before.
fn byte_level_pattern(tokenizer: &tokenizers::Tokenizer) -> Option<String> {
    // As its file writes it (small, unlike the model).
    let pre = serde_json::to_value(tokenizer.get_pre_tokenizer()?).ok()?;
    let steps = pre["pretokenizers"].as_array()?;
    let byte_level = pre["type"] == "Sequence"
        && steps.len() == 2
        && steps[0]["type"] == "Split"
        && steps[0]["behavior"] == "Isolated"
        && steps[0]["invert"] == false
        && steps[1]["type"] == "ByteLevel"
        && steps[1]["add_prefix_space"] == false
        && steps[1]["use_regex"] == false;
    byte_level.then(|| steps[0]["pattern"]["Regex"].as_str().map(str::to_owned))?
}

/// A BPE that counts the same every time, with nothing added to words.
fn plain(bpe: &tokenizers::models::bpe::BPE) -> bool {
    bpe.dropout.is_none()
        && bpe
            .continuing_subword_prefix
            .as_deref()
            .unwrap_or("")
            .is_empty()
        && bpe.end_of_word_suffix.as_deref().unwrap_or("").is_empty()
}

/// `Replace(" ", "▁")`.
fn is_space_replace(step: &Value) -> bool {
    step["type"] == "Replace" && step["pattern"]["String"] == " " && step["content"] == "▁"
}
