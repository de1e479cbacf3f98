//! The Lua scripts (`lua/`), and how they are called. Session scripts get
//! the session's four keys (`Keys::session`), the rules of `lua/rules.lua`
//! and the shared functions of `lua/common.lua`; index scripts get one
//! user's index key.
//!
//! On Redis 7 and later every script is a function of one library
//! (`Library`), loaded once and called by FCALL: the shared functions are
//! defined when it loads, not again on each call as an EVAL script does
//! (about a tenth of Redis' CPU a question). Where Redis has no functions
//! (Redis 6, or an ACL user without FUNCTION), the same scripts run by
//! EVALSHA.

use std::sync::atomic::{AtomicBool, Ordering};

use redis::{FromRedisValue, RedisError, Script, Value};

use super::RedisStore;
use super::conn::Conn;
use crate::store::StoreError;
use crate::telemetry;
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

/// What a script is made of besides its own file: nothing, the rules
/// (`lua/rules.lua`), the rules and the session functions
/// (`lua/common.lua`), or those and the walk (`lua/walk.lua`).
#[derive(Clone, Copy, PartialEq)]
enum Needs {
    Nothing,
    Rules,
    Session,
    Walk,
}

/// When Redis may run a function (its flags). `Reads` writes nothing
/// (`no-writes`): it runs while Redis is out of memory, as a read must.
/// `Frees` deletes, or writes a few bytes at most (`allow-oom`): a user's
/// erasure is not refused because memory is full. `Writes` is refused
/// before it runs when Redis is out of memory, so it writes nothing then.
/// (By EVALSHA, Redis refuses a script's first write instead.)
#[derive(Clone, Copy)]
enum Runs {
    Reads,
    Frees,
    Writes,
}

struct Def {
    name: &'static str,
    needs: Needs,
    runs: Runs,
    again: bool,
    body: &'static str,
}

const RULES: &str = include_str!("lua/rules.lua");
const COMMON: &str = include_str!("lua/common.lua");
const WALK: &str = include_str!("lua/walk.lua");

impl Def {
    /// The script as EVALSHA runs it: what it needs, then its own file.
    fn source(&self) -> String {
        let parts: &[&str] = match self.needs {
            Needs::Nothing => &[],
            Needs::Rules => &[RULES],
            Needs::Session => &[RULES, COMMON],
            Needs::Walk => &[RULES, COMMON, WALK],
        };
        let mut source = String::new();
        for part in parts {
            source.push_str(part);
            source.push('\n');
        }
        source + self.body
    }
}

/// A script, and whether it may run twice for one call: after a dropped
/// connection nobody knows whether it ran, and only such a script is
/// tried again (reads; writes that find what they did, a start by its
/// turn id, say).
pub(super) struct Lua {
    pub script: Script,
    /// Its file's name (a trace's span names the call after it).
    pub name: &'static str,
    /// Its name in the library; `None` for a script of its own (a
    /// migration's), always run by EVALSHA.
    pub function: Option<String>,
    pub again: bool,
}

impl Lua {
    /// A script outside the library, run once a call.
    pub(super) fn once(name: &'static str, script: Script) -> Self {
        Lua {
            script,
            name,
            function: None,
            again: false,
        }
    }
}

macro_rules! again {
    (twice) => {
        true
    };
    (once) => {
        false
    };
}

/// Each script: its file under `lua/` (named as the field), what it
/// needs, when Redis may run it, and whether it may run twice for a call.
macro_rules! scripts {
    ($($name:ident: $needs:ident, $runs:ident, $again:ident;)*) => {
        pub(super) struct Scripts {
            $(pub $name: Lua,)*
            pub library: Library,
        }

        const DEFS: &[Def] = &[$(Def {
            name: stringify!($name),
            needs: Needs::$needs,
            runs: Runs::$runs,
            again: again!($again),
            body: include_str!(concat!("lua/", stringify!($name), ".lua")),
        },)*];

        impl Scripts {
            pub fn new() -> Self {
                let library = Library::new(DEFS);
                let mut defs = DEFS.iter();
                Scripts {
                    $($name: library.lua(defs.next().expect("a definition a script")),)*
                    library,
                }
            }
        }
    };
}

scripts! {
    start_turn: Walk, Writes, twice;
    finalize_turn: Session, Writes, twice;
    regenerate: Session, Writes, twice;
    delete_turn: Session, Frees, once;
    history: Walk, Reads, twice;
    session_info: Session, Reads, twice;
    clear_session: Session, Frees, twice;
    probe: Session, Frees, twice;
    erase_sessions: Session, Frees, twice;
    index_add: Rules, Writes, twice;
    index_remove: Nothing, Frees, twice;
    summary_put: Session, Writes, once;
    summary_get: Session, Reads, twice;
    summary_delete: Session, Frees, twice;
    unsummarized: Session, Reads, twice;
    import: Session, Writes, twice;
    turns_page: Session, Reads, twice;
    forget_turns: Session, Frees, twice;
    fork_read: Session, Reads, twice;
    fork_write: Session, Writes, twice;
    fork_publish: Session, Writes, twice;
    fork_abort: Nothing, Frees, twice;
    lock: Nothing, Writes, once;
}

