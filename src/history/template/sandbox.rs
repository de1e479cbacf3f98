//! The sandbox a template runs in, and the one way to call its macros.
//!
//! Templates come from files an operator drops in a directory, and render
//! texts that users wrote: they run with no loader and without
//! minijinja's `multi_template` feature, so `include`, `import` and
//! `extends` do not even parse (no file is reachable); minijinja has no
//! access to the environment or the network; the only data a macro sees is
//! its argument and the two globals (`context`). Each macro call is a
//! rendering of its own, with its own [`FUEL`], which bounds both its time
//! and the memory it can allocate (about 64 bytes per fuel), and its output
//! is capped at [`MAX_OUTPUT_BYTES`]. Undefined values are errors
//! (`UndefinedBehavior::Strict`): a misspelt field fails loudly with its
//! line instead of leaving a hole in a prompt; `is defined` still works.
//! Beside minijinja's own filters, templates get one: `xml_escape`.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};

use minijinja::value::ValueKind;
use minijinja::{AutoEscape, Environment, UndefinedBehavior, Value};

use super::TemplateError;

/// Fuel of one macro call: about this many instructions, or 16 MiB of data
/// created. The `xml` turn over the largest turn the default limits allow
/// (a 32 KiB question and a 128 KiB answer, full of XML specials) uses
/// about 14,000; `markdown` about 2,200.
pub const FUEL: u64 = 250_000;

/// minijinja's own recursion counter (a macro call costs 4), well below its
/// default of 500 so that a recursive template stops long before a 2 MiB
/// worker stack could.
pub const RECURSION_LIMIT: usize = 100;

/// The most one macro call may return.
pub const MAX_OUTPUT_BYTES: usize = 1 << 20;

/// The macros a template may define; only `turn` is required.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Part {
    Summary,
    Header,
    Turn,
    Separator,
    Footer,
}

impl Part {
    pub const ALL: [Part; 5] = [
        Part::Summary,
        Part::Header,
        Part::Turn,
        Part::Separator,
        Part::Footer,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Part::Summary => "summary",
            Part::Header => "header",
            Part::Turn => "turn",
            Part::Separator => "separator",
            Part::Footer => "footer",
        }
    }
}

/// A template compiled in its own sandboxed environment.
#[derive(Debug)]
pub(super) struct Compiled {
    /// Unique in the process: what a cached rendering names it by.
    id: u64,
    name: String,
    env: Environment<'static>,
    /// Where each macro is defined, for errors raised outside its body
    /// (wrong arguments, output too large); by `Part` order.
    lines: [Option<usize>; 5],
    /// The source names `session_id` or `user_id` somewhere: what it
    /// renders may depend on the session, not only on a macro's argument.
    uses_globals: bool,
}

