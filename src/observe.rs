//! Metrics, through the `metrics` facade: install any recorder (Prometheus,
//! StatsD, ...) and these appear; without one they cost next to nothing.
//! Names and labels are documented in `docs/observability.md`.

use crate::model::group::{GroupInfo, Lag};
use crate::model::lease::Lease;

/// Events appended (counter; label `stream`).
pub const APPENDED: &str = "rheo_events_appended_total";
/// Deliveries leased by `fetch` (counter; `stream`, `group`).
pub const LEASED: &str = "rheo_deliveries_leased_total";
/// Leased deliveries that were not the first attempt (counter; `stream`, `group`).
pub const REDELIVERED: &str = "rheo_deliveries_redelivered_total";
/// Deliveries acknowledged (counter; `stream`, `group`).
pub const ACKED: &str = "rheo_deliveries_acked_total";
/// Deliveries given back for a retry (counter; `stream`, `group`).
pub const RETRIED: &str = "rheo_deliveries_retried_total";
/// Deliveries dead-lettered, by `reject` or out of attempts (counter; `stream`, `group`).
pub const DEAD_LETTERED: &str = "rheo_deliveries_dead_lettered_total";
/// Due positions a fetch could not deliver because their stored records
/// can't be read (counter; `stream`, `group`): counted at every fetch that
/// meets them, so a steady rate means a consumer is stuck on damage that an
/// operator must skip or restore.
pub const DAMAGED: &str = "rheo_damaged_reads_total";
/// Lag of a partition as last read by `lag`/`group_info` (gauge; `stream`, `group`, `partition`).
pub const LAG: &str = "rheo_group_lag";
/// Unsettled leased deliveries as last read by `group_info` (gauge; `stream`, `group`).
pub const INFLIGHT: &str = "rheo_group_inflight";

/// Events retention dropped (counter; `stream`).
pub const RETENTION_DROPPED: &str = "rheo_retention_dropped_events_total";
/// Events retention dropped before a group settled them (counter; `stream`, `group`).
pub const RETENTION_SKIPPED: &str = "rheo_retention_skipped_events_total";

/// Round trips to a database server: statements, and a transaction's
/// `BEGIN` and `COMMIT` (counter; label `backend`). Divided by the events
/// a workload moved, it is a figure that does not depend on the machine:
/// `rheo bench` reports it per event.
pub const ROUND_TRIPS: &str = "rheo_backend_round_trips_total";

/// One round trip to a database server (see [`ROUND_TRIPS`]).
#[cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]
pub(crate) fn round_trip(backend: &'static str) {
    metrics::counter!(ROUND_TRIPS, "backend" => backend).increment(1);
}

