"""steps.idx: used while it matches the ledger, rebuilt (never trusted) when it
does not — truncated or rewritten ledger, garbage, deleted, from another
generation, a planted symlink — caught up after appends it missed, kept by
concurrent writers, and never the cause of a wrong answer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from crucible.ledger import Ledger, Outcome, compact, content_step, verify
from crucible.ledger._index import HEADER_SIZE, INDEX_NAME, Table
from crucible.ledger._record import encode_line, make_record


def _fill(directory: Path, count: int, scope: str = "s") -> None:
    with Ledger(directory) as ledger:
        for i in range(count):
            assert ledger.record(scope, f"step-{i}", Outcome.ok({"i": i}))


def _check_all(ledger: Ledger, count: int, scope: str = "s") -> None:
    for i in range(count):
        hit = ledger.lookup(scope, f"step-{i}")
        assert hit is not None and hit.value == {"i": i}, i
    assert ledger.lookup(scope, f"step-{count}") is None
    assert len(ledger) == count


def _source(directory: Path) -> str:
    with Ledger(directory, warn=lambda _m: None) as ledger:
        return ledger.report.source


def test_appends_keep_the_index_and_a_reopen_reads_only_it(ledger_dir: Path) -> None:
    _fill(ledger_dir, 300)  # 300 identities: grown from 64 slots several times
    table = Table.open(ledger_dir)
    assert table is not None and table.summary.identities == 300
    assert table.summary.covered == (ledger_dir / "steps.jsonl").stat().st_size
    table.close()
    with Ledger(ledger_dir) as ledger:
        assert ledger.report.source == "index"
        _check_all(ledger, 300)
        assert ledger.report.summary.records == 300


def test_an_index_is_built_for_a_ledger_written_without_one(ledger_dir: Path) -> None:
    lines = [encode_line(make_record("s", f"step-{i}", "ok", {"i": i})) for i in range(50)]
    (ledger_dir / "steps.jsonl").write_bytes(b"".join(lines))
    assert _source(ledger_dir) == "rebuilt"
    with Ledger(ledger_dir) as ledger:
        assert ledger.report.source == "index"
        _check_all(ledger, 50)


def test_deleted_index_is_rebuilt(ledger_dir: Path) -> None:
    _fill(ledger_dir, 20)
    (ledger_dir / INDEX_NAME).unlink()
    with Ledger(ledger_dir) as ledger:
        assert ledger.report.source == "rebuilt"
        _check_all(ledger, 20)
    assert (ledger_dir / INDEX_NAME).exists()


@pytest.mark.parametrize(
    "damage",
    ["random", "zeros", "empty", "header-byte", "short", "bad-slot-count"],
)
def test_garbage_index_is_rebuilt_never_trusted(ledger_dir: Path, damage: str) -> None:
    _fill(ledger_dir, 40)
    index = ledger_dir / INDEX_NAME
    raw = bytearray(index.read_bytes())
    if damage == "random":
        raw = bytearray(os.urandom(len(raw)))
    elif damage == "zeros":
        raw = bytearray(len(raw))
    elif damage == "empty":
        raw = bytearray()
    elif damage == "header-byte":
        raw[40] ^= 0xFF  # inside the header: its checksum no longer matches
    elif damage == "short":
        raw = raw[: len(raw) - 16]
    elif damage == "bad-slot-count":
        raw = raw[:HEADER_SIZE]
    index.write_bytes(bytes(raw))
    with Ledger(ledger_dir) as ledger:
        assert ledger.report.source == "rebuilt"
        _check_all(ledger, 40)


def test_damaged_slots_under_a_good_header_never_give_a_wrong_answer(ledger_dir: Path) -> None:
    _fill(ledger_dir, 40)
    index = ledger_dir / INDEX_NAME
    raw = bytearray(index.read_bytes())
    # every slot points at the first record: the header is whole, the table lies
    first = raw[HEADER_SIZE : HEADER_SIZE + 16]
    for off in range(HEADER_SIZE, len(raw), 16):
        if raw[off : off + 8] != bytes(8):
            raw[off + 8 : off + 16] = first[8:16]
    index.write_bytes(bytes(raw))
    with Ledger(ledger_dir, warn=lambda _m: None) as ledger:
        for i in range(40):
            hit = ledger.lookup("s", f"step-{i}")
            assert hit is None or hit.value == {"i": i}  # a miss at worst
    verify(ledger_dir)  # rebuilds it
    with Ledger(ledger_dir) as ledger:
        assert ledger.report.source == "index"
        _check_all(ledger, 40)


@pytest.mark.parametrize("cut", ["mid-record", "record-end", "empty"])
def test_truncated_ledger_makes_the_index_stale(ledger_dir: Path, cut: str) -> None:
    _fill(ledger_dir, 30)
    path = ledger_dir / "steps.jsonl"
    data = path.read_bytes()
    ends = [i + 1 for i, b in enumerate(data) if b == ord("\n")]
    size = {"mid-record": ends[9] + 5, "record-end": ends[9], "empty": 0}[cut]
    with path.open("r+b") as f:  # same inode: only the size tells
        f.truncate(size)
    with Ledger(ledger_dir, warn=lambda _m: None) as ledger:
        assert ledger.report.source == "rebuilt"
        _check_all(ledger, 0 if cut == "empty" else 10)


def test_ledger_rewritten_in_place_at_the_same_size_makes_the_index_stale(
    ledger_dir: Path,
) -> None:
    _fill(ledger_dir, 10)
    path = ledger_dir / "steps.jsonl"
    other = b"".join(encode_line(make_record("s", f"step-{i}", "ok", {"i": i})) for i in range(10))
    other = other.replace(b'"at":"', b'"at":"')  # same records, other stamps: other bytes
    lines = [
        encode_line(make_record("t", f"x{i:02d}", "ok", {"i": i}, at="2000-01-01T00:00:00Z"))
        for i in range(200)
    ]
    blob = b"".join(lines)
    size = path.stat().st_size
    # the same number of bytes, other content, same inode
    cut = blob[:size]
    cut = cut[: cut.rfind(b"\n") + 1]
    cut += b"\n" * (size - len(cut))
    with path.open("r+b") as f:
        f.write(cut)
    with Ledger(ledger_dir, warn=lambda _m: None) as ledger:
        assert ledger.report.source == "rebuilt"
        assert ledger.lookup("s", "step-0") is None
        assert ledger.lookup("t", "x00") is not None


def test_index_from_another_generation_is_rebuilt(ledger_dir: Path) -> None:
    with Ledger(ledger_dir) as ledger:
        for i in range(10):
            ledger.record("s", f"step-{i}", Outcome.ok({"old": i}))
        for i in range(10):  # duplicates, so that compaction moves every record
            ledger.record("s", f"step-{i}", Outcome.ok({"i": i}))
    old = (ledger_dir / INDEX_NAME).read_bytes()
    compact(ledger_dir)
    assert _source(ledger_dir) == "index"  # compaction rebuilt it
    (ledger_dir / INDEX_NAME).write_bytes(old)  # an index of the file before compaction
    with Ledger(ledger_dir) as ledger:
        assert ledger.report.source == "rebuilt"
        _check_all(ledger, 10)


def test_appends_the_index_missed_are_caught_up(ledger_dir: Path) -> None:
    _fill(ledger_dir, 10)
    path = ledger_dir / "steps.jsonl"
    # an append that never reached the index (a kill between the two, an older writer)
    with path.open("ab") as f:
        f.write(encode_line(make_record("s", "step-10", "ok", {"i": 10})))
        f.write(b"junk line\n")
        f.write(encode_line(make_record("s", "step-3", "ok", {"i": 3, "again": True})))
    with Ledger(ledger_dir, warn=lambda _m: None) as ledger:
        assert ledger.report.source == "caught-up"
        assert ledger.report.summary.bad_lines == 1
        assert ledger.report.summary.first_bad_line == 12
        hit = ledger.lookup("s", "step-3")
        assert hit is not None and hit.value == {"i": 3, "again": True}
        assert ledger.lookup("s", "step-10") is not None
    with Ledger(ledger_dir, warn=lambda _m: None) as ledger:
        assert ledger.report.source == "index" and len(ledger) == 11


def test_torn_tail_then_append_keeps_the_index_right(ledger_dir: Path) -> None:
    _fill(ledger_dir, 5)
    path = ledger_dir / "steps.jsonl"
    with path.open("ab") as f:
        f.write(encode_line(make_record("s", "torn", "ok", 1))[:30])
    with Ledger(ledger_dir, warn=lambda _m: None) as ledger:
        assert ledger.report.summary.torn_tail
        assert ledger.record("s", "step-5", Outcome.ok({"i": 5}))
    with Ledger(ledger_dir, warn=lambda _m: None) as ledger:
        assert ledger.report.source == "index"
        assert ledger.report.summary.bad_lines == 1 and not ledger.report.summary.torn_tail
        _check_all(ledger, 6)
    assert verify(ledger_dir)["bad_lines"] == 1


def test_a_symlinked_index_is_never_followed(ledger_dir: Path, tmp_path: Path) -> None:
    _fill(ledger_dir, 5)
    real = ledger_dir / INDEX_NAME
    outside = tmp_path / "outside.idx"
    outside.write_bytes(real.read_bytes())
    real.unlink()
    real.symlink_to(outside)
    before = outside.read_bytes()
    with Ledger(ledger_dir) as ledger:
        assert ledger.report.source == "rebuilt"
        ledger.record("s", "step-5", Outcome.ok({"i": 5}))
    with Ledger(ledger_dir) as ledger:
        assert ledger.report.source == "index"
        _check_all(ledger, 6)
    assert outside.read_bytes() == before
    assert not real.is_symlink()


def test_hash_collisions_cost_a_miss_never_a_wrong_hit(
    ledger_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import crucible.ledger._files as files
    import crucible.ledger._index as index
    import crucible.ledger._ledger as ledger_module

    for module in (files, index, ledger_module):
        monkeypatch.setattr(module, "identity_hash", lambda _scope, _step: 42)
    with Ledger(ledger_dir) as ledger:
        ledger.record("s", "a", Outcome.ok("A"))
        ledger.record("s", "b", Outcome.ok("B"))
    with Ledger(ledger_dir) as ledger:
        assert ledger.report.source == "index"
        a, b = ledger.lookup("s", "a"), ledger.lookup("s", "b")
        assert a is None  # the earlier of two identities of one hash
        assert b is not None and b.value == "B"
    (ledger_dir / INDEX_NAME).unlink()
    with Ledger(ledger_dir) as ledger:
        assert ledger.report.source == "rebuilt"
        for step, value in (("a", "A"), ("b", "B")):
            hit = ledger.lookup("s", step)
            assert hit is None or hit.value == value


def test_an_unusable_lock_means_an_index_in_memory(ledger_dir: Path, tmp_path: Path) -> None:
    _fill(ledger_dir, 5)
    (ledger_dir / INDEX_NAME).unlink()
    (ledger_dir / "steps.lock").unlink()
    (ledger_dir / "steps.lock").symlink_to(tmp_path / "elsewhere")  # refused, not followed
    before = (ledger_dir / "steps.jsonl").read_bytes()
    with Ledger(ledger_dir, readonly=True) as ledger:
        assert ledger.report.source == "memory"
        _check_all(ledger, 5)
        assert {json.loads(p)["step"] for p in ledger.records()} == {f"step-{i}" for i in range(5)}
    assert not (tmp_path / "elsewhere").exists() and not (ledger_dir / INDEX_NAME).exists()
    assert (ledger_dir / "steps.jsonl").read_bytes() == before


def test_a_readonly_open_writes_only_the_index(ledger_dir: Path) -> None:
    _fill(ledger_dir, 5)
    (ledger_dir / INDEX_NAME).unlink()
    before = (ledger_dir / "steps.jsonl").read_bytes()
    with Ledger(ledger_dir, readonly=True) as ledger:
        assert ledger.report.source == "rebuilt"
        _check_all(ledger, 5)
    assert (ledger_dir / "steps.jsonl").read_bytes() == before
    assert sorted(p.name for p in ledger_dir.iterdir()) == [
        "steps.idx",
        "steps.jsonl",
        "steps.lock",
    ]


def test_library_api_by_content_key(ledger_dir: Path) -> None:
    key = {"task": "t", "inputs": {"a": "sha256:" + "0" * 64}}
    with Ledger(ledger_dir) as ledger:
        assert ledger.lookup_key("dispatch", "task", key) is None
        assert ledger.record_key("dispatch", "task", key, Outcome.ok({"passed": True}))
        with pytest.raises(ValueError, match="settled"):
            ledger.record_key("dispatch", "task", key, Outcome.transient(1))
    with Ledger(ledger_dir) as ledger:
        hit = ledger.lookup_key("dispatch", "task", key)
        assert hit is not None and hit.cached and hit.value == {"passed": True}
        assert hit.step == content_step("task", key)
        assert ledger.lookup_key("dispatch", "task", {**key, "task": "u"}) is None
        [payload] = ledger.records("dispatch")
        assert json.loads(payload)["key"] == key


WRITER = r"""
import random, sys
from pathlib import Path
from crucible.ledger import Ledger, Outcome
directory, who, count = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
rng = random.Random(who)
with Ledger(directory) as ledger:
    for i in range(count):
        assert ledger.record("race", f"{who}-{i}", Outcome.ok({"who": who, "i": i}))
        if i % 100 == 99:
            # a fresh opener between the appends: everything this writer
            # recorded is there, through the index the four keep between them
            with Ledger(directory, readonly=True) as reader:
                for j in rng.sample(range(i + 1), 20) + [i]:
                    hit = reader.lookup("race", f"{who}-{j}")
                    assert hit is not None and hit.value == {"who": who, "i": j}, (who, j)
