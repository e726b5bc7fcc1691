"""A hostile task under the real dispatcher (issue 12, items 8, 9, 10, 17): each
settles as a failed attempt with a note; the run ends, never hangs or crashes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.run.dispatchtests import result

DISPATCH = Path(sys.executable).parent / "crucible-dispatch"

PACK = """edition = 3

[workflow]
name = "hostile"

[[workflow.task]]
name = "fifo"
run = "mkfifo $CRUCIBLE_OUTPUT"
emits = {{ n = "integer" }}

[[workflow.task]]
name = "zero"
run = "ln -s {zero} $CRUCIBLE_OUTPUT"
emits = {{ n = "integer" }}

[[workflow.task]]
name = "outside"
run = "ln -s {outside} $CRUCIBLE_OUTPUT"
emits = {{ n = "integer" }}

[[workflow.task]]
name = "retried"
retries = 1
run = '''
if [ "$CRUCIBLE_ATTEMPT" = 1 ]; then
  mkdir -p "$(dirname "$CRUCIBLE_OUTPUT")/../2/retried.json/x"; exit 1
fi
echo '{{"n": 2}}' > "$CRUCIBLE_OUTPUT"
'''
emits = {{ n = "integer" }}
"""


def test_hostile_result_files_fail_their_attempts_and_the_run_ends(tmp_path: Path) -> None:
    zero = "/dev/zero"
    if not os.path.exists(zero):  # pragma: no cover - any Linux has it; never read
        os.mkfifo(tmp_path / "zero")
        zero = str(tmp_path / "zero")
    outside = tmp_path / "outside.json"
    outside.write_text('{"n": 1}')
    pack = tmp_path / "pack.toml"
    pack.write_text(PACK.format(zero=zero, outside=outside))
    state = tmp_path / "st"
    r = subprocess.run(
        [str(DISPATCH), str(pack), "--state", str(state)],
        capture_output=True,
        text=True,
        timeout=120,  # before the fix: the worker blocked in open() forever
    )
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr
    notes = {t: result(state, t)["note"] for t in ("fifo", "zero", "outside")}  # type: ignore[index]
    assert "is a FIFO, not a regular file" in notes["fifo"]
    assert "outside the workspace" in notes["zero"] and "/dev/zero" in notes["zero"]
    assert "outside the workspace" in notes["outside"]
    retried = result(state, "retried")
    assert retried is not None and retried["status"] == "passed" and retried["attempt"] == 2
