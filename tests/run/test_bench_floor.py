"""benchmarks/floor_engine.py, the plain-Python floor bench_dispatch prints beside
make and crucible: it must do the work it claims (a record and two events per
task), or its figure would flatter the floor."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

FLOOR = Path(__file__).resolve().parents[2] / "benchmarks" / "floor_engine.py"


def test_the_floor_writes_a_record_and_two_events_per_task_and_leaves_no_result_file(
    tmp_path: Path,
) -> None:
    root = tmp_path / "floor"
    subprocess.run([sys.executable, str(FLOOR), str(root), "7"], check=True, timeout=60)
    records = sorted(p.name for p in (root / "results").iterdir())
    assert records == sorted(f"t{i}.json" for i in range(7))  # no temp file left
    record = json.loads((root / "results" / "t3.json").read_text())
    assert record["status"] == "passed" and record["output"] == {} and record["exit_code"] == 0
    assert list(record) == sorted(record)  # canonically ordered, as crucible's
    assert sorted(p.name for p in (root / "work").iterdir()) == sorted(f"t{i}" for i in range(7))
    assert list((root / "output").iterdir()) == []
    events = [json.loads(line) for line in (root / "session.jsonl").read_text().splitlines()]
    assert sorted(e["event"] for e in events) == ["task_finished"] * 7 + ["task_started"] * 7
    assert {e["task"] for e in events} == {f"t{i}" for i in range(7)}


def test_the_floor_lines_say_what_the_budget_leaves_crucible_over_the_floor() -> None:
    sys.path.insert(0, str(FLOOR.parent))
    try:
        from bench_dispatch import WALL_BUDGET, floor_lines
    finally:
        sys.path.remove(str(FLOOR.parent))
    # make 0.5 s, floor 0.6 s: the budget (0.7 s at 1.4x) leaves 0.7 / 0.6 of the floor
    over, leaves = floor_lines(0.5, 0.6, 0.9, 0.84)
    assert "from the pack 1.50x, from the plan 1.40x" in over
    assert f"{WALL_BUDGET * 0.5 / 0.6:.2f}x the floor" in leaves
    assert "below the floor itself" not in leaves
    # a floor slower than the budget: no Python engine meets it in those rounds
    _, under = floor_lines(0.5, 0.75, 0.9, 0.9)
    assert under.endswith("(below the floor itself)")
