//! Chat templates: a loaded tokenizer's own Jinja template (the
//! `chat_template` of its `tokenizer_config.json`), rendering chat messages
//! into the prompt a model receives, as Hugging Face's
//! `apply_chat_template` does: `trim_blocks` and `lstrip_blocks`,
//! `break`/`continue`, Python's string methods (`.strip()`,
//! `.startswith()`, …), `raise_exception`, `strftime_now`, a `tojson` that
//! writes what Python's `json.dumps` does, and the tokenizer's special
//! tokens (`bos_token`, `eos_token`, …) as globals.
//!
//! The sandbox is the history templates' (see `sandbox`): no loader, no
//! environment, fuel for a rendering ([`CHAT_FUEL`]: a history of
//! [`crate::http::history::MAX_LIMIT`] turns renders well within it), the
//! same recursion limit, and the output capped while it is written.

use std::io;

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Environment, Error, ErrorKind, Value};

use super::TemplateError;
use super::sandbox::{FUEL, RECURSION_LIMIT, engine_error, limited};
use crate::history::Role;

/// Fuel of one rendering: a chat template loops over every message, so a
/// history of 10,000 turns (20,001 messages) takes far more instructions
/// than a history template's macro call. Llama 3's, ChatML's and
/// Mistral's templates use less than a quarter of it on such a history
/// (see the tests).
pub const CHAT_FUEL: u64 = 40 * FUEL;

/// The tokens a `tokenizer_config.json` names, which templates read as
/// globals (`{{ bos_token }}`).
const SPECIAL_TOKENS: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "pad_token",
    "sep_token",
    "cls_token",
    "mask_token",
];

/// A chat template, compiled and tried at load.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    /// The special tokens, as globals (a map).
    tokens: Value,
}

const NAME: &str = "chat_template";

impl ChatTemplate {
    /// Compiles `source` with the special tokens `config` (a
    /// `tokenizer_config.json`) names, and renders a short conversation
    /// with it: a template that cannot is refused at load.
    pub fn new(source: &str, config: &serde_json::Value) -> Result<Self, TemplateError> {
        let mut env = limited(CHAT_FUEL);
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| engine_error(&e, None))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(NAME, source.to_owned())
            .map_err(|e| engine_error(&e, None))?;
        let tokens: std::collections::BTreeMap<Value, Value> = SPECIAL_TOKENS
            .iter()
            .filter_map(|&name| {
                let token = special_token(config.get(name)?)?;
                Some((Value::from(name), Value::from(token)))
            })
            .collect();
        let tokens = Value::from_object(tokens);
        let template = ChatTemplate { env, tokens };
        let probe = vec![
            Self::message(Role::User, "Hello"),
            Self::message(Role::Assistant, "Hi! How can I help?"),
        ];
        template.render(probe.clone(), false, 1 << 20)?;
        template.render(probe[..1].to_vec(), true, 1 << 20)?;
        Ok(template)
    }

    /// A message as the template sees it: `{role, content}`. A rendering
    /// takes its messages as such values, made once (cheap to clone).
    pub fn message(role: Role, content: &str) -> Value {
        minijinja::context! { role => role.name(), content => content }
    }

    /// The prompt of `messages` (see [`ChatTemplate::message`]), with the
    /// template's generation prompt after them when
    /// `add_generation_prompt`; at most `max_bytes` of it.
    pub fn render(
        &self,
        messages: Vec<Value>,
        add_generation_prompt: bool,
        max_bytes: usize,
    ) -> Result<String, TemplateError> {
        let ctx = minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            tools => (),
            documents => (),
            ..self.tokens.clone()
        };
        let template = self
            .env
            .get_template(NAME)
            .map_err(|e| engine_error(&e, None))?;
        let mut out = Capped {
            out: Vec::new(),
            max: max_bytes,
            over: false,
        };
        let rendered = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            template.render_captured_to(ctx, &mut out).map(|_| ())
        }));
        match rendered {
            Ok(Ok(())) => {}
            Ok(Err(e)) if e.kind() == ErrorKind::WriteFailure && out.over => {
                return Err(TemplateError::new(
                    None,
                    format!("the prompt is larger than {} KiB", max_bytes / 1024),
                ));
            }
            Ok(Err(e)) => return Err(engine_error(&e, None)),
            Err(_) => return Err(TemplateError::new(None, "the template engine failed")),
        }
        // minijinja writes strings: the bytes are UTF-8.
        String::from_utf8(out.out)
            .map_err(|_| TemplateError::new(None, "the template wrote bytes that are not UTF-8"))
    }
}

/// A writer that refuses what would take it past `max` bytes.
struct Capped {
    out: Vec<u8>,
    max: usize,
    /// It refused a write.
    over: bool,
}

