//! History templates (v1.1): a history rendered by a named template instead
//! of the `text` format, under the same budget rule and with an exact
//! `token_count`.
//!
//! A template is minijinja source defining the macro `turn(turn)` and, if it
//! wants, `header()`, `separator()`, `footer()` (each "" by default) and
//! `summary(summary)`. A history of turns t₁ (oldest) … tₙ renders as
//! `summary(s)? + header() + turn(t₁) + separator() + … + turn(tₙ) + footer()`;
//! without turns it is the summary alone, or "". The built-ins `xml` and
//! `markdown` are template source too, whose turns and summaries a native
//! twin renders (`builtins`).
//!
//! - `sandbox`: the engine's limits, and the one way to call a macro.
//! - `chat`: tokenizers' chat templates, in the same sandbox.
//! - `context`: what a macro sees.
//! - `joints`: exact counts of a concatenation from its segments' counts.
//! - `cache`: the counts of recently seen segments.
//! - `rendered`: recently rendered turns, with their counted runs.
//! - `selector`: the budget rule over rendered segments.
//!
//! Pure: nothing here does I/O except [`Templates::load`], once, at start.

mod builtins;
mod cache;
mod chat;
mod context;
mod joints;
mod rendered;
mod sandbox;
mod selector;

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use minijinja::Value;

pub use cache::{CAPACITY as COUNT_CACHE_CAPACITY, CountCache};
pub use chat::{CHAT_FUEL, ChatTemplate};
pub use rendered::{BUDGET_BYTES as TURN_CACHE_BYTES, TurnCache};
pub use sandbox::{FUEL, MAX_OUTPUT_BYTES, RECURSION_LIMIT};
pub use selector::{TemplateSelection, TemplateSelector, max_rendering_bytes, select_template};

use super::candidate::SelectedTurn;
use crate::domain::is_file_name;
use crate::tokens::Encoding;
use builtins::Native;
use joints::{Counter, Run};
use sandbox::{Compiled, Part};

/// The largest template file loaded: a template is a few macros, not data.
pub const MAX_TEMPLATE_BYTES: u64 = 256 * 1024;

/// A template failed while rendering (or compiling): where, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateError {
    /// 1-based line in the template's source, when known.
    pub line: Option<usize>,
    pub message: String,
}

impl TemplateError {
    pub(crate) fn new(line: Option<usize>, message: impl Into<String>) -> Self {
        TemplateError {
            line,
            message: message.into(),
        }
    }
}

impl fmt::Display for TemplateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "line {line}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for TemplateError {}

/// The globals every macro sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Globals<'a> {
    pub session_id: &'a str,
    /// None when the session has no user.
    pub user_id: Option<&'a str>,
}

/// A session's summary, rendered by the `summary` macro before the turns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    pub text: String,
    /// The newest turn the summary covers.
    pub through_seq: u64,
}

/// The caches a selection renders and counts through: a template's (see
/// [`Templates::with_caches`]; the process-wide ones unless given others).
#[derive(Debug, Clone)]
pub struct Caches {
    pub counts: Arc<CountCache>,
    pub turns: Arc<TurnCache>,
}

impl Caches {
    /// Caches of their own: at most `counts` counts and `turn_bytes` bytes
    /// of rendered turns.
    pub fn new(counts: usize, turn_bytes: usize) -> Caches {
        Caches {
            counts: Arc::new(CountCache::new(counts)),
            turns: Arc::new(TurnCache::new(turn_bytes)),
        }
    }

    pub fn global() -> Caches {
        Caches {
            counts: CountCache::global(),
            turns: TurnCache::global(),
        }
    }

    /// Forgets everything, so that a bench can time a cold read. Nothing in
    /// the service calls it.
    pub fn clear(&self) {
        self.counts.clear();
        self.turns.clear();
    }
}

/// A compiled template; cheap to clone, shared by every read.
#[derive(Debug, Clone)]
pub struct Template {
    compiled: Arc<Compiled>,
    /// Its fixed parts by encoding (by `Encoding::slot`), once
    /// rendered, when they do not depend on the globals.
    fixed: Arc<[OnceLock<Arc<Fixed>>; Encoding::ALL.len()]>,
    /// A built-in's turn and summary, rendered without the engine.
    native: Option<Native>,
    /// What its selections render and count through.
    caches: Caches,
}

