"""``--executor dask`` on workers that dask-jobqueue's ``SLURMCluster`` starts as
jobs of the real local SLURM cluster (ci/slurm-up.sh; issue 30 item 3): the
cluster is started in this process and its address passed to the dispatcher.
Its workers reach their ``--lifetime`` (the walltime dask-jobqueue sets below
the job's) mid-run, again and again (``--lifetime-restart``: the nanny starts
a fresh worker in the same job): the units they ran are retried, and none runs
to its end twice (crucible.run.executors.dask._close)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.packed import keyed
from tests.run.dispatchtests import dispatch, events, write_pack

pytest.importorskip("distributed")
pytest.importorskip("dask_jobqueue")
pytestmark = pytest.mark.usefixtures("slurm_cluster")
from tests.run.slurmtests import slurm_cluster  # noqa: E402,F401  (the fixture)


@pytest.fixture
def jobqueue(tmp_path: Path) -> Iterator[Any]:
    """Two Dask workers, each a SLURM job, each closing 5 s after it started
    (and started again in its job); the scheduler never reruns a task silently."""
    import dask
    import dask_jobqueue.slurm
    import distributed

    # untyped third-party classes
    slurm_cluster_type: Any = dask_jobqueue.slurm.SLURMCluster
    client_type: Any = distributed.Client

    with dask.config.set({"distributed.scheduler.allowed-failures": 0}):
        cluster = slurm_cluster_type(
            cores=1,
            processes=1,
            memory="1GB",
            walltime="00:05:00",
            python=sys.executable,
            scheduler_options={"host": "127.0.0.1", "dashboard_address": None},
            worker_extra_args=[
                "--lifetime",
                "5s",
                "--lifetime-stagger",
                "0s",
                "--lifetime-restart",
            ],
            log_directory=str(tmp_path / "worker-logs"),
            local_directory=str(tmp_path / "worker-scratch"),
        )
        try:
            cluster.scale(2)
            with client_type(cluster, timeout=30) as client:
                client.wait_for_workers(2, timeout=60)
            yield cluster
        finally:
            cluster.close()


def test_workers_reaching_their_lifetime_mid_run_have_their_units_retried_never_run_twice(
    tmp_path: Path, jobqueue: Any
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    pack = write_pack(
        tmp_path,
        f"""
        edition = 4
        [workflow]
        name = "lifetime"
        [[workflow.task]]
        name = "t"
        map = {{ count = 8 }}
        retries = 6
        run = 'echo "start $CRUCIBLE_KEY" >> {marks}/log; sleep 2; echo "end $CRUCIBLE_KEY" >> {marks}/log; echo "{{}}" > "$CRUCIBLE_OUTPUT"'
        """,
    )
    state = tmp_path / "state"
    done = dispatch(
        pack, "--state", state, "--executor", "dask", "--scheduler", jobqueue.scheduler_address,
        "-j", "2", timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert sorted(keyed(state, "t")) == [str(k) for k in range(8)]
    ends = [
        line.split()[1]
        for line in (marks / "log").read_text().splitlines()
        if line.startswith("end")
    ]
    assert sorted(ends) == [str(k) for k in range(8)]  # each unit ran to its end once
    lost = [e for e in events(state) if e["event"] == "task_finished" and e.get("retry")]
    assert lost and all(e["note"].startswith("worker lost: tcp://") for e in lost), lost
