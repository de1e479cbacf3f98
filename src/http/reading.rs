//! What a history read counts with, and the cut of a store's selection to
//! a loaded tokenizer's counts (see `history::exact`).

use std::cell::{Cell, RefCell};

use super::error::ApiError;
use crate::history::exact::{self, Cut, Narrowed, Sums, Taken, Uncut};
use crate::history::template::{ChatTemplate, TemplateError, max_rendering_bytes};
use crate::history::{Options, Role, Selection, StoppedBy, Window, chat_system};
use crate::store::{StoredHistory, Unsummarized};
use crate::tokens::{Counting, LoadedTokenizer, apart};

/// The most of the history's texts a chat template's prompt may hold to
/// be rendered and counted on the request's worker thread (the default
/// read's 20 turns hold about 15 KiB); a longer one is rendered apart, on
/// the blocking pool, whose renderings would hold a worker too long.
const INLINE_PROMPT_BYTES: usize = 64 * 1024;

/// A read through a loaded tokenizer's chat template (`chat_template`).
#[derive(Debug, Clone)]
pub struct Chat {
    /// The caller's system message.
    pub system: Option<String>,
    /// Return the prompt.
    pub prompt: bool,
    /// A start's question: the prompt ends with it, then the template's
    /// generation prompt.
    pub question: Option<String>,
    /// Where its fields are (`history.` in a start).
    pub at: String,
}

/// A read's options, and what counts it. A loaded tokenizer's counts of
/// parts need not add up as the store sums them (see `history::exact`):
/// the store then selects without the token bound, in the default
/// encoding, bounded by `limit` and by the bytes `max_tokens` of its
/// tokens can hold, and the selection is cut back here.
#[derive(Debug, Clone)]
pub struct Reading {
    /// What the store is asked.
    pub options: Options,
    pub counting: Counting,
    /// The read's own `max_tokens` and `max_bytes`, for a loaded tokenizer.
    bounds: Option<(u32, u64)>,
    /// Through the tokenizer's chat template.
    pub chat: Option<Chat>,
    /// The read's window (a loaded tokenizer's is applied to the cut, not
    /// by the store).
    pub window: Window,
    /// Mark the prompt-cache breakpoints (`format=anthropic`).
    pub cache_control: bool,
}

impl Reading {
    pub fn new(mut options: Options, counting: Counting) -> Self {
        let window = options.window;
        let bounds = match &counting {
            Counting::Builtin(encoding) => {
                options.encoding = *encoding;
                None
            }
            Counting::Loaded(tokenizer) => {
                let bounds = (options.max_tokens, options.max_bytes);
                options.max_bytes = options
                    .max_bytes
                    .min(tokenizer.bytes_within(options.max_tokens));
                options.max_tokens = u32::MAX;
                options.window = Window::Sliding;
                Some(bounds)
            }
        };
        Reading {
            options,
            counting,
            bounds,
            chat: None,
            window,
            cache_control: false,
        }
    }

    pub fn with_chat(self, chat: Option<Chat>) -> Self {
        Reading { chat, ..self }
    }

    /// Whether the store's counts are the read's (its encoding is built in).
    pub fn counts_in_store(&self) -> bool {
        self.bounds.is_none()
    }

    /// [`Reading::cut`]: here when the tokenizer's counts of every part
    /// are kept from earlier reads, else apart (`tokens::apart`: counts of
    /// long texts take time).
    pub async fn cut_apart(&self, mut stored: StoredHistory) -> Result<StoredHistory, ApiError> {
        if self.counts_in_store() || self.cut(&mut stored, false)? {
            return Ok(stored);
        }
        let reading = self.clone();
        apart(move || {
            reading.cut(&mut stored, true)?;
            Ok(stored)
        })
        .await
    }

