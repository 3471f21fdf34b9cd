//! Secondary indexes: declaring and adding them, their progress, and that
//! queries through them return exactly what a scan would (typed values,
//! dotted paths), on every backend. On a backend with indexes
//! (`capabilities().indexed_query`), `Page::explain` shows them used.

use rheo::{Access, AppendOptions, Error, Query, StreamOptions};
use serde_json::{Value, json};

use crate::common::Fixture;
use crate::support::*;

/// `n` events over two partitions: `{"name": "o<i>", "currency": EUR|USD|GBP,
/// "amount": i, "order": {"customer_id": i % 7}}`, type `order_<i % 4>`.
async fn orders(f: &Fixture, n: u64, indexes: &[&str]) {
    let opts = StreamOptions::new().partitions(2).indexes(indexes.iter().copied());
    f.rheo.create_stream(S, opts).await.expect("create the stream");
    let currencies = ["EUR", "USD", "GBP"];
    for i in 0..n {
        let payload = json!({
            "name": format!("o{i}"), "type": format!("order_{}", i % 4),
            "currency": currencies[usize::try_from(i % 3).expect("small")],
            "amount": i, "order": {"customer_id": i % 7}, "pad": "x".repeat(40),
        });
        let opts = AppendOptions::new().partition(u32::try_from(i % 2).expect("small"));
        f.rheo.append(S, &payload, opts).await.expect("append");
    }
}

/// The names a query returns over all its pages.
async fn all_names(f: &Fixture, q: Query) -> Vec<String> {
    let mut out = Vec::new();
    let mut q = q.limit(7);
    loop {
        let page = f.rheo.query_page(&q).await.unwrap_or_else(|e| panic!("query {q:?}: {e}"));
        out.extend(
            page.events.iter().map(|e| e.payload().json().expect("json")["name"].as_str().unwrap_or("?").to_owned()),
        );
        match page.next_cursor {
            Some(c) => q = q.cursor(c),
            None => return out,
        }
    }
}

/// The names the query should return, in ascending (sequence, partition)
/// order, for events `o<i>` where `keep(i)`.
fn expected(n: u64, keep: impl Fn(u64) -> bool) -> Vec<String> {
    let mut rows: Vec<(u64, u64, String)> =
        (0..n).filter(|&i| keep(i)).map(|i| (i / 2 + 1, i % 2, format!("o{i}"))).collect();
    rows.sort();
    rows.into_iter().map(|r| r.2).collect()
}

/// Adding an index backfills it; queries are exact before, during and after.
pub async fn create_index_backfills_and_queries_stay_exact(f: Fixture) {
    let n = 240;
    orders(&f, n, &[]).await;
    let by_currency = || Query::new(S).eq("currency", "USD");
    let want = expected(n, |i| i % 3 == 1);
    assert_eq!(all_names(&f, by_currency()).await, want, "before the index");
    let build = f.rheo.create_index(S, "currency").await.expect("create_index");
    assert_eq!(build.field(), "payload.currency");
    assert_eq!(all_names(&f, by_currency()).await, want, "while it builds");
    let mut calls = 0;
    let done = build.wait(|_| calls += 1).await.expect("the build finishes");
    assert!(done.ready() && calls >= 1, "{done:?} after {calls} progress calls");
    assert_eq!(all_names(&f, by_currency()).await, want, "after it is built");
    let nested = Query::new(S).eq("order.customer_id", 3).gte("amount", 100);
    assert_eq!(all_names(&f, nested).await, expected(n, |i| i % 7 == 3 && i >= 100));
    // Adding it again (under another spelling of the same path) is a no-op.
    f.rheo.create_index(S, "payload.currency").await.expect("again");
    let status = f.rheo.index_status(S).await.expect("status");
    assert_eq!(status.iter().filter(|s| s.field == "payload.currency").count(), 1, "{status:?}");
    let info = f.rheo.list_streams().await.expect("list").into_iter().find(|s| s.name == S).expect("stream");
    assert_eq!(info.indexes, vec!["currency".to_owned()]);
}

/// Fields the log orders itself, empty segments and unknown streams are refused.
pub async fn create_index_refuses_log_fields_bad_paths_and_unknown_streams(f: Fixture) {
    f.rheo.create_stream(S, StreamOptions::new()).await.expect("create");
    for bad in ["sequence", "partition", "timestamp", "stream", "", "a..b", ".a", "a."] {
        let err = assert_err!(f.rheo.create_index(S, bad).await, Error::InvalidArgument { .. });
        assert!(err.to_string().contains(&format!("{bad:?}")), "{err} names the field");
    }
    assert_err!(f.rheo.create_index("nope", "currency").await, Error::StreamNotFound { .. });
    let opts = StreamOptions::new().indexes(["timestamp"]);
    assert_err!(f.rheo.create_stream("other", opts).await, Error::InvalidArgument { .. });
    let many: Vec<String> = (0..=rheo::MAX_INDEXES).map(|i| format!("f{i}")).collect();
    assert_err!(f.rheo.create_stream("other", StreamOptions::new().indexes(many)).await, Error::InvalidArgument { .. });
}

