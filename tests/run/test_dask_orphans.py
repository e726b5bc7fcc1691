"""No task process outlives the process that started it (issue 19): a Dask
worker SIGKILLed mid-task, and a dispatcher SIGKILLed under dask-local,
leave no task (nor a task's grandchild) running. Real LocalClusters and
``dask worker`` processes; every wait is bounded."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from crucible.run.executors._reaper import Reaper
from tests.run.dasktests import FIRST_OF_0, LOCAL, held_pack
from tests.run.dispatchtests import (
    finished,
    process_alive,
    read_pids,
    reaped,
    start_dispatch,
    wait_files,
    wait_gone,
    write_pack,
)

pytest.importorskip("distributed")


def test_the_reaper_kills_the_groups_of_a_dead_parent(tmp_path: Path) -> None:
    """Library level: a process with a reaper dies by SIGKILL with a task group
    registered; the reaper kills that group (its leader and a grandchild)."""
    pids = tmp_path / "pids"
    code = (
        "import os, subprocess, sys, time\n"
        "from crucible.run.executors._reaper import Reaper\n"
        "r = Reaper(1.0)\n"
        f"p = subprocess.Popen(['sh', '-c', 'sleep 300 & echo $! >> {pids}; echo $$ >> {pids};"
        " wait'], start_new_session=True)\n"
        "r.watch(p.pid)\n"
        "print(r.pid, flush=True)\n"
        "time.sleep(300)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        reaper_pid = int(parent.stdout.readline())
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (
            not pids.exists() or len(pids.read_text().split()) < 2
        ):
            time.sleep(0.05)
        group = [int(p) for p in pids.read_text().split()]
        assert len(group) == 2 and all(process_alive(p) for p in group)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
        assert not wait_gone(group)
        assert not wait_gone([reaper_pid])  # and it ends itself
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(timeout=30)
        if parent.stdout is not None:
            parent.stdout.close()


def test_a_reaper_forgets_a_reaped_group(tmp_path: Path) -> None:
    """A group forgotten (its leader reaped) is not signalled at close."""
    reaper = Reaper(0.5)
    sleeper = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        reaper.watch(sleeper.pid)
        reaper.forget(sleeper.pid)
        reaper.close()
        time.sleep(0.2)
        assert sleeper.poll() is None  # not killed: it was forgotten
    finally:
        sleeper.kill()
        sleeper.wait(timeout=30)


def test_a_sigkilled_workers_task_and_its_grandchild_do_not_survive(tmp_path: Path) -> None:
    # Instance 0's first attempt records its worker, itself and a grandchild,
    # then waits for ever; the test SIGKILLs that worker.
    grandchild = f"sleep 300 & echo $! > {tmp_path / 'marks'}/grandchild; "
    pack, marks = held_pack(
        tmp_path, "orphan", held=FIRST_OF_0, hold="wait", count=3, before=grandchild
    )
    state = tmp_path / "state"
    with reaped(start_dispatch(pack, state, "-j", "2", *LOCAL, stderr=tmp_path / "stderr")) as proc:
        wait_files(marks, "task", 1)
        wait_files(marks, "grandchild", 1)
        task = read_pids(marks, "task") + read_pids(marks, "grandchild")
        assert all(process_alive(p) for p in task)
        # mid-task: the worker registered the group with its reaper right after
        # the spawn (run.md: a task the worker started a moment before it died
        # may be missed)
        time.sleep(1)
        os.kill(read_pids(marks, "worker")[0], signal.SIGKILL)
        assert not wait_gone(task), "the dead worker's task survived it"
        # The run's own outcome after a lost worker is test_dask_executor's
        # test_a_worker_killed_mid_run_is_survived_with_its_unit_retried.
        assert proc.wait(timeout=120) in (0, 1), (tmp_path / "stderr").read_text()
    assert finished(state, key="0")[0]["note"].startswith("worker lost: tcp://127.0.0.1:")


def test_a_sigkilled_dispatcher_leaves_no_worker_and_no_task(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    pack = write_pack(
        tmp_path,
        f"""
        edition = 4
        [workflow]
        name = "headless"
        [[workflow.task]]
        name = "t"
        map = {{ count = 2 }}
        run = 'sleep 300 & echo $! > {marks}/$CRUCIBLE_KEY.grandchild; echo $PPID > {marks}/$CRUCIBLE_KEY.worker; echo $$ > {marks}/$CRUCIBLE_KEY.task; wait'
        """,
    )
    state = tmp_path / "state"
    proc = start_dispatch(pack, state, "-j", "2", *LOCAL)
    try:
        wait_files(marks, "*.task", 2)
        wait_files(marks, "*.grandchild", 2)
        tasks = read_pids(marks, "*.task") + read_pids(marks, "*.grandchild")
        workers = sorted(set(read_pids(marks, "*.worker")))
        assert workers and proc.pid not in workers
        assert all(process_alive(p) for p in tasks + workers)
        time.sleep(1)  # mid-task (see above)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        assert not wait_gone(workers), "a LocalCluster worker outlived its dispatcher"
        assert not wait_gone(tasks), "a task outlived its dispatcher"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


@pytest.mark.parametrize("count", [12, 40])
def test_units_queued_on_a_lost_worker_are_retried_like_its_running_one(
    tmp_path: Path, count: int
) -> None:
    """Units submitted ahead to a worker that is SIGKILLed (queued there, or
    staged and waiting for its slot) are lost with it: each is a lost-worker
    failure retried under its task's retries, as the unit whose task was
    running there (run.md, "Executors"); none hangs, none is rerun silently."""
    # Instance 0's first attempt holds its worker's only slot until the test
    # kills that worker; the others are submitted at once (the window): 12 go
    # one per future, 40 in batches of 4 (crucible.run.executors.dask._batches), whose
    # units behind instance 0 are handed back.
    pack, marks = held_pack(tmp_path, "queued", held=FIRST_OF_0, hold="sleep 300", count=count)
    state = tmp_path / "state"
    with reaped(start_dispatch(pack, state, "-j", "2", *LOCAL, stderr=tmp_path / "stderr")) as proc:
        wait_files(marks, "task", 1)
        time.sleep(1)  # mid-task (see above)
        os.kill(read_pids(marks, "worker")[0], signal.SIGKILL)
        assert proc.wait(timeout=120) == 0, (tmp_path / "stderr").read_text()
    done = [e for e in finished(state) if "key" in e]
    lost = [e for e in done if e["status"] == "failed"]
    assert lost and all(e["note"].startswith("worker lost: ") and e["retry"] for e in lost)
    assert "0" in {e["key"] for e in lost}
    assert sorted(e["key"] for e in done if e["status"] == "passed") == sorted(
        str(i) for i in range(count)
    )
