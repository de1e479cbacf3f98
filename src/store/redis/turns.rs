//! Writes of turns: start (with the owner's index entry written first, see
//! `users.rs`), finalize and delete.

use std::time::Duration;

use redis::Value;

use super::RedisStore;
use super::reads::{Found, Page, first_budget, walk_args};
use super::record::{self, Translations, id_bytes};
use super::reply::{Reply, corrupt};
use super::scripts::{args, pack};
use crate::domain::{SessionId, TurnId, UserId};
use crate::store::{
    Finalized, Outage, OutageClass, StartTurn, Started, StoreError, StoredHistory, ms,
};
use crate::turn::{Finalization, Millis, TurnView};

/// Starts that may ask for a fresh index entry before giving up: each
/// answer to one is a newer entry, so only a fence set in between (an
/// erasure of this very session) asks again.
const INDEX_ATTEMPTS: usize = 4;

/// `lua/start_turn.lua`'s reply.
enum StartReply {
    OwnerMismatch,
    IdempotencyKeyReused,
    TooManyPending {
        oldest_deadline: Millis,
    },
    /// Nothing written: write the user's index entry past `min`, call again.
    NeedIndex {
        user: String,
        min: Millis,
    },
    /// `{'ok'|'replay', owner, turn id, seq, started_at, page or false,
    /// pending before, purged, generation, move up}`
    Started {
        replayed: bool,
        owner: Option<String>,
        turn_id: TurnId,
        seq: u64,
        started_at: Millis,
        page: Option<Box<Page>>,
        pending_before: u64,
        purged: u64,
        generation: String,
        /// Move the owner's index entry to the top (see `move_to_top`).
        move_up: bool,
    },
}

impl StartReply {
    fn parse(v: Value, read: Translations) -> Result<Self, StoreError> {
        let mut r = Reply::array(v)?;
        let status = r.string()?;
        Ok(match status.as_str() {
            "owner_mismatch" => StartReply::OwnerMismatch,
            "idem_reused" => StartReply::IdempotencyKeyReused,
            "too_many_pending" => StartReply::TooManyPending {
                oldest_deadline: r.int()?,
            },
            "need_index" => StartReply::NeedIndex {
                user: r.string()?,
                min: r.int()?,
            },
            "ok" | "replay" => StartReply::Started {
                replayed: status == "replay",
                owner: r.owner()?,
                turn_id: record::turn_id(&r.bytes()?)?,
                seq: r.uint()?,
                started_at: r.int()?,
                page: match r.next()? {
                    Value::Nil => None,
                    v => Some(Box::new(Page::parse(v, read)?)),
                },
                pending_before: r.uint()?,
                purged: r.uint()?,
                generation: record::generation(&r.bytes()?),
                move_up: r.int()? == 1,
            },
            other => return Err(corrupt(format!("start_turn status {other:?}"))),
        })
    }
}

/// `lua/finalize_turn.lua`'s reply: `{'ok' | 'already', record, English
/// copies or false}` or `{'not_found'}`; an 'ok' record without its answer
/// (the one just sent).
enum FinalizeReply {
    Now(TurnView),
    Already(TurnView),
    NotFound,
}

impl FinalizeReply {
    fn parse(v: Value, turn: TurnId, answer: &str) -> Result<Self, StoreError> {
        let mut r = Reply::array(v)?;
        let status = r.string()?;
        if status == "not_found" {
            return Ok(FinalizeReply::NotFound);
        }
        let record = r.bytes()?;
        let english = Reply::opt_bytes_of(r.next()?)?;
        let mut view = record::view(turn, &record, english.as_deref())?;
        Ok(match status.as_str() {
            "ok" => {
                view.final_answer = answer.to_owned();
                FinalizeReply::Now(view)
            }
            "already" => FinalizeReply::Already(view),
            other => return Err(corrupt(format!("finalize_turn status {other:?}"))),
        })
    }
}

