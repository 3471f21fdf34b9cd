//! What the database backends (SQL and MongoDB) share: the group settings
//! only this crate keeps, and a group as loaded with its stream's high
//! watermarks.

use std::collections::BTreeMap;

use crate::error::Result;
use crate::model::group::{Backoff, GroupSummary, Lag, PartitionLag, check_partitions};
use crate::model::time::Timestamp;

/// The group settings only this crate keeps (the reference's group rows
/// have no place for them), stored as JSON beside the group.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct GroupSettings {
    /// The partitions the group consumes (None: all).
    #[serde(default)]
    pub partitions: Option<Vec<u32>>,
    /// The group's retry backoff.
    #[serde(default)]
    pub retry_backoff: Backoff,
}

/// Frontier and cursor of a partition from a group's maps (defaults: 0,
/// F + 1).
pub(crate) fn frontier_cursor(frontiers: &BTreeMap<u32, u64>, cursors: &BTreeMap<u32, u64>, p: u32) -> (u64, u64) {
    let f = frontiers.get(&p).copied().unwrap_or(0);
    let c = cursors.get(&p).copied().unwrap_or(f.saturating_add(1)).max(1);
    (f, c)
}

/// A group as loaded (without a lock), with its stream's high watermarks.
#[derive(Debug, Clone)]
pub(crate) struct GroupRow {
    pub count: u32,
    pub max_attempts: u32,
    pub settings: GroupSettings,
    pub cursors: BTreeMap<u32, u64>,
    pub frontiers: BTreeMap<u32, u64>,
    pub created_at: Timestamp,
    /// The stream's high watermarks, read with the group.
    pub hws: Vec<u64>,
}

impl GroupRow {
    pub fn hw(&self, p: u32) -> u64 {
        self.hws.get(p as usize).copied().unwrap_or(0)
    }

    pub fn partitions(&self) -> Vec<u32> {
        match &self.settings.partitions {
            Some(ps) => ps.clone(),
            None => (0..self.count).collect(),
        }
    }

    /// The group's partitions within `requested`, checking those exist.
    pub fn scope(&self, stream: &str, requested: Option<&[u32]>) -> Result<Vec<u32>> {
        if let Some(r) = requested {
            check_partitions(stream, r, self.count)?;
        }
        Ok(self.partitions().into_iter().filter(|p| requested.is_none_or(|r| r.contains(p))).collect())
    }

    pub fn summary(&self, name: &str) -> GroupSummary {
        GroupSummary {
            name: name.to_owned(),
            max_attempts: self.max_attempts,
            partitions: self.settings.partitions.clone(),
            created_at: self.created_at,
        }
    }

    /// Lag of the partitions in `scope`.
    pub fn lag(&self, stream: &str, group: &str, scope: &[u32]) -> Lag {
        let per = scope
            .iter()
            .map(|&p| PartitionLag::new(p, self.hw(p), self.frontiers.get(&p).copied().unwrap_or(0)))
            .collect();
        Lag::new(stream, group, per)
    }
}
