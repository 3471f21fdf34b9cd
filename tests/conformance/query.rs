//! History queries: filters, bounds, order, limits, exact paging and the lazy stream.

use std::collections::{BTreeMap, HashSet};

use futures::{StreamExt, TryStreamExt};
use rheo::{AppendOptions, Cursor, Error, MAX_LIMIT, OrderBy, Query};
use serde_json::{Value, json};

use crate::common::Fixture;
use crate::support::*;

/// Six events over two partitions, ten seconds apart, the last one with an
/// explicit timestamp before all the others:
///
/// | name | partition | sequence | timestamp |
/// |------|-----------|----------|-----------|
/// | e1   | 0         | 1        | t0        |
/// | e2   | 1         | 1        | t10       |
/// | e3   | 0         | 2        | t20       |
/// | e4   | 1         | 2        | t30       |
/// | e5   | 0         | 3        | t40       |
/// | e6   | 1         | 3        | t-10      |
async fn seed(f: &Fixture) {
    stream(f, 2).await;
    let rows: [(Value, AppendOptions); 6] = [
        (
            json!({"name": "e1", "type": "order_placed", "key": "c-1", "total": 10,
                   "customer": {"tier": "gold", "id": 1}, "note": "x"}),
            AppendOptions::new().partition(0).correlation_id("tx-1"),
        ),
        (
            json!({"name": "e2", "type": "order_paid", "key": "c-2", "total": 25,
                   "customer": {"tier": "silver", "id": 2}}),
            AppendOptions::new().partition(1).correlation_id("tx-2"),
        ),
        (
            json!({"name": "e3", "type": "order_paid", "key": "c-1", "total": "10",
                   "customer": {"tier": "gold", "id": 1}}),
            AppendOptions::new().partition(0).correlation_id("tx-1"),
        ),
        (
            json!({"name": "e4", "type": "order_shipped", "key": "c-3", "total": 40}),
            AppendOptions::new().partition(1).correlation_id("tx-3"),
        ),
        (
            json!({"name": "e5", "type": "order_placed", "key": "c-4", "total": 55.5,
                   "customer": {"tier": "bronze", "id": 4}}),
            AppendOptions::new().partition(0).producer("web"),
        ),
        (json!({"name": "e6", "type": "refund", "total": -5}), AppendOptions::new().partition(1).timestamp(at(-10))),
    ];
    for (payload, opts) in rows {
        f.rheo.append(S, &payload, opts).await.expect("append");
        f.clock.advance(secs(10));
    }
}

/// The `name` of each event a query returns, in order.
async fn names(f: &Fixture, q: Query) -> Vec<String> {
    let events = f.rheo.query(&q).await.unwrap_or_else(|e| panic!("query {q:?}: {e}"));
    events
        .iter()
        .map(|e| e.payload().json().expect("json")["name"].as_str().expect("every seeded event has a name").to_owned())
        .collect()
}

fn q() -> Query {
    Query::new(S)
}

/// `eq` on `type`.
pub async fn query_eq_on_type(f: Fixture) {
    seed(&f).await;
    assert_eq!(names(&f, q().eq("type", "order_paid")).await, ["e2", "e3"]);
    assert_eq!(names(&f, q().eq("type", "refund")).await, ["e6"]);
    assert!(names(&f, q().eq("type", "nothing")).await.is_empty());
}

/// `eq` on `key`.
pub async fn query_eq_on_key(f: Fixture) {
    seed(&f).await;
    assert_eq!(names(&f, q().eq("key", "c-1")).await, ["e1", "e3"]);
    assert_eq!(names(&f, q().eq("key", "c-3")).await, ["e4"]);
}

/// `eq` on `partition`, also through `Query::partition`.
pub async fn query_eq_on_partition(f: Fixture) {
    seed(&f).await;
    assert_eq!(names(&f, q().eq("partition", 1)).await, ["e2", "e4", "e6"]);
    assert_eq!(names(&f, q().partition(0)).await, ["e1", "e3", "e5"]);
    assert!(names(&f, q().partition(7)).await.is_empty());
}

