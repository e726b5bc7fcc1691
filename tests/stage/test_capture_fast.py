"""Capture's fast path (docs/spec/inputs.md 4.5): large files are copied in the
kernel (a reflink where the filesystem has one) and hashed over the copy by
threads while the next file is copied; small files are read, hashed and written
in one pass. The bound, the refusals and the digests hold on both paths."""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest

from crucible.core import canon
from crucible.core.errors import OperationalError
from crucible.core.fsio import open_regular
from crucible.stage import StateDir, _files
from crucible.stage._files import KERNEL_COPY_MIN, capture_files
from tests.stage.stageplans import plan, task

BIG = KERNEL_COPY_MIN + 12_345  # takes the kernel path


def _sha(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def _tree(ws: Path, sizes: dict[str, int]) -> None:
    for rel, size in sizes.items():
        p = ws / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(os.urandom(size))


def _capture(
    ws: Path, dest: Path, patterns: tuple[str, ...], budget: int = 1 << 40
) -> list[dict[str, object]]:
    dest.mkdir(exist_ok=True)
    return capture_files(ws, patterns, dest, budget=budget, require_literals=True).files


def test_large_and_small_files_carry_the_digest_of_the_bytes_stored(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    # more large files than the hashing queue holds, mixed with small ones and an empty one
    sizes = {f"out/big{i:02}": BIG + i for i in range(20)}
    sizes |= {f"out/small{i}": 100 * i for i in range(5)}
    sizes["out/d/exact"] = KERNEL_COPY_MIN
    _tree(ws, sizes)
    before = _fds()
    files = _capture(ws, tmp_path / "dest", ("out",))
    assert _fds() == before  # every copy's fd closed, on both paths
    assert [f["path"] for f in files] == sorted(sizes)
    for f in files:
        stored = tmp_path / "dest" / str(f["path"])
        assert stored.read_bytes() == (ws / str(f["path"])).read_bytes()
        assert f["size"] == sizes[str(f["path"])] and f["digest"] == _sha(stored)
    assert not [t for t in threading.enumerate() if t.name == "crucible-capture-hash"]


def test_the_digest_is_taken_over_the_copy_not_the_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A source rewritten after it was copied (a process still holding it)
    must not give the store a digest of bytes it does not hold."""
    ws = tmp_path / "ws"
    _tree(ws, {"big": BIG})
    real = _files.kernel_copy_bounded

    def copy_then_rewrite(src: int, out: int, target: Path, **kw: Any) -> int:
        n = real(src, out, target, **kw)
        (ws / "big").write_bytes(b"\0" * BIG)  # same size, other bytes
        return n

    monkeypatch.setattr(_files, "kernel_copy_bounded", copy_then_rewrite)
    original = (ws / "big").read_bytes()
    (f,) = _capture(ws, tmp_path / "dest", ("big",))
    stored = tmp_path / "dest" / "big"
    assert stored.read_bytes() == original
    assert f["digest"] == _sha(stored) != _sha(ws / "big")


@pytest.mark.parametrize("size", [1000, BIG], ids=["in-memory", "kernel"])
def test_a_file_growing_past_the_bound_while_copied_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    """The file is measured when it is opened; it then grows before it is
    copied: the copy itself stops at the bound."""
    ws = tmp_path / "ws"
    _tree(ws, {"f": size})
    real_open = open_regular

    def open_then_grow(path: str) -> tuple[int, os.stat_result]:
        got = real_open(path)
        with open(path, "ab") as f:
            f.write(b"x" * 5000)
        return got

    monkeypatch.setattr(_files, "open_regular", open_then_grow)
    before = _fds()
    with pytest.raises(_files.CaptureRefused) as refused:
        _capture(ws, tmp_path / "dest", ("f",), budget=size + 4999)
    assert "grew past the bound" in refused.value.note and not refused.value.retryable
    assert _fds() == before
    # at the bound exactly, it is captured whole
    (tmp_path / "dest2").mkdir()
    (f,) = capture_files(
        ws, ("f",), tmp_path / "dest2", budget=size + 10_000, require_literals=True
    ).files
    assert f["size"] == size + 10_000 == (tmp_path / "dest2" / "f").stat().st_size
    assert f["digest"] == _sha(tmp_path / "dest2" / "f")


@pytest.mark.parametrize("grow", [False, True], ids=["whole", "grows-mid-copy"])
def test_a_copy_in_many_steps_is_hashed_as_it_grows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, grow: bool
) -> None:
    """A file copied in several sendfile steps is hashed behind the copy; a
    copy refused half-way (the file grew past the bound) leaves no fd, thread
    or half-hashed digest."""
    monkeypatch.setattr(_files, "_SENDFILE_MAX", 1 << 16)
    ws = tmp_path / "ws"
    _tree(ws, {"a": BIG, "big": 40 * (1 << 16) + 7, "c": BIG})
    if grow:
        real_open = open_regular

        def open_then_grow(path: str) -> tuple[int, os.stat_result]:
            got = real_open(path)
            if path.endswith("big"):
                with open(path, "ab") as f:
                    f.write(b"x" * (1 << 20))
            return got

        monkeypatch.setattr(_files, "open_regular", open_then_grow)
    before = _fds()
    if grow:
        with pytest.raises(_files.CaptureRefused, match="grew past the bound"):
            _capture(ws, tmp_path / "dest", ("a", "big", "c"), budget=2 * BIG + 40 * (1 << 16) + 9)
    else:
        files = _capture(ws, tmp_path / "dest", ("a", "big", "c"))
        assert [f["digest"] for f in files] == [_sha(ws / n) for n in ("a", "big", "c")]
    assert _fds() == before
    assert not [t for t in threading.enumerate() if t.name == "crucible-capture-hash"]


def test_the_bound_holds_when_the_kernel_cannot_sendfile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = tmp_path / "ws"
    _tree(ws, {"a": BIG, "b": BIG})

    def no_sendfile(*args: object) -> int:
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(os, "sendfile", no_sendfile)
    files = _capture(ws, tmp_path / "dest", ("a", "b"))
    assert [f["digest"] for f in files] == [_sha(ws / "a"), _sha(ws / "b")]
    with (
        open(ws / "a", "rb") as src,
        open(tmp_path / "c", "wb") as out,
        pytest.raises(_files.CaptureRefused, match="grew past the bound"),
    ):
        # the fallback reads at most limit + 1 bytes, whatever the file holds
        _files.kernel_copy_bounded(src.fileno(), out.fileno(), tmp_path / "c", limit=BIG - 1)
    assert (tmp_path / "c").stat().st_size < BIG


def test_a_clone_over_the_bound_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the filesystem clones (XFS, btrfs), the clone's size is checked."""
    ws = tmp_path / "ws"
    _tree(ws, {"f": BIG})

    def fake_clone(src: int, out: int, key: object = None) -> bool:  # a clone is all of the source, whatever its size
        os.write(out, os.pread(src, 1 << 30, 0) + b"grown")
        return True

    monkeypatch.setattr(_files, "clone_fd", fake_clone)
    with pytest.raises(_files.CaptureRefused, match="grew past the bound"):
        _capture(ws, tmp_path / "dest", ("f",), budget=BIG + 4)
    (f,) = _capture(ws, tmp_path / "dest2", ("f",), budget=BIG + 5)
    assert f["digest"] == _sha(tmp_path / "dest2" / "f")


def test_a_refusal_after_large_files_were_queued_leaves_no_fd_or_thread(
    state: Path, tmp_path: Path
) -> None:
    ws = state / "work" / "p"
    _tree(ws, {f"out/a{i:02}": BIG for i in range(12)})
    os.mkfifo(ws / "out" / "z-fifo")
    before = _fds()
    rec = StateDir(plan(task("p", emits_files=["out"]), version=2), state).capture(
        "p",
        ws,
        output_file=ws / "none",
        exit_code=0,
    )
    assert rec["status"] == "failed" and "FIFO" in rec["note"] and rec["retryable"] is False
    assert not (state / "files" / "p").exists()
    assert not [n for n in os.listdir(state / "files") if n.startswith("@")]
    assert _fds() == before
    assert not [t for t in threading.enumerate() if t.name == "crucible-capture-hash"]


def test_a_hashing_error_is_operational_and_leaves_nothing(
    state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = state / "work" / "p"
    _tree(ws, {"out/a": BIG, "out/b": BIG})

    def failing(*args: object) -> int:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(_files, "hash_fd", failing)
    before = _fds()
    with pytest.raises(OperationalError, match="Input/output error"):
        StateDir(plan(task("p", emits_files=["out"])), state).capture(
            "p", ws, output_file=ws / "n", exit_code=0
        )
    assert os.listdir(state / "files") == []
    assert _fds() == before


@pytest.mark.parametrize("cores", [1, 2])
def test_hashing_on_one_core_runs_in_the_callers_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cores: int
) -> None:
    monkeypatch.setattr(_files, "_hash_threads", lambda: cores)
    started: list[str] = []
    real_start = threading.Thread.start

    def start(self: threading.Thread) -> None:
        started.append(self.name)
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    ws = tmp_path / "ws"
    _tree(ws, {"a": BIG, "b": BIG, "c": 10})
    files = _capture(ws, tmp_path / "dest", ("a", "b", "c"))
    assert [f["digest"] for f in files] == [_sha(ws / n) for n in "abc"]
    assert started == ["crucible-capture-hash"] * (0 if cores == 1 else cores)


def test_small_files_start_no_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A capture of small files (the common task) pays for no thread."""

    def no_hasher() -> None:
        raise AssertionError("a thread was started for small files")

    monkeypatch.setattr(_files, "_Hasher", no_hasher)
    ws = tmp_path / "ws"
    _tree(ws, {f"o/{i}": KERNEL_COPY_MIN - 1 for i in range(3)})
    files = _capture(ws, tmp_path / "dest", ("o",))
    assert [f["digest"] for f in files] == [_sha(ws / "o" / str(i)) for i in range(3)]


def _reflink_dir() -> Path | None:
    d = os.environ.get("CRUCIBLE_TEST_REFLINK_DIR")
    if not d:
        return None
    path = Path(tempfile.mkdtemp(prefix="crucible-test-", dir=d))
    (path / "a").write_bytes(b"x")
    with open(path / "a", "rb") as src, open(path / "b", "wb") as dst:
        if not _files.clone_fd(src.fileno(), dst.fileno()):
            shutil.rmtree(path)
            return None
    return path


def test_with_reflinks_the_store_is_a_clone_hashed_over_itself() -> None:
    root = _reflink_dir()
    if root is None:
        pytest.skip("set CRUCIBLE_TEST_REFLINK_DIR to a directory on XFS or btrfs")
    try:
        ws = root / "ws"
        _tree(ws, {"out/a": BIG, "out/b": 3 * BIG})
        files = _capture(ws, root / "dest", ("out",))
        for f in files:
            stored = root / "dest" / str(f["path"])
            assert f["digest"] == _sha(stored) == _sha(ws / str(f["path"]))
        (ws / "out" / "a").write_bytes(b"changed")  # copy-on-write: the store keeps its bytes
        assert _sha(root / "dest" / "out" / "a") == files[0]["digest"]
    finally:
        shutil.rmtree(root)


def test_the_command_captures_large_files_with_their_digests(tmp_path: Path) -> None:
    """End to end: `crucible-stage capture` records what the store holds."""
    state = tmp_path / "state"
    state.mkdir()
    p = plan(task("p", emits_files=["data/**"]), version=2)
    (state / "plan.json").write_bytes(canon.dumps(p))
    ws = state / "work" / "p"
    _tree(ws, {"data/x/big.bin": 3 * BIG, "data/small.txt": 12, "data/y/big2.bin": BIG})
    exe = Path(sys.executable).parent / "crucible-stage"
    done = subprocess.run(
        [str(exe), "capture", "--state", str(state), "--task", "p", "--exit-code", "0",
         "--output", str(ws / "none.json")],
        capture_output=True,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr == b""
    rec = canon.loads(done.stdout)
    got = {f["path"]: (f["size"], f["digest"]) for f in rec["files"]}
    store = state / "files" / "p"
    assert got == {
        rel: ((store / rel).stat().st_size, _sha(store / rel))
        for rel in ("data/small.txt", "data/x/big.bin", "data/y/big2.bin")
    }
    assert _sha(store / "data/x/big.bin") == _sha(ws / "data/x/big.bin")
