//! The Lua scripts of the Redis backend: each is `lua/common.lua` (the key
//! names and shared steps) followed by its own file, loaded once per
//! server and called by its SHA1 (the driver loads it again when a
//! restarted server answers `NOSCRIPT`).
//!
//! Each runs with a `#!lua` shebang and no flags: Redis refuses it up
//! front when the server is out of memory (so an append never stops half
//! way for lack of memory), and it may not touch keys of another Cluster
//! slot. Every key it touches carries the stream's hash tag; the meta key
//! is declared as `KEYS[1]` so that a Cluster routes the call to the
//! stream's node.

use redis::Script;

macro_rules! script {
    ($file:literal) => {
        Script::new(concat!("#!lua\n", include_str!("lua/common.lua"), include_str!(concat!("lua/", $file))))
    };
}

/// Every script, built once per backend.
pub(super) struct Scripts {
    pub create_stream: Script,
    pub append: Script,
    pub create_group: Script,
    pub claim: Script,
    pub ack: Script,
    pub renew: Script,
    pub settle_one: Script,
    pub skip: Script,
    pub replay: Script,
    pub replay_query: Script,
    pub reset: Script,
    pub info: Script,
    pub retain: Script,
}

impl Scripts {
    pub fn new() -> Scripts {
        Scripts {
            create_stream: script!("create_stream.lua"),
            append: script!("append.lua"),
            create_group: script!("create_group.lua"),
            claim: script!("claim.lua"),
            ack: script!("ack.lua"),
            renew: script!("renew.lua"),
            settle_one: script!("settle_one.lua"),
            skip: script!("skip.lua"),
            replay: script!("replay.lua"),
            replay_query: script!("replay_query.lua"),
            reset: script!("reset.lua"),
            info: script!("info.lua"),
            retain: script!("retain.lua"),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_claim_script_dead_letters_with_the_crates_reason() {
        let claim = include_str!("lua/claim.lua");
        assert!(claim.contains(&format!("'{}'", crate::groups::rules::EXPIRED_ON_LAST_ATTEMPT)));
    }
}
