"""Signals reach tasks: every task starts with default dispositions and an
empty signal mask (issue 13 item 1), so a TERM trap runs on a timeout and on
the dispatcher's SIGTERM, and a task that exits 0 after its trap is recorded
as what it was."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from tests.run.dispatchtests import events, piped_dispatch, result, run, wait_for

Pack = Callable[..., Path]
#: glibc's posix_spawn leaves its two internal real-time signals (32, 33)
#: ignored; no program can name them (docs/spec/run.md, "Task processes")
GLIBC_INTERNAL = (1 << 31) | (1 << 32)


def test_a_task_ignores_and_blocks_no_signal(pack: Pack, tmp_path: Path) -> None:
    plan = pack(
        """
[[workflow.task]]
name = "probe"
run = '''grep -E '^Sig(Ign|Blk):' /proc/self/status > "$CRUCIBLE_WORKSPACE/../sig.txt"'''
"""
    )
    state = tmp_path / "s"
    # The dispatcher itself starts with TERM ignored and USR1 blocked (nohup, a
    # CI runner): the task must still start clean.
    old = signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    try:
        outcome = run(plan, state)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
        signal.signal(signal.SIGUSR2, old)
    assert outcome.exit_code == 0  # type: ignore[attr-defined]
    fields = dict(
        line.split(":\t") for line in (state / "work" / "sig.txt").read_text().splitlines()
    )
    assert int(fields["SigIgn"], 16) & ~GLIBC_INTERNAL == 0, fields
    assert int(fields["SigBlk"], 16) == 0, fields


def test_a_term_trap_runs_on_timeout(pack: Pack, tmp_path: Path) -> None:
    plan = pack(
        """
[[workflow.task]]
name = "slow"
timeout = 0.5
run = '''trap 'echo trapped > ../trap.txt; exit 0' TERM; sleep 30 & wait'''
"""
    )
    state = tmp_path / "s"
    started = time.monotonic()
    outcome = run(plan, state)
    elapsed = time.monotonic() - started
    assert outcome.exit_code == 1  # type: ignore[attr-defined]
    assert (state / "work" / "trap.txt").read_text() == "trapped\n"
    # ended by its SIGTERM at 0.5 s, not by the SIGKILL after the 1 s grace
    assert elapsed < 1.4, elapsed
    rec = result(state, "slow")
    assert rec is not None and rec["status"] == "failed"
    assert rec["note"] == "exited with status 0 after timeout 0.5s", rec["note"]


def test_dispatcher_sigterm_runs_the_trap_and_a_task_that_exits_0_passes(
    pack: Pack, tmp_path: Path
) -> None:
    plan = pack(
        """
[[workflow.task]]
name = "graceful"
run = '''trap 'echo "{}" > "$CRUCIBLE_OUTPUT"; echo trapped > ../graceful.txt; exit 0' TERM; touch ../graceful.up; sleep 30 & wait'''

[[workflow.task]]
name = "abrupt"
run = '''trap 'echo trapped > ../abrupt.txt; exit 5' TERM; touch ../abrupt.up; sleep 30 & wait'''
"""
    )
    state = tmp_path / "s"
    proc = piped_dispatch(plan, state, "-j", "2")
    work = state / "work"
    wait_for(lambda: (work / "graceful.up").exists() and (work / "abrupt.up").exists())
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 143, err
    assert (work / "graceful.txt").read_text() == "trapped\n"
    assert (work / "abrupt.txt").read_text() == "trapped\n"
    finished = {e["task"]: e["status"] for e in events(state) if e["event"] == "task_finished"}
    assert finished == {"graceful": "passed", "abrupt": "interrupted"}
    rec = result(state, "graceful")
    assert rec is not None and rec["status"] == "passed"
    assert result(state, "abrupt") is None  # unsettled: a resume runs it
    assert not os.path.exists(state / "results" / "abrupt.json")
