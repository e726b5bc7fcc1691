"""``--executor slurm`` on the real local cluster (ci/slurm-up.sh; issue 30):
the fanout, matrix and daily examples give the same records, outputs and
captured files as local runs."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.run.dispatchtests import DISPATCH, REPO, events
from tests.run.slurmtests import SLURM, event_contents, tree

pytestmark = pytest.mark.usefixtures("slurm_cluster")
from tests.run.slurmtests import slurm_cluster  # noqa: E402,F401  (the fixture)

EXAMPLES = ("fanout", "matrix", "daily")


def test_the_examples_give_the_same_records_and_files_as_local(tmp_path: Path) -> None:
    """The three SLURM runs go at once (the cluster queues their arrays)."""
    runs = {}
    for name in EXAMPLES:
        pack = REPO / "examples" / name / "pack.toml"
        for executor in ("local", "slurm"):
            state = tmp_path / name / executor
            argv = [DISPATCH, str(pack), "--state", str(state), "-j", "2"]
            if executor == "slurm":
                argv += SLURM
            runs[name, executor] = subprocess.Popen(
                argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
            )
    for (name, executor), proc in runs.items():
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, (name, executor, err)
    for name in EXAMPLES:
        local, slurm = tmp_path / name / "local", tmp_path / name / "slurm"
        for sub in ("results", "output", "instances", "files"):
            assert tree(local / sub) == tree(slurm / sub), (name, sub)
        assert (local / "outputs.json").exists() == (slurm / "outputs.json").exists()
        if (local / "outputs.json").exists():
            assert (local / "outputs.json").read_bytes() == (slurm / "outputs.json").read_bytes()
        assert event_contents(local) == event_contents(slurm), name
        workers = {e["worker"] for e in events(slurm) if e["event"] == "task_started"}
        assert workers and all("(slurm job " in w for w in workers), workers
        # the run's own directory is gone once every job answered
        assert not (slurm / "slurm").exists() or not any((slurm / "slurm").iterdir())
