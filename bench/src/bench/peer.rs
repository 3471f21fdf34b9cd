//! Bare Redis Streams as a peer, measured by the same workloads
//! (`redis-streams://host:port/`, feature `peers`): one stream key per case,
//! `XADD` per event (a `MULTI`/`EXEC` pipeline per batch), `XREADGROUP COUNT
//! n` then one `XACK` of the ids read. No leases, fences, retries, dead
//! letters or frontier: what a hand-written Redis consumer does.

/// The URL scheme of the peer.
pub const SCHEME: &str = "redis-streams:";

#[cfg(feature = "peers")]
pub use imp::{RedisPeer, RedisTarget};

#[cfg(feature = "peers")]
mod imp {
    use std::sync::Arc;

    use redis::AsyncCommands;
    use redis::aio::MultiplexedConnection;
    use redis::streams::{StreamReadOptions, StreamReadReply};

    use super::super::workload::{Backlog, Consumed, Item};
    use rheo_cli::error::CliError;

    fn fail(what: &str, e: redis::RedisError) -> CliError {
        CliError::new(format!("redis-streams: {what}: {e}"))
    }

    /// A connection to the Redis server and its persistence settings.
    #[derive(Clone)]
    pub struct RedisPeer {
        conn: MultiplexedConnection,
        appendonly: String,
        appendfsync: String,
    }

    impl RedisPeer {
        /// Connects and reads the server's AOF settings.
        pub async fn open(url: &str) -> Result<Self, CliError> {
            let rest = url
                .strip_prefix(super::SCHEME)
                .ok_or_else(|| CliError::usage(format!("{url}: expected {}//host:port/", super::SCHEME)))?;
            let redis_url = format!("redis:{rest}");
            let client = redis::Client::open(redis_url.as_str()).map_err(|e| fail("bad URL", e))?;
            let mut conn = client.get_multiplexed_async_connection().await.map_err(|e| fail("cannot connect", e))?;
            // Name, value, name, value (Redis 7 takes several names).
            let pairs: Vec<String> = redis::cmd("CONFIG")
                .arg("GET")
                .arg("appendonly")
                .arg("appendfsync")
                .query_async(&mut conn)
                .await
                .map_err(|e| fail("CONFIG GET", e))?;
            let get =
                |name: &str| pairs.chunks_exact(2).find(|kv| kv[0] == name).map(|kv| kv[1].clone()).unwrap_or_default();
            Ok(RedisPeer { conn, appendonly: get("appendonly"), appendfsync: get("appendfsync") })
        }

        /// `redis-streams (aof always)`, `(aof everysec)` or `(no aof)`.
        pub fn label(&self) -> String {
            if self.appendonly == "yes" {
                format!("redis-streams (aof {})", self.appendfsync)
            } else {
                "redis-streams (no aof)".to_owned()
            }
        }

        /// Whether an acknowledged `XADD` is on disk: AOF with `always`.
        pub fn durable(&self) -> bool {
            self.appendonly == "yes" && self.appendfsync == "always"
        }

        /// The case's stream key.
        pub fn target(&self, stream: &str) -> RedisTarget {
            RedisTarget { conn: self.conn.clone(), key: stream.into() }
        }
    }

