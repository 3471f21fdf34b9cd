//! What the database backends (SQL and MongoDB) share: the group settings
//! only this crate keeps, and a group as loaded with its stream's high
//! watermarks.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::model::group::{Backoff, GroupSummary, Lag, PartitionLag, StartPosition, check_partitions};
use crate::model::lease::LeaseRef;
use crate::model::time::Timestamp;

/// The group settings only this crate keeps (the reference's group rows
/// have no place for them), stored as JSON beside the group.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct GroupSettings {
    /// The partitions the group consumes (None: all).
    #[serde(default)]
    pub partitions: Option<Vec<u32>>,
    /// The group's retry backoff.
    #[serde(default)]
    pub retry_backoff: Backoff,
    /// Events retention dropped before the group settled them.
    #[serde(default)]
    pub retention_skipped: u64,
    /// Per-key order (`GroupOptions::ordered_by_key`); written only when
    /// set, so an unkeyed group's settings are as before.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ordered_by_key: bool,
}

/// Frontier and cursor of a partition from a group's maps (defaults: 0,
/// F + 1).
#[cfg_attr(not(any(feature = "sqlite", feature = "postgres", feature = "mongo")), allow(dead_code))]
pub(crate) fn frontier_cursor(frontiers: &BTreeMap<u32, u64>, cursors: &BTreeMap<u32, u64>, p: u32) -> (u64, u64) {
    let f = frontiers.get(&p).copied().unwrap_or(0);
    let c = cursors.get(&p).copied().unwrap_or(f.saturating_add(1)).max(1);
    (f, c)
}

/// A group as loaded (without a lock), with its stream's high watermarks.
#[derive(Debug, Clone)]
pub(crate) struct GroupRow {
    pub count: u32,
    pub max_attempts: u32,
    pub settings: GroupSettings,
    #[cfg_attr(not(any(feature = "sqlite", feature = "postgres", feature = "mongo")), allow(dead_code))]
    pub cursors: BTreeMap<u32, u64>,
    pub frontiers: BTreeMap<u32, u64>,
    pub created_at: Timestamp,
    /// The stream's high watermarks, read with the group.
    pub hws: Vec<u64>,
}

impl GroupRow {
    pub fn hw(&self, p: u32) -> u64 {
        self.hws.get(p as usize).copied().unwrap_or(0)
    }

    pub fn partitions(&self) -> Vec<u32> {
        match &self.settings.partitions {
            Some(ps) => ps.clone(),
            None => (0..self.count).collect(),
        }
    }

    /// The group's partitions within `requested`, checking those exist.
    pub fn scope(&self, stream: &str, requested: Option<&[u32]>) -> Result<Vec<u32>> {
        if let Some(r) = requested {
            check_partitions(stream, r, self.count)?;
        }
        Ok(self.partitions().into_iter().filter(|p| requested.is_none_or(|r| r.contains(p))).collect())
    }

    pub fn summary(&self, name: &str) -> GroupSummary {
        GroupSummary {
            name: name.to_owned(),
            max_attempts: self.max_attempts,
            partitions: self.settings.partitions.clone(),
            created_at: self.created_at,
            ordered_by_key: self.settings.ordered_by_key,
        }
    }

    /// Lag of the partitions in `scope`.
    pub fn lag(&self, stream: &str, group: &str, scope: &[u32]) -> Lag {
        let per = scope
            .iter()
            .map(|&p| PartitionLag::new(p, self.hw(p), self.frontiers.get(&p).copied().unwrap_or(0)))
            .collect();
        Lag::new(stream, group, per)
    }
}

