//! Loading templates, and the built-ins' exact renderings.

use std::fs;

use super::*;
use crate::domain::TurnId;
use crate::turn::TurnView;

const GLOBALS: Globals<'static> = Globals {
    session_id: "s1",
    user_id: Some("u1"),
};

/// A finalized turn, selected whole (shared with `history::exact`).
pub(crate) fn turn(seq: u64, q: &str, a: &str) -> SelectedTurn {
    SelectedTurn {
        turn: TurnView {
            turn_id: TurnId::generate(),
            seq,
            user_query: q.into(),
            final_answer: a.into(),
            started_at: 1_795_000_000_123,
            finalized_at: 1_795_000_001_000,
            user_query_en: None,
            final_answer_en: None,
        },
        truncated: false,
    }
}

fn builtin(name: &str) -> Template {
    Templates::load(None).unwrap().get(name).unwrap().clone()
}

fn summary(text: &str) -> Summary {
    Summary {
        text: text.into(),
        through_seq: 3,
    }
}

#[test]
fn xml_renders_the_documented_string_escaped() {
    let xml = builtin("xml");
    let turns = [turn(1, "a < b & \"c\"?", "it's > d"), turn(2, "q2", "a2")];
    assert_eq!(
        xml.render(&GLOBALS, None, &turns).unwrap(),
        "<history><turn role=\"user\">a &lt; b &amp; &quot;c&quot;?</turn>\
         <turn role=\"assistant\">it&apos;s &gt; d</turn>\
         <turn role=\"user\">q2</turn><turn role=\"assistant\">a2</turn></history>"
    );
    assert_eq!(
        xml.render(&GLOBALS, Some(&summary("Goal: <x> & y")), &turns[1..])
            .unwrap(),
        "<summary>Goal: &lt;x&gt; &amp; y</summary><history><turn role=\"user\">q2</turn>\
         <turn role=\"assistant\">a2</turn></history>"
    );
    assert_eq!(
        xml.render(&GLOBALS, Some(&summary("s")), &[]).unwrap(),
        "<summary>s</summary>"
    );
    assert_eq!(xml.render(&GLOBALS, None, &[]).unwrap(), "");
}

#[test]
fn markdown_renders_the_documented_string() {
    let md = builtin("markdown");
    let turns = [turn(1, "q1 <b>", "a1"), turn(2, "q2", "a2\n")];
    assert_eq!(
        md.render(&GLOBALS, None, &turns).unwrap(),
        "## Conversation history\n\n**User:** q1 <b>\n\n**Assistant:** a1\n\n\
         **User:** q2\n\n**Assistant:** a2\n"
    );
    assert_eq!(
        md.render(&GLOBALS, Some(&summary("So far.")), &turns[..1])
            .unwrap(),
        "## Conversation summary\n\nSo far.\n\n## Conversation history\n\n\
         **User:** q1 <b>\n\n**Assistant:** a1"
    );
    assert_eq!(
        md.render(&GLOBALS, Some(&summary("So far.")), &[]).unwrap(),
        "## Conversation summary\n\nSo far.\n\n"
    );
    assert_eq!(md.render(&GLOBALS, None, &[]).unwrap(), "");
}

#[test]
fn a_turn_object_holds_exactly_the_documented_fields() {
    let t = Template::compile(
        "fields",
        "{% macro turn(turn) %}{{ turn|items|map('first')|join(',') }}|{{ turn.seq }}|\
         {{ turn.started_at }}|{{ turn.finalized_at }}|{{ turn.truncated }}|\
         {{ turn.turn_id|length }}{% endmacro %}\
         {% macro summary(summary) %}{{ summary.text }}@{{ summary.through_seq }};{% endmacro %}\
         {% macro header() %}{{ session_id }}/{{ user_id }}:{% endmacro %}",
    )
    .unwrap();
    let out = t
        .render(&GLOBALS, Some(&summary("S")), &[turn(7, "q", "a")])
        .unwrap();
    assert_eq!(
        out,
        "S@3;s1/u1:seq,turn_id,user_query,final_answer,started_at,finalized_at,truncated|7|\
         2026-11-18T11:06:40.123Z|2026-11-18T11:06:41.000Z|False|36"
    );
    let anonymous = Globals {
        session_id: "s2",
        user_id: None,
    };
    let out = t.render(&anonymous, None, &[turn(1, "q", "a")]).unwrap();
    assert!(out.starts_with("s2/None:"), "{out}");
}

#[test]
fn a_summary_needs_a_summary_macro() {
    let t = Template::compile("plain", "{% macro turn(turn) %}x{% endmacro %}").unwrap();
    let err = t.render(&GLOBALS, Some(&summary("s")), &[]).unwrap_err();
    assert_eq!(err.to_string(), "template plain has no summary macro");
    assert_eq!(err.line, None);
}

