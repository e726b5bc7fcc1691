from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from crucible.core import atomic, ndjson
from crucible.core.errors import OperationalError
from crucible.core.fdio import read_file


def test_ndjson_reports_line_number() -> None:
    data = b'{"a":1}\n\n{"b":2}\n{"c":\n'
    it = ndjson.iter_lines(io.BytesIO(data), name="events.jsonl")
    assert next(it) == (1, {"a": 1})
    assert next(it) == (3, {"b": 2})
    with pytest.raises(ndjson.NdjsonError) as info:
        next(it)
    assert str(info.value).startswith("events.jsonl:4: ")


def test_ndjson_refuses_non_objects_and_duplicates() -> None:
    with pytest.raises(ndjson.NdjsonError, match="x:1: line is not a JSON object"):
        list(ndjson.iter_lines(io.BytesIO(b"[1]\n"), name="x"))
    with pytest.raises(ndjson.NdjsonError, match="x:2: duplicate"):
        list(ndjson.iter_lines(io.BytesIO(b'{}\n{"a":1,"a":1}\n'), name="x"))


def test_ndjson_write_and_append(tmp_path: Path) -> None:
    out = io.BytesIO()
    ndjson.write(out, [{"b": 1, "a": [1, 2]}, {}])
    assert out.getvalue() == b'{"a":[1,2],"b":1}\n{}\n'
    path = tmp_path / "log.jsonl"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        ndjson.append(fd, {"n": 1})
        ndjson.append(fd, {"n": 2})
    finally:
        os.close(fd)
    assert [v for _, v in ndjson.read_path(path)] == [{"n": 1}, {"n": 2}]


def test_atomic_write_if_changed_keeps_mtime(tmp_path: Path) -> None:
    p = tmp_path / "plan.json"
    assert atomic.write_json(p, {"a": 1}) is True
    os.utime(p, (1_000_000, 1_000_000))
    assert atomic.write_json(p, {"a": 1}, if_changed=True) is False
    assert p.stat().st_mtime == 1_000_000
    assert atomic.write_json(p, {"a": 2}, if_changed=True) is True
    assert p.read_bytes() == b'{"a":2}'


def test_atomic_write_failure_leaves_old_file_and_no_temp(tmp_path: Path) -> None:
    p = tmp_path / "out.json"
    p.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic.atomic_file(p) as f:
        f.write(b"half")
        raise RuntimeError("boom")
    assert p.read_bytes() == b"old"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["out.json"]


def test_atomic_write_into_missing_dir_is_operational(tmp_path: Path) -> None:
    with pytest.raises(OperationalError) as info:
        atomic.write_bytes(tmp_path / "nope" / "x", b"1")
    assert info.value.exit_code == 3


def test_atomic_write_with_a_255_byte_name(tmp_path: Path) -> None:
    p = tmp_path / ("k" * 255)
    assert atomic.write_bytes(p, b"long") is True
    assert p.read_bytes() == b"long"
    assert sorted(x.name for x in tmp_path.iterdir()) == [p.name]


def test_atomic_write_prefix_and_non_durable(tmp_path: Path) -> None:
    p = tmp_path / "prompt.txt"
    with pytest.raises(RuntimeError), atomic.atomic_file(p, tmp_prefix="@tmp-", durable=False) as f:
        f.write(b"x")
        assert [x.name[:5] for x in tmp_path.iterdir()] == ["@tmp-"]
        raise RuntimeError("stop")
    assert list(tmp_path.iterdir()) == []
    assert atomic.write_bytes(p, b"p", tmp_prefix="@tmp-", durable=False) is True
    assert p.read_bytes() == b"p" and (p.stat().st_mode & 0o777) == 0o644


@pytest.mark.parametrize("size", [0, 1, 4096, 3 * 1024 * 1024])
def test_read_file_reads_whole_files(tmp_path: Path, size: int) -> None:
    path = tmp_path / "f"
    data = os.urandom(size)
    path.write_bytes(data)
    assert read_file(path) == data


def test_read_file_reads_special_files_to_their_end() -> None:
    # /proc files report size 0: read until EOF, not zero bytes
    text = read_file("/proc/self/status")
    assert b"Name:" in text and text.endswith(b"\n")
    with pytest.raises(FileNotFoundError):
        read_file("/nonexistent/file")


def test_atomic_write_bytes_mode_ignores_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        atomic.write_bytes(tmp_path / "f", b"x", mode=0o644)
    finally:
        os.umask(old)
    assert (tmp_path / "f").stat().st_mode & 0o777 == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["f"]
