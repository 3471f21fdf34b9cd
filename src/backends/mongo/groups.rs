//! Consumer groups on MongoDB: the reference's `groups` (cursors and
//! frontiers as sub-documents keyed by decimal partition) and
//! `deliveries` (one document per materialized delivery), driven by the
//! crate's group rules (ADR 0014 lists where this differs from the
//! reference, compatibly).
//!
//! Invariants (those of the SQL backends): per partition, every sequence
//! of `[start, cursor)` has a delivery document, except those the group
//! settled by starting past them; a missing document below the cursor is
//! settled. The frontier F is the largest n such that nothing in `(F, n]`
//! is unsettled.
//!
//! Concurrency: every transaction that changes the group's state (its
//! maps, dead letters, acks) first writes the group document
//! (`rheo_rs_version`), so two of them on one group always conflict and
//! one runs again: they behave as if taken one after the other (without
//! it, two acks that each read the other's delivery as unsettled would
//! both leave the frontier short). Claims and renewals run outside the
//! group's lock: each delivery document is updated atomically under its
//! own filter, so two claimers never both win one.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::TryStreamExt;
use mongodb::ClientSession;
use mongodb::bson::{Bson, DateTime, Document, doc};
use mongodb::options::ReturnDocument;

use super::streams::{decode_event, get_map, get_u64};
use super::{
    DELIVERIES, EVENTS, GROUPS, MongoBackend, Phase, SETTINGS, STREAMS, TxFailure, in_group_tx, in_tx, map_err, txe,
};
use crate::backends::common::{self, GroupRow, GroupSettings, frontier_cursor as fc};
use crate::backends::group_store::{
    self, ClaimSpec, DeadLetterAt, DeliveryCounts, GroupStore, Held, MaterializedFetch, NewGroup, SettleStore, Taken,
};
use crate::error::{Error, ObjectKind, Result};
use crate::groups::rules;
use crate::model::event::Event;
use crate::model::group::{DeadLetter, FetchOptions, GroupSummary};
use crate::model::lease::{FetchReport, Lease, LeaseId, LeaseRef};
use crate::model::time::Timestamp;

/// Spent deliveries one fetch dead-letters at most, beyond its limit.
const SPENT_PER_FETCH: usize = crate::groups::SPENT_PER_FETCH;
/// Times a fetch claims again when other consumers won every candidate.
const CLAIM_ROUNDS: u32 = 8;
/// Pages of candidates a keyed group's claim reads per partition at most
/// (each leaves out the keys met in the ones before).
const KEYED_PAGES: usize = 4;
/// The field of a delivery that orders dead letters (this crate's; the
/// reference's dead letters have none and list first).
const MARK: &str = "rheo_rs_mark";
/// The group document's counters: the version every state change bumps
/// (see the module docs) and the last dead-letter mark given.
const VERSION: &str = "rheo_rs_version";
const MARKS: &str = "rheo_rs_marks";

const LEASED: &str = "leased";
const AVAILABLE: &str = "available";
const ACKED: &str = "acked";
pub(super) const REJECTED: &str = "rejected";

fn dt(t: Timestamp) -> Bson {
    Bson::DateTime(DateTime::from_millis(t.as_millis()))
}

/// The path of an event document's delivery time (`DELIVER_AT` in its
/// metadata, milliseconds), for a projection.
const METADATA_DELIVER_AT: &str = "metadata.deliver_at";

/// The delivery time an event document holds (projected or whole), if any.
fn stored_deliver_at(e: &Document) -> Option<Timestamp> {
    match e.get_document("metadata").ok()?.get(crate::model::path::DELIVER_AT)? {
        Bson::Int64(n) => Some(Timestamp::from_millis(*n)),
        Bson::Int32(n) => Some(Timestamp::from_millis(i64::from(*n))),
        _ => None,
    }
}

fn ts(d: &Document, field: &str) -> Option<Timestamp> {
    match d.get(field) {
        Some(Bson::DateTime(t)) => Some(Timestamp::from_millis(t.timestamp_millis())),
        _ => None,
    }
}

