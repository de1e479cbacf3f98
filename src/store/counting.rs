//! Offering candidates to a selection without holding up the async workers.
//!
//! Taking a candidate whose stored counts apply is a few additions; one the
//! read counts (another encoding, a cut content) tokenizes it, which takes
//! about a millisecond per 4 KiB. Such candidates are offered in slices of
//! at most [`SLICE_TURNS`] turns and [`SLICE_BYTES`] bytes, each slice on
//! Tokio's blocking pool, so that the workers keep answering other requests
//! (health checks among them) and a request dropped at its timeout stops
//! within a slice.

use crate::history::template::{Globals, Summary};
use crate::history::{Candidate, Options, Picker, Prelude};
use crate::store::{StoreError, StoredSummary};
use crate::tokens::SummaryTokens;

/// Texts longer than this are counted on the blocking pool.
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
    let bytes = summary.text.len() as u64;
    if summary.tokens.encoding == read.encoding {
        return Prelude::of(read.format, &summary.tokens, bytes);
    }
    let (text, enc) = (summary.text.clone(), read.encoding);
    let tokens = if text.len() > COUNT_INLINE_BYTES {
        match tokio::task::spawn_blocking(move || SummaryTokens::count(enc, &text)).await {
            Ok(t) => t,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    } else {
        SummaryTokens::count(enc, &text)
    };
    Prelude::of(read.format, &tokens, bytes)
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

/// Maps `items` with `f` on the blocking pool, in slices of at most
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
        match tokio::task::spawn_blocking(move || slice.into_iter().map(f).collect::<Vec<U>>())
            .await
        {
            Ok(done) => out.extend(done),
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => panic!("the runtime shut down during a count"),
        }
    }
    out
}

/// Runs `work` on `sel` on the blocking pool. A panic there is raised
/// again here, as if it had happened in the request's task.
async fn blocking(mut sel: Picker, work: impl FnOnce(&mut Picker) + Send + 'static) -> Picker {
    match tokio::task::spawn_blocking(move || {
        work(&mut sel);
        sel
    })
    .await
    {
        Ok(sel) => sel,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => panic!("the runtime shut down during a read"),
    }
}
