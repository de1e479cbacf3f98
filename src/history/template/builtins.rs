//! The built-in templates, written as template source so that they go
//! through the same sandbox, rendering and counting as a user's.

/// Built-in templates by name; a user template may not take these names.
pub(super) const BUILTINS: [(&str, &str); 2] = [("xml", XML), ("markdown", MARKDOWN)];

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
