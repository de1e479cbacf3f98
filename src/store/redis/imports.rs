//! Imports: finalized turns appended from a transcript, in one script call
//! (`lua/import.lua`), with the owner's index entry written first when the
//! import claims the session or outlives its entry (see `users.rs`).

use redis::Value;

use super::RedisStore;
use super::record::id_bytes;
use super::reply::{Reply, corrupt};
use super::scripts::{args, pack};
use crate::store::{Import, Imported, Outage, OutageClass, StoreError, ms};
use crate::tokens::TurnCosts;
use crate::turn::Millis;

/// Imports that may ask for a fresh index entry before giving up.
const INDEX_ATTEMPTS: usize = 4;

/// A turn's member without its seq: its id and costs (`COSTS` in
/// `lua/common.lua`).
fn member(id: &crate::domain::TurnId, c: &TurnCosts) -> Vec<u8> {
    let mut m = id_bytes(id);
    m.push(c.query.encoding.code());
    m.push(c.answer.encoding.code());
    for n in [
        c.query.query,
        c.query.user_line,
        c.answer.answer,
        c.answer.assistant_sep,
        c.answer.assistant_last,
        c.query_bytes,
        c.answer_bytes,
    ] {
        m.extend_from_slice(&n.to_be_bytes());
    }
    m
}

/// Records an import's trim leaves to its caller, freed a call at a time
/// (`TRIM` in `lua/common.lua`).
const TRIM: usize = 128;

impl RedisStore {
    /// Frees the records of the turns an import trimmed beyond the first
    /// `TRIM` (`lua/forget_turns.lua`), `TRIM` a call. Should this stop
    /// half way (logged: the import itself is written and answered), the
    /// records stay until the session goes; no read finds them (they left
    /// the turns), and a delete of one is a 404.
    async fn free_trimmed(&self, session: &crate::domain::SessionId, trimmed: Value) {
        if let Err(e) = self.free_pages(session, trimmed).await {
            tracing::warn!(error = %e, "records an import trimmed stay until the session goes");
        }
    }

    async fn free_pages(
        &self,
        session: &crate::domain::SessionId,
        trimmed: Value,
    ) -> Result<(), StoreError> {
        let mut reply = Reply::array(trimmed)?;
        let mut ids = Vec::new();
        while let Ok(id) = reply.next() {
            ids.push(Reply::bytes_of(id)?);
        }
        for page in ids.chunks(TRIM) {
            let _: i64 = self
                .run_session(&self.scripts.forget_turns, session.as_str(), page.to_vec())
                .await?;
        }
        Ok(())
    }

    pub(super) async fn import_turns(&self, req: Import<'_>) -> Result<Imported, StoreError> {
        let session = req.session_id;
        let (key, hash) = req
            .idempotency
            .map(|(k, h)| (k.as_str(), h))
            .unwrap_or(("", ""));
        let mut turns = Vec::with_capacity(req.turns.len() * 4);
        for t in req.turns {
            let (started, finalized) = t.times.unwrap_or((req.now, req.now));
            turns.push(member(&t.turn_id, &t.costs()));
            turns.push(format!("{started} {finalized}").into_bytes());
            turns.push(t.user_query.as_bytes().to_vec());
            turns.push(t.final_answer.as_bytes().to_vec());
        }
        let mut indexed: Option<(String, Millis)> = None;
        for _ in 0..INDEX_ATTEMPTS {
            let (index_user, index_time) =
                indexed.as_ref().map_or(("", 0), |(u, t)| (u.as_str(), *t));
            let mut numbers = Vec::with_capacity(5 * 8);
            pack(
                &mut numbers,
                &[
                    req.now as f64,
                    ms(self.limits.session_ttl) as f64,
                    f64::from(self.limits.max_turns),
                    ms(self.limits.index_needed()) as f64,
                    index_time as f64,
                ],
            );
            let mut a = args![
                numbers,
                req.user_id.map(|u| u.as_str()).unwrap_or(""),
                key,
                hash,
                index_user,
            ];
            a.extend(turns.iter().cloned());
            let v: Value = self
                .run_session(&self.scripts.import, session.as_str(), a)
                .await?;
            let mut r = Reply::array(v)?;
            let status = r.string()?;
            match status.as_str() {
                "ok" | "replay" => {
                    let imported = Imported {
                        user_id: r.owner()?,
                        first_seq: r.uint()?,
                        last_seq: r.uint()?,
                        replayed: status == "replay",
                    };
                    if let (1, Some(owner)) = (r.int()?, &imported.user_id) {
                        self.move_to_top(owner, session, req.now).await;
                    }
                    self.free_trimmed(session, r.next()?).await;
                    return Ok(imported);
                }
                "owner_mismatch" => return Err(StoreError::OwnerMismatch),
                "idem_reused" => return Err(StoreError::IdempotencyKeyReused),
                "need_index" => {
                    let user = r.string()?;
                    let min = r.int()?;
                    let time = self.index(&user, session, req.now, min).await?;
                    indexed = Some((user, time));
                }
                other => return Err(corrupt(format!("import status {other:?}"))),
            }
        }
        Err(StoreError::Unavailable(Outage::new(
            OutageClass::Contended,
            "the user index kept changing under this import",
        )))
    }
}
