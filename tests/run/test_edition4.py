"""Edition 4 (IR v3) runs exactly as edition 3 until a pack uses one of its keys:
staging gives one file per declared input and an index, capture caps fields."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.run.dispatchtests import DISPATCH

PACK = """edition = 4

[workflow]
name = "e4"

[[workflow.task]]
name = "make"
emits = { n = "integer" }
run = 'echo "{\\"n\\": 41}" > "$CRUCIBLE_OUTPUT"'

[[workflow.task]]
name = "use"
needs = ["make"]
inputs = { n = "make.n" }
emits = { m = "integer" }
run = 'test -f "$CRUCIBLE_INPUTS_DIR/index.json" && echo "{\\"m\\": $(($(cat "$CRUCIBLE_INPUTS_DIR/n") + 1))}" > "$CRUCIBLE_OUTPUT"'
"""


def test_edition_4_pack_runs_with_edition_3_staging(tmp_path: Path) -> None:
    (tmp_path / "pack.toml").write_text(PACK)
    state = tmp_path / "state"
    proc = subprocess.run(
        [DISPATCH, str(tmp_path / "pack.toml"), "--state", str(state)],
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    plan = json.loads((state / "plan.json").read_bytes())
    assert (plan["version"], plan["edition"]) == (3, 4)
    (record,) = [json.loads(p.read_bytes()) for p in (state / "results").rglob("use*.json")]
    assert record["status"] == "passed" and record["output"] == {"m": 42}
