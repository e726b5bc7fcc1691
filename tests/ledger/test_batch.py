"""Batch append (docs/spec/ledger.md §5, "Batch append"): several records with one
write and one fsync under the lock, each indexed; a batch torn by SIGKILL leaves
a durable prefix of whole records and never a half record trusted."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from crucible.ledger import Ledger, Outcome, verify
from tests.ledger.conftest import Warnings


def _facts(tag: str, n: int, pad: int = 0) -> list[tuple[str, str, Outcome, object]]:
    return [("b", f"{tag}-{i}", Outcome.ok({"i": i, "pad": "x" * pad}), None) for i in range(n)]


def test_a_batch_is_one_write_and_one_fsync_and_is_indexed(
    ledger_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from crucible.core.fdio import write_all as real_write

    calls = {"fsync": 0, "write": 0}
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        calls["fsync"] += 1
        real_fsync(fd)

    def write_all(fd: int, data: bytes) -> None:
        calls["write"] += 1
        real_write(fd, data)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr("crucible.ledger._files.write_all", write_all)
    with Ledger(ledger_dir) as ledger:
        assert ledger.record("b", "first", Outcome.ok(0))  # the file and its index exist
        calls.update(fsync=0, write=0)
        assert ledger.record_many(_facts("x", 25)) == 25
        assert calls == {"fsync": 1, "write": 1}
    monkeypatch.undo()
    with Ledger(ledger_dir) as ledger:
        assert ledger.report.source == "index"  # the batch kept the index fresh
        for i in range(25):
            hit = ledger.lookup("b", f"x-{i}")
            assert hit is not None and hit.value["i"] == i
    report = verify(ledger_dir)
    assert report["records"] == 26 and not report["damaged"]


def test_a_batch_after_a_torn_tail_starts_on_a_fresh_line(ledger_dir: Path) -> None:
    with Ledger(ledger_dir) as ledger:
        assert ledger.record_many(_facts("a", 3)) == 3
    with (ledger_dir / "steps.jsonl").open("ab") as f:
        f.write(b'{"half a rec')  # a crash mid-line
    with Ledger(ledger_dir, warn=Warnings()) as ledger:
        assert ledger.record_many(_facts("c", 4)) == 4
    with Ledger(ledger_dir) as ledger:
        for tag, n in (("a", 3), ("c", 4)):
            for i in range(n):
                assert ledger.lookup("b", f"{tag}-{i}") is not None


def test_a_batch_cut_mid_write_keeps_its_whole_records_only(
    ledger_dir: Path, warnings: Warnings
) -> None:
    with Ledger(ledger_dir) as ledger:
        assert ledger.record_many(_facts("k", 5, pad=100)) == 5
    path = ledger_dir / "steps.jsonl"
    data = path.read_bytes()
    lines = data.split(b"\n")[:-1]
    # what a SIGKILL inside the batch's write leaves: 3 whole lines, half the 4th
    cut = sum(len(x) + 1 for x in lines[:3]) + len(lines[3]) // 2
    os.truncate(path, cut)
    with Ledger(ledger_dir, warn=warnings) as ledger:
        assert [ledger.lookup("b", f"k-{i}") is not None for i in range(5)] == [
            True,
            True,
            True,
            False,
            False,
        ]
        assert any("torn tail" in w for w in warnings)
        assert ledger.record_many(_facts("after", 2)) == 2
    with Ledger(ledger_dir) as ledger:
        assert ledger.lookup("b", "after-1") is not None
        assert ledger.lookup("b", "k-3") is None


def test_a_value_outside_the_domain_is_left_out_of_its_batch(
    ledger_dir: Path, warnings: Warnings
) -> None:
    facts = _facts("d", 3)
    facts.insert(1, ("b", "bad", Outcome.ok({"n": 2**60}), None))
    with Ledger(ledger_dir, warn=warnings) as ledger:
        assert ledger.record_many(facts) == 3
        assert ledger.lookup("b", "bad") is not None  # the memo holds it
    assert any("cannot be recorded" in w for w in warnings)
    with Ledger(ledger_dir) as ledger:
        assert ledger.lookup("b", "bad") is None
        assert all(ledger.lookup("b", f"d-{i}") is not None for i in range(3))


def test_a_readonly_ledger_records_no_batch(ledger_dir: Path, warnings: Warnings) -> None:
    with Ledger(ledger_dir, readonly=True, warn=warnings) as ledger:
        assert ledger.record_many(_facts("r", 2)) == 0
    assert not (ledger_dir / "steps.jsonl").exists()
    assert warnings


def _batch_writer(directory: Path, trial: int, ack_fd: int) -> None:  # pragma: no cover
    """Append batches forever; acknowledge each batch's steps once it returned."""
    try:
        rng = random.Random(trial)
        with Ledger(directory, warn=lambda _m: None) as ledger:
            n = 0
            while True:
                size = rng.randrange(1, 9)
                facts = [
                    ("kill", f"t{trial}-{n + j}", Outcome.ok({"t": trial, "pad": "p" * 2000}), None)
                    for j in range(size)
                ]
                if ledger.record_many(facts) == size:
                    os.write(ack_fd, "".join(f"{f[1]}\n" for f in facts).encode())
                n += size
    finally:
        os._exit(0)


