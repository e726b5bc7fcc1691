"""Helpers shared by the dispatcher tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: the ``pack`` fixture (tests/run/conftest.py): writes a pack, returns its manifest
Pack = Callable[..., Path]

DISPATCH = str(Path(sys.executable).parent / "crucible-dispatch")


def dispatch(*args: object, cwd: Path | None = None, **kw: Any) -> subprocess.CompletedProcess[str]:
    """``crucible-dispatch ARGS`` as a real subprocess, text output captured."""
    return subprocess.run(
        [DISPATCH, *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=120, **kw
    )


def wait_for(predicate: Callable[[], bool], timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("timed out waiting")


def one_line(err: str) -> str:
    """The one stderr line of a refusal (never a traceback)."""
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def events(state: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (state / "session.jsonl").read_bytes().splitlines()]


def result(state: Path, task: str, key: str | None = None) -> dict[str, Any] | None:
    from crucible import stage

    return stage.load_result(state, task, key)


def run(plan: Path, state: Path, **kw: object) -> object:
    """run_plan with short backoff and grace, and a small fixed host environment."""
    from crucible.run import RunOptions
    from crucible.run.runner import run_plan  # typed (crucible.run loads it lazily)

    options = RunOptions(plan=plan, state=state, backoff=0.01, kill_grace=1.0, **kw)  # type: ignore[arg-type]
    return run_plan(
        options, environ={"PATH": os.environ["PATH"], "HOME": "/nonexistent", "SECRET": "s3"}
    )


def _stat_fields(pid: int) -> list[str] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    return stat.rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, ...


def process_alive(pid: int) -> bool:
    """True for a process that exists and is not a zombie (which still answers kill 0)."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def parent_pid(pid: int) -> int:
    """The parent of ``pid``; -1 when it is gone."""
    fields = _stat_fields(pid)
    return -1 if fields is None else int(fields[1])
