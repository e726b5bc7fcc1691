"""Issue 27 item 1: a ``when`` condition is evaluated within bounds of time and
memory, in a child the dispatcher abandons on SIGINT/SIGTERM (manifest.md,
"Bounded evaluation")."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from crucible.compile._bounded import MAX_EXPRESSION_SECONDS
from tests.run.dispatchtests import reaped, start_dispatch, wait_for, write_pack
from tests.run.test_control_run import dispatch, task

LOOP = "len([1 for a in range(100000) for b in range(100000) if False]) == 0"


def test_a_looping_condition_fails_its_unit_with_a_condition_note(tmp_path: Path) -> None:
    run = dispatch(tmp_path, task("spin", "true", when=LOOP) + task("other", "true"))
    assert run.code == 1
    assert run.status("other") == "passed"
    record = run.record("spin")
    assert record["status"] == "failed"
    assert record["note"].startswith(f"condition error: {LOOP}: evaluation took longer than")
    assert f"{MAX_EXPRESSION_SECONDS:g} s" in record["note"]


def test_a_condition_past_the_memory_bound_fails_its_unit(tmp_path: Path) -> None:
    run = dispatch(tmp_path, task("big", "true", when='len("x" * 2000000000) > 0'))
    assert run.code == 1, run.stderr
    note = run.record("big")["note"]
    assert "condition error" in note and "MiB of memory" in note


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            text = Path(f"/proc/{pid}/task/{tid}/children").read_text()
        except OSError:
            continue
        found += [int(c) for c in text.split()]
    return found


def test_sigterm_stops_a_run_while_a_condition_is_evaluated(tmp_path: Path) -> None:
    pack = write_pack(
        tmp_path, "edition = 4\n[workflow]\nname = 'c'\n" + task("spin", "true", when=LOOP)
    )
    state = tmp_path / "state"
    with reaped(start_dispatch(pack, state)) as proc:
        # the evaluator child is the dispatcher's only child here (no task runs)
        wait_for(lambda: bool(_children(proc.pid)))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 143
    # undecided, not failed: a resume evaluates the condition again
    assert not (state / "results" / "spin.jsonl").exists()


def test_the_evaluator_dies_with_a_killed_dispatcher(tmp_path: Path) -> None:
    pack = write_pack(
        tmp_path, "edition = 4\n[workflow]\nname = 'c'\n" + task("spin", "true", when=LOOP)
    )
    with reaped(start_dispatch(pack, tmp_path / "state")) as proc:
        wait_for(lambda: bool(_children(proc.pid)))
        (child,) = _children(proc.pid)
        proc.kill()
        proc.wait(timeout=30)
    wait_for(lambda: not Path(f"/proc/{child}").exists() or _zombie(child))


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