/// Values of every JSON type under one indexed field: equality, ranges and
/// `exists` match by type (1 == 1.0, 1 != "1", big integers exactly).
pub async fn indexed_values_match_by_type(f: Fixture) {
    f.rheo.create_stream(S, StreamOptions::new().indexes(["v"])).await.expect("create");
    let big = (1i64 << 53) + 1;
    let values: [(&str, Option<Value>); 12] = [
        ("int", Some(json!(1))),
        ("float_one", Some(json!(1.0))),
        ("string_one", Some(json!("1"))),
        ("true", Some(json!(true))),
        ("null", Some(Value::Null)),
        ("array", Some(json!([1]))),
        ("object", Some(json!({"a": 1}))),
        ("big", Some(json!(big))),
        ("big_next", Some(json!(big + 1))),
        ("neg", Some(json!(-2.5))),
        ("text", Some(json!("b"))),
        ("missing", None),
    ];
    for (name, v) in &values {
        let mut payload = json!({"name": name});
        if let Some(v) = v {
            payload["v"] = v.clone();
        }
        f.rheo.append(S, &payload, AppendOptions::new()).await.expect("append");
    }
    let check = |q: Query, want: &[&str]| {
        let f = &f;
        let want: Vec<String> = want.iter().map(|s| (*s).to_owned()).collect();
        async move {
            let got = all_names(f, q.clone()).await;
            assert_eq!(got, want, "{q:?}");
        }
    };
    check(Query::new(S).eq("v", 1), &["int", "float_one"]).await;
    check(Query::new(S).eq("payload.v", 1.0), &["int", "float_one"]).await;
    check(Query::new(S).eq("v", "1"), &["string_one"]).await;
    check(Query::new(S).eq("v", true), &["true"]).await;
    check(Query::new(S).eq("v", Value::Null), &["null"]).await;
    check(Query::new(S).eq("v", json!([1])), &["array"]).await;
    check(Query::new(S).eq("v", big), &["big"]).await;
    check(Query::new(S).is_in("v", [json!("1"), json!(-2.5), json!(big + 1)]), &["string_one", "big_next", "neg"])
        .await;
    check(Query::new(S).gt("v", 1), &["big", "big_next"]).await;
    check(Query::new(S).lte("v", 1), &["int", "float_one", "neg"]).await;
    check(Query::new(S).gte("v", "a"), &["text"]).await;
    check(Query::new(S).lt("v", "a"), &["string_one"]).await;
    check(
        Query::new(S).exists("v"),
        &["int", "float_one", "string_one", "true", "null", "array", "object", "big", "big_next", "neg", "text"],
    )
    .await;
    check(Query::new(S).missing("v"), &["missing"]).await;
}

/// Where the backend has indexes, an equality on an indexed field reads
/// only through them once they are built; a filter on an unindexed field
/// scans. Other backends leave `explain` empty.
pub async fn explain_shows_the_index_or_the_scan(f: Fixture) {
    let n = 120;
    orders(&f, n, &["currency"]).await;
    let build = f.rheo.create_index(S, "currency").await.expect("ensure built");
    build.wait(|_| {}).await.expect("built");
    let page = f.rheo.query_page(&Query::new(S).eq("currency", "GBP").limit(1000)).await.expect("query");
    assert_eq!(page.events.len(), expected(n, |i| i % 3 == 2).len());
    let scan = f.rheo.query_page(&Query::new(S).eq("pad", "nope")).await.expect("query");
    assert!(scan.events.is_empty());
    if !f.rheo.capabilities().indexed_query {
        assert!(page.explain.is_empty() && scan.explain.is_empty());
        return;
    }
    assert!(!page.explain.is_empty());
    for e in &page.explain {
        match &e.access {
            Access::Index { fields, .. } => assert_eq!(fields, &vec!["payload.currency".to_owned()], "{e}"),
            other => panic!("expected the index, got {other:?} in {e}"),
        }
    }
    let candidates: u64 = page
        .explain
        .iter()
        .map(|e| if let Access::Index { candidates, .. } = &e.access { *candidates } else { 0 })
        .sum();
    assert_eq!(candidates, page.events.len() as u64, "only matching events were read");
    assert!(scan.explain.iter().all(|e| matches!(e.access, Access::Scan { .. })), "{:?}", scan.explain);
}