/// `eq` on lineage fields reads the metadata, by bare name or `metadata.` path.
pub async fn query_eq_on_lineage_fields(f: Fixture) {
    seed(&f).await;
    assert_eq!(names(&f, q().eq("correlation_id", "tx-1")).await, ["e1", "e3"]);
    assert_eq!(names(&f, q().eq("producer", "web")).await, ["e5"]);
    assert_eq!(names(&f, q().eq("metadata.correlation_id", "tx-2")).await, ["e2"]);
    assert!(names(&f, q().eq("causation_id", "tx-1")).await.is_empty());
}

/// `eq` on payload fields, with dotted paths into nested objects.
pub async fn query_eq_on_payload_dotted_paths(f: Fixture) {
    seed(&f).await;
    assert_eq!(names(&f, q().eq("customer.tier", "gold")).await, ["e1", "e3"]);
    assert_eq!(names(&f, q().eq("payload.customer.id", 2)).await, ["e2"]);
    assert_eq!(names(&f, q().eq("note", "x")).await, ["e1"]);
    assert_eq!(names(&f, q().eq("customer.tier", "gold").eq("type", "order_paid")).await, ["e3"], "filters AND");
}

/// `is_in` matches any of the values.
pub async fn query_is_in_matches_any_value(f: Fixture) {
    seed(&f).await;
    assert_eq!(names(&f, q().is_in("type", ["order_shipped", "refund"])).await, ["e4", "e6"]);
    assert_eq!(names(&f, q().is_in("key", ["c-2", "nope"])).await, ["e2"]);
    assert_eq!(names(&f, q().is_in("total", [10, 40])).await, ["e1", "e4"], "the string \"10\" is not 10");
    assert!(names(&f, q().is_in("type", Vec::<String>::new())).await.is_empty());
}

/// `gt`, `gte`, `lt`, `lte` on numbers, integers and floats alike.
pub async fn query_range_operators_on_numbers(f: Fixture) {
    seed(&f).await;
    assert_eq!(names(&f, q().gt("total", 10)).await, ["e2", "e4", "e5"]);
    assert_eq!(names(&f, q().gte("total", 10)).await, ["e1", "e2", "e4", "e5"]);
    assert_eq!(names(&f, q().lt("total", 10)).await, ["e6"]);
    assert_eq!(names(&f, q().lte("total", 10)).await, ["e1", "e6"]);
    assert_eq!(names(&f, q().gt("total", 0).lt("total", 50)).await, ["e1", "e2", "e4"]);
    assert_eq!(names(&f, q().gt("total", 55)).await, ["e5"]);
    assert_eq!(names(&f, q().lt("total", 55.6).gt("total", 55.4)).await, ["e5"]);
}

/// Range operators on strings and timestamps.
pub async fn query_range_operators_on_strings_and_timestamps(f: Fixture) {
    seed(&f).await;
    assert_eq!(names(&f, q().gte("key", "c-2")).await, ["e2", "e4", "e5"]);
    assert_eq!(names(&f, q().lt("key", "c-2")).await, ["e1", "e3"]);
    assert_eq!(names(&f, q().gte("timestamp", at(30))).await, ["e4", "e5"]);
    assert_eq!(names(&f, q().lt("timestamp", at(0))).await, ["e6"]);
    assert_eq!(names(&f, q().gt("sequence", 2)).await, ["e5", "e6"]);
}

/// `exists` and `missing`.
pub async fn query_exists_and_missing(f: Fixture) {
    seed(&f).await;
    assert_eq!(names(&f, q().exists("customer")).await, ["e1", "e2", "e3", "e5"]);
    assert_eq!(names(&f, q().exists("customer.tier")).await, ["e1", "e2", "e3", "e5"]);
    assert_eq!(names(&f, q().missing("customer")).await, ["e4", "e6"]);
    assert_eq!(names(&f, q().missing("key")).await, ["e6"]);
    assert_eq!(names(&f, q().exists("note")).await, ["e1"]);
    assert_eq!(names(&f, q().exists("producer")).await, ["e5"]);
}

