//! Offering candidates to a selection without holding up the async workers.
//!
//! Taking a candidate whose stored counts apply is a few additions; one the
//! read counts (another encoding, a cut content) tokenizes it, which takes
//! about a millisecond per 4 KiB. Such candidates are offered in slices of
//! at most [`SLICE_TURNS`] turns and [`SLICE_BYTES`] bytes, each slice on
//! Tokio's blocking pool, so that the workers keep answering other requests
//! (health checks among them) and a request dropped at its timeout stops
//! within a slice.

use crate::domain::SessionId;
use crate::history::template::{Globals, Summary};
use crate::history::{Candidate, Options, Picker, Prelude};
use crate::store::{Store, StoreError, StoredHistory, StoredSummary};
use crate::tokens::{AnswerTokens, QueryTokens, SummaryTokens, apart};

/// Texts longer than this are counted apart (`tokens::apart`).
const COUNT_INLINE_BYTES: usize = 16 * 1024;

/// The read's selection, once the session's owner and the summary it
/// begins with (if any) are known.
pub(crate) async fn begin(
    read: &Options,
    session_id: &str,
    user_id: Option<&str>,
    summary: Option<&StoredSummary>,
) -> Result<Picker, StoreError> {
    let globals = Globals {
        session_id,
        user_id,
    };
    let summary = match summary {
        None => None,
        Some(s) => Some((
            Summary {
                text: s.text.clone(),
                through_seq: s.through_seq,
            },
            prelude(s, read).await,
        )),
    };
    Ok(Picker::begin(
        read,
        &globals,
        summary.as_ref().map(|(s, p)| (s, *p)),
    )?)
}

/// What the summary adds before the turns under the read's encoding: its
/// stored counts when they apply, else counted now.
pub(crate) async fn prelude(summary: &StoredSummary, read: &Options) -> Prelude {
    if summary.tokens.encoding == read.encoding {
        return read.format.prelude(&summary.text, &summary.tokens);
    }
    let (text, enc) = (summary.text.clone(), read.encoding);
    let tokens = if text.len() > COUNT_INLINE_BYTES {
        apart(move || SummaryTokens::count(enc, &text)).await
    } else {
        SummaryTokens::count(enc, &text)
    };
    read.format.prelude(&summary.text, &tokens)
}

pub(crate) const SLICE_TURNS: usize = 64;
pub(crate) const SLICE_BYTES: usize = 256 * 1024;

/// Offers `first` (reserved, with `keep_first`) then `rest` in order to
/// `sel`, until it stops; returns it.
pub(crate) async fn offer_all(
    mut sel: Picker,
    first: Option<Candidate>,
    rest: Vec<Candidate>,
) -> Picker {
    if let Some(first) = first {
        sel = if sel.must_count(&first) {
            blocking(sel, move |sel| {
                sel.reserve_first(first);
            })
            .await
        } else {
            sel.reserve_first(first);
            sel
        };
        if sel.is_stopped() {
            return sel;
        }
    }
    let mut rest = rest.into_iter().peekable();
    while let Some(next) = rest.peek() {
        if sel.is_stopped() {
            break;
        }
        if !sel.must_count(next) {
            let c = rest.next().expect("peeked");
            sel.offer(c);
            continue;
        }
        let (mut slice, mut bytes) = (Vec::new(), 0);
        while slice.len() < SLICE_TURNS && bytes < SLICE_BYTES {
            let Some(c) = rest.next() else { break };
            bytes += c.user_query.text.len() + c.final_answer.text.len();
            slice.push(c);
        }
        sel = blocking(sel, move |sel| {
            for c in slice {
                if !sel.offer(c) {
                    break;
                }
            }
        })
        .await;
    }
    sel
}

/// Maps `items` with `f` apart (`tokens::apart`), in slices of at most
/// [`SLICE_TURNS`] items and [`SLICE_BYTES`] bytes (as `bytes` measures
/// them): a request dropped at its timeout stops within a slice, where one
/// blocking task would count on (an import's texts are counted so).
pub(crate) async fn in_slices<T, U, F>(items: Vec<T>, bytes: fn(&T) -> usize, f: F) -> Vec<U>
where
    T: Send + 'static,
    U: Send + 'static,
    F: Fn(T) -> U + Clone + Send + 'static,
{
    let mut out = Vec::with_capacity(items.len());
    let mut rest = items.into_iter().peekable();
    while rest.peek().is_some() {
        let (mut slice, mut size) = (Vec::new(), 0);
        while slice.len() < SLICE_TURNS && size < SLICE_BYTES {
            let Some(item) = rest.next() else { break };
            size += bytes(&item);
            slice.push(item);
        }
        let f = f.clone();
        out.extend(apart(move || slice.into_iter().map(f).collect::<Vec<U>>()).await);
    }
    out
}

