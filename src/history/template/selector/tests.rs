use proptest::prelude::*;

use super::*;
use crate::domain::TurnId;
use crate::history::candidate::{Content, TRUNCATION_MARK, truncate};
use crate::history::template::Templates;
use crate::tokens::{AnswerTokens, Encoding, QueryTokens, TurnCosts};
use crate::turn::TurnView;

mod cost;

const GLOBALS: Globals<'static> = Globals {
    session_id: "s-42",
    user_id: Some("alice"),
};

fn candidate(seq: u64, q: &str, a: &str) -> Candidate {
    let enc = Encoding::O200kBase;
    Candidate {
        turn_id: TurnId::generate(),
        seq,
        started_at: 1_795_000_000_000 + seq as i64,
        finalized_at: 1_795_000_001_000 + seq as i64,
        user_query: Content::whole(q),
        final_answer: Content::whole(a),
        costs: TurnCosts::new(
            q,
            QueryTokens::count(enc, q),
            a,
            AnswerTokens::count(enc, a),
        ),
        recount: false,
        copies: Default::default(),
    }
}

/// `c` as a template sees it under `o`, truncated as `Selector`
/// truncates it.
fn selected_turn(c: &Candidate, o: &Options) -> SelectedTurn {
    let (user_query, query_cut) = truncate(c.user_query.clone(), o.max_query_chars);
    let (final_answer, answer_cut) = truncate(c.final_answer.clone(), o.max_answer_chars);
    SelectedTurn {
        truncated: query_cut || answer_cut,
        turn: TurnView {
            turn_id: c.turn_id,
            seq: c.seq,
            started_at: c.started_at,
            finalized_at: c.finalized_at,
            user_query,
            final_answer,
            user_query_en: None,
            final_answer_en: None,
        },
    }
}

fn candidates(pairs: &[(&str, &str)]) -> Vec<Candidate> {
    pairs
        .iter()
        .enumerate()
        .map(|(i, (q, a))| candidate(i as u64 + 1, q, a))
        .collect()
}

fn opts(encoding: Encoding, max_tokens: u32) -> Options {
    Options {
        limit: 20,
        max_tokens,
        ..Options::everything(encoding)
    }
}

fn builtin(name: &str) -> Template {
    Templates::load(None).unwrap().get(name).unwrap().clone()
}

/// User templates that stress joints: no separators at all (pieces of
/// the tokenizer span turns), and text in every fixed part.
fn user_template(name: &str) -> Template {
    let source = match name {
        "bare" => {
            "{% macro turn(turn) %}{{ turn.user_query }}{{ turn.final_answer }}{% endmacro %}"
        }
        "chat" => concat!(
            "{% macro summary(summary) %}Summary to {{ summary.through_seq }}: {{ summary.text }}\n{% endmacro %}",
            "{% macro header() %}Conversation with {{ user_id }} in {{ session_id }}:\n{% endmacro %}",
            "{% macro turn(turn) %}#{{ turn.seq }} U: {{ turn.user_query }}\nA: {{ turn.final_answer }}",
            "{% if turn.truncated %} (cut){% endif %}{% endmacro %}",
            "{% macro separator() %}\n---\n{% endmacro %}",
            "{% macro footer() %}\n(end of history){% endmacro %}",
        ),
        _ => unreachable!(),
    };
    Template::compile(name, source).unwrap()
}

/// `select_template` with a cache of the test's own.
fn pick(
    cs: &[Candidate],
    o: &Options,
    t: &Template,
    summary: Option<&Summary>,
    caches: &Caches,
) -> Result<TemplateSelection, TemplateError> {
    let read = cs.iter().map(|c| Candidate {
        user_query: Content::for_read(&c.user_query.text, o.max_query_chars),
        final_answer: Content::for_read(&c.final_answer.text, o.max_answer_chars),
        ..c.clone()
    });
    let mut read = read.collect::<Vec<_>>().into_iter();
    let mut s = TemplateSelector::with_caches(t, o, &GLOBALS, summary, caches.clone())?;
    if o.keep_first
        && let Some(first) = read.next()
        && !s.reserve_first(first)?
    {
        return Ok(s.finish());
    }
    for c in read.rev() {
        if !s.offer(c)? {
            break;
        }
    }
    Ok(s.finish())
}

