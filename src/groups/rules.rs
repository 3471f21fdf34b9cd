//! The group rules that need no storage: whether a delivery has attempts
//! left, what a retry does, how long its backoff waits, and what a dead
//! letter's reason says. The group core (behind `memory:` and `native:`)
//! calls these, and so does every database backend, so that each rule is
//! written once and a backend only stores what they decide.

use std::time::Duration;

use crate::model::group::Backoff;
use crate::model::lease::RetryOutcome;
use crate::model::time::Timestamp;

/// The dead-letter reason of a delivery whose lease expired on its last
/// attempt (its consumer died holding it: a poison pill).
pub(crate) const EXPIRED_ON_LAST_ATTEMPT: &str = "max_attempts: lease expired";

/// True when a delivery claimed `attempt` times has no attempt left.
pub(crate) fn spent(attempt: u32, max_attempts: u32) -> bool {
    attempt >= max_attempts
}

/// What a retry does to a delivery claimed `attempt` times.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RetryDecision {
    /// Claimable again from `available_at`.
    Reschedule {
        /// When it becomes claimable.
        available_at: Timestamp,
    },
    /// Out of attempts: dead-lettered with this reason.
    DeadLetter {
        /// The dead letter's reason.
        reason: String,
    },
}

impl RetryDecision {
    /// What the caller of `retry` is told.
    pub(crate) fn outcome(&self) -> RetryOutcome {
        match self {
            RetryDecision::Reschedule { available_at } => RetryOutcome::Scheduled { available_at: *available_at },
            RetryDecision::DeadLetter { .. } => RetryOutcome::DeadLettered,
        }
    }
}

/// The retry rule: with attempts left, the delivery waits `delay` (None:
/// the group's backoff for this attempt) from `now`; on its last attempt it
/// is dead-lettered with reason `max_attempts: <reason>`.
pub(crate) fn retry(
    attempt: u32,
    max_attempts: u32,
    reason: &str,
    delay: Option<Duration>,
    backoff: &Backoff,
    now: Timestamp,
) -> RetryDecision {
    if spent(attempt, max_attempts) {
        return RetryDecision::DeadLetter { reason: format!("max_attempts: {reason}") };
    }
    let wait = delay.unwrap_or_else(|| backoff.delay(attempt));
    RetryDecision::Reschedule { available_at: now.saturating_add(wait) }
}

/// The dead-letter reason of a rejected delivery: the caller's, as given.
pub(crate) fn rejected(reason: &str) -> String {
    reason.to_owned()
}

/// The dead-letter reason of a position an operator skipped.
pub(crate) fn skipped(reason: &str) -> String {
    format!("skipped: {reason}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retry_reschedules_until_the_last_attempt_then_dead_letters() {
        let now = Timestamp::from_millis(1_000);
        let backoff = Backoff::Fixed(Duration::from_secs(2));
        assert_eq!(
            retry(1, 3, "busy", None, &backoff, now),
            RetryDecision::Reschedule { available_at: Timestamp::from_millis(3_000) }
        );
        assert_eq!(
            retry(2, 3, "busy", Some(Duration::from_millis(5)), &backoff, now),
            RetryDecision::Reschedule { available_at: Timestamp::from_millis(1_005) },
            "an explicit delay wins over the backoff"
        );
        let last = retry(3, 3, "busy", None, &backoff, now);
        assert_eq!(last, RetryDecision::DeadLetter { reason: "max_attempts: busy".into() });
        assert_eq!(last.outcome(), RetryOutcome::DeadLettered);
        assert!(spent(4, 3) && !spent(2, 3));
        assert_eq!(skipped("bad record"), "skipped: bad record");
        assert_eq!(rejected("no"), "no");
    }
}
