"""The task cache never reads, writes or deletes through a link planted in its
directory (docs/spec/cache.md, "The store"): temp files are created
O_EXCL|O_NOFOLLOW (a symlink or hard link at the name is refused, never written
through), store directories are made one real directory at a time, a store file
is a regular file opened O_NOFOLLOW, ``gc`` and ``forget`` refuse a linked
``files/`` or ``last/``, and a ledger value's file paths stay inside the unit's
files directory. Every link and FIFO is built inside tmp_path."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from crucible.core import digest
from crucible.core.atomic import TMP_PREFIX
from crucible.run.cache._store import CacheKey, Hit, TaskCache
from crucible.run.cache._storefs import file_digest, real_dirs

DISPATCH = str(Path(sys.executable).parent / "crucible-dispatch")


class _Hung(Exception):
    pass


def _cache(tmp_path: Path) -> TaskCache:
    return TaskCache(tmp_path / "cache", warn=lambda _w: None)


def _captured(tmp_path: Path, data: bytes = b"captured bytes\n") -> tuple[Path, str]:
    src = tmp_path / "state-files" / "out.txt"
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_bytes(data)
    return src, digest.of_bytes(data)


def _outside(tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    outside.write_bytes(b"untouched")
    return outside


def test_a_symlink_at_put_files_temp_name_is_never_written_through(tmp_path: Path) -> None:
    tc = _cache(tmp_path)
    src, d = _captured(tmp_path)
    target = tc._store_path(d)
    target.parent.mkdir(parents=True)
    outside = _outside(tmp_path)
    os.symlink(outside, target.parent / f"@tmp-{os.getpid()}-{target.name}")
    with pytest.raises(OSError):
        tc._put_file(src, d)
    assert outside.read_bytes() == b"untouched"
    assert not target.exists()


def test_a_hard_link_at_put_files_temp_name_is_never_written_through(tmp_path: Path) -> None:
    tc = _cache(tmp_path)
    src, d = _captured(tmp_path)
    target = tc._store_path(d)
    target.parent.mkdir(parents=True)
    outside = _outside(tmp_path)
    os.link(outside, target.parent / f"@tmp-{os.getpid()}-{target.name}")
    with pytest.raises(OSError):
        tc._put_file(src, d)
    assert outside.read_bytes() == b"untouched"


def test_a_hard_link_at_the_restored_copys_temp_name_is_never_written_through(
    tmp_path: Path,
) -> None:
    tc = _cache(tmp_path)
    data = b'{"format":"x"}'
    target = tc._store_path(digest.of_bytes(data))
    target.parent.mkdir(parents=True)
    outside = _outside(tmp_path)
    os.link(outside, target.with_name(f"@tmp-r{os.getpid()}-{threading.get_ident()}-{target.name}"))
    with pytest.raises(OSError):
        tc._put_restored(data)
    assert outside.read_bytes() == b"untouched"


def test_a_hard_link_at_the_last_keys_temp_name_is_never_written_through(tmp_path: Path) -> None:
    tc = _cache(tmp_path)
    ck = CacheKey("t", None, {"task": digest.of_bytes(b"t")})
    last = tc.directory / "last" / "t"
    last.mkdir(parents=True)
    outside = _outside(tmp_path)
    os.link(outside, last / f"{TMP_PREFIX}q-{os.getpid()}")
    tc._write_last(ck, lambda k: k)  # a failure is silent: the last key is a hint
    assert outside.read_bytes() == b"untouched"
    assert not (last / "@task.json").exists()


@pytest.mark.parametrize("linked", ["files", "files/sha256", "files/sha256/xx"])
def test_a_linked_store_directory_is_never_written_through(tmp_path: Path, linked: str) -> None:
    tc = _cache(tmp_path)
    src, d = _captured(tmp_path)
    linked = linked.replace("xx", d[7:9])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link = tc.directory / linked
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(elsewhere, link)
    with pytest.raises(NotADirectoryError):
        tc._put_file(src, d)
    if not linked.startswith("files/sha256/"):  # the restored copy's own subdirectory
        with pytest.raises(NotADirectoryError):
            tc._put_restored(b"{}")
    assert list(elsewhere.iterdir()) == []


def test_a_linked_last_task_directory_is_never_written_through(tmp_path: Path) -> None:
    tc = _cache(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tc.directory / "last").mkdir(parents=True)
    os.symlink(elsewhere, tc.directory / "last" / "t")
    tc._write_last(CacheKey("t", None, {"task": digest.of_bytes(b"t")}), lambda k: k)
    assert list(elsewhere.iterdir()) == []


def test_a_checked_directory_vouches_only_for_itself(tmp_path: Path) -> None:
    """real_dirs checks each component once per process: ``last`` checked for
    one task does not let a link planted at another task's directory through,
    and the memo holds only what was checked."""
    base = tmp_path / "cache"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    made: set[str] = set()
    real_dirs(base, base / "last" / "a", made)
    assert {str(base), str(base / "last"), str(base / "last" / "a")} <= made
    os.symlink(elsewhere, base / "last" / "b")
    with pytest.raises(OSError, match="symlink is never followed"):
        real_dirs(base, str(base / "last" / "b"), made)
    assert str(base / "last" / "b") not in made
    with pytest.raises(ValueError, match="not under"):
        real_dirs(base, tmp_path / "cache-other" / "x", made)
    assert list(elsewhere.iterdir()) == []


def test_a_symlink_at_a_store_files_name_is_replaced_never_kept(tmp_path: Path) -> None:
    """A link planted at a store file's name, to a file holding those very bytes:
    not a store file (a later change of its target would change every hit); the
    next store of those bytes replaces the link with a real file."""
    tc = _cache(tmp_path)
    src, d = _captured(tmp_path)
    target = tc._store_path(d)
    target.parent.mkdir(parents=True)
    twin = tmp_path / "twin"
    twin.write_bytes(src.read_bytes())
    os.symlink(twin, target)
    with pytest.raises(OSError):
        file_digest(target)
    tc._put_file(src, d)
    assert not target.is_symlink() and target.read_bytes() == src.read_bytes()
    assert twin.read_bytes() == src.read_bytes()


def test_a_symlinked_restored_copy_is_never_laid_as_a_record(tmp_path: Path) -> None:
    tc = _cache(tmp_path)
    data = b'{"format":"crucible.result/1"}'
    d = digest.of_bytes(data)
    target = tc._store_path(d)
    target.parent.mkdir(parents=True)
    twin = tmp_path / "twin"
    twin.write_bytes(data)
    os.symlink(twin, target)
    results = tmp_path / "state" / "results"
    results.mkdir(parents=True)
    ck = CacheKey("t", None, {"task": d})
    assert tc.link_record(ck, Hit({}, [], d), str(results / "t.json")) is False
    assert not os.path.lexists(results / "t.json")


def test_a_fifo_in_the_store_is_a_miss_not_a_hang(tmp_path: Path) -> None:
    tc = _cache(tmp_path)
    d = digest.of_bytes(b"x")
    target = tc._store_path(d)
    target.parent.mkdir(parents=True)
    os.mkfifo(target)
    ck = CacheKey("t", None, {"task": d})

    def hung(_sig: int, _frame: object) -> None:
        raise _Hung("file_digest blocked opening a FIFO")  # not an OSError: verify lets it out

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(5)
    try:
        assert tc.verify(ck, Hit({}, [{"path": "x", "size": 1, "digest": d}])) is False
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize(
    "path", ["../escape", "a/../../escape", "/abs/escape", "", "a//b", "./a", "a/\0b"]
)
def test_a_ledger_file_path_outside_the_units_files_is_never_restored(
    tmp_path: Path, path: str
) -> None:
    tc = _cache(tmp_path)
    src, d = _captured(tmp_path)
    tc._put_file(src, d)
    ck = CacheKey("t", None, {"task": d})
    hit = Hit({}, [{"path": path, "size": src.stat().st_size, "digest": d}])
    with pytest.raises(ValueError):
        tc.verify(ck, hit)


def test_a_ledger_file_without_a_sha256_digest_is_never_restored(tmp_path: Path) -> None:
    tc = _cache(tmp_path)
    ck = CacheKey("t", None, {})
    with pytest.raises(ValueError):
        tc.verify(ck, Hit({}, [{"path": "a", "size": 1, "digest": "sha256:../../x"}]))


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([DISPATCH, "cache", *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("linked", ["files", "files/sha256"])
def test_gc_refuses_a_linked_store_and_deletes_nothing_outside(tmp_path: Path, linked: str) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    elsewhere = tmp_path / "elsewhere"
    victim = elsewhere / "sha256" / "ab" / ("c" * 62) if linked == "files" else None
    victim = victim or elsewhere / "ab" / ("c" * 62)
    victim.parent.mkdir(parents=True)
    victim.write_bytes(b"not the cache's")
    (cache / linked).parent.mkdir(parents=True, exist_ok=True)
    os.symlink(elsewhere, cache / linked)
    done = _cli("gc", "--cache", str(cache), "--grace", "0")
    assert done.returncode == 3, done.stderr
    assert done.stderr.count("\n") == 1 and str(cache / linked) in done.stderr
    assert "Traceback" not in done.stderr
    assert victim.read_bytes() == b"not the cache's"


def test_forget_never_removes_through_a_linked_last(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "t").mkdir(parents=True)
    (elsewhere / "t" / "keep.json").write_text("{}")
    os.symlink(elsewhere, cache / "last")
    done = _cli("forget", "t", "--cache", str(cache))
    assert done.returncode == 0, done.stderr
    assert "symlink is never followed" in done.stderr and "Traceback" not in done.stderr
    assert (elsewhere / "t" / "keep.json").exists()


@pytest.mark.parametrize("kind", ["fifo", "symlink"])
def test_a_planted_last_key_is_no_last_key_and_never_hangs(tmp_path: Path, kind: str) -> None:
    """The dry run reads ``last/<task>/<key>.json`` to say why a unit would run."""
    tc = _cache(tmp_path)
    last = tc.directory / "last" / "t"
    last.mkdir(parents=True)
    outside = tmp_path / "outside.json"
    outside.write_text('{"task": "sha256:' + "0" * 64 + '"}')
    if kind == "fifo":
        os.mkfifo(last / "@task.json")
    else:
        os.symlink(outside, last / "@task.json")

    def hung(_sig: int, _frame: object) -> None:
        raise _Hung("last_components blocked opening a FIFO")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(5)
    try:
        assert tc.last_components("t", None, lambda k: k) is None
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_file_digest_of_a_large_store_file_and_of_a_link_to_one(tmp_path: Path) -> None:
    big = tmp_path / "big"
    big.write_bytes(os.urandom(300_000))  # past the one-read size
    assert file_digest(big) == digest.of_file(big)
    link = tmp_path / "link"
    os.symlink(big, link)
    with pytest.raises(OSError):
        file_digest(link)


def _two_store_files(tc: TaskCache, tmp_path: Path) -> tuple[str, str]:
    a, da = _captured(tmp_path, b"first\n")
    tc._put_file(a, da)
    b, db = _captured(tmp_path, b"second\n")
    tc._put_file(b, db)
    return da, db


def test_a_path_listed_twice_is_never_restored(tmp_path: Path) -> None:
    """The second entry would be laid over the first, a hard link to the store:
    copied through it, it rewrote the store file (as root, whom 0444 does not stop)."""
    tc = _cache(tmp_path)
    da, db = _two_store_files(tc, tmp_path)
    files = [{"path": "x", "size": 6, "digest": da}, {"path": "x", "size": 7, "digest": db}]
    with pytest.raises(ValueError):
        tc.verify(CacheKey("t", None, {}), Hit({}, files))
    assert file_digest(tc._store_path(da)) == da


def test_restore_never_copies_over_what_is_at_a_name(tmp_path: Path) -> None:
    tc = _cache(tmp_path)
    da, db = _two_store_files(tc, tmp_path)
    files_dir = tmp_path / "state" / "files" / "t"
    files = [{"path": "x", "size": 6, "digest": da}, {"path": "x", "size": 7, "digest": db}]
    with pytest.raises(FileExistsError):
        tc.restore(Hit({}, files), files_dir)
    assert file_digest(tc._store_path(da)) == da and file_digest(tc._store_path(db)) == db


def test_restore_copies_where_links_cannot_be_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    tc = _cache(tmp_path)
    da, _ = _two_store_files(tc, tmp_path)

    def exdev(src: object, dst: object) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", exdev)
    files_dir = tmp_path / "state" / "files" / "t"
    tc.restore(Hit({}, [{"path": "d/x", "size": 6, "digest": da}]), files_dir)
    copied = files_dir / "d" / "x"
    assert copied.read_bytes() == b"first\n" and copied.stat().st_mode & 0o777 == 0o444
    assert copied.stat().st_ino != tc._store_path(da).stat().st_ino