def test_sigkilled_batch_writer_loses_no_acknowledged_record(ledger_dir: Path) -> None:
    rng = random.Random(20261202)
    acknowledged: list[str] = []
    for trial in range(60):
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover
            os.close(read_fd)
            _batch_writer(ledger_dir, trial, write_fd)
        os.close(write_fd)
        wanted = rng.randrange(4)
        seen = b""
        while seen.count(b"\n") < wanted:
            seen += os.read(read_fd, 65536)
        time.sleep(rng.uniform(0.0, 0.003))
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status)
        with os.fdopen(read_fd, "rb") as pipe:
            seen += pipe.read()
        acked = [line.decode() for line in seen.split(b"\n")[:-1]]
        acknowledged.extend(acked)
        with Ledger(ledger_dir, warn=lambda _m: None) as ledger:
            assert ledger.report.quarantined is None
            for step in acked:
                hit = ledger.lookup("kill", step)
                assert hit is not None and hit.value["t"] == trial, (trial, step)
            # whatever else is there is whole: a record of this trial, never a part
            for payload in ledger.records("kill"):
                assert payload.count(b'"pad":"' + b"p" * 2000 + b'"') == 1
    # A write the kill cut short left a torn line, which the next trial's first
    # append closed with a fresh line: verify counts it as a bad line, and no
    # reader ever took it for a record (above). Every whole record counts.
    report = verify(ledger_dir)
    assert report["records"] >= len(acknowledged)
    with Ledger(ledger_dir) as ledger:
        assert all(ledger.lookup("kill", s) is not None for s in acknowledged)
    assert len(acknowledged) >= 60


BATCHER = r"""
import sys, time
from pathlib import Path
from crucible.ledger import Ledger, Outcome
directory, who, batches, go = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
with Ledger(directory) as ledger:
    while not go.exists():
        time.sleep(0.001)
    for b in range(batches):
        facts = [("race", f"{who}-{b}-{j}", Outcome.ok({"who": who, "pad": who * 300}), None)
                 for j in range(8)]
        assert ledger.record_many(facts) == 8
        for _, step, _, _ in facts:  # lookups in between, through the index
            assert ledger.lookup("race", step) is not None
        print(" ".join(f[1] for f in facts), flush=True)
"""


def test_four_writers_times_batches_lose_nothing_and_keep_the_index(ledger_dir: Path) -> None:
    go = ledger_dir.parent / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", BATCHER, str(ledger_dir), who, "40", str(go)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for who in "abcd"
    ]
    go.touch()
    acked: set[str] = set()
    for proc in procs:
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0
        acked |= set(out.split())
    assert len(acked) == 4 * 40 * 8
    data = (ledger_dir / "steps.jsonl").read_bytes()
    assert data.count(b"\n") == len(acked)  # one line per record, none merged
    with Ledger(ledger_dir) as ledger:
        assert ledger.report.source == "index"  # every writer kept it fresh
        for step in acked:
            hit = ledger.lookup("race", step)
            assert hit is not None and hit.value["pad"] == step[0] * 300
    report = verify(ledger_dir)
    assert report["records"] == len(acked) and not report["damaged"]
