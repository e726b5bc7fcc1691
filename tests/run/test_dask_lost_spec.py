"""A Dask worker that dies holding the only copy of the run's spec (the data
every unit waits on, scattered once) must not leave a unit unsettled: Dask
then cancels the units waiting on it, and the dispatcher used to end the run
"run failed: 3 passed, 0 failed" (exit 1 with no failure counted). Real
``dask scheduler`` and ``dask worker`` processes; every wait is bounded."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.run.dispatchtests import DISPATCH, events, write_pack
from tests.run.test_dask_executor import DASK, cluster, wait_workers

pytest.importorskip("distributed")


def _worker(address: str) -> subprocess.Popen[bytes]:
    # no nanny: the worker the test kills stays dead (a nanny would restart
    # it empty, which is the same loss, later)
    argv = [DASK, "worker", address, "--nworkers", "1", "--nthreads", "1", "--no-nanny",
            "--no-dashboard", "--host", "127.0.0.1"]  # fmt: skip
    return subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )


def _wait_written(path: Path, seconds: float = 60) -> int:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists() and (text := path.read_text()).endswith("\n"):
            return int(text)
        time.sleep(0.05)
    raise AssertionError(f"{path} was not written")


def test_a_unit_whose_spec_died_with_its_worker_is_sent_again(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    gate = tmp_path / "gate"
    gate.write_text("closed")
    # The first attempt records its worker ($PPID) and waits; the test starts
    # a second worker (which never got the spec: it joined after the scatter)
    # and SIGKILLs the first. The retry can only run on the second worker.
    pack = write_pack(
        tmp_path,
        f"""
        edition = 4
        [workflow]
        name = "spec"
        [[workflow.task]]
        name = "t"
        retries = 1
        run = 'if [ "$CRUCIBLE_ATTEMPT" = 1 ]; then echo $PPID > {marks}/worker; echo $$ > {marks}/task; while [ -e {gate} ]; do sleep 0.05; done; fi; echo "{{}}" > "$CRUCIBLE_OUTPUT"'
        """,
    )
    state = tmp_path / "state"
    with cluster(tmp_path) as (address, procs):
        procs.append(_worker(address))
        wait_workers(address, 1)
        with (tmp_path / "stderr").open("wb") as err:
            proc = subprocess.Popen(
                [DISPATCH, str(pack), "--state", str(state), "--executor", "dask",
                 "--scheduler", address],
                stdout=subprocess.DEVNULL,
                stderr=err,
            )  # fmt: skip
        try:
            _wait_written(marks / "task")
            first = _wait_written(marks / "worker")
            procs.append(_worker(address))
            wait_workers(address, 2)
            os.kill(first, signal.SIGKILL)
            code = proc.wait(timeout=120)
        finally:
            gate.unlink()
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    stderr = (tmp_path / "stderr").read_text()
    assert code == 0, stderr
    assert "run passed: 1 passed, 0 failed" in stderr
    finished = [e for e in events(state) if e["event"] == "task_finished"]
    assert [(e["attempt"], e["status"]) for e in finished] == [(1, "failed"), (2, "passed")]
    assert finished[0]["note"].startswith("worker lost: tcp://127.0.0.1:")
