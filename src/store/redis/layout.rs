//! The data layout's version, and the migrations between versions (their
//! scripts live in `migrations/`).

use redis::Value;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};

use super::RedisStore;
use super::conn::{Conn, Target};
use super::scripts::Lua;
use crate::store::{INDEX_SKEW, StoreError, ms};
use crate::turn::now_millis;

/// The layout this build reads and writes.
pub const LAYOUT: u32 = 5;

/// Key suffixes of a session's keys, per layout (index = layout - 1); the
/// first is the meta key, which every session has.
const SUFFIXES: [&[&str]; 5] = [
    &["meta", "turns", "order", "pending", "deadlines", "idem"],
    &["m", "t", "o", "p", "d", "i"],
    &["m", "t", "o", "p", "d", "i"],
    &["h", "r", "s"],
    &["h", "r", "s"],
];

pub fn session_suffixes(layout: u32) -> &'static [&'static str] {
    SUFFIXES[(layout as usize).clamp(1, SUFFIXES.len()) - 1]
}

/// How a migration's script runs per session, with the session's keys in
/// the old layout, then in the new one.
enum Run {
    /// Once; it returns `{changes, conflicts}`.
    Once,
    /// Page by page (`{status, changes, owner, ix}`, see migration 0004),
    /// indexing the owner before the session is finished; then the old
    /// user indexes are dropped.
    Paged,
    /// Page by page over the finalized turns (`{'more', last seq}` until
    /// `{'done', changes}`, see migration 0005).
    Pages,
}

struct Migration {
    /// The layout it produces.
    to: u32,
    name: &'static str,
    /// What its changes are, for the report.
    changes: &'static str,
    script: &'static str,
    run: Run,
}

const MIGRATIONS: &[Migration] = &[
    Migration {
        to: 2,
        name: "0002_short_session_keys",
        changes: "keys moved",
        script: include_str!("../../../migrations/0002_short_session_keys.lua"),
        run: Run::Once,
    },
    Migration {
        to: 3,
        name: "0003_compact_turn_records",
        changes: "records rewritten",
        script: include_str!("../../../migrations/0003_compact_turn_records.lua"),
        run: Run::Once,
    },
    Migration {
        to: 4,
        name: "0004_budget_without_loading",
        changes: "records rewritten",
        script: include_str!("../../../migrations/0004_budget_without_loading.lua"),
        run: Run::Paged,
    },
    Migration {
        to: 5,
        name: "0005_sums_and_english_copies",
        changes: "sums written",
        script: include_str!("../../../migrations/0005_sums_and_english_copies.lua"),
        run: Run::Pages,
    },
];

#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error(
        "the Redis data is in layout {found}, newer than this turnstore knows ({LAYOUT}): upgrade turnstore"
    )]
    Newer { found: u32 },
    #[error("the Redis data is in layout {found}, older than {LAYOUT}: run `turnstore migrate`")]
    Older { found: u32 },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What `migrate` did: one step per migration applied.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct MigrateReport {
    pub from: u32,
    pub to: u32,
    pub steps: Vec<MigrateStep>,
}

#[derive(Debug, PartialEq, Eq)]
pub struct MigrateStep {
    pub name: &'static str,
    pub sessions: u64,
    /// How many, and what (`"keys moved"`, …).
    pub changes: (u64, &'static str),
    pub conflicts: u64,
}

const BATCH: u32 = 500;

/// A master's address; `None` for a standalone Redis.
type Node = Option<(String, u16)>;

impl RedisStore {
    /// The masters' addresses: one for a standalone Redis.
    async fn masters(&self) -> Result<Vec<Node>, StoreError> {
        if matches!(self.conn.target, Target::Standalone(_)) {
            return Ok(vec![None]);
        }
        let slots: Vec<Value> = self
            .conn
            .query(redis::cmd("CLUSTER").arg("SLOTS").clone())
            .await?;
        let mut masters = Vec::new();
        for range in slots {
            let Value::Array(items) = range else { continue };
            if let Some(Value::Array(node)) = items.get(2)
                && let (Some(host), Some(Value::Int(port))) = (node.first(), node.get(1))
            {
                let host = match host {
                    Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                    Value::SimpleString(s) => s.clone(),
                    _ => continue,
                };
                let addr = Some((host, *port as u16));
                if !masters.contains(&addr) {
                    masters.push(addr);
                }
            }
        }
        Ok(masters)
    }

