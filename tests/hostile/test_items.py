"""Issue 12's 32 hostile-input defects, each with the regression test that
holds it fixed. The tests live beside the tool they exercise (tests/<tool>/);
this table is the hostile suite's index, and it fails if a listed test is
renamed or removed, so an item can never silently lose its guard."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]

#: item -> "file::test" (a parametrized test by its function name)
ITEMS: dict[int, list[str]] = {
    1: [
        "ledger/test_hostile.py::test_compact_refuses_a_symlinked_lock_and_leaves_its_target",
        "ledger/test_hostile.py::test_quarantine_in_run_never_writes_through_a_symlinked_lock",
        "ledger/test_hostile.py::test_a_dangling_lock_symlink_creates_nothing_outside",
    ],
    2: [
        "ledger/test_hostile.py::test_a_symlinked_ledger_is_quarantined_not_written_through",
        "ledger/test_hostile.py::test_readers_never_follow_a_symlinked_ledger",
    ],
    3: [
        "core/test_output.py::test_device_is_written_through_never_renamed_over",
        "core/test_output.py::test_fifo_without_a_reader_is_refused_at_once",
        "core/test_output.py::test_compile_o_fifo_without_reader_is_exit_2_without_blocking",
        "core/test_output.py::test_compile_o_device_and_link_to_pipe_stay_what_they_are",
        "core/test_output.py::test_report_html_to_a_fifo_or_device_is_never_renamed_over",
    ],
    4: [
        "core/test_output.py::test_compile_to_stdout_on_a_full_disk_is_exit_3_not_truncated",
        "ledger/test_hostile.py::test_run_passthrough_on_a_full_disk_exits_3",
        "ledger/test_hostile.py::test_ls_and_get_on_a_full_disk_exit_3",
    ],
    5: ["run/test_daily.py::test_events_to_a_full_device_keep_the_log_complete"],
    6: [
        "proof/writer/test_hostile_cli.py::test_dir_holding_a_proof_among_other_files_is_not_replaced",
        "proof/writer/test_hostile_cli.py::test_bundle_with_foreign_content_is_not_replaced",
    ],
    7: ["run/test_daily.py::test_a_second_dispatcher_on_a_state_is_refused_naming_the_first"],
    8: [
        "stage/test_capture_hostile.py::test_a_fifo_result_file_fails_the_attempt_without_blocking",
        "stage/test_hostile_tasks.py::test_hostile_result_files_fail_their_attempts_and_the_run_ends",
    ],
    9: [
        "stage/test_capture_hostile.py::test_a_device_result_file_is_never_read",
        "stage/test_capture_hostile.py::test_a_result_file_over_the_bound_is_a_measured_failure",
    ],
    10: [
        "stage/test_capture_hostile.py::test_a_symlink_to_a_file_outside_the_workspace_is_refused"
    ],
    11: [
        "compile/test_compile_hostile.py::test_deep_starlark_is_exit_2_with_a_location",
        "compile/test_compile_hostile.py::test_deep_starlark_from_stdin",
    ],
    12: [
        "compile/test_compile_hostile.py::test_growing_string_is_a_starlark_error_diagnostic",
        "compile/test_compile_hostile.py::test_a_crashing_evaluator_is_a_diagnostic",
    ],
    13: ["run/test_daily.py::test_a_fanout_key_with_nul_runs_with_the_escaped_key"],
    14: [
        "stage/test_capture_hostile.py::"
        "test_deeply_nested_directories_fail_measured_not_with_recursion_error"
    ],
    15: [
        "compile/test_compile_hostile.py::test_validate_refuses_what_the_run_would",
        "stage/test_capture_hostile.py::test_a_bad_glob_is_a_plan_error_never_re_error",
    ],
    16: ["stage/test_capture_hostile.py::test_a_directory_renamed_mid_capture_fails_the_attempt"],
    17: [
        "stage/test_capture_hostile.py::"
        "test_a_directory_left_where_the_result_file_goes_fails_the_attempt"
    ],
    18: [
        "run/test_report_state.py::test_damaged_session_line_is_one_line_exit_2",
        "run/test_report_state.py::test_damaged_result_record_is_one_line_exit_2",
    ],
    19: [
        "run/test_report_state.py::test_a_fifo_is_refused_without_waiting",
        "compile/test_compile_hostile.py::test_source_that_is_a_fifo_is_refused_without_blocking",
    ],
    20: ["proof/reader/test_hostile_cli.py::test_unreadable_bundle_is_exit_3"],
    21: ["proof/reader/test_hostile_cli.py::test_invalid_expect_is_usage_2"],
    22: ["run/test_daily.py::test_a_bad_events_path_leaves_the_state_unclaimed"],
    23: ["compile/test_compile_hostile.py::test_source_that_is_a_directory_is_exit_2"],
    24: ["core/test_cli_edge.py::test_sigint_while_the_tool_loads_is_130_with_one_line"],
    25: ["run/test_daily.py::test_jobs_are_capped_by_the_units_and_a_maximum"],
    26: [
        "run/test_report.py::test_long_and_hostile_keys_and_notes_are_escaped_and_cut",
        "proof/reader/test_hostile_cli.py::test_hostile_name_in_bundle_is_one_escaped_line",
    ],
    27: [
        "run/test_daily.py::test_param_messages_say_what_is_wrong",
        "run/test_daily.py::test_an_integral_number_is_an_integer_param",
    ],
    28: [
        "cli/test_stage_cli.py::test_out_of_range_numbers_name_their_option",
        "stage/test_commands.py::test_emit_cap_has_one_rule_and_names_its_source",
        "proof/writer/test_hostile_cli.py::test_failed_write_is_exit_3_naming_the_file",
    ],
    29: ["ledger/test_hostile.py::test_read_only_dir_names_the_lock_and_permission"],
    30: ["core/test_cli_edge.py::test_no_subcommand_is_one_line_with_the_help_hint"],
    31: ["proof/reader/test_hostile_cli.py::test_symlink_to_bundle_says_links_are_not_followed"],
    32: [
        "compile/test_compile_hostile.py::test_non_utf8_and_junk_plans_say_what_they_are",
        "run/test_daily.py::test_a_junk_plan_json_in_the_state_is_said_to_be_no_plan",
    ],
}

#: issue 27 (defects found by probing the edition-4 surfaces): item -> "file::test",
#: every one of its 21 items
ISSUE_27: dict[int, list[str]] = {
    2: [
        "run/test_stalled_readers.py::test_a_stalled_events_fifo_is_dropped_and_signals_stop_the_run",
        "run/test_stalled_readers.py::test_a_stalled_events_pipe_on_stdout_lets_the_run_finish",
        "run/test_stalled_readers.py::test_follow_to_a_stderr_nobody_reads_still_stops_on_sigterm",
    ],
    3: [
        "run/test_group_kill.py::test_a_process_group_sigkill_leaves_no_task_and_resume_waits",
        "run/test_group_kill.py::test_the_killed_run_tasks_die_without_a_resume",
        "run/test_group_kill.py::"
        "test_resume_stops_an_earlier_attempt_even_when_the_reaper_was_killed",
    ],
    11: [
        "run/test_publish_foreign.py::test_a_users_file_in_a_destination_is_refused_and_kept",
        "run/test_publish_foreign.py::"
        "test_a_users_regular_file_where_a_destination_goes_is_refused_and_kept",
        "run/test_publish_foreign.py::test_an_earlier_publication_is_replaced_but_an_added_file_is_not",
        "run/test_publish_foreign.py::test_a_file_under_a_scratch_name_does_not_wedge_later_publishes",
    ],
    12: [
        "run/test_flags_before_claim.py::test_outputs_a_directory_is_refused_up_front",
        "run/test_flags_before_claim.py::test_outputs_a_fifo_without_reader_is_refused_up_front",
        "run/test_flags_before_claim.py::test_outputs_a_dangling_link_is_refused_up_front",
        "run/test_flags_before_claim.py::test_outputs_into_the_state_dir_is_refused_and_the_plan_kept",
        "run/test_flags_before_claim.py::test_events_into_the_state_dir_is_refused",
        "run/test_flags_before_claim.py::test_publish_dir_a_fifo_is_refused_up_front",
        "run/test_flags_before_claim.py::"
        "test_an_emit_cap_past_the_json_range_is_refused_naming_its_source",
        "run/test_flags_before_claim.py::test_scheduler_without_executor_dask_is_a_usage_error",
        "run/test_flags_before_claim.py::test_a_resource_refusal_leaves_the_state_unclaimed",
    ],
    13: ["run/test_passed_words.py::test_outputs_to_a_closed_pipe_keeps_the_failure_code_and_line"],
    14: [
        "run/test_passed_words.py::test_resume_of_a_passed_run_with_tolerated_failure_and_skip_exits_0"
    ],
    15: [
        "run/test_passed_words.py::test_tolerated_failures_are_counted_apart_in_the_summary",
        "run/test_passed_words.py::test_a_passed_run_with_absent_outputs_warns",
    ],
    1: [
        "run/test_condition_bounds.py::test_a_looping_condition_fails_its_unit_with_a_condition_note",
        "run/test_condition_bounds.py::test_a_condition_past_the_memory_bound_fails_its_unit",
        "run/test_condition_bounds.py::test_sigterm_stops_a_run_while_a_condition_is_evaluated",
        "compile/test_bounded.py::test_cancelled_abandons_the_evaluation",
    ],
    6: [
        "compile/test_issue27_values.py::test_a_duration_past_a_year_is_refused_at_its_key",
        "compile/test_issue27_values.py::test_the_timeout_bound_holds_in_every_edition",
        "compile/test_issue27_values.py::test_a_time_budget_past_a_year_is_refused_at_its_key",
        "run/test_control_policy.py::test_backoff_never_overflows",
        "run/test_long_durations.py::test_a_task_with_the_longest_timeout_runs",
        "run/test_long_durations.py::test_a_retry_a_year_away_waits_and_stops_on_sigterm",
    ],
    7: ["run/test_loop_values.py::test_an_infinite_delta_is_recorded_as_none_and_reported"],
    8: ["run/test_loop_values.py::test_a_loop_with_no_revision_reports_and_fails_by_its_body"],
    9: [
        "compile/test_compile_hostile.py::test_a_deep_when_is_when_syntax_with_its_location",
        "compile/test_compile_hostile.py::test_a_deep_when_through_starlark_is_when_syntax",
    ],
    18: ["compile/test_issue27_values.py::test_a_map_over_a_mapped_task_is_refused_at_its_map"],
    19: [
        "compile/test_issue27_values.py::test_linear_matching_gives_the_rules_result",
        "compile/test_issue27_values.py::"
        "test_a_static_matrix_past_the_bound_with_its_includes_is_refused",
    ],
    21: [
        "compile/test_issue27_values.py::test_a_sequence_integer_out_of_range_says_so",
        "compile/test_issue27_values.py::test_a_huge_loop_number_is_not_called_infinite",
        "run/test_issue27_messages.py::"
        "test_param_values_crucible_refuses_are_named_and_printed_as_given",
        "compile/test_issue27_values.py::test_a_deep_literal_map_is_refused_at_its_key",
        "run/test_issue27_messages.py::"
        "test_a_result_with_a_huge_integer_is_valid_json_crucible_refuses",
        "run/test_issue27_messages.py::"
        "test_a_resource_no_worker_offers_that_much_of_says_the_most_offered",
        "core/test_sigterm_edge.py::test_sigterm_while_the_tool_loads_is_143_with_one_line",
        "core/test_sigterm_edge.py::"
        "test_sigterm_inside_the_command_is_143_with_one_line_after_cleanups",
        "run/test_issue27_messages.py::test_cache_forget_refuses_a_name_no_task_can_have",
        "run/test_loop_values.py::test_a_loop_with_no_revision_reports_and_fails_by_its_body",
    ],
    4: [
        "run/test_dask_leaving_worker.py::test_a_sigtermed_workers_unit_is_dead_before_it_runs_again",
        "run/test_dask_leaving_worker.py::"
        "test_a_unit_whose_answer_was_lost_with_its_record_written_is_not_run_again",
    ],
    5: [
        "run/test_dask_lost_scheduler.py::"
        "test_a_scheduler_stopped_mid_run_ends_it_in_one_line_with_exit_3"
    ],
    10: [
        "run/test_dask_setup_errors.py::test_a_malformed_dask_config_is_located_exit_2_before_the_claim",
        "run/test_dask_setup_errors.py::"
        "test_a_temporary_directory_that_is_a_file_is_exit_2_before_the_claim",
        "run/test_dask_setup_errors.py::test_an_unknown_scheduler_scheme_is_exit_2_before_the_claim",
        "run/test_dask_setup_errors.py::test_a_worker_without_this_crucible_is_named_exit_3",
        "run/test_dask_setup_errors.py::test_a_worker_that_cannot_see_the_pack_directory_is_exit_3",
        "run/test_dask_setup_errors.py::test_a_scheduler_that_reruns_lost_units_itself_is_warned_about",
    ],
    16: [
        "run/test_fold_note.py::"
        "test_the_aggregate_note_names_the_first_failure_and_counts_skips_apart"
    ],
    17: [
        "run/test_retry_reason.py::"
        "test_the_no_retry_reason_is_on_the_first_line_and_the_tail_shown_once",
        "run/test_retry_reason.py::test_a_long_headline_is_cut_before_the_reason",
        "run/test_retry_reason.py::test_a_note_recorded_with_the_reason_after_the_tail_shows_it_once",
    ],
    20: [
        "run/test_report_listed.py::test_a_listed_fanout_interrupted_in_instance_0_shows_every_instance",
        "run/test_report_listed.py::test_a_mapped_task_all_cache_hits_is_cached_with_its_output_size",
        "run/test_report_listed.py::test_a_failed_instance_that_captured_nothing_stages_no_files",
    ],
}


def test_every_item_has_a_guard() -> None:
    assert sorted(ITEMS) == list(range(1, 33))
    assert all(ITEMS[i] for i in ITEMS)
    assert sorted(ISSUE_27) == list(range(1, 22))
    assert all(ISSUE_27[i] for i in ISSUE_27)


@pytest.mark.parametrize(
    "node",
    [n for index in (ITEMS, ISSUE_27) for tests in index.values() for n in tests],
    ids=lambda n: n.split("::")[1],
)
def test_listed_regression_test_exists(node: str) -> None:
    path, name = node.split("::")
    source = (TESTS / path).read_text()
    assert re.search(rf"^(async )?def {re.escape(name)}\(", source, re.M), node
