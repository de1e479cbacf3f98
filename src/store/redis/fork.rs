//! Forks: a new session made of another's finalized turns through a seq.
//! The two sessions may live in two slots of a cluster, and a session may
//! hold a thousand turns of 160 KiB: the copy goes a page of about
//! `PAGE_BYTES` at a time, read from the source (`lua/fork_read.lua`) and
//! written to staging keys of the new session (`lua/fork_write.lua`),
//! which no read or start sees; `lua/fork_publish.lua` then renames them
//! into place and writes the session's meta at once. An attempt holds
//! the staging by a token: a retry of a request with an Idempotency-Key
//! has the first try's, and goes on where that one stopped (so a fork too
//! long for one request's time completes over retries); another request
//! waits until the staging's attempt stopped writing (`STALE`), then
//! starts again. A source cleared or replaced while it is copied ends the
//! fork.

use std::time::Duration;

use redis::Value;

use super::RedisStore;
use super::record::id_bytes;
use super::reply::{Reply, corrupt};
use super::scripts::{args, pack};
use crate::store::{Fork, Forked, Outage, OutageClass, StoreError, ms};

/// Bytes of records a page of the copy holds (one turn at least).
const PAGE_BYTES: u64 = 1 << 20;
/// How long staging outlives its attempt's last page.
const STAGE_TTL: Duration = Duration::from_secs(60);
/// After how long without a page an attempt counts as dead
/// (`FORK_STALE` in `lua/fork_write.lua`).
const STALE: Duration = Duration::from_secs(5);
/// Index entries written for one publish, as an import writes them.
const INDEX_ATTEMPTS: usize = 4;

/// What a fork's first page said of its source (kept with the staging, for
/// a retry that goes on with it).
struct Source {
    owner: String,
    generation: Vec<u8>,
    through: u64,
    /// The summary's text and header, and the seq it covers to.
    summary: Option<(Vec<u8>, Vec<u8>, u64)>,
}

impl Source {
    fn covered(&self) -> u64 {
        self.summary.as_ref().map_or(0, |s| s.2)
    }
}

/// A page of the source, as `lua/fork_read.lua` answers.
struct Page {
    source: Source,
    more: bool,
    /// Five values a turn: seq, member, head, tail, English copies.
    turns: Vec<Vec<u8>>,
}

impl Page {
    fn parse(v: Value) -> Result<Page, StoreError> {
        let mut r = Reply::array(v)?;
        match r.string()?.as_str() {
            "ok" => {}
            "not_found" | "replaced" => return Err(StoreError::SessionNotFound),
            "owner_mismatch" => return Err(StoreError::OwnerMismatch),
            "beyond" => return Err(StoreError::ForkBeyond { newest: r.uint()? }),
            "empty" => return Err(StoreError::ForkEmpty { oldest: r.uint()? }),
            other => return Err(corrupt(format!("fork_read status {other:?}"))),
        }
        let owner = r.string()?;
        let generation = r.bytes()?;
        let through = r.uint()?;
        let summary = match r.next()? {
            Value::Array(parts) => {
                let mut s = Reply::array(Value::Array(parts))?;
                Some((s.bytes()?, s.bytes()?, s.uint()?))
            }
            _ => None,
        };
        let more = r.int()? == 1;
        let mut turns = Vec::new();
        while let Ok(v) = r.next() {
            turns.push(Reply::bytes_of(v)?);
        }
        if turns.len() % 5 != 0 {
            return Err(corrupt("a fork page of partial turns"));
        }
        Ok(Page {
            source: Source {
                owner,
                generation,
                through,
                summary,
            },
            more,
            turns,
        })
    }
}

/// How an attempt begins.
enum Begin {
    /// Staging of its own, empty.
    Fresh,
    /// The staging of an earlier try of the same request (`staged` turns):
    /// the copy goes on after `top`.
    Resume {
        top: u64,
        staged: u64,
        source: Source,
    },
    /// The session is this very fork, made earlier.
    Made(Forked),
}

