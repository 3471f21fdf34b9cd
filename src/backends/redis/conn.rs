//! Connecting: to one server through the driver's reconnecting connection
//! manager, or to a Redis Cluster through its cluster client (ADR 0023).
//!
//! A cluster is named by `redis+cluster://[user:pass@]host:port[,host:port…]`
//! (`rediss+cluster://` over TLS) or by a `redis://` URL with
//! `cluster=true`; the hosts are seeds, the client learns the rest of the
//! topology from them and follows it as slots move and replicas take over.

use std::collections::HashMap;
use std::time::Duration;

use redis::Value;
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_routing::{MultipleNodeRoutingInfo, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};

use super::{Conn, Durability, NAME, UrlOptions, map_err, v_text};
use crate::backends::redact_url;
use crate::error::{Error, Result};

/// How long a watch task's blocking read may wait for its reply (it
/// blocks up to 5 s itself).
pub(super) const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How the watch tasks (blocking reads, one connection each) connect.
#[derive(Clone)]
pub(super) enum Connector {
    Single(redis::Client),
    /// A cluster client whose response timeout outlasts a blocking read.
    Cluster(Box<ClusterClient>),
}

impl Connector {
    /// A connection of its own for blocking reads that wait up to
    /// `timeout`.
    pub async fn blocking(&self, timeout: Duration) -> redis::RedisResult<Conn> {
        match self {
            Connector::Single(c) => {
                let config = redis::AsyncConnectionConfig::new().set_response_timeout(Some(timeout));
                Ok(Conn::Plain(c.get_multiplexed_async_connection_with_config(&config).await?))
            }
            Connector::Cluster(c) => Ok(Conn::Cluster(c.get_async_connection().await?)),
        }
    }
}

/// What `open` makes: the connection for reads and idempotent writes, the
/// one scripts that write go through, and the watch tasks' connector.
pub(super) struct Opened {
    pub conn: Conn,
    pub writes: Conn,
    pub connector: Connector,
}

/// True for a URL that names a cluster by its scheme.
pub(super) fn cluster_scheme(url: &str) -> bool {
    url.starts_with("redis+cluster://") || url.starts_with("rediss+cluster://")
}

/// The seed URLs of a cluster URL (its `+cluster` scheme or `cluster=true`
/// already taken off the options): one `redis://[user:pass@]host:port/`
/// per listed host, the driver's query options on each.
pub(super) fn cluster_seeds(driver: &str) -> Result<Vec<String>> {
    let bad = |why: &str| Error::invalid("url", format!("{}: {why}", redact_url(driver)));
    let (scheme, rest) = driver.split_once("://").ok_or_else(|| bad("expected redis+cluster://host:port,..."))?;
    let scheme = match scheme {
        "redis" | "redis+cluster" => "redis",
        "rediss" | "rediss+cluster" => "rediss",
        _ => return Err(bad("expected redis+cluster:// or rediss+cluster://")),
    };
    let (authority, tail) = match rest.find(['/', '?']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let (path, query) = tail.split_once('?').unwrap_or((tail, ""));
    if !matches!(path, "" | "/" | "/0") {
        return Err(bad("a Redis Cluster has only database 0"));
    }
    let (user, hosts) = match authority.rsplit_once('@') {
        Some((u, h)) => (format!("{u}@"), h),
        None => (String::new(), authority),
    };
    let query = if query.is_empty() { String::new() } else { format!("?{query}") };
    let seeds: Vec<String> =
        hosts.split(',').filter(|h| !h.is_empty()).map(|h| format!("{scheme}://{user}{h}/{query}")).collect();
    if seeds.is_empty() {
        return Err(bad("name at least one node of the cluster (host:port)"));
    }
    if seeds.len() > 64 {
        return Err(bad("at most 64 seed nodes"));
    }
    Ok(seeds)
}

/// Connects to one server; refuses a node of a cluster (its keys would be
/// spread over other nodes).
pub(super) async fn open_single(url: &str, driver: String, o: &UrlOptions) -> Result<Opened> {
    let client = redis::Client::open(driver).map_err(|e| Error::invalid("url", format!("{}: {e}", redact_url(url))))?;
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(Some(o.connect_timeout))
        .set_response_timeout(Some(o.response_timeout))
        .set_number_of_retries(2);
    let conn = tokio::time::timeout(o.connect_timeout, client.get_connection_manager_with_config(config))
        .await
        .map_err(|_| unreachable(url, o.connect_timeout))?
        .map_err(|e| Error::unavailable(NAME, "open", format!("cannot reach {}: {e}", redact_url(url))))?;
    let mut conn = Conn::Single(conn);
    let info: String =
        redis::cmd("INFO").arg("cluster").query_async(&mut conn).await.map_err(|e| map_err("open", false, &e))?;
    if info.lines().any(|l| l.trim() == "cluster_enabled:1") {
        return Err(Error::invalid(
            "url",
            format!(
                "{}: this server is a node of a Redis Cluster; open the cluster with \
                 redis+cluster://host:port[,host:port...] or add cluster=true to the URL",
                redact_url(url)
            ),
        ));
    }
    Ok(Opened { writes: conn.clone(), conn, connector: Connector::Single(client) })
}

/// Connects to a cluster through its seeds.
pub(super) async fn open_cluster(url: &str, driver: &str, o: &UrlOptions) -> Result<Opened> {
    let seeds = cluster_seeds(driver)?;
    let builder = |retries: u32, timeout: Duration| -> Result<ClusterClient> {
        ClusterClientBuilder::new(seeds.clone())
            .connection_timeout(o.connect_timeout)
            .response_timeout(timeout)
            .retries(retries)
            .min_retry_wait(10)
            .max_retry_wait(500)
            .build()
            .map_err(|e| Error::invalid("url", format!("{}: {e}", redact_url(url))))
    };
    // Reads and idempotent writes: the driver follows MOVED and ASK and
    // resends after a reconnect by itself, within the response timeout.
    let reads = builder(16, o.response_timeout)?;
    // Scripts that write: never resent by the driver (see `run`).
    let writes = builder(0, o.response_timeout)?;
    let watch = builder(0, READ_TIMEOUT)?;
    let connect = |c: ClusterClient| async move {
        tokio::time::timeout(o.connect_timeout, async move { c.get_async_connection().await })
            .await
            .map_err(|_| unreachable(url, o.connect_timeout))?
            .map_err(|e| Error::unavailable(NAME, "open", format!("cannot reach the cluster {}: {e}", redact_url(url))))
    };
    let conn = Conn::Cluster(connect(reads).await?);
    let writes = Conn::Cluster(connect(writes).await?);
    Ok(Opened { conn, writes, connector: Connector::Cluster(Box::new(watch)) })
}

fn unreachable(url: &str, within: Duration) -> Error {
    Error::unavailable(NAME, "open", format!("cannot reach {} within {within:?}", redact_url(url)))
}

/// True for a failure the server (or the driver) reports before the call
/// ran anywhere: on a cluster, safe to send again once the slot settles.
pub(super) fn unrun(e: &redis::RedisError) -> bool {
    use redis::ErrorKind as K;
    use redis::ServerErrorKind as S;
    e.is_connection_refusal()
        || matches!(
            e.kind(),
            K::Server(S::Moved | S::Ask | S::TryAgain | S::ClusterDown | S::MasterDown | S::ReadOnly)
                | K::ClusterConnectionNotFound
        )
}

/// The route to the master of the slot `key` is in.
pub(super) fn master_of(key: &str) -> RoutingInfo {
    RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::with_key(key, SlotAddr::Master)))
}