impl Compiled {
    /// Compiles `source`, runs its top level once (with an empty session
    /// id and no user) and checks that it defines `turn`, and that what it
    /// defines under the other names are macros.
    pub fn new(name: &str, source: String) -> Result<Compiled, TemplateError> {
        let lines = Part::ALL.map(|p| macro_line(&source, p.name()));
        let mut env = sandbox();
        env.add_template_owned(name.to_owned(), source)
            .map_err(|e| engine_error(&e, None))?;
        let names = env
            .get_template(name)
            .map_err(|e| engine_error(&e, None))?
            .undeclared_variables(false);
        let uses_globals = names.contains("session_id") || names.contains("user_id");
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        let compiled = Compiled {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            name: name.to_owned(),
            env,
            lines,
            uses_globals,
        };
        let globals = super::context::globals(&super::Globals {
            session_id: "",
            user_id: None,
        });
        for part in Part::ALL {
            let defined = compiled.with_macro(&globals, part, |_, _| Ok(()))?;
            if part == Part::Turn && defined.is_none() {
                return Err(TemplateError::new(
                    None,
                    "the template defines no turn macro",
                ));
            }
        }
        Ok(compiled)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    /// The line where the macro of `part` is defined, if it is.
    pub fn line(&self, part: Part) -> Option<usize> {
        self.lines[part as usize]
    }

    /// Whether a rendering may depend on the globals. When not, a macro
    /// without arguments always renders the same text.
    pub fn uses_globals(&self) -> bool {
        self.uses_globals
    }

    /// Calls the macro of `part`: `None` when the template does not define
    /// it. Never panics: an engine failure is an error too.
    pub fn call(
        &self,
        globals: &Value,
        part: Part,
        args: &[Value],
    ) -> Result<Option<String>, TemplateError> {
        let line = self.lines[part as usize];
        let called = catch_unwind(AssertUnwindSafe(|| {
            self.with_macro(globals, part, |state, m| {
                m.call(state, args).map_err(|e| engine_error(&e, line))
            })
        }));
        let out = match called {
            Ok(out) => out?,
            Err(_) => return Err(TemplateError::new(line, "the template engine failed")),
        };
        let Some(out) = out else { return Ok(None) };
        let out = String::from(out);
        if out.len() > MAX_OUTPUT_BYTES {
            let message = format!(
                "the {} macro's output is larger than {} KiB",
                part.name(),
                MAX_OUTPUT_BYTES / 1024
            );
            return Err(TemplateError::new(line, message));
        }
        Ok(Some(out))
    }

    /// Runs the top level with `globals` (a rendering of its own, with fresh
    /// fuel) and hands the macro of `part`, if defined, to `f`.
    fn with_macro<R>(
        &self,
        globals: &Value,
        part: Part,
        f: impl FnOnce(&mut minijinja::State<'_, '_>, Value) -> Result<R, TemplateError>,
    ) -> Result<Option<R>, TemplateError> {
        let template = self
            .env
            .get_template(&self.name)
            .map_err(|e| engine_error(&e, None))?;
        let mut captured = template
            .render_captured(globals.clone())
            .map_err(|e| engine_error(&e, None))?;
        let line = self.lines[part as usize];
        captured.with_state_mut(|state| {
            let Some(value) = state.lookup(part.name()) else {
                return Ok(None);
            };
            if !is_macro(&value, part.name()) {
                let message = format!("{} is defined but is not a macro", part.name());
                return Err(TemplateError::new(line, message));
            }
            f(state, value).map(Some)
        })
    }
}

/// A fresh environment with every limit of the sandbox set.
fn sandbox() -> Environment<'static> {
    let mut env = limited(FUEL);
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env.add_filter("xml_escape", xml_escape);
    env
}

/// A fresh environment with `fuel` a rendering, the recursion limit, no
/// HTML escaping and no `debug`: what every template here runs in (a
/// history template's, and a tokenizer's chat template).
pub(super) fn limited(fuel: u64) -> Environment<'static> {
    let mut env = Environment::new();
    env.set_fuel(Some(fuel));
    env.set_recursion_limit(RECURSION_LIMIT);
    // Prompts are not HTML: a template escapes what it needs (see `xml`).
    env.set_auto_escape_callback(|_| AutoEscape::None);
    // It prints the engine's state; nothing a template needs.
    env.remove_global("debug");
    env
}

/// `& < > " '` as XML's five entities. minijinja's `escape` is HTML's (it
/// also turns `/` into `&#x2f;`, which costs tokens and mangles URLs), and
/// five `replace` passes in template source took three times as long as
/// the rest of an `xml` rendering.
pub(super) fn xml_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + text.len() / 8);
    let mut copied = 0;
    for (i, b) in text.bytes().enumerate() {
        let entity = match b {
            b'&' => "&amp;",
            b'<' => "&lt;",
            b'>' => "&gt;",
            b'"' => "&quot;",
            b'\'' => "&apos;",
            _ => continue,
        };
        // Every special is ASCII: `i` is on a character boundary.
        out.push_str(&text[copied..i]);
        out.push_str(entity);
        copied = i + 1;
    }
    out.push_str(&text[copied..]);
    out
}

/// Whether `value` is the macro `name` (minijinja shows macros as a map
/// whose display is `<macro NAME>`; no value a template makes displays so).
fn is_macro(value: &Value, name: &str) -> bool {
    value.kind() == ValueKind::Map && value.to_string() == format!("<macro {name}>")
}

