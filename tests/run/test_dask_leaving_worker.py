"""Issue 27 item 4: a ``dask worker --no-nanny`` sent SIGTERM left its event loop
(so the scheduler dropped it and the dispatcher ran its unit again elsewhere)
while its thread let the running task finish: two attempts at once in one
workspace, and two passed records for one unit. A leaving worker now kills
its units' tasks at once (docs/spec/run.md, "A lost worker"). Real ``dask
scheduler`` and ``dask worker`` processes; every wait is bounded."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.packed import keyed
from tests.run.dasktests import cluster, start_worker, wait_workers
from tests.run.dispatchtests import reaped, start_dispatch, wait_files, write_pack

pytest.importorskip("distributed")


def test_a_sigtermed_workers_unit_is_dead_before_it_runs_again(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    # the first start of instance 0 (whichever attempt: a unit lost before its
    # start was announced is sent again as the same attempt) records its worker
    # and itself, and would finish by itself 4 s later; every later start notes
    # whether that first one still runs
    script = (
        f'if [ "$CRUCIBLE_KEY" = 0 ] && mkdir {marks}/first 2>/dev/null; then '
        f"echo $PPID > {marks}/worker; echo $$ > {marks}/task; sleep 4; echo > {marks}/late; "
        f'elif [ "$CRUCIBLE_KEY" = 0 ] && kill -0 "$(cat {marks}/task)" 2>/dev/null; then '
        f"echo > {marks}/overlap; fi; "
        'echo "{}" > "$CRUCIBLE_OUTPUT"'
    )
    pack = write_pack(
        tmp_path,
        'edition = 4\n[workflow]\nname = "leave"\n[[workflow.task]]\nname = "t"\n'
        f"map = {{ count = 2 }}\nretries = 1\nrun = '{script}'\n",
    )
    state = tmp_path / "state"
    stderr = tmp_path / "stderr"
    with cluster(tmp_path) as (address, procs):
        workers = [start_worker(address, nanny=False) for _ in range(2)]
        procs.extend(workers)
        wait_workers(address, 2)
        dask = ("--executor", "dask", "--scheduler", address)
        with reaped(start_dispatch(pack, state, *dask, stderr=stderr)) as proc:
            wait_files(marks, "task", 1)
            wait_files(marks, "worker", 1)
            leaving = int((marks / "worker").read_text())
            os.kill(leaving, signal.SIGTERM)
            code = proc.wait(timeout=120)
        (gone,) = [w for w in workers if w.pid == leaving]
        gone.wait(timeout=60)  # whatever it still had to write is written
    assert code == 0, stderr.read_text()
    assert not (marks / "overlap").exists(), "instance 0 ran again while its first start ran"
    assert not (marks / "late").exists(), "the leaving worker let its task finish"
    records = keyed(state, "t")
    assert sorted(records) == ["0", "1"]
    assert all(r["status"] == "passed" for r in records.values())
    lines = (state / "results" / "t.jsonl").read_text().splitlines()
    assert len(lines) == 2, lines  # never two passed records for one unit
