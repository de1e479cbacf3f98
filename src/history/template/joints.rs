//! Exact counts of a concatenation from the counts of its segments.
//!
//! The tiktoken pre-tokenizer (o200k, cl100k, p50k, r50k) cuts a text into
//! pieces, and BPE runs inside each piece. Two kinds of place are always
//! between two pieces, whatever the text around them: call them *cuts*.
//!
//! - An ASCII letter followed by a space: a piece holding a letter ends
//!   with a letter, and a space can only begin one (see
//!   `tokens::count_with_prefix`). What lies before such a cut tokenizes
//!   as it does alone.
//! - A newline followed by a letter, or by a printable ASCII character
//!   other than `/`: no piece holds a newline followed by such a character
//!   (a letter piece never starts with a newline, whitespace pieces hold
//!   only whitespace, and o200k's punctuation pieces may end in newlines
//!   and `/`, nothing else). What lies before such a cut tokenizes as it
//!   does before any non-space other than `/` (the lookahead of
//!   `\s+(?!\S)` only asks "non-space?"): as before a probe letter, so it
//!   is counted as `count(text + "U") - count("U")`, as `tokens` counts a
//!   user line.
//!
//! What follows a cut tokenizes as it does alone (the pre-tokenizer has no
//! look-behind). So a segment with cuts is kept as a [`Run::Cut`]: its head
//! (up to its first cut), the exact count of what lies between its first
//! and last cuts (taken once, and cached), and its tail (after its last
//! cut). Joining two such runs counts the span between their cuts, tail +
//! head: the joint correction. Heads and tails are counted alone only at the
//! ends of a rendering, so each byte is tokenized about once.
//!
//! A segment without a cut (a separator `\n\n`, a header `<history>`, a
//! turn of CJK text in a template that puts no newline in it) is kept whole
//! and joins the end of its neighbour: the span counted at that joint grows
//! by it. Only a chain of such segments makes counted spans long (each turn
//! added then counts the chain again, quadratic in its length); there the
//! tokenizer's pieces may really span the turns, and counting the span is
//! the only exact answer. The built-ins never chain: an `xml` turn holds
//! `n r` (of `<turn role`), a `markdown` turn a newline before `**`.

use std::sync::Arc;

use super::cache::CountCache;
use crate::tokens::Encoding;

/// What follows a newline cut when the text before it is counted.
const PROBE: &str = "U";

/// Counts texts in one encoding through a cache.
#[derive(Debug, Clone)]
pub(super) struct Counter {
    pub encoding: Encoding,
    pub cache: Arc<CountCache>,
}

impl Counter {
    pub fn count(&self, text: &str) -> u32 {
        self.cache.count(self.encoding, &[text])
    }

    /// The count of `a` then `b`, built as one string only on a miss.
    pub fn count_joined(&self, a: &str, b: &str) -> u32 {
        self.cache.count(self.encoding, &[a, b])
    }

    /// The count of `a` then `b` as they tokenize before a cut of `kind`.
    fn count_before(&self, a: &str, b: &str, kind: Kind) -> u32 {
        match kind {
            Kind::LetterSpace => self.count_joined(a, b),
            Kind::Newline => {
                let with_probe = self.cache.count(self.encoding, &[a, b, PROBE]);
                with_probe.saturating_sub(self.count(PROBE))
            }
        }
    }
}

/// A text and its exact count alone (under the counter's encoding).
#[derive(Debug, Clone, Copy)]
pub(super) struct Known<'a> {
    pub text: &'a str,
    pub count: u32,
}

/// The two kinds of cut (see the module's doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    LetterSpace,
    Newline,
}

