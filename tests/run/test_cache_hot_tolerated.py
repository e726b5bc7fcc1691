"""Records the scheduling thread amends — a tolerated failure's ``tolerated``
mark, a fold whose instances were skipped by their condition — ride the group
commit like every other record (issue 14): written without fsync on the
scheduling thread, fsynced by the session log's writer before the batch that
says they settled."""

from __future__ import annotations

import json
from pathlib import Path

from tests.run.cachetests import traced_dispatch

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
    traced = traced_dispatch(tmp_path / "trace.txt", pack, "--state", state, "-j", "2")
    flaky = json.loads((state / "results" / "flaky.json").read_bytes())
    assert flaky["status"] == "failed" and flaky["tolerated"] is True
    each = json.loads((state / "results" / "each.json").read_bytes())
    assert each["status"] == "skipped"
    records = [f for f in traced.of_dispatcher() if "/results/" in f.path]
    assert any(f.path.endswith("results/flaky.json") for f in records)
    assert any(f.path.endswith("results/each.json") for f in records)
    assert all(f.thread == "session-log" for f in records), records