/// Sends `cmd` to every master: (node, its answer or its error text).
pub(super) async fn on_masters(conn: &mut Conn, cmd: redis::Cmd) -> redis::RedisResult<Vec<(String, Value)>> {
    let Conn::Cluster(c) = conn else {
        let v = redis::aio::ConnectionLike::req_packed_command(conn, &cmd).await?;
        return Ok(vec![(String::new(), v)]);
    };
    let v = c.route_command(cmd, RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None))).await?;
    Ok(match v {
        Value::Map(pairs) => pairs.into_iter().map(|(k, v)| (v_text(&k).unwrap_or_default(), v)).collect(),
        other => vec![(String::new(), other)],
    })
}

/// The persistence of every master (`CONFIG GET append*`): the weakest
/// one decides what an acknowledged write survives.
pub(super) async fn durability(conn: &mut Conn) -> Result<Durability> {
    let answers = match on_masters(conn, redis::cmd("CONFIG").arg("GET").arg("append*").clone()).await {
        Ok(a) => a,
        Err(e) if e.is_connection_refusal() || e.is_io_error() || e.is_timeout() => {
            return Err(map_err("open", false, &e));
        }
        Err(_) => return Ok(Durability { aof: false, fsync: String::new(), known: false }),
    };
    let mut all = Vec::with_capacity(answers.len());
    for (_, v) in answers {
        let m: Option<HashMap<String, String>> = redis::from_redis_value(v).ok();
        all.push(match m {
            Some(m) => Durability {
                aof: m.get("appendonly").is_some_and(|v| v == "yes"),
                fsync: m.get("appendfsync").cloned().unwrap_or_default(),
                known: m.contains_key("appendonly"),
            },
            None => Durability { aof: false, fsync: String::new(), known: false },
        });
    }
    let weakest = all.iter().find(|d| !d.durable()).or(all.first()).cloned();
    Ok(weakest.unwrap_or(Durability { aof: false, fsync: String::new(), known: false }))
}

/// The lowest `redis_version` of the masters (`INFO server`), if any says.
pub(super) async fn lowest_version(conn: &mut Conn) -> Option<String> {
    let answers = on_masters(conn, redis::cmd("INFO").arg("server").clone()).await.ok()?;
    answers
        .iter()
        .filter_map(|(_, v)| {
            let text = match v {
                Value::VerbatimString { text, .. } => Some(text.clone()),
                v => v_text(v),
            }?;
            text.lines().find_map(|l| l.strip_prefix("redis_version:")).map(|s| s.trim().to_owned())
        })
        .min_by_key(|v| v.split('.').map(|n| n.parse::<u32>().unwrap_or(0)).collect::<Vec<_>>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_urls_give_one_seed_per_host() {
        assert_eq!(
            cluster_seeds("redis+cluster://u:p@a:1,b:2/?protocol=resp3").expect("seeds"),
            ["redis://u:p@a:1/?protocol=resp3", "redis://u:p@b:2/?protocol=resp3"]
        );
        assert_eq!(cluster_seeds("rediss+cluster://a:1").expect("seeds"), ["rediss://a:1/"]);
        assert_eq!(cluster_seeds("redis://a:1/0").expect("seeds"), ["redis://a:1/"]);
        for (url, says) in [
            ("redis+cluster://a:1/3", "only database 0"),
            ("redis+cluster://", "at least one node"),
            ("http://a:1", "expected redis+cluster"),
        ] {
            let e = cluster_seeds(url).expect_err(url);
            assert!(e.to_string().contains(says), "{url}: {e}");
        }
        assert!(cluster_scheme("redis+cluster://a:1") && cluster_scheme("rediss+cluster://a:1"));
        assert!(!cluster_scheme("redis://a:1"));
    }
}
