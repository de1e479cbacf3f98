//! One selection over the two ways a history renders: a format, from the
//! counts stored with each turn (`Selector`), or a template, rendering and
//! counting each turn (`TemplateSelector`). Stores offer candidates to a
//! `Picker` and need not know which.

use super::template::{Globals, Summary, TemplateError, TemplateSelector};
use super::{Candidate, Options, Prelude, Selection, Selector, StoppedBy};

pub enum Picker {
    Plain(Box<Selector>),
    Template(Box<TemplatePick>),
}

/// A templated selection, and the first error a template raised (the
/// selection stops there; `finish` returns it).
pub struct TemplatePick {
    selector: TemplateSelector,
    error: Option<TemplateError>,
}

/// What a selection picked; a templated one also brings its rendering.
pub struct Picked {
    pub selection: Selection,
    pub rendered: Option<String>,
}

impl Picker {
    /// The read's selection once its session's owner and summary are known:
    /// a template's, or a format's beginning with the summary's `prelude`.
    pub fn begin(
        opts: &Options,
        globals: &Globals<'_>,
        summary: Option<(&Summary, Prelude)>,
    ) -> Result<Picker, TemplateError> {
        if let Some(template) = &opts.template {
            let s = TemplateSelector::new(template, opts, globals, summary.map(|(s, _)| s))?;
            return Ok(Picker::Template(Box::new(TemplatePick {
                selector: s,
                error: None,
            })));
        }
        let mut sel = Selector::new(opts);
        if let Some((_, prelude)) = summary {
            sel.open_with(prelude);
        }
        Ok(Picker::Plain(Box::new(sel)))
    }

    pub fn options(&self) -> &Options {
        match self {
            Picker::Plain(s) => s.options(),
            Picker::Template(t) => t.selector.options(),
        }
    }

    pub fn offer(&mut self, c: Candidate) -> bool {
        match self {
            Picker::Plain(s) => s.offer(c),
            Picker::Template(t) => {
                let taken = t.selector.offer(c);
                t.taken(taken)
            }
        }
    }

    pub fn reserve_first(&mut self, c: Candidate) -> bool {
        match self {
            Picker::Plain(s) => s.reserve_first(c),
            Picker::Template(t) => {
                let taken = t.selector.reserve_first(c);
                t.taken(taken)
            }
        }
    }

    pub fn stop(&mut self, why: StoppedBy) {
        match self {
            Picker::Plain(s) => s.stop(why),
            Picker::Template(t) => t.selector.stop(why),
        }
    }

    pub fn is_stopped(&self) -> bool {
        match self {
            Picker::Plain(s) => s.is_stopped(),
            Picker::Template(t) => t.selector.is_stopped(),
        }
    }

    /// Whether taking `c` may tokenize, or run a template: a template's
    /// turn may unless it was rendered recently (see
    /// [`TemplateSelector::ready`]).
    pub fn must_count(&mut self, c: &Candidate) -> bool {
        match self {
            Picker::Plain(s) => s.must_count(c),
            Picker::Template(t) => !t.selector.ready(c),
        }
    }

    pub fn finish(self) -> Result<Picked, TemplateError> {
        match self {
            Picker::Plain(s) => Ok(Picked {
                selection: s.finish(),
                rendered: None,
            }),
            Picker::Template(t) => {
                if let Some(e) = t.error {
                    return Err(e);
                }
                let t = t.selector.finish();
                Ok(Picked {
                    selection: Selection {
                        summary: t.summary,
                        turns: t.turns,
                        token_count: t.token_count,
                        bytes: t.bytes,
                        stopped_by: t.stopped_by,
                        left_out: t.left_out,
                    },
                    rendered: Some(t.rendered),
                })
            }
        }
    }
}

impl TemplatePick {
    /// A template error stops the selection; `finish` answers with it.
    fn taken(&mut self, taken: Result<bool, TemplateError>) -> bool {
        match taken {
            Ok(taken) => taken,
            Err(e) => {
                self.error.get_or_insert(e);
                self.selector.stop(StoppedBy::Limit);
                false
            }
        }
    }
}
