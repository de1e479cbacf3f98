//! The Lua scripts (`lua/`), loaded once, and how they are called. Session
//! scripts get the session's seven keys (`Keys::session`) and the shared
//! functions of `lua/common.lua`; index scripts get one user's index key.

use redis::{FromRedisValue, Script};

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

pub(super) struct Scripts {
    pub start_turn: Script,
    pub finalize_turn: Script,
    pub delete_turn: Script,
    pub history: Script,
    pub session_info: Script,
    pub clear_session: Script,
    pub probe: Script,
    pub erase_session: Script,
    pub index_add: Script,
    pub index_remove: Script,
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
            erase_session: session_script!("lua/erase_session.lua"),
            index_add: Script::new(include_str!("lua/index_add.lua")),
            index_remove: Script::new(include_str!("lua/index_remove.lua")),
        }
    }
}

impl RedisStore {
    /// Runs a session script, once the stored layout is known to be ours.
    pub(super) async fn run_session<T: FromRedisValue + Send + 'static>(
        &self,
        script: &Script,
        session: &str,
        args: Vec<Vec<u8>>,
    ) -> Result<T, StoreError> {
        self.layout_checked().await?;
        let mut inv = script.prepare_invoke();
        for key in self.keys.session(session) {
            inv.key(key);
        }
        for arg in args {
            inv.arg(arg);
        }
        self.conn
            .with_conn(|mut conn| async move { inv.invoke_async(&mut conn).await })
            .await
    }

    /// Runs an index script on a user's index.
    pub(super) async fn run_index<T: FromRedisValue + Send + 'static>(
        &self,
        script: &Script,
        user: &str,
        args: Vec<Vec<u8>>,
    ) -> Result<T, StoreError> {
        self.layout_checked().await?;
        let mut inv = script.prepare_invoke();
        inv.key(self.keys.user_index(user));
        for arg in args {
            inv.arg(arg);
        }
        self.conn
            .with_conn(|mut conn| async move { inv.invoke_async(&mut conn).await })
            .await
    }
}