/// Comparison is by value type: 1 never equals "1", and numbers never order against strings.
pub async fn query_compares_by_value_type(f: Fixture) {
    seed(&f).await;
    assert_eq!(names(&f, q().eq("total", 10)).await, ["e1"]);
    assert_eq!(names(&f, q().eq("total", "10")).await, ["e3"]);
    assert_eq!(names(&f, q().gt("total", "1")).await, ["e3"]);
    assert!(names(&f, q().eq("customer.id", "1")).await.is_empty());
    assert!(names(&f, q().eq("partition", "0")).await.is_empty());
}

/// `from` / `to` bound the timestamp, both inclusive.
pub async fn query_from_and_to_are_inclusive(f: Fixture) {
    seed(&f).await;
    assert_eq!(names(&f, q().from(at(10)).to(at(30))).await, ["e2", "e3", "e4"]);
    assert_eq!(names(&f, q().from(at(10))).await, ["e2", "e3", "e4", "e5"]);
    assert_eq!(names(&f, q().to(at(0))).await, ["e1", "e6"]);
    assert_eq!(names(&f, q().from(at(20)).to(at(20))).await, ["e3"]);
}

/// `after_sequence` is exclusive, `until_sequence` inclusive, in every partition.
pub async fn query_after_sequence_exclusive_until_sequence_inclusive(f: Fixture) {
    seed(&f).await;
    assert_eq!(names(&f, q().after_sequence(1)).await, ["e3", "e4", "e5", "e6"]);
    assert_eq!(names(&f, q().until_sequence(2)).await, ["e1", "e2", "e3", "e4"]);
    assert_eq!(names(&f, q().after_sequence(1).until_sequence(2)).await, ["e3", "e4"]);
    assert!(names(&f, q().after_sequence(3)).await.is_empty());
}

/// `after_sequences` sets an exclusive lower bound per partition.
pub async fn query_after_sequences_per_partition(f: Fixture) {
    seed(&f).await;
    assert_eq!(names(&f, q().after_sequences(BTreeMap::from([(0, 2)]))).await, ["e2", "e4", "e5", "e6"]);
    assert_eq!(names(&f, q().after_sequences(BTreeMap::from([(0, 1), (1, 2)]))).await, ["e3", "e5", "e6"]);
}

/// `order_by` sequence (the default), ascending and descending.
pub async fn query_order_by_sequence_asc_and_desc(f: Fixture) {
    seed(&f).await;
    assert_eq!(names(&f, q()).await, ["e1", "e2", "e3", "e4", "e5", "e6"]);
    assert_eq!(names(&f, q().order_by(OrderBy::Sequence)).await, ["e1", "e2", "e3", "e4", "e5", "e6"]);
    assert_eq!(names(&f, q().descending()).await, ["e6", "e5", "e4", "e3", "e2", "e1"]);
}

/// `order_by` timestamp, ascending and descending.
pub async fn query_order_by_timestamp_asc_and_desc(f: Fixture) {
    seed(&f).await;
    assert_eq!(names(&f, q().order_by(OrderBy::Timestamp)).await, ["e6", "e1", "e2", "e3", "e4", "e5"]);
    assert_eq!(names(&f, q().order_by(OrderBy::Timestamp).descending()).await, ["e5", "e4", "e3", "e2", "e1", "e6"]);
}

/// `order_by` partition, ascending and descending.
pub async fn query_order_by_partition_asc_and_desc(f: Fixture) {
    seed(&f).await;
    assert_eq!(names(&f, q().order_by(OrderBy::Partition)).await, ["e1", "e3", "e5", "e2", "e4", "e6"]);
    assert_eq!(names(&f, q().order_by(OrderBy::Partition).descending()).await, ["e6", "e4", "e2", "e5", "e3", "e1"]);
}

