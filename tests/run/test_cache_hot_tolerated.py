"""Records the scheduling thread amends — a tolerated failure's ``tolerated``
mark, a fold whose instances were skipped by their condition — ride the group
commit like every other record (issue 14): written without fsync on the
scheduling thread, fsynced by the session log's writer before the batch that
says they settled."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

#: crucible-dispatch with every fsync of the dispatcher traced as "<thread> <path>"
TRACED = """
import os, sys, threading
trace = os.environ["TRACE"]
real = os.fsync
me = os.getpid()
def traced(fd):
    real(fd)
    if os.getpid() != me:
        return
    try:
        what = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        what = "?"
    with open(trace, "a") as f:
        f.write(f"{threading.current_thread().name} {what}\\n")
os.fsync = traced
sys.argv[0] = "crucible-dispatch"
from crucible.run.cli import main
main()
"""

PACK = """edition = 4

[workflow]
name = "tolerant"

[[workflow.task]]
name = "flaky"
on_failure = "continue"
run = "exit 3"

[[workflow.task]]
name = "each"
map = ["a", "b"]
when = "item == 'never'"
run = "true"

[[workflow.task]]
name = "after"
needs = ["flaky", "each"]
join = "settled"
run = "true"
"""


def test_amended_records_are_fsynced_by_the_writer_not_the_scheduler(tmp_path: Path) -> None:
    pack = tmp_path / "pack.toml"
    pack.write_text(PACK)
    state = tmp_path / "state"
    trace = tmp_path / "trace.txt"
    done = subprocess.run(
        [sys.executable, "-c", TRACED, str(pack), "--state", str(state), "-j", "2"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "TRACE": str(trace)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    flaky = json.loads((state / "results" / "flaky.json").read_bytes())
    assert flaky["status"] == "failed" and flaky["tolerated"] is True
    each = json.loads((state / "results" / "each.json").read_bytes())
    assert each["status"] == "skipped"
    lines = trace.read_text().splitlines()
    records = [line for line in lines if "/results/" in line]
    assert any(line.endswith("results/flaky.json") for line in records)
    assert any(line.endswith("results/each.json") for line in records)
    assert all(line.startswith("session-log ") for line in records), records
