//! The Lua scripts (`lua/`), loaded once, and how they are called. Session
//! scripts get the session's four keys (`Keys::session`) and the shared
//! functions of `lua/common.lua`; index scripts get one user's index key.

use redis::{FromRedisValue, Script, Value};

use super::RedisStore;
use crate::store::StoreError;

/// Script arguments, each as Redis would send it.
macro_rules! args {
    ($($a:expr),* $(,)?) => {{
        #[allow(unused_mut)]
        let mut v: Vec<Vec<u8>> = Vec::new();
        $( v.extend(redis::ToRedisArgs::to_redis_args(&$a)); )*
        v
    }};
}
pub(super) use args;

macro_rules! session_script {
    ($file:literal) => {
        Script::new(concat!(
            include_str!("lua/common.lua"),
            "\n",
            include_str!($file)
        ))
    };
    // Scripts that read the history also get the walk.
    (walk $file:literal) => {
        Script::new(concat!(
            include_str!("lua/common.lua"),
            "\n",
            include_str!("lua/walk.lua"),
            "\n",
            include_str!($file)
        ))
    };
}

/// Sessions a call of a per-session script takes on a single Redis: each
/// costs a few commands (about 10 us), so a call stays near 5 ms.
const SESSIONS_PER_CALL: usize = 500;

pub(super) struct Scripts {
    pub start_turn: Script,
    pub finalize_turn: Script,
    pub delete_turn: Script,
    pub history: Script,
    pub session_info: Script,
    pub clear_session: Script,
    pub probe: Script,
    pub erase_sessions: Script,
    pub index_add: Script,
    pub index_remove: Script,
    pub summary_put: Script,
    pub summary_get: Script,
    pub summary_delete: Script,
    pub unsummarized: Script,
    pub import: Script,
    pub turns_page: Script,
    pub forget_turns: Script,
    pub lock: Script,
}

impl Scripts {
    pub fn new() -> Self {
        Scripts {
            start_turn: session_script!(walk "lua/start_turn.lua"),
            finalize_turn: session_script!("lua/finalize_turn.lua"),
            delete_turn: session_script!("lua/delete_turn.lua"),
            history: session_script!(walk "lua/history.lua"),
            session_info: session_script!("lua/session_info.lua"),
            clear_session: session_script!("lua/clear_session.lua"),
            probe: session_script!("lua/probe.lua"),
            erase_sessions: session_script!("lua/erase_sessions.lua"),
            index_add: Script::new(include_str!("lua/index_add.lua")),
            index_remove: Script::new(include_str!("lua/index_remove.lua")),
            summary_put: session_script!("lua/summary_put.lua"),
            summary_get: session_script!("lua/summary_get.lua"),
            summary_delete: session_script!("lua/summary_delete.lua"),
            unsummarized: session_script!("lua/unsummarized.lua"),
            import: session_script!("lua/import.lua"),
            turns_page: session_script!("lua/turns_page.lua"),
            forget_turns: session_script!("lua/forget_turns.lua"),
            lock: Script::new(include_str!("lua/lock.lua")),
        }
    }
}

impl RedisStore {
    /// Runs `script` with these keys and arguments, bounded by the store
    /// timeout. Every script call goes through here.
    pub(super) async fn invoke<T, K, A>(
        &self,
        script: &Script,
        keys: impl IntoIterator<Item = K>,
        args: impl IntoIterator<Item = A>,
    ) -> Result<T, StoreError>
    where
        T: FromRedisValue + Send + 'static,
        K: redis::ToRedisArgs,
        A: redis::ToRedisArgs,
    {
        let mut inv = script.prepare_invoke();
        for key in keys {
            inv.key(key);
        }
        for arg in args {
            inv.arg(arg);
        }
        self.conn
            .with_conn(|mut conn| async move { inv.invoke_async(&mut conn).await })
            .await
    }

    /// Runs a session script, once the stored layout is known to be ours.
    pub(super) async fn run_session<T: FromRedisValue + Send + 'static>(
        &self,
        script: &Script,
        session: &str,
        args: Vec<Vec<u8>>,
    ) -> Result<T, StoreError> {
        self.layout_checked().await?;
        self.invoke(script, self.keys.session(session), args).await
    }

    /// Runs a script that takes any number of sessions (`lua/probe.lua`,
    /// `lua/erase_sessions.lua`): their five keys each, `args`, then one
    /// argument a session. On a single Redis, up to `SESSIONS_PER_CALL`
    /// sessions a call; on a cluster one a call (the keys of one call must
    /// share a slot), concurrently. Returns the reply's element for each
    /// session, in order.
    pub(super) async fn run_per_session(
        &self,
        script: &Script,
        args: Vec<Vec<u8>>,
        sessions: Vec<(&str, Vec<u8>)>,
    ) -> Result<Vec<Value>, StoreError> {
        self.layout_checked().await?;
        let per_call = if self.conn.is_cluster() {
            1
        } else {
            SESSIONS_PER_CALL
        };
        let calls = sessions.chunks(per_call).map(|chunk| {
            let keys = chunk
                .iter()
                .flat_map(|(session, _)| self.keys.session(session));
            let args = args.iter().chain(chunk.iter().map(|(_, a)| a));
            self.invoke::<Vec<Value>, _, _>(script, keys, args)
        });
        let replies = futures_util::future::join_all(calls).await;
        let mut out = Vec::with_capacity(sessions.len());
        for reply in replies {
            out.extend(reply?);
        }
        Ok(out)
    }

    /// Runs an index script on a user's index.
    pub(super) async fn run_index<T: FromRedisValue + Send + 'static>(
        &self,
        script: &Script,
        user: &str,
        args: Vec<Vec<u8>>,
    ) -> Result<T, StoreError> {
        self.layout_checked().await?;
        self.invoke(script, [self.keys.user_index(user)], args)
            .await
    }
}