/// The same compiled template (reads compare options, templates included).
impl PartialEq for Template {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.compiled, &other.compiled)
    }
}

impl Eq for Template {}

impl Template {
    /// Compiles a template from its source (what [`Templates::load`] does
    /// for each file). The error's line is in `source`.
    pub fn compile(name: &str, source: impl Into<String>) -> Result<Template, TemplateError> {
        let compiled = Compiled::new(name, source.into())?;
        Ok(Template {
            compiled: Arc::new(compiled),
            fixed: Arc::default(),
            native: None,
            caches: Caches::global(),
        })
    }

    pub fn name(&self) -> &str {
        self.compiled.name()
    }

    fn id(&self) -> u64 {
        self.compiled.id()
    }

    /// Where the `turn` macro is defined, for errors about what it renders.
    fn turn_line(&self) -> Option<usize> {
        self.compiled.line(Part::Turn)
    }

    /// The whole rendering of `turns` (oldest first) after an optional
    /// summary, without a budget: what a [`TemplateSelector`] returns for
    /// the turns it selects.
    pub fn render(
        &self,
        globals: &Globals<'_>,
        summary: Option<&Summary>,
        turns: &[SelectedTurn],
    ) -> Result<String, TemplateError> {
        let g = context::globals(globals);
        let mut out = match summary {
            Some(s) => self.summary(&g, s)?,
            None => String::new(),
        };
        if turns.is_empty() {
            return Ok(out);
        }
        let separator = self.fixed(&g, Part::Separator)?;
        out.push_str(&self.fixed(&g, Part::Header)?);
        for (i, t) in turns.iter().enumerate() {
            if i > 0 {
                out.push_str(&separator);
            }
            out.push_str(&self.turn(&g, t)?);
        }
        out.push_str(&self.fixed(&g, Part::Footer)?);
        Ok(out)
    }

    /// The header, separator and footer under `counter`'s encoding. A
    /// template that does not use the globals renders them once per
    /// encoding, not once per read.
    fn fixed_parts(&self, globals: &Value, counter: &Counter) -> Result<Arc<Fixed>, TemplateError> {
        if self.compiled.uses_globals() {
            return Ok(Arc::new(Fixed::render(self, globals, counter)?));
        }
        let slot = &self.fixed[counter.encoding.slot()];
        if let Some(fixed) = slot.get() {
            return Ok(fixed.clone());
        }
        let fixed = Arc::new(Fixed::render(self, globals, counter)?);
        Ok(slot.get_or_init(|| fixed).clone())
    }

    /// `header()`, `separator()` or `footer()`: "" when not defined.
    fn fixed(&self, globals: &Value, part: Part) -> Result<String, TemplateError> {
        Ok(self.compiled.call(globals, part, &[])?.unwrap_or_default())
    }

    fn turn(&self, globals: &Value, t: &SelectedTurn) -> Result<String, TemplateError> {
        if let Some(native) = self.native {
            return Ok(native.turn(t));
        }
        let out = self
            .compiled
            .call(globals, Part::Turn, &[context::turn(t)])?;
        out.ok_or_else(|| self.missing(Part::Turn))
    }

    fn summary(&self, globals: &Value, s: &Summary) -> Result<String, TemplateError> {
        if let Some(native) = self.native {
            return Ok(native.summary(s));
        }
        let out = self
            .compiled
            .call(globals, Part::Summary, &[context::summary(s)])?;
        out.ok_or_else(|| self.missing(Part::Summary))
    }

    /// A macro the rendering needs is not defined: `summary` in a template
    /// that has none, or `turn` when its definition depends on the globals.
    fn missing(&self, part: Part) -> TemplateError {
        let message = format!("template {} has no {} macro", self.name(), part.name());
        TemplateError::new(None, message)
    }
}

