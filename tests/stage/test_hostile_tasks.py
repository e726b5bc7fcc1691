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


TAMPER = """edition = 3

[workflow]
name = "tamper"

[[workflow.task]]
name = "p"
run = "mkdir out && printf captured > out/f"
emits_files = ["out"]

[[workflow.task]]
name = "a"
needs = ["p"]
run = "chmod u+w inputs/p/out/f && printf EVIL > inputs/p/out/f"

[[workflow.task]]
name = "b"
needs = ["p"]
emits = {{ seen = "string" }}
run = '''printf '{{"seen": "%s"}}' "$(cat inputs/p/out/f)" > "$CRUCIBLE_OUTPUT"'''

[[workflow.task]]
name = "c"
needs = ["p", "a"]
join = "settled"
emits = {{ seen = "string" }}
run = '''printf '{{"seen": "%s"}}' "$(cat inputs/p/out/f)" > "$CRUCIBLE_OUTPUT"'''
"""


def test_a_consumer_writing_a_staged_file_is_named_and_the_next_sees_the_capture(
    tmp_path: Path,
) -> None:
    pack = tmp_path / "pack.toml"
    pack.write_text(TAMPER.format())
    state = tmp_path / "st"
    r = subprocess.run(
        [str(DISPATCH), str(pack), "--state", str(state), "-j", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1, r.stderr
    a = result(state, "a")
    assert a is not None and a["status"] == "failed" and a["retryable"] is False
    assert "inputs/p/out/f" in a["note"] and "changed while a held it" in a["note"]
    # b may be staged ahead while a runs (dispatch stages the next unit early);
    # a is checked before its slot is given back, and what a changed is undone
    # in b's workspace before b starts (inputs.md 3.4)
    b = result(state, "b")
    assert b is not None and b["status"] == "passed" and b["output"] == {"seen": "captured"}
    # c is staged after a was settled: it gets the restored copy
    c = result(state, "c")
    assert c is not None and c["status"] == "passed" and c["output"] == {"seen": "captured"}
    assert (state / "files" / "p" / "out" / "f").read_bytes() == b"captured"


TAMPER_TWICE = """edition = 3

[workflow]
name = "tamper-twice"

[[workflow.task]]
name = "p"
run = "mkdir out && printf captured > out/f"
emits_files = ["out"]

[[workflow.task]]
name = "a"
needs = ["p"]
run = "chmod u+w inputs/p/out/f && printf EVIL > inputs/p/out/f"

[[workflow.task]]
name = "a2"
needs = ["p", "a"]
join = "settled"
run = "chmod u+w inputs/p/out/f && printf EVIL2 > inputs/p/out/f"

[[workflow.task]]
name = "c"
needs = ["p", "a2"]
join = "settled"
emits = {{ seen = "string" }}
run = '''printf '{{"seen": "%s"}}' "$(cat inputs/p/out/f)" > "$CRUCIBLE_OUTPUT"'''
"""


def test_a_second_writer_through_the_restored_file_is_named_and_the_store_kept(
    tmp_path: Path,
) -> None:
    """The first write restores the store to a fresh inode; the second writer,
    handed that inode, is caught the same way (before: its write stayed in the
    store and c read it)."""
    pack = tmp_path / "pack.toml"
    pack.write_text(TAMPER_TWICE.format())
    state = tmp_path / "st"
    r = subprocess.run(
        [str(DISPATCH), str(pack), "--state", str(state), "-j", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1, r.stderr
    for writer in ("a", "a2"):
        rec = result(state, writer)
        assert rec is not None and rec["status"] == "failed", (writer, rec)
        assert f"changed while {writer} held it" in rec["note"]
    c = result(state, "c")
    assert c is not None and c["status"] == "passed" and c["output"] == {"seen": "captured"}
    assert (state / "files" / "p" / "out" / "f").read_bytes() == b"captured"
