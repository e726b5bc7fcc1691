"""Temporary files (issue 33 item 2; docs/spec/run.md, "Temporary files"):
freed once every direct dependant settled, the marker first, rerun when a
later session needs them, shown by the report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.run.dispatchtests import dispatch, result, write_pack

MB = 1_000_000

#: each task measures the state's disk (files and workspaces, a hard link once)
#: when it has written its own temporaries: the peak of the chain
MEASURE = "du -sk --apparent-size ../../files ../../work | awk '{s+=$1} END {print s}' > ../../du-$CRUCIBLE_TASK"

CHAIN = f"""
edition = 4
[workflow]
name = "chain"

[[workflow.task]]
name = "a"
emits_files = ["t"]
temp_files = ["t"]
run = '''mkdir t && head -c {MB} /dev/zero > t/data && {MEASURE} && printf '{{}}' > "$CRUCIBLE_OUTPUT"'''

[[workflow.task]]
name = "b"
needs = ["a"]
emits_files = ["t"]
temp_files = ["t"]
run = '''mkdir t && cat inputs/a/t/data > t/data && {MEASURE} && printf '{{}}' > "$CRUCIBLE_OUTPUT"'''

[[workflow.task]]
name = "c"
needs = ["b"]
emits_files = ["t"]
temp_files = ["t"]
run = '''test ! -e inputs/a/t && mkdir t && cat inputs/b/t/data > t/data && {MEASURE} && printf '{{}}' > "$CRUCIBLE_OUTPUT"'''

[[workflow.task]]
name = "d"
needs = ["c"]
run = '''test -s inputs/c/t/data && printf '{{}}' > "$CRUCIBLE_OUTPUT"'''
"""


def _events(state: Path, kind: str) -> list[dict[str, object]]:
    lines = (state / "session.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == kind]


def test_a_chain_of_temporaries_peaks_at_two_units_not_three(tmp_path: Path) -> None:
    pack = write_pack(tmp_path, CHAIN)
    state = tmp_path / "st"
    r = dispatch(pack, "--state", state)
    assert r.returncode == 0, r.stderr
    peak = {t: int((state / f"du-{t}").read_text()) * 1024 for t in "abc"}
    # c runs holding b's temporaries and its own: a's were freed once b settled
    assert peak["c"] < 2.5 * MB, peak
    assert peak["b"] < 2.5 * MB, peak
    for t in "abc":
        assert not (state / "files" / t / "t").exists()
        marker = json.loads((state / "freed" / f"{t}.json").read_text())
        assert marker["bytes"] == MB and marker["files"] == 1
    assert [e["task"] for e in _events(state, "temp_freed")] == ["a", "b", "c"]
    shown = dispatch("report", state).stdout
    assert "TEMPORARY FILES FREED (3000000 bytes)" in shown
    assert "  b: 1 files, 1000000 bytes" in shown


SLOW = """
edition = 4
[workflow]
name = "slow"

[[workflow.task]]
name = "p"
emits_files = ["t"]
temp_files = ["t"]
run = '''mkdir t && echo bytes > t/f && printf '{}' > "$CRUCIBLE_OUTPUT"'''

[[workflow.task]]
name = "fast"
needs = ["p"]
run = '''printf '{}' > "$CRUCIBLE_OUTPUT"'''

[[workflow.task]]
name = "slow"
needs = ["p"]
run = '''while [ ! -e ../fast-done ]; do sleep 0.05; done; sleep 0.3; cat inputs/p/t/f > got && printf '{}' > "$CRUCIBLE_OUTPUT"'''