    /// Cuts the store's selection back to the read's `max_tokens` when a
    /// loaded tokenizer counts it; what it leaves out is unsummarized
    /// (and the tokens of the unsummarized turns unknown). Counts parts
    /// not kept from earlier reads only when `count`: `false` when it
    /// needs such a count and may not, the selection untouched.
    fn cut(&self, stored: &mut StoredHistory, count: bool) -> Result<bool, ApiError> {
        let (Counting::Loaded(tokenizer), Some((max_tokens, max_bytes))) =
            (&self.counting, self.bounds)
        else {
            return Ok(true);
        };
        let format = self.options.format;
        let uncut = Uncut {
            summary: stored
                .summary
                .as_ref()
                .filter(|_| stored.selection.summary)
                .map(|s| s.text.as_str()),
            turns: &stored.selection.turns,
            reserved_first: self.options.keep_first,
        };
        let part = |pieces: &[&str], after| tokenizer.count_part(pieces, after, count);
        let mut prompt = None;
        let window = (self.window, stored.selection.stopped_by.is_some());
        let Narrowed {
            cut,
            trimmed,
            left_out,
        } = if let Some(chat) = &self.chat {
            let limits = (max_tokens, max_bytes);
            let Some((narrowed, p)) = chat.cut(tokenizer, &uncut, limits, window, count)? else {
                return Ok(false);
            };
            prompt = p;
            narrowed
        } else if tokenizer.adds_up_in(format) {
            let Some(sums) = Sums::of(&uncut, format, part) else {
                return Ok(false);
            };
            let cut = exact::cut(&uncut, max_tokens, None, |taken| sums.count(taken));
            exact::narrow(&uncut, cut, window, |t| sums.count(t))
        } else if count {
            // Sums of parts (kept) are near for such a tokenizer: where
            // they cut, the whole counts begin.
            let guess = Sums::of(&uncut, format, part).map(|sums| {
                exact::cut(&uncut, max_tokens, None, |t| sums.count(t))
                    .taken
                    .offers()
            });
            let whole = |taken| exact::whole(&uncut, format, taken, |text| tokenizer.count(text));
            let cut = exact::cut(&uncut, max_tokens, guess, whole);
            exact::narrow(&uncut, cut, window, whole)
        } else {
            return Ok(false);
        };
        let selection = std::mem::take(&mut stored.selection);
        let (turns, dropped) = cut.taken.split(selection.turns);
        // The store stopped at the bytes `max_tokens` tokens can hold: the
        // turn it stopped at does not fit in tokens either.
        let ours = self.options.max_bytes < max_bytes;
        let stopped_by = match selection.stopped_by {
            _ if trimmed => Some(StoppedBy::MaxTokens),
            Some(StoppedBy::MaxBytes) if ours => Some(StoppedBy::MaxTokens),
            other => other,
        };
        let dropped_bytes: u64 = dropped
            .iter()
            .map(|t| (t.turn.user_query.len() + t.turn.final_answer.len()) as u64)
            .sum();
        if let (Some(oldest), Some(newest)) = (dropped.first(), dropped.last()) {
            let (from, to) = (oldest.turn.seq, newest.turn.seq);
            let u = stored.unsummarized.get_or_insert(Unsummarized {
                after_seq: from.saturating_sub(1),
                through_seq: to,
                turns: 0,
                tokens: None,
            });
            u.turns += dropped.len() as u64;
            u.through_seq = u.through_seq.max(to);
        }
        if let Some(u) = stored.unsummarized.as_mut() {
            u.tokens = None;
        }
        if !cut.taken.summary {
            stored.summary = None;
        }
        stored.selection = Selection {
            summary: cut.taken.summary,
            turns,
            token_count: cut.token_count,
            bytes: selection.bytes.saturating_sub(dropped_bytes),
            stopped_by,
            left_out,
        };
        stored.rendered = prompt;
        Ok(true)
    }
}

