//! The storage engine measured without the `Rheo` facade
//! (`engine:DIR?durability=sync|batched|none`): appends go straight to
//! `Engine::append` and wait for its ticket, so a run with `native:` beside
//! it shows what the facade costs ("vs native" in the report; issue 34).
//!
//! Each event is still prepared (its payload encoded, its id made) and
//! routed by key the way the facade routes it: only what the facade adds on
//! top of that is left out (its checks, building the returned events,
//! waking readers, the backend trait's hop). Only the append workloads run
//! here: consumer groups are the facade's.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rheo::engine::log::stream::Routed;
use rheo::engine::{Durability, Engine, EngineOptions};
use rheo::{NewEvent, Payload, partition_for_key};
use rheo_cli::error::CliError;

use super::workload::{Backlog, Item};

/// The URL scheme.
pub const SCHEME: &str = "engine:";

/// An engine opened on a directory.
#[derive(Clone)]
pub struct EngineStore {
    engine: Arc<Engine>,
    durability: Durability,
}

impl std::fmt::Debug for EngineStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineStore").field("durability", &self.durability).finish_non_exhaustive()
    }
}

/// The directory of an `engine:` URL.
pub fn dir_of(url: &str) -> Option<PathBuf> {
    let rest = url.strip_prefix(SCHEME)?;
    let path = rest.split('?').next().unwrap_or(rest);
    (!path.is_empty()).then(|| PathBuf::from(path))
}

impl EngineStore {
    /// Opens `engine:DIR[?durability=sync|batched|none]` (`sync` by
    /// default; `batched` syncs every 5 ms).
    pub fn open(url: &str) -> Result<EngineStore, CliError> {
        let dir = dir_of(url).ok_or_else(|| CliError::usage(format!("{url}: give a directory: engine:DIR")))?;
        let mut durability = Durability::Sync;
        if let Some((_, query)) = url.split_once('?') {
            for pair in query.split('&').filter(|p| !p.is_empty()) {
                durability = match pair {
                    "durability=sync" => Durability::Sync,
                    "durability=batched" => Durability::Batched { max_delay: Duration::from_millis(5) },
                    "durability=none" => Durability::None,
                    other => {
                        return Err(CliError::usage(format!(
                            "{url}: unknown option {other:?} (engine: takes durability=sync, batched or none)"
                        )));
                    }
                };
            }
        }
        let engine = Engine::open_dir(&dir, EngineOptions::default().durability(durability))?;
        Ok(EngineStore { engine: Arc::new(engine), durability })
    }

    /// Its name in the results.
    pub fn label(&self) -> String {
        let d = match self.durability {
            Durability::Sync => "sync",
            Durability::Batched { .. } => "batched",
            Durability::None => "none",
        };
        format!("engine (durability={d})")
    }

    /// A target on the case's streams.
    pub fn target(&self, streams: Arc<[Arc<str>]>) -> EngineTarget {
        EngineTarget { engine: self.engine.clone(), stream: streams[0].clone(), streams }
    }
}

/// What a case runs on at the engine level.
#[derive(Clone)]
pub struct EngineTarget {
    engine: Arc<Engine>,
    /// The stream a task works on now.
    pub stream: Arc<str>,
    /// Every stream of the case.
    pub streams: Arc<[Arc<str>]>,
}

impl std::fmt::Debug for EngineTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineTarget").field("stream", &self.stream).finish_non_exhaustive()
    }
}

impl EngineTarget {
    /// Creates the case's streams.
    pub fn setup(&self, partitions: u32) -> Result<(), CliError> {
        for s in self.streams.iter() {
            self.engine.create_stream(s, partitions, &[], 0)?;
        }
        Ok(())
    }

    /// Appends the items as one atomic batch and waits for its ticket.
    pub async fn append(&self, items: Vec<Item>) -> Result<(), CliError> {
        let stream = self.engine.stream(&self.stream)?;
        let count = stream.log.partition_count();
        let events: Vec<(u32, NewEvent)> = items
            .into_iter()
            .map(|item| {
                let partition = partition_for_key(&item.key, count);
                let (payload, opts) = item.options();
                (partition, NewEvent::prepare(Payload::from(payload), opts))
            })
            .collect();
        let ts = rheo::Timestamp::now().as_millis();
        let routed: Vec<Routed<'_>> =
            events.iter().map(|(partition, event)| Routed { partition: *partition, ts, event }).collect();
        let (_, ticket) = self.engine.append(&stream, &routed)?;
        ticket.resolved().await?;
        Ok(())
    }

    /// What the case's streams hold (no group: nothing is unsettled).
    pub fn backlog(&self) -> Result<Backlog, CliError> {
        let mut appended = 0;
        for s in self.streams.iter() {
            let stream = self.engine.stream(s)?;
            for p in 0..stream.log.partition_count() {
                appended += stream.log.partition(p)?.visible();
            }
        }
        Ok(Backlog { appended, unsettled: 0 })
    }
}