/// Whether there is a cut just before byte `at` of `text` (0 < `at` <
/// `text.len()`), and of which kind. Looks at bytes, and decodes the
/// character after a newline only (a newline is ASCII, so `at` is then on
/// a character boundary).
fn cut_at(text: &str, at: usize) -> Option<Kind> {
    let bytes = text.as_bytes();
    match bytes[at - 1] {
        b if b.is_ascii_alphabetic() && bytes[at] == b' ' => Some(Kind::LetterSpace),
        b'\n' => {
            let after = text[at..].chars().next()?;
            let text_char = if after.is_ascii() {
                after.is_ascii_graphic() && after != '/'
            } else {
                after.is_alphabetic()
            };
            text_char.then_some(Kind::Newline)
        }
        _ => None,
    }
}

/// The first and the last cut of `text`, each as its byte offset and kind:
/// `text[..first]` is the head and `text[last..]` the tail. Searched from
/// either end, so a long segment costs its ends, not its length.
pub(super) fn cuts(text: &str) -> Option<((usize, Kind), (usize, Kind))> {
    let find = |at: usize| cut_at(text, at).map(|kind| (at, kind));
    let first = (1..text.len()).find_map(find)?;
    let last = (first.0..text.len()).rev().find_map(find)?;
    Some((first, last))
}

/// A part of a text shared with the rendering it is cut from: a clone
/// costs a reference count, not a copy, and a kept rendering holds its
/// ends without a copy of them.
#[derive(Debug, Clone)]
struct Span {
    src: Arc<str>,
    start: usize,
    end: usize,
}

impl Span {
    fn of(src: &Arc<str>, range: std::ops::Range<usize>) -> Self {
        Span {
            src: src.clone(),
            start: range.start,
            end: range.end,
        }
    }

    fn joined(a: &str, b: &str) -> Self {
        let src: Arc<str> = [a, b].concat().into();
        Span::of(&src, 0..src.len())
    }

    fn as_str(&self) -> &str {
        &self.src[self.start..self.end]
    }

    fn len(&self) -> usize {
        self.end - self.start
    }
}

/// A text whose count is taken when first needed: as it tokenizes before
/// a cut of `before` (a head), or at the end of the text (a tail, `None`).
#[derive(Debug, Clone)]
pub(super) struct End {
    text: Span,
    before: Option<Kind>,
    count: Option<u32>,
}

impl End {
    fn new(text: Span, before: Option<Kind>) -> Self {
        End {
            text,
            before,
            count: None,
        }
    }

    fn text(&self) -> &str {
        self.text.as_str()
    }

    fn count(&mut self, counter: &Counter) -> u32 {
        let (text, before) = (self.text.as_str(), self.before);
        *self.count.get_or_insert_with(|| match before {
            Some(kind) => counter.count_before(text, "", kind),
            None => counter.count(text),
        })
    }

    fn append(self, text: &str) -> Self {
        if text.is_empty() {
            return self;
        }
        End::new(Span::joined(self.text(), text), self.before)
    }

    fn prepend(self, text: &str) -> Self {
        if text.is_empty() {
            return self;
        }
        End::new(Span::joined(text, self.text()), self.before)
    }
}

/// Consecutive segments of a rendering, as the counter keeps them.
#[derive(Debug, Clone)]
pub(super) enum Run {
    /// No cut inside: the whole text.
    Whole(End),
    /// `head`, then exactly `inner` tokens, then `tail`: the text cut at its
    /// first and last cuts.
    Cut { head: End, inner: u64, tail: End },
}

impl Default for Run {
    fn default() -> Self {
        Run::Whole(End {
            text: Span::of(&Arc::from(""), 0..0),
            before: None,
            count: Some(0),
        })
    }
}

impl Run {
    /// A rendered segment: counted (through the cache) between its first
    /// and last cuts; its ends are counted in the joint spans they fall in,
    /// or alone if they start or end the rendering. Without a cut it is
    /// kept whole.
    pub fn segment(text: &str, counter: &Counter) -> Run {
        Self::segment_knowing(&text.into(), counter, [])
    }

