//! A session's rolling summary: written, read and deleted in the session's
//! meta hash (`sm`, `st`, `sh`; see `lua/common.lua`), and the turns a read
//! leaves unsummarized when the read itself could not describe them.

use redis::Value;

use super::RedisStore;
use super::record;
use super::reply::{Reply, corrupt};
use super::scripts::{args, pack};
use crate::domain::SessionId;
use crate::history::{Options, Selection};
use crate::store::{
    Outage, OutageClass, StoreError, StoredSummary, SummaryWrite, Unreturned, Unsummarized, ms,
};
use crate::tokens::{Encoding, SummaryTokens};
use crate::turn::Millis;

/// Writes that may ask for a fresh index entry before giving up (as starts).
const INDEX_ATTEMPTS: usize = 4;

/// A summary as the scripts return it: `{text, through seq, header}`
/// (`lua/common.lua`, SUMMARY).
pub(super) fn parse(v: Value) -> Result<Option<StoredSummary>, StoreError> {
    if v == Value::Nil {
        return Ok(None);
    }
    let mut r = Reply::array(v)?;
    let text = r.string()?;
    let through_seq = r.uint()?;
    let header = r.string()?;
    let bad = || corrupt("a summary's header is malformed");
    let fields: Vec<&str> = header.split(' ').collect();
    let [
        updated_at,
        letter,
        text_count,
        alone,
        joined,
        message,
        _bytes,
    ] = fields.as_slice()
    else {
        return Err(bad());
    };
    let number = |s: &str| s.parse::<u32>().map_err(|_| bad());
    let updated_at: Millis = updated_at.parse().map_err(|_| bad())?;
    let encoding = letter
        .bytes()
        .next()
        .and_then(Encoding::from_code)
        .ok_or_else(bad)?;
    let tokens = SummaryTokens {
        encoding,
        text: number(text_count)?,
        alone: number(alone)?,
        joined: number(joined)?,
        message: number(message)?,
    };
    Ok(Some(StoredSummary {
        text,
        through_seq,
        updated_at,
        tokens,
    }))
}

/// `lua/walk.lua`'s description of what a read leaves unsummarized.
#[derive(Debug)]
pub(super) enum Described {
    /// What lies below the turns the walk returned: the read's, if it
    /// takes them all.
    Done(Option<Unsummarized>),
    /// The walk did not end the selection: ask once it has.
    Later,
}

impl Described {
    pub fn parse(v: Value) -> Result<Self, StoreError> {
        Ok(match v {
            Value::Nil => Described::Done(None),
            Value::BulkString(b) if b == b"later" => Described::Later,
            Value::SimpleString(s) if s == "later" => Described::Later,
            v => Described::Done(Some(unsummarized(v)?)),
        })
    }
}

/// `{covered, newest seq, turns, tokens or false}`.
fn unsummarized(v: Value) -> Result<Unsummarized, StoreError> {
    let mut r = Reply::array(v)?;
    Ok(Unsummarized {
        after_seq: r.uint()?,
        through_seq: r.uint()?,
        turns: r.uint()?,
        tokens: match r.next()? {
            Value::Nil => None,
            v => Some(
                u32::try_from(Reply::uint_of(v)?)
                    .map_err(|_| corrupt("a token count is too large"))?,
            ),
        },
    })
}

