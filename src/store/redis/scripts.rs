//! The Lua scripts (`lua/`), loaded once, and how they are called. Session
//! scripts get the session's four keys (`Keys::session`), the rules of
//! `lua/rules.lua` and the shared functions of `lua/common.lua`; index
//! scripts get one user's index key.

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

/// Numbers as a script unpacks them (`struct.unpack('>d…')`): one argument
/// for many, and no `tonumber` in Lua (each costs more than the walk's own
/// logic). Exact for integers below 2^53.
pub(super) fn pack(out: &mut Vec<u8>, numbers: &[f64]) {
    for n in numbers {
        out.extend_from_slice(&n.to_be_bytes());
    }
}

macro_rules! session_script {
    ($again:ident $file:literal) => {
        Lua::$again(Script::new(concat!(
            include_str!("lua/rules.lua"),
            "\n",
            include_str!("lua/common.lua"),
            "\n",
            include_str!($file)
        )))
    };
    // Scripts that read the history also get the walk.
    ($again:ident walk $file:literal) => {
        Lua::$again(Script::new(concat!(
            include_str!("lua/rules.lua"),
            "\n",
            include_str!("lua/common.lua"),
            "\n",
            include_str!("lua/walk.lua"),
            "\n",
            include_str!($file)
        )))
    };
}

/// A script, and whether it may run twice for one call: after a dropped
/// connection nobody knows whether it ran, and only such a script is
/// tried again (reads; writes that find what they did, a start by its
/// turn id, say).
pub(super) struct Lua {
    pub script: Script,
    pub again: bool,
}

impl Lua {
    pub(super) fn twice(script: Script) -> Self {
        Lua {
            script,
            again: true,
        }
    }

    pub(super) fn once(script: Script) -> Self {
        Lua {
            script,
            again: false,
        }
    }
}

/// Sessions a call of a per-session script takes on a single Redis: each
/// costs a few commands (about 10 us), so a call stays near 5 ms.
const SESSIONS_PER_CALL: usize = 500;

pub(super) struct Scripts {
    pub start_turn: Lua,
    pub finalize_turn: Lua,
    pub delete_turn: Lua,
    pub history: Lua,
    pub session_info: Lua,
    pub clear_session: Lua,
    pub probe: Lua,
    pub erase_sessions: Lua,
    pub index_add: Lua,
    pub index_remove: Lua,
    pub summary_put: Lua,
    pub summary_get: Lua,
    pub summary_delete: Lua,
    pub unsummarized: Lua,
    pub import: Lua,
    pub turns_page: Lua,
    pub forget_turns: Lua,
    pub lock: Lua,
}

impl Scripts {
    pub fn new() -> Self {
        Scripts {
            start_turn: session_script!(twice walk "lua/start_turn.lua"),
            finalize_turn: session_script!(twice "lua/finalize_turn.lua"),
            delete_turn: session_script!(once "lua/delete_turn.lua"),
            history: session_script!(twice walk "lua/history.lua"),
            session_info: session_script!(twice "lua/session_info.lua"),
            clear_session: session_script!(twice "lua/clear_session.lua"),
            probe: session_script!(twice "lua/probe.lua"),
            erase_sessions: session_script!(twice "lua/erase_sessions.lua"),
            index_add: Lua::twice(Script::new(concat!(
                include_str!("lua/rules.lua"),
                "\n",
                include_str!("lua/index_add.lua")
            ))),
            index_remove: Lua::twice(Script::new(include_str!("lua/index_remove.lua"))),
            summary_put: session_script!(once "lua/summary_put.lua"),
            summary_get: session_script!(twice "lua/summary_get.lua"),
            summary_delete: session_script!(twice "lua/summary_delete.lua"),
            unsummarized: session_script!(twice "lua/unsummarized.lua"),
            import: session_script!(twice "lua/import.lua"),
            turns_page: session_script!(twice "lua/turns_page.lua"),
            forget_turns: session_script!(twice "lua/forget_turns.lua"),
            lock: Lua::once(Script::new(include_str!("lua/lock.lua"))),
        }
    }
}

impl RedisStore {
    /// Runs `script` with these keys and arguments, bounded by the store
    /// timeout. Every script call goes through here.
    pub(super) async fn invoke<T, K, A>(
        &self,
        script: &Lua,
        keys: &[K],
        args: &[A],
    ) -> Result<T, StoreError>
    where
        T: FromRedisValue + Send + 'static,
        K: redis::ToRedisArgs + Sync,
        A: redis::ToRedisArgs + Sync,
    {
        // Built again for each attempt (a second one is rare): the
        // arguments are copied once a call, as a ScriptInvocation does.
        self.conn
            .with_conn(script.again, |mut conn| async move {
                let mut inv = script.script.prepare_invoke();
                for key in keys {
                    inv.key(key);
                }
                for arg in args {
                    inv.arg(arg);
                }
                inv.invoke_async(&mut conn).await
            })
            .await
    }

    /// Runs a session script, once the stored layout is known to be ours.
    pub(super) async fn run_session<T: FromRedisValue + Send + 'static>(
        &self,
        script: &Lua,
        session: &str,
        args: Vec<Vec<u8>>,
    ) -> Result<T, StoreError> {
        self.layout_checked().await?;
        self.invoke(script, &self.keys.session(session), &args)
            .await
    }

    /// Runs a script that takes any number of sessions (`lua/probe.lua`,
    /// `lua/erase_sessions.lua`): their five keys each, `args`, then one
    /// argument a session. On a single Redis, up to `SESSIONS_PER_CALL`
    /// sessions a call; on a cluster one a call (the keys of one call must
    /// share a slot), concurrently. Returns the reply's element for each
    /// session, in order.
    pub(super) async fn run_per_session(
        &self,
        script: &Lua,
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
            let keys: Vec<String> = chunk
                .iter()
                .flat_map(|(session, _)| self.keys.session(session))
                .collect();
            let args: Vec<&Vec<u8>> = args.iter().chain(chunk.iter().map(|(_, a)| a)).collect();
            async move { self.invoke::<Vec<Value>, _, _>(script, &keys, &args).await }
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
        script: &Lua,
        user: &str,
        args: Vec<Vec<u8>>,
    ) -> Result<T, StoreError> {
        self.layout_checked().await?;
        self.invoke(script, &[self.keys.user_index(user)], &args)
            .await
    }
}
