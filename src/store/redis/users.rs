//! The user index, kept never behind the data. A user's sessions are in
//! `P:u:U` (another slot than the sessions themselves in a cluster, so no
//! write can cover both). The order of writes keeps the rule "a session
//! owned by U is in U's index":
//!
//! - Writing: an entry is written (`lua/index_add.lua`) before the session
//!   script may claim the session or slide it past what the entry covers;
//!   the script asks for it (`need_index`) and writes nothing until then.
//!   Each entry written gets a time past every other of the user's.
//! - Removing: whoever removes an entry (clear, erase, a listing that met a
//!   dead session) first reads its time, then fences it in the session's
//!   slot (`fence` in `lua/common.lua`; checked that the user does not own
//!   the session), then removes it only if it still has that time
//!   (`lua/index_remove.lua`). A claim racing with that must bring an entry
//!   written after the fence's time, which the removal leaves alone.
//!
//! An entry whose session is gone is only a hint: listings check each one.

use std::time::Duration;

use redis::Value;

use super::RedisStore;
use super::reply::{Reply, corrupt};
use super::scripts::args;
use crate::domain::{SessionId, UserId};
use crate::store::{
    ERASE_BATCH, EXAMINED_PER_LISTED, Erased, INDEX_SKEW, Pace, SessionSummary, SessionsPage,
    StoreError, ms,
};
use crate::turn::Millis;

/// How long a fence holds: longer than any removal takes between fencing
/// an entry and removing it.
const FENCE_TTL: Duration = Duration::from_secs(120);

/// Rounds an erasure spends on entries moved while it ran.
const MOVED_ROUNDS: usize = 3;

/// `lua/probe.lua`'s reply.
enum Probe {
    /// `{1, last_active_at, turn_count}`: the user owns the session.
    Live {
        last_active_at: Millis,
        turn_count: u64,
    },
    /// `{0}`: the entry is stale, and now fenced.
    Stale,
}

impl Probe {
    fn parse(v: Value) -> Result<Self, StoreError> {
        let mut r = Reply::array(v)?;
        Ok(match r.int()? {
            1 => Probe::Live {
                last_active_at: r.int()?,
                turn_count: r.uint()?,
            },
            _ => Probe::Stale,
        })
    }
}

/// The entries that name a valid session id (one turnstore wrote), each
/// with its time as a script argument.
fn sessions_with_times(entries: &[(String, Millis)]) -> Vec<(&str, Vec<u8>)> {
    entries
        .iter()
        .filter(|(s, _)| SessionId::parse(s.as_str()).is_ok())
        .map(|(s, t)| (s.as_str(), t.to_string().into_bytes()))
        .collect()
}

/// Index entries `(session, time)`, from `ZREVRANGEBYSCORE … WITHSCORES`.
fn entries(v: Value) -> Result<Vec<(String, Millis)>, StoreError> {
    let mut r = Reply::array(v)?;
    let mut out = Vec::new();
    while let Ok(member) = r.next() {
        let session = Reply::string_of(member)?;
        let time: f64 = r
            .string()?
            .parse()
            .map_err(|_| corrupt("an index time is not a number"))?;
        out.push((session, time as Millis));
    }
    Ok(out)
}

impl RedisStore {
    /// Writes the user's entry for the session, past `min`; returns its time.
    pub(super) async fn index(
        &self,
        user: &str,
        session: &SessionId,
        now: Millis,
        min: Millis,
    ) -> Result<Millis, StoreError> {
        self.write_entry(user, session, now, min, "").await
    }

    /// Moves the user's entry for the session to the top of their index,
    /// if it has one (`activity` in `lua/common.lua`): best effort, as it
    /// orders listings only; a failure is logged, and the next start
    /// moves it.
    pub(super) async fn move_to_top(&self, user: &str, session: &SessionId, now: Millis) {
        if let Err(e) = self.write_entry(user, session, now, 0, "xx").await {
            tracing::debug!(error = %e, "a session's index entry did not move up");
        }
    }

    /// `lua/index_add.lua`; `only`: `"xx"` to move an entry there is only.
    async fn write_entry(
        &self,
        user: &str,
        session: &SessionId,
        now: Millis,
        min: Millis,
        only: &str,
    ) -> Result<Millis, StoreError> {
        self.run_index(
            &self.scripts.index_add,
            user,
            args![
                session.as_str(),
                now,
                now.saturating_add(ms(self.limits.index_horizon())),
                min,
                ms(INDEX_SKEW),
                only
            ],
        )
        .await
    }

    /// Removes each entry that still has the time it was seen with (and
    /// that is fenced); returns those whose time changed meanwhile (a new
    /// claim, or an entry moved to the top), with their time now.
    async fn unindex(
        &self,
        user: &str,
        seen: &[(String, Millis)],
    ) -> Result<Vec<(String, Millis)>, StoreError> {
        if seen.is_empty() {
            return Ok(Vec::new());
        }
        let mut a = Vec::with_capacity(seen.len() * 2);
        for (session, time) in seen {
            a.extend(args![session.as_str(), *time]);
        }
        entries(self.run_index(&self.scripts.index_remove, user, a).await?)
    }

