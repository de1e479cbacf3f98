//! What a read costs: the caches it renders and counts through (a turn's
//! rendering and the fixed parts, each reused only where it renders
//! alike), what a cold read tokenizes, and the cap on what an operator's
//! template may render.

use super::*;

#[test]
fn a_template_selects_through_the_caches_it_was_given() {
    // Arrange: the built-ins with caches of their own (16 shards of two
    // 2 KiB generations), and 300 turns rendered in about 100 KB.
    let budget = 64 * 1024;
    let caches = Caches::new(1024, budget);
    let templates = Templates::load(None).unwrap().with_caches(&caches);
    let xml = templates.get("xml").unwrap();
    let pairs: Vec<(String, String)> = (0..300)
        .map(|i| {
            (
                format!("question {i}"),
                format!("the answer to question {i}"),
            )
        })
        .collect();
    let pairs: Vec<(&str, &str)> = pairs.iter().map(|(q, a)| (&q[..], &a[..])).collect();
    let cs = candidates(&pairs);
    let o = Options {
        limit: 300,
        ..opts(Encoding::O200kBase, 1_000_000)
    };
    let read =
        |cs: &[Candidate]| select_template(cs.iter().cloned(), &o, xml, &GLOBALS, None).unwrap();

    // Act
    let first = read(&cs[290..]);
    let hits = caches.turns.hits();
    let again = read(&cs[290..]);
    let hits_again = caches.turns.hits() - hits;
    let everything = read(&cs);

    // Assert: the selections rendered into these caches (a repeat
    // found its 10 turns there), which kept within their budget.
    assert_eq!(again, first);
    assert_eq!(hits_again, 10);
    assert_eq!(everything.turns.len(), 300);
    assert!(caches.turns.bytes() > 0);
    assert!(caches.turns.bytes() <= budget, "{}", caches.turns.bytes());
    assert!(caches.counts.len() <= 1024);
}

#[test]
fn an_operators_rendering_is_capped_before_it_is_counted() {
    // Arrange: a template repeating a string far beyond its contents,
    // 300 KB a turn, and a history cap of 100 bytes (a rendering of
    // 1 MiB and 200 bytes at most: three turns, not four).
    let t = Template::compile(
        "bloat",
        "{% macro header() %}<hh>{% endmacro %}\n\
         {% macro turn(turn) %}{{ turn.user_query }}{{ 'word ' * 60000 }}{% endmacro %}",
    )
    .unwrap();
    let cs = candidates(&[("q1", "a1"), ("q2", "a2"), ("q3", "a3"), ("q4", "a4")]);
    let mut o = opts(Encoding::O200kBase, 10_000_000);
    o.max_bytes = 100;
    let max = max_rendering_bytes(o.max_bytes);
    assert_eq!(max, 200 + 1024 * 1024);
    let caches = Caches::new(1 << 12, 1 << 22);

    // Act
    let err = pick(&cs, &o, &t, None, &caches).unwrap_err();
    let tokenized = caches.counts.tokenized_bytes();
    let again = pick(&cs, &o, &t, None, &caches).unwrap_err();
    let two = pick(&cs[2..], &o, &t, None, &caches).unwrap();

    // Assert: the fourth piece passes the cap (the first three found
    // in the cache the second time): an error naming the turn macro,
    // and the piece that passed it was not counted.
    assert_eq!(err.line, Some(2), "{err}");
    assert_eq!(
        err.message,
        format!(
            "the rendering is larger than {max} bytes \
             (twice TURNSTORE_MAX_HISTORY_BYTES and 1 MiB)"
        )
    );
    assert_eq!(again, err);
    assert!(tokenized < 3 * 300_002 + 1024, "{tokenized}");
    assert_eq!(two.turns.len(), 2);
    assert_eq!(two.rendered.len(), 4 + 2 * 300_002);
    // A rendering of exactly the cap is whole; one byte less fails.
    let four = 4 + 4 * 300_002;
    o.max_bytes = (four - 1024 * 1024) / 2;
    assert_eq!(max_rendering_bytes(o.max_bytes), four);
    let whole = pick(&cs, &o, &t, None, &caches).unwrap();
    assert_eq!(whole.rendered.len() as u64, four);
    o.max_bytes -= 1;
    assert!(pick(&cs, &o, &t, None, &caches).is_err());
}