/// Runs `work` on `sel` apart (`tokens::apart`). A panic there is raised
/// again here, as if it had happened in the request's task.
async fn blocking(mut sel: Picker, work: impl FnOnce(&mut Picker) + Send + 'static) -> Picker {
    apart(move || {
        work(&mut sel);
        sel
    })
    .await
}

/// Turns, and bytes of their texts, a page of `unsummarized_tokens` reads:
/// a page is one Redis command, kept short (4 MiB in one took 50 ms under
/// four such reads at once, `bench/limits`; 1 MiB as an export's page).
const UNSUMMARIZED_PAGE_TURNS: usize = 256;
const UNSUMMARIZED_PAGE_BYTES: u64 = 1024 * 1024;
/// Bytes of text a token of the read's budget lets `unsummarized_tokens`
/// read (about what a token holds in English).
const BYTES_PER_TOKEN: u64 = 4;

/// Fills in `unsummarized.tokens` where the store could not sum stored
/// counts (the read's encoding is not the one the session's turns were
/// counted in, or many turns wait behind a pending one): the turns' texts
/// are read and counted in the read's encoding and language, as their
/// `text` blocks render. Bounded by the read: at most 4 bytes of text a
/// token of its `max_tokens` (and `max_bytes`, the history byte cap), so
/// that a read that returns little moves little; past it, `tokens` stays
/// unknown. Counting is sliced as a read's: a request that ends stops it.
pub(crate) async fn unsummarized_tokens(
    store: &dyn Store,
    session: &SessionId,
    history: &mut StoredHistory,
    read: &Options,
) -> Result<(), StoreError> {
    let max_bytes = read
        .max_bytes
        .min(u64::from(read.max_tokens).saturating_mul(BYTES_PER_TOKEN));
    let Some(u) = history.unsummarized.as_mut().filter(|u| u.tokens.is_none()) else {
        return Ok(());
    };
    // The turn keep_first returned is not unsummarized (see `Unreturned`).
    let skip = history
        .selection
        .turns
        .first()
        .map(|t| t.turn.seq)
        .filter(|s| read.keep_first && *s > u.after_seq && *s <= u.through_seq);
    let (mut texts, mut bytes, mut after) = (Vec::new(), 0u64, u.after_seq);
    'pages: while after < u.through_seq {
        let room = max_bytes
            .saturating_sub(bytes)
            .clamp(1, UNSUMMARIZED_PAGE_BYTES);
        let page = store
            .turns_page(session, after, UNSUMMARIZED_PAGE_TURNS, room)
            .await?;
        if page.is_empty() {
            break;
        }
        for t in page {
            if t.seq > u.through_seq {
                break 'pages;
            }
            after = t.seq;
            if Some(t.seq) == skip {
                continue;
            }
            let (q, a) = if read.english {
                (
                    t.user_query_en.unwrap_or(t.user_query),
                    t.final_answer_en.unwrap_or(t.final_answer),
                )
            } else {
                (t.user_query, t.final_answer)
            };
            bytes += (q.len() + a.len()) as u64;
            if bytes > max_bytes {
                return Ok(());
            }
            texts.push((q, a));
        }
    }
    if texts.len() as u64 != u.turns {
        return Ok(()); // the session changed since the read: unknown
    }
    let encoding = read.encoding;
    let counts = in_slices(
        texts,
        |(q, a)| q.len() + a.len(),
        move |(q, a)| {
            let (q, a) = (
                QueryTokens::count(encoding, &q),
                AnswerTokens::count(encoding, &a),
            );
            (q.user_line, a.assistant_sep, a.assistant_last)
        },
    )
    .await;
    let Some((_, last_sep, last)) = counts.last().copied() else {
        return Ok(());
    };
    let inner: u64 = counts
        .iter()
        .map(|(line, sep, _)| u64::from(*line) + u64::from(*sep))
        .sum();
    u.tokens = u32::try_from(inner - u64::from(last_sep) + u64::from(last)).ok();
    Ok(())
}