/// What a rendering holds whatever its turns: the header, the separator
/// and the footer, with their runs under one encoding.
#[derive(Debug)]
struct Fixed {
    header: String,
    separator: String,
    footer: String,
    header_run: Run,
    separator_run: Run,
    footer_run: Run,
}

impl Fixed {
    pub fn render(
        template: &Template,
        globals: &Value,
        counter: &Counter,
    ) -> Result<Fixed, TemplateError> {
        let header = template.fixed(globals, Part::Header)?;
        let separator = template.fixed(globals, Part::Separator)?;
        let footer = template.fixed(globals, Part::Footer)?;
        Ok(Fixed {
            header_run: Run::segment(&header, counter),
            separator_run: Run::segment(&separator, counter),
            footer_run: Run::segment(&footer, counter),
            header,
            separator,
            footer,
        })
    }
}

/// Every template a server knows: the built-ins and the operator's files.
#[derive(Debug, Clone)]
pub struct Templates {
    by_name: BTreeMap<String, Template>,
}

impl Templates {
    /// The built-ins, plus every `NAME.jinja` in `dir` (other files are
    /// ignored). Each is compiled and checked to define `turn`. An error
    /// names the file and the line: `"<file>:<line>: <message>"` (line 1
    /// for a problem with the file itself: its name, size or encoding). A
    /// directory that cannot be listed is `"<dir>: <message>"`.
    pub fn load(dir: Option<&Path>) -> Result<Templates, String> {
        let mut by_name = BTreeMap::new();
        for (name, source, native) in builtins::BUILTINS {
            let mut template = Template::compile(name, source)
                .map_err(|e| format!("built-in {name}:{}: {}", e.line.unwrap_or(1), e.message))?;
            template.native = Some(native);
            by_name.insert(name.to_owned(), template);
        }
        let Some(dir) = dir else {
            return Ok(Templates { by_name });
        };
        for (name, path) in template_files(dir)? {
            let at = |line: Option<usize>, message: &str| {
                format!("{}:{}: {message}", path.display(), line.unwrap_or(1))
            };
            if !is_file_name(&name) {
                return Err(at(
                    None,
                    "a template name must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$",
                ));
            }
            if by_name.contains_key(&name) {
                return Err(at(None, &format!("{name} is a built-in template")));
            }
            let source = read_source(&path).map_err(|e| at(None, &e))?;
            let template = Template::compile(&name, source).map_err(|e| at(e.line, &e.message))?;
            by_name.insert(name, template);
        }
        Ok(Templates { by_name })
    }

    /// The same templates, selecting through `caches` (the service's,
    /// sized by `TURNSTORE_TEMPLATE_CACHE_MB`).
    pub fn with_caches(mut self, caches: &Caches) -> Templates {
        for template in self.by_name.values_mut() {
            template.caches = caches.clone();
        }
        self
    }

    pub fn get(&self, name: &str) -> Option<&Template> {
        self.by_name.get(name)
    }

    /// Every name, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.by_name.keys().map(String::as_str)
    }
}

/// `(NAME, path)` of every `NAME.jinja` file in `dir`, sorted by name so
/// that the first error is always the same one.
fn template_files(dir: &Path) -> Result<Vec<(String, std::path::PathBuf)>, String> {
    let listing = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut files = Vec::new();
    for entry in listing {
        let path = entry.map_err(|e| format!("{}: {e}", dir.display()))?.path();
        let Some(file_name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let Some(name) = file_name.strip_suffix(".jinja") else {
            continue;
        };
        if path.is_file() {
            files.push((name.to_owned(), path.clone()));
        }
    }
    files.sort();
    Ok(files)
}

fn read_source(path: &Path) -> Result<String, String> {
    let size = std::fs::metadata(path).map_err(|e| e.to_string())?.len();
    if size > MAX_TEMPLATE_BYTES {
        return Err(format!(
            "a template is at most {} KiB",
            MAX_TEMPLATE_BYTES / 1024
        ));
    }
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    String::from_utf8(bytes).map_err(|_| "a template must be UTF-8".to_owned())
}

#[cfg(test)]
pub(crate) mod tests;