    /// One SCAN page on one master: (next cursor, keys).
    async fn scan_page(
        &self,
        node: &Node,
        cursor: u64,
        pattern: &str,
    ) -> Result<(u64, Vec<String>), StoreError> {
        let mut cmd = redis::cmd("SCAN");
        cmd.arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(BATCH);
        self.conn
            .with_conn(true, |conn| {
                let (cmd, node) = (cmd.clone(), node.clone());
                async move {
                    match (conn, node) {
                        (Conn::Cluster(mut c), Some((host, port))) => {
                            let routing =
                                RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                                    host,
                                    port,
                                });
                            let v = c.route_command(cmd, routing).await?;
                            Ok(redis::from_redis_value(v)?)
                        }
                        (mut conn, _) => cmd.query_async(&mut conn).await,
                    }
                }
            })
            .await
    }

    /// Sessions of layout 1 exist: some `P:{*}:meta` key, on any master.
    async fn has_layout_1_data(&self) -> Result<bool, StoreError> {
        let pattern = format!("{}:{{*}}:{}", self.keys.prefix(), session_suffixes(1)[0]);
        for node in self.masters().await? {
            let mut cursor = 0;
            loop {
                let (next, keys) = self.scan_page(&node, cursor, &pattern).await?;
                if !keys.is_empty() {
                    return Ok(true);
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        Ok(false)
    }

    /// The stored layout; `None` for a store with no turnstore data yet.
    pub async fn stored_layout(&self) -> Result<Option<u32>, StoreError> {
        let v: Option<u32> = self
            .conn
            .query(redis::cmd("GET").arg(self.keys.layout()).clone())
            .await?;
        match v {
            Some(v) => Ok(Some(v)),
            // Layout 1 had no version key.
            None if self.has_layout_1_data().await? => Ok(Some(1)),
            None => Ok(None),
        }
    }

    /// Marks a store with no turnstore data as being in this layout.
    async fn mark_fresh(&self) -> Result<(), StoreError> {
        let cmd = redis::cmd("SET")
            .arg(self.keys.layout())
            .arg(LAYOUT)
            .arg("NX")
            .clone();
        self.conn.query::<Value>(cmd).await.map(|_| ())
    }

    /// Checks that this build can serve the stored layout; records it on a
    /// fresh store.
    pub async fn ensure_layout(&self) -> Result<(), LayoutError> {
        match self.stored_layout().await? {
            Some(found) if found > LAYOUT => Err(LayoutError::Newer { found }),
            Some(found) if found < LAYOUT => Err(LayoutError::Older { found }),
            Some(_) => Ok(()),
            None => {
                self.mark_fresh().await?;
                // Another instance may have set it first: read it back.
                match self.stored_layout().await? {
                    Some(LAYOUT) => Ok(()),
                    Some(found) if found > LAYOUT => Err(LayoutError::Newer { found }),
                    Some(found) => Err(LayoutError::Older { found }),
                    None => Ok(()),
                }
            }
        }
    }

    /// Applies every migration past the stored layout, resuming an
    /// interrupted run. `progress` is told about each batch.
    pub async fn migrate(&self, progress: impl Fn(&str)) -> Result<MigrateReport, LayoutError> {
        let from = match self.stored_layout().await? {
            Some(found) if found > LAYOUT => return Err(LayoutError::Newer { found }),
            Some(found) => found,
            None => LAYOUT,
        };
        let mut report = MigrateReport {
            from,
            to: from,
            steps: Vec::new(),
        };
        for m in MIGRATIONS.iter().filter(|m| m.to > from) {
            report.steps.push(self.apply(m, &progress).await?);
            let cmd = redis::cmd("SET").arg(self.keys.layout()).arg(m.to).clone();
            self.conn.query::<Value>(cmd).await?;
            report.to = m.to;
            progress(&format!("{}: layout is now {}", m.name, m.to));
        }
        if report.from == report.to {
            self.mark_fresh().await?;
        }
        Ok(report)
    }

    async fn apply(
        &self,
        m: &Migration,
        progress: &impl Fn(&str),
    ) -> Result<MigrateStep, LayoutError> {
        let mut report = MigrateStep {
            name: m.name,
            sessions: 0,
            changes: (0, m.changes),
            conflicts: 0,
        };
        let script = Lua::once(m.name, redis::Script::new(m.script));
        let (old, new) = (session_suffixes(m.to - 1), session_suffixes(m.to));
        let prefix = self.keys.prefix();
        let pattern = format!("{prefix}:{{*}}:{}", old[0]);
        for node in self.masters().await? {
            let node_name = node
                .as_ref()
                .map(|(h, p)| format!("{h}:{p}"))
                .unwrap_or_else(|| "standalone".into());
            let cursor_key = format!("{prefix}:migration:{}:{node_name}", m.to);
            let saved: Option<u64> = self
                .conn
                .query(redis::cmd("GET").arg(&cursor_key).clone())
                .await?;
            let mut cursor = saved.unwrap_or(0);
            if saved.is_some() {
                progress(&format!(
                    "{}: resuming {node_name} at cursor {cursor}",
                    m.name
                ));
            }
            loop {
                let (next, keys) = self.scan_page(&node, cursor, &pattern).await?;
                for key in &keys {
                    let Some(session) = key
                        .strip_prefix(&format!("{prefix}:{{"))
                        .and_then(|k| k.strip_suffix(&format!("}}:{}", old[0])))
                    else {
                        continue;
                    };
                    let base = format!("{prefix}:{{{session}}}:");
                    let keys: Vec<String> = old
                        .iter()
                        .chain(new.iter())
                        .map(|s| format!("{base}{s}"))
                        .collect();
                    let (changes, conflicts) = match m.run {
                        Run::Once => self.migrate_once(&script, &keys).await?,
                        Run::Paged => (self.migrate_paged(&script, &keys, session).await?, 0),
                        Run::Pages => (self.migrate_pages(&script, &keys).await?, 0),
                    };
                    report.sessions += 1;
                    report.changes.0 += changes;
                    report.conflicts += conflicts;
                }
                if next == 0 {
                    break;
                }
                cursor = next;
                let save = redis::cmd("SET").arg(&cursor_key).arg(cursor).clone();
                self.conn.query::<Value>(save).await?;
                progress(&format!(
                    "{}: {node_name}: {} sessions so far",
                    m.name, report.sessions
                ));
            }
            self.conn
                .query::<Value>(redis::cmd("DEL").arg(&cursor_key).clone())
                .await?;
        }
        if let Run::Paged = m.run {
            let dropped = self.drop_keys(&format!("{prefix}:user:*")).await?;
            progress(&format!("{}: {dropped} old user indexes dropped", m.name));
        }
        Ok(report)
    }

    async fn migrate_once(&self, script: &Lua, keys: &[String]) -> Result<(u64, u64), StoreError> {
        self.invoke::<_, _, Vec<u8>>(script, keys, &[]).await
    }

    /// Runs a paged migration on one session until it is done, indexing
    /// its owner before the last call (the index is never behind).
    async fn migrate_paged(
        &self,
        script: &Lua,
        keys: &[String],
        session: &str,
    ) -> Result<u64, StoreError> {
        let horizon = ms(self.limits.index_horizon());
        let mut changes = 0;
        let mut finish = false;
        loop {
            let a = super::scripts::args![now_millis(), horizon, if finish { "1" } else { "0" }];
            let (status, n, owner, ix): (String, u64, String, i64) =
                self.invoke(script, keys, &a).await?;
            changes += n;
            match status.as_str() {
                "more" => {}
                "ready" => {
                    if !owner.is_empty() {
                        let now = now_millis();
                        let a = super::scripts::args![session, now, ix, 0, ms(INDEX_SKEW)];
                        let _: i64 = self
                            .invoke(&self.scripts.index_add, &[self.keys.user_index(&owner)], &a)
                            .await?;
                    }
                    finish = true;
                }
                _ => return Ok(changes),
            }
        }
    }

    /// Runs a migration over a session's finalized turns a page a call.
    async fn migrate_pages(&self, script: &Lua, keys: &[String]) -> Result<u64, StoreError> {
        let mut after = "0".to_owned();
        loop {
            let (status, next): (String, String) = self
                .invoke(script, keys, &super::scripts::args![after.as_str()])
                .await?;
            match status.as_str() {
                "more" => after = next,
                _ => return Ok(next.parse().unwrap_or(0)),
            }
        }
    }

    /// UNLINKs every key matching `pattern`, on every master.
    async fn drop_keys(&self, pattern: &str) -> Result<u64, StoreError> {
        let mut dropped = 0;
        for node in self.masters().await? {
            let mut cursor = 0;
            loop {
                let (next, keys) = self.scan_page(&node, cursor, pattern).await?;
                for key in keys {
                    let _: i64 = self
                        .conn
                        .query(redis::cmd("UNLINK").arg(key).clone())
                        .await?;
                    dropped += 1;
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        Ok(dropped)
    }
}