/// The rule applied naively: each candidate rendering rendered whole
/// and counted fresh. Returns the selected seqs, the stop, and the
/// fresh count of the rendering that was refused, if one was.
fn reference(
    cs: &[Candidate],
    o: &Options,
    t: &Template,
    summary: Option<&Summary>,
) -> (Vec<u64>, Option<StoppedBy>, Option<u32>) {
    let fresh = |turns: &[SelectedTurn], s: Option<&Summary>| {
        o.encoding.count(&t.render(&GLOBALS, s, turns).unwrap())
    };
    let selected = |c: &Candidate| selected_turn(c, o);
    let mut bytes = 0u64;
    if let Some(s) = summary {
        let tokens = fresh(&[], Some(s));
        if tokens > o.max_tokens {
            return (vec![], Some(StoppedBy::MaxTokens), Some(tokens));
        }
        if s.text.len() as u64 > o.max_bytes {
            return (vec![], Some(StoppedBy::MaxBytes), None);
        }
        bytes = s.text.len() as u64;
    }
    let mut order: Vec<&Candidate> = Vec::new();
    if o.keep_first && !cs.is_empty() {
        order.push(&cs[0]);
        order.extend(cs[1..].iter().rev());
    } else {
        order.extend(cs.iter().rev());
    }
    let mut taken: Vec<SelectedTurn> = Vec::new(); // oldest first
    for (i, c) in order.into_iter().enumerate() {
        if taken.len() == o.limit {
            return (seqs(&taken), Some(StoppedBy::Limit), None);
        }
        let turn = selected(c);
        let turn_bytes = (turn.turn.user_query.len() + turn.turn.final_answer.len()) as u64;
        let mut with = taken.clone();
        let at = if o.keep_first && i > 0 { 1 } else { 0 };
        with.insert(at, turn);
        let tokens = fresh(&with, summary);
        if tokens > o.max_tokens {
            return (seqs(&taken), Some(StoppedBy::MaxTokens), Some(tokens));
        }
        if bytes + turn_bytes > o.max_bytes {
            return (seqs(&taken), Some(StoppedBy::MaxBytes), None);
        }
        bytes += turn_bytes;
        taken = with;
    }
    (seqs(&taken), None, None)
}

fn seqs(turns: &[SelectedTurn]) -> Vec<u64> {
    turns.iter().map(|t| t.turn.seq).collect()
}

/// Everything a selection must satisfy against the naive rule.
fn check(
    cs: &[Candidate],
    o: &Options,
    t: &Template,
    summary: Option<&Summary>,
) -> Result<TemplateSelection, TestCaseError> {
    let caches = Caches::new(1 << 12, 1 << 20);
    let s = pick(cs, o, t, summary, &caches).unwrap();
    let rendered = t
        .render(&GLOBALS, summary.filter(|_| s.summary), &s.turns)
        .unwrap();
    prop_assert_eq!(&s.rendered, &rendered);
    prop_assert_eq!(
        s.token_count,
        o.encoding.count(&s.rendered),
        "{:?}",
        s.rendered
    );
    prop_assert!(s.token_count <= o.max_tokens);
    prop_assert!(s.bytes <= o.max_bytes);
    let contents: usize = s
        .turns
        .iter()
        .map(|t| t.turn.user_query.len() + t.turn.final_answer.len())
        .sum();
    let summary_bytes = summary.filter(|_| s.summary).map_or(0, |x| x.text.len());
    prop_assert_eq!(s.bytes, (contents + summary_bytes) as u64);
    let (expected, stopped_by, refused) = reference(cs, o, t, summary);
    prop_assert_eq!(seqs(&s.turns), expected);
    prop_assert_eq!(s.stopped_by, stopped_by);
    if s.stopped_by == Some(StoppedBy::MaxTokens) {
        // Taking one more (or the summary alone) would exceed the budget.
        prop_assert!(refused.is_some_and(|n| n > o.max_tokens));
    }
    // A second read counts the same through the warm caches, taking
    // the turns it renders as rendered before, and tokenizes nothing.
    let tokenized = caches.counts.tokenized();
    prop_assert_eq!(pick(cs, o, t, summary, &caches).unwrap(), s.clone());
    prop_assert_eq!(caches.counts.tokenized(), tokenized);
    Ok(s)
}

#[test]
fn xml_selection_is_exact_and_renders_the_turns() {
    let cs = candidates(&[
        ("What is 2+2?", "4."),
        ("And <b>?", "It's \"bold\" & more."),
    ]);
    for enc in Encoding::ALL {
        let s = check(&cs, &opts(enc, 4096), &builtin("xml"), None).unwrap();
        assert_eq!(s.turns.len(), 2);
        assert_eq!(s.stopped_by, None);
    }
}

