"""`report STATE` shows the run's results (STATE/outputs.json) under its table."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.run.dispatchtests import DISPATCH

PACK = """edition = 4

[workflow]
name = "r"

[workflow.outputs]
good = "ok.v"
gone = "bad.v"

[[workflow.task]]
name = "ok"
emits = { v = "string" }
run = 'printf "{\\"v\\": \\"\\\\u001b]0;x\\"}" > "$CRUCIBLE_OUTPUT"'

[[workflow.task]]
name = "bad"
emits = { v = "integer" }
run = 'exit 3'
"""


def test_report_lists_present_and_absent_results(tmp_path: Path) -> None:
    (tmp_path / "pack.toml").write_text(PACK)
    state = tmp_path / "s"
    run = subprocess.run(
        [DISPATCH, str(tmp_path / "pack.toml"), "--state", str(state)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1, run.stderr
    shown = subprocess.run(
        [DISPATCH, "report", str(state)], capture_output=True, text=True, timeout=60
    )
    assert shown.returncode == 0, shown.stderr
    results = shown.stdout.split("\nRESULTS\n", 1)[1].splitlines()
    assert results[0].startswith("  gone: absent (failed")
    # the value's control character is escaped, never sent to the terminal
    assert results[1].startswith("  good = ") and "\x1b" not in results[1]
    assert (
        "RESULTS"
        not in subprocess.run(
            [DISPATCH, "report", str(state), "ok"], capture_output=True, text=True, timeout=60
        ).stdout
    )