impl Chat {
    /// [`Reading::cut`] through `tokenizer`'s chat template: the longest
    /// run of `uncut`'s offers whose prompt counts at most `max_tokens`
    /// (narrowed by the read's `window`), and the prompt when asked for. `None` when a count it needs is not
    /// kept and it may not `count`.
    fn cut(
        &self,
        tokenizer: &LoadedTokenizer,
        uncut: &Uncut<'_>,
        (max_tokens, max_bytes): (u32, u64),
        window: (Window, bool),
        count: bool,
    ) -> Result<Option<(Narrowed, Option<String>)>, ApiError> {
        // A long prompt is rendered and counted apart, even when every
        // piece's count is kept: its rendering takes time.
        if !count && uncut.offer_bytes().sum::<usize>() > INLINE_PROMPT_BYTES {
            return Ok(None);
        }
        let Some(template) = tokenizer.chat_template() else {
            return Err(ApiError::field(
                format!("{}chat_template", self.at),
                "the tokenizer has no chat template",
            ));
        };
        // Each message once, as the template takes it (cheap to clone).
        let system = [None, uncut.summary].map(|summary| {
            chat_system(self.system.as_deref(), summary)
                .map(|s| ChatTemplate::message(Role::System, &s))
        });
        let turns: Vec<[minijinja::Value; 2]> = uncut
            .turns
            .iter()
            .map(|t| {
                [
                    ChatTemplate::message(Role::User, &t.turn.user_query),
                    ChatTemplate::message(Role::Assistant, &t.turn.final_answer),
                ]
            })
            .collect();
        let question = self
            .question
            .as_deref()
            .map(|q| ChatTemplate::message(Role::User, q));
        let extra = self.system.as_ref().map_or(0, String::len)
            + self.question.as_ref().map_or(0, String::len);
        let cap = max_rendering_bytes(max_bytes.saturating_add(extra as u64));
        let cap = usize::try_from(cap).unwrap_or(usize::MAX);
        let render = |taken: Taken| {
            let mut messages = Vec::with_capacity(2 * taken.offers() + 2);
            messages.extend(system[usize::from(taken.summary)].clone());
            for i in taken.turns(turns.len()) {
                messages.extend(turns[i].iter().cloned());
            }
            messages.extend(question.clone());
            // Nothing to say: no prompt (templates read `messages[0]`).
            if messages.is_empty() {
                return Ok(String::new());
            }
            template.render(messages, question.is_some(), cap)
        };
        let failed = RefCell::new(None);
        let missing = Cell::new(false);
        // With `prompt`, the largest prompt that fits, as rendered.
        let kept: RefCell<Option<(Taken, String)>> = RefCell::new(None);
        let counted = |taken: Taken| match render(taken) {
            Ok(prompt) => {
                let n = tokenizer.count_prompt(&prompt, count).unwrap_or_else(|| {
                    missing.set(true);
                    u32::MAX
                });
                let larger = |k: &(Taken, String)| k.0.offers() < taken.offers();
                if self.prompt && n <= max_tokens && kept.borrow().as_ref().is_none_or(larger) {
                    kept.replace(Some((taken, prompt)));
                }
                n
            }
            Err(e) => {
                failed.replace(Some(e));
                u32::MAX
            }
        };
        // Most reads take every offer: that prompt is counted first. When
        // it does not fit, the cut begins where as many tokens a byte
        // would fit (near, for most), not at every offer: each count is
        // a rendering of the prompt.
        let all = uncut.first(uncut.offers());
        let mut cut = match counted(all) {
            n if n <= max_tokens => Cut {
                taken: all,
                token_count: n,
            },
            // A count it may not take, or a failure: told below.
            n if missing.get() || failed.borrow().is_some() => Cut {
                taken: all,
                token_count: n,
            },
            n => {
                let bytes: usize = uncut.offer_bytes().sum();
                let fit = bytes as f64 * f64::from(max_tokens) / f64::from(n);
                let guess = uncut
                    .offer_bytes()
                    .scan(0, |sum, b| {
                        *sum += b;
                        Some(*sum)
                    })
                    .take_while(|&sum| sum as f64 <= fit)
                    .count();
                exact::cut(uncut, max_tokens, Some(guess), counted)
            }
        };
        if cut.taken.offers() == 0 {
            cut.token_count = counted(cut.taken);
        }
        let narrowed = exact::narrow(uncut, cut, window, counted);
        let cut = narrowed.cut;
        if let Some(e) = failed.into_inner() {
            return Err(template_failed(e));
        }
        if missing.get() {
            return Ok(None);
        }
        if cut.token_count > max_tokens {
            return Err(ApiError::field(
                format!("{}max_tokens", self.at),
                format!(
                    "the prompt without history (system message, question) counts {} tokens, more than max_tokens",
                    cut.token_count
                ),
            ));
        }
        let prompt = match kept.into_inner() {
            Some((taken, prompt)) if taken == cut.taken => Some(prompt),
            _ if self.prompt => Some(render(cut.taken).map_err(template_failed)?),
            _ => None,
        };
        Ok(Some((narrowed, prompt)))
    }
}

/// A chat template's failure on a read's conversation: a 422.
fn template_failed(e: TemplateError) -> ApiError {
    ApiError::Template(format!("the chat template failed: {e}"))
}
