"""Issue 27 item 4: a ``dask worker --no-nanny`` sent SIGTERM left its event loop
(so the scheduler dropped it and the dispatcher ran its unit again elsewhere)
while its thread let the running task finish: two attempts at once in one
workspace, and two passed records for one unit. A leaving worker now kills
its units' tasks at once (docs/spec/run.md, "A lost worker"). Real ``dask
scheduler`` and ``dask worker`` processes; every wait is bounded."""

from __future__ import annotations

import json
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


def test_a_unit_whose_answer_was_lost_with_its_record_written_is_not_run_again(
    tmp_path: Path,
) -> None:
    """Library level, the narrow case the leave guard cannot cover: an attempt
    that passed and wrote its record in the instant before its worker left,
    its answer lost with the connection. The batch's end (lost worker,
    cancelled) answers it from its record instead of a retry or a resend that
    would give it a second passed record."""
    from crucible.run.executors.dask._executor import DaskExecutor

    results = tmp_path / "results"
    results.mkdir()
    record = {
        "attempt": 1, "emit_cap": 65536, "emit_sizes": {}, "exit_code": 0, "files": [],
        "files_captured": False, "format": "crucible.result/1", "key": "0", "note": "",
        "output": {}, "retryable": False, "status": "passed", "task": "t",
    }  # fmt: skip
    (results / "t.jsonl").write_text(json.dumps(record) + "\n")
    executor = DaskExecutor.__new__(DaskExecutor)
    executor._state = tmp_path
    executor._requests = {7: ("unit", "t", "0", 1, None), 8: ("unit", "t", "0", 2, None)}
    executor._pids, executor._started, executor._lost_worker = {7: 42}, {7: "tcp://w"}, "x"
    reply = executor._recorded(7)
    assert reply is not None and reply.token == 7
    assert reply.payload["kind"] == "finished" and reply.payload["pid"] == 42
    assert reply.payload["record"]["status"] == "passed"
    assert executor._recorded(8) is None  # another attempt's record: it runs