print("done", flush=True)
"""


def test_four_writers_times_1000_appends_with_lookups_between(ledger_dir: Path) -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(ledger_dir), who, "1000"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for who in "abcd"
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0 and out == "done\n", err
    with Ledger(ledger_dir) as ledger:
        assert ledger.report.source == "index"
        assert len(ledger) == 4000 and ledger.report.summary.records == 4000
        for who in "abcd":
            for i in range(1000):
                hit = ledger.lookup("race", f"{who}-{i}")
                assert hit is not None and hit.value == {"who": who, "i": i}
    report = verify(ledger_dir)
    assert report["records"] == 4000 and not report["damaged"]


def test_a_full_table_under_a_good_header_neither_hangs_nor_lies(ledger_dir: Path) -> None:
    """Slots of writers killed before their header was written are not counted:
    a table can hold more entries than its header says. Probes are bounded."""
    _fill(ledger_dir, 10)
    index = ledger_dir / INDEX_NAME
    raw = bytearray(index.read_bytes())
    for off in range(HEADER_SIZE, len(raw), 16):  # every slot taken, none ours
        if raw[off : off + 8] == bytes(8):
            raw[off : off + 16] = (off * 7919 + 3).to_bytes(8, "little") + (1).to_bytes(8, "little")
    index.write_bytes(bytes(raw))
    with Ledger(ledger_dir, warn=lambda _m: None) as ledger:
        assert ledger.lookup("s", "missing") is None
        assert ledger.record("s", "new", Outcome.ok(1))  # the insert grows the table
    with Ledger(ledger_dir, warn=lambda _m: None) as ledger:
        hit = ledger.lookup("s", "new")
        assert hit is not None and hit.value == 1


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_fifo_or_directory_at_the_index_name_is_not_an_index(ledger_dir: Path, kind: str) -> None:
    _fill(ledger_dir, 5)
    index = ledger_dir / INDEX_NAME
    index.unlink()
    if kind == "fifo":
        os.mkfifo(index)
    else:
        index.mkdir()
    with Ledger(ledger_dir, warn=lambda _m: None) as ledger:  # never hangs
        assert ledger.report.source in ("rebuilt", "memory")
        _check_all(ledger, 5)
        assert ledger.record("s", "step-5", Outcome.ok({"i": 5}))
    with Ledger(ledger_dir, warn=lambda _m: None) as ledger:
        _check_all(ledger, 6)