impl RedisStore {
    pub(super) async fn fork_session(&self, req: Fork<'_>) -> Result<Forked, StoreError> {
        // A retry of a request with a key takes its first try's token: it
        // goes on with that try's staging.
        let token = match req.idempotency {
            Some((key, hash)) => format!("{hash}/{}", key.as_str()),
            None => uuid::Uuid::new_v4().simple().to_string(),
        };
        let made = self.fork_copy(&req, &token).await;
        // A fork refused drops its staging (best effort: staging left
        // behind expires anyway). One the store failed keeps it when it
        // has a key, for its retry to go on with; another attempt's, or
        // the session made, is not this one's to drop.
        let keep = match &made {
            Ok(_) | Err(StoreError::SessionExists { .. }) => true,
            Err(StoreError::Unavailable(_)) => req.idempotency.is_some(),
            Err(_) => false,
        };
        if !keep {
            let dropped: Result<i64, _> = self
                .run_fork(
                    &self.scripts.fork_abort,
                    req.target.as_str(),
                    args![token.as_str()],
                )
                .await;
            if let Err(e) = dropped {
                tracing::debug!(error = %e, "a failed fork's staging stays until it expires");
            }
        }
        made
    }

    async fn fork_copy(&self, req: &Fork<'_>, token: &str) -> Result<Forked, StoreError> {
        let (key, hash) = req
            .idempotency
            .map(|(k, h)| (k.as_str(), h))
            .unwrap_or(("", ""));
        let user = req.user_id.map(|u| u.as_str()).unwrap_or("");
        let (mut after, mut turns, mut source) =
            match self.fork_begin(req, token, key, hash).await? {
                Begin::Made(made) => return Ok(made),
                Begin::Fresh => (0, 0, None),
                Begin::Resume {
                    top,
                    staged,
                    source,
                } => (top, staged, Some(source)),
            };
        let mut more = source.as_ref().is_none_or(|s| after < s.through);
        while more {
            let mut numbers = Vec::with_capacity(3 * 8);
            let through = source
                .as_ref()
                .map_or(req.through_seq.unwrap_or(0), |s| s.through);
            pack(
                &mut numbers,
                &[through as f64, after as f64, PAGE_BYTES as f64],
            );
            let expected = source.as_ref().map_or(&[][..], |s| &s.generation[..]);
            let v: Value = self
                .run_session(
                    &self.scripts.fork_read,
                    req.source.as_str(),
                    args![numbers, user, expected],
                )
                .await?;
            let page = Page::parse(v)?;
            more = page.more;
            let source = source.get_or_insert(page.source);
            if let Some(seq) = page.turns.chunks(5).last().map(|t| &t[0]) {
                after = std::str::from_utf8(seq)
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| corrupt("a fork page's seq"))?;
            }
            turns += (page.turns.len() / 5) as u64;
            if let Some(made) = self
                .fork_write(req, token, key, source, &page.turns, hash)
                .await?
            {
                return Ok(made);
            }
        }
        let source = source.ok_or_else(|| corrupt("a fork without a first page"))?;
        let owner = match source.owner.as_str() {
            "" => req.user_id.map(|u| u.to_string()),
            o => Some(o.to_owned()),
        };
        let made = Forked {
            user_id: owner,
            through_seq: source.through,
            turns,
            summary: source.summary.is_some(),
            replayed: false,
        };
        match self
            .fork_publish(req, token, key, hash, &made, &source)
            .await?
        {
            Some(replayed) => Ok(replayed),
            None => Ok(made),
        }
    }

    /// `lua/fork_write.lua`'s first call: staging for this attempt.
    async fn fork_begin(
        &self,
        req: &Fork<'_>,
        token: &str,
        key: &str,
        hash: &str,
    ) -> Result<Begin, StoreError> {
        let mut numbers = Vec::with_capacity(4 * 8);
        pack(
            &mut numbers,
            &[req.now as f64, ms(STAGE_TTL) as f64, 1.0, 0.0],
        );
        let v: Value = self
            .run_fork(
                &self.scripts.fork_write,
                req.target.as_str(),
                args![numbers, token, key, "", "", "", "", ""],
            )
            .await?;
        let mut r = Reply::array(v)?;
        match r.string()?.as_str() {
            "ok" => Ok(Begin::Fresh),
            "resume" => {
                let top = r.uint()?;
                let generation = r.bytes()?;
                let through = r.uint()?;
                let owner = r.string()?;
                let (text, header, covered) = (r.bytes()?, r.bytes()?, r.uint()?);
                Ok(Begin::Resume {
                    top,
                    staged: r.uint()?,
                    source: Source {
                        owner,
                        generation,
                        through,
                        summary: (!text.is_empty()).then_some((text, header, covered)),
                    },
                })
            }
            other => written(other, &mut r, hash).map(Begin::Made),
        }
    }

    /// A page into `lua/fork_write.lua`. `Some`: the session is this very
    /// fork, made earlier.
    async fn fork_write(
        &self,
        req: &Fork<'_>,
        token: &str,
        key: &str,
        source: &Source,
        turns: &[Vec<u8>],
        hash: &str,
    ) -> Result<Option<Forked>, StoreError> {
        let mut numbers = Vec::with_capacity(4 * 8);
        pack(
            &mut numbers,
            &[
                req.now as f64,
                ms(STAGE_TTL) as f64,
                0.0,
                source.covered() as f64,
            ],
        );
        let (text, header) = source
            .summary
            .as_ref()
            .map_or((&[][..], &[][..]), |(t, h, _)| (&t[..], &h[..]));
        let mut a = args![
            numbers,
            token,
            key,
            &source.generation[..],
            source.through.to_string(),
            source.owner.as_str(),
            text,
            header
        ];
        a.extend(turns.iter().cloned());
        let v: Value = self
            .run_fork(&self.scripts.fork_write, req.target.as_str(), a)
            .await?;
        let mut r = Reply::array(v)?;
        match r.string()?.as_str() {
            "ok" => Ok(None),
            other => written(other, &mut r, hash).map(Some),
        }
    }

    /// `lua/fork_publish.lua`, with the owner's index entry written first
    /// (as an import's: the session is new to its owner's index). `Some`:
    /// the session is this very fork, made earlier.
    async fn fork_publish(
        &self,
        req: &Fork<'_>,
        token: &str,
        key: &str,
        hash: &str,
        made: &Forked,
        source: &Source,
    ) -> Result<Option<Forked>, StoreError> {
        let owner = made.user_id.as_deref().unwrap_or("");
        let record = if key.is_empty() {
            String::new()
        } else {
            format!("{} {hash}", made.record())
        };
        let (text, header, covered) = match &source.summary {
            Some((t, h, c)) => (&t[..], &h[..], *c),
            None => (&[][..], &[][..], 0),
        };
        let mut indexed: Option<(String, i64)> = None;
        for _ in 0..INDEX_ATTEMPTS {
            let (index_user, index_time) =
                indexed.as_ref().map_or(("", 0), |(u, t)| (u.as_str(), *t));
            let mut numbers = Vec::with_capacity(5 * 8);
            pack(
                &mut numbers,
                &[
                    req.now as f64,
                    ms(self.limits.session_ttl) as f64,
                    ms(self.limits.index_needed()) as f64,
                    index_time as f64,
                    made.through_seq as f64,
                ],
            );
            let v: Value = self
                .run_fork(
                    &self.scripts.fork_publish,
                    req.target.as_str(),
                    args![
                        numbers,
                        token,
                        owner,
                        index_user,
                        key,
                        record.as_str(),
                        id_bytes(&req.generation),
                        text,
                        header,
                        covered.to_string()
                    ],
                )
                .await?;
            let mut r = Reply::array(v)?;
            match r.string()?.as_str() {
                "ok" => return Ok(None),
                "need_index" => {
                    let user = r.string()?;
                    let min = r.int()?;
                    let time = self.index(&user, req.target, req.now, min).await?;
                    indexed = Some((user, time));
                }
                other => return written(other, &mut r, hash).map(Some),
            }
        }
        Err(StoreError::Unavailable(Outage::new(
            OutageClass::Contended,
            "the user index kept changing under this fork",
        )))
    }
}

/// A write's refusal: the session exists (made by this very fork
/// earlier, `Ok`, or taken), another attempt is under way, or took over.
fn written(status: &str, r: &mut Reply, hash: &str) -> Result<Forked, StoreError> {
    match status {
        "exists" => exists(r, hash),
        "busy" => {
            let since = Duration::from_millis(r.uint()?);
            Err(StoreError::SessionExists {
                busy: Some(STALE.saturating_sub(since).max(Duration::from_secs(1))),
            })
        }
        "lost" => Err(StoreError::SessionExists { busy: Some(STALE) }),
        other => Err(corrupt(format!("fork status {other:?}"))),
    }
}

/// The new session exists: made by this very fork earlier (its key's
/// record names this request: a replay), or taken.
fn exists(r: &mut Reply, hash: &str) -> Result<Forked, StoreError> {
    let record = r.string()?;
    let owner = r.owner()?;
    match Forked::parse(&record) {
        Some((made, stored)) if stored == hash => Ok(Forked {
            user_id: owner,
            ..made
        }),
        None if record.is_empty() => Err(StoreError::SessionExists { busy: None }),
        _ => Err(StoreError::IdempotencyKeyReused),
    }
}