/// A query returns 100 events by default, and `limit` events when set.
pub async fn query_limit_defaults_to_100(f: Fixture) {
    stream(&f, 1).await;
    f.rheo.append_batch(S, (0..150).map(|n| json!({"n": n}))).await.expect("batch");
    assert_eq!(Query::new(S).limit, 100);
    let page = f.rheo.query_page(&Query::new(S)).await.expect("query");
    assert_eq!(page.events.len(), 100);
    assert_eq!(page.events.last().map(|e| e.sequence()), Some(100));
    assert!(page.next_cursor.is_some(), "more remain");
    assert_eq!(f.rheo.query(&Query::new(S).limit(7)).await.expect("query").len(), 7);
    let all = f.rheo.query_page(&Query::new(S).limit(MAX_LIMIT)).await.expect("query");
    assert_eq!(all.events.len(), 150);
    assert!(all.next_cursor.is_none(), "no cursor after the last page");
}

/// Appends `counts[p]` events `{"n": i}` to each partition p, one clock second
/// every three events so timestamps both tie and differ.
async fn seed_uneven(f: &Fixture, counts: &[u64]) {
    let partitions = u32::try_from(counts.len()).expect("few partitions");
    stream(f, partitions).await;
    let mut n = 0u64;
    for (p, &count) in (0..partitions).zip(counts) {
        for _ in 0..count {
            f.rheo.append(S, &json!({"n": n}), AppendOptions::new().partition(p)).await.expect("append");
            if n % 3 == 2 {
                f.clock.advance(secs(1));
            }
            n += 1;
        }
    }
}

/// Follows `next_cursor` from the first page to the last; returns every page.
async fn all_pages(f: &Fixture, query: &Query) -> Vec<Vec<rheo::Event>> {
    let mut pages = Vec::new();
    let mut q = query.clone();
    loop {
        let page = f.rheo.query_page(&q).await.expect("page");
        assert!(page.events.len() <= q.limit, "a page holds at most `limit` events");
        pages.push(page.events);
        match page.next_cursor {
            Some(c) => q = query.clone().cursor(c),
            None => return pages,
        }
        assert!(pages.len() <= 100, "paging does not end");
    }
}

/// Paging returns every matching event exactly once, across partitions and in
/// the query's order, for every order.
pub async fn query_page_returns_each_match_exactly_once_across_partitions(f: Fixture) {
    seed_uneven(&f, &[7, 3, 12]).await;
    let orders = [OrderBy::Sequence, OrderBy::Timestamp, OrderBy::Partition];
    for (order, descending) in orders.into_iter().flat_map(|o| [(o, false), (o, true)]) {
        let mut base = Query::new(S).order_by(order).is_in("n", (0..22).step_by(2));
        if descending {
            base = base.descending();
        }
        let unpaged = f.rheo.query(&base.clone().limit(1000)).await.expect("one page");
        assert_eq!(unpaged.len(), 11, "{order:?}");
        let pages = all_pages(&f, &base.clone().limit(4)).await;
        assert_eq!(pages.len(), 3, "{order:?} desc={descending}: 11 events in pages of 4");
        let paged: Vec<rheo::Event> = pages.into_iter().flatten().collect();
        assert_unique(paged.iter().map(|e| (e.partition(), e.sequence())));
        assert_eq!(event_positions(&paged), event_positions(&unpaged), "{order:?} desc={descending}");
    }
}

/// Every bound (sequence, time, per partition) holds on every page, not just
/// the first, in every order: what a bound excludes may sort first or last.
pub async fn query_page_keeps_bounds_on_every_page(f: Fixture) {
    seed_uneven(&f, &[9, 9, 9]).await;
    let bounded = Query::new(S)
        .after_sequence(1)
        .until_sequence(8)
        .after_sequences(BTreeMap::from([(2, 4)]))
        .from(at(1))
        .to(at(7))
        .lt("n", 25);
    let orders = [OrderBy::Sequence, OrderBy::Timestamp, OrderBy::Partition];
    for (order, descending) in orders.into_iter().flat_map(|o| [(o, false), (o, true)]) {
        let mut q = bounded.clone().order_by(order);
        if descending {
            q = q.descending();
        }
        let expected = f.rheo.query(&q.clone().limit(1000)).await.expect("one page");
        assert_eq!(expected.len(), 14, "{order:?} desc={descending}");
        let pages = all_pages(&f, &q.limit(2)).await;
        for event in pages.iter().flatten() {
            let why = format!("{order:?} desc={descending}: {event:?}");
            assert!((2..=8).contains(&event.sequence()), "{why}");
            assert!(event.partition() != 2 || event.sequence() > 4, "{why}");
            assert!(event.timestamp() >= at(1) && event.timestamp() <= at(7), "{why}");
            assert!(event.payload().json().expect("json")["n"].as_u64().is_some_and(|n| n < 25), "{why}");
        }
        let paged: Vec<rheo::Event> = pages.into_iter().flatten().collect();
        assert_eq!(paged, expected, "{order:?} desc={descending}");
    }
}

