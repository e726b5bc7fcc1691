"""Issue 27's items 4, 5, 10, 16, 17 and 20, each with the regression test that
holds it fixed (the tests live beside the code they exercise); the index fails
if a listed test is renamed or removed, as tests/hostile/test_items.py does for
issue 12."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]

#: item -> "file::test" (a parametrized test by its function name)
ITEMS: dict[int, list[str]] = {
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


@pytest.mark.parametrize(
    "node", [n for tests in ITEMS.values() for n in tests], ids=lambda n: n.split("::")[1]
)
def test_listed_regression_test_exists(node: str) -> None:
    path, name = node.split("::")
    source = (TESTS / path).read_text()
    assert re.search(rf"^(async )?def {re.escape(name)}\(", source, re.M), node