    /// After an erasure's round: entries that moved while it ran (a start
    /// of a session the round deleted moved it up) are probed again and
    /// removed when stale, so that an erased user's index keeps no
    /// session of theirs. A session claimed again meanwhile keeps its
    /// entry. A few rounds at most: each needs another start racing.
    async fn unindex_moved(
        &self,
        user: &str,
        mut moved: Vec<(String, Millis)>,
    ) -> Result<(), StoreError> {
        for _ in 0..MOVED_ROUNDS {
            if moved.is_empty() {
                break;
            }
            let probes = self.probe(user, &moved).await?;
            let stale: Vec<(String, Millis)> = moved
                .into_iter()
                .zip(probes)
                .filter(|(_, p)| matches!(p, Probe::Stale))
                .map(|(e, _)| e)
                .collect();
            moved = self.unindex(user, &stale).await?;
        }
        Ok(())
    }

    /// Entries below `bound` (exclusive; `None`: from the top), newest first.
    async fn index_page(
        &self,
        user: &str,
        bound: Option<Millis>,
        count: usize,
    ) -> Result<Vec<(String, Millis)>, StoreError> {
        let max = bound.map_or_else(|| "+inf".to_owned(), |b| format!("({b}"));
        let cmd = redis::cmd("ZREVRANGEBYSCORE")
            .arg(self.keys.user_index(user))
            .arg(max)
            .arg("-inf")
            .arg("WITHSCORES")
            .arg("LIMIT")
            .arg(0)
            .arg(count)
            .clone();
        entries(self.conn.query(cmd).await?)
    }

    /// Probes each entry's session (`lua/probe.lua`); an entry naming no
    /// valid session id (never written by turnstore) is stale.
    async fn probe(
        &self,
        user: &str,
        entries: &[(String, Millis)],
    ) -> Result<Vec<Probe>, StoreError> {
        let valid = |s: &str| SessionId::parse(s).is_ok();
        let mut replies = self
            .run_per_session(
                &self.scripts.probe,
                args![user, ms(FENCE_TTL)],
                sessions_with_times(entries),
            )
            .await?
            .into_iter();
        entries
            .iter()
            .map(|(s, _)| {
                if valid(s) {
                    Probe::parse(replies.next().unwrap_or(Value::Nil))
                } else {
                    Ok(Probe::Stale)
                }
            })
            .collect()
    }

    pub(super) async fn clear(&self, session: &SessionId) -> Result<(), StoreError> {
        let owner: String = self
            .run_session(&self.scripts.clear_session, session.as_str(), args![])
            .await?;
        if owner.is_empty() {
            return Ok(());
        }
        let cmd = redis::cmd("ZSCORE")
            .arg(self.keys.user_index(&owner))
            .arg(session.as_str())
            .clone();
        let Some(time) = self.conn.query::<Option<f64>>(cmd).await? else {
            return Ok(());
        };
        let seen = [(session.to_string(), time as Millis)];
        match self.probe(&owner, &seen).await?.pop() {
            // Claimed again since: its entry stays.
            Some(Probe::Live { .. }) => Ok(()),
            _ => self.unindex(&owner, &seen).await.map(drop),
        }
    }

    pub(super) async fn list(
        &self,
        user: &UserId,
        limit: usize,
        cursor: Option<Millis>,
    ) -> Result<SessionsPage, StoreError> {
        let user = user.as_str();
        let cap = limit.max(1) * EXAMINED_PER_LISTED;
        let (mut sessions, mut examined) = (Vec::new(), 0);
        let (mut bound, mut last, mut reached_end) = (cursor, None, false);
        while sessions.len() < limit && examined < cap {
            let want = (limit - sessions.len()).min(cap - examined);
            let page = self.index_page(user, bound, want).await?;
            let probes = self.probe(user, &page).await?;
            let mut stale = Vec::new();
            for ((session, time), probe) in page.iter().zip(probes) {
                examined += 1;
                last = Some(*time);
                match probe {
                    Probe::Live {
                        last_active_at,
                        turn_count,
                    } => sessions.push(SessionSummary {
                        session_id: session.clone(),
                        last_active_at,
                        turn_count,
                    }),
                    Probe::Stale => stale.push((session.clone(), *time)),
                }
            }
            self.unindex(user, &stale).await?;
            if page.len() < want {
                reached_end = true;
                break;
            }
            bound = last;
        }
        let next_cursor = match last {
            Some(t) if !reached_end && !self.index_page(user, Some(t), 1).await?.is_empty() => {
                Some(t)
            }
            _ => None,
        };
        Ok(SessionsPage {
            sessions,
            next_cursor,
        })
    }

    pub(super) async fn erase(
        &self,
        user: &UserId,
        budget: Duration,
    ) -> Result<Erased, StoreError> {
        let mut pace = Pace::new(budget);
        let user = user.as_str();
        let (mut deleted_sessions, mut bound) = (0, None);
        loop {
            let page = self.index_page(user, bound, ERASE_BATCH).await?;
            let erased = self
                .run_per_session(
                    &self.scripts.erase_sessions,
                    args![user, ms(FENCE_TTL)],
                    sessions_with_times(&page),
                )
                .await?;
            for e in erased {
                deleted_sessions += Reply::uint_of(e)?;
            }
            let moved = self.unindex(user, &page).await?;
            self.unindex_moved(user, moved).await?;
            match page.last() {
                Some((_, t)) if page.len() == ERASE_BATCH => bound = Some(*t),
                _ => {
                    return Ok(Erased {
                        deleted_sessions,
                        complete: true,
                    });
                }
            }
            if !pace.another() {
                return Ok(Erased {
                    deleted_sessions,
                    complete: false,
                });
            }
        }
    }
}