/// A cursor only continues the order it was made for; printed and parsed
/// back it continues the same way.
pub async fn query_cursor_of_another_order_is_rejected(f: Fixture) {
    seed(&f).await;
    let first = f.rheo.query_page(&q().limit(2)).await.expect("page");
    let cursor = first.next_cursor.expect("more than 2 events");
    for other in [q().order_by(OrderBy::Timestamp), q().order_by(OrderBy::Partition), q().descending()] {
        let e = assert_err!(
            f.rheo.query_page(&other.limit(2).cursor(cursor)).await,
            Error::InvalidArgument { argument: "cursor", .. }
        );
        assert_mentions(&e, &["cursor"]);
    }
    let parsed: Cursor = cursor.to_string().parse().expect("a printed cursor parses");
    let next = f.rheo.query(&q().limit(2).cursor(parsed)).await.expect("page 2");
    let names: Vec<&str> = next.iter().filter_map(|e| e.payload().json().expect("json")["name"].as_str()).collect();
    assert_eq!(names, ["e3", "e4"]);
}

/// `stream_query` yields every matching event, fetching pages lazily as it is
/// consumed (so it also sees events appended while it is being read).
pub async fn stream_query_yields_everything_lazily(f: Fixture) {
    stream(&f, 2).await;
    for n in 0..25u32 {
        f.rheo.append(S, &json!({"n": n}), AppendOptions::new().partition(n % 2)).await.expect("append");
    }
    let all: Vec<rheo::Event> = f.rheo.stream_query(Query::new(S).limit(10)).try_collect().await.expect("collect");
    assert_eq!(all.len(), 25);
    assert_unique(all.iter().map(|e| e.id().to_owned()));

    let mut lazy = std::pin::pin!(f.rheo.stream_query(Query::new(S).limit(10)));
    let mut seen = Vec::new();
    for _ in 0..5 {
        seen.push(lazy.next().await.expect("an item").expect("no error"));
    }
    for n in 25..35u32 {
        f.rheo.append(S, &json!({"n": n}), AppendOptions::new().partition(n % 2)).await.expect("append");
    }
    while let Some(event) = lazy.next().await {
        seen.push(event.expect("no error"));
    }
    let ns: HashSet<u64> = seen.iter().filter_map(|e| e.payload().json().expect("json")["n"].as_u64()).collect();
    assert_eq!(seen.len(), 35, "pages after the first are read when reached");
    assert_eq!(ns, (0..35).collect());

    let mut missing = std::pin::pin!(f.rheo.stream_query(Query::new("nope")));
    assert!(matches!(missing.next().await, Some(Err(Error::StreamNotFound { .. }))));
}

/// A query on a missing stream is `StreamNotFound`; a bad limit is `InvalidArgument`.
pub async fn query_on_missing_stream_is_stream_not_found(f: Fixture) {
    let e =
        assert_err!(f.rheo.query(&Query::new("nope")).await, Error::StreamNotFound { ref stream } if stream == "nope");
    assert_mentions(&e, &["nope"]);
    stream(&f, 1).await;
    for limit in [0, MAX_LIMIT + 1] {
        assert_err!(f.rheo.query(&q().limit(limit)).await, Error::InvalidArgument { argument: "limit", .. });
    }
}
