//! Consumer groups on Redis: a Redis consumer group per partition stream
//! for new deliveries, and beside it the fences, the due set, the settled
//! set and the dead letters (see the module docs of `redis`), each change
//! made by one script. The rules that need no storage are the crate's
//! (`groups::rules`), decided here and applied by the scripts.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use redis::{AsyncCommands, Value};

use super::streams::{decode_entry, entries};
use super::{Core, Keys, bad_reply, key_name, map_err, missing_code, v_arr, v_int, v_text, v_u64};
use crate::backends::common::{self, GroupRow, GroupSettings};
use crate::backends::group_store::{DeliveryCounts, GroupStore, Held, NewGroup};
use crate::error::{Error, ObjectKind, Result};
use crate::groups::rules;
use crate::ids::LeaseId;
use crate::model::damage::Damage;
use crate::model::group::{DeadLetter, DeadLetterOptions, FetchOptions, GroupSummary, check_partitions};
use crate::model::lease::{FetchReport, Lease, LeaseRef};
use crate::model::time::Timestamp;

/// Spent deliveries one fetch dead-letters at most, beyond its limit.
const SPENT_PER_FETCH: usize = crate::groups::SPENT_PER_FETCH;
/// The largest frontier or sequence stored: the scripts count in Lua
/// numbers (doubles), exact up to 2^53. A start past it (no stream gets
/// there) is stored as it, which means the same: nothing to deliver.
const MAX_SEQ: u64 = (1 << 53) - 1;

/// Positions one replay-by-query script reopens at most.
const REPLAY_CHUNK: usize = 1000;

/// A dead letter's record in `dead:{s}:<g>`.
#[derive(Debug, serde::Deserialize)]
struct DeadRecord {
    r: String,
    a: String,
    t: String,
}

impl Core {
    /// The arguments every group script starts with (after prefix and tag).
    fn gargs(group: &str) -> [String; 2] {
        [key_name(group), group.to_owned()]
    }

    fn group_row(stream: &str, group: &str, h: &HashMap<String, String>, hws: &[u64], count: u32) -> Result<GroupRow> {
        let bad = |what: &str| {
            Error::failed(
                "reading a group",
                format!("redis: group {stream:?}/{group:?}: {what} is missing or not valid"),
            )
        };
        let mut settings: GroupSettings = match h.get("settings") {
            Some(t) => serde_json::from_str(t).map_err(|_| bad("settings"))?,
            None => GroupSettings::default(),
        };
        settings.retention_skipped = h.get("skipped").and_then(|v| v.parse().ok()).unwrap_or(0);
        let mut frontiers = BTreeMap::new();
        let mut cursors = BTreeMap::new();
        for (k, v) in h {
            let n: u64 = match v.parse() {
                Ok(n) => n,
                Err(_) => continue,
            };
            if let Some(p) = k.strip_prefix("f:").and_then(|p| p.parse::<u32>().ok()) {
                frontiers.insert(p, n);
            } else if let Some(p) = k.strip_prefix("c:").and_then(|p| p.parse::<u32>().ok()) {
                cursors.insert(p, n);
            }
        }
        Ok(GroupRow {
            count,
            max_attempts: h.get("max").and_then(|v| v.parse().ok()).ok_or_else(|| bad("max attempts"))?,
            settings,
            cursors,
            frontiers,
            created_at: Timestamp::from_millis(h.get("created").and_then(|v| v.parse().ok()).unwrap_or(0)),
            hws: hws.to_vec(),
        })
    }

    /// Every group of a stream, loaded.
    pub(super) async fn all_groups(&self, stream: &str) -> Result<Vec<GroupRow>> {
        Ok(self.groups_named(stream).await?.into_iter().map(|(_, g)| g).collect())
    }

    /// The names of a stream's groups (`groups:{s}`), as the API spells them.
    pub(super) async fn group_names(&self, stream: &str) -> Result<Vec<String>> {
        let mut conn = self.conn();
        conn.hkeys(format!("{}groups:{}", self.base, Self::tag(stream)))
            .await
            .map_err(|e| map_err("list_groups", false, &e))
    }

