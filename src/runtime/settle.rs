//! The settler: one task that settles what many handler tasks decided,
//! coalescing acks into `ack_many` batches.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::mpsc;

use super::clip_reason;
use crate::client::Rheo;
use crate::error::Error;
use crate::model::lease::{LeaseRef, RetryOutcome};

/// A settle decided by a handler task.
#[derive(Debug)]
pub(crate) struct SettleOp {
    pub(crate) lease: LeaseRef,
    pub(crate) kind: SettleKind,
    /// The consumer's demand slot: released once the settle is done, so a
    /// queued settle still counts against `max_demand`.
    pub(crate) slot: Option<tokio::sync::OwnedSemaphorePermit>,
}

/// What to do with the lease.
#[derive(Debug)]
pub(crate) enum SettleKind {
    Ack,
    Retry(String, Option<Duration>),
    Reject(String),
}

/// Counters shared by the fetch loop, the handler tasks and the settler.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub(crate) fetched: AtomicU64,
    pub(crate) acked: AtomicU64,
    pub(crate) retried: AtomicU64,
    pub(crate) dead_lettered: AtomicU64,
    pub(crate) panicked: AtomicU64,
    pub(crate) lost: AtomicU64,
    pub(crate) left_to_expiry: AtomicU64,
    pub(crate) fetch_errors: AtomicU64,
    pub(crate) ack_batches: AtomicU64,
    pub(crate) damaged: AtomicU64,
    /// Settles queued and not yet done (not a reported count).
    pub(crate) queued: AtomicU64,
}

impl Stats {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// What the runtime does after a settle call failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The lease no longer holds the delivery: drop it.
    Stale,
    /// Unknown outcome or backend unreachable: leave it to lease expiry.
    LeaveToExpiry,
    /// The call definitely did nothing: nack it (or leave it if a nack failed).
    Definite,
}

pub(crate) fn classify(e: &Error) -> Failure {
    if e.is_stale_lease() {
        Failure::Stale
    } else if e.is_transient() {
        Failure::LeaveToExpiry
    } else {
        Failure::Definite
    }
}

/// Runs until every sender is dropped and the channel is empty.
pub(crate) async fn run_settler(rheo: Rheo, mut rx: mpsc::Receiver<SettleOp>, stats: Arc<Stats>, batch_max: usize) {
    let mut buf = Vec::with_capacity(batch_max);
    loop {
        buf.clear();
        if rx.recv_many(&mut buf, batch_max).await == 0 {
            return;
        }
        let mut acks = Vec::new();
        let mut slots = Vec::new();
        for op in buf.drain(..) {
            slots.push(op.slot);
            match op.kind {
                SettleKind::Ack => acks.push(op.lease),
                SettleKind::Retry(reason, delay) => settle_retry(&rheo, &stats, &op.lease, &reason, delay).await,
                SettleKind::Reject(reason) => settle_reject(&rheo, &stats, &op.lease, &reason).await,
            }
        }
        if !acks.is_empty() {
            settle_acks(&rheo, &stats, acks).await;
        }
        // Settled: the slots are free for new fetches.
        let n = slots.len() as u64;
        drop(slots);
        stats.queued.fetch_sub(n, std::sync::atomic::Ordering::AcqRel);
    }
}

async fn settle_acks(rheo: &Rheo, stats: &Stats, acks: Vec<LeaseRef>) {
    Stats::add(&stats.ack_batches, 1);
    match rheo.ack_many(acks.iter()).await {
        Ok(results) => {
            for (lease, r) in acks.iter().zip(results) {
                match r {
                    Ok(()) => Stats::add(&stats.acked, 1),
                    Err(e) => ack_failed(rheo, stats, lease, &e).await,
                }
            }
        }
        Err(e) => {
            for lease in &acks {
                ack_failed(rheo, stats, lease, &e).await;
            }
        }
    }
}

async fn ack_failed(rheo: &Rheo, stats: &Stats, lease: &LeaseRef, e: &Error) {
    match classify(e) {
        Failure::Stale => lost(stats, lease, "ack", e),
        Failure::LeaveToExpiry => left(stats, lease, "ack", e),
        Failure::Definite => {
            let reason = format!("ack_failed: {e}");
            settle_retry(rheo, stats, lease, &reason, None).await;
        }
    }
}

async fn settle_retry(rheo: &Rheo, stats: &Stats, lease: &LeaseRef, reason: &str, delay: Option<Duration>) {
    let reason = clip_reason(reason);
    let r = match delay {
        Some(d) => rheo.retry_after(lease, reason, d).await,
        None => rheo.retry(lease, reason).await,
    };
    match r {
        Ok(RetryOutcome::Scheduled { .. }) => Stats::add(&stats.retried, 1),
        Ok(RetryOutcome::DeadLettered) => Stats::add(&stats.dead_lettered, 1),
        Err(e) if classify(&e) == Failure::Stale => lost(stats, lease, "retry", &e),
        Err(e) => left(stats, lease, "retry", &e),
    }
}

async fn settle_reject(rheo: &Rheo, stats: &Stats, lease: &LeaseRef, reason: &str) {
    match rheo.reject(lease, clip_reason(reason)).await {
        Ok(()) => Stats::add(&stats.dead_lettered, 1),
        Err(e) if classify(&e) == Failure::Stale => lost(stats, lease, "reject", &e),
        Err(e) if classify(&e) == Failure::Definite => {
            // A definite failure changed nothing: give the delivery back so it
            // is rejected on a later attempt instead of waiting for expiry.
            let reason = format!("reject_failed: {e}");
            settle_retry(rheo, stats, lease, &reason, None).await;
        }
        Err(e) => left(stats, lease, "reject", &e),
    }
}

fn lost(stats: &Stats, lease: &LeaseRef, op: &str, e: &Error) {
    Stats::add(&stats.lost, 1);
    tracing::debug!(stream = %lease.stream, group = %lease.group, partition = lease.partition,
        sequence = lease.sequence, "{op}: lease lost, dropped: {e}");
}

fn left(stats: &Stats, lease: &LeaseRef, op: &str, e: &Error) {
    Stats::add(&stats.left_to_expiry, 1);
    tracing::warn!(stream = %lease.stream, group = %lease.group, partition = lease.partition,
        sequence = lease.sequence, "{op} failed, left to lease expiry: {e}");
}
