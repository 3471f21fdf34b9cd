//! The conformance suite: every rule of `docs/semantics.md` as a named case, run
//! against every backend.
//!
//! Each case is written once, as `pub async fn rule_name(f: Fixture)` in the
//! module of its area, and `conformance!` turns the list below into one
//! `#[tokio::test]` per backend and case: `cargo test --test conformance`
//! prints `memory::fetch_claims_in_partition_sequence_order`, and so on.
//! Adding a backend is one line in `common::backends!`; adding a case is a
//! function in its area plus one line in the list.
//!
//! Time is the fixture's manual clock: lease expiry and retry backoff are
//! tested by moving it, never by sleeping.

mod common;

/// Asserts that a `Result` is an error matching a pattern (with an optional
/// guard) and returns the error, so its message can be checked too.
macro_rules! assert_err {
    ($result:expr, $pattern:pat $(if $guard:expr)? $(,)?) => {{
        match $result {
            Err(err) => {
                assert!(matches!(err, $pattern $(if $guard)?), "expected {}, got {err:?}", stringify!($pattern));
                err
            }
            Ok(value) => panic!("expected {}, got Ok({value:?})", stringify!($pattern)),
        }
    }};
}

#[path = "conformance/append.rs"]
mod append;
#[path = "conformance/concurrency.rs"]
mod concurrency;
#[path = "conformance/dlq.rs"]
mod dlq;
#[path = "conformance/errors.rs"]
mod errors;
#[path = "conformance/fetch.rs"]
mod fetch;
#[path = "conformance/frontier_lag.rs"]
mod frontier_lag;
#[path = "conformance/groups.rs"]
mod groups;
#[path = "conformance/indexes.rs"]
mod indexes;
#[path = "conformance/keyed.rs"]
mod keyed;
#[path = "conformance/names.rs"]
mod names;
#[path = "conformance/ops_inspect.rs"]
mod ops_inspect;
#[path = "conformance/partitions.rs"]
mod partitions;
#[path = "conformance/query.rs"]
mod query;
#[path = "conformance/read.rs"]
mod read;
#[path = "conformance/replay.rs"]
mod replay;
#[path = "conformance/reset.rs"]
mod reset;
#[path = "conformance/retention.rs"]
mod retention;
#[path = "conformance/retry.rs"]
mod retry;
#[path = "conformance/scheduled.rs"]
mod scheduled;
#[path = "conformance/settle.rs"]
mod settle;
#[path = "conformance/skip.rs"]
mod skip;
#[path = "conformance/streams.rs"]
mod streams;
#[path = "conformance/support.rs"]
mod support;
#[path = "conformance/wakeups.rs"]
mod wakeups;