    async fn groups_named(&self, stream: &str) -> Result<Vec<(String, GroupRow)>> {
        let m = self.meta(stream).await?;
        let mut conn = self.conn();
        let names: HashMap<String, String> = conn
            .hgetall(format!("{}groups:{}", self.base, Self::tag(stream)))
            .await
            .map_err(|e| map_err("list_groups", false, &e))?;
        let mut names: Vec<String> = names.into_keys().collect();
        names.sort();
        if names.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for n in &names {
            pipe.hgetall(self.group_key(stream, n));
        }
        crate::observe::round_trip(super::NAME);
        let rows: Vec<HashMap<String, String>> =
            pipe.query_async(&mut conn).await.map_err(|e| map_err("list_groups", false, &e))?;
        let mut out = Vec::with_capacity(names.len());
        for (n, h) in names.into_iter().zip(rows) {
            if !h.is_empty() {
                let row = Self::group_row(stream, &n, &h, &m.hws, m.count)?;
                out.push((n, row));
            }
        }
        Ok(out)
    }

    pub(super) async fn list_groups_impl(&self, stream: &str) -> Result<Vec<GroupSummary>> {
        Ok(self.groups_named(stream).await?.into_iter().map(|(n, g)| g.summary(&n)).collect())
    }

    // ---- fetch ----

    pub(super) async fn fetch_impl(&self, stream: &str, group: &str, opts: &FetchOptions) -> Result<FetchReport> {
        // One round trip: the script reads the group (max attempts, which
        // partitions it consumes) itself.
        let count = self.partition_count(stream).await?;
        let scope: Vec<u32> = match opts.partitions.as_deref() {
            Some(r) => {
                check_partitions(stream, r, count)?;
                let mut r = r.to_vec();
                r.sort_unstable();
                r.dedup();
                r
            }
            None => (0..count).collect(),
        };
        let now = self.now();
        let expires = now.saturating_add(opts.lease);
        // The leases name their consumer; an unnamed one is "rheo" (Redis no
        // longer sees it: fences do not keep it, ADR 0026).
        let consumer = opts.consumer_id.clone().filter(|c| !c.is_empty()).unwrap_or_else(|| "rheo".to_owned());
        let parts = scope.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
        let [gk, gn] = Self::gargs(group);
        let mut args: Vec<String> = vec![
            gk,
            gn,
            now.as_millis().to_string(),
            expires.as_millis().to_string(),
            opts.limit.to_string(),
            (opts.limit + SPENT_PER_FETCH).to_string(),
            parts,
        ];
        let lease_ids: Vec<String> =
            (0..opts.limit).map(|_| LeaseId::from_u128(crate::ids::new_lease_id()).to_string()).collect();
        args.extend(lease_ids.iter().cloned());
        let r = self.run(&self.scripts.claim, stream, Keys::Group(group), &args, "fetch", true).await?;
        missing_code(&r, stream, group)?;
        let claimed = parse_claims(v_arr(&r).get(1).map(v_arr).unwrap_or_default(), &lease_ids)?;
        let mut claimed = claimed;
        claimed.sort_unstable_by_key(|c| (c.0, c.1));
        // The claimed entries, read outside the script (ADR 0024): one
        // XRANGE per run of consecutive sequences, in one round trip.
        let replies = self.claimed_entries(stream, &claimed).await?;
        let mut found: HashMap<(u32, u64), &[Value]> = HashMap::with_capacity(claimed.len());
        for (p, reply) in &replies {
            for (id, fields) in entries(reply) {
                if let Some(q) = id.split_once('-').and_then(|(q, _)| q.parse().ok()) {
                    found.insert((*p, q), fields);
                }
            }
        }
        let name: Arc<str> = Arc::from(stream);
        let group_name: Arc<str> = Arc::from(group);
        let consumer: Arc<str> = Arc::from(consumer.as_str());
        let mut leases = Vec::with_capacity(claimed.len());
        let mut damaged = Vec::new();
        let mut gone = Vec::new();
        for (p, q, attempt, lease_id) in claimed {
            // An entry deleted by hand: the lease is acked below (settled,
            // nothing to deliver), as before it was claimed.
            let Some(fields) = found.remove(&(p, q)) else {
                gone.push((p, q, lease_id));
                continue;
            };
            // An entry that does not decode (written by another program)
            // is reported, not delivered; the other claims stand.
            let event = match decode_entry(&name, p, &format!("{q}-0"), fields) {
                Ok(e) => e,
                Err(e) => {
                    damaged.push(Damage {
                        stream: stream.to_owned(),
                        partition: p,
                        sequence: q,
                        file: std::path::PathBuf::from(self.part_key(stream, p)),
                        offset: 0,
                        reason: e.to_string(),
                    });
                    continue;
                }
            };
            leases.push(Lease {
                lease_id: lease_id.parse()?,
                receipt: None,
                group: group_name.clone(),
                consumer_id: consumer.clone(),
                attempt,
                expires_at: expires,
                event,
            });
        }
        if !gone.is_empty() {
            let [gk, gn] = Self::gargs(group);
            let mut args: Vec<String> = vec![gk, gn];
            for (p, q, lid) in gone {
                args.extend([p.to_string(), q.to_string(), lid]);
            }
            self.run(&self.scripts.ack, stream, Keys::Group(group), &args, "fetch", true).await?;
        }
        leases.sort_by_key(|l| (l.event.partition(), l.event.sequence()));
        Ok(FetchReport { leases, damaged, ..FetchReport::default() })
    }