#[test]
fn the_first_turn_that_does_not_fit_stops_the_selection() {
    let big = "word ".repeat(200);
    let cs = candidates(&[("tiny", "tiny"), ("q", &big), ("q3", "a3")]);
    let s = check(
        &cs,
        &opts(Encoding::O200kBase, 60),
        &builtin("markdown"),
        None,
    )
    .unwrap();
    assert_eq!(seqs(&s.turns), [3]);
    assert_eq!(s.stopped_by, Some(StoppedBy::MaxTokens));
}

#[test]
fn keep_first_inserts_between_the_first_and_the_newest_run() {
    let big = "word ".repeat(200);
    let cs = candidates(&[
        ("goal", "ok"),
        ("q", &big),
        ("q3", "a3"),
        ("q4", "a4"),
        ("q5", "a5"),
    ]);
    for name in ["xml", "markdown"] {
        let mut o = opts(Encoding::Cl100kBase, 120);
        o.keep_first = true;
        let s = check(&cs, &o, &builtin(name), None).unwrap();
        assert_eq!(seqs(&s.turns), [1, 3, 4, 5], "{name}");
        assert_eq!(s.stopped_by, Some(StoppedBy::MaxTokens));
    }
    let mut o = opts(Encoding::O200kBase, 4096);
    o.keep_first = true;
    o.limit = 2;
    let s = check(&cs, &o, &builtin("xml"), None).unwrap();
    assert_eq!(
        (seqs(&s.turns), s.stopped_by),
        (vec![1, 5], Some(StoppedBy::Limit))
    );
}

#[test]
fn keep_first_with_no_room_for_the_first_turn_keeps_nothing() {
    let cs = candidates(&[("goal", &"word ".repeat(200)), ("q2", "a2")]);
    let mut o = opts(Encoding::O200kBase, 60);
    o.keep_first = true;
    let s = check(&cs, &o, &builtin("xml"), None).unwrap();
    assert_eq!((s.rendered.as_str(), s.token_count), ("", 0));
    assert_eq!(s.stopped_by, Some(StoppedBy::MaxTokens));
}

#[test]
fn the_summary_counts_first_and_may_stand_alone() {
    let cs = candidates(&[("q1", "a1"), ("q2", "a2")]);
    let summary = Summary {
        text: "The user asked about keys & locks.".into(),
        through_seq: 0,
    };
    for name in ["xml", "markdown"] {
        let t = builtin(name);
        let s = check(&cs, &opts(Encoding::O200kBase, 4096), &t, Some(&summary)).unwrap();
        assert!(s.summary && s.turns.len() == 2, "{name}");

        let mut o = opts(Encoding::P50kBase, 4096);
        o.limit = 0;
        let s = check(&cs, &o, &t, Some(&summary)).unwrap();
        assert!(s.summary && s.turns.is_empty());
        assert_eq!(s.rendered, t.render(&GLOBALS, Some(&summary), &[]).unwrap());
        assert_eq!(s.stopped_by, Some(StoppedBy::Limit));
        assert_eq!(s.bytes, summary.text.len() as u64);

        let alone = s.token_count;
        let s = check(
            &cs,
            &opts(Encoding::P50kBase, alone - 1),
            &t,
            Some(&summary),
        )
        .unwrap();
        assert!(!s.summary && s.rendered.is_empty() && s.turns.is_empty());
        assert_eq!(s.stopped_by, Some(StoppedBy::MaxTokens));

        let mut o = opts(Encoding::P50kBase, 4096);
        o.max_bytes = summary.text.len() as u64 - 1;
        let s = check(&cs, &o, &t, Some(&summary)).unwrap();
        assert!(!s.summary && s.rendered.is_empty());
        assert_eq!(s.stopped_by, Some(StoppedBy::MaxBytes));

        o.max_bytes = summary.text.len() as u64 + 4;
        let s = check(&cs, &o, &t, Some(&summary)).unwrap();
        assert_eq!(
            (seqs(&s.turns), s.stopped_by),
            (vec![2], Some(StoppedBy::MaxBytes))
        );
    }
}

#[test]
fn a_summary_without_a_summary_macro_is_a_template_error() {
    let t = user_template("bare");
    let summary = Summary {
        text: "s".into(),
        through_seq: 1,
    };
    let err = TemplateSelector::new(
        &t,
        &opts(Encoding::O200kBase, 100),
        &GLOBALS,
        Some(&summary),
    )
    .unwrap_err();
    assert_eq!(err.to_string(), "template bare has no summary macro");
}

