"""Stage names the plan file in a plan problem through the error's structured
location (``in_plan`` + ``name_source``), never by rewriting a ``"plan:"``
prefix: a path that merely starts with ``plan:`` is left as it is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BIN = Path(sys.executable).parent


def task(name: str, **extra: object) -> dict[str, object]:
    base = {"name": name, "kind": "command", "needs": [], "join": "all", "emits": {}}
    return base | {"emits_files": [], "retries": 0, "epilogue": False, "run": "true"} | extra


def stage(cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "crucible-stage"), "inputs", *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def plan(*tasks: dict[str, object]) -> str:
    return json.dumps(
        {"version": 1, "edition": 1, "workflow": {"name": "w", "params": {}}, "tasks": list(tasks)}
    )


def test_a_state_dir_named_plan_colon_is_not_rewritten(tmp_path: Path) -> None:
    state = tmp_path / "plan:s"
    (state / "results").mkdir(parents=True)
    (state / "plan.json").write_text(plan(task("p"), task("c", needs=["p"])))
    (state / "results" / "p.json").write_text("{")  # damaged: the error names it
    done = stage(tmp_path, "--state", "plan:s", "--task", "c")
    assert done.returncode == 2
    assert done.stderr.startswith("crucible-stage: error: plan:s/results/p.json: invalid JSON"), (
        done.stderr
    )


def test_a_plan_problem_names_the_file_and_the_json_path(tmp_path: Path) -> None:
    (tmp_path / "s").mkdir()
    (tmp_path / "p.json").write_text(plan(task("a", map="nope")))
    done = stage(tmp_path, "--state", "s", "--task", "a", "--plan", "p.json")
    assert done.returncode == 1
    assert done.stderr == (
        "crucible-stage: error: p.json:$.tasks[0].map: expected 'producer.field', got 'nope'\n"
    )
    (tmp_path / "p.json").write_text(plan(task("a")))
    done = stage(tmp_path, "--state", "s", "--task", "zz", "--plan", "p.json")
    assert done.stderr == "crucible-stage: error: p.json: task 'zz' is not in the plan\n"