/// A sequence or count as BSON's int64 (a start past `i64::MAX` is as
/// good as `i64::MAX`).
pub(super) fn int(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A partition map as a sub-document `{"0": n}`.
fn map_doc(m: &BTreeMap<u32, u64>) -> Document {
    m.iter().map(|(p, n)| (p.to_string(), Bson::Int64(int(*n)))).collect()
}

/// The filter of one group's deliveries.
fn sg(stream: &str, group: &str) -> Document {
    doc! { "stream": stream, "group": group }
}

/// The filter of one group's deliveries plus `extra`.
fn sg_and(stream: &str, group: &str, extra: Document) -> Document {
    let mut d = sg(stream, group);
    d.extend(extra);
    d
}

/// Settled statuses.
fn terminal() -> Bson {
    Bson::Array(vec![ACKED.into(), REJECTED.into()])
}

/// Claimable at `now`: never claimed, or leased with an expired lease (a
/// retry's backoff is a lease without a holder that expires when it ends).
fn claimable(now: Timestamp) -> Document {
    doc! { "$or": [
        { "status": AVAILABLE },
        { "status": LEASED, "expires_at": { "$ne": Bson::Null, "$lte": dt(now) } },
    ] }
}

pub(super) fn int_of(d: &Document, field: &str) -> u64 {
    get_u64(d, field).unwrap_or(0)
}

fn u32_of(d: &Document, field: &str) -> u32 {
    u32::try_from(int_of(d, field)).unwrap_or(u32::MAX)
}

/// A driver error outside a transaction.
fn err(operation: &'static str) -> impl Fn(mongodb::error::Error) -> Error {
    move |e| map_err(operation, Phase::Safe, &e)
}

/// A driver error of a write outside a transaction (a lost reply leaves it
/// unknown).
fn werr(operation: &'static str) -> impl Fn(mongodb::error::Error) -> Error {
    move |e| map_err(operation, Phase::Commit, &e)
}

type TxResult<T> = std::result::Result<T, TxFailure>;

/// A delivery's (partition, sequence).
fn position(d: &Document) -> (u32, u64) {
    (u32_of(d, "partition"), int_of(d, "sequence"))
}

/// An event document's key as a delivery keeps it (null: none).
fn key_of(event: &Document) -> Bson {
    event.get("key").filter(|k| matches!(k, Bson::String(_))).cloned().unwrap_or(Bson::Null)
}

/// A delivery's event id as the events are keyed.
fn event_key(d: &Document) -> String {
    id_text(d.get("event_id"))
}

/// An event id as text (an event's `_id`, a delivery's `event_id`).
fn id_text(id: Option<&Bson>) -> String {
    match id {
        Some(Bson::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => String::new(),
    }
}

/// The walk of the group core: in (partition, sequence) order until `limit`
/// claims; spent deliveries met on the way are dead-lettered (at most
/// limit + 64 a fetch; past that a partition stops). Returns (to claim, to
/// dead-letter).
fn walk_candidates(cands: Vec<Document>, limit: usize, max_attempts: u32) -> (Vec<Document>, Vec<Document>) {
    let (mut spent_left, mut claims, mut dead) = (limit + SPENT_PER_FETCH, Vec::new(), Vec::new());
    let mut stopped: Option<u32> = None;
    for d in cands {
        if claims.len() >= limit {
            break;
        }
        let p = u32_of(&d, "partition");
        if stopped == Some(p) {
            continue;
        }
        let holder = !matches!(d.get("lease_id"), None | Some(Bson::Null));
        if d.get_str("status") == Ok(LEASED) && holder && rules::spent(u32_of(&d, "attempt"), max_attempts) {
            if spent_left == 0 {
                stopped = Some(p);
                continue;
            }
            spent_left -= 1;
            dead.push(d);
        } else {
            claims.push(d);
        }
    }
    (claims, dead)
}

impl MongoBackend {
    pub(super) fn deliveries(&self) -> mongodb::Collection<Document> {
        self.collection(DELIVERIES)
    }

    /// Finds every document of `filter` (sorted, limited), optionally in a
    /// session.
    async fn find_all(
        &self,
        coll: &str,
        filter: Document,
        sort: Option<Document>,
        limit: Option<i64>,
        session: Option<&mut ClientSession>,
    ) -> std::result::Result<Vec<Document>, mongodb::error::Error> {
        let c = self.collection(coll);
        let mut find = c.find(filter);
        if let Some(s) = sort {
            find = find.sort(s);
        }
        if let Some(l) = limit {
            find = find.limit(l);
        }
        match session {
            Some(s) => {
                let mut cursor = find.session(&mut *s).await?;
                let mut out = Vec::new();
                while let Some(d) = cursor.next(&mut *s).await {
                    out.push(d?);
                }
                Ok(out)
            }
            None => find.await?.try_collect().await,
        }
    }

    /// The documents an aggregation of the deliveries gives.
    async fn aggregate_deliveries(&self, pipeline: Vec<Document>, op: &'static str) -> Result<Vec<Document>> {
        self.deliveries().aggregate(pipeline).await.map_err(err(op))?.try_collect().await.map_err(err(op))
    }

    async fn settings(&self, stream: &str, group: &str) -> Result<GroupSettings> {
        let found = self
            .collection(SETTINGS)
            .find_one(doc! { "stream": stream, "name": group })
            .await
            .map_err(err("load group"))?;
        match found.as_ref().and_then(|d| d.get_str("settings").ok()) {
            Some(text) => serde_json::from_str(text)
                .map_err(|e| Error::failed("reading a group", format!("group {stream:?}/{group:?}: settings: {e}"))),
            None => Ok(GroupSettings::default()),
        }
    }

    /// Takes the group's lock in a transaction (a write to its document,
    /// see the module docs); returns (frontiers, cursors).
    pub(super) async fn lock_group(
        &self,
        s: &mut ClientSession,
        stream: &str,
        group: &str,
        op: &'static str,
    ) -> TxResult<(BTreeMap<u32, u64>, BTreeMap<u32, u64>)> {
        let g = self
            .collection(GROUPS)
            .find_one_and_update(doc! { "stream": stream, "name": group }, doc! { "$inc": { VERSION: 1_i64 } })
            .return_document(ReturnDocument::After)
            .session(&mut *s)
            .await
            .map_err(txe(op))?
            .ok_or_else(|| Error::group_not_found(stream, group))?;
        Ok((get_map(&g, "frontiers"), get_map(&g, "cursors")))
    }

    pub(super) async fn write_maps(
        &self,
        s: &mut ClientSession,
        stream: &str,
        group: &str,
        frontiers: Option<&BTreeMap<u32, u64>>,
        cursors: Option<&BTreeMap<u32, u64>>,
        op: &'static str,
    ) -> TxResult<()> {
        let mut set = Document::new();
        if let Some(f) = frontiers {
            set.insert("frontiers", map_doc(f));
        }
        if let Some(c) = cursors {
            set.insert("cursors", map_doc(c));
        }
        if set.is_empty() {
            return Ok(());
        }
        self.collection(GROUPS)
            .update_one(doc! { "stream": stream, "name": group }, doc! { "$set": set })
            .session(&mut *s)
            .await
            .map_err(txe(op))?;
        Ok(())
    }

    /// Moves the frontier of `parts` as far as the settled deliveries allow
    /// (under the group lock the caller holds), and writes it when it
    /// moved. Per partition: the first unsettled delivery above F (one
    /// sorted `find`), and the first position at or after the cursor
    /// without a delivery (documents there exist only after a replay moved
    /// the cursor back, or a skip ahead of it).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn advance(
        &self,
        s: &mut ClientSession,
        stream: &str,
        group: &str,
        frontiers: &mut BTreeMap<u32, u64>,
        cursors: &BTreeMap<u32, u64>,
        parts: &BTreeSet<u32>,
        op: &'static str,
    ) -> TxResult<()> {
        let mut moved = false;
        for &p in parts {
            let (f, c) = fc(frontiers, cursors, p);
            let open = self
                .deliveries()
                .find_one(sg_and(
                    stream,
                    group,
                    doc! { "partition": i64::from(p), "sequence": { "$gt": int(f) }, "status": { "$nin": terminal() } },
                ))
                .sort(doc! { "partition": 1, "sequence": 1 })
                .projection(doc! { "sequence": 1 })
                .session(&mut *s)
                .await
                .map_err(txe(op))?;
            let mut gap = c;
            let mut after = self
                .deliveries()
                .find(sg_and(stream, group, doc! { "partition": i64::from(p), "sequence": { "$gte": int(c) } }))
                .sort(doc! { "partition": 1, "sequence": 1 })
                .projection(doc! { "sequence": 1 })
                .session(&mut *s)
                .await
                .map_err(txe(op))?;
            while let Some(d) = after.next(&mut *s).await {
                let q = int_of(&d.map_err(txe(op))?, "sequence");
                if q != gap {
                    break;
                }
                gap += 1;
            }
            let first = open.as_ref().and_then(|d| get_u64(d, "sequence")).unwrap_or(gap).min(gap);
            let new = f.max(first.saturating_sub(1));
            if new != f {
                frontiers.insert(p, new);
                moved = true;
            }
        }
        if moved {
            self.write_maps(s, stream, group, Some(frontiers), None, op).await?;
        }
        Ok(())
    }

    /// Gives the dead letters at `positions` their order, after every
    /// earlier one of the group, in the order given.
    async fn mark_dead(
        &self,
        s: &mut ClientSession,
        stream: &str,
        group: &str,
        positions: &[(u32, u64)],
        op: &'static str,
    ) -> TxResult<()> {
        if positions.is_empty() {
            return Ok(());
        }
        let n = i64::try_from(positions.len()).unwrap_or(i64::MAX);
        let g = self
            .collection(GROUPS)
            .find_one_and_update(doc! { "stream": stream, "name": group }, doc! { "$inc": { MARKS: n } })
            .return_document(ReturnDocument::After)
            .session(&mut *s)
            .await
            .map_err(txe(op))?
            .ok_or_else(|| Error::group_not_found(stream, group))?;
        let last = i64::try_from(int_of(&g, MARKS)).unwrap_or(i64::MAX);
        for (i, &(p, q)) in positions.iter().enumerate() {
            let mark = last - n + 1 + i64::try_from(i).unwrap_or(0);
            self.deliveries()
                .update_one(
                    sg_and(stream, group, doc! { "partition": i64::from(p), "sequence": int(q), "status": REJECTED }),
                    doc! { "$set": { MARK: mark } },
                )
                .session(&mut *s)
                .await
                .map_err(txe(op))?;
        }
        Ok(())
    }

    pub(super) async fn list_groups_impl(&self, stream: &str) -> Result<Vec<GroupSummary>> {
        self.partition_count(stream).await?;
        let groups =
            self.find_all(GROUPS, doc! { "stream": stream }, None, None, None).await.map_err(err("list_groups"))?;
        let settings =
            self.find_all(SETTINGS, doc! { "stream": stream }, None, None, None).await.map_err(err("list_groups"))?;
        let settings: HashMap<String, GroupSettings> = settings
            .iter()
            .filter_map(|d| {
                let text = d.get_str("settings").ok()?;
                Some((d.get_str("name").ok()?.to_owned(), serde_json::from_str(text).unwrap_or_default()))
            })
            .collect();
        let mut out: Vec<GroupSummary> = groups
            .iter()
            .filter_map(|g| {
                let name = g.get_str("name").ok()?.to_owned();
                Some(GroupSummary {
                    max_attempts: u32_of(g, "max_attempts"),
                    partitions: settings.get(&name).and_then(|s| s.partitions.clone()),
                    created_at: ts(g, "created_at").unwrap_or_default(),
                    ordered_by_key: settings.get(&name).is_some_and(|s| s.ordered_by_key),
                    name,
                })
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    // ---- fetch ----

    pub(super) async fn fetch_impl(&self, stream: &str, group: &str, opts: &FetchOptions) -> Result<FetchReport> {
        group_store::fetch_materialized(self, stream, group, opts).await
    }

    /// [`MaterializedFetch::materialize`] in a session; returns how many
    /// scheduled events it set aside (at most `budget`, shared by the
    /// partitions: past its share a partition's cursor stops before the
    /// next one, so the next fetch goes on from there).
    #[allow(clippy::too_many_arguments)]
    async fn materialize_in(
        &self,
        s: &mut ClientSession,
        stream: &str,
        group: &str,
        parts: &[u32],
        (chunk, budget): (u64, usize),
        only_near: bool,
        now: Timestamp,
    ) -> TxResult<u64> {
        const OP: &str = "fetch";
        let mut park_left = budget;
        let mut parked = 0u64;
        let (frontiers, mut cursors) = self.lock_group(s, stream, group, OP).await?;
        let sd = self
            .collection(STREAMS)
            .find_one(doc! { "name": stream })
            .session(&mut *s)
            .await
            .map_err(txe(OP))?
            .ok_or_else(|| Error::stream_not_found(stream))?;
        let hws = get_map(&sd, "next_sequences");
        let mut docs = Vec::new();
        for (i, &p) in parts.iter().enumerate() {
            let share = crate::groups::park_share(park_left, parts.len() - i);
            let mut parked_here = 0usize;
            let (f, c) = fc(&frontiers, &cursors, p);
            let hw = hws.get(&p).copied().unwrap_or(0);
            if c > hw {
                cursors.entry(p).or_insert_with(|| f.saturating_add(1));
                continue;
            }
            if only_near && c.saturating_sub(1).saturating_sub(f) >= chunk / 2 {
                continue;
            }
            let hi = hw.min(c.saturating_add(chunk - 1));
            let range = doc! { "partition": i64::from(p), "sequence": { "$gte": int(c), "$lte": int(hi) } };
            let mut have = BTreeSet::new();
            let mut cur = self
                .deliveries()
                .find(sg_and(stream, group, range.clone()))
                .projection(doc! { "sequence": 1 })
                .session(&mut *s)
                .await
                .map_err(txe(OP))?;
            while let Some(d) = cur.next(&mut *s).await {
                have.insert(int_of(&d.map_err(txe(OP))?, "sequence"));
            }
            let mut filter = doc! { "stream": stream };
            filter.extend(range);
            let mut events = self
                .collection(EVENTS)
                .find(filter)
                .projection(doc! { "_id": 1, "sequence": 1, "key": 1, METADATA_DELIVER_AT: 1 })
                .session(&mut *s)
                .await
                .map_err(txe(OP))?;
            let mut ids: BTreeMap<u64, (Bson, Option<Timestamp>, Bson)> = BTreeMap::new();
            while let Some(e) = events.next(&mut *s).await {
                let e = e.map_err(txe(OP))?;
                let id = e.get("_id").cloned().unwrap_or(Bson::Null);
                let key = key_of(&e);
                ids.insert(int_of(&e, "sequence"), (id, stored_deliver_at(&e), key));
            }
            // Only the unbroken run from the cursor: a sequence counted but
            // not stored yet (the reference allocates, then inserts, in two
            // writes) holds the cursor, so it is never taken for settled.
            // A gap that never fills holds the group there; `skip` moves it.
            // An event scheduled after now is set aside as it is passed: a
            // lease with no holder that expires at its time, attempt 0 (a
            // retry's backoff has the same shape, and every claim takes it
            // once its time has come).
            let mut next = c;
            while next <= hi {
                if !have.contains(&next) {
                    let Some((id, at, key)) = ids.remove(&next) else { break };
                    let later = at.filter(|&t| t > now);
                    if later.is_some() && parked_here >= share {
                        break;
                    }
                    let (status, expires) = match later {
                        Some(t) => {
                            parked_here += 1;
                            (LEASED, dt(t))
                        }
                        None => (AVAILABLE, Bson::Null),
                    };
                    docs.push(doc! {
                        "stream": stream,
                        "group": group,
                        "event_id": id,
                        "partition": i64::from(p),
                        "sequence": int(next),
                        "status": status,
                        "attempt": 0_i64,
                        "lease_id": Bson::Null,
                        "consumer_id": Bson::Null,
                        "expires_at": expires,
                        "created_at": dt(now),
                        // Its event's key, for per-key order (null: none).
                        "key": key,
                    });
                }
                next += 1;
            }
            park_left = park_left.saturating_sub(parked_here);
            parked += parked_here as u64;
            if next <= hi {
                tracing::debug!(
                    stream,
                    group,
                    partition = p,
                    sequence = next,
                    "no event stored at a counted sequence yet"
                );
            }
            cursors.insert(p, next);
        }
        if !docs.is_empty() {
            self.deliveries().insert_many(docs).session(&mut *s).await.map_err(txe(OP))?;
        }
        self.write_maps(s, stream, group, None, Some(&cursors), OP).await?;
        Ok(parked)
    }

    /// One round of `claim`; `raced` is true when others took candidates
    /// this round wanted (another round may find more).
    async fn claim_round(&self, spec: &ClaimSpec<'_>, limit: usize) -> Result<(Vec<Lease>, Vec<(u32, u64)>, bool)> {
        let (stream, group, consumer, lease_for) = (spec.stream, spec.group, spec.consumer, spec.lease);
        let now = self.now();
        let cands = self.claim_candidates(stream, group, spec.scope, limit, spec.ordered_by_key, now).await?;
        let (mut claims, dead) = walk_candidates(cands, limit, spec.max_attempts);
        // Their events, before anything changes.
        let events = self.events_of(stream, &claims).await?;
        claims.retain(|d| {
            let found = events.contains_key(&event_key(d));
            if !found {
                let (p, q) = position(d);
                tracing::warn!(stream, group, partition = p, sequence = q, "a delivery has no event document");
            }
            found
        });
        // A delivery made claimable again before its event's time (a
        // replay's) is set aside again instead of claimed.
        let (early, claims): (Vec<Document>, Vec<Document>) = claims
            .into_iter()
            .partition(|d| events.get(&event_key(d)).and_then(Event::deliver_at).is_some_and(|t| t > now));
        let set_aside = self.set_aside(&early, &events, now).await?;
        let dead_positions = self.dead_letter_spent(&dead, now).await?;
        if claims.is_empty() {
            return Ok((Vec::new(), dead_positions, set_aside > 0));
        }
        let expires = now.saturating_add(lease_for);
        let won = self.lease_candidates(&claims, consumer, now, expires).await?;
        // Lost candidates to others, or set some aside: another round may
        // find more.
        let raced = won.len() < claims.len() || set_aside > 0;
        let group_name: Arc<str> = Arc::from(group);
        let consumer: Arc<str> = Arc::from(consumer);
        let mut leases = Vec::with_capacity(won.len());
        for d in &won {
            let Some(event) = events.get(&event_key(d)) else { continue };
            leases.push(Lease {
                lease_id: d.get_str("lease_id").unwrap_or_default().parse()?,
                receipt: None,
                group: group_name.clone(),
                consumer_id: consumer.clone(),
                attempt: u32_of(d, "attempt"),
                expires_at: ts(d, "expires_at").unwrap_or(expires),
                event: event.clone(),
            });
        }
        Ok((leases, dead_positions, raced))
    }

    /// The claimable deliveries above each frontier in `scope`, at most
    /// `limit` + the spent allowance per partition, in (partition,
    /// sequence) order; for a keyed group, only those that may go now
    /// ([`MongoBackend::keyed_candidates`]).
    async fn claim_candidates(
        &self,
        stream: &str,
        group: &str,
        scope: &[u32],
        limit: usize,
        keyed: bool,
        now: Timestamp,
    ) -> Result<Vec<Document>> {
        const OP: &str = "fetch";
        let g = self
            .collection(GROUPS)
            .find_one(doc! { "stream": stream, "name": group })
            .projection(doc! { "frontiers": 1, "cursors": 1 })
            .await
            .map_err(err(OP))?
            .ok_or_else(|| Error::group_not_found(stream, group))?;
        let (frontiers, cursors) = (get_map(&g, "frontiers"), get_map(&g, "cursors"));
        let per = i64::try_from(limit + SPENT_PER_FETCH).unwrap_or(i64::MAX);
        let mut cands: Vec<Document> = Vec::new();
        for &p in scope {
            if keyed {
                let (f, c) = fc(&frontiers, &cursors, p);
                cands.extend(self.keyed_candidates((stream, group), p, (f, c), per, now).await?);
                continue;
            }
            let f = frontiers.get(&p).copied().unwrap_or(0);
            let mut filter = sg_and(stream, group, doc! { "partition": i64::from(p), "sequence": { "$gt": int(f) } });
            filter.extend(claimable(now));
            cands.extend(
                self.find_all(DELIVERIES, filter, Some(doc! { "partition": 1, "sequence": 1 }), Some(per), None)
                    .await
                    .map_err(err(OP))?,
            );
        }
        cands.sort_by_key(position);
        Ok(cands)
    }

    /// Per-key order: partition `p`'s claimable deliveries that may go now,
    /// at most `per`, in sequence order. Only below the cursor (`c`), where
    /// every unsettled position has its delivery (a replay that moved the
    /// cursor back reopens deliveries above it, which wait until the
    /// cursor passes them again, in order). Read in pages: the keys met in
    /// a page (gone or held) are left out of the next, so a key with a
    /// long backlog costs one page, not every candidate.
    async fn keyed_candidates(
        &self,
        (stream, group): (&str, &str),
        p: u32,
        (f, c): (u64, u64),
        per: i64,
        now: Timestamp,
    ) -> Result<Vec<Document>> {
        const OP: &str = "fetch";
        let want = usize::try_from(per).unwrap_or(usize::MAX);
        let (mut out, mut seen, mut after) = (Vec::new(), BTreeSet::<String>::new(), f);
        for _ in 0..KEYED_PAGES {
            let mut filter = sg_and(
                stream,
                group,
                doc! { "partition": i64::from(p), "sequence": { "$gt": int(after), "$lt": int(c) } },
            );
            filter.extend(claimable(now));
            if !seen.is_empty() {
                filter.insert("key", doc! { "$nin": seen.iter().map(String::as_str).collect::<Vec<_>>() });
            }
            let page = self
                .find_all(DELIVERIES, filter, Some(doc! { "sequence": 1 }), Some(per), None)
                .await
                .map_err(err(OP))?;
            let Some(last) = page.last().map(|d| position(d).1) else { break };
            let full = page.len() >= want;
            let heads = self.key_heads((stream, group), p, &page, now).await?;
            for d in page {
                let Ok(key) = d.get_str("key") else {
                    out.push(d);
                    continue;
                };
                let go = heads.get(key).is_some_and(|&(head, free)| free && head == position(&d).1);
                seen.insert(key.to_owned());
                if go {
                    out.push(d);
                }
            }
            if !full || out.len() >= want {
                break;
            }
            after = last;
        }
        out.truncate(want);
        Ok(out)
    }

    /// Per-key order: for each key of `page` (deliveries of partition
    /// `p`), its first unsettled sequence and whether no delivery of the key
    /// holds a live lease. A keyed candidate goes only when it is its key's
    /// first and the key is free. Read (one aggregation) after the
    /// candidates, so a delivery of the key claimed or made to wait in
    /// between is seen (a settle in between only frees the key); and each
    /// claim is still fenced on its candidate being claimable.
    async fn key_heads(
        &self,
        (stream, group): (&str, &str),
        p: u32,
        page: &[Document],
        now: Timestamp,
    ) -> Result<HashMap<String, (u64, bool)>> {
        let keys: BTreeSet<&str> = page.iter().filter_map(|d| d.get_str("key").ok()).collect();
        if keys.is_empty() {
            return Ok(HashMap::new());
        }
        let live = doc! { "$and": [
            { "$ne": [{ "$ifNull": ["$lease_id", Bson::Null] }, Bson::Null] },
            { "$gt": ["$expires_at", dt(now)] },
        ] };
        let filter = sg_and(
            stream,
            group,
            doc! {
                "partition": i64::from(p),
                "key": { "$in": keys.into_iter().collect::<Vec<_>>() },
                "status": { "$in": [AVAILABLE, LEASED] },
            },
        );
        let pipeline = vec![
            doc! { "$match": filter },
            doc! { "$group": {
                "_id": "$key",
                "head": { "$min": "$sequence" },
                "live": { "$sum": { "$cond": [live, 1, 0] } },
            } },
        ];
        let rows = self.aggregate_deliveries(pipeline, "fetch").await?;
        Ok(rows
            .iter()
            .filter_map(|r| {
                let key = r.get_str("_id").ok()?.to_owned();
                Some((key, (get_u64(r, "head")?, get_u64(r, "live") == Some(0))))
            })
            .collect())
    }

    /// The events of `deliveries`, by event id.
    async fn events_of(&self, stream: &str, deliveries: &[Document]) -> Result<HashMap<String, Event>> {
        let ids: Vec<Bson> = deliveries.iter().filter_map(|d| d.get("event_id").cloned()).collect();
        let mut events: HashMap<String, Event> = HashMap::new();
        if !ids.is_empty() {
            let name: Arc<str> = Arc::from(stream);
            let found = self.find_all(EVENTS, doc! { "_id": { "$in": ids } }, None, None, None).await;
            for e in found.map_err(err("fetch"))? {
                let e = decode_event(&name, e)?;
                events.insert(e.id().to_owned(), e);
            }
        }
        Ok(events)
    }

    /// Sets aside the claimable deliveries `early` until their events'
    /// times (those still claimable: another fetch may have met them
    /// first), in one update; how many it set aside.
    async fn set_aside(&self, early: &[Document], events: &HashMap<String, Event>, now: Timestamp) -> Result<u64> {
        if early.is_empty() {
            return Ok(0);
        }
        let ids: Vec<Bson> = early.iter().filter_map(|d| d.get("_id").cloned()).collect();
        let times: Vec<Bson> = early
            .iter()
            .map(|d| events.get(&event_key(d)).and_then(Event::deliver_at).map_or(Bson::Null, dt))
            .collect();
        let mut filter = doc! { "_id": { "$in": ids.clone() } };
        filter.extend(claimable(now));
        let update = vec![doc! { "$set": {
            "status": LEASED,
            "lease_id": Bson::Null,
            "consumer_id": Bson::Null,
            "expires_at": { "$arrayElemAt": [times, { "$indexOfArray": [ids, "$_id"] }] },
        } }];
        let r = self.deliveries().update_many(filter, update).await.map_err(werr("fetch"))?;
        Ok(r.modified_count)
    }

    /// Dead-letters the spent deliveries a walk met (those still claimable:
    /// another fetch may have met them first); their positions.
    async fn dead_letter_spent(&self, dead: &[Document], now: Timestamp) -> Result<Vec<(u32, u64)>> {
        if dead.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<Bson> = dead.iter().filter_map(|d| d.get("_id").cloned()).collect();
        let mut filter = doc! { "_id": { "$in": ids }, "status": LEASED, "lease_id": { "$ne": Bson::Null } };
        filter.extend(claimable(now));
        self.deliveries()
            .update_many(
                filter,
                doc! { "$set": {
                    "status": REJECTED, "lease_id": Bson::Null, "expires_at": Bson::Null,
                    "reason": rules::EXPIRED_ON_LAST_ATTEMPT, "dead_lettered_at": dt(now),
                } },
            )
            .await
            .map_err(werr("fetch"))?;
        Ok(dead.iter().map(position).collect())
    }

    /// Leases the candidates still claimable, each under a lease id of its
    /// own, in one update; returns those this call won (others may have
    /// taken some meanwhile).
    async fn lease_candidates(
        &self,
        claims: &[Document],
        consumer: &str,
        now: Timestamp,
        expires: Timestamp,
    ) -> Result<Vec<Document>> {
        const OP: &str = "fetch";
        let ids: Vec<Bson> = claims.iter().filter_map(|d| d.get("_id").cloned()).collect();
        let lease_ids: Vec<String> =
            (0..claims.len()).map(|_| LeaseId::from_u128(crate::ids::new_lease_id()).to_string()).collect();
        let mut filter = doc! { "_id": { "$in": ids.clone() } };
        filter.extend(claimable(now));
        let update = vec![doc! { "$set": {
            "status": LEASED,
            "lease_id": { "$arrayElemAt": [lease_ids.clone(), { "$indexOfArray": [ids.clone(), "$_id"] }] },
            // A literal: in an aggregation update a `$`-string is a field path.
            "consumer_id": { "$literal": consumer },
            "leased_at": dt(now),
            "expires_at": dt(expires),
            "attempt": { "$add": [{ "$ifNull": ["$attempt", 0] }, 1] },
        } }];
        self.deliveries().update_many(filter, update).await.map_err(werr(OP))?;
        // Which this call won: those of the candidates (by primary key) that
        // now hold one of its lease ids.
        let mine: std::collections::HashSet<&str> = lease_ids.iter().map(String::as_str).collect();
        Ok(self
            .find_all(DELIVERIES, doc! { "_id": { "$in": ids } }, None, None, None)
            .await
            .map_err(werr(OP))?
            .into_iter()
            .filter(|d| d.get_str("status") == Ok(LEASED) && d.get_str("lease_id").is_ok_and(|l| mine.contains(l)))
            .collect())
    }

    // ---- settles ----

    /// The deliveries `leases` still hold (fenced by lease id, position and
    /// status), read in the session: position -> `_id`.
    async fn held(
        &self,
        s: &mut ClientSession,
        stream: &str,
        group: &str,
        leases: &[&LeaseRef],
        op: &'static str,
    ) -> TxResult<BTreeMap<(u32, u64), Bson>> {
        let ids: Vec<String> = leases.iter().map(|l| l.lease_id.to_string()).collect();
        let want: HashMap<String, (u32, u64)> =
            leases.iter().map(|l| (l.lease_id.to_string(), (l.partition, l.sequence))).collect();
        let docs = self
            .find_all(
                DELIVERIES,
                sg_and(stream, group, doc! { "status": LEASED, "lease_id": { "$in": ids } }),
                None,
                None,
                Some(s),
            )
            .await
            .map_err(txe(op))?;
        let mut out = BTreeMap::new();
        for d in docs {
            let pos = (u32_of(&d, "partition"), int_of(&d, "sequence"));
            let lid = d.get_str("lease_id").unwrap_or_default();
            if want.get(lid) == Some(&pos) {
                out.insert(pos, d.get("_id").cloned().unwrap_or(Bson::Null));
            }
        }
        Ok(out)
    }

    /// Updates the held deliveries `ids` (still leased): all of them, or
    /// the transaction runs again (a concurrent claim changed one).
    async fn update_held(
        &self,
        s: &mut ClientSession,
        ids: Vec<Bson>,
        update: Document,
        op: &'static str,
    ) -> TxResult<()> {
        let n = ids.len() as u64;
        let r = self
            .deliveries()
            .update_many(doc! { "_id": { "$in": ids }, "status": LEASED }, update)
            .session(&mut *s)
            .await
            .map_err(txe(op))?;
        if r.matched_count != n {
            return Err(TxFailure::Raced("a lease changed while it was settled"));
        }
        Ok(())
    }

    /// Per-key order: leaves out of `held` the expired leases whose key
    /// went to another delivery meanwhile (an earlier event a replay
    /// reopened, claimed once they expired): renewing one would put two of
    /// the key in flight, so it is answered `StaleLease`.
    async fn drop_moved_keys(
        &self,
        s: &mut ClientSession,
        (stream, group): (&str, &str),
        held: &mut BTreeMap<(u32, u64), Bson>,
        now: Timestamp,
    ) -> TxResult<()> {
        const OP: &str = "renew";
        if held.is_empty() {
            return Ok(());
        }
        let ids: Vec<Bson> = held.values().cloned().collect();
        let filter = doc! { "_id": { "$in": ids }, "expires_at": { "$lte": dt(now) }, "key": { "$type": "string" } };
        let expired = self.find_all(DELIVERIES, filter, None, None, Some(&mut *s)).await.map_err(txe(OP))?;
        if expired.is_empty() || !self.settings(stream, group).await?.ordered_by_key {
            return Ok(());
        }
        for d in expired {
            let (p, q) = position(&d);
            let Ok(key) = d.get_str("key") else { continue };
            let live = doc! {
                "partition": i64::from(p), "key": key, "sequence": { "$ne": int(q) }, "status": LEASED,
                "lease_id": { "$ne": Bson::Null }, "expires_at": { "$gt": dt(now) },
            };
            let other =
                self.deliveries().find_one(sg_and(stream, group, live)).session(&mut *s).await.map_err(txe(OP))?;
            if other.is_some() {
                held.remove(&(p, q));
            }
        }
        Ok(())
    }

    pub(super) async fn renew_many_impl(&self, leases: &[LeaseRef], d: Duration) -> Result<Vec<Result<Timestamp>>> {
        group_store::per_group(self, leases, |stream, group, idx| async move {
            let batch: Vec<&LeaseRef> = idx.iter().map(|&i| &leases[i]).collect();
            let now = self.now();
            let exp = now.saturating_add(d);
            let held = in_tx!(self, "renew", |s| {
                let mut held = self.held(s, &stream, &group, &batch, "renew").await?;
                self.drop_moved_keys(s, (&stream, &group), &mut held, now).await?;
                if !held.is_empty() {
                    let set = doc! { "$set": { "expires_at": dt(exp), "renewed_at": dt(now) } };
                    self.update_held(s, held.values().cloned().collect(), set, "renew").await?;
                }
                Ok(held)
            })?;
            Ok(held.into_keys().map(|k| (k, exp)).collect())
        })
        .await
    }

    pub(super) async fn ack_many_impl(&self, leases: &[LeaseRef]) -> Result<Vec<Result<()>>> {
        const OP: &str = "ack";
        group_store::per_group(self, leases, |stream, group, idx| async move {
            let batch: Vec<&LeaseRef> = idx.iter().map(|&i| &leases[i]).collect();
            let now = self.now();
            let held = in_group_tx!(self, &stream, &group, OP, |s| {
                let (mut frontiers, cursors) = self.lock_group(s, &stream, &group, OP).await?;
                let held = self.held(s, &stream, &group, &batch, OP).await?;
                if !held.is_empty() {
                    let ids = held.values().cloned().collect();
                    let set = doc! { "$set": {
                        "status": ACKED, "acked_at": dt(now), "lease_id": Bson::Null, "expires_at": Bson::Null,
                    } };
                    self.update_held(s, ids, set, OP).await?;
                    let parts: BTreeSet<u32> = held.keys().map(|k| k.0).collect();
                    self.advance(s, &stream, &group, &mut frontiers, &cursors, &parts, OP).await?;
                }
                Ok(held)
            })?;
            Ok(held.into_keys().map(|k| (k, ())).collect())
        })
        .await
    }

    /// Dead-letters the delivery a lease holds, with `reason`; false when
    /// the lease is stale.
    async fn dead_letter_held(&self, lease: &LeaseRef, reason: &str, now: Timestamp, op: &'static str) -> Result<bool> {
        let (stream, group) = (&*lease.stream, &*lease.group);
        in_group_tx!(self, stream, group, op, |s| {
            let (mut frontiers, cursors) = self.lock_group(s, stream, group, op).await?;
            let held = self.held(s, stream, group, &[lease], op).await?;
            if held.is_empty() {
                return Ok(false);
            }
            let set = doc! { "$set": {
                "status": REJECTED, "dead_lettered_at": dt(now), "reason": reason,
                "lease_id": Bson::Null, "expires_at": Bson::Null,
            } };
            self.update_held(s, held.values().cloned().collect(), set, op).await?;
            self.mark_dead(s, stream, group, &[(lease.partition, lease.sequence)], op).await?;
            let parts = BTreeSet::from([lease.partition]);
            self.advance(s, stream, group, &mut frontiers, &cursors, &parts, op).await?;
            Ok(true)
        })
    }

    // ---- replay and reset ----

    /// What a replay sets on a delivery it reopens.
    fn reopened(now: Timestamp) -> Document {
        doc! {
            "$set": {
                "status": AVAILABLE, "attempt": 0_i64, "lease_id": Bson::Null, "consumer_id": Bson::Null,
                "expires_at": Bson::Null, "reason": "replay", "retried_at": dt(now),
            },
            "$unset": { MARK: "" },
        }
    }

    // ---- inspecting ----
}

/// The `$or` of "after this dead letter" in the order (mark, time,
/// partition, sequence), where a missing mark or time comes first.
fn after_key(a: &Document) -> Vec<Document> {
    let value = |f: &str| a.get(f).cloned().filter(|v| !matches!(v, Bson::Null));
    let keys = [MARK, "dead_lettered_at", "partition", "sequence"];
    let mut out = Vec::new();
    let mut equal = Document::new();
    for k in keys {
        let mut gt = equal.clone();
        match value(k) {
            // Every present value sorts after a missing one.
            None => {
                gt.insert(k, doc! { "$ne": Bson::Null });
                equal.insert(k, Bson::Null);
            }
            Some(v) => {
                gt.insert(k, doc! { "$gt": v.clone() });
                equal.insert(k, v);
            }
        }
        out.push(gt);
    }
    out
}

impl GroupStore for MongoBackend {
    async fn stream_marks(&self, stream: &str) -> Result<(u32, Vec<u64>)> {
        let count = self.partition_count(stream).await?;
        let s = self
            .collection(STREAMS)
            .find_one(doc! { "name": stream })
            .await
            .map_err(err("read"))?
            .ok_or_else(|| Error::stream_not_found(stream))?;
        let m = get_map(&s, "next_sequences");
        Ok((count, (0..count).map(|p| m.get(&p).copied().unwrap_or(0)).collect()))
    }

    async fn load_group(&self, stream: &str, group: &str) -> Result<GroupRow> {
        let s = self
            .collection(STREAMS)
            .find_one(doc! { "name": stream })
            .await
            .map_err(err("load group"))?
            .ok_or_else(|| Error::stream_not_found(stream))?;
        let g = self
            .collection(GROUPS)
            .find_one(doc! { "stream": stream, "name": group })
            .await
            .map_err(err("load group"))?
            .ok_or_else(|| Error::group_not_found(stream, group))?;
        let settings = self.settings(stream, group).await?;
        let count = get_u64(&s, "partition_count").and_then(|n| u32::try_from(n).ok()).unwrap_or(1);
        let hws = get_map(&s, "next_sequences");
        Ok(GroupRow {
            count,
            max_attempts: u32_of(&g, "max_attempts"),
            settings,
            cursors: get_map(&g, "cursors"),
            frontiers: get_map(&g, "frontiers"),
            created_at: ts(&g, "created_at").unwrap_or_default(),
            hws: (0..count).map(|p| hws.get(&p).copied().unwrap_or(0)).collect(),
        })
    }

    async fn log_starts(&self, stream: &str, hws: &[u64]) -> Result<Vec<u64>> {
        MongoBackend::log_starts(self, stream, hws).await
    }

    async fn first_at_or_after(&self, stream: &str, _count: u32, t: Timestamp) -> Result<BTreeMap<u32, u64>> {
        let pipeline = vec![
            doc! { "$match": { "stream": stream, "timestamp": { "$gte": dt(t) } } },
            doc! { "$group": { "_id": "$partition", "first": { "$min": "$sequence" } } },
        ];
        let rows: Vec<Document> = self
            .collection(EVENTS)
            .aggregate(pipeline)
            .await
            .map_err(err("start_at"))?
            .try_collect()
            .await
            .map_err(err("start_at"))?;
        Ok(rows.iter().filter_map(|r| Some((u32::try_from(get_u64(r, "_id")?).ok()?, get_u64(r, "first")?))).collect())
    }

    async fn insert_group(&self, stream: &str, group: &str, new: &NewGroup<'_>) -> Result<Timestamp> {
        let NewGroup { max_attempts, frontiers, settings } = *new;
        let cursors: BTreeMap<u32, u64> = frontiers.iter().map(|(&p, &f)| (p, f.saturating_add(1))).collect();
        let text = serde_json::to_string(settings).map_err(|e| Error::failed("create_group", e.to_string()))?;
        let now = self.now();
        let group_doc = doc! {
            "stream": stream,
            "name": group,
            "cursors": map_doc(&cursors),
            "frontiers": map_doc(frontiers),
            "max_attempts": i64::from(max_attempts),
            "created_at": dt(now),
        };
        in_tx!(self, "create_group", |s| {
            match self.collection(GROUPS).insert_one(group_doc.clone()).session(&mut *s).await {
                Ok(_) => {}
                Err(e) if super::is_duplicate(&e) => {
                    return Err::<(), _>(
                        Error::AlreadyExists { kind: ObjectKind::Group, name: format!("{stream}/{group}") }.into(),
                    );
                }
                Err(e) => return Err(txe("create_group")(e)),
            }
            self.collection(SETTINGS)
                .update_one(doc! { "stream": stream, "name": group }, doc! { "$set": { "settings": &text } })
                .upsert(true)
                .session(&mut *s)
                .await
                .map_err(txe("create_group"))?;
            // Deliveries of an earlier group of that name (deleted by hand)
            // would be taken for this one's.
            self.deliveries().delete_many(sg(stream, group)).session(&mut *s).await.map_err(txe("create_group"))?;
            Ok(())
        })?;
        Ok(now)
    }

    async fn skip_position(&self, stream: &str, group: &str, at: (u32, u64), reason: &str) -> Result<bool> {
        let (partition, sequence) = at;
        const OP: &str = "skip";
        let now = self.now();
        in_group_tx!(self, stream, group, OP, |s| {
            let (mut frontiers, cursors) = self.lock_group(s, stream, group, OP).await?;
            let (f, c) = fc(&frontiers, &cursors, partition);
            let e = self
                .collection(EVENTS)
                .find_one(doc! { "stream": stream, "partition": i64::from(partition), "sequence": int(sequence) })
                .projection(doc! { "_id": 1, "key": 1 })
                .session(&mut *s)
                .await
                .map_err(txe(OP))?;
            let key = e.as_ref().map_or(Bson::Null, key_of);
            // A sequence counted but never stored (the reference's appends
            // can leave one) is skipped under a placeholder event id.
            let event_id = match e {
                Some(e) => e.get("_id").cloned().unwrap_or(Bson::Null),
                None => Bson::String(format!("rheo-rs-gap:{partition}:{sequence}")),
            };
            let d = self
                .deliveries()
                .find_one(sg_and(stream, group, doc! { "event_id": event_id.clone() }))
                .session(&mut *s)
                .await
                .map_err(txe(OP))?;
            let status = d.as_ref().and_then(|d| d.get_str("status").ok().map(str::to_owned));
            if status.as_deref() == Some(REJECTED) {
                return Ok(false);
            }
            if sequence <= f || status.as_deref() == Some(ACKED) || (status.is_none() && sequence < c) {
                return Err(common::already_settled(group, partition, sequence).into());
            }
            let set = doc! {
                "status": REJECTED, "lease_id": Bson::Null, "expires_at": Bson::Null, "reason": reason,
                "dead_lettered_at": dt(now),
            };
            match d {
                Some(d) => {
                    self.deliveries()
                        .update_one(doc! { "_id": d.get("_id").cloned().unwrap_or(Bson::Null) }, doc! { "$set": set })
                        .session(&mut *s)
                        .await
                        .map_err(txe(OP))?;
                }
                None => {
                    let mut new = doc! {
                        "stream": stream, "group": group, "event_id": event_id, "partition": i64::from(partition),
                        "sequence": int(sequence), "attempt": 0_i64, "consumer_id": Bson::Null, "created_at": dt(now),
                        "key": key,
                    };
                    new.extend(set);
                    self.deliveries().insert_one(new).session(&mut *s).await.map_err(txe(OP))?;
                }
            }
            self.mark_dead(s, stream, group, &[(partition, sequence)], OP).await?;
            self.advance(s, stream, group, &mut frontiers, &cursors, &BTreeSet::from([partition]), OP).await?;
            Ok(true)
        })
    }

    async fn reopen_after(&self, stream: &str, group: &str, starts: &[(u32, u64)], hws: &[u64]) -> Result<u64> {
        let now = self.now();
        const OP: &str = "replay";
        // The high watermarks were read before: events appended since are
        // above them, never settled, so nothing they change is counted.
        in_group_tx!(self, stream, group, OP, |s| {
            let (mut frontiers, mut cursors) = self.lock_group(s, stream, group, OP).await?;
            let mut reopened = 0u64;
            for &(p, from) in starts {
                let (f, c) = fc(&frontiers, &cursors, p);
                let hw = hws.get(p as usize).copied().unwrap_or(0);
                let upper = hw.min(c.saturating_sub(1));
                let part = i64::from(p);
                let open_below = self
                    .deliveries()
                    .count_documents(sg_and(
                        stream,
                        group,
                        doc! { "partition": part, "sequence": { "$gt": int(from), "$lt": int(c), "$lte": int(hw) },
                        "status": { "$nin": terminal() } },
                    ))
                    .session(&mut *s)
                    .await
                    .map_err(txe(OP))?;
                let settled_above = self
                    .deliveries()
                    .count_documents(sg_and(
                        stream,
                        group,
                        doc! { "partition": part, "sequence": { "$gt": int(from), "$gte": int(c), "$lte": int(hw) },
                        "status": { "$in": terminal() } },
                    ))
                    .session(&mut *s)
                    .await
                    .map_err(txe(OP))?;
                reopened += upper.saturating_sub(from).saturating_sub(open_below) + settled_above;
                self.deliveries()
                    .update_many(
                        sg_and(
                            stream,
                            group,
                            doc! { "partition": part, "sequence": { "$gt": int(from) }, "status": { "$in": terminal() } },
                        ),
                        Self::reopened(now),
                    )
                    .session(&mut *s)
                    .await
                    .map_err(txe(OP))?;
                frontiers.insert(p, f.min(from));
                cursors.insert(p, c.min(from.saturating_add(1)));
            }
            self.write_maps(s, stream, group, Some(&frontiers), Some(&cursors), OP).await?;
            Ok(reopened)
        })
    }

    async fn reopen_matches(&self, stream: &str, group: &str, matched: &[(u32, u64, String)]) -> Result<u64> {
        let now = self.now();
        const OP: &str = "replay";
        in_group_tx!(self, stream, group, OP, |s| {
            let (mut frontiers, cursors) = self.lock_group(s, stream, group, OP).await?;
            let mut reopened = 0u64;
            for chunk in matched.chunks(1000) {
                let ids: Vec<&str> = chunk.iter().map(|m| m.2.as_str()).collect();
                let found = self
                    .find_all(
                        DELIVERIES,
                        sg_and(stream, group, doc! { "event_id": { "$in": ids } }),
                        None,
                        None,
                        Some(s),
                    )
                    .await
                    .map_err(txe(OP))?;
                let by_event: HashMap<String, &Document> =
                    found.iter().filter_map(|d| Some((d.get_str("event_id").ok()?.to_owned(), d))).collect();
                let (mut update, mut insert) = (Vec::new(), Vec::new());
                for (p, q, id) in chunk {
                    let d = by_event.get(id);
                    let status = d.and_then(|d| d.get_str("status").ok());
                    let (f, c) = fc(&frontiers, &cursors, *p);
                    let settled = *q <= f || matches!(status, Some(ACKED | REJECTED)) || (status.is_none() && *q < c);
                    if !settled {
                        continue;
                    }
                    frontiers.insert(*p, f.min(q.saturating_sub(1)));
                    reopened += 1;
                    match d {
                        Some(d) => update.push(d.get("_id").cloned().unwrap_or(Bson::Null)),
                        None => insert.push(doc! {
                            "stream": stream, "group": group, "event_id": id, "partition": i64::from(*p),
                            "sequence": int(*q), "status": AVAILABLE, "attempt": 0_i64, "lease_id": Bson::Null,
                            "consumer_id": Bson::Null, "expires_at": Bson::Null, "reason": "replay",
                            "retried_at": dt(now), "created_at": dt(now),
                        }),
                    }
                }
                if !update.is_empty() {
                    self.deliveries()
                        .update_many(doc! { "_id": { "$in": update } }, Self::reopened(now))
                        .session(&mut *s)
                        .await
                        .map_err(txe(OP))?;
                }
                if !insert.is_empty() {
                    // Their events' keys, for per-key order.
                    let ids: Vec<Bson> = insert.iter().filter_map(|d| d.get("event_id").cloned()).collect();
                    let mut keys: HashMap<String, Bson> = HashMap::new();
                    let mut events = self
                        .collection(EVENTS)
                        .find(doc! { "_id": { "$in": ids } })
                        .projection(doc! { "_id": 1, "key": 1 })
                        .session(&mut *s)
                        .await
                        .map_err(txe(OP))?;
                    while let Some(e) = events.next(&mut *s).await {
                        let e = e.map_err(txe(OP))?;
                        keys.insert(id_text(e.get("_id")), key_of(&e));
                    }
                    for d in &mut insert {
                        let key = keys.get(&event_key(d)).cloned().unwrap_or(Bson::Null);
                        d.insert("key", key);
                    }
                    self.deliveries().insert_many(insert).session(&mut *s).await.map_err(txe(OP))?;
                }
            }
            self.write_maps(s, stream, group, Some(&frontiers), None, OP).await?;
            Ok(reopened)
        })
    }

    async fn restart(&self, stream: &str, group: &str, starts: &BTreeMap<u32, u64>) -> Result<()> {
        const OP: &str = "reset_group";
        let parts: Vec<i64> = starts.keys().map(|&p| i64::from(p)).collect();
        in_group_tx!(self, stream, group, OP, |s| {
            let (mut frontiers, mut cursors) = self.lock_group(s, stream, group, OP).await?;
            self.deliveries()
                .delete_many(sg_and(stream, group, doc! { "partition": { "$in": parts.clone() } }))
                .session(&mut *s)
                .await
                .map_err(txe(OP))?;
            for (&p, &f) in starts {
                frontiers.insert(p, f);
                cursors.insert(p, f.saturating_add(1));
            }
            self.write_maps(s, stream, group, Some(&frontiers), Some(&cursors), OP).await
        })
    }

    async fn delivery_counts(&self, stream: &str, group: &str, _scope: &[u32]) -> Result<DeliveryCounts> {
        let now = dt(self.now());
        let sum = |cond: Document| doc! { "$sum": { "$cond": [cond, 1, 0] } };
        let holder = doc! { "$ne": [{ "$ifNull": ["$lease_id", Bson::Null] }, Bson::Null] };
        let waiting = doc! { "$and": [
            { "$eq": ["$status", LEASED] },
            { "$eq": [{ "$ifNull": ["$lease_id", Bson::Null] }, Bson::Null] },
            { "$gt": ["$expires_at", now] },
        ] };
        let pipeline = vec![
            doc! { "$match": sg_and(stream, group, doc! { "status": { "$in": [LEASED, REJECTED] } }) },
            doc! { "$group": {
                "_id": Bson::Null,
                "inflight": sum(doc! { "$and": [{ "$eq": ["$status", LEASED] }, holder.clone()] }),
                // Waiting with attempt 0: a scheduled event set aside; with
                // more, a retry's backoff.
                "waiting": sum(doc! { "$and": [waiting.clone(), { "$gt": ["$attempt", 0] }] }),
                "scheduled": sum(doc! { "$and": [waiting.clone(), { "$lte": ["$attempt", 0] }] }),
                "next_due": { "$min": { "$cond": [
                    { "$and": [waiting, { "$lte": ["$attempt", 0] }] }, "$expires_at", Bson::Null,
                ] } },
                "dead": sum(doc! { "$eq": ["$status", REJECTED] }),
            } },
        ];
        let rows = self.aggregate_deliveries(pipeline, "group_info").await?;
        let r = rows.first();
        let n = |f: &str| r.and_then(|r| get_u64(r, f)).unwrap_or(0);
        Ok(DeliveryCounts {
            inflight: n("inflight"),
            retry_waiting: n("waiting"),
            dead_letters: n("dead"),
            scheduled: n("scheduled"),
            next_due: r.and_then(|r| ts(r, "next_due")),
        })
    }

    async fn held_attempt(&self, lease: &LeaseRef) -> Result<Option<Held>> {
        let d = self.deliveries().find_one(held(lease)).await.map_err(err("retry"))?;
        Ok(d.map(|d| Held { attempt: u32_of(&d, "attempt"), now: self.now() }))
    }

    async fn dead_letter(&self, lease: &LeaseRef, held: Held, reason: &str) -> Result<bool> {
        let now = held.now;
        self.dead_letter_held(lease, reason, now, "retry").await
    }

    async fn reschedule(&self, lease: &LeaseRef, at: Held, reason: &str, available_at: Timestamp) -> Result<bool> {
        let Held { attempt, now } = at;
        // Claimable at once: the reference's 'available'. Later: a lease
        // with no holder that expires when the backoff ends, which both
        // implementations' claims take once it passes.
        let (status, exp) = if available_at > now { (LEASED, dt(available_at)) } else { (AVAILABLE, Bson::Null) };
        let mut filter = held(lease);
        filter.insert("attempt", i64::from(attempt));
        let r = self
            .deliveries()
            .update_one(
                filter,
                doc! { "$set": {
                    "status": status, "lease_id": Bson::Null, "consumer_id": Bson::Null, "expires_at": exp,
                    "reason": reason, "retried_at": dt(now),
                } },
            )
            .await
            .map_err(werr("retry"))?;
        Ok(r.matched_count > 0)
    }
}

/// The filter of the delivery a lease holds.
fn held(lease: &LeaseRef) -> Document {
    sg_and(
        &lease.stream,
        &lease.group,
        doc! {
            "partition": i64::from(lease.partition),
            "sequence": int(lease.sequence),
            "lease_id": lease.lease_id.to_string(),
            "status": LEASED,
        },
    )
}

/// Claims: candidates are read per partition above the frontier, in
/// sequence order; their events are read before anything is claimed; then
/// one `update_many` (an aggregation update giving each delivery its own
/// lease id) claims those still claimable, and a `find` by lease id says
/// which this call won. Rounds that lost candidates to others go again.
impl MaterializedFetch for MongoBackend {
    const MATERIALIZE_MIN: u64 = 256;

    async fn materialize(
        &self,
        stream: &str,
        group: &str,
        parts: &[u32],
        chunk: u64,
        budget: usize,
        only_near: bool,
    ) -> Result<u64> {
        let now = self.now();
        in_group_tx!(self, stream, group, "fetch", |s| self
            .materialize_in(s, stream, group, parts, (chunk, budget), only_near, now)
            .await)
    }

    async fn claim(&self, spec: &ClaimSpec<'_>, limit: usize) -> Result<Taken> {
        let mut leases = Vec::new();
        let mut spent = Vec::new();
        for round in 0..CLAIM_ROUNDS {
            let (won, dead, raced) = self.claim_round(spec, limit - leases.len()).await?;
            leases.extend(won);
            spent.extend(dead);
            if !raced || leases.len() >= limit {
                break;
            }
            tokio::time::sleep(super::backoff(round + 1)).await;
        }
        Ok((leases, spent))
    }

    async fn settled(&self, stream: &str, group: &str, dead: &[(u32, u64)]) -> Result<()> {
        const OP: &str = "fetch";
        in_group_tx!(self, stream, group, OP, |s| {
            let (mut frontiers, cursors) = self.lock_group(s, stream, group, OP).await?;
            self.mark_dead(s, stream, group, dead, OP).await?;
            let parts: BTreeSet<u32> = dead.iter().map(|d| d.0).collect();
            self.advance(s, stream, group, &mut frontiers, &cursors, &parts, OP).await
        })
    }
}

/// Dead letters are ordered by their mark (those the reference wrote have
/// none and come first), then time, partition and sequence.
impl SettleStore for MongoBackend {
    /// The dead letter's delivery document.
    type DeadLetterKey = Document;

    async fn dead_letter_key(&self, stream: &str, group: &str, at: DeadLetterAt<'_>) -> Result<Option<Document>> {
        let cond = match at {
            DeadLetterAt::Position(p, q) => doc! { "partition": i64::from(p), "sequence": int(q) },
            DeadLetterAt::Event(id) => doc! { "event_id": id },
        };
        let mut filter = sg_and(stream, group, doc! { "status": REJECTED });
        filter.extend(cond);
        self.deliveries().find_one(filter).await.map_err(err("dead_letters"))
    }

    async fn dead_letter_page(
        &self,
        stream: &str,
        group: &str,
        after: Option<&Document>,
        limit: usize,
    ) -> Result<Vec<DeadLetter>> {
        const OP: &str = "dead_letters";
        let sort = doc! { MARK: 1, "dead_lettered_at": 1, "partition": 1, "sequence": 1 };
        let mut filter = sg_and(stream, group, doc! { "status": REJECTED });
        if let Some(a) = after {
            filter.insert("$or", after_key(a));
        }
        let lim = i64::try_from(limit).unwrap_or(i64::MAX);
        let docs = self.find_all(DELIVERIES, filter, Some(sort), Some(lim), None).await.map_err(err(OP))?;
        let ids: Vec<Bson> = docs.iter().filter_map(|d| d.get("event_id").cloned()).collect();
        let name: Arc<str> = Arc::from(stream);
        let mut events: HashMap<String, Event> = HashMap::new();
        if !ids.is_empty() {
            for e in self.find_all(EVENTS, doc! { "_id": { "$in": ids } }, None, None, None).await.map_err(err(OP))? {
                let e = decode_event(&name, e)?;
                events.insert(e.id().to_owned(), e);
            }
        }
        Ok(docs
            .iter()
            .map(|d| {
                let event = d.get_str("event_id").ok().and_then(|id| events.get(id).cloned());
                DeadLetter {
                    partition: u32_of(d, "partition"),
                    sequence: int_of(d, "sequence"),
                    // An event document is missing only when retention dropped it.
                    dropped: event.is_none(),
                    event,
                    damage: None,
                    reason: d.get_str("reason").unwrap_or_default().to_owned(),
                    attempts: u32_of(d, "attempt"),
                    dead_lettered_at: ts(d, "dead_lettered_at").unwrap_or_default(),
                }
            })
            .collect())
    }

    async fn reject_held(&self, lease: &LeaseRef, reason: &str) -> Result<bool> {
        self.dead_letter_held(lease, reason, self.now(), "reject").await
    }

    async fn missing(&self, stream: &str, group: &str) -> Result<Option<Error>> {
        match self.partition_count(stream).await {
            Err(e @ Error::StreamNotFound { .. }) => return Ok(Some(e)),
            Err(e) => return Err(e),
            Ok(_) => {}
        }
        let found = self
            .collection(GROUPS)
            .find_one(doc! { "stream": stream, "name": group })
            .projection(doc! { "_id": 1 })
            .await
            .map_err(err("settle"))?;
        Ok(found.is_none().then(|| Error::group_not_found(stream, group)))
    }
}
