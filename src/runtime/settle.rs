//! Settling an [`Outcome`]: the one settle call, and the settler — one task
//! that settles what a consumer's handler workers decided, coalescing acks
//! into `ack_many` batches.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::mpsc;

use super::{Outcome, Settled, StreamLease, clip_reason};
use crate::client::Rheo;
use crate::error::{Error, Result};
use crate::model::lease::{LeaseRef, RetryOutcome};
use crate::model::limits::MAX_LEASE;

/// A settle decided by a handler worker: the lease (which keeps its demand
/// slot, and its renewal, until the settle is done) and what to do.
#[derive(Debug)]
pub(crate) struct SettleOp {
    pub(crate) lease: StreamLease,
    pub(crate) outcome: Outcome,
}

/// Settles one lease as `outcome` says: the one settle call behind
/// [`StreamLease::settle`] and the consumer's retries and rejects.
pub(crate) async fn settle(rheo: &Rheo, lease: &LeaseRef, outcome: &Outcome) -> Result<Settled> {
    let retried = |r: RetryOutcome| match r {
        RetryOutcome::Scheduled { available_at } => Settled::Retried { available_at },
        RetryOutcome::DeadLettered => Settled::DeadLettered,
    };
    match outcome {
        Outcome::Ack => rheo.ack(lease).await.map(|()| Settled::Acked),
        Outcome::Retry(reason) => rheo.retry(lease, clip_reason(reason)).await.map(retried),
        Outcome::RetryAfter(reason, delay) => {
            rheo.retry_after(lease, clip_reason(reason), (*delay).min(MAX_LEASE)).await.map(retried)
        }
        Outcome::Reject(reason) => rheo.reject(lease, clip_reason(reason)).await.map(|()| Settled::DeadLettered),
    }
}

/// Counters shared by the fetch loop, the handler workers and the settler.
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

/// Runs until every sender is dropped and the channel is empty. Spawn it
/// inside [`keeping_the_worker_free`](crate::backend::keeping_the_worker_free):
/// handlers share its worker, and a sync must not hold them up (on
/// `native:`, the commit thread syncs while the next batch is handled).
pub(crate) async fn run_settler(rheo: Rheo, mut rx: mpsc::Receiver<SettleOp>, stats: Arc<Stats>, batch_max: usize) {
    let mut buf = Vec::with_capacity(batch_max);
    loop {
        buf.clear();
        if rx.recv_many(&mut buf, batch_max).await == 0 {
            return;
        }
        let mut acks = Vec::new();
        let mut held = Vec::new();
        let n = buf.len() as u64;
        for op in buf.drain(..) {
            let lease = op.lease.to_ref();
            match op.outcome {
                Outcome::Ack => {
                    acks.push(lease);
                    held.push(op.lease);
                }
                outcome => {
                    settle_other(&rheo, &stats, &lease, outcome).await;
                    // Settled: its slot is free, its renewal stops.
                    drop(op.lease);
                }
            }
        }
        if !acks.is_empty() {
            settle_acks(&rheo, &stats, acks).await;
        }
        drop(held);
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
                    Err(e) => failed(rheo, stats, lease, "ack", &e).await,
                }
            }
        }
        Err(e) => {
            for lease in &acks {
                failed(rheo, stats, lease, "ack", &e).await;
            }
        }
    }
}

/// A retry or a reject.
async fn settle_other(rheo: &Rheo, stats: &Stats, lease: &LeaseRef, outcome: Outcome) {
    let op = if matches!(outcome, Outcome::Reject(_)) { "reject" } else { "retry" };
    match settle(rheo, lease, &outcome).await {
        Ok(Settled::Retried { .. }) => Stats::add(&stats.retried, 1),
        Ok(_) => Stats::add(&stats.dead_lettered, 1),
        Err(e) => failed(rheo, stats, lease, op, &e).await,
    }
}

/// After a failed settle: a lost lease is dropped, an unknown outcome left
/// to lease expiry; a definite failure of an ack or a reject changed
/// nothing, so the delivery is given back (and handled again, or rejected
/// on a later attempt) instead of waiting for expiry.
async fn failed(rheo: &Rheo, stats: &Stats, lease: &LeaseRef, op: &str, e: &Error) {
    match classify(e) {
        Failure::Stale => lost(stats, lease, op, e),
        Failure::Definite if op != "retry" => {
            let reason = format!("{op}_failed: {e}");
            Box::pin(settle_other(rheo, stats, lease, Outcome::Retry(reason))).await;
        }
        _ => left(stats, lease, op, e),
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