#[test]
fn the_built_ins_are_not_held_to_the_rendering_cap() {
    // Quotes escape to six bytes each in `xml`: four times the cap.
    let quotes = "'".repeat(200_000);
    let cs = candidates(&[(&quotes, &quotes)]);
    let mut o = opts(Encoding::O200kBase, 10_000_000);
    o.max_bytes = 400_000;
    let s = select_template(cs.into_iter(), &o, &builtin("xml"), &GLOBALS, None).unwrap();
    assert!(s.rendered.len() as u64 > max_rendering_bytes(o.max_bytes));
}

/// A cold read of `pairs` (every turn the same size) with `template`:
/// the bytes it tokenized, and the bytes it rendered.
fn cold_read(pairs: &[(String, String)], template: &Template, enc: Encoding) -> (u64, u64) {
    let pairs: Vec<(&str, &str)> = pairs
        .iter()
        .map(|(q, a)| (q.as_str(), a.as_str()))
        .collect();
    let cs = candidates(&pairs);
    let caches = Caches::new(1 << 14, 1 << 20);
    let o = Options {
        limit: cs.len(),
        ..opts(enc, 10_000_000)
    };
    let s = pick(&cs, &o, template, None, &caches).unwrap();
    assert_eq!(s.turns.len(), cs.len());
    assert_eq!(s.token_count, enc.count(&s.rendered));
    (caches.counts.tokenized_bytes(), s.rendered.len() as u64)
}

#[test]
fn a_cold_read_tokenizes_about_what_it_renders_once() {
    // Each turn's piece once, plus its short ends and joints: nothing
    // like the sum over turns of the rendering so far (×25 here) that a
    // count of each candidate rendering would be. Every text differs,
    // so that no count comes from an earlier turn of the same read.
    let answer = "Rotate the keys in three steps, then roll the deployment again. ".repeat(10);
    let english: Vec<_> = (0..50)
        .map(|i| {
            (
                format!("How do I rotate key {i}?"),
                format!("{answer}Done {i}."),
            )
        })
        .collect();
    // No ASCII letter before a space anywhere: only newline cuts.
    let cjk: Vec<_> = (0..50)
        .map(|i| {
            (
                format!("密钥{i}怎么轮换？"),
                format!("{}{i}。", "先添加新密钥，再滚动部署。".repeat(20)),
            )
        })
        .collect();
    for (pairs, name) in [
        (&english, "xml"),
        (&english, "markdown"),
        (&cjk, "markdown"),
    ] {
        for enc in [Encoding::Cl100kBase, Encoding::P50kBase] {
            let (tokenized, rendered) = cold_read(pairs, &builtin(name), enc);
            assert!(
                tokenized < rendered + rendered / 4,
                "{name} {enc:?}: {tokenized} vs {rendered}"
            );
        }
    }
}

