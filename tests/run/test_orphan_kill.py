"""The dispatcher's last-resort kill of running tasks' groups (after an error in
its loop) signals only pids of this host: a remote executor's pids are other
hosts' processes, and the same numbers here are unrelated local processes."""

from __future__ import annotations

import signal
from types import SimpleNamespace
from typing import Any

import pytest

from crucible.run.engine import _dispatcher as engine


def _dispatcher(pids_are_local: bool | None) -> Any:
    d = engine.Dispatcher.__new__(engine.Dispatcher)
    workers = (
        SimpleNamespace()
        if pids_are_local is None
        else SimpleNamespace(pids_are_local=pids_are_local)
    )
    d.workers = workers
    tokens: dict[int, Any] = {1: SimpleNamespace(pid=4242), 2: SimpleNamespace(pid=None)}
    d._tokens = tokens
    return d


@pytest.mark.parametrize(("local", "killed"), [(True, [4242]), (None, [4242]), (False, [])])
def test_orphaned_groups_are_killed_only_when_their_pids_are_this_hosts(
    monkeypatch: pytest.MonkeyPatch, local: bool | None, killed: list[int]
) -> None:
    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(engine, "kill_group", lambda pid, sig: calls.append((pid, sig)))
    _dispatcher(local)._kill_orphaned_groups()
    assert calls == [(pid, signal.SIGKILL) for pid in killed]


def test_the_local_executor_reports_this_hosts_pids() -> None:
    from crucible.run.executors._seam import LocalExecutor

    assert LocalExecutor.pids_are_local is True
