"""Crash and concurrency with real processes: SIGKILLed writers, concurrent
appenders, compaction racing appenders."""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from crucible.ledger import Ledger, Outcome, compact, verify
from tests.schemas.walker import check_tree


def _writer_child(directory: Path, trial: int, ack_fd: int) -> None:  # pragma: no cover
    """Append forever, writing each acknowledged step to ``ack_fd``."""
    try:
        with Ledger(directory, warn=lambda _m: None) as ledger:
            i = 0
            while True:
                step = f"t{trial}-{i}"
                if ledger.record("crash", step, Outcome.ok({"trial": trial, "i": i})):
                    os.write(ack_fd, f"{step}\n".encode())
                i += 1
    finally:
        os._exit(0)


def _set_torn_lines_aside(directory: Path) -> None:
    """After a test's own assertions: compact the ledger a SIGKILLed writer left.

    A SIGKILL can cut a write short (where the line crosses a page), and the
    next append starts on a fresh line, so the torn fragment becomes a bad line
    in mid-file: the expected state here (ledger.md §2), but one the
    end-of-session schema walk (tests/schemas) rightly flags in any other
    ledger. Compaction keeps every record and sets the bad lines aside
    verbatim in ``steps.jsonl.rejected-<n>``, which the walk does not read; the
    records that stay are still walked, strictly."""
    damage = verify(directory)
    report = compact(directory)
    assert report.dropped_bad == damage["bad_lines"]
    assert report.kept == damage["identities"]
    after = verify(directory)
    assert not after["damaged"] and after["records"] == damage["identities"]


def test_a_torn_line_left_by_a_kill_is_set_aside_for_the_schema_walk(ledger_dir: Path) -> None:
    with Ledger(ledger_dir) as ledger:
        assert ledger.record("crash", "a", Outcome.ok(1))
    with (ledger_dir / "steps.jsonl").open("ab") as f:
        f.write(b'{"c":"0123456789abcdef","r":{"at":')  # a write cut short by the kill
    with Ledger(ledger_dir, warn=lambda _m: None) as ledger:
        assert ledger.record("crash", "b", Outcome.ok(2))  # on a fresh line
    _checked, problems = check_tree([ledger_dir])
    assert len(problems) == 1 and "not JSON" in problems[0].message  # what the walk saw
    _set_torn_lines_aside(ledger_dir)
    checked, problems = check_tree([ledger_dir])
    assert checked == 1 and not problems
    with Ledger(ledger_dir) as ledger:
        assert [ledger.lookup("crash", s) is not None for s in "ab"] == [True, True]


def test_sigkilled_writer_loses_no_acknowledged_record(ledger_dir: Path) -> None:
    rng = random.Random(20261130)
    acknowledged: list[str] = []
    waited_for = 0
    for trial in range(200):
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover
            os.close(read_fd)
            _writer_child(ledger_dir, trial, write_fd)
        os.close(write_fd)
        # kill at a random moment: after 0-4 acknowledgements (0: while opening or
        # in the first append), plus a random 0-3 ms, whatever the machine's speed
        wanted = rng.randrange(5)
        waited_for += wanted
        seen = b""
        while seen.count(b"\n") < wanted:
            seen += os.read(read_fd, 4096)
        time.sleep(rng.uniform(0.0, 0.003))
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        with os.fdopen(read_fd, "rb") as pipe:
            seen += pipe.read()
        # a step is acknowledged only once its whole line reached the pipe
        acked = [line.decode() for line in seen.split(b"\n")[:-1]]
        acknowledged.extend(acked)
        with Ledger(ledger_dir) as ledger:  # reopen after every kill
            for step in acked:
                hit = ledger.lookup("crash", step)
                assert hit is not None, (trial, step)
                assert hit.value["trial"] == trial
            assert ledger.report.quarantined is None
    with Ledger(ledger_dir) as ledger:  # everything acknowledged, ever, is there
        missing = [s for s in acknowledged if ledger.lookup("crash", s) is None]
        assert not missing
        # and the ledger stays usable
        assert ledger.record("crash", "after", Outcome.ok(1))
    with Ledger(ledger_dir) as ledger:
        assert ledger.lookup("crash", "after") is not None
    assert len(acknowledged) >= waited_for >= 200  # the trials really appended
    _set_torn_lines_aside(ledger_dir)
    with Ledger(ledger_dir) as ledger:  # and compaction lost nothing acknowledged
        assert not [s for s in acknowledged if ledger.lookup("crash", s) is None]


