//! Every key name of the Redis store (layout 5; older layouts' names are in
//! `layout.rs`, for the migrations).

use super::layout::session_suffixes;

pub(super) struct Keys {
    prefix: String,
}

impl Keys {
    pub fn new(prefix: String) -> Self {
        Keys { prefix }
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// `P:{S}:h`, `:r`, `:s`, the fences `:f` and the summarizer's lock
    /// `:l`, in the order of KEYS in `lua/common.lua`: one hash tag, so one
    /// slot.
    pub fn session(&self, session: &str) -> Vec<String> {
        let base = format!("{}:{{{}}}:", self.prefix, session);
        session_suffixes(super::LAYOUT)
            .iter()
            .chain(["f", "l"].iter())
            .map(|k| format!("{base}{k}"))
            .collect()
    }

    /// The session's keys, then a fork's staging into it (`lua/fork_write.lua`):
    /// records `:fr`, turns `:fs` and the attempt's marker `:fk`.
    pub fn fork(&self, session: &str) -> Vec<String> {
        let mut keys = self.session(session);
        let base = format!("{}:{{{}}}:", self.prefix, session);
        keys.extend(["fr", "fs", "fk"].iter().map(|k| format!("{base}{k}")));
        keys
    }

    /// `P:u:U`: the user's index (another slot than their sessions').
    pub fn user_index(&self, user: &str) -> String {
        format!("{}:u:{}", self.prefix, user)
    }

    /// `P:ready`: what a readiness probe writes (a time, for seconds).
    pub fn ready(&self) -> String {
        format!("{}:ready", self.prefix)
    }

    /// `P:layout`: the layout version.
    pub fn layout(&self) -> String {
        format!("{}:layout", self.prefix)
    }
}
