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
