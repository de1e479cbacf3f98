//! The built-in templates, written as template source: they compile,
//! and render their header, separator and footer, in the same sandbox as
//! a user's. Their `turn` and `summary` macros also have a native twin
//! ([`Native`]) that renders the same text without running the engine
//! (a test holds them equal): a turn read for the first time then costs
//! building a string, not a rendering of the template.

use super::Summary;
use super::sandbox::xml_escape;
use crate::history::candidate::SelectedTurn;

/// Built-in templates by name, with their native twins; a user template
/// may not take these names.
pub(super) const BUILTINS: [(&str, &str, Native); 2] = [
    ("xml", XML, Native::Xml),
    ("markdown", MARKDOWN, Native::Markdown),
];

/// What the `turn` and `summary` macros of a built-in render, in Rust.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Native {
    Xml,
    Markdown,
}

impl Native {
    pub fn turn(self, t: &SelectedTurn) -> String {
        let (q, a) = (&t.turn.user_query, &t.turn.final_answer);
        match self {
            Native::Xml => {
                let (q, a) = (xml_escape(q), xml_escape(a));
                let mut out = String::with_capacity(q.len() + a.len() + 58);
                out.push_str("<turn role=\"user\">");
                out.push_str(&q);
                out.push_str("</turn><turn role=\"assistant\">");
                out.push_str(&a);
                out.push_str("</turn>");
                out
            }
            Native::Markdown => {
                let mut out = String::with_capacity(q.len() + a.len() + 27);
                out.push_str("**User:** ");
                out.push_str(q);
                out.push_str("\n\n**Assistant:** ");
                out.push_str(a);
                out
            }
        }
    }

    pub fn summary(self, s: &Summary) -> String {
        match self {
            Native::Xml => format!("<summary>{}</summary>", xml_escape(&s.text)),
            Native::Markdown => format!("## Conversation summary\n\n{}\n\n", s.text),
        }
    }
}

/// `<summary>S</summary><history><turn role="user">Q</turn><turn
/// role="assistant">A</turn>…</history>`, every text escaped for XML.
const XML: &str = r#"{%- macro summary(summary) -%}
<summary>{{ summary.text|xml_escape }}</summary>
{%- endmacro -%}
{%- macro header() %}<history>{% endmacro -%}
{%- macro turn(turn) -%}
<turn role="user">{{ turn.user_query|xml_escape }}</turn><turn role="assistant">{{ turn.final_answer|xml_escape }}</turn>
{%- endmacro -%}
{%- macro footer() %}</history>{% endmacro -%}
"#;

/// A "## Conversation history" section with bold speakers, turns apart by
/// a blank line; the summary in a section of its own before it.
const MARKDOWN: &str = r#"{%- macro summary(summary) -%}
## Conversation summary

{{ summary.text }}

{% endmacro -%}
{%- macro header() -%}
## Conversation history

{% endmacro -%}
{%- macro turn(turn) -%}
**User:** {{ turn.user_query }}

**Assistant:** {{ turn.final_answer }}
{%- endmacro -%}
{%- macro separator() %}

{% endmacro -%}
"#;
