//! Many consumers competing on one group at once.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rheo::{AppendOptions, FetchOptions, Rheo};
use serde_json::json;

use crate::common::Fixture;
use crate::support::*;

const EVENTS: u32 = 10_000;
/// The events and workers on a slow backend ([`Fixture::small`]).
const SMALL_EVENTS: u32 = 400;
const SMALL_WORKERS: usize = 4;
const PARTITIONS: u32 = 4;
const WORKERS: usize = 16;

/// What the workers saw, shared between them.
#[derive(Default)]
struct Ledger {
    /// Delivery -> the worker holding it right now.
    holders: HashMap<(u32, u64), usize>,
    /// Every delivery acked so far.
    acked: HashSet<(u32, u64)>,
    /// Broken rules, described.
    violations: Vec<String>,
}

async fn worker(rheo: Rheo, me: usize, ledger: Arc<Mutex<Ledger>>) {
    let consumer = format!("worker-{me}");
    loop {
        // The manual clock never moves here, so no lease ever expires.
        let opts = FetchOptions::new().limit(25).consumer(consumer.clone()).lease(Duration::from_secs(3600));
        let leases = rheo.fetch(S, G, opts).await.expect("fetch");
        if leases.is_empty() {
            if rheo.lag(S, G).await.expect("lag").total == 0 {
                return;
            }
            tokio::task::yield_now().await;
            continue;
        }
        for lease in &leases {
            let at = (lease.partition(), lease.sequence());
            let mut l = ledger.lock().expect("ledger lock");
            if let Some(other) = l.holders.insert(at, me) {
                l.violations.push(format!("{at:?} claimed by worker {me} while worker {other} held it"));
            }
            if lease.attempt != 1 {
                l.violations.push(format!("{at:?} delivered with attempt {} though no lease expired", lease.attempt));
            }
        }
        for lease in &leases {
            let at = (lease.partition(), lease.sequence());
            ledger.lock().expect("ledger lock").holders.remove(&at);
            rheo.ack(lease).await.expect("ack a lease that cannot have expired");
            let mut l = ledger.lock().expect("ledger lock");
            if !l.acked.insert(at) {
                l.violations.push(format!("{at:?} acked twice"));
            }
        }
    }
}

/// 16 consumers compete on one group over 10,000 events (4 over 400 on a
/// slow backend, see [`Fixture::small`]) in 4 partitions: every
/// event is acked exactly once, no two live leases ever hold the same delivery,
/// and the final lag is 0.
pub async fn competing_consumers_ack_every_event_exactly_once(f: Fixture) {
    setup(&f, PARTITIONS).await;
    let events = if f.small { SMALL_EVENTS } else { EVENTS };
    let items = (0..events).map(|i| (json!({"i": i}), AppendOptions::new().partition(i % PARTITIONS)));
    let appended = f.rheo.append_batch_with(S, items).await.expect("append the events");
    assert_eq!(appended.len(), events as usize);

    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let workers = if f.small { SMALL_WORKERS } else { WORKERS };
    let tasks: Vec<_> = (0..workers).map(|me| tokio::spawn(worker(f.rheo.clone(), me, ledger.clone()))).collect();
    let all = futures::future::join_all(tasks);
    let results = tokio::time::timeout(Duration::from_secs(120), all).await.expect("the workers finish");
    for r in results {
        r.expect("a worker panicked");
    }

    let ledger = std::mem::take(&mut *ledger.lock().expect("ledger lock"));
    let first = &ledger.violations[..ledger.violations.len().min(5)];
    assert!(ledger.violations.is_empty(), "{} violations, first: {first:?}", ledger.violations.len());
    assert_eq!(ledger.acked.len(), events as usize);
    let expected: HashSet<(u32, u64)> = appended.iter().map(|e| (e.partition(), e.sequence())).collect();
    assert!(ledger.acked == expected, "the acked set is exactly the appended set");
    assert!(ledger.holders.is_empty());
    assert_eq!(lag_total(&f).await, 0);
    assert_eq!(f.rheo.group_info(S, G).await.expect("info").inflight, 0);
}

/// Eight producers append the same id at once (twenty rounds, a new id
/// each): one event is stored per id, every producer gets it, seven of them
/// marked as duplicates.
pub async fn concurrent_appends_of_one_id_store_one_event(f: Fixture) {
    stream(&f, 2).await;
    const ROUNDS: u64 = 20;
    for round in 0..ROUNDS {
        let id = format!("the-one-{round}");
        let tasks: Vec<_> = (0..8)
            .map(|n| {
                let (rheo, id) = (f.rheo.clone(), id.clone());
                tokio::spawn(async move {
                    rheo.append(S, &serde_json::json!({"producer": n}), AppendOptions::new().id(id)).await
                })
            })
            .collect();
        let mut got = Vec::new();
        for t in tasks {
            got.push(t.await.expect("task").expect("append"));
        }
        let at: std::collections::BTreeSet<(u32, u64)> = got.iter().map(|e| (e.partition(), e.sequence())).collect();
        assert_eq!(at.len(), 1, "round {round}: every producer got the one event: {got:?}");
        assert_eq!(got.iter().filter(|e| !e.is_duplicate()).count(), 1, "round {round}: one stored, seven duplicates");
        let payloads: std::collections::BTreeSet<String> = got.iter().map(|e| e.payload().to_string()).collect();
        assert_eq!(payloads.len(), 1, "round {round}: the duplicates answer the stored payload");
    }
    let total: u64 = f.rheo.list_streams().await.expect("list")[0].high_watermarks.iter().sum();
    assert_eq!(total, ROUNDS);
}
