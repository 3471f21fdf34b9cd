//! A running service to look inside: it holds a native data directory,
//! appends orders at a steady rate and consumes them with two groups, one of
//! which dead-letters some and lags behind. While it runs, another terminal
//! can watch it with the `rheo` command, which opens the directory read-only:
//!
//! ```sh
//! cargo run --release --example live_service -- ./live-data      # terminal 1
//! rheo --backend native:./live-data group lag orders billing     # terminal 2
//! rheo --backend native:./live-data tail orders --from-end
//! rheo --backend native:./live-data dlq list orders billing
//! rheo --backend native:./live-data top
//! ```
//!
//! Arguments: the data directory (default `./live-data`), then the rate in
//! orders per second (default 200) and how many seconds to run (default:
//! until Ctrl-C).

use std::time::Duration;

use rheo::{AppendOptions, GroupOptions, Handler, Lease, Outcome, Rheo, StreamOptions};
use serde_json::json;

/// Bills orders; an order with a negative total is dead-lettered, one in
/// fifty fails once and is retried.
struct Billing;

#[async_trait::async_trait]
impl Handler for Billing {
    async fn handle(&self, lease: &Lease) -> Outcome {
        let Ok(order) = lease.event.payload().decode::<serde_json::Value>() else {
            return Outcome::reject("not an order");
        };
        if order["total"].as_i64().unwrap_or(0) < 0 {
            return Outcome::reject("negative total");
        }
        if order["order"].as_u64().unwrap_or(0) % 50 == 7 && lease.attempt == 1 {
            return Outcome::retry_after("payment gateway timeout", Duration::from_millis(200));
        }
        Outcome::Ack
    }
}

/// Audits orders slowly (it falls behind: its lag grows).
struct Audit;

#[async_trait::async_trait]
impl Handler for Audit {
    async fn handle(&self, _lease: &Lease) -> Outcome {
        tokio::time::sleep(Duration::from_millis(20)).await;
        Outcome::Ack
    }
}

#[tokio::main]
async fn main() -> rheo::Result<()> {
    let mut args = std::env::args().skip(1);
    let dir = args.next().unwrap_or_else(|| "./live-data".to_owned());
    let rate: u64 = args.next().and_then(|r| r.parse().ok()).unwrap_or(200).clamp(1, 100_000);
    let seconds: Option<u64> = args.next().and_then(|s| s.parse().ok());
    let rheo = Rheo::open(&format!("native:{dir}")).await?;
    rheo.ensure_stream("orders", StreamOptions::new().partitions(4)).await?;
    rheo.ensure_group("orders", "billing", GroupOptions::new().max_attempts(3)).await?;
    rheo.ensure_group("orders", "audit", GroupOptions::new()).await?;
    let billing = rheo.consumer("orders", "billing").concurrency(4).spawn(Billing).await?;
    let audit = rheo.consumer("orders", "audit").concurrency(1).spawn(Audit).await?;
    println!("live_service: {rate} orders/s into native:{dir} (Ctrl-C to stop)");

    let producer = {
        let rheo = rheo.clone();
        async move {
            let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / rate));
            for n in 0u64.. {
                tick.tick().await;
                let total = if n % 97 == 13 { -1 } else { i64::try_from(n % 500).unwrap_or(0) };
                let order =
                    json!({"type": "order_placed", "order": n, "customer": format!("c-{}", n % 37), "total": total});
                rheo.append("orders", &order, AppendOptions::new().key(format!("c-{}", n % 37))).await?;
            }
            Ok::<(), rheo::Error>(())
        }
    };
    let stop = async {
        match seconds {
            Some(s) => tokio::time::sleep(Duration::from_secs(s)).await,
            None => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    };
    tokio::select! {
        r = producer => r?,
        () = stop => {}
    }
    billing.shutdown().await?;
    audit.shutdown().await?;
    println!("live_service: stopped");
    Ok(())
}
