"""Issue 32 items 4-7 through real ``crucible-dispatch`` subprocesses: the
include-only matrix, ``on_empty``, sequences with ``format`` and params, and
``retry.when``; plus the start-up double run of a settled join."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path
from typing import Any

from tests.run.dispatchtests import DISPATCH


def dispatch(
    tmp_path: Path, toml: str, *args: str, state: str = "state"
) -> subprocess.CompletedProcess[str]:
    pack = tmp_path / "pack.toml"
    pack.write_text(textwrap.dedent(toml).lstrip())
    return subprocess.run(
        [DISPATCH, str(pack), "--state", str(tmp_path / state), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def events(state: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (state / "session.jsonl").read_text().splitlines()]


def finished(state: Path) -> dict[str, dict[str, Any]]:
    """task (``task[key]`` for an instance) -> its last ``task_finished``."""
    out = {}
    for e in events(state):
        if e["event"] == "task_finished":
            label = e["task"] if e.get("key") is None else f"{e['task']}[{e['key']}]"
            out[label] = e
    return out


def record(state: Path, task: str) -> dict[str, Any]:
    return json.loads((state / "results" / f"{task}.json").read_bytes())  # type: ignore[no-any-return]


# -- the start-up double run -------------------------------------------------------


def test_a_settled_join_after_a_start_up_skip_runs_once(tmp_path: Path) -> None:
    """A task skipped while the dispatcher starts wakes its consumers at once; the
    start-up walk then reached the same consumer: a settled join ran twice."""
    proc = dispatch(
        tmp_path,
        """
        edition = 4
        [workflow]
        name = "dbl"
        [[workflow.task]]
        name = "a"
        when = "False"
        run = "true"
        [[workflow.task]]
        name = "b"
        needs = ["a"]
        join = "settled"
        run = "echo ran >> \\"$CRUCIBLE_PACK_DIR/b.count\\""
        """,
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "b.count").read_text() == "ran\n"
    started = [e["task"] for e in events(tmp_path / "state") if e["event"] == "task_started"]
    assert started == ["b"]
    assert "1 passed, 0 failed, 1 skipped" in proc.stderr