/// The frontier a group starts at in each partition of `parts`: `hws` are
/// the stream's high watermarks and `firsts` (for `StartPosition::At`)
/// each partition's first sequence at or after the time.
pub(crate) fn start_frontiers(
    start: &StartPosition,
    parts: &[u32],
    hws: &[u64],
    firsts: &BTreeMap<u32, u64>,
    log_starts: &[u64],
) -> BTreeMap<u32, u64> {
    let hw = |p: u32| hws.get(p as usize).copied().unwrap_or(0);
    // A start before the log start begins at it.
    let floor = |p: u32| log_starts.get(p as usize).copied().unwrap_or(1).saturating_sub(1);
    parts
        .iter()
        .map(|&p| {
            let f = match start {
                StartPosition::Beginning => 0,
                StartPosition::After(n) => *n,
                StartPosition::AfterPerPartition(m) => m.get(&p).copied().unwrap_or(0),
                StartPosition::At(_) => firsts.get(&p).map_or(hw(p), |s| s - 1),
                StartPosition::Latest => hw(p),
            };
            (p, f.max(floor(p)))
        })
        .collect()
}

/// The error of a `skip` of a position retention dropped.
pub(crate) fn dropped_by_retention(stream: &str, partition: u32, sequence: u64, start: u64) -> Error {
    Error::invalid(
        "sequence",
        format!(
            "sequence {sequence} of partition {partition} of stream {stream:?} was dropped by retention \
             (the partition starts at {start}): nothing to skip"
        ),
    )
}

/// Which partitions of `scope` a fetch adds delivery rows to, in chunks
/// ahead of the claims: (chunk, behind, near). A partition is behind when
/// its cursor has not passed its high watermark; it is near (gets its next
/// chunk before the claim) once fewer than half a chunk of its positions
/// between frontier and cursor are left, so most fetches add none. (A
/// claim that comes back short adds to every partition behind, so a
/// position held back by a hole never starves the rest.)
#[cfg_attr(not(any(feature = "sqlite", feature = "postgres", feature = "mongo")), allow(dead_code))]
pub(crate) fn materialize_plan(g: &GroupRow, scope: &[u32], limit: usize, min: u64) -> (u64, Vec<u32>, Vec<u32>) {
    let chunk = (limit as u64).saturating_mul(8).max(min);
    let behind: Vec<u32> =
        scope.iter().copied().filter(|&p| frontier_cursor(&g.frontiers, &g.cursors, p).1 <= g.hw(p)).collect();
    let near = behind
        .iter()
        .copied()
        .filter(|&p| {
            let (f, c) = frontier_cursor(&g.frontiers, &g.cursors, p);
            c.saturating_sub(1).saturating_sub(f) < chunk / 2
        })
        .collect();
    (chunk, behind, near)
}

/// Checks a `skip` before anything is read: the partition exists and the
/// group consumes it, the sequence is within `1..=high watermark`.
pub(crate) fn check_skip(g: &GroupRow, stream: &str, group: &str, partition: u32, sequence: u64) -> Result<()> {
    check_partitions(stream, &[partition], g.count)?;
    if !g.partitions().contains(&partition) {
        return Err(Error::invalid("partition", format!("group {group:?} does not consume partition {partition}")));
    }
    let hw = g.hw(partition);
    if sequence == 0 || sequence > hw {
        return Err(Error::invalid(
            "sequence",
            format!("sequence {sequence} is not in partition {partition} of stream {stream:?} (it holds 1..={hw})"),
        ));
    }
    Ok(())
}

/// The error of a `skip` of a position already settled.
pub(crate) fn already_settled(group: &str, partition: u32, sequence: u64) -> Error {
    Error::invalid(
        "sequence",
        format!(
            "sequence {sequence} of partition {partition} is already settled for group {group:?} \
             (acknowledged, or before its start): nothing to skip"
        ),
    )
}

/// The starts of a replay by time: per partition of `scope` with an event
/// at or after `t` (`firsts`), the sequence before it. `NoEventsInRange`
/// when none has one.
pub(crate) fn replay_time_starts(
    stream: &str,
    group: &str,
    scope: &[u32],
    firsts: &BTreeMap<u32, u64>,
    t: Timestamp,
) -> Result<Vec<(u32, u64)>> {
    let starts: Vec<(u32, u64)> = scope.iter().filter_map(|&p| firsts.get(&p).map(|&s| (p, s - 1))).collect();
    if starts.is_empty() {
        return Err(Error::NoEventsInRange {
            stream: stream.to_owned(),
            group: group.to_owned(),
            detail: format!("no event at or after {t} in partitions {scope:?}"),
        });
    }
    Ok(starts)
}