    /// The `XRANGE` replies for `claimed` (sorted by partition and
    /// sequence), one per run of consecutive sequences, with the run's
    /// partition, pipelined in one round trip. An entry missing from them
    /// was deleted by hand.
    async fn claimed_entries(&self, stream: &str, claimed: &[(u32, u64, u32, String)]) -> Result<Vec<(u32, Value)>> {
        let mut runs: Vec<(u32, u64, u64)> = Vec::new();
        for &(p, q, _, _) in claimed {
            match runs.last_mut() {
                Some((rp, _, hi)) if *rp == p && *hi + 1 == q => *hi = q,
                _ => runs.push((p, q, q)),
            }
        }
        if runs.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for &(p, lo, hi) in &runs {
            pipe.cmd("XRANGE").arg(self.part_key(stream, p)).arg(format!("{lo}-0")).arg(format!("{hi}-0"));
        }
        crate::observe::round_trip(super::NAME);
        let mut conn = self.conn();
        // (A lost reply leaves the claim made: `Ambiguous`, and the leases
        // come back when they expire.)
        let replies: Vec<Value> = pipe.query_async(&mut conn).await.map_err(|e| map_err("fetch", true, &e))?;
        Ok(runs.iter().map(|r| r.0).zip(replies).collect())
    }

    // ---- settles ----

    /// Runs a batch script over leases grouped by (stream, group): one 1/0
    /// per lease, `StreamNotFound`/`GroupNotFound` for all of a group.
    async fn settle_batch(
        &self,
        leases: &[LeaseRef],
        script: &redis::Script,
        extra: Option<String>,
        operation: &'static str,
    ) -> Result<Vec<Result<bool>>> {
        let mut out: Vec<Option<Result<bool>>> = vec![None; leases.len()];
        for ((stream, group), idx) in common::by_group(leases) {
            let [gk, gn] = Self::gargs(&group);
            let mut args: Vec<String> = vec![gk, gn];
            args.extend(extra.clone());
            for &i in &idx {
                let l = &leases[i];
                args.extend([l.partition.to_string(), l.sequence.to_string(), l.lease_id.to_string()]);
            }
            let r = self.run(script, &stream, Keys::Group(&group), &args, operation, true).await?;
            if let Err(e) = missing_code(&r, &stream, &group) {
                for i in idx {
                    out[i] = Some(Err(e.clone()));
                }
                continue;
            }
            let answers = v_arr(&r);
            if answers.len() != idx.len() {
                return Err(bad_reply(operation, "one answer per lease"));
            }
            for (i, a) in idx.into_iter().zip(answers) {
                out[i] = Some(Ok(v_int(a) == Some(1)));
            }
        }
        Ok(out.into_iter().map(|r| r.unwrap_or_else(|| Err(Error::failed(operation, "no result")))).collect())
    }