fn sg(stream: &str, group: &str) -> [(&'static str, String); 2] {
    [("stream", stream.to_owned()), ("group", group.to_owned())]
}

/// The hot paths' counters (`append`, `fetch`, settles) by name, stream and
/// group, with their keys built once per thread: counting an event then
/// allocates nothing. A key does not depend on the recorder (which is
/// looked up at each count, so local recorders see these too).
mod hot {
    use std::cell::RefCell;
    use std::sync::Arc;

    use metrics::{Key, Label, Level, Metadata};

    /// Entries kept per thread; the oldest goes first.
    const ENTRIES: usize = 64;

    static METADATA: Metadata<'static> = Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

    struct Entry {
        name: &'static str,
        stream: Arc<str>,
        group: Option<Arc<str>>,
        key: Key,
    }

    thread_local! {
        static KEYS: RefCell<Vec<Entry>> = const { RefCell::new(Vec::new()) };
    }

    /// A new entry for (`name`, `stream`, `group`).
    fn entry(name: &'static str, stream: &str, group: Option<&str>) -> Entry {
        let stream: Arc<str> = Arc::from(stream);
        let group: Option<Arc<str>> = group.map(Arc::from);
        let mut labels = vec![Label::new("stream", stream.clone())];
        if let Some(g) = &group {
            labels.push(Label::new("group", g.clone()));
        }
        Entry { name, stream, group, key: Key::from_parts(name, labels) }
    }

    fn increment(e: &Entry, n: u64) {
        if n > 0 {
            metrics::with_recorder(|r| r.register_counter(&e.key, &METADATA).increment(n));
        }
    }

    /// Adds `n` to the counter `name` of `stream` (and `group`); answers
    /// the stream's name shared (what the appended events hold).
    pub(super) fn count(name: &'static str, stream: &str, group: Option<&str>, n: u64) -> Arc<str> {
        let cached = KEYS.try_with(|keys| {
            // Busy (a recorder counting from inside a count) or gone (a
            // thread being torn down): the count goes on uncached, below.
            let mut keys = keys.try_borrow_mut().ok()?;
            let found = keys.iter().position(|e| e.name == name && &*e.stream == stream && e.group.as_deref() == group);
            let i = match found {
                Some(i) => i,
                None => {
                    if keys.len() == ENTRIES {
                        keys.remove(0);
                    }
                    keys.push(entry(name, stream, group));
                    keys.len() - 1
                }
            };
            increment(&keys[i], n);
            Some(keys[i].stream.clone())
        });
        match cached {
            Ok(Some(shared)) => shared,
            _ => {
                let e = entry(name, stream, group);
                increment(&e, n);
                e.stream
            }
        }
    }
}

/// Counts `n` events appended to `stream`; answers the stream's name as
/// the appended events share it.
pub(crate) fn appended(stream: &str, n: usize) -> std::sync::Arc<str> {
    hot::count(APPENDED, stream, None, n as u64)
}

pub(crate) fn leased(stream: &str, group: &str, leases: &[Lease]) {
    if leases.is_empty() {
        return;
    }
    hot::count(LEASED, stream, Some(group), leases.len() as u64);
    let again = leases.iter().filter(|l| l.attempt > 1).count() as u64;
    if again > 0 {
        hot::count(REDELIVERED, stream, Some(group), again);
    }
}

pub(crate) fn damaged(group: &str, damaged: &[crate::model::damage::Damage]) {
    if let Some(d) = damaged.first() {
        metrics::counter!(DAMAGED, &sg(&d.stream, group)).increment(damaged.len() as u64);
    }
}

pub(crate) fn settled(name: &'static str, stream: &str, group: &str, n: usize) {
    if n > 0 {
        hot::count(name, stream, Some(group), n as u64);
    }
}

pub(crate) fn lag(lag: &Lag) {
    for p in &lag.partitions {
        let labels =
            [("stream", lag.stream.clone()), ("group", lag.group.clone()), ("partition", p.partition.to_string())];
        #[allow(clippy::cast_precision_loss)] // a gauge is an f64
        metrics::gauge!(LAG, &labels).set(p.lag as f64);
    }
}

pub(crate) fn group_info(info: &GroupInfo) {
    lag(&info.lag);
    #[allow(clippy::cast_precision_loss)]
    metrics::gauge!(INFLIGHT, &sg(&info.lag.stream, &info.lag.group)).set(info.inflight as f64);
}

/// Counts what a retention pass dropped and skipped (a backend's background
/// passes report here too).
pub(crate) fn retention(report: &crate::model::retention::RetentionReport) {
    let dropped = report.events_dropped();
    if dropped > 0 {
        metrics::counter!(RETENTION_DROPPED, "stream" => report.stream.clone()).increment(dropped);
    }
    for s in report.skipped.iter().filter(|s| s.skipped > 0) {
        metrics::counter!(RETENTION_SKIPPED, &sg(&report.stream, &s.group)).increment(s.skipped);
    }
    if report.ceiling_hit {
        tracing::warn!(stream = %report.stream, "interest retention hit its limits: events some group had not settled were dropped");
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};

    /// Adds every counter into one total, and counts once more from inside
    /// its registration of `ACKED` (as a recorder that itself reports
    /// through code counting here could).
    struct Reentrant(Arc<AtomicU64>);

    impl Recorder for Reentrant {
        fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
            if key.name() == super::ACKED {
                super::hot::count(super::RETRIED, "s", Some("g"), 1);
            }
            Counter::from_arc(self.0.clone())
        }
        fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
            Gauge::noop()
        }
        fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
            Histogram::noop()
        }
    }

    #[test]
    fn a_count_made_while_counting_is_counted_uncached() {
        let total = Arc::new(AtomicU64::new(0));
        let recorder = Reentrant(total.clone());
        metrics::with_local_recorder(&recorder, || {
            let shared = super::hot::count(super::ACKED, "s", Some("g"), 2);
            assert_eq!(&*shared, "s");
            // Cached now: counted again, the same way.
            super::hot::count(super::ACKED, "s", Some("g"), 2);
        });
        assert_eq!(total.load(Ordering::Relaxed), 6, "2 acked and 1 retried, twice");
    }
}
