"""Issue 27 item 16: a mapped task's aggregate note counted instances skipped by
their condition as "did not pass" and named one as the first, while the real
failures were others. It names the first failure, skips counted apart (the
record's note is what the session log, the report and settled consumers' index
show)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.run.dispatchtests import DISPATCH, finished, write_pack

PACK = """
edition = 4
[workflow]
name = "fold"
[[workflow.task]]
name = "t"
map = { count = 5 }
when = "item >= 2"
run = 'if [ "$CRUCIBLE_KEY" = 3 ]; then echo "no three" >&2; exit 4; fi; echo "{}" > "$CRUCIBLE_OUTPUT"'
"""


def test_the_aggregate_note_names_the_first_failure_and_counts_skips_apart(
    tmp_path: Path,
) -> None:
    pack = write_pack(tmp_path, PACK)
    state = tmp_path / "state"
    proc = subprocess.run(
        [DISPATCH, str(pack), "--state", str(state)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1, proc.stderr
    note = "1 of 5 instances failed, 2 skipped; first '3': failed: exited with status 4 (see logs/t/3.log)"
    record = json.loads((state / "results" / "t.json").read_text())
    assert record["note"].split("\n")[0] == note
    assert record["counts"] == {"passed": 2, "failed": 1, "skipped": 2}
    (aggregate,) = [e for e in finished(state) if e["task"] == "t" and e.get("key") is None]
    assert aggregate["note"].split("\n")[0] == note
