"""pytest plugin: at the end of a session, every file the tools wrote matches its schema.

Each test's ``tmp_path`` is noted with the test that owned it; when the session
ends, :func:`tests.schemas.walker.check_tree` walks pytest's base temporary
directory (state dirs, result records, session logs, inputs indexes, ledgers,
... see walker.py) and a file that does not match its schema fails the run,
named with its test. Files a test broke on purpose (hostile and fuzz tests
corrupt state to check the tools refuse it) are left out by :data:`EXEMPT`, by
test, each with its reason — never silently.

``CRUCIBLE_SCHEMA_WALK=0`` turns the check off (for a quick local loop).
"""

from __future__ import annotations

import os
import time
from collections.abc import Generator
from pathlib import Path

import pytest

from tests.schemas.walker import Problem, check_tree

_DAMAGED = "damages the file on purpose, to check the reader refuses or skips it"
_HAND = "writes a state dir by hand (a v2 plan.json with a loop member) for the report to read"
_SPLICED = "splices junk or a torn line into steps.jsonl, to check the readers count it"

#: owners whose files are left out -> why: a test node-id prefix, or
#: ``fixture:<directory name prefix>`` for a fixture's tmp_path_factory directory
EXEMPT: dict[str, str] = {
    "tests/stage/test_packed_records.py::test_damaged_": _DAMAGED,
    "tests/run/test_report_state.py::test_damaged_": _DAMAGED,
    "tests/run/test_report_state.py::test_unparseable_state_files": _DAMAGED,
    "tests/run/test_report_state.py::test_unknown_event_kinds_are_skipped": _DAMAGED,
    "tests/run/test_usage.py::test_report_refuses_a_usage_member": _DAMAGED,
    "tests/run/test_loop_view.py::test_bad_loop_json_is_one_line": _DAMAGED,
    "tests/run/test_loop_view.py::test_unknown_format_refused": _DAMAGED,
    "tests/run/test_loop_view.py::test_unparseable_loop_json": _DAMAGED,
    "tests/run/test_loop_run.py::test_a_damaged_loop_json_is_named_on_resume": _DAMAGED,
    "tests/run/test_loop_view.py::test_chart_in_chromium": _HAND,
    "tests/run/test_loop_view.py::test_json_carries_the_loop_line": _HAND,
    "tests/ledger/test_index.py::test_appends_the_index_missed_are_caught_up": _SPLICED,
    "tests/ledger/test_index.py::test_torn_tail_then_append_keeps_the_index_right": _SPLICED,
    "tests/ledger/test_ledger.py::test_readonly_open_never_quarantines": _SPLICED,
    "tests/ledger/test_maintenance.py::test_verify_": _SPLICED,
    "tests/ledger/test_hostile.py::test_quarantine_": _SPLICED,
    "tests/ledger/test_golden.py::test_verify_report_is_byte_exact": _SPLICED,
    "tests/ledger/test_batch.py::test_a_batch_after_a_torn_tail": _SPLICED,
    "tests/ledger/test_batch.py::test_a_batch_cut_mid_write": _SPLICED,
    # a SIGKILL can cut a batch's write short: a torn line, then a fresh one
    "tests/ledger/test_batch.py::test_sigkilled_batch_writer": _SPLICED,
    "tests/run/test_cache_perf_run.py::test_a_record_of_the_wrong_shape_is_a_warned_miss": (
        "records a cache value of the wrong shape by hand, to check the hit path refuses it"
    ),
    "tests/proof/writer/test_export.py::": "lays recorded proof vectors out as accounted "
    "runs' state dirs by hand (a stand-in plan.json and session log) for the export to read",
    "fixture:big-": "tests/run/test_timeline.py's write_big_state writes a session log by "
    "hand (only what the page reads), not through the tools",
}

_owners: dict[str, str] = {}


def exempt_reason(nodeid: str) -> str | None:
    for prefix, why in EXEMPT.items():
        if nodeid.startswith(prefix):
            return why
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    yield
    funcargs = getattr(item, "funcargs", {})
    tmp = funcargs.get("tmp_path")
    if isinstance(tmp, Path):
        _owners[str(tmp)] = item.nodeid


def owner_of(path: Path, basetemp: Path) -> str:
    """The test whose ``tmp_path`` holds ``path``, else ``fixture:<directory>`` (a
    directory a fixture made with ``tmp_path_factory``)."""
    try:
        top = path.relative_to(basetemp).parts[0]
    except (ValueError, IndexError):
        return str(path)
    return _owners.get(str(basetemp / top), f"fixture:{top}")


def _basetemp() -> Path | None:
    # every tmp_path is <basetemp>/<test name><n>
    for tmp in _owners:
        return Path(tmp).parent
    return None


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if os.environ.get("CRUCIBLE_SCHEMA_WALK") == "0":
        return
    basetemp = _basetemp()
    if basetemp is None or not basetemp.is_dir():
        return
    start = time.monotonic()
    checked, problems = check_tree([basetemp])
    kept: list[tuple[str, Problem]] = []
    for problem in problems:
        owner = owner_of(problem.path, basetemp)
        if exempt_reason(owner) is None:
            kept.append((owner, problem))
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    elapsed = time.monotonic() - start
    if reporter is not None:
        reporter.write_line(
            f"schemas: {checked} files the tools wrote checked in {elapsed:.1f} s, "
            f"{len(kept)} not matching their schema"
        )
        for owner, problem in kept[:50]:
            reporter.write_line(f"  {problem}  ({owner})", red=True)
    if kept:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