    /// As [`Run::segment`], without tokenizing what lies inside `known`
    /// texts found in `text` as they are: a turn's contents, whose counts
    /// alone were taken when they were written. Such a text cut at its own
    /// first and last cuts (which are cuts of `text` too) counts, between
    /// them, its count alone less its two ends; only its ends and what lies
    /// between the texts (the template's markup) are tokenized. A text not
    /// found as it is (escaped, say) changes nothing. The run's ends are
    /// parts of `shared`, not copies.
    pub fn segment_knowing<'a>(
        shared: &Arc<str>,
        counter: &Counter,
        known: impl IntoIterator<Item = Known<'a>>,
    ) -> Run {
        let text: &str = shared;
        let Some(((first, first_kind), (last, last_kind))) = cuts(text) else {
            return Run::Whole(End::new(Span::of(shared, 0..text.len()), None));
        };
        let mut inner = 0u64;
        // What is counted so far: text[first..at].
        let mut at = first;
        for k in known {
            let Some(((f, f_kind), (l, _))) = cuts(k.text) else {
                continue;
            };
            let Some(found) = find_from(text, at, k.text) else {
                continue;
            };
            let head = counter.count_before(&k.text[..f], "", f_kind);
            let tail = counter.count(&k.text[l..]);
            let Some(k_inner) = k.count.checked_sub(head + tail) else {
                continue; // not its count: count it as markup
            };
            let (from, to) = (found + f, found + l);
            if at < from {
                inner += u64::from(counter.count_before(&text[at..from], "", f_kind));
            }
            inner += u64::from(k_inner);
            at = to;
        }
        if at < last {
            inner += u64::from(counter.count_before(&text[at..last], "", last_kind));
        }
        Run::Cut {
            head: End::new(Span::of(shared, 0..first), Some(first_kind)),
            inner,
            tail: End::new(Span::of(shared, last..text.len()), None),
        }
    }

    /// The bytes of its ends: before its first cut and after its last (the
    /// whole text, twice, without a cut). Joining it to a neighbour counts
    /// a span of an end of each.
    pub fn ends(&self) -> (usize, usize) {
        match self {
            Run::Whole(end) => (end.text.len(), end.text.len()),
            Run::Cut { head, tail, .. } => (head.text.len(), tail.text.len()),
        }
    }

    pub fn is_cut(&self) -> bool {
        matches!(self, Run::Cut { .. })
    }

    /// The exact count of the run's text.
    pub fn count(&mut self, counter: &Counter) -> u64 {
        match self {
            Run::Whole(end) => u64::from(end.count(counter)),
            Run::Cut { head, inner, tail } => {
                u64::from(head.count(counter)) + *inner + u64::from(tail.count(counter))
            }
        }
    }

    /// `self` followed by `next`. Two cut runs count the span between their
    /// cuts now (the joint correction); a whole run joins the other's end.
    pub fn then(self, next: Run, counter: &Counter) -> Run {
        match (self, next) {
            (Run::Whole(a), Run::Whole(b)) => Run::Whole(a.append(b.text())),
            (Run::Cut { head, inner, tail }, Run::Whole(b)) => Run::Cut {
                head,
                inner,
                tail: tail.append(b.text()),
            },
            (Run::Whole(a), Run::Cut { head, inner, tail }) => Run::Cut {
                head: head.prepend(a.text()),
                inner,
                tail,
            },
            (
                Run::Cut {
                    head,
                    inner: a_inner,
                    tail: a_tail,
                },
                Run::Cut {
                    head: b_head,
                    inner: b_inner,
                    tail,
                },
            ) => {
                let joint = joint(&a_tail, &b_head, counter);
                Run::Cut {
                    head,
                    inner: a_inner + joint + b_inner,
                    tail,
                }
            }
        }
    }

    /// The exact count of `self` followed by `next`, without building the
    /// joined run: what a candidate costs between a fixed beginning and
    /// the rest.
    pub fn count_joined(&mut self, next: &mut Run, counter: &Counter) -> u64 {
        match (self, next) {
            (Run::Whole(a), Run::Whole(b)) => u64::from(counter.count_joined(a.text(), b.text())),
            (Run::Cut { head, inner, tail }, Run::Whole(b)) => {
                u64::from(head.count(counter))
                    + *inner
                    + u64::from(counter.count_joined(tail.text(), b.text()))
            }
            (Run::Whole(a), Run::Cut { head, inner, tail }) => {
                joint(a, head, counter) + *inner + u64::from(tail.count(counter))
            }
            (
                Run::Cut {
                    head,
                    inner: a_inner,
                    tail: a_tail,
                },
                Run::Cut {
                    head: b_head,
                    inner: b_inner,
                    tail,
                },
            ) => {
                u64::from(head.count(counter))
                    + *a_inner
                    + joint(a_tail, b_head, counter)
                    + *b_inner
                    + u64::from(tail.count(counter))
            }
        }
    }
}