    pub(super) async fn ack_many_impl(&self, leases: &[LeaseRef]) -> Result<Vec<Result<()>>> {
        let done = self.settle_batch(leases, &self.scripts.ack, None, "ack").await?;
        Ok(done
            .into_iter()
            .zip(leases)
            .map(|(r, l)| match r {
                Ok(true) => Ok(()),
                Ok(false) => Err(l.stale()),
                Err(e) => Err(e),
            })
            .collect())
    }

    pub(super) async fn renew_many_impl(&self, leases: &[LeaseRef], d: Duration) -> Result<Vec<Result<Timestamp>>> {
        let exp = self.now().saturating_add(d);
        let done = self.settle_batch(leases, &self.scripts.renew, Some(exp.as_millis().to_string()), "renew").await?;
        Ok(done
            .into_iter()
            .zip(leases)
            .map(|(r, l)| match r {
                Ok(true) => Ok(exp),
                Ok(false) => Err(l.stale()),
                Err(e) => Err(e),
            })
            .collect())
    }

    /// Dead-letters or reschedules one held delivery (`attempt`: the one
    /// the decision was made on, None for any). False when the lease no
    /// longer holds it.
    #[allow(clippy::too_many_arguments)]
    async fn settle_one(
        &self,
        lease: &LeaseRef,
        attempt: Option<u32>,
        dead: bool,
        reason: &str,
        now: Timestamp,
        ready: Timestamp,
        operation: &'static str,
    ) -> Result<bool> {
        let [gk, gn] = Self::gargs(&lease.group);
        let args: Vec<String> = vec![
            gk,
            gn,
            lease.partition.to_string(),
            lease.sequence.to_string(),
            lease.lease_id.to_string(),
            attempt.map(|a| a.to_string()).unwrap_or_default(),
            if dead { "dead" } else { "wait" }.to_owned(),
            reason.to_owned(),
            now.as_millis().to_string(),
            ready.as_millis().to_string(),
        ];
        let r = self
            .run(&self.scripts.settle_one, &lease.stream, Keys::Group(&lease.group), &args, operation, true)
            .await?;
        missing_code(&r, &lease.stream, &lease.group)?;
        Ok(v_int(&r) == Some(1))
    }

    pub(super) async fn reject_impl(&self, lease: &LeaseRef, reason: &str) -> Result<()> {
        let now = self.now();
        if self.settle_one(lease, None, true, &rules::rejected(reason), now, now, "reject").await? {
            Ok(())
        } else {
            Err(lease.stale())
        }
    }

    // ---- inspecting ----