impl RedisStore {
    pub(super) async fn write_summary(
        &self,
        w: SummaryWrite<'_>,
    ) -> Result<StoredSummary, StoreError> {
        let session = w.session_id;
        let t = w.tokens;
        let counts = format!(
            "{} {} {} {} {}",
            t.encoding.code() as char,
            t.text,
            t.alone,
            t.joined,
            t.message
        );
        let mut indexed: Option<(String, Millis)> = None;
        for _ in 0..INDEX_ATTEMPTS {
            let (index_user, index_time) =
                indexed.as_ref().map_or(("", 0), |(u, t)| (u.as_str(), *t));
            let mut numbers = Vec::with_capacity(6 * 8);
            pack(
                &mut numbers,
                &[
                    w.now as f64,
                    ms(self.limits.session_ttl) as f64,
                    w.through_seq as f64,
                    w.expected_through_seq.map_or(-1.0, |e| e as f64),
                    ms(self.limits.index_needed()) as f64,
                    index_time as f64,
                ],
            );
            let a = args![
                numbers,
                w.user_id.map(|u| u.as_str()).unwrap_or(""),
                w.text,
                counts.as_str(),
                index_user,
                w.expected_generation
                    .map(record::generation_bytes)
                    .unwrap_or_default(),
            ];
            let v: Value = self
                .run_session(&self.scripts.summary_put, session.as_str(), a)
                .await?;
            let mut r = Reply::array(v)?;
            match r.string()?.as_str() {
                "ok" => {
                    return Ok(StoredSummary {
                        text: w.text.to_owned(),
                        through_seq: w.through_seq,
                        updated_at: w.now,
                        tokens: *t,
                    });
                }
                "owner_mismatch" => return Err(StoreError::OwnerMismatch),
                "replaced" => return Err(StoreError::SessionReplaced),
                "conflict" => return Err(StoreError::SummaryConflict { stored: r.uint()? }),
                "beyond" => return Err(StoreError::SummaryBeyond { newest: r.uint()? }),
                "pending" => return Err(StoreError::SummaryOverPending { pending: r.uint()? }),
                "need_index" => {
                    let user = r.string()?;
                    let min = r.int()?;
                    let time = self.index(&user, session, w.now, min).await?;
                    indexed = Some((user, time));
                }
                other => return Err(corrupt(format!("summary_put status {other:?}"))),
            }
        }
        Err(StoreError::Unavailable(Outage::new(
            OutageClass::Contended,
            "the user index kept changing under this summary",
        )))
    }

    pub(super) async fn read_summary(
        &self,
        session: &SessionId,
    ) -> Result<Option<StoredSummary>, StoreError> {
        let v: Value = self
            .run_session(&self.scripts.summary_get, session.as_str(), args![])
            .await?;
        parse(v)
    }

    /// Takes (`Some(ttl)`) or releases (`None`) the summarizer's lock.
    pub(super) async fn summarizer_lock(
        &self,
        session: &SessionId,
        token: &str,
        ttl: Option<std::time::Duration>,
    ) -> Result<bool, StoreError> {
        let a = match ttl {
            Some(ttl) => args!["take", token, ms(ttl)],
            None => args!["release", token],
        };
        let v: i64 = self
            .run_session(&self.scripts.lock, session.as_str(), a)
            .await?;
        Ok(v == 1)
    }

    pub(super) async fn remove_summary(&self, session: &SessionId) -> Result<(), StoreError> {
        let _: i64 = self
            .run_session(&self.scripts.summary_delete, session.as_str(), args![])
            .await?;
        Ok(())
    }

    /// What a read that selected `selection` leaves unsummarized, asked
    /// after the selection (see `Described::Later`).
    pub(super) async fn describe(
        &self,
        session: &SessionId,
        selection: &Selection,
        read: &Options,
        before_seq: u64,
        now: Millis,
    ) -> Result<Option<Unsummarized>, StoreError> {
        // The script knows what the summary covers and which turns are
        // pending; 0 and None let it judge.
        let u = Unreturned::of(selection, read, 0, before_seq, None);
        let mut numbers = Vec::with_capacity(3 * 8 + 2);
        pack(
            &mut numbers,
            &[u.below as f64, u.skip.map_or(0.0, |s| s as f64), now as f64],
        );
        numbers.push(read.encoding.code());
        numbers.push(u8::from(read.english));
        let v: Value = self
            .run_session(&self.scripts.unsummarized, session.as_str(), args![numbers])
            .await?;
        match v {
            Value::Nil => Ok(None),
            v => unsummarized(v).map(Some),
        }
    }
}
