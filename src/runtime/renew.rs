//! The one lease renewer of the consumer runtime: the leases a managed
//! consumer or a [`LeaseStream`](crate::LeaseStream) holds, renewed together
//! by one task, one `renew_many` per batch and tick (so one round trip, or
//! one WAL sync on `native:`, however many are held).

use std::collections::HashMap;
use std::sync::Weak;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::renew_interval;
use super::settle::{Failure, classify};
use crate::client::Rheo;
use crate::model::lease::LeaseRef;
use crate::model::limits::MAX_BATCH_EVENTS;

/// A held lease, with where to say it was lost.
type Entry = (LeaseRef, oneshot::Sender<()>);

/// The leases held, under ids the holder keeps.
#[derive(Debug, Default)]
pub(crate) struct Renewals {
    held: parking_lot::Mutex<HashMap<u64, Entry>>,
    next: AtomicU64,
    /// Held by the renewer from its snapshot of `held` to the end of its
    /// renewals, and by a release (a lease given back at shutdown): a
    /// renewal that took the lease in its snapshot never lands after the
    /// release and extends it again.
    pub(crate) renewing: tokio::sync::Mutex<()>,
}

/// Says when a renewal found a held lease lost (see [`Renewals::insert`]).
#[derive(Debug)]
pub(crate) struct LostNotice(oneshot::Receiver<()>);

impl LostNotice {
    /// Resolves when a renewal says the lease is no longer held; never when
    /// the lease stopped being renewed for another reason (settled, dropped,
    /// or the renewer stopped).
    pub(crate) async fn lost(&mut self) {
        if (&mut self.0).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// True when a renewal has said the lease is no longer held.
    pub(crate) fn is_lost(&mut self) -> bool {
        self.0.try_recv().is_ok()
    }
}

/// A task aborted when its handle is dropped: the renewer of a lease
/// stream ends with the stream's last lease, not a tick later.
#[derive(Debug)]
pub(crate) struct AbortOnDrop(pub(crate) tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Renewals {
    /// Renews `lease` from now on until [`Renewals::remove`]; returns its
    /// id and the notice a renewal that finds it lost gives.
    pub(crate) fn insert(&self, lease: LeaseRef) -> (u64, LostNotice) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.held.lock().insert(id, (lease, tx));
        (id, LostNotice(rx))
    }

    /// Stops renewing the lease of `id`.
    pub(crate) fn remove(&self, id: u64) {
        self.held.lock().remove(&id);
    }

    /// A renewal found the lease of `id` lost: stop renewing it and tell
    /// its holder.
    fn lost(&self, id: u64) {
        if let Some((_, notice)) = self.held.lock().remove(&id) {
            // The holder may be gone: nothing to tell.
            let _ = notice.send(());
        }
    }
}

/// Renews every held lease every `lease / 2`, in batches of
/// `MAX_BATCH_EVENTS`, until the renewals are gone. A lease a renewal says
/// is no longer held stops being renewed (its holder is told, where it
/// asked to be); a failed call is retried well before the leases run out,
/// not a whole tick later.
pub(crate) async fn run_renewer(rheo: Rheo, renewals: Weak<Renewals>, lease: Duration, stream: String, group: String) {
    let every = renew_interval(lease);
    let soon = (lease / 8).max(Duration::from_millis(10));
    let mut ticks = tokio::time::interval_at(Instant::now() + every, every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let Some(renewals) = renewals.upgrade() else { return };
        let mut failed = false;
        {
            let _renewing = renewals.renewing.lock().await;
            let held: Vec<(u64, LeaseRef)> =
                renewals.held.lock().iter().map(|(id, (lease, _))| (*id, lease.clone())).collect();
            for batch in held.chunks(MAX_BATCH_EVENTS) {
                let results = match rheo.renew_many(batch.iter().map(|(_, l)| l), lease).await {
                    Ok(results) => results,
                    Err(e) => {
                        failed = true;
                        tracing::warn!(%stream, %group, leases = batch.len(), "renew failed, retrying in {soon:?}: {e}");
                        continue;
                    }
                };
                for ((id, held), r) in batch.iter().zip(results) {
                    match r {
                        Ok(_) => {}
                        Err(e) if classify(&e) == Failure::Stale => {
                            tracing::debug!(%stream, %group, sequence = held.sequence,
                                "renew: lease lost; its settle will say so: {e}");
                            renewals.lost(*id);
                        }
                        Err(e) => {
                            failed = true;
                            tracing::warn!(%stream, %group, sequence = held.sequence,
                                "renew failed, retrying in {soon:?}: {e}");
                        }
                    }
                }
            }
        }
        drop(renewals);
        if failed {
            tokio::time::sleep(soon).await;
            ticks.reset_immediately();
        }
    }
}