#[test]
fn a_turn_rendered_before_is_taken_only_by_a_read_that_renders_it_alike() {
    // Arrange: a template whose turns show the user, one set of caches,
    // and turns long enough for a truncation to cut.
    let t = Template::compile(
        "owner",
        "{% macro turn(turn) %}{{ user_id }} asked: {{ turn.user_query }}\nanswer: {{ turn.final_answer }}{% endmacro %}",
    )
    .unwrap();
    let caches = Caches::new(1 << 12, 1 << 20);
    let cs = candidates(&[
        ("first question", "first answer"),
        ("second one", "and more"),
    ]);
    let o = opts(Encoding::O200kBase, 4096);
    let read = |globals: &Globals<'_>, o: &Options| {
        let mut s = TemplateSelector::with_caches(&t, o, globals, None, caches.clone()).unwrap();
        for c in cs.iter().rev() {
            let c = Candidate {
                user_query: Content::for_read(&c.user_query.text, o.max_query_chars),
                final_answer: Content::for_read(&c.final_answer.text, o.max_answer_chars),
                ..c.clone()
            };
            assert!(s.offer(c).unwrap());
        }
        s.finish().rendered
    };
    let bob = Globals {
        user_id: Some("bob"),
        ..GLOBALS
    };
    let cut = Options {
        max_query_chars: Some(5),
        ..o.clone()
    };

    // Act
    let first = read(&GLOBALS, &o);
    let hits = caches.turns.hits();
    let again = read(&GLOBALS, &o);
    let hits_again = caches.turns.hits() - hits;
    let claimed = read(&bob, &o);
    let truncated = read(&GLOBALS, &cut);

    // Assert: the repeated read took both turns from the cache; a read
    // with other globals or another truncation rendered its own.
    assert_eq!(hits_again, 2);
    assert_eq!(again, first);
    assert_eq!(
        first,
        "alice asked: first question\nanswer: first answer\
         alice asked: second one\nanswer: and more"
    );
    assert_eq!(claimed, first.replace("alice", "bob"));
    assert_eq!(
        truncated,
        "alice asked: first [truncated]\nanswer: first answer\
         alice asked: secon [truncated]\nanswer: and more"
    );
    // What a read may take on a worker: turns it finds rendered alike.
    let ready = |globals: &Globals<'_>| {
        let mut s = TemplateSelector::with_caches(&t, &o, globals, None, caches.clone()).unwrap();
        cs.iter().rev().map(|c| s.ready(c)).collect::<Vec<_>>()
    };
    assert_eq!(ready(&bob), [true, true]);
    let carol = Globals {
        user_id: Some("carol"),
        ..GLOBALS
    };
    assert_eq!(ready(&carol), [false, false]);
}

#[test]
fn fixed_parts_that_name_a_global_are_rendered_for_each_session() {
    let sources = [
        "{% macro turn(t) %}{{ t.user_query }}{% endmacro %}\
         {% macro header() %}[{{ session_id }}]{% endmacro %}",
        "{% set who = user_id %}{% macro turn(t) %}{{ t.user_query }}{% endmacro %}\
         {% macro footer() %}({{ who or 'nobody' }}){% endmacro %}",
        "{% macro turn(t) %}{{ t.user_query }}{% endmacro %}{% macro separator() %}\
         {% if user_id is defined %}|{{ user_id|upper }}|{% endif %}{% endmacro %}",
    ];
    let cs = candidates(&[("q1", "a1"), ("q2", "a2")]);
    let o = opts(Encoding::O200kBase, 4096);
    let turns: Vec<_> = cs.iter().map(|c| selected_turn(c, &o)).collect();
    for source in sources {
        let t = Template::compile("g", source).unwrap();
        assert!(t.compiled.uses_globals(), "{source}");
        let mut seen = std::collections::HashSet::new();
        for (session_id, user_id) in [("s1", Some("u1")), ("s2", Some("u2")), ("s3", None)] {
            let g = Globals {
                session_id,
                user_id,
            };
            let whole = t.render(&g, None, &turns).unwrap();
            let picked = select_template(cs.clone().into_iter(), &o, &t, &g, None).unwrap();
            assert_eq!(picked.rendered, whole, "{source}");
            assert_eq!(picked.token_count, o.encoding.count(&whole), "{source}");
            seen.insert(whole);
        }
        assert_eq!(seen.len(), 3, "{source}: each session its own rendering");
    }
    for name in ["xml", "markdown"] {
        assert!(!builtin(name).compiled.uses_globals(), "{name}");
    }
}