APPENDER = r"""
import sys, time
from pathlib import Path
from crucible.ledger import Ledger, Outcome
directory, who, count, go = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
with Ledger(directory) as ledger:
    while not go.exists():
        time.sleep(0.001)
    for i in range(count):
        # the value is large enough that interleaved bytes would break lines
        if ledger.record("race", f"{who}-{i}", Outcome.ok({"who": who, "i": i, "pad": who * 300})):
            print(f"{who}-{i}", flush=True)
"""


def _start_appenders(
    directory: Path, names: list[str], count: int, go: Path
) -> list[subprocess.Popen[str]]:
    return [
        subprocess.Popen(
            [sys.executable, "-c", APPENDER, str(directory), who, str(count), str(go)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for who in names
    ]


def test_four_processes_times_1000_appends_lose_and_interleave_nothing(
    ledger_dir: Path,
) -> None:
    go = ledger_dir.parent / "go"
    procs = _start_appenders(ledger_dir, ["a", "b", "c", "d"], 1000, go)
    go.touch()
    # meanwhile, a reader: it may see a torn tail (an append in flight) but never a
    # bad complete line, and never takes a partial line for a record
    reads = 0
    while any(p.poll() is None for p in procs):
        with Ledger(ledger_dir, readonly=True, warn=lambda _m: None) as reader:
            assert reader.report.summary.bad_lines == 0
            for payload in reader.records()[-50:]:
                record = json.loads(payload)
                hit = reader.lookup(record["scope"], record["step"])
                assert hit is not None and hit.value["pad"] == record["step"][0] * 300
        reads += 1
    acked: set[str] = set()
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0
        acked |= set(out.split())
    assert len(acked) == 4000 and reads > 0
    report = verify(ledger_dir)
    assert report["records"] == 4000 and report["identities"] == 4000
    assert not report["damaged"] and report["bad_lines"] == 0
    data = (ledger_dir / "steps.jsonl").read_bytes()
    assert data.count(b"\n") == 4000  # exactly one line per record, no blank or merged lines
    with Ledger(ledger_dir) as ledger:
        for step in acked:
            hit = ledger.lookup("race", step)
            assert hit is not None and hit.value["pad"] == step[0] * 300
    # the appends really interleaved between processes (the lock orders whole lines)
    order = [line[line.index(b'"step":"') + 8] for line in data.split(b"\n")[:-1]]
    switches = sum(1 for x, y in itertools.pairwise(order) if x != y)
    assert switches > 3


def test_compaction_racing_appenders_loses_nothing(ledger_dir: Path) -> None:
    with Ledger(ledger_dir) as ledger:  # duplicates for compaction to drop
        for i in range(50):
            ledger.record("race", "dup", Outcome.ok(i))
    go = ledger_dir.parent / "go"
    procs = _start_appenders(ledger_dir, ["x", "y"], 250, go)
    go.touch()
    compactions = 0
    while any(p.poll() is None for p in procs):
        compact(ledger_dir)
        compactions += 1
    compact(ledger_dir)
    acked: set[str] = set()
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0
        acked |= set(out.split())
    assert len(acked) == 500 and compactions >= 2
    report = verify(ledger_dir)
    assert not report["damaged"] and report["duplicates"] == 0
    assert report["records"] == 501  # 500 appended + the one surviving "dup"
    with Ledger(ledger_dir) as ledger:
        assert all(ledger.lookup("race", s) is not None for s in acked)
        dup = ledger.lookup("race", "dup")
        assert dup is not None and dup.value == 49  # the latest record was kept
    assert not list(ledger_dir.glob(".steps.jsonl.*.tmp"))


def test_appender_follows_the_file_after_compaction(ledger_dir: Path) -> None:
    with Ledger(ledger_dir) as ledger:
        ledger.record("s", "a", Outcome.ok(1))
        before = os.stat(ledger_dir / "steps.jsonl").st_ino
        compact(ledger_dir)
        assert os.stat(ledger_dir / "steps.jsonl").st_ino != before
        # the same open ledger appends to the new file, not the unlinked old one
        ledger.record("s", "b", Outcome.ok(2))
    with Ledger(ledger_dir) as ledger:
        assert ledger.lookup("s", "a") is not None and ledger.lookup("s", "b") is not None


def test_appender_recreates_a_deleted_ledger(ledger_dir: Path) -> None:
    with Ledger(ledger_dir) as ledger:
        ledger.record("s", "a", Outcome.ok(1))
        (ledger_dir / "steps.jsonl").unlink()
        ledger.record("s", "b", Outcome.ok(2))
    with Ledger(ledger_dir) as ledger:
        assert ledger.lookup("s", "a") is None and ledger.lookup("s", "b") is not None


def test_forked_child_does_not_share_the_parents_lock(ledger_dir: Path) -> None:
    """A flock taken through an inherited descriptor would not exclude the parent:
    the child must re-open, and so must wait while the parent holds the lock."""
    import fcntl
    import select

    with Ledger(ledger_dir) as ledger:
        ledger.record("s", "parent", Outcome.ok(1))  # opens the lock descriptor
        lock_fd = ledger._appender._lock_fd
        assert lock_fd is not None
        fcntl.flock(lock_fd, fcntl.LOCK_EX)  # the parent holds the lock
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            ok = ledger.record("s", "child", Outcome.ok(2))
            os.write(write_fd, b"1" if ok else b"0")
            os._exit(0)
        os.close(write_fd)
        ready, _, _ = select.select([read_fd], [], [], 0.5)
        assert not ready, "the child appended while the parent held the lock"
        fcntl.flock(lock_fd, fcntl.LOCK_UN)
        assert os.read(read_fd, 1) == b"1"
        os.close(read_fd)
        os.waitpid(pid, 0)
    with Ledger(ledger_dir) as ledger:
        assert ledger.lookup("s", "child") is not None


def test_a_short_write_is_truncated_away_and_the_value_still_returned(ledger_dir: Path) -> None:
    """A real partial write: RLIMIT_FSIZE lets the first write(2) land only part of
    the line, the next one fails with EFBIG; the append must remove the partial
    line, report, and the step must still return its value."""
    import resource

    with Ledger(ledger_dir) as ledger:
        ledger.record("s", "before", Outcome.ok(1))
    before = (ledger_dir / "steps.jsonl").read_bytes()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.close(read_fd)
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
            resource.setrlimit(resource.RLIMIT_FSIZE, (len(before) + 40, hard))
            warned: list[str] = []
            with Ledger(ledger_dir, warn=warned.append) as ledger:
                reply = ledger.step("s", "big", lambda: "v" * 500)
            os.write(write_fd, f"{reply.value == 'v' * 500}|{warned}".encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    _, status = os.waitpid(pid, 0)
    with os.fdopen(read_fd, "rb") as pipe:
        said = pipe.read().decode()
    assert os.waitstatus_to_exitcode(status) == 0
    assert said.startswith("True|") and "File too large" in said and "not recorded" in said
    assert (ledger_dir / "steps.jsonl").read_bytes() == before  # no partial line left


def test_appender_follows_the_path_after_another_process_quarantines(ledger_dir: Path) -> None:
    from crucible.ledger._files import quarantine

    with Ledger(ledger_dir) as ledger:
        ledger.record("s", "a", Outcome.ok(1))  # the appender holds the file open
        aside = quarantine(ledger_dir / "steps.jsonl", None)  # as another process would
        assert aside is not None
        ledger.record("s", "b", Outcome.ok(2))
    assert b'"step":"b"' not in aside.read_bytes()  # not appended to the file set aside
    with Ledger(ledger_dir) as ledger:
        assert ledger.lookup("s", "b") is not None and ledger.lookup("s", "a") is None
