//! The README's quick start: a stream, a group, an append, a fetch and an ack.

use rheo::{AppendOptions, FetchOptions, GroupOptions, Rheo, StreamOptions};
use serde_json::json;

/// What billing reads of an event, decoded straight from the stored payload.
#[derive(serde::Deserialize)]
struct Order {
    total: Option<u64>,
}

#[tokio::main]
async fn main() -> rheo::Result<()> {
    // The embedded engine, durable in ./rheo-data (`memory:` for an ephemeral one).
    let rheo = Rheo::open("native:./rheo-data").await?;
    // Created on the first run; found, with their positions, on the next ones.
    rheo.ensure_stream("orders", StreamOptions::new().partitions(4)).await?;
    rheo.ensure_group("orders", "billing", GroupOptions::new().max_attempts(3)).await?;

    // `type` and `key` come from the payload; the key picks the partition.
    rheo.append("orders", &json!({"type": "order_placed", "key": "c-7", "total": 42}), AppendOptions::new()).await?;

    for lease in rheo.fetch("orders", "billing", FetchOptions::new().limit(10)).await? {
        println!("partition {} #{}: {}", lease.partition(), lease.sequence(), lease.event.payload());
        let order: Order = lease.event.payload().decode()?;
        match order.total {
            Some(_) => rheo.ack(&lease).await?,
            None => rheo.reject(&lease, "no total").await?,
        }
    }
    assert_eq!(rheo.lag("orders", "billing").await?.total, 0);
    println!("lag is zero: every order was handled");
    Ok(())
}
