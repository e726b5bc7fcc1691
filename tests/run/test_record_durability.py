"""Result records are fsynced by the dispatcher's group commit, not by the
workers: before the session lines of their batch, and before anything that
depends on them starts (docs/spec/run.md, "Session log"; issue 14)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from crucible.run.session import _log as session
from crucible.run.session import events
from tests.packed import keyed
from tests.run.dispatchtests import DISPATCH, start_dispatch

#: crucible-dispatch with every os.fsync traced: "<pid> <what>" per call, in
#: order, appended after the fsync returned
TRACED = """
import os, sys
log = os.environ["FSYNC_LOG"]
real = os.fsync
def note(line):
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, line.encode())
    os.close(fd)
def traced(fd):
    real(fd)
    try:
        what = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        what = "?"
    note(f"{os.getpid()} fsync {what}\\n")
os.fsync = traced
note(f"{os.getpid()} dispatcher\\n")
sys.argv[0] = "crucible-dispatch"
from crucible.run.cli import main
main()
"""

CHAIN = """
edition = 4
[workflow]
name = "chain"
[[workflow.task]]
name = "a"
emits = {{ x = "integer" }}
run = 'echo "{{\\"x\\": 1}}" > "$CRUCIBLE_OUTPUT"'
[[workflow.task]]
name = "b"
needs = ["a"]
inputs = {{ x = "a.x" }}
run = 'echo "{pid} start-b" >> {log}'
[[workflow.task]]
name = "m"
map = {{ start = 0, end = 19 }}
run = 'true'
"""


def test_the_log_fsyncs_record_files_before_the_lines_of_their_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    real = os.fsync

    def traced(fd: int) -> None:
        real(fd)
        calls.append(os.readlink(f"/proc/self/fd/{fd}"))

    monkeypatch.setattr(session, "_fsync", traced)
    record = tmp_path / "results" / "t.jsonl"
    record.parent.mkdir()
    record.write_bytes(b"{}\n")
    log = session.SessionLog(tmp_path / "session.jsonl", 1)
    woken: list[int] = []
    log.on_durable = lambda: woken.append(log.durable_seq)
    log.sync([str(record), str(record.parent)])
    log.sync([str(record)])  # many instances of one task: one fsync
    log.emit(events.task_finished(task="t", key="0", status="passed", note=None))
    assert log.commit() == 1
    log.close()
    assert calls == [str(record), str(record.parent), str(tmp_path / "session.jsonl")]
    assert log.durable_seq == 1 and woken == [1]


def test_workers_do_not_fsync_and_a_dependant_waits_for_its_producers_record(
    tmp_path: Path,
) -> None:
    trace = tmp_path / "fsyncs.txt"
    pack = tmp_path / "pack.toml"
    pack.write_text(textwrap.dedent(CHAIN.format(pid=0, log=trace)).lstrip())
    state = tmp_path / "state"
    done = subprocess.run(
        [sys.executable, "-c", TRACED, str(pack), "--state", str(state), "-j", "2"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "FSYNC_LOG": str(trace)},
    )
    assert done.returncode == 0, done.stderr
    lines = trace.read_text().splitlines()
    dispatcher = lines[0].split()[0]
    assert lines[0] == f"{dispatcher} dispatcher"
    workers = [line for line in lines if not line.startswith(("0 ", f"{dispatcher} "))]
    assert workers == []  # 0 fsyncs per settled unit in a worker (was 2)
    a_record = f"{dispatcher} fsync {state / 'results' / 'a.json'}"
    assert a_record in lines
    assert lines.index(a_record) < lines.index("0 start-b")
    # one fsync of the packed file per batch, however many instances it holds
    packed = [line for line in lines if line.endswith("results/m.jsonl")]
    assert 1 <= len(packed) < 20
    assert len(keyed(state, "m")) == 20


def test_sigkill_mid_fanout_then_resume_completes_with_every_record_once(
    tmp_path: Path,
) -> None:
    pack = tmp_path / "pack.toml"
    pack.write_text(
        textwrap.dedent(
            """
            edition = 4
            [workflow]
            name = "wide"
            [[workflow.task]]
            name = "t"
            map = { start = 0, end = 199 }
            emits = { k = "string" }
            run = 'printf "{\\"k\\": \\"%s\\"}" "$CRUCIBLE_KEY" > "$CRUCIBLE_OUTPUT"'
            [[workflow.task]]
            name = "fold"
            needs = ["t"]
            inputs = { ks = "t.k" }
            emits = { n = "integer" }
            run = 'echo "{\\"n\\": $(ls "$CRUCIBLE_INPUTS_DIR/ks" | wc -l)}" > "$CRUCIBLE_OUTPUT"'
            """
        ).lstrip()
    )
    state = tmp_path / "state"
    proc = start_dispatch(pack, state, "-j", "2")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if state.exists() and len(keyed(state, "t")) >= 40:
            break
        time.sleep(0.01)
    assert proc.poll() is None, "the run ended before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    time.sleep(0.5)  # the orphaned workers notice and exit without a record
    assert not (state / "results" / "fold.json").exists()
    again = subprocess.run(
        [DISPATCH, str(pack), "--state", str(state), "--resume"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0, again.stderr
    lines = [json.loads(x) for x in (state / "results" / "t.jsonl").read_bytes().splitlines()]
    keys = [x["key"] for x in lines]
    assert sorted(keys, key=int) == [str(i) for i in range(200)]  # every record once
    assert json.loads((state / "results" / "fold.json").read_bytes())["output"] == {"n": 200}


def test_closing_the_slots_twice_leaves_other_descriptors_alone(tmp_path: Path) -> None:
    """The dispatcher closes its slots at the end of run() and again in close();
    meanwhile the session log's writer thread opens record files to fsync them,
    which may get the numbers just freed (a second close made its fsync fail
    with EBADF: a run ended with exit 3 under load)."""
    from crucible.run.executors._slots import Slots

    slots = Slots(1)
    slots.close()
    fd = os.open(tmp_path / "record", os.O_RDWR | os.O_CREAT, 0o644)  # a freed number
    try:
        slots.close()
        os.fstat(fd)  # still open
    finally:
        os.close(fd)