/// Every script as a function of one Redis library. Its name and its
/// functions' carry a hash of its source, so instances of two versions
/// sharing a Redis (a rolling upgrade) each call their own. Redis keeps
/// loaded libraries with its data (persisted, replicated); one that lost
/// it (a restart without persistence, `FUNCTION FLUSH`, a new cluster
/// master) answers "Function not found", and the library is loaded again.
pub(super) struct Library {
    pub name: String,
    source: String,
    /// Redis turned out to have no functions: scripts run by EVALSHA.
    unsupported: AtomicBool,
}

impl Library {
    fn new(defs: &[Def]) -> Self {
        // KEYS and ARGV are globals of an EVAL script; here each
        // function's callback sets them for the script it runs.
        let mut body = format!("local KEYS, ARGV\n{RULES}\n{COMMON}\n{WALK}\n");
        for d in defs {
            body += &format!("local function script_{}()\n{}\nend\n", d.name, d.body);
        }
        let name = format!("turnstore_{}", &Script::new(&body).get_hash()[..12]);
        for d in defs {
            let flags = match d.runs {
                Runs::Reads => "'no-writes'",
                Runs::Frees => "'allow-oom'",
                Runs::Writes => "",
            };
            body += &format!(
                "redis.register_function{{function_name = '{name}_{0}', \
                 callback = function(keys, args) KEYS, ARGV = keys, args; \
                 return script_{0}() end, flags = {{{flags}}}}}\n",
                d.name
            );
        }
        Library {
            source: format!("#!lua name={name}\n{body}"),
            name,
            unsupported: AtomicBool::new(false),
        }
    }

    fn lua(&self, def: &Def) -> Lua {
        Lua {
            script: Script::new(&def.source()),
            name: def.name,
            function: Some(format!("{}_{}", self.name, def.name)),
            again: def.again,
        }
    }

    /// Runs `fcall`, loading the library first if Redis lacks it; `None`
    /// when Redis has no functions (the caller runs the script by
    /// EVALSHA, from then on).
    async fn call<T: FromRedisValue>(
        &self,
        conn: &mut Conn,
        fcall: &redis::Cmd,
    ) -> Option<redis::RedisResult<T>> {
        if self.unsupported.load(Ordering::Relaxed) {
            return None;
        }
        match fcall.query_async(conn).await {
            Err(e) if missing(&e) => {}
            Err(e) if unsupported(&e) => return self.give_up(&e),
            done => return Some(done),
        }
        let load = redis::cmd("FUNCTION")
            .arg("LOAD")
            .arg("REPLACE")
            .arg(&self.source)
            .query_async::<Value>(conn)
            .await;
        match load {
            Ok(_) => {
                tracing::debug!(library = %self.name, "loaded the Redis function library");
                Some(fcall.query_async(conn).await)
            }
            Err(e) if unsupported(&e) => self.give_up(&e),
            Err(e) => Some(Err(e)),
        }
    }

    fn give_up<T>(&self, e: &RedisError) -> Option<T> {
        if !self.unsupported.swap(true, Ordering::Relaxed) {
            // Not `e` itself: Redis quotes the command's arguments.
            tracing::warn!(
                code = e.code().unwrap_or("none"),
                "Redis runs no functions here (Redis 6, or FUNCTION or FCALL not \
                 permitted): scripts run by EVALSHA, at about a tenth more Redis CPU"
            );
        }
        None
    }
}

/// Sessions a call of a per-session script takes on a single Redis: each
/// costs a few commands (about 10 us), so a call stays near 5 ms.
const SESSIONS_PER_CALL: usize = 500;

/// Redis has functions, but not this library.
fn missing(e: &RedisError) -> bool {
    e.code() == Some("ERR")
        && e.detail()
            .is_some_and(|d| d.starts_with("Function not found"))
}

/// Redis has no functions, or this user may not call or load them.
fn unsupported(e: &RedisError) -> bool {
    let detail = e.detail().unwrap_or("").to_ascii_lowercase();
    match e.code() {
        Some("ERR") => {
            detail.starts_with("unknown command") || detail.starts_with("unknown subcommand")
        }
        Some("NOPERM") => detail.contains("fcall") || detail.contains("function"),
        _ => false,
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
        let call = self.conn.with_conn(script.again, |mut conn| async move {
            if let Some(function) = &script.function {
                let mut fcall = redis::cmd("FCALL");
                fcall.arg(function).arg(keys.len()).arg(keys).arg(args);
                if let Some(done) = self.scripts.library.call(&mut conn, &fcall).await {
                    return done;
                }
            }
            let mut inv = script.script.prepare_invoke();
            for key in keys {
                inv.key(key);
            }
            for arg in args {
                inv.arg(arg);
            }
            inv.invoke_async(&mut conn).await
        });
        if telemetry::on() {
            telemetry::script(script.name, call).await
        } else {
            call.await
        }
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

    /// Runs a fork's script on the session it makes, with its staging keys.
    pub(super) async fn run_fork<T: FromRedisValue + Send + 'static>(
        &self,
        script: &Lua,
        session: &str,
        args: Vec<Vec<u8>>,
    ) -> Result<T, StoreError> {
        self.layout_checked().await?;
        self.invoke(script, &self.keys.fork(session), &args).await
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
