"""``-j`` under ``--executor dask-local`` (issue 19): it bounds the task
processes running at once while more units are submitted ahead (so a worker
thread that finishes starts its next unit without a round trip), and several
threads of one worker start tasks without mixing up their working
directories. Real LocalClusters; every wait is bounded."""

from __future__ import annotations

from pathlib import Path

import pytest

from crucible.run.executors.dask._executor import local_layout
from tests.run.dasktests import cluster, dispatch, start_worker, wait_workers
from tests.run.dispatchtests import events, write_pack

pytest.importorskip("distributed")


def test_local_layout_splits_the_slots_and_stages_ahead() -> None:
    two = local_layout(2, 2, None)
    assert two.slots == [1, 1]  # -j 2 over 2 workers
    assert two.threads == 1 + 2  # its slot, and its share of min(2, 8) + 1 ahead
    assert two.window == 2 * 3 * 2  # a queued unit per thread
    uneven = local_layout(5, 2, None)
    assert uneven.slots == [3, 2] and sum(uneven.slots) == 5
    # more workers than -j: each still gets a slot (run.md says so)
    assert local_layout(1, 3, None).slots == [1, 1, 1]
    # --threads-per-worker sets the Dask threads; the slots still come from -j
    given = local_layout(4, 2, 1)
    assert given.slots == [2, 2] and given.threads == 1


def _counting(tmp_path: Path, name: str, count: int, sleep: float) -> tuple[Path, Path]:
    """A pack whose ``count`` instances each count the tasks running beside it
    into ``counts`` (a line each) and check they started in their own workspace
    (procs.spawn changes the working directory around posix_spawn, and one
    worker runs units in several threads). Returns the pack and ``counts``."""
    running = tmp_path / "running"
    running.mkdir()
    counts = tmp_path / "counts"
    pack = write_pack(
        tmp_path,
        f"""
        edition = 4
        [workflow]
        name = "{name}"
        [[workflow.task]]
        name = "t"
        map = {{ count = {count} }}
        run = '[ "$(pwd -P)" = "$(cd "$CRUCIBLE_WORKSPACE" && pwd -P)" ] || exit 9; touch {running}/$CRUCIBLE_KEY; ls {running} | wc -l >> {counts}; sleep {sleep}; rm {running}/$CRUCIBLE_KEY; echo "{{}}" > "$CRUCIBLE_OUTPUT"'
        """,
    )
    return pack, counts


def test_j_bounds_the_running_tasks_while_units_are_submitted_ahead(tmp_path: Path) -> None:
    pack, counts = _counting(tmp_path, "bound", 10, 0.5)
    state = tmp_path / "state"
    proc = dispatch(pack, state, "-j", "2", "--executor", "dask-local", "--workers", "2",
                    "--threads-per-worker", "4")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    seen = [int(n) for n in counts.read_text().split()]
    assert len(seen) == 10
    assert max(seen) == 2, seen  # two at once, never more
    workers = {e["worker"] for e in events(state) if e["event"] == "task_started"}
    assert len(workers) == 2


def test_one_worker_runs_its_share_of_j_at_once(tmp_path: Path) -> None:
    """One worker, -j 3: its three slots run three tasks at once in one process."""
    pack, counts = _counting(tmp_path, "one", 6, 0.8)
    proc = dispatch(pack, tmp_path / "state", "-j", "3", "--executor", "dask-local",
                    "--workers", "1")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    seen = [int(n) for n in counts.read_text().split()]
    assert len(seen) == 6 and max(seen) <= 3
    assert max(seen) >= 2, seen  # more than one at once in one worker process


def test_a_workers_threads_start_tasks_one_at_a_time(tmp_path: Path) -> None:
    """procs.spawn changes the process's working directory around posix_spawn:
    on a worker running units in several threads, each start holds the spawn
    lock, so no task starts in another's workspace."""
    import os
    import threading

    from crucible.run.executors.dask import _executor as dask_executor

    done = threading.Event()
    result: list[tuple[object, int, object]] = []

    def start() -> None:
        launched = dask_executor._WorkerRunner._launch(
            ["true"], {}, tmp_path, None, os.devnull, False
        )
        result.append(launched)
        done.set()

    with dask_executor._SPAWN_LOCK:
        thread = threading.Thread(target=start)
        thread.start()
        assert not done.wait(0.3)  # waits for the lock another thread holds
    assert done.wait(10)
    thread.join(10)
    proc, out_r, _ = result[0]
    os.close(out_r)
    import select

    select.select([proc.pidfd], [], [], 30)  # type: ignore[attr-defined]
    assert proc.reap() == 0  # type: ignore[attr-defined]


def test_units_batched_behind_a_long_task_are_handed_back_and_run_elsewhere(
    tmp_path: Path,
) -> None:
    """40 units on one worker's window of 10 batches go as batches of 4
    (crucible.run.executors.dask._batches), each run one after another on its worker. The
    first unit of the first batch runs for seconds: the three batched behind it
    are handed back once it ran past the handback threshold, and finish long
    before it, on the worker's other slot."""
    pack = write_pack(
        tmp_path,
        """
        edition = 4
        [workflow]
        name = "handback"
        [[workflow.task]]
        name = "t"
        map = { count = 40 }
        run = 'if [ "$CRUCIBLE_KEY" = 0 ]; then sleep 4; fi; echo "{}" > "$CRUCIBLE_OUTPUT"'
        """,
    )
    state = tmp_path / "state"
    proc = dispatch(pack, state, "-j", "2", "--executor", "dask-local", "--workers", "1")
    assert proc.returncode == 0, proc.stderr
    order = [e["key"] for e in events(state) if e["event"] == "task_finished" and "key" in e]
    assert sorted(order, key=int) == [str(i) for i in range(40)]
    assert order[-1] == "0", order  # nothing waited behind the long one
    assert {"1", "2", "3"} < set(order[: order.index("0")])


def test_on_a_scheduler_j_bounds_the_running_tasks_of_batches(tmp_path: Path) -> None:
    """--executor dask: the window is -j batches, each running one task at a
    time, so a worker with more threads than -j still runs at most -j tasks at
    once; 30 units there go in batches (crucible.run.executors.dask._batches)."""
    pack, counts = _counting(tmp_path, "remote", 30, 0.2)
    with cluster(tmp_path) as (address, procs):
        procs.append(start_worker(address, threads=4))
        wait_workers(address, 1)
        proc = dispatch(pack, tmp_path / "state", "-j", "2", "--executor", "dask",
                        "--scheduler", address)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    seen = [int(n) for n in counts.read_text().split()]
    assert len(seen) == 30
    assert max(seen) == 2, seen
