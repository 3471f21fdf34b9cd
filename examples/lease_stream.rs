//! `LeaseStream`: leases as a `futures::Stream`, composed two ways —
//! `buffer_unordered` (handle 8 at once, settle each through its item) and
//! `ready_chunks` + `ack_many` (settle a batch in one commit).
//!
//! Run: `cargo run --example lease_stream` (a native database in a temporary
//! directory), or `cargo run --example lease_stream -- memory:`.

use futures::StreamExt;
use rheo::{GroupOptions, LeaseStreamOptions, Rheo, StreamOptions};
use serde_json::json;

#[tokio::main]
async fn main() -> rheo::Result<()> {
    let dir = tempfile::tempdir().map_err(|e| rheo::Error::failed("tempdir", e))?;
    let url = std::env::args().nth(1).unwrap_or_else(|| format!("native:{}", dir.path().display()));
    let rheo = Rheo::open(&url).await?;
    rheo.ensure_stream("clicks", StreamOptions::new().partitions(2)).await?;
    rheo.ensure_group("clicks", "stats", GroupOptions::new()).await?;
    rheo.append_batch("clicks", (0..1_000).map(|n| json!({"type": "click", "page": n % 10}))).await?;

    // 1. Up to 8 leases handled at once, each acked through its item.
    let leases = rheo.lease_stream("clicks", "stats", LeaseStreamOptions::new().max_demand(8))?;
    let handled = leases
        .take(500)
        .map(|lease| async move {
            let lease = lease?;
            // ... handle lease.event here ...
            lease.ack().await
        })
        .buffer_unordered(8)
        .fold(Ok(0usize), |n, r: rheo::Result<()>| async move { r.and(n.map(|n| n + 1)) })
        .await?;
    println!("buffer_unordered: acked {handled} one by one");

    // 2. Whatever is ready, up to 200, acked with one ack_many call.
    let leases = rheo.lease_stream("clicks", "stats", LeaseStreamOptions::new().max_demand(200))?;
    let mut chunks = leases.ready_chunks(200);
    let mut acked = 0;
    while rheo.lag("clicks", "stats").await?.total > 0 {
        let Some(chunk) = chunks.next().await else { break };
        let chunk: Vec<_> = chunk.into_iter().collect::<rheo::Result<_>>()?;
        let n = chunk.len();
        for r in rheo.ack_many(chunk).await? {
            r?;
        }
        acked += n;
        println!("ready_chunks: acked a batch of {n}");
    }
    println!("ready_chunks + ack_many: acked {acked}; lag {}", rheo.lag("clicks", "stats").await?.total);
    Ok(())
}
