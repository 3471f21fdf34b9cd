//! A managed consumer: `Rheo::consumer` runs a handler on every event with 8 handlers
//! at once, retries a flaky event, dead-letters a bad one, and drains on
//! shutdown.
//!
//! Run: `cargo run --example consumer` (a native database in a temporary
//! directory), or `cargo run --example consumer -- native:./rheo-data` /
//! `-- memory:`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rheo::{DeadLetterOptions, GroupOptions, Handler, Lease, Outcome, Rheo, StreamOptions};
use serde_json::json;

/// Ships orders; counts what it saw.
struct Shipping {
    handled: AtomicU64,
}

/// The fields shipping reads, decoded straight from the stored payload.
#[derive(serde::Deserialize)]
struct Order {
    total: i64,
    flaky: bool,
}

#[async_trait::async_trait]
impl Handler for Shipping {
    async fn setup(&self) -> rheo::Result<()> {
        println!("shipping handler ready");
        Ok(())
    }

    async fn handle(&self, lease: &Lease) -> Outcome {
        self.handled.fetch_add(1, Ordering::Relaxed);
        let Ok(order) = lease.event.payload().decode::<Order>() else {
            return Outcome::reject("not an order");
        };
        if order.total < 0 {
            return Outcome::reject("negative total");
        }
        if order.flaky && lease.attempt == 1 {
            // The carrier's API timed out: try again shortly.
            return Outcome::retry_after("carrier timeout", Duration::from_millis(50));
        }
        Outcome::Ack
    }
}

#[tokio::main]
async fn main() -> rheo::Result<()> {
    let dir = tempfile::tempdir().map_err(|e| rheo::Error::failed("tempdir", e))?;
    let url = std::env::args().nth(1).unwrap_or_else(|| format!("native:{}", dir.path().display()));
    let rheo = Rheo::open(&url).await?;
    rheo.ensure_stream("orders", StreamOptions::new().partitions(4)).await?;
    rheo.ensure_group("orders", "shipping", GroupOptions::new().max_attempts(3)).await?;

    let orders: Vec<_> = (0..1_000)
        .map(|n| {
            json!({"type": "order_placed", "key": format!("c-{}", n % 37), "order": n,
                        "total": if n == 500 { -1 } else { n }, "flaky": n % 250 == 7})
        })
        .collect();
    rheo.append_batch("orders", orders).await?;
    println!("appended 1000 orders to {url}");

    let started = Instant::now();
    let shipping = Shipping { handled: AtomicU64::new(0) };
    let handle = rheo.consumer("orders", "shipping").concurrency(8).max_demand(64).spawn(shipping).await?;
    while rheo.lag("orders", "shipping").await?.total > 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let summary = handle.shutdown().await?;
    println!("caught up in {:?}: {summary:?}", started.elapsed());

    for dl in rheo.dead_letters("orders", "shipping", DeadLetterOptions::default()).await? {
        match &dl.event {
            Some(event) => println!("dead letter: {} ({})", event.payload(), dl.reason),
            None => println!("dead letter: partition {} #{} can't be read ({})", dl.partition, dl.sequence, dl.reason),
        }
    }
    Ok(())
}
