//! `rheo demo`: the whole idea in one narrated run.

use std::io::Write;
use std::time::Duration;

use rheo::{
    AppendOptions, DeadLetterOptions, FetchOptions, GroupOptions, Query, ReplayOptions, RetryOutcome, Rheo,
    StreamOptions,
};
use serde_json::json;

/// Errors of the demo: a Rheo error or a failed write to the terminal.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error(transparent)]
    Rheo(#[from] rheo::Error),
    #[error("writing output: {0}")]
    Io(#[from] std::io::Error),
}

const CUSTOMERS: [&str; 8] = ["ada", "brian", "chen", "dora", "emil", "fatou", "grace", "hiro"];
/// The order whose handler always fails in the billing group.
const POISON_ORDER: u64 = 7;

/// What the billing consumer reads of an order event: decoded straight
/// from the stored payload.
#[derive(serde::Deserialize)]
struct Order {
    order: u64,
    total: u64,
}

/// Runs the scenario on `backend`, narrating to `out`.
pub async fn run(backend: &str, out: &mut impl Write) -> Result<(), DemoError> {
    let rheo = Rheo::open(backend).await?;
    writeln!(out, "Rheo demo on backend `{backend}`\n")?;
    // A durable backend keeps earlier runs: this one gets its own stream.
    let is_run = |name: &str| {
        name == "orders"
            || name.strip_prefix("orders-").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    let earlier = rheo.list_streams().await?.iter().filter(|s| is_run(&s.name)).count();
    let stream = if earlier == 0 { "orders".to_owned() } else { format!("orders-{}", earlier + 1) };
    let stream = stream.as_str();
    if earlier > 0 {
        writeln!(
            out,
            "This data directory still holds {earlier} earlier demo run(s), events and group positions included; this run uses stream `{stream}`.\n"
        )?;
    }

    writeln!(out, "1. A stream of orders, split into 4 partitions; a customer's orders share a partition.")?;
    rheo.create_stream(stream, StreamOptions::new().partitions(4)).await?;
    rheo.create_group(stream, "billing", GroupOptions::new().max_attempts(3)).await?;
    rheo.create_group(stream, "analytics", GroupOptions::new()).await?;
    writeln!(out, "   Two consumer groups, `billing` (max 3 attempts) and `analytics`, each get every event.\n")?;

    writeln!(out, "2. Producers append 20 orders, keyed by customer:")?;
    let payloads: Vec<_> = (1..=20u64)
        .map(|n| {
            let customer = CUSTOMERS[usize::try_from(n).unwrap_or(0) % CUSTOMERS.len()];
            (
                json!({"type": "order_placed", "order": n, "customer": customer, "total": n * 15}),
                AppendOptions::new().key(customer).producer("checkout"),
            )
        })
        .collect();
    let events = rheo.append_batch_with(stream, payloads).await?;
    for customer in CUSTOMERS {
        let e = events
            .iter()
            .find(|e| e.key() == Some(customer))
            .ok_or_else(|| rheo::Error::failed("demo", format!("no event for customer {customer}")))?;
        let n = events.iter().filter(|e| e.key() == Some(customer)).count();
        writeln!(out, "   {customer:<6} -> partition {} ({n} orders)", e.partition())?;
    }
    print_lag(&rheo, stream, "billing", out).await?;

    writeln!(out, "\n3. The billing consumer works through its deliveries; order {POISON_ORDER} always fails.")?;
    loop {
        let leases = rheo.fetch(stream, "billing", FetchOptions::new().limit(8).consumer("billing-1")).await?;
        if leases.is_empty() {
            break;
        }
        for lease in leases {
            let order = lease.event.payload().decode::<Order>()?.order;
            if order == POISON_ORDER {
                match rheo.retry(&lease, "card declined").await? {
                    RetryOutcome::Scheduled { .. } => {
                        writeln!(out, "   order {order}: attempt {} failed, retrying", lease.attempt)?
                    }
                    RetryOutcome::DeadLettered => writeln!(
                        out,
                        "   order {order}: attempt {} failed, out of attempts: dead-lettered",
                        lease.attempt
                    )?,
                }
            } else {
                rheo.ack(&lease).await?;
            }
        }
    }
    writeln!(out, "   billed the other 19 orders.")?;
    print_lag(&rheo, stream, "billing", out).await?;
    for dl in rheo.dead_letters(stream, "billing", DeadLetterOptions::new()).await? {
        let order = match &dl.event {
            Some(e) => e.payload().decode::<Order>()?.order.to_string(),
            None => "?".to_owned(),
        };
        writeln!(
            out,
            "   dead letter: order {order} (partition {} #{}) after {} attempts: {}",
            dl.partition, dl.sequence, dl.attempts, dl.reason
        )?;
    }

    writeln!(out, "\n4. Analytics is independent: it still has everything to read.")?;
    print_lag(&rheo, stream, "analytics", out).await?;
    let mut seen = 0;
    loop {
        let leases = rheo.fetch(stream, "analytics", FetchOptions::new().limit(100)).await?;
        if leases.is_empty() {
            break;
        }
        seen += leases.len();
        rheo.ack_many(&leases).await?.into_iter().collect::<Result<Vec<()>, _>>()?;
    }
    writeln!(out, "   analytics acknowledged {seen} events in batches.")?;
    print_lag(&rheo, stream, "analytics", out).await?;

    writeln!(out, "\n5. History stays queryable: chen's orders over 100, newest first.")?;
    let q = Query::new(stream).eq("customer", "chen").gt("total", 100).descending().limit(10);
    for e in rheo.query(&q).await? {
        let o: Order = e.payload().decode()?;
        writeln!(out, "   order {} total {} (partition {} #{})", o.order, o.total, e.partition(), e.sequence())?;
    }

    writeln!(out, "\n6. The card issue is fixed: replay the dead-lettered order to billing.")?;
    let replay = Query::new(stream).eq("order", POISON_ORDER);
    let reopened = rheo.replay(stream, "billing", ReplayOptions::query(replay)).await?;
    writeln!(out, "   reopened {reopened} delivery")?;
    print_lag(&rheo, stream, "billing", out).await?;
    for lease in rheo.fetch(stream, "billing", FetchOptions::new()).await? {
        writeln!(
            out,
            "   order {} billed on attempt {}",
            lease.event.payload().decode::<Order>()?.order,
            lease.attempt
        )?;
        rheo.ack(&lease).await?;
    }
    print_lag(&rheo, stream, "billing", out).await?;
    let info = rheo.group_info(stream, "billing").await?;
    writeln!(out, "   billing: {} in flight, {} dead letters.", info.inflight, info.dead_letters)?;
    scheduled(&rheo, stream, out).await?;
    keyed(&rheo, stream, out).await?;
    writeln!(out, "\nDone. Every event is still in the log; groups only move their own positions.")?;
    if let Some(dir) = backend.strip_prefix("native:") {
        writeln!(
            out,
            "It is all on disk in {}: run the demo again and this run's stream is still there, acks and dead letters included.",
            dir.split('?').next().unwrap_or(dir)
        )?;
    }
    Ok(())
}

/// Step 7: a reminder scheduled a second ahead, set aside by the group
/// until then (on a backend that schedules).
async fn scheduled(rheo: &Rheo, stream: &str, out: &mut impl Write) -> Result<(), DemoError> {
    writeln!(out, "\n7. A payment reminder for order {POISON_ORDER}, scheduled one second from now.")?;
    if !rheo.capabilities().scheduled_delivery {
        writeln!(out, "   (backend `{}` does not schedule deliveries yet: skipped)", rheo.capabilities().backend)?;
        return Ok(());
    }
    let reminders = format!("{stream}-reminders");
    rheo.create_stream(&reminders, StreamOptions::new()).await?;
    rheo.create_group(&reminders, "mailer", GroupOptions::new()).await?;
    let payload = json!({"type": "payment_reminder", "order": POISON_ORDER});
    let e = rheo.append(&reminders, &payload, AppendOptions::new().delay(Duration::from_secs(1))).await?;
    let due = e.deliver_at().unwrap_or(e.timestamp());
    writeln!(out, "   stored at once as {reminders} #{}, due at {due}.", e.sequence())?;
    let early = rheo.fetch(&reminders, "mailer", FetchOptions::new()).await?;
    let info = rheo.group_info(&reminders, "mailer").await?;
    writeln!(
        out,
        "   the mailer fetches now: {} delivered, {} set aside until its time (lag {}).",
        early.len(),
        info.scheduled,
        info.lag.total
    )?;
    let started = std::time::Instant::now();
    let lease = loop {
        let leases = rheo.fetch(&reminders, "mailer", FetchOptions::new()).await?;
        if let Some(lease) = leases.into_iter().next() {
            break lease;
        }
        if started.elapsed() > Duration::from_secs(30) {
            return Err(rheo::Error::failed("demo", "the scheduled reminder was not delivered within 30 s").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    writeln!(
        out,
        "   {:.1} s later it is due: delivered on attempt {} and acknowledged.",
        started.elapsed().as_secs_f64(),
        lease.attempt
    )?;
    rheo.ack(&lease).await?;
    Ok(())
}

/// Step 8: a group ordered by key over the orders: customers in parallel,
/// each customer's orders one at a time and in order (on a backend that
/// orders by key).
async fn keyed(rheo: &Rheo, stream: &str, out: &mut impl Write) -> Result<(), DemoError> {
    writeln!(out, "\n8. A `shipping` group ordered by customer: customers in parallel, a customer's orders in order.")?;
    if !rheo.capabilities().ordered_by_key {
        writeln!(out, "   (backend `{}` does not order by key yet: skipped)", rheo.capabilities().backend)?;
        return Ok(());
    }
    rheo.create_group(stream, "shipping", GroupOptions::new().ordered_by_key()).await?;
    let mut last: std::collections::BTreeMap<String, u64> = std::collections::BTreeMap::new();
    let (mut fetches, mut shipped, mut widest) = (0u32, 0usize, 0usize);
    loop {
        let leases = rheo.fetch(stream, "shipping", FetchOptions::new().limit(100)).await?;
        if leases.is_empty() {
            break;
        }
        fetches += 1;
        widest = widest.max(leases.len());
        for lease in &leases {
            let customer = lease.event.key().unwrap_or_default().to_owned();
            let order = lease.event.field("order").and_then(|v| v.as_u64()).unwrap_or_default();
            if last.get(&customer).is_some_and(|&before| before >= order) {
                return Err(rheo::Error::failed("demo", format!("{customer}'s order {order} came out of order")).into());
            }
            last.insert(customer, order);
        }
        shipped += leases.len();
        rheo.ack_many(leases.iter()).await?;
        if fetches > 100 {
            return Err(rheo::Error::failed("demo", "the shipping group did not drain in 100 fetches").into());
        }
    }
    writeln!(
        out,
        "   {shipped} orders shipped in {fetches} fetches, at most {widest} at once (one per customer), each customer's in order."
    )?;
    Ok(())
}

async fn print_lag(rheo: &Rheo, stream: &str, group: &str, out: &mut impl Write) -> Result<(), DemoError> {
    let lag = rheo.lag(stream, group).await?;
    let per: Vec<String> = lag.partitions.iter().map(|p| format!("p{}={}", p.partition, p.lag)).collect();
    writeln!(out, "   lag of {group}: {} ({})", lag.total, per.join(" "))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn demo_runs_to_the_end_and_drains_every_group() {
        let mut out = Vec::new();
        run("memory:", &mut out).await.expect("demo succeeds");
        let text = String::from_utf8(out).expect("utf-8");
        assert!(text.contains("dead-lettered"), "{text}");
        assert!(text.contains("analytics acknowledged 20 events"), "{text}");
        assert!(text.contains("reopened 1 delivery"), "{text}");
        assert!(text.contains("billing: 0 in flight, 0 dead letters."), "{text}");
        assert!(text.contains("0 delivered, 1 set aside until its time (lag 1)"), "{text}");
        assert!(text.contains("it is due: delivered on attempt 1 and acknowledged"), "{text}");
        assert!(text.contains("20 orders shipped in 3 fetches, at most 8 at once (one per customer)"), "{text}");
        assert!(text.trim_end().ends_with("only move their own positions."), "{text}");
    }

    /// The demo on SQLite (a temporary file), twice: the command works on
    /// a database backend as on the embedded one.
    #[tokio::test]
    async fn demo_runs_on_sqlite_and_again_on_the_same_file() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let url = format!("sqlite:{}", dir.path().join("demo.db").display());
        for run_no in 0..2 {
            let mut out = Vec::new();
            run(&url, &mut out).await.expect("demo succeeds on sqlite");
            let text = String::from_utf8(out).expect("utf-8");
            assert!(text.contains("reopened 1 delivery"), "run {run_no}: {text}");
            assert!(text.contains("billing: 0 in flight, 0 dead letters."), "run {run_no}: {text}");
            assert!(text.contains("it is due: delivered on attempt 1 and acknowledged"), "run {run_no}: {text}");
            assert!(text.trim_end().ends_with("only move their own positions."), "run {run_no}: {text}");
        }
        let rheo = Rheo::open(&url).await.expect("reopen");
        // Each run's orders and its reminders (step 7: SQLite schedules).
        assert!(rheo.capabilities().scheduled_delivery);
        assert_eq!(rheo.list_streams().await.expect("streams").len(), 4, "each run has its own streams");
        let info = rheo.group_info("orders", "billing").await.expect("first run's group");
        assert_eq!((info.lag.total, info.inflight, info.dead_letters), (0, 0, 0));
    }

    #[tokio::test]
    async fn demo_runs_twice_on_the_native_default_and_keeps_the_first_run() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let url = format!("native:{}", dir.path().display());
        let mut first = Vec::new();
        run(&url, &mut first).await.expect("first run");
        let mut second = Vec::new();
        run(&url, &mut second).await.expect("second run");
        let text = String::from_utf8(second).expect("utf-8");
        assert!(text.contains("still holds 1 earlier demo run"), "{text}");
        assert!(text.contains("uses stream `orders-2`"), "{text}");
        assert!(text.contains("billing: 0 in flight, 0 dead letters."), "{text}");
        assert!(text.contains("20 orders shipped in 3 fetches, at most 8 at once"), "{text}");
        let rheo = Rheo::open(&url).await.expect("reopen");
        let info = rheo.group_info("orders", "billing").await.expect("first run's group");
        assert_eq!((info.lag.total, info.inflight, info.dead_letters), (0, 0, 0));
        // Each run's orders and its reminders.
        assert_eq!(rheo.list_streams().await.expect("streams").len(), 4);
    }
}