    pub(super) async fn dead_letters_impl(
        &self,
        stream: &str,
        group: &str,
        opts: &DeadLetterOptions,
    ) -> Result<Vec<DeadLetter>> {
        const OP: &str = "dead_letters";
        self.load_group(stream, group).await?;
        let tag = Self::tag(stream);
        let gk = key_name(group);
        let dl = format!("{}dl:{tag}:{gk}", self.base);
        let dead = format!("{}dead:{tag}:{gk}", self.base);
        let mut conn = self.conn();
        let after: Option<String> = match (&opts.after_position, &opts.after) {
            (Some((p, q)), _) => Some(format!("{p}:{q}")),
            (None, Some(id)) => {
                let pos: Option<String> =
                    conn.hget(format!("{}dlid:{tag}:{gk}", self.base), id).await.map_err(|e| map_err(OP, false, &e))?;
                Some(pos.ok_or_else(|| Error::CursorNotFound {
                    scope: format!("dead letters of {stream:?}/{group:?}"),
                    cursor: id.clone(),
                })?)
            }
            (None, None) => None,
        };
        let limit = isize::try_from(opts.limit).unwrap_or(isize::MAX);
        let positions: Vec<String> = match after {
            None => conn.zrange(&dl, 0, limit - 1).await.map_err(|e| map_err(OP, false, &e))?,
            Some(pos) => {
                let score: Option<f64> = conn.zscore(&dl, &pos).await.map_err(|e| map_err(OP, false, &e))?;
                let score = score.ok_or_else(|| Error::CursorNotFound {
                    scope: format!("dead letters of {stream:?}/{group:?}"),
                    cursor: opts.after.clone().unwrap_or(pos.clone()),
                })?;
                conn.zrangebyscore_limit(&dl, format!("({score}"), "+inf", 0, limit)
                    .await
                    .map_err(|e| map_err(OP, false, &e))?
            }
        };
        if positions.is_empty() {
            return Ok(Vec::new());
        }
        crate::observe::round_trip(super::NAME);
        let records: Vec<Option<String>> = redis::cmd("HMGET")
            .arg(&dead)
            .arg(&positions)
            .query_async(&mut conn)
            .await
            .map_err(|e| map_err(OP, false, &e))?;
        let name: Arc<str> = Arc::from(stream);
        let mut out = Vec::with_capacity(positions.len());
        for (pos, rec) in positions.iter().zip(records) {
            let (Some((p, q)), Some(rec)) = (
                pos.split_once(':').and_then(|(p, q)| Some((p.parse::<u32>().ok()?, q.parse::<u64>().ok()?))),
                rec.and_then(|r| serde_json::from_str::<DeadRecord>(&r).ok()),
            ) else {
                return Err(Error::failed(
                    OP,
                    format!("redis: dead letter {pos} of {stream:?}/{group:?} is not valid"),
                ));
            };
            let v = self.range(stream, p, q - 1, q, 1).await?;
            let event = match entries(&v).first() {
                Some((id, f)) => Some(decode_entry(&name, p, id, f)?),
                None => None,
            };
            out.push(DeadLetter {
                partition: p,
                sequence: q,
                dropped: event.is_none(),
                event,
                damage: None,
                reason: rec.r,
                attempts: rec.a.parse().unwrap_or(0),
                dead_lettered_at: Timestamp::from_millis(rec.t.parse().unwrap_or(0)),
            });
        }
        Ok(out)
    }
}

impl GroupStore for Core {
    async fn stream_marks(&self, stream: &str) -> Result<(u32, Vec<u64>)> {
        let m = self.meta(stream).await?;
        Ok((m.count, m.hws))
    }

    async fn load_group(&self, stream: &str, group: &str) -> Result<GroupRow> {
        let m = self.meta(stream).await?;
        let mut conn = self.conn();
        let h: HashMap<String, String> =
            conn.hgetall(self.group_key(stream, group)).await.map_err(|e| map_err("load group", false, &e))?;
        if h.is_empty() {
            return Err(Error::group_not_found(stream, group));
        }
        Self::group_row(stream, group, &h, &m.hws, m.count)
    }

    async fn log_starts(&self, stream: &str, hws: &[u64]) -> Result<Vec<u64>> {
        Core::log_starts(self, stream, hws).await
    }

    async fn first_at_or_after(&self, stream: &str, count: u32, t: Timestamp) -> Result<BTreeMap<u32, u64>> {
        Core::first_at_or_after(self, stream, count, t).await
    }

