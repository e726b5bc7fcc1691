"""The SLURM executor's pure parts (issue 30), without a cluster: --slurm-extra,
resources to sbatch options, the --time margin, sinfo's GPU field, and the
node's check before any unit."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

import crucible
from crucible.core.errors import InputRefused, UsageError
from crucible.core.plan import Task
from crucible.run._options import RunOptions
from crucible.run.executors.slurm._cli import Partition, _gpus, extra_args
from crucible.run.executors.slurm._executor import MARGIN, _partition, _resource_args, time_limit
from crucible.run.executors.slurm._node import NodeSpec, check_node

NODE = Partition(name="debug", default=True, cpus=8, memory_mib=16000, gpus=2)


def test_extra_args_are_split_as_a_shell_would() -> None:
    assert extra_args("--constraint=skylake --comment 'two words'") == [
        "--constraint=skylake", "--comment", "two words",
    ]  # fmt: skip
    assert extra_args(None) == [] and extra_args("") == []


@pytest.mark.parametrize(
    "text", ["--output=x", "-o x", "-ox", "--wrap 'echo'", "--array=0-3", "-J name", "--error=e"]
)
def test_extra_args_may_not_set_what_the_executor_sets(text: str) -> None:
    with pytest.raises(UsageError, match="--slurm-extra may not set"):
        extra_args(text)


def test_unbalanced_quotes_in_extra_args_are_a_usage_error() -> None:
    with pytest.raises(UsageError, match="--slurm-extra: No closing quotation"):
        extra_args("--comment 'open")


def _task(members: dict[str, Any]) -> Task:
    return Task.from_json({"name": "t", "kind": "command", "run": "x", **members}, "$", 3)


def test_resources_become_cpus_mem_with_the_runners_share_and_gres() -> None:
    task = _task({"resources": {"cpus": 4, "memory": 1 << 30, "gpu": 1}})
    assert _resource_args("t", task, [NODE], "here") == [
        "--cpus-per-task=4", "--mem=1280M", "--gres=gpu:1",
    ]  # fmt: skip
    assert _resource_args("t", _task({}), [NODE], "here") == ["--cpus-per-task=1"]


@pytest.mark.parametrize(
    ("need", "short"),
    [
        ({"cpus": 9}, "cpus=9 (largest node: 8)"),
        ({"memory": 1 << 40}, "memory=1048832 MiB with the runner's (largest node: 16000 MiB)"),
        ({"gpu": 3}, "gpu=3 (most on a node: 2)"),
    ],
)
def test_resources_no_node_offers_are_refused(need: dict[str, int], short: str) -> None:
    with pytest.raises(InputRefused) as caught:
        _resource_args("t", _task({"resources": need}), [NODE], "SLURM partition 'debug'")
    assert str(caught.value) == (
        f"task 't' needs resources no node of SLURM partition 'debug' offers: {short}"
    )


def test_the_time_limit_is_the_units_timeouts_plus_the_margin_in_minutes() -> None:
    assert MARGIN == 120
    assert time_limit(None, 8) is None
    assert time_limit(30, 1) == "3"  # 30 + 120 s -> 2.5 min -> 3
    assert time_limit(60, 8) == "10"  # 480 + 120 s


def test_sinfo_gres_fields_give_the_gpu_count() -> None:
    assert _gpus("(null)") == 0
    assert _gpus("gpu:2") == 2
    assert _gpus("gpu:a100:4(S:0-1)") == 4
    assert _gpus("craynetwork:4,gpu:1") == 1


def test_the_default_partition_unless_one_is_named() -> None:
    other = Partition(name="long", default=False, cpus=2, memory_mib=1000, gpus=0)
    assert _partition([NODE, other], None) == [NODE]
    assert _partition([NODE, other], "long") == [other]
    with pytest.raises(
        UsageError, match=r"--slurm-partition x: no such partition \(sinfo lists: debug, long\)"
    ):
        _partition([NODE, other], "x")


def _spec(state: Path, **changes: object) -> NodeSpec:
    fields: dict[str, object] = {
        "run_id": "r", "plan": {}, "model": None, "options": RunOptions(plan=state, state=state),
        "emit_cap": 1, "environ": {}, "pack_dir": str(state), "token": "token\n",
        "version": crucible.__version__, "python": tuple(sys.version_info[:2]),
    }  # fmt: skip
    fields.update(changes)
    return NodeSpec(**fields)  # type: ignore[arg-type]


def test_a_node_checks_the_token_the_version_and_the_pack_dir(tmp_path: Path) -> None:
    (tmp_path / "executor-token").write_text("token\n")
    assert check_node(_spec(tmp_path)) is None
    problem = check_node(_spec(tmp_path, token="another\n"))
    assert problem is not None and "reads another run's token" in problem
    problem = check_node(_spec(tmp_path, version="0.0.0"))
    assert problem is not None and "the dispatcher runs crucible 0.0.0" in problem
    problem = check_node(_spec(tmp_path, pack_dir=str(tmp_path / "gone")))
    assert problem is not None and "does not see the pack directory" in problem
    (tmp_path / "executor-token").unlink()
    problem = check_node(_spec(tmp_path))
    assert problem is not None and "cannot read it (No such file or directory)" in problem