impl RedisStore {
    pub(super) async fn start(&self, req: StartTurn<'_>) -> Result<Started, StoreError> {
        let session = req.session_id;
        let tail = record::pending_tail(&req.turn);
        let english = record::pending_english(&req.turn);
        let (key, hash) = req
            .idempotency
            .map(|(k, h)| (k.as_str(), h))
            .unwrap_or(("", ""));
        // A session id just made cannot be owned yet: index it at once.
        let mut indexed: Option<(String, Millis)> = None;
        if req.new_session
            && let Some(user) = req.user_id
        {
            let time = self.index(user.as_str(), session, req.now, 0).await?;
            indexed = Some((user.to_string(), time));
        }
        for _ in 0..INDEX_ATTEMPTS {
            let reading = req.history;
            let (index_user, index_time) =
                indexed.as_ref().map_or(("", 0), |(u, t)| (u.as_str(), *t));
            let mut numbers = Vec::with_capacity(6 * 8 + 1);
            pack(
                &mut numbers,
                &[
                    req.now as f64,
                    ms(self.limits.session_ttl) as f64,
                    ms(self.limits.pending_ttl) as f64,
                    f64::from(self.limits.max_pending),
                    ms(self.limits.index_needed()) as f64,
                    index_time as f64,
                ],
            );
            numbers.push(u8::from(reading.is_some()));
            let mut a = args![
                numbers,
                req.user_id.map(UserId::as_str).unwrap_or(""),
                id_bytes(req.turn.turn_id),
                tail.as_slice(),
                key,
                hash,
                index_user,
                english.as_slice(),
            ];
            if let Some(o) = reading {
                a.extend(args![walk_args(
                    o,
                    first_budget(o),
                    o.after_seq,
                    None,
                    o.keep_first,
                    true
                )]);
            }
            let v: Value = self
                .run_session(&self.scripts.start_turn, session.as_str(), a)
                .await?;
            let translations = req
                .history
                .map_or_else(Translations::default, Translations::of);
            match StartReply::parse(v, translations)? {
                StartReply::OwnerMismatch => return Err(StoreError::OwnerMismatch),
                StartReply::IdempotencyKeyReused => {
                    return Err(StoreError::IdempotencyKeyReused);
                }
                StartReply::TooManyPending { oldest_deadline } => {
                    let wait = u64::try_from(oldest_deadline - req.now).unwrap_or(0);
                    return Err(StoreError::TooManyPendingTurns {
                        retry_after: Duration::from_millis(wait),
                    });
                }
                StartReply::NeedIndex { user, min } => {
                    let time = self.index(&user, session, req.now, min).await?;
                    indexed = Some((user, time));
                }
                StartReply::Started {
                    replayed,
                    owner,
                    turn_id,
                    seq,
                    started_at,
                    page,
                    pending_before,
                    purged,
                    generation,
                    move_up,
                } => {
                    self.expired_pending.inc_by(purged);
                    let moving = async {
                        if let (true, Some(owner)) = (move_up, &owner) {
                            self.move_to_top(owner, session, req.now).await;
                        }
                    };
                    let selecting = async {
                        let (Some(read), Some(page)) = (reading, page) else {
                            return Ok(None);
                        };
                        let s = self
                            .select_pages(
                                session,
                                Found {
                                    owner: owner.as_deref(),
                                    generation: &generation,
                                },
                                read,
                                *page,
                                req.now,
                                seq,
                            )
                            .await?;
                        Ok(Some(StoredHistory {
                            user_id: owner.clone(),
                            total_turns: s.total,
                            pending_turns: pending_before,
                            selection: s.selection,
                            summary: s.summary,
                            rendered: s.rendered,
                            unsummarized: s.unsummarized,
                            generation: Some(generation.clone()),
                        }))
                    };
                    let ((), history) = tokio::join!(moving, selecting);
                    let history = match history {
                        Ok(h) => h,
                        Err(e) => {
                            // A template failed on the history: the start
                            // leaves nothing.
                            if !replayed && matches!(e, StoreError::Template(_)) {
                                let _ = self.delete(session, turn_id).await;
                            }
                            return Err(e);
                        }
                    };
                    return Ok(Started {
                        user_id: owner,
                        turn_id,
                        seq,
                        started_at,
                        history,
                        replayed,
                    });
                }
            }
        }
        Err(StoreError::Unavailable(Outage::new(
            OutageClass::Contended,
            "the user index kept changing under this start",
        )))
    }