    async fn insert_group(&self, stream: &str, group: &str, new: &NewGroup<'_>) -> Result<Timestamp> {
        let NewGroup { max_attempts, frontiers, settings } = *new;
        let text = serde_json::to_string(settings).map_err(|e| Error::failed("create_group", e.to_string()))?;
        let now = self.now();
        let [g, gn] = Self::gargs(group);
        let mut args: Vec<String> = vec![g, gn, now.as_millis().to_string(), max_attempts.to_string(), text];
        for (p, f) in frontiers {
            args.extend([p.to_string(), (*f).min(MAX_SEQ).to_string()]);
        }
        let r = self.run(&self.scripts.create_group, stream, Keys::Group(group), &args, "create_group", true).await?;
        match v_int(&r) {
            Some(0) => {}
            Some(-1) => return Err(Error::stream_not_found(stream)),
            Some(-3) => {
                return Err(Error::AlreadyExists { kind: ObjectKind::Group, name: format!("{stream}/{group}") });
            }
            _ => return Err(bad_reply("create_group", "a status")),
        }
        Ok(now)
    }

    async fn skip_position(&self, stream: &str, group: &str, at: (u32, u64), reason: &str) -> Result<bool> {
        let (partition, sequence) = at;
        let v = self.range(stream, partition, sequence - 1, sequence, 1).await?;
        let eid = entries(&v)
            .first()
            .and_then(|(_, f)| f.chunks(2).find(|kv| v_text(&kv[0]).as_deref() == Some("id")))
            .and_then(|kv| kv.get(1).and_then(v_text))
            .unwrap_or_default();
        let [gk, gn] = Self::gargs(group);
        let args: Vec<String> = vec![
            gk,
            gn,
            partition.to_string(),
            sequence.to_string(),
            reason.to_owned(),
            self.now().as_millis().to_string(),
            eid,
        ];
        let r = self.run(&self.scripts.skip, stream, Keys::Group(group), &args, "skip", true).await?;
        missing_code(&r, stream, group)?;
        match v_int(&r) {
            Some(1) => Ok(true),
            Some(0) => Ok(false),
            Some(-4) => Err(common::already_settled(group, partition, sequence)),
            _ => Err(bad_reply("skip", "a status")),
        }
    }

    async fn reopen_after(&self, stream: &str, group: &str, starts: &[(u32, u64)], hws: &[u64]) -> Result<u64> {
        let [gk, gn] = Self::gargs(group);
        let mut args: Vec<String> = vec![gk, gn];
        for &(p, from) in starts {
            args.extend([
                p.to_string(),
                from.min(MAX_SEQ).to_string(),
                hws.get(p as usize).copied().unwrap_or(0).to_string(),
            ]);
        }
        let r = self.run(&self.scripts.replay, stream, Keys::Group(group), &args, "replay", true).await?;
        missing_code(&r, stream, group)?;
        v_u64(&r).ok_or_else(|| bad_reply("replay", "a count"))
    }

    async fn reopen_matches(&self, stream: &str, group: &str, matched: &[(u32, u64, String)]) -> Result<u64> {
        let mut total = 0;
        for chunk in matched.chunks(REPLAY_CHUNK) {
            let [gk, gn] = Self::gargs(group);
            let mut args: Vec<String> = vec![gk, gn, self.now().as_millis().to_string()];
            for (p, q, id) in chunk {
                args.extend([p.to_string(), q.to_string(), id.clone()]);
            }
            let r = self.run(&self.scripts.replay_query, stream, Keys::Group(group), &args, "replay", true).await?;
            missing_code(&r, stream, group)?;
            total += v_u64(&r).ok_or_else(|| bad_reply("replay", "a count"))?;
        }
        Ok(total)
    }

    async fn restart(&self, stream: &str, group: &str, starts: &BTreeMap<u32, u64>) -> Result<()> {
        let [gk, gn] = Self::gargs(group);
        let mut args: Vec<String> = vec![gk, gn];
        for (p, &f) in starts {
            args.extend([p.to_string(), f.min(MAX_SEQ).to_string()]);
        }
        let r = self.run(&self.scripts.reset, stream, Keys::Group(group), &args, "reset_group", true).await?;
        missing_code(&r, stream, group)
    }