    impl std::fmt::Debug for RedisPeer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(&self.label())
        }
    }

    /// One stream key and its `bench` group.
    #[derive(Clone)]
    pub struct RedisTarget {
        conn: MultiplexedConnection,
        key: Arc<str>,
    }

    impl std::fmt::Debug for RedisTarget {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "RedisTarget({})", self.key)
        }
    }

    const GROUP: &str = "bench";

    fn encode(item: &Item) -> String {
        item.payload.to_string()
    }

    impl RedisTarget {
        /// Creates the stream and its group.
        pub async fn setup(&self) -> Result<(), CliError> {
            let mut c = self.conn.clone();
            let _: () = c.xgroup_create_mkstream(&*self.key, GROUP, "0").await.map_err(|e| fail("XGROUP CREATE", e))?;
            Ok(())
        }

        /// `XADD key * d <payload>`.
        pub async fn append(&self, item: Item) -> Result<(), CliError> {
            let mut c = self.conn.clone();
            let _: String = c.xadd(&*self.key, "*", &[("d", encode(&item))]).await.map_err(|e| fail("XADD", e))?;
            Ok(())
        }

        /// The batch's `XADD`s in one `MULTI`/`EXEC`.
        pub async fn append_batch(&self, items: Vec<Item>) -> Result<(), CliError> {
            let mut c = self.conn.clone();
            let mut pipe = redis::pipe();
            pipe.atomic();
            for item in &items {
                pipe.xadd(&*self.key, "*", &[("d", encode(item))]).ignore();
            }
            let _: () = pipe.query_async(&mut c).await.map_err(|e| fail("MULTI XADD", e))?;
            Ok(())
        }

        /// `XREADGROUP ... COUNT limit STREAMS key >`, then `XACK` of the ids.
        pub async fn consume(&self, limit: usize, stamps: bool) -> Result<Consumed, CliError> {
            let mut c = self.conn.clone();
            let opts = StreamReadOptions::default().group(GROUP, "bench").count(limit);
            let reply: Option<StreamReadReply> =
                c.xread_options(&[&*self.key], &[">"], &opts).await.map_err(|e| fail("XREADGROUP", e))?;
            let entries: Vec<_> = reply.into_iter().flat_map(|r| r.keys).flat_map(|k| k.ids).collect();
            if entries.is_empty() {
                return Ok(Consumed::default());
            }
            let mut out = Consumed { count: entries.len(), stamps: Vec::new() };
            if stamps {
                out.stamps = entries
                    .iter()
                    .filter_map(|e| e.get::<String>("d"))
                    .filter_map(|d| serde_json::from_str::<serde_json::Value>(&d).ok())
                    .filter_map(|v| v.get("t").and_then(serde_json::Value::as_u64))
                    .collect();
            }
            let ids: Vec<&str> = entries.iter().map(|e| e.id.as_str()).collect();
            let acked: usize = c.xack(&*self.key, GROUP, &ids).await.map_err(|e| fail("XACK", e))?;
            if acked != ids.len() {
                return Err(CliError::new(format!("redis-streams: XACK acknowledged {acked} of {} ids", ids.len())));
            }
            Ok(out)
        }

        /// `XLEN`, and the group's lag plus pending from `XINFO GROUPS`.
        pub async fn backlog(&self) -> Result<Backlog, CliError> {
            let mut c = self.conn.clone();
            let appended: u64 = c.xlen(&*self.key).await.map_err(|e| fail("XLEN", e))?;
            let groups: Vec<std::collections::HashMap<String, redis::Value>> = redis::cmd("XINFO")
                .arg("GROUPS")
                .arg(&*self.key)
                .query_async(&mut c)
                .await
                .map_err(|e| fail("XINFO", e))?;
            let num = |name: &str, v: Option<&redis::Value>| match v {
                Some(redis::Value::Int(n)) => {
                    u64::try_from(*n).map_err(|_| CliError::new(format!("redis-streams: {name} is {n}")))
                }
                // Redis before 7 has no `lag`; 7 answers nil when it cannot
                // tell: the bench would not know when it is done.
                other => Err(CliError::new(format!(
                    "redis-streams: XINFO GROUPS gives {name} = {other:?} on {} (Redis 7 with an exact lag is needed)",
                    self.key
                ))),
            };
            let group = groups
                .iter()
                .find(|g| matches!(g.get("name"), Some(redis::Value::BulkString(n)) if n == GROUP.as_bytes()))
                .ok_or_else(|| CliError::new(format!("redis-streams: no group {GROUP} on {}", self.key)))?;
            Ok(Backlog { appended, unsettled: num("lag", group.get("lag"))? + num("pending", group.get("pending"))? })
        }
    }
}