/// The line of `{% macro NAME(` in `source`, if it is there.
fn macro_line(source: &str, name: &str) -> Option<usize> {
    let mut rest = source;
    while let Some(at) = rest.find("{%") {
        let after = rest[at + 2..].trim_start_matches(['-', '+']).trim_start();
        if let Some(decl) = after.strip_prefix("macro")
            && decl.starts_with(char::is_whitespace)
            && let Some(decl) = decl.trim_start().strip_prefix(name)
            && decl.trim_start().starts_with('(')
        {
            let offset = source.len() - rest.len() + at;
            return Some(1 + source[..offset].matches('\n').count());
        }
        rest = &rest[at + 2..];
    }
    None
}

/// What a template's author needs of an engine error: its line (or the
/// macro's, when the engine gives none) and what went wrong.
pub(super) fn engine_error(e: &minijinja::Error, fallback_line: Option<usize>) -> TemplateError {
    let message = match e.detail() {
        Some(detail) => format!("{}: {detail}", e.kind()),
        None => e.kind().to_string(),
    };
    TemplateError::new(e.line().or(fallback_line), message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compile(source: &str) -> Result<Compiled, TemplateError> {
        Compiled::new("t", source.to_string())
    }

    fn call_turn(source: &str) -> Result<Option<String>, TemplateError> {
        let compiled = compile(source)?;
        let turn = minijinja::context! { user_query => "q", final_answer => "a" };
        let globals = minijinja::context! { session_id => "s1", user_id => () };
        compiled.call(&globals, Part::Turn, &[turn])
    }

    #[test]
    fn a_turn_macro_sees_its_turn_and_the_globals() {
        let out = call_turn(
            "{% macro turn(turn) %}{{ turn.user_query }}/{{ session_id }}/\
             {{ user_id is none }}{% endmacro %}",
        );
        assert_eq!(out, Ok(Some("q/s1/True".to_string())));
    }

    #[test]
    fn fuel_stops_an_endless_loop_with_its_line() {
        let err = call_turn(
            "{% macro turn(turn) %}\n{% for i in range(100000) %}{% for j in range(100000) %}\
             x{% endfor %}{% endfor %}{% endmacro %}",
        )
        .unwrap_err();
        assert_eq!(err.line, Some(2), "{err}");
        assert!(err.message.contains("fuel"), "{err}");
    }

    #[test]
    fn fuel_stops_a_doubling_string() {
        let err = call_turn(
            "{% macro turn(turn) %}{% set ns = namespace(s='x') %}\n\
             {% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}{% endmacro %}",
        )
        .unwrap_err();
        assert_eq!(err.line, Some(2), "{err}");
        assert!(err.message.contains("fuel"), "{err}");
    }

    #[test]
    fn output_is_capped_with_the_macros_line() {
        let err =
            call_turn("\n\n{% macro turn(turn) %}{{ 'x' * 1100000 }}{% endmacro %}").unwrap_err();
        assert_eq!(err.line, Some(3), "{err}");
        assert!(err.message.contains("larger than 1024 KiB"), "{err}");
        let fits = call_turn("{% macro turn(turn) %}{{ 'x' * 1000000 }}{% endmacro %}");
        assert_eq!(fits.map(|o| o.map(|s| s.len())), Ok(Some(1_000_000)));
    }

    #[test]
    fn an_undefined_value_is_an_error_with_its_line() {
        let err =
            call_turn("{% macro turn(turn) %}\n\n{{ turn.user_qeury }}{% endmacro %}").unwrap_err();
        assert_eq!(err.line, Some(3), "{err}");
        assert!(err.message.contains("undefined"), "{err}");
        let ok = call_turn("{% macro turn(turn) %}{{ turn.nope is defined }}{% endmacro %}");
        assert_eq!(ok, Ok(Some("False".to_string())));
    }

    #[test]
    fn recursion_stops_cleanly() {
        let err = call_turn(
            "{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}\n\
             {% macro turn(turn) %}{{ r(0) }}{% endmacro %}",
        )
        .unwrap_err();
        assert!(err.message.contains("recursion"), "{err}");
        assert_eq!(err.line, Some(1));
    }

    #[test]
    fn no_file_or_environment_is_reachable() {
        for source in [
            "{% include '/etc/passwd' %}{% macro turn(turn) %}{% endmacro %}",
            "{% import 'other' as o %}{% macro turn(turn) %}{% endmacro %}",
            "{% from 'other' import m %}{% macro turn(turn) %}{% endmacro %}",
            "{% extends 'base' %}{% macro turn(turn) %}{% endmacro %}",
        ] {
            let err = compile(source).unwrap_err();
            assert_eq!(err.line, Some(1), "{source}: {err}");
            assert!(err.message.contains("unknown statement"), "{source}: {err}");
        }
        for name in ["env", "environ", "config", "self", "debug", "os", "request"] {
            let source = format!("{{% macro turn(turn) %}}{{{{ {name} }}}}{{% endmacro %}}");
            let err = call_turn(&source).unwrap_err();
            assert!(err.message.contains("undefined"), "{name}: {err}");
        }
    }

    #[test]
    fn what_a_template_defines_is_checked_at_compile_time() {
        let err = compile("{% macro header() %}h{% endmacro %}").unwrap_err();
        assert_eq!(err.message, "the template defines no turn macro");
        let err = compile("{% set turn = 'x' %}").unwrap_err();
        assert_eq!(err.message, "turn is defined but is not a macro");
        let err =
            compile("{% macro turn(turn) %}{% endmacro %}\n{% set footer = 1 %}").unwrap_err();
        assert_eq!(err.message, "footer is defined but is not a macro");
        let err = compile("{% macro turn(turn) %}\n{% if %}{% endmacro %}").unwrap_err();
        assert_eq!(err.line, Some(2), "{err}");
        let err = compile("{% macro turn(turn) %}{% endmacro %}\n{{ nothing }}").unwrap_err();
        assert_eq!(err.line, Some(2), "top-level errors show at load: {err}");
    }

    #[test]
    fn wrong_macro_arguments_point_at_the_macro() {
        let err = call_turn("\n{%- macro turn() %}x{% endmacro %}").unwrap_err();
        assert_eq!(err.line, Some(2), "{err}");
    }

    #[test]
    fn the_largest_turn_renders_well_within_the_fuel() {
        // The largest contents the default limits allow, full of specials.
        let turn = minijinja::context! {
            user_query => "<a & 'b'> ".repeat(32 * 1024 / 10),
            final_answer => "x < y && \"z\"\n".repeat(128 * 1024 / 16),
        };
        let globals = minijinja::context! { session_id => "s", user_id => () };
        for (name, source, _) in super::super::builtins::BUILTINS {
            let compiled = compile(source).unwrap();
            let used = compiled
                .with_macro(&globals, Part::Turn, |state, m| {
                    m.call(state, std::slice::from_ref(&turn))
                        .map_err(|e| engine_error(&e, None))?;
                    Ok(state.fuel_levels().map_or(0, |(used, _)| used))
                })
                .unwrap()
                .unwrap();
            assert!(used < FUEL / 10, "{name}: {used}");
        }
    }

    #[test]
    fn xml_escape_writes_the_five_entities_only() {
        assert_eq!(
            xml_escape("a<b>&\"c\" 'd' / é🙂"),
            "a&lt;b&gt;&amp;&quot;c&quot; &apos;d&apos; / é🙂"
        );
        assert_eq!(xml_escape(""), "");
        let out = call_turn("{% macro turn(turn) %}{{ '<&>'|xml_escape }}{% endmacro %}");
        assert_eq!(out, Ok(Some("&lt;&amp;&gt;".to_string())));
    }

    #[test]
    fn macro_lines_are_found_in_the_source() {
        let source = "{# a macro turn( comment #}\n{%- macro   header() %}{% endmacro %}\n\
                      {%+ macro turn(turn) %}{% endmacro %}{% macro turns() %}{% endmacro %}";
        assert_eq!(macro_line(source, "header"), Some(2));
        assert_eq!(macro_line(source, "turn"), Some(3));
        assert_eq!(macro_line(source, "footer"), None);
    }
}