[[workflow.task]]
name = "mark"
needs = ["fast"]
run = '''touch ../slow/../fast-done; printf '{}' > "$CRUCIBLE_OUTPUT"'''
"""


def test_a_dependant_still_running_keeps_them(tmp_path: Path) -> None:
    pack = write_pack(tmp_path, SLOW)
    state = tmp_path / "st"
    r = dispatch(pack, "--state", state, "-j", "3")
    assert r.returncode == 0, r.stderr
    assert (state / "work" / "slow" / "got").read_text() == "bytes\n"
    lines = (state / "session.jsonl").read_text().splitlines()
    order = [
        (e["event"], e.get("task"))
        for e in map(json.loads, lines)
        if e["event"] in ("task_finished", "temp_freed")
    ]
    assert order.index(("temp_freed", "p")) > order.index(("task_finished", "slow"))


RETRY = """
edition = 4
[workflow]
name = "retry"

[[workflow.task]]
name = "p"
emits_files = ["t"]
temp_files = ["t"]
run = '''echo run >> ../../p-runs; mkdir t && echo bytes > t/f && printf '{}' > "$CRUCIBLE_OUTPUT"'''

[[workflow.task]]
name = "c"
needs = ["p"]
run = '''test -e ../../ok && cat inputs/p/t/f > got && printf '{}' > "$CRUCIBLE_OUTPUT"'''
"""


def test_retry_failed_that_needs_them_reruns_the_producer_and_says_why(tmp_path: Path) -> None:
    pack = write_pack(tmp_path, RETRY)
    state = tmp_path / "st"
    assert dispatch(pack, "--state", state).returncode == 1
    assert (state / "freed" / "p.json").exists()
    assert not (state / "files" / "p" / "t").exists()
    dry = dispatch(pack, "--state", state, "--resume", "--retry-failed", "-n")
    assert dry.returncode == 0, dry.stderr
    assert "its temporary files were freed and 'c' needs them" in dry.stdout + dry.stderr
    (state / "ok").touch()
    r = dispatch(pack, "--state", state, "--resume", "--retry-failed")
    assert r.returncode == 0, r.stderr
    assert (state / "p-runs").read_text() == "run\nrun\n"
    assert (state / "work" / "c" / "got").read_text() == "bytes\n"
    rec = result(state, "c")
    assert rec is not None and rec["status"] == "passed"
    assert (state / "freed" / "p.json").exists()  # freed again once c settled


KILL_BETWEEN = """
import os, signal, sys
from crucible.run.engine import _temps

def _die(self, producer):
    os.kill(os.getpid(), signal.SIGKILL)  # the marker is written; nothing deleted yet

_temps.TempFreer._delete = _die
from crucible.run.cli import main
sys.argv = ["crucible-dispatch", *sys.argv[1:]]
main()
"""

PAIR = """
edition = 4
[workflow]
name = "pair"

[[workflow.task]]
name = "p"
emits_files = ["t"]
temp_files = ["t"]
run = '''mkdir t && echo bytes > t/f && printf '{}' > "$CRUCIBLE_OUTPUT"'''

[[workflow.task]]
name = "c"
needs = ["p"]
run = '''cat inputs/p/t/f > got && printf '{}' > "$CRUCIBLE_OUTPUT"'''
"""


def test_sigkill_between_marker_and_delete_is_finished_by_the_next_session(
    tmp_path: Path,
) -> None:
    pack = write_pack(tmp_path, PAIR)
    state = tmp_path / "st"
    script = tmp_path / "die.py"
    script.write_text(KILL_BETWEEN)
    done = subprocess.run(
        [sys.executable, str(script), str(pack), "--state", str(state)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == -9, done.stderr
    # the marker is there, the files still are: no reference to a missing file
    assert (state / "freed" / "p.json").exists()
    assert (state / "files" / "p" / "t" / "f").read_text() == "bytes\n"
    assert (state / "work" / "c" / "got").read_text() == "bytes\n"
    r = dispatch(pack, "--state", state, "--resume")
    assert r.returncode == 0, r.stderr
    assert not (state / "files" / "p" / "t").exists()
    assert not os.path.lexists(state / "work" / "c" / "inputs" / "p" / "t")