#[test]
fn the_byte_cap_counts_contents_not_markup() {
    let cs = candidates(&[("q1", "a1"), ("q2", "aa2"), ("q3", "a3")]);
    let mut o = opts(Encoding::O200kBase, 4096);
    o.max_bytes = 8;
    let s = check(&cs, &o, &builtin("xml"), None).unwrap();
    assert_eq!((seqs(&s.turns), s.bytes), (vec![3], 4));
    assert_eq!(s.stopped_by, Some(StoppedBy::MaxBytes));
}

#[test]
fn truncation_happens_before_rendering() {
    let cs = candidates(&[("héllo wörld", "ünïcode ✓ answer")]);
    let mut o = opts(Encoding::O200kBase, 4096);
    o.max_answer_chars = Some(9);
    let s = check(&cs, &o, &user_template("chat"), None).unwrap();
    assert!(s.turns[0].truncated);
    assert!(
        s.rendered
            .contains(&format!("A: ünïcode ✓{TRUNCATION_MARK} (cut)")),
        "{}",
        s.rendered
    );
}

#[test]
fn turns_without_letter_space_cuts_are_counted_exactly() {
    let cjk = candidates(&[("漢字漢字", "字漢。"), ("🙂🙂", "漢字\n\n"), ("字", "漢")]);
    for enc in Encoding::ALL {
        for t in [builtin("markdown"), user_template("bare")] {
            check(&cjk, &opts(enc, 4096), &t, None).unwrap();
        }
    }
}

#[test]
fn a_failing_turn_is_an_error_with_its_line() {
    let t = Template::compile(
        "picky",
        "{% macro turn(turn) %}\n{% if turn.seq == 2 %}{{ turn.nope }}{% endif %}x{% endmacro %}",
    )
    .unwrap();
    let cs = candidates(&[("q1", "a1"), ("q2", "a2"), ("q3", "a3")]);
    let err = select_template(
        cs.into_iter(),
        &opts(Encoding::O200kBase, 4096),
        &t,
        &GLOBALS,
        None,
    )
    .unwrap_err();
    assert_eq!(err.line, Some(2), "{err}");
}

fn content() -> impl Strategy<Value = String> {
    // Whitespace runs at either end, words, CJK without spaces, emoji,
    // XML specials, special-token text and the truncation mark: what
    // moves the pre-tokenizer's cuts around joints.
    let part = prop_oneof![
        "[a-zA-Z]{1,8}",
        " [a-zA-Z]{1,6}",
        Just("\n\n".to_string()),
        Just("  ".to_string()),
        Just("\t".to_string()),
        "[ \n]{1,5}",
        "[.,!?;:'\"()/-]{1,3}",
        "[<>&\"']{1,3}",
        "[0-9]{1,5}",
        "[漢字語]{1,6}",
        "[🙂👍]{1,2}",
        Just("é".to_string()),
        Just("'s".to_string()),
        Just("<|endoftext|>".to_string()),
        Just(TRUNCATION_MARK.to_string()),
    ];
    let edge = || prop_oneof![Just(""), Just("\n\n"), Just("  "), Just("\t"), Just(" ")];
    (edge(), proptest::collection::vec(part, 1..10), edge())
        .prop_map(|(start, body, end)| format!("{start}{}{end}", body.concat()))
}

fn template_strategy() -> impl Strategy<Value = &'static str> {
    prop_oneof![Just("xml"), Just("markdown"), Just("bare"), Just("chat")]
}

fn named(name: &str) -> Template {
    match name {
        "xml" | "markdown" => builtin(name),
        _ => user_template(name),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn selections_are_exact_and_follow_the_rule(
        pairs in proptest::collection::vec((content(), content()), 0..7),
        template in template_strategy(),
        encoding in 0..Encoding::ALL.len(),
        max_tokens in 0u32..250,
        max_bytes in prop_oneof![Just(u64::MAX), 0u64..300],
        limit in 0usize..9,
        keep_first in any::<bool>(),
        max_query_chars in proptest::option::of(1usize..15),
        max_answer_chars in proptest::option::of(1usize..15),
        summary in proptest::option::of(content()),
    ) {
        let t = named(template);
        let summary = summary
            .filter(|_| matches!(template, "xml" | "markdown" | "chat"))
            .map(|text| Summary { text, through_seq: 9 });
        let pairs: Vec<(&str, &str)> = pairs.iter().map(|(q, a)| (q.as_str(), a.as_str())).collect();
        let o = Options {
            limit, max_tokens, max_bytes, max_query_chars, max_answer_chars, keep_first,
            ..opts(Encoding::ALL[encoding], 0)
        };
        check(&candidates(&pairs), &o, &t, summary.as_ref())?;
    }
}