#[test]
fn errors_show_their_line() {
    let e = TemplateError::new(Some(3), "undefined value");
    assert_eq!(e.to_string(), "line 3: undefined value");
}

#[test]
fn load_reads_every_jinja_file_beside_the_built_ins() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(
        dir.path().join("chat.v2.jinja"),
        "{% macro turn(turn) %}Q: {{ turn.user_query }}{% endmacro %}\n",
    )
    .unwrap();
    fs::write(dir.path().join("notes.txt"), "not a template {%").unwrap();
    fs::create_dir(dir.path().join("sub.jinja")).unwrap();
    let templates = Templates::load(Some(dir.path())).unwrap();
    assert_eq!(
        templates.names().collect::<Vec<_>>(),
        ["chat.v2", "markdown", "xml"]
    );
    let chat = templates.get("chat.v2").unwrap();
    assert_eq!(
        chat.render(&GLOBALS, None, &[turn(1, "hi", "yo")]).unwrap(),
        "Q: hi"
    );
    assert!(templates.get("nope").is_none());
}

/// `load` of a directory holding one file, `name`, with `source`.
fn load_one(name: &str, source: &[u8]) -> (String, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    fs::write(&path, source).unwrap();
    let err = Templates::load(Some(dir.path())).unwrap_err();
    (err, path.display().to_string())
}

#[test]
fn a_broken_template_fails_load_with_its_file_and_line() {
    let (err, path) = load_one(
        "broken.jinja",
        b"{% macro turn(turn) %}\n{{ turn.user_query }\n{% endmacro %}",
    );
    assert!(err.starts_with(&format!("{path}:2: syntax error")), "{err}");

    let (err, path) = load_one(
        "reads.jinja",
        b"\n\n{% include '/etc/passwd' %}{% macro turn(turn) %}{% endmacro %}",
    );
    assert_eq!(
        err,
        format!("{path}:3: syntax error: unknown statement include")
    );

    let (err, path) = load_one("empty.jinja", b"{# nothing #}");
    assert_eq!(err, format!("{path}:1: the template defines no turn macro"));
}

#[test]
fn load_refuses_bad_names_shadows_and_huge_or_binary_files() {
    let (err, path) = load_one("xml.jinja", b"{% macro turn(turn) %}{% endmacro %}");
    assert_eq!(err, format!("{path}:1: xml is a built-in template"));

    for name in [
        "-x.jinja",
        "a b.jinja",
        &format!("{}.jinja", "a".repeat(65)),
    ] {
        let (err, path) = load_one(name, b"{% macro turn(turn) %}{% endmacro %}");
        assert!(
            err.starts_with(&format!("{path}:1: a template name must")),
            "{err}"
        );
    }
    let ok = "a".repeat(64);
    assert!(is_file_name(&ok) && is_file_name("A.b_c-9"));

    let (err, _) = load_one("big.jinja", &vec![b' '; 300 * 1024]);
    assert!(err.ends_with("a template is at most 256 KiB"), "{err}");
    let (err, _) = load_one("bin.jinja", &[0xff, 0xfe]);
    assert!(err.ends_with("a template must be UTF-8"), "{err}");
}

#[test]
fn a_missing_directory_is_an_error() {
    let err = Templates::load(Some(Path::new("/no/such/dir"))).unwrap_err();
    assert!(err.starts_with("/no/such/dir: "), "{err}");
}

mod native {
    use proptest::prelude::*;

    use super::*;

    fn text() -> impl Strategy<Value = String> {
        proptest::collection::vec(
            prop_oneof![
                "[a-zA-Z0-9 ]{0,12}",
                "[&<>\"'/]{1,3}",
                "[\n\r\t]{1,2}",
                "[é漢🙂]{1,2}",
                Just("{{ x }}{% y %}".to_string()),
                Just("&amp;".to_string()),
            ],
            0..8,
        )
        .prop_map(|p| p.concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// The native twins render what the built-ins' source does.
        #[test]
        fn built_ins_render_as_their_source_does(
            texts in proptest::collection::vec((text(), text()), 0..4),
            summary_text in proptest::option::of(text()),
        ) {
            let turns: Vec<SelectedTurn> = texts
                .iter()
                .enumerate()
                .map(|(i, (q, a))| turn(i as u64 + 1, q, a))
                .collect();
            let s = summary_text.map(|t| summary(&t));
            for (name, source, _) in builtins::BUILTINS {
                let native = builtin(name);
                prop_assert!(native.native.is_some());
                let engine = Template::compile(name, source).unwrap();
                prop_assert_eq!(
                    native.render(&GLOBALS, s.as_ref(), &turns).unwrap(),
                    engine.render(&GLOBALS, s.as_ref(), &turns).unwrap(),
                    "{}", name
                );
            }
        }
    }
}
