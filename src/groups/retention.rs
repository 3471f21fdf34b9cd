//! The retention rules every backend that keeps group state in process
//! shares: where a partition's new log start goes, and moving the groups
//! behind it (`docs/semantics.md`, "Retention").

use super::GroupState;
use crate::model::retention::{GroupSkip, RetentionPolicy, RetentionReport};

/// The first sequence of partition `p` the groups' interest keeps: the
/// lowest `frontier + 1` over the groups consuming `p`; None when no group
/// consumes it.
pub(crate) fn interest_start<'a>(groups: impl IntoIterator<Item = &'a GroupState>, p: u32) -> Option<u64> {
    groups.into_iter().filter_map(|g| g.frontier(p)).min().map(|f| f.saturating_add(1))
}

/// The new log start of a partition: `limits_start` is the first sequence
/// the limits keep, `interest` what [`interest_start`] says. Under
/// `Limits` the limits alone decide; under `Interest` what every group
/// settled goes too, and the limits stay a ceiling (the second value is
/// true when they cut into what some group had not settled). A partition
/// no group consumes keeps everything within the limits.
pub(crate) fn new_start(policy: RetentionPolicy, limits_start: u64, interest: Option<u64>) -> (u64, bool) {
    match (policy, interest) {
        (RetentionPolicy::Interest, Some(i)) => (limits_start.max(i), limits_start > i),
        _ => (limits_start, false),
    }
}

/// Moves every group behind `start` in partition `p` to it (see
/// [`GroupState::drop_before`]), recording who skipped what in `report`.
pub(crate) fn move_groups<'a>(
    groups: impl IntoIterator<Item = &'a mut GroupState>,
    p: u32,
    start: u64,
    report: &mut RetentionReport,
) {
    for g in groups {
        let skipped = g.drop_before(p, start);
        if skipped > 0 {
            report.skipped.push(GroupSkip { group: g.summary.name.clone(), partition: p, skipped });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interest_keeps_what_some_group_has_not_settled_within_the_ceiling() {
        assert_eq!(new_start(RetentionPolicy::Limits, 5, Some(2)), (5, false));
        assert_eq!(new_start(RetentionPolicy::Interest, 1, Some(4)), (4, false));
        assert_eq!(new_start(RetentionPolicy::Interest, 6, Some(4)), (6, true));
        assert_eq!(new_start(RetentionPolicy::Interest, 3, None), (3, false));
    }
}
