"""benchmarks/unit_phases.py wraps crucible's own functions by name: a rename
must fail here, not leave a profile that silently reports nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "unit_phases.py"


def test_every_phase_start_up_step_and_hit_step_is_clocked(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--tasks", "12", "--dir", str(tmp_path), "--json"],
        check=True,
        capture_output=True,
        timeout=120,
    )
    figures = json.loads(out.stdout)
    assert figures["units"] == 12  # both workers' units, each begun once
    phases = figures["phase_cpu_us"]
    assert set(phases) == {"begin", "start", "wait", "ended", "finish"}
    assert all(us > 0 for us in phases.values())
    assert figures["worker_cpu_us"] > sum(phases.values())
    steps = list(figures["startup_ms"])
    assert steps == [
        "crucible imported",
        "plan load",
        "admission",
        "session open",
        "workers forked",
        "first reply",
        "exit",
    ]
    # a fully cached rerun: every unit keyed, found, restored and settled once
    assert figures["hits"] == {"key": 12, "ledger find": 12, "restore": 12, "settle": 12}
    assert all(us > 0 for us in figures["hit_us"].values())


def test_a_dir_that_is_a_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.write_text("")
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--tasks", "2", "--dir", str(plain)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "Not a directory" in out.stderr
    assert plain.read_text() == ""