/// Leases grouped by (stream, group), each with its index in `leases`.
pub(crate) fn by_group(leases: &[LeaseRef]) -> BTreeMap<(Arc<str>, Arc<str>), Vec<usize>> {
    let mut out: BTreeMap<(Arc<str>, Arc<str>), Vec<usize>> = BTreeMap::new();
    for (i, l) in leases.iter().enumerate() {
        out.entry((l.stream.clone(), l.group.clone())).or_default().push(i);
    }
    out
}

/// What answers a query a page at a time: every backend, and the Redis
/// backend's core (which its combiner shares).
pub(crate) trait QueryPages: Sync {
    fn query_page<'a>(
        &'a self,
        q: &'a crate::model::query::Query,
    ) -> futures::future::BoxFuture<'a, Result<crate::model::query::Page>>;
}

impl<T: crate::backend::Backend + ?Sized> QueryPages for T {
    fn query_page<'a>(
        &'a self,
        q: &'a crate::model::query::Query,
    ) -> futures::future::BoxFuture<'a, Result<crate::model::query::Page>> {
        self.query(q)
    }
}

/// Every (partition, sequence, event id) matching `q` in `scope`, read
/// page by page through the backend's own query (a replay by query).
pub(crate) async fn all_matches(
    backend: &(impl QueryPages + ?Sized),
    q: &crate::model::query::Query,
    scope: &[u32],
) -> Result<Vec<(u32, u64, String)>> {
    let mut q = q.clone();
    q.limit = crate::model::limits::MAX_LIMIT;
    q.cursor = None;
    let mut out = Vec::new();
    loop {
        let page = backend.query_page(&q).await?;
        out.extend(
            page.events
                .iter()
                .filter(|e| scope.contains(&e.partition()))
                .map(|e| (e.partition(), e.sequence(), e.id().to_owned())),
        );
        match page.next_cursor {
            Some(c) => q.cursor = Some(c),
            None => return Ok(out),
        }
    }
}

/// Candidates a keyset scan of a query reads per round trip at most.
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mongo"))]
const QUERY_BATCH_MAX: usize = 1000;

/// One read of [`keyset_query`]: up to `limit` events of `parts` in the
/// query's order past the sort key `after` (from the start when None).
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mongo"))]
pub(crate) struct KeysetBatch<'a> {
    pub parts: &'a [u32],
    /// True when `parts` is every partition of the stream.
    pub every_partition: bool,
    pub after: Option<crate::model::query::SortKey>,
    pub limit: usize,
}

/// Answers `q` (over the stream's partitions, `count`) by a keyset scan in
/// the query's order: `batch` reads one [`KeysetBatch`] within the bounds
/// and filters the database can apply; the query's own rules then pick the
/// page. Stops at a short batch, or at a page and one more match (which
/// sets the next cursor).
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mongo"))]
pub(crate) async fn keyset_query<F, Fut>(
    q: &crate::model::query::Query,
    count: impl std::future::Future<Output = Result<u32>>,
    mut batch: F,
) -> Result<crate::model::query::Page>
where
    F: FnMut(KeysetBatch<'_>) -> Fut,
    Fut: std::future::Future<Output = Result<Vec<crate::model::event::Event>>>,
{
    q.validate()?;
    let count = count.await?;
    let parts = q.partitions(count);
    let every_partition = parts.len() >= count as usize;
    let mut builder = q.page_builder();
    if parts.is_empty() {
        return Ok(builder.finish());
    }
    let want = q.limit.saturating_add(1);
    let n = want.clamp(2, QUERY_BATCH_MAX);
    let mut last = q.cursor.as_ref().map(|c| c.key().2);
    let mut matched = 0usize;
    loop {
        let events = batch(KeysetBatch { parts: &parts, every_partition, after: last, limit: n }).await?;
        let got = events.len();
        for e in events {
            last = Some(q.sort_key(&e));
            if q.matches(&e) {
                matched += 1;
                builder.offer(e);
            }
        }
        if got < n || matched >= want {
            return Ok(builder.finish());
        }
    }
}
