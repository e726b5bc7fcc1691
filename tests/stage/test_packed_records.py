"""Packed result records: one append-only ``STATE/results/<task>.jsonl`` per task
with keyed units (docs/spec/inputs.md 5, issue 14)."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from crucible import stage
from crucible.core import canon
from crucible.core.errors import OperationalError, ParseError
from crucible.stage import _store
from tests.packed import keyed
from tests.run.dispatchtests import DISPATCH


def rec(task: str, key: str, status: str = "passed", note: str = "") -> dict[str, Any]:
    return {
        "format": "crucible.result/1",
        "task": task,
        "key": key,
        "status": status,
        "note": note,
        "retryable": False,
    }


def dispatch(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [DISPATCH, *argv], capture_output=True, text=True, timeout=timeout, check=False
    )


FANOUT = """
edition = 4
[workflow]
name = "wide"
[[workflow.task]]
name = "t"
map = {{ start = 0, end = {last} }}
emits = {{ k = "string" }}
run = 'if [ -e {fail} ] && [ "$CRUCIBLE_KEY" = "7" ]; then exit 3; fi; printf "{{\\"k\\": \\"%s\\"}}" "$CRUCIBLE_KEY" > "$CRUCIBLE_OUTPUT"'
[[workflow.task]]
name = "fold"
needs = ["t"]
join = "settled"
inputs = {{ ks = "t.k" }}
emits = {{ n = "integer" }}
run = 'echo "{{\\"n\\": $(ls "$CRUCIBLE_INPUTS_DIR/ks" | wc -l)}}" > "$CRUCIBLE_OUTPUT"'
"""


def write_pack(tmp_path: Path, n: int) -> tuple[Path, Path]:
    fail = tmp_path / "fail-7"
    pack = tmp_path / "pack.toml"
    pack.write_text(textwrap.dedent(FANOUT.format(last=n - 1, fail=fail)).lstrip())
    return pack, fail


# -- a run -------------------------------------------------------------------


def test_a_200_instance_fanout_leaves_one_packed_file(tmp_path: Path) -> None:
    pack, fail = write_pack(tmp_path, 200)
    fail.touch()  # instance 7 fails
    state = tmp_path / "state"
    first = dispatch(str(pack), "--state", str(state), "-j", "2")
    assert first.returncode == 1, first.stderr
    results = state / "results"
    assert sorted(p.name for p in results.iterdir()) == ["fold.json", "t.json", "t.jsonl"]
    records = keyed(state, "t")
    assert len(records) == 200 and records["7"]["status"] == "failed"
    assert len((results / "t.jsonl").read_bytes().splitlines()) == 200  # one line each
    fold = json.loads((results / "fold.json").read_bytes())
    assert fold["status"] == "passed" and fold["output"] == {"n": 199}  # settled join
    shown = dispatch("report", str(state))
    assert shown.returncode == 0 and "t[7]: exited with status 3" in shown.stdout, shown.stderr
    # --retry-failed: the failed instance reruns, its old line superseded
    fail.unlink()
    again = dispatch(str(pack), "--state", str(state), "--resume", "--retry-failed")
    assert again.returncode == 0, again.stderr
    records = keyed(state, "t")
    assert len(records) == 200 and all(r["status"] == "passed" for r in records.values())
    lines = [json.loads(x) for x in (results / "t.jsonl").read_bytes().splitlines()]
    assert [x for x in lines if x.get("removed")] == [
        {"format": "crucible.result/1", "key": "7", "removed": True, "task": "t"}
    ]
    assert [x["key"] for x in lines[-1:]] == ["7"]  # the rerun's line, last
    assert json.loads((results / "fold.json").read_bytes())["output"] == {"n": 200}
    assert not (results / "t").exists()
    assert dispatch("report", str(state)).returncode == 0


# -- readers -----------------------------------------------------------------


def test_last_line_wins_and_a_tombstone_removes(tmp_path: Path) -> None:
    _store.store_record(tmp_path, rec("t", "a", "failed"), durable=False)
    _store.store_record(tmp_path, rec("t", "b"), durable=False)
    _store.store_record(tmp_path, rec("t", "a"), durable=False)
    assert stage.load_result(tmp_path, "t", "a")["status"] == "passed"  # type: ignore[index]
    stage.remove_result(tmp_path, "t", "b")
    assert sorted(stage.load_all(tmp_path, "t")) == ["a"]
    assert stage.load_result(tmp_path, "t", "b") is None
    stage.remove_result(tmp_path, "t", "b")  # nothing to remove: no line
    assert len((tmp_path / "results" / "t.jsonl").read_bytes().splitlines()) == 4


def test_a_torn_last_line_is_ignored_and_cut_by_the_next_append(tmp_path: Path) -> None:
    _store.store_record(tmp_path, rec("t", "a"), durable=False)
    path = tmp_path / "results" / "t.jsonl"
    with path.open("ab") as f:
        f.write(canon.dumps(rec("t", "b"))[:20])  # a crash mid-append
    assert sorted(stage.load_all(tmp_path, "t")) == ["a"]
    _store.store_record(tmp_path, rec("t", "c"), durable=False)
    assert sorted(stage.load_all(tmp_path, "t")) == ["a", "c"]
    assert len(path.read_bytes().splitlines()) == 2  # the torn bytes are gone


def test_damaged_middle_line_is_named_by_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "results" / "t.jsonl"
    path.parent.mkdir()
    path.write_bytes(
        canon.dumps(rec("t", "a")) + b"\n{garbage\n" + canon.dumps(rec("t", "b")) + b"\n"
    )
    with pytest.raises(ParseError) as got:
        stage.load_all(tmp_path, "t")
    assert got.value.where == f"{path}:2"


def test_damaged_packed_file_makes_report_exit_2(tmp_path: Path) -> None:
    pack, _ = write_pack(tmp_path, 3)
    state = tmp_path / "state"
    assert dispatch(str(pack), "--state", str(state)).returncode == 0
    path = state / "results" / "t.jsonl"
    lines = path.read_bytes().splitlines()
    path.write_bytes(b"\n".join([lines[0], b"not json", *lines[1:]]) + b"\n")
    shown = dispatch("report", str(state))
    assert shown.returncode == 2, shown.stdout + shown.stderr
    assert f"{path}:2" in shown.stderr and len(shown.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_damaged_packed_file_that_is_not_regular_is_refused(tmp_path: Path, kind: str) -> None:
    results = tmp_path / "results"
    results.mkdir()
    other = tmp_path / "elsewhere.jsonl"
    other.write_bytes(canon.dumps(rec("t", "a")) + b"\n")
    path = results / "t.jsonl"
    if kind == "symlink":
        path.symlink_to(other)
    else:
        os.mkfifo(path)
    with pytest.raises(OperationalError, match=r"not a regular file|symlink"):
        stage.load_all(tmp_path, "t")
    with pytest.raises(OperationalError, match="not a regular file"):
        _store.store_record(tmp_path, rec("t", "b"), durable=False)
    assert other.read_bytes().count(b"\n") == 1  # nothing written through the link


def test_a_short_write_is_cut_back_and_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _store.store_record(tmp_path, rec("t", "a"), durable=False)
    path = tmp_path / "results" / "t.jsonl"
    before = path.read_bytes()
    real = os.write

    def short(fd: int, data: bytes) -> int:
        return real(fd, bytes(data)[:7])  # ENOSPC after 7 bytes

    monkeypatch.setattr("crucible.stage._store.os.write", short)
    with pytest.raises(OperationalError, match="cannot write result record"):
        _store.store_record(tmp_path, rec("t", "b"), durable=False)
    monkeypatch.undo()
    assert path.read_bytes() == before


def _writer(state: str, n: int, w: int) -> None:
    for i in range(n):
        note = f"writer {w} line {i} " + "x" * (i % 300)
        _store.store_record(Path(state), rec("t", f"{w}-{i}", note=note), durable=False)


def test_concurrent_appends_never_interleave(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), 500, w)) for w in range(4)]
    for p in procs:
        p.start()
    seen = 0
    while any(p.is_alive() for p in procs):  # a reader in between: whole lines only
        seen = max(seen, len(stage.load_all(tmp_path, "t")))
    for p in procs:
        p.join()
        assert p.exitcode == 0
    lines = (tmp_path / "results" / "t.jsonl").read_bytes().split(b"\n")
    assert lines[-1] == b"" and len(lines) == 2001
    for line in lines[:-1]:
        value = json.loads(line)
        w, i = value["key"].split("-")
        assert value["note"] == f"writer {w} line {i} " + "x" * (int(i) % 300)
    assert len(stage.load_all(tmp_path, "t")) == 2000 >= seen


def test_a_file_rewritten_in_place_is_read_again_whole(tmp_path: Path) -> None:
    """The reader's cache parses only what was appended to the inode it read;
    a file replaced in place (or by one that got the same inode number after a
    rerun removed it) is read again from the start."""
    _store.store_record(tmp_path, rec("t", "a", "failed"), durable=False)
    assert sorted(stage.load_all(tmp_path, "t")) == ["a"]
    path = tmp_path / "results" / "t.jsonl"
    with path.open("r+b") as f:  # same inode, new content, longer
        f.truncate(0)
        f.write(canon.dumps(rec("t", "b", note="x" * 80)) + b"\n")
        f.write(canon.dumps(rec("t", "c")) + b"\n")
    assert sorted(stage.load_all(tmp_path, "t")) == ["b", "c"]


def test_the_first_appends_of_a_run_race_to_create_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No results/ yet, and another worker creates the file between our mkdir
    and our create: the append opens what the other made (it failed the unit
    with "cannot write result records" under load)."""
    real = os.open

    def racing(path: Any, flags: int, mode: int = 0o777) -> int:
        if flags & os.O_EXCL and Path(path).parent.is_dir() and not Path(path).exists():
            os.close(real(path, os.O_WRONLY | os.O_CREAT, 0o644))  # the other worker
        return real(path, flags, mode)

    monkeypatch.setattr("crucible.stage._store.os.open", racing)
    _store.store_record(tmp_path, rec("t", "a"), durable=False)
    monkeypatch.undo()
    assert sorted(stage.load_all(tmp_path, "t")) == ["a"]
