"""Whose fsync makes a Dask worker's records durable (docs/spec/run.md, "Records
ride the group commit"): dask-local's workers share this host's page cache and
hand their records to the dispatcher's group commit, as local workers do; a
worker of a scheduler the dispatcher did not start may write STATE through
another host's mount, so it fsyncs its own."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

dask_executor = pytest.importorskip("crucible.run.executors.dask._executor")

from crucible.run._options import RunOptions  # noqa: E402


class _FakeRunner:
    durable_records = True

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs


@pytest.mark.parametrize(("executor", "durable"), [("dask-local", False), ("dask", True)])
def test_a_dask_workers_records_are_fsynced_by_whoever_shares_its_cache(
    monkeypatch: pytest.MonkeyPatch, executor: str, durable: bool
) -> None:
    monkeypatch.setattr(dask_executor, "_WorkerRunner", _FakeRunner)
    monkeypatch.setattr(dask_executor, "_reaper", lambda grace: None)
    monkeypatch.setattr(dask_executor, "_RUNNERS", {})
    monkeypatch.setattr(dask_executor, "_CONTROLS", {})
    options = RunOptions(plan=Path("p"), state=Path("s"), executor=executor, kill_grace=1.0)
    spec = dask_executor._Spec(
        run_id=f"r-{executor}",
        plan={},
        model=None,  # the fake runner reads none of it
        options=options,
        emit_cap=1,
        environ={},
        pack_dir=".",
        slots={},
    )
    worker = SimpleNamespace(
        name="w",
        state=SimpleNamespace(nthreads=1),
        loop=SimpleNamespace(add_callback=lambda *args: None),  # the leave guard's
    )
    runner = dask_executor._runner(spec, worker)
    assert runner.durable_records is durable
