"""Issue 27 item 5: the Dask scheduler stopped mid-run gave 30 s of silence, a
raw ``distributed.client`` log line and an ``I/O error`` (exit 3) while the
session log said exit 70 with no ``run_finished``, and units logged ``worker
lost`` had passed records. Now: one line naming the scheduler at once, exit 3
in both places, ``run_finished`` logged, and the units in flight unsettled (no
record, no event) with their tasks killed. Real ``dask scheduler`` and ``dask
worker`` processes; every wait is bounded."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.run.dasktests import cluster, start_worker, wait_workers
from tests.run.dispatchtests import (
    Gate,
    events,
    read_pids,
    reaped,
    start_dispatch,
    wait_files,
    wait_gone,
    write_pack,
)

pytest.importorskip("distributed")


def test_a_scheduler_stopped_mid_run_ends_it_in_one_line_with_exit_3(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    state = tmp_path / "state"
    stderr = tmp_path / "stderr"
    with Gate(tmp_path / "gate") as gate, cluster(tmp_path) as (address, procs):
        pack = write_pack(
            tmp_path,
            'edition = 4\n[workflow]\nname = "gone"\n[[workflow.task]]\nname = "t"\n'
            "map = { count = 2 }\nretries = 2\n"
            f'run = \'echo $$ > {marks}/$CRUCIBLE_KEY.task; {gate.wait}; echo "{{}}" > "$CRUCIBLE_OUTPUT"\'\n',
        )
        procs.append(start_worker(address, nanny=False, threads=2))
        wait_workers(address, 1)
        dask = ("--executor", "dask", "--scheduler", address)
        with reaped(start_dispatch(pack, state, *dask, "-j", "2", stderr=stderr)) as proc:
            wait_files(marks, "*.task", 2)
            tasks = read_pids(marks, "*.task")
            os.killpg(procs[0].pid, signal.SIGKILL)  # the scheduler
            code = proc.wait(timeout=25)  # not the client's 30 s of reconnecting
        # the worker lost its scheduler too, and closed: its tasks are gone
        assert not wait_gone(tasks, 30), "a task outlived its worker's scheduler"
    err = stderr.read_text()
    assert code == 3, err
    assert err.count("\n") == 1 and "Traceback" not in err and "distributed" not in err, err
    assert f"lost the Dask scheduler {address}" in err
    log = events(state)
    assert [e["event"] for e in log[-2:]] == ["run_finished", "shutdown"]
    assert log[-2]["status"] == "failed"
    assert log[-1]["reason"] == "error" and log[-1]["exit_code"] == 3
    # the log agrees with the records: nothing settled, nothing recorded
    assert not [e for e in log if e["event"] == "task_finished"]
    records = state / "results" / "t.jsonl"
    assert not records.exists() or not records.read_text()