impl io::Write for Capped {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.out.len() + buf.len() > self.max {
            self.over = true;
            return Err(io::Error::other("the prompt is too large"));
        }
        self.out.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A special token of a `tokenizer_config.json`: a string, or an object
/// with its `content` (an `AddedToken`).
fn special_token(v: &serde_json::Value) -> Option<String> {
    match v {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content")?.as_str().map(str::to_owned),
        _ => None,
    }
}

/// `raise_exception(message)`: the template refuses the conversation.
fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(
        ErrorKind::InvalidOperation,
        format!("the template raised: {message}"),
    ))
}

/// `strftime_now(format)`: the time now (UTC), formatted as Python's
/// `strftime` does.
fn strftime_now(format: String) -> Result<String, Error> {
    use std::fmt::Write;
    let mut out = String::new();
    write!(out, "{}", chrono::Utc::now().format(&format)).map_err(|_| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: not a format: {format}"),
        )
    })?;
    Ok(out)
}

/// `tojson`: what Python's `json.dumps(value, ensure_ascii=False)` writes
/// (", " and ": " between items), or with `indent=N` its indented form.
fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_json(&mut out, value, indent, sort_keys.unwrap_or(false), 0)?;
    Ok(Value::from_safe_string(out))
}

fn write_json(
    out: &mut String,
    value: &Value,
    indent: Option<usize>,
    sort_keys: bool,
    depth: usize,
) -> Result<(), Error> {
    if depth > RECURSION_LIMIT {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "tojson: nested too deeply",
        ));
    }
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    };
    let (item_sep, key_sep) = match indent {
        Some(_) => (",", ": "),
        None => (", ", ": "),
    };
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => out.push_str(&value.to_string()),
        ValueKind::String | ValueKind::Bytes | ValueKind::Plain | ValueKind::Invalid => {
            json_string(out, value.as_str().unwrap_or(&value.to_string()))
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                write_json(out, item, indent, sort_keys, depth + 1)?;
            }
            if !items.is_empty() {
                newline(out, depth);
            }
            out.push(']');
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = value.try_iter()?.collect();
            if sort_keys {
                keys.sort();
            }
            out.push('{');
            for (i, key) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                json_string(out, key.as_str().unwrap_or(&key.to_string()));
                out.push_str(key_sep);
                write_json(out, &value.get_item(key)?, indent, sort_keys, depth + 1)?;
            }
            if !keys.is_empty() {
                newline(out, depth);
            }
            out.push('}');
        }
        _ => json_string(out, &value.to_string()),
    }
    Ok(())
}