/// One test: the case `$area::$case` on a fresh fixture from `$factory`,
/// with the given test attributes.
macro_rules! one_case {
    ($(#[$attr:meta])*; $factory:path; $area:ident :: $case:ident) => {
        $(#[$attr])*
        async fn $case() {
            let factory: crate::common::Factory = $factory;
            crate::$area::$case(factory().await).await;
        }
    };
}

/// One `#[tokio::test]` per case. Cases under `concurrent` run on a
/// multi-threaded runtime. In `log_only` mode the group cases are generated
/// as ignored tests, so `cargo test` lists each one as not run for that
/// backend instead of hiding it.
macro_rules! cases {
    (full; $factory:path;
     log: [$($larea:ident :: $lcase:ident),* $(,)?];
     groups: [$($garea:ident :: $gcase:ident),* $(,)?];
     concurrent: [$($carea:ident :: $ccase:ident),* $(,)?] $(;)?) => {
        $( one_case!(#[tokio::test]; $factory; $larea::$lcase); )*
        $( one_case!(#[tokio::test]; $factory; $garea::$gcase); )*
        $( one_case!(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]; $factory; $carea::$ccase); )*
    };
    (service $reason:literal; $factory:path;
     log: [$($larea:ident :: $lcase:ident),* $(,)?];
     groups: [$($garea:ident :: $gcase:ident),* $(,)?];
     concurrent: [$($carea:ident :: $ccase:ident),* $(,)?] $(;)?) => {
        $( one_case!(#[tokio::test] #[ignore = $reason]; $factory; $larea::$lcase); )*
        $( one_case!(#[tokio::test] #[ignore = $reason]; $factory; $garea::$gcase); )*
        $( one_case!(#[tokio::test(flavor = "multi_thread", worker_threads = 2)] #[ignore = $reason]; $factory; $carea::$ccase); )*
    };
    (log_only; $factory:path;
     log: [$($larea:ident :: $lcase:ident),* $(,)?];
     groups: [$($garea:ident :: $gcase:ident),* $(,)?];
     concurrent: [$($carea:ident :: $ccase:ident),* $(,)?] $(;)?) => {
        $( one_case!(#[tokio::test]; $factory; $larea::$lcase); )*
        $( one_case!(#[tokio::test] #[ignore = "this backend has no consumer groups yet"]; $factory; $garea::$gcase); )*
        $( one_case!(#[tokio::test] #[ignore = "this backend has no consumer groups yet"]; $factory; $carea::$ccase); )*
    };
}

macro_rules! suite {
    ($mode:ident $($reason:literal)?, $backend:ident, $factory:path) => {
        mod $backend {
            cases! {
                $mode $($reason)?; $factory;
                log: [
                    names::stream_name_over_255_bytes_is_invalid_name,
                    names::names_with_nul_or_control_chars_are_invalid_name,
                    wakeups::wait_for_events_wakes_on_append,
                    wakeups::a_subscription_sees_appends_made_between_its_waits,
                    indexes::create_index_backfills_and_queries_stay_exact,
                    indexes::create_index_refuses_log_fields_bad_paths_and_unknown_streams,
                    indexes::indexed_values_match_by_type,
                    indexes::explain_shows_the_index_or_the_scan,
                    streams::create_stream_defaults_to_one_partition,
                    streams::create_stream_keeps_partitions_and_indexes,
                    streams::create_stream_twice_is_already_exists,
                    streams::ensure_stream_creates_once_and_checks_partitions,
                    streams::zero_partitions_is_invalid_partition_count,
                    streams::partitions_above_maximum_is_invalid_partition_count,
                    append::append_takes_type_from_payload_type_field,
                    append::append_key_option_wins_over_payload_key,
                    append::append_key_falls_back_to_payload_key,
                    append::append_metadata_merges_option_and_payload_payload_wins,
                    append::append_payload_keeps_all_fields,
                    append::generated_ids_are_unique_time_ordered_uuid_v7,
                    append::explicit_id_and_timestamp_are_kept,
                    append::an_append_retried_with_its_id_writes_nothing_and_answers_the_original,
                    append::a_batch_appends_new_ids_and_answers_known_ones,
                    append::default_timestamp_is_the_backend_clock,
                    append::event_over_max_size_is_event_too_large_and_nothing_written,
                    append::batch_with_an_oversized_event_writes_nothing,
                    append::max_event_bytes_is_configurable,
                    append::typed_append_round_trips_through_payload_as,
                    append::payload_as_wrong_type_is_payload_error,
                    append::payload_depth_and_json_form_are_checked_at_append,
                    append::lineage_options_read_back_through_event_lineage,
                    append::caused_by_links_correlation_and_causation,
                    partitions::explicit_partition_is_used,
                    partitions::explicit_partition_out_of_range_is_invalid_partition,
                    partitions::key_routes_to_partition_for_key,
                    partitions::explicit_partition_wins_over_key,
                    partitions::unkeyed_event_goes_to_partition_zero,
                    partitions::sequences_start_at_one_and_are_contiguous_per_partition,
                    partitions::append_batch_is_contiguous_per_partition_in_input_order,
                    partitions::append_batch_is_atomic_when_one_partition_is_invalid,
                    partitions::append_to_missing_stream_is_stream_not_found,
                    query::query_eq_on_type,
                    query::query_eq_on_key,
                    query::query_eq_on_partition,
                    query::query_eq_on_lineage_fields,
                    query::query_eq_on_payload_dotted_paths,
                    query::query_is_in_matches_any_value,
                    query::query_range_operators_on_numbers,
                    query::query_range_operators_on_strings_and_timestamps,
                    query::query_exists_and_missing,
                    query::query_compares_by_value_type,
                    query::query_from_and_to_are_inclusive,
                    query::query_after_sequence_exclusive_until_sequence_inclusive,
                    query::query_after_sequences_per_partition,
                    query::query_order_by_sequence_asc_and_desc,
                    query::query_order_by_timestamp_asc_and_desc,
                    query::query_order_by_partition_asc_and_desc,
                    query::query_limit_defaults_to_100,
                    query::query_page_returns_each_match_exactly_once_across_partitions,
                    query::query_page_keeps_bounds_on_every_page,
                    query::query_cursor_of_another_order_is_rejected,
                    query::stream_query_yields_everything_lazily,
                    query::query_on_missing_stream_is_stream_not_found,
                    read::read_returns_events_after_sequence_up_to_limit,
                    read::read_out_of_range_partition_is_invalid_partition,
                    ops_inspect::list_streams_lists_every_stream_by_name,
                    ops_inspect::capabilities_promise_at_least_once_and_lease_fencing,
                    errors::explicit_event_id_out_of_bounds_is_invalid_argument,
                    errors::query_with_too_many_terms_is_invalid_argument,
                ];
                groups: [
                    ops_inspect::capabilities_announce_ops_inspect,
                    names::empty_stream_name_is_invalid_name,
                    names::group_names_follow_the_name_rules,
                    names::consumer_id_follows_the_name_rules,
                    names::path_like_names_are_plain_names,
                    groups::group_ops_on_missing_stream_are_stream_not_found_first,
                    groups::group_ops_on_missing_group_are_group_not_found,
                    groups::create_group_twice_is_already_exists,
                    groups::ensure_group_creates_once_keeps_position_and_checks_options,
                    groups::start_after_the_largest_sequence_fetches_nothing,
                    groups::group_names_are_per_stream,
                    groups::create_group_defaults,
                    groups::create_group_with_partition_out_of_range_is_invalid_partition,
                    groups::create_group_with_zero_max_attempts_is_invalid_argument,
                    groups::start_after_delivers_only_later_sequences,
                    groups::start_after_per_partition_map,
                    groups::start_at_delivers_from_first_event_at_or_after_time,
                    groups::start_at_after_every_event_delivers_only_new_events,
                    groups::frontier_starts_before_start_position_so_lag_counts_only_what_to_consume,
                    groups::start_after_beyond_high_watermark_waits_for_later_sequences,
                    groups::group_partitions_scope_deliveries_and_lag,
                    fetch::fetch_claims_in_partition_sequence_order,
                    fetch::fetch_claims_at_most_limit,
                    fetch::fetch_with_nothing_claimable_is_empty,
                    fetch::every_claim_gets_a_fresh_unique_lease_id,
                    fetch::lease_records_group_consumer_and_expiry,
                    fetch::lease_carries_the_stored_event,
                    fetch::fetch_partitions_option_restricts_claims,
                    fetch::competing_consumers_never_share_a_leased_delivery,
                    fetch::independent_groups_each_get_every_event,
                    fetch::expired_lease_is_reclaimable_with_next_attempt,
                    settle::ack_settles_the_delivery,
                    settle::second_ack_of_same_lease_is_stale_lease,
                    settle::made_up_lease_id_is_stale_lease,
                    settle::every_settle_checks_the_lease_id,
                    settle::lease_of_one_group_cannot_settle_another,
                    settle::expired_lease_can_still_settle_until_reclaimed,
                    settle::expired_lease_is_stale_after_reclaim,
                    settle::renew_extends_lease_past_old_expiry,
                    settle::renew_of_stale_lease_is_stale_lease,
                    settle::ack_many_returns_one_result_per_lease_and_a_stale_one_fails_alone,
                    settle::renew_many_extends_each_lease_and_a_stale_one_fails_alone,
                    scheduled::a_scheduled_event_is_readable_at_once_and_claimed_only_at_its_time,
                    scheduled::due_events_behind_a_scheduled_one_are_claimed_in_order,
                    scheduled::a_time_already_past_is_due_at_once,
                    scheduled::append_batch_schedules_each_event_by_its_options,
                    scheduled::a_deliver_at_that_is_not_a_time_is_invalid_argument,
                    scheduled::a_deliver_at_outside_four_digit_years_is_invalid_argument,
                    scheduled::replay_and_reset_keep_the_schedule,
                    scheduled::each_group_keeps_the_schedule_and_retries_follow_the_backoff,
                    scheduled::a_fetch_sets_aside_a_bounded_number_and_the_next_goes_on,
                    scheduled::a_fetch_past_scheduled_events_claims_at_most_its_limit,
                    keyed::one_event_per_key_is_in_flight_and_the_next_follows_the_ack,
                    keyed::a_retry_keeps_the_key_until_the_event_is_settled,
                    keyed::a_dead_letter_unblocks_its_key,
                    keyed::an_expired_lease_is_redelivered_before_the_next_of_its_key,
                    keyed::competing_consumers_never_share_a_key,
                    keyed::a_replay_reopens_a_key_in_order,
                    keyed::a_scheduled_event_holds_its_key_until_settled,
                    keyed::ensure_group_checks_the_order,
                    keyed::an_expired_lease_whose_key_moved_on_cannot_be_renewed,
                    keyed::an_event_behind_its_key_and_its_time_waits_for_both,
                    keyed::a_skipped_then_replayed_event_keeps_its_key,
                    keyed::a_replay_before_the_start_keeps_each_key_in_order,
                    keyed::a_busy_key_does_not_hold_up_the_others,
                    retry::retry_makes_delivery_claimable_again_with_next_attempt,
                    retry::retry_at_max_attempts_dead_letters_with_reason,
                    retry::retry_with_max_attempts_one_dead_letters_at_once,
                    retry::retry_backoff_delays_reclaim_until_clock_passes,
                    retry::exponential_retry_backoff_doubles_up_to_max,
                    retry::retry_after_uses_explicit_delay,
                    retry::lease_expired_on_last_attempt_is_dead_lettered_not_redelivered,
                    retry::retry_or_reject_of_settled_lease_is_stale_lease,
                    dlq::reject_dead_letters_for_that_group_only,
                    dlq::dead_letter_records_event_reason_attempts_and_time,
                    dlq::events_are_never_deleted_by_group_operations,
                    dlq::dead_letters_are_oldest_first_and_limited,
                    dlq::dead_letters_page_after_event_id,
                    dlq::dead_letters_unknown_cursor_is_cursor_not_found,
                    skip::skip_dead_letters_a_position_never_claimed,
                    skip::skip_of_a_leased_position_makes_its_lease_stale,
                    skip::skip_of_a_dead_letter_is_a_no_op,
                    skip::skip_refuses_settled_and_unknown_positions,
                    skip::dead_letters_page_after_position,
                    frontier_lag::hole_blocks_the_frontier,
                    frontier_lag::lag_is_high_watermark_minus_frontier_summed,
                    frontier_lag::lag_of_scopes_to_partitions,
                    frontier_lag::dead_letters_advance_the_frontier,
                    frontier_lag::unsettled_deliveries_do_not_move_the_frontier,
                    replay::replay_from_sequence_reopens_acked_deliveries,
                    replay::replay_from_sequence_sets_frontier_to_min_of_frontier_and_s,
                    replay::replay_keeps_in_flight_leases_valid,
                    replay::replay_from_time_reopens_per_partition,
                    replay::replay_from_time_without_events_is_no_events_in_range,
                    replay::replay_query_reopens_exactly_matching_events,
                    replay::replay_without_options_is_invalid_replay_opts,
                    replay::replay_with_several_options_is_invalid_replay_opts,
                    replay::replay_reopens_dead_letters,
                    replay::replay_partition_scope_leaves_other_partitions,
                    replay::replay_counts_only_events_that_exist,
                    reset::reset_without_confirm_is_confirm_required,
                    reset::reset_clears_leases_and_restarts_from_the_beginning,
                    reset::reset_restarts_at_the_given_start,
                    reset::reset_of_some_partitions_leaves_the_others,
                    reset::reset_clears_dead_letters_in_scope,
                    read::read_and_query_never_touch_group_state,
                    ops_inspect::list_groups_lists_the_groups_of_a_stream,
                    ops_inspect::group_info_reports_lag_inflight_and_dead_letters,
                    errors::zero_or_too_large_limit_is_invalid_argument,
                    errors::zero_or_too_long_lease_is_invalid_argument,
                    errors::too_long_retry_delay_is_invalid_argument,
                    errors::too_long_reason_is_invalid_argument,
                                    retention::a_stream_keeps_everything_by_default_and_reports_its_bounds,
                    retention::max_events_drops_the_oldest_and_reads_begin_at_the_log_start,
                    retention::max_age_drops_events_older_than_it,
                    retention::max_bytes_drops_the_oldest_until_the_size_fits,
                    retention::set_retention_changes_the_stream_and_a_pass_applies_it,
                    retention::limits_move_groups_past_dropped_events_and_count_what_they_skipped,
                    retention::interest_drops_only_what_every_group_settled,
                    retention::interest_limits_are_a_ceiling_that_says_when_it_is_hit,
                    retention::dead_letters_of_dropped_events_stay_listed_marked_dropped,
                    retention::starts_replays_and_resets_before_the_log_start_begin_at_it,
                    retention::consumers_keep_working_across_passes,
                ];
                concurrent: [
                    retention::passes_beside_producers_and_consumers_lose_nothing_uncounted,
                    concurrency::competing_consumers_ack_every_event_exactly_once,
                    concurrency::concurrent_appends_of_one_id_store_one_event,
                ];
            }
        }
    };
}

/// The whole suite for a backend that implements all of docs/semantics.md.
macro_rules! conformance {
    ($backend:ident, $factory:path) => {
        suite!(full, $backend, $factory);
    };
}

crate::backends!(conformance);

/// The whole suite for a backend that needs a service (ignored unless run
/// with `--ignored`, as .ci/run does with the service started).
macro_rules! service_conformance {
    ($backend:ident, $factory:path) => {
        suite!(service "needs PostgreSQL: .ci/run starts one and runs these with RHEO_POSTGRES_URL set", $backend, $factory);
    };
}

crate::service_backends!(service_conformance);

/// The whole suite on MongoDB (with the `mongo` feature; ignored unless
/// run with `--ignored`, as .ci/run does with a server started).
#[cfg(feature = "mongo")]
macro_rules! mongo_conformance {
    ($backend:ident, $factory:path) => {
        suite!(service "needs a MongoDB-wire server: .ci/run starts one and runs these with RHEO_MONGO_URL set", $backend, $factory);
    };
}

#[cfg(feature = "mongo")]
crate::mongo_backends!(mongo_conformance);

/// The whole suite on Redis (with the `redis` feature; ignored unless run
/// with `--ignored`, as .ci/run does with a server started).
#[cfg(feature = "redis")]
macro_rules! redis_conformance {
    ($backend:ident, $factory:path) => {
        suite!(service "needs a Redis server: .ci/run starts one and runs these with RHEO_REDIS_URL set", $backend, $factory);
    };
}

#[cfg(feature = "redis")]
crate::redis_backends!(redis_conformance);

/// What a plain `cargo test` (no `mongo` feature) says about the MongoDB
/// suite: listed as not run. Run with `--ignored` in such a build, it fails,
/// so a run meant for MongoDB never passes with no MongoDB case in it.
#[cfg(not(feature = "mongo"))]
#[test]
#[ignore = "the MongoDB suite needs --features mongo and a MongoDB-wire server (.ci/run runs it)"]
fn mongo_suite_not_built() {
    panic!("the MongoDB suite is not built: cargo test --features mongo, with RHEO_MONGO_URL set");
}

/// The same for Redis (no `redis` feature).
#[cfg(not(feature = "redis"))]
#[test]
#[ignore = "the Redis suite needs --features redis and a Redis server (.ci/run runs it)"]
fn redis_suite_not_built() {
    panic!("the Redis suite is not built: cargo test --features redis, with RHEO_REDIS_URL set");
}