    async fn delivery_counts(&self, stream: &str, group: &str, scope: &[u32]) -> Result<DeliveryCounts> {
        let [gk, gn] = Self::gargs(group);
        let parts = scope.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
        let args: Vec<String> = vec![gk, gn, self.now().as_millis().to_string(), parts];
        let r = self.run(&self.scripts.info, stream, Keys::Group(group), &args, "group_info", false).await?;
        missing_code(&r, stream, group)?;
        let n: Vec<u64> = v_arr(&r).iter().filter_map(v_u64).collect();
        let [inflight, waiting, dead] = n[..] else { return Err(bad_reply("group_info", "three counts")) };
        Ok(DeliveryCounts { inflight, retry_waiting: waiting, dead_letters: dead, ..DeliveryCounts::default() })
    }

    async fn held_attempt(&self, lease: &LeaseRef) -> Result<Option<Held>> {
        let mut conn = self.conn();
        let raw: Option<String> = conn
            .hget(
                format!("{}st:{}:{}:{}", self.base, Self::tag(&lease.stream), key_name(&lease.group), lease.partition),
                lease.sequence,
            )
            .await
            .map_err(|e| map_err("retry", false, &e))?;
        Ok(raw
            .as_deref()
            .and_then(|t| held_attempt(t, &lease.lease_id.to_string()))
            .map(|attempt| Held { attempt, now: self.now() }))
    }

    async fn dead_letter(&self, lease: &LeaseRef, held: Held, reason: &str) -> Result<bool> {
        let Held { attempt, now } = held;
        self.settle_one(lease, Some(attempt), true, reason, now, now, "retry").await
    }

    async fn reschedule(&self, lease: &LeaseRef, held: Held, reason: &str, available_at: Timestamp) -> Result<bool> {
        let Held { attempt, now } = held;
        self.settle_one(lease, Some(attempt), false, reason, now, available_at.max(now), "retry").await
    }
}

/// The claims of a claim script's reply: per partition (partition, ranges,
/// attempts above the first); the n-th claim holds the n-th lease id.
/// The attempt of a fence (ADR 0026) that is a lease held under `lease`:
/// compact `L<attempt>:<lease id>:<expiry>`, or JSON.
fn held_attempt(fence: &str, lease: &str) -> Option<u32> {
    if let Some(rest) = fence.strip_prefix('L') {
        let mut parts = rest.splitn(3, ':');
        let attempt = parts.next()?.parse().ok()?;
        return (parts.next()? == lease).then_some(attempt);
    }
    let d = serde_json::from_str::<serde_json::Value>(fence).ok()?;
    if d["s"] != "L" || d["l"] != lease {
        return None;
    }
    d["a"].as_str()?.parse().ok()
}

fn parse_claims(parts: &[Value], lease_ids: &[String]) -> Result<Vec<(u32, u64, u32, String)>> {
    let bad = || bad_reply("fetch", "a partition's claims");
    let mut out = Vec::new();
    let mut ids = lease_ids.iter();
    for part in parts.chunks(3) {
        let [p, ranges, again] = part else { return Err(bad()) };
        let p = v_u64(p).and_then(|p| u32::try_from(p).ok()).ok_or_else(bad)?;
        let again: HashMap<u64, u32> = v_text(again)
            .unwrap_or_default()
            .split(',')
            .filter(|a| !a.is_empty())
            .map(|a| {
                let (q, n) = a.split_once(':')?;
                Some((q.parse().ok()?, n.parse().ok()?))
            })
            .collect::<Option<_>>()
            .ok_or_else(bad)?;
        for range in v_text(ranges).ok_or_else(bad)?.split(',') {
            let (lo, hi) = range.split_once('-').unwrap_or((range, range));
            let (lo, hi): (u64, u64) = (lo.parse().map_err(|_| bad())?, hi.parse().map_err(|_| bad())?);
            if hi < lo || hi - lo >= lease_ids.len() as u64 {
                return Err(bad());
            }
            for q in lo..=hi {
                let id = ids.next().ok_or_else(bad)?;
                out.push((p, q, again.get(&q).copied().unwrap_or(1), id.clone()));
            }
        }
    }
    Ok(out)
}