    pub(super) async fn finalize(
        &self,
        session: &SessionId,
        turn: TurnId,
        end: &Finalization,
    ) -> Result<Finalized, StoreError> {
        let v: Value = self
            .run_session(
                &self.scripts.finalize_turn,
                session.as_str(),
                self.answer_args(turn, end),
            )
            .await?;
        match FinalizeReply::parse(v, turn, &end.final_answer)? {
            FinalizeReply::Now(view) => Ok(Finalized::Now(view)),
            FinalizeReply::Already(view) => Ok(Finalized::Already(view)),
            FinalizeReply::NotFound => Err(StoreError::TurnNotFound),
        }
    }

    /// The arguments of `lua/finalize_turn.lua` and `lua/regenerate.lua`:
    /// the time, the TTL, the answer's counts, `max_turns`, its English
    /// copy's counts; the turn, the answer, its counts' encoding, the copy.
    fn answer_args(&self, turn: TurnId, end: &Finalization) -> Vec<Vec<u8>> {
        let t = &end.tokens;
        let en = end.english.as_ref();
        let en_count = |f: fn(&crate::tokens::AnswerTokens) -> u32| {
            en.map_or(0.0, |e| f64::from(f(&e.tokens)))
        };
        let mut numbers = Vec::with_capacity(9 * 8);
        pack(
            &mut numbers,
            &[
                end.finalized_at as f64,
                ms(self.limits.session_ttl) as f64,
                f64::from(t.answer),
                f64::from(t.assistant_sep),
                f64::from(t.assistant_last),
                f64::from(self.limits.max_turns),
                en_count(|t| t.answer),
                en_count(|t| t.assistant_sep),
                en_count(|t| t.assistant_last),
            ],
        );
        args![
            numbers,
            id_bytes(&turn),
            end.final_answer.as_str(),
            (t.encoding.code() as char).to_string(),
            en.map_or("", |e| e.text.as_str()),
        ]
    }

    pub(super) async fn replace_answer(
        &self,
        session: &SessionId,
        turn: TurnId,
        end: &Finalization,
    ) -> Result<TurnView, StoreError> {
        let v: Value = self
            .run_session(
                &self.scripts.regenerate,
                session.as_str(),
                self.answer_args(turn, end),
            )
            .await?;
        let mut r = Reply::array(v)?;
        match r.string()?.as_str() {
            "ok" => {
                let record = r.bytes()?;
                let english = Reply::opt_bytes_of(r.next()?)?;
                let mut view = record::view(turn, &record, english.as_deref())?;
                view.final_answer = end.final_answer.clone();
                Ok(view)
            }
            "not_found" => Err(StoreError::TurnNotFound),
            "pending" => Err(StoreError::TurnPending),
            "summarized" => Err(StoreError::TurnSummarized { through: r.uint()? }),
            other => Err(corrupt(format!("regenerate status {other:?}"))),
        }
    }

    pub(super) async fn delete(&self, session: &SessionId, turn: TurnId) -> Result<(), StoreError> {
        // 'pending' | 'finalized' | 'not_found'
        let v: String = self
            .run_session(
                &self.scripts.delete_turn,
                session.as_str(),
                args![crate::turn::now_millis(), id_bytes(&turn)],
            )
            .await?;
        match v.as_str() {
            "pending" | "finalized" => Ok(()),
            _ => Err(StoreError::TurnNotFound),
        }
    }
}