/// Where `needle` is in `text` at or after `from`, if it is at the first
/// place its beginning is: a search for a long needle sets up in time of
/// its length (std's and memchr's alike), which cost more than the rest of
/// a rendering, and trying every place could take a text's length times
/// the needle's. A needle missed (its beginning also in the markup before
/// it) is only counted as markup.
fn find_from(text: &str, from: usize, needle: &str) -> Option<usize> {
    let mut prefix = needle.len().min(32);
    while !needle.is_char_boundary(prefix) {
        prefix -= 1;
    }
    let at = from + text[from..].find(&needle[..prefix])?;
    text[at..].starts_with(needle).then_some(at)
}

/// The span from a cut (or the start) through `head`, which ends at a cut:
/// `a` then `head`, counted as they tokenize before that cut.
fn joint(a: &End, head: &End, counter: &Counter) -> u64 {
    let kind = head.before.unwrap_or(Kind::LetterSpace);
    u64::from(counter.count_before(a.text(), head.text(), kind))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn counter(encoding: Encoding) -> Counter {
        Counter {
            encoding,
            cache: Arc::new(CountCache::new(4096)),
        }
    }

    /// The run of `segments` in order, joined as a selection joins them.
    fn run_of(segments: &[String], c: &Counter) -> Run {
        segments
            .iter()
            .fold(Run::default(), |run, s| run.then(Run::segment(s, c), c))
    }

    #[test]
    fn cuts_are_letters_before_a_space_and_newlines_before_text() {
        use Kind::*;
        assert_eq!(cuts("ab cd ef"), Some(((2, LetterSpace), (5, LetterSpace))));
        assert_eq!(cuts("a b"), Some(((1, LetterSpace), (1, LetterSpace))));
        assert_eq!(cuts("1 2, x\ty\n z\n\n/x\n"), None);
        assert_eq!(cuts("é a"), None, "é is not an ASCII letter");
        assert_eq!(
            cuts("漢字 and more"),
            Some(((10, LetterSpace), (10, LetterSpace)))
        );
        assert_eq!(
            cuts("**U:** 漢\n\n**A:** 字"),
            Some(((12, Newline), (12, Newline)))
        );
        assert_eq!(
            cuts("。\n漢\n1 x y"),
            Some(((4, Newline), (11, LetterSpace)))
        );
        assert_eq!(cuts("\n🙂"), None, "an emoji is not a letter");
        assert_eq!(cuts(""), None);
    }

    #[test]
    fn summing_segment_counts_alone_is_wrong_at_joints() {
        // What the joint correction is for: these joints merge pieces.
        let enc = Encoding::O200kBase;
        let parts = [
            "<turn role=\"user\">hi</turn>",
            "<turn role=\"user\">yo</turn>",
        ];
        let naive: u32 = parts.iter().map(|p| enc.count(p)).sum();
        assert_ne!(naive, enc.count(&parts.concat()));
        let c = counter(enc);
        let mut run = run_of(&parts.map(String::from), &c);
        assert_eq!(run.count(&c), u64::from(enc.count(&parts.concat())));
    }

    #[test]
    fn text_before_a_newline_cut_counts_as_it_tokenizes_before_text() {
        // p50k makes two pieces of "\n\n" before "#", one at the end.
        let enc = Encoding::P50kBase;
        let c = counter(enc);
        let in_context = enc.count("\n\n#") - enc.count("#");
        assert_eq!(c.count_before("\n", "\n", Kind::Newline), in_context);
        assert_ne!(in_context, enc.count("\n\n"));
        // The whole "\n" joins the head "\n" of the second segment.
        let segments = ["\n".to_string(), "\n#".to_string()];
        assert_eq!(
            run_of(&segments, &c).count(&c),
            u64::from(enc.count("\n\n#"))
        );
    }

    #[test]
    fn a_repeated_join_tokenizes_nothing() {
        let c = counter(Encoding::Cl100kBase);
        let segments: Vec<String> = (0..20)
            .map(|i| format!("<turn>question {i} here</turn><turn>the answer {i}</turn>"))
            .collect();
        let first = run_of(&segments, &c).count(&c);
        let tokenized = c.cache.tokenized();
        assert_eq!(run_of(&segments, &c).count(&c), first);
        assert_eq!(c.cache.tokenized(), tokenized);
    }

    fn segment() -> impl Strategy<Value = String> {
        proptest::collection::vec(
            prop_oneof![
                "[a-zA-Z]{1,6}",
                Just(" ".to_string()),
                Just("  ".to_string()),
                Just("\n\n".to_string()),
                Just("\t".to_string()),
                "[.,!?:;'\"<>/&*#-]{1,3}",
                "[0-9]{1,4}",
                "[漢字🙂é]{1,3}",
                "\n[*#/a-zA-Z漢🙂 -]{1,2}",
                "[\r\n]{1,3}",
                Just("'s".to_string()),
                Just("<|endoftext|>".to_string()),
                Just(" [truncated]".to_string()),
            ],
            0..8,
        )
        .prop_map(|p| p.concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]

        #[test]
        fn known_texts_count_without_their_insides(
            markup in proptest::collection::vec(segment(), 3),
            texts in proptest::collection::vec(segment(), 2),
            wrong in any::<bool>(),
            encoding in 0..Encoding::ALL.len(),
        ) {
            let enc = Encoding::ALL[encoding];
            let c = counter(enc);
            let piece = format!("{}{}{}{}{}", markup[0], texts[0], markup[1], texts[1], markup[2]);
            let whole = u64::from(enc.count(&piece));
            let known: Vec<Known> = texts
                .iter()
                .map(|t| Known { text: t, count: enc.count(t) })
                .collect();
            let piece: Arc<str> = piece.into();
            let mut run = Run::segment_knowing(&piece, &c, known.iter().copied());
            prop_assert_eq!(run.count(&c), whole);
            // Joined to neighbours, as a selection joins turns.
            let mut around = run_of(&[markup[2].clone()], &c);
            let mut joined = run.then(around.clone(), &c);
            prop_assert_eq!(
                joined.count(&c),
                u64::from(enc.count(&format!("{piece}{}", markup[2])))
            );
            prop_assert_eq!(
                around.count_joined(&mut Run::segment_knowing(&piece, &c, known.iter().copied()), &c),
                u64::from(enc.count(&format!("{}{piece}", markup[2])))
            );
            // A count too small to be the text's is not believed.
            if wrong {
                let lies = [Known { text: &texts[0], count: 0 }];
                prop_assert_eq!(Run::segment_knowing(&piece, &c, lies).count(&c), whole);
            }
        }

        #[test]
        fn joined_runs_count_exactly(
            segments in proptest::collection::vec(segment(), 0..8),
            split in 0usize..8,
            encoding in 0..Encoding::ALL.len(),
        ) {
            let enc = Encoding::ALL[encoding];
            let c = counter(enc);
            let whole = u64::from(enc.count(&segments.concat()));
            prop_assert_eq!(run_of(&segments, &c).count(&c), whole);
            let (a, b) = segments.split_at(split.min(segments.len()));
            let (mut a, mut b) = (run_of(a, &c), run_of(b, &c));
            prop_assert_eq!(a.count_joined(&mut b, &c), whole);
        }
    }
}