/// A JSON string as Python writes it with `ensure_ascii=False`.
fn json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Templates in the layouts of three model families, written here (the
    /// real ones, from the models' `tokenizer_config.json`, are tried in
    /// `tests/api/chat.rs`).
    pub(crate) const LLAMA3: &str = "{{- bos_token }}{% for message in messages %}\
        {{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}\
        {% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";

    pub(crate) const CHATML: &str = "{%- if messages[0]['role'] != 'system' %}
    {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {{- '<|im_start|>' + message.role + '\\n' + message.content.strip() + '<|im_end|>' + '\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
";

    pub(crate) const MISTRAL: &str = r#"{%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message["role"] == "user" %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST] " + system_message + "\n\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST] " + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif message["role"] == "assistant" %}
        {{- " " + message["content"]|trim + eos_token}}
    {%- endif %}
{%- endfor %}
"#;

    fn config() -> serde_json::Value {
        serde_json::json!({
            "bos_token": {"content": "<s>", "special": true},
            "eos_token": "</s>",
            "pad_token": null,
        })
    }

    fn conversation(system: bool, last_user: bool) -> Vec<Value> {
        let mut m = Vec::new();
        if system {
            m.push(ChatTemplate::message(Role::System, "Be brief."));
        }
        m.push(ChatTemplate::message(Role::User, " What is HNSW? "));
        m.push(ChatTemplate::message(Role::Assistant, "A graph index.\n"));
        if last_user {
            m.push(ChatTemplate::message(Role::User, "And IVF?"));
        }
        m
    }

    fn render(
        source: &str,
        messages: Vec<Value>,
        generation: bool,
    ) -> Result<String, TemplateError> {
        ChatTemplate::new(source, &config())?.render(messages, generation, 1 << 20)
    }

    #[test]
    fn llama3_s_layout_byte_for_byte() {
        let config = serde_json::json!({"bos_token": "<|begin_of_text|>"});
        let t = ChatTemplate::new(LLAMA3, &config).unwrap();
        assert_eq!(
            t.render(conversation(true, true), true, 1 << 20).unwrap(),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>\
             <|start_header_id|>user<|end_header_id|>\n\nWhat is HNSW?<|eot_id|>\
             <|start_header_id|>assistant<|end_header_id|>\n\nA graph index.<|eot_id|>\
             <|start_header_id|>user<|end_header_id|>\n\nAnd IVF?<|eot_id|>\
             <|start_header_id|>assistant<|end_header_id|>\n\n"
        );
    }

    #[test]
    fn chatml_s_layout_byte_for_byte() {
        assert_eq!(
            render(CHATML, conversation(false, false), false).unwrap(),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n\
             <|im_start|>user\nWhat is HNSW?<|im_end|>\n\
             <|im_start|>assistant\nA graph index.<|im_end|>\n"
        );
        assert_eq!(
            render(CHATML, conversation(true, true), true).unwrap(),
            "<|im_start|>system\nBe brief.<|im_end|>\n\
             <|im_start|>user\nWhat is HNSW?<|im_end|>\n\
             <|im_start|>assistant\nA graph index.<|im_end|>\n\
             <|im_start|>user\nAnd IVF?<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn mistral_s_layout_byte_for_byte() {
        assert_eq!(
            render(MISTRAL, conversation(true, true), true).unwrap(),
            "<s>[INST]  What is HNSW? [/INST] A graph index.</s>[INST] Be brief.\n\nAnd IVF?[/INST]"
        );
        // Two user messages in a row: the template refuses them.
        let mut m = conversation(false, true);
        m.remove(1);
        let e = render(MISTRAL, m, false).unwrap_err();
        assert!(
            e.message
                .contains("the template raised: After the optional system message"),
            "{e}"
        );
    }

    #[test]
    fn blocks_trim_and_strip_as_hugging_face_s_jinja_does() {
        let source = "{% for m in messages %}\n    {% if m.role == 'user' %}\nU:{{ m.content }}\n    {% endif %}\n{% endfor %}";
        assert_eq!(
            render(source, conversation(false, true), false).unwrap(),
            "U: What is HNSW? \nU:And IVF?\n"
        );
        // Python's methods, loop controls, namespace, tojson as json.dumps.
        let source = "{% set ns = namespace(n=0) %}{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}\
            {% set ns.n = ns.n + 1 %}{{ m.content.strip().upper() }}|{% endfor %}{{ ns.n }}\
            {{ messages[0] | tojson }}{{ {'a': [1, 'é\"\\n'], 'b': none} | tojson }}{{ 'x'.startswith('x') }}";
        assert_eq!(
            render(source, conversation(false, true), false).unwrap(),
            "WHAT IS HNSW?|A GRAPH INDEX.|2{\"role\": \"user\", \"content\": \" What is HNSW? \"}\
             {\"a\": [1, \"é\\\"\\n\"], \"b\": null}True"
        );
        assert_eq!(
            render("{{ {'a': [1]} | tojson(indent=2) }}", vec![], false).unwrap(),
            "{\n  \"a\": [\n    1\n  ]\n}"
        );
        // The special tokens of the config, and strftime_now.
        let out = render(
            "{{ bos_token }}{{ eos_token }}{{ pad_token is defined }}{{ strftime_now('%Y') }}",
            vec![],
            false,
        )
        .unwrap();
        assert!(out.starts_with("<s></s>False20"), "{out}");
    }

    #[test]
    fn loops_raises_and_large_prompts_fail_cleanly() {
        let endless =
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
        let e = render(endless, vec![], false).unwrap_err();
        assert!(e.message.contains("fuel"), "{e}");
        let e = ChatTemplate::new("{{ raise_exception('no') }}", &config()).unwrap_err();
        assert!(e.message.contains("the template raised: no"), "{e}");
        let e = ChatTemplate::new("{% for %}", &config()).unwrap_err();
        assert_eq!(e.line, Some(1), "{e}");
        for source in ["{% include 'x' %}", "{{ debug() }}"] {
            assert!(ChatTemplate::new(source, &config()).is_err(), "{source}");
        }
        let t = ChatTemplate::new(
            "{% for m in messages %}{{ m.content * 100 }}{% endfor %}",
            &config(),
        )
        .unwrap();
        let e = t
            .render(conversation(false, true), false, 1024)
            .unwrap_err();
        assert_eq!(e.message, "the prompt is larger than 1 KiB");
        assert!(t.render(conversation(false, true), false, 4096).is_ok());
    }

    /// The largest history the limits allow (10,000 turns) renders well
    /// within the fuel in each layout.
    #[test]
    fn the_longest_history_renders_within_the_fuel() {
        let mut m = vec![ChatTemplate::message(Role::System, "s")];
        for _ in 0..10_000 {
            m.push(ChatTemplate::message(Role::User, "q"));
            m.push(ChatTemplate::message(Role::Assistant, "a"));
        }
        m.push(ChatTemplate::message(Role::User, "q"));
        for source in [LLAMA3, CHATML, MISTRAL] {
            let t = ChatTemplate::new(source, &config()).unwrap();
            let mut env = t.env.clone();
            env.set_fuel(Some(CHAT_FUEL / 4));
            let ctx = minijinja::context! {
                messages => m.clone(),
                add_generation_prompt => true,
                bos_token => "<s>",
                eos_token => "</s>",
            };
            let out = env.render_str(source, ctx);
            assert!(out.is_ok(), "{source}: {out:?}");
        }
    }
}
