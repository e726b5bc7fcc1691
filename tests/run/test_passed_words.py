"""A passed run's words and codes (issue 27 items 13, 14, 15): the summary counts
tolerated failures apart, a passed run that leaves declared outputs absent says
so, ``--resume`` on a settled run exits with the run's code, and a closed
``--outputs -`` reader never hides a failure."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

from tests.run.dispatchtests import DISPATCH
from tests.run.test_control_run import HEAD, OK, dispatch, emit, task

TOLERATED = (
    task("enrich", "exit 7", on_failure="continue")
    + task("gate", OK, when="1 == 2")
    + task("use", emit({"total": 3}), needs=["enrich"], emits={"total": "integer"})
    + '\n[workflow.outputs]\ntotal = "use.total"\n'
)


def test_tolerated_failures_are_counted_apart_in_the_summary(tmp_path: Path) -> None:
    run = dispatch(tmp_path, TOLERATED)
    assert run.code == 0, run.stderr
    last = run.stderr.strip().splitlines()[-1]
    assert "run passed: 0 passed, 1 failed (tolerated), 2 skipped" in last, last


def test_a_passed_run_with_absent_outputs_warns(tmp_path: Path) -> None:
    run = dispatch(tmp_path, TOLERATED)
    assert run.code == 0
    warnings = [line for line in run.stderr.splitlines() if "warning:" in line]
    assert len(warnings) == 1, run.stderr
    assert "1 of 1 declared output" in warnings[0] and "total" in warnings[0]
    assert str(run.state / "outputs.json") in warnings[0]


def test_a_passed_run_with_every_output_present_does_not_warn(tmp_path: Path) -> None:
    run = dispatch(
        tmp_path,
        task("use", emit({"total": 3}), emits={"total": "integer"})
        + '\n[workflow.outputs]\ntotal = "use.total"\n',
    )
    assert run.code == 0 and "warning" not in run.stderr, run.stderr


def test_resume_of_a_passed_run_with_tolerated_failure_and_skip_exits_0(tmp_path: Path) -> None:
    run = dispatch(tmp_path, TOLERATED)
    assert run.code == 0
    again = subprocess.run(
        [DISPATCH, str(tmp_path / "pack.toml"), "--state", str(run.state), "--resume"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert again.returncode == 0, again.stderr
    assert "nothing to resume" in again.stderr and "--retry-failed" not in again.stderr
    assert "1 failed (tolerated)" in again.stderr


def test_resume_of_a_failed_run_still_exits_1(tmp_path: Path) -> None:
    run = dispatch(tmp_path, task("t", "exit 3"))
    assert run.code == 1
    again = subprocess.run(
        [DISPATCH, str(tmp_path / "pack.toml"), "--state", str(run.state), "--resume"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert again.returncode == 1 and "--retry-failed" in again.stderr


def test_outputs_to_a_closed_pipe_keeps_the_failure_code_and_line(tmp_path: Path) -> None:
    pack = tmp_path / "pack.toml"
    pack.write_text(textwrap.dedent(HEAD) + task("t", "exit 3"))
    state = tmp_path / "state"
    # `| head -c 0`: the reader is gone before the outputs are written
    script = f'"{DISPATCH}" "{pack}" --state "{state}" --outputs - | head -c 0; echo "rc=${{PIPESTATUS[0]}}" >&2'
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert "rc=1" in proc.stderr, proc.stderr
    assert "run failed: 0 passed, 1 failed, 0 skipped" in proc.stderr
    assert "Traceback" not in proc.stderr
