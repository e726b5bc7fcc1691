"""A Dask worker that dies holding the only copy of the run's spec (the data
every unit waits on, scattered once) must not leave a unit unsettled: Dask
then cancels the units waiting on it, and the dispatcher used to end the run
"run failed: 3 passed, 0 failed" (exit 1 with no failure counted). Real
``dask scheduler`` and ``dask worker`` processes; every wait is bounded."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.run.dasktests import cluster, held_pack, start_worker, wait_workers
from tests.run.dispatchtests import Gate, finished, read_pids, reaped, start_dispatch, wait_files

pytest.importorskip("distributed")


def test_a_unit_whose_spec_died_with_its_worker_is_sent_again(tmp_path: Path) -> None:
    # The first attempt records its worker and waits; the test starts a second
    # worker (which never got the spec: it joined after the scatter) and
    # SIGKILLs the first. The retry can only run on the second worker.
    with Gate(tmp_path / "gate") as gate, cluster(tmp_path) as (address, procs):
        pack, marks = held_pack(
            tmp_path, "spec", held='[ "$CRUCIBLE_ATTEMPT" = 1 ]', hold=gate.wait
        )
        state = tmp_path / "state"
        procs.append(start_worker(address, nanny=False))
        wait_workers(address, 1)
        dask = ("--executor", "dask", "--scheduler", address)
        with reaped(start_dispatch(pack, state, *dask, stderr=tmp_path / "stderr")) as proc:
            wait_files(marks, "task", 1)
            wait_files(marks, "worker", 1)
            (first,) = read_pids(marks, "worker")
            procs.append(start_worker(address, nanny=False))
            wait_workers(address, 2)
            os.kill(first, signal.SIGKILL)
            code = proc.wait(timeout=120)
            gate.open()
    stderr = (tmp_path / "stderr").read_text()
    assert code == 0, stderr
    assert "run passed: 1 passed, 0 failed" in stderr
    done = finished(state)
    assert [(e["attempt"], e["status"]) for e in done] == [(1, "failed"), (2, "passed")]
    assert done[0]["note"].startswith("worker lost: tcp://127.0.0.1:")
