"""Staging captured files without a copy per consumer (issue 14 item 1;
docs/spec/inputs.md 3.4): one published copy per producer unit, consumers get
reflinks or hard links to it, writes through a link are detected, named and
undone, and staging across filesystems copies."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from crucible.core import digest
from crucible.core.errors import InputRefused
from crucible.stage import StateDir
from crucible.stage._files import FICLONE
from tests.stage.stageplans import consume, finish, plan, settle, task

BIG = os.urandom(3000) * 7  # 21,000 bytes: several blocks


def _plan(version: int = 2) -> dict:  # type: ignore[type-arg]
    return plan(
        task("p", emits_files=["out/**"]),
        task("a", needs=["p"]),
        task("b", needs=["p"]),
        task("c", needs=["p"]),
        version=version,
    )


def _produce(state: Path, p: dict) -> dict:  # type: ignore[type-arg]
    return settle(p, state, "p", None, files={"out/big": BIG, "out/sub/small": b"small"})


def _sha(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def test_consumers_share_one_published_copy_whose_digests_equal_the_captured(
    state: Path,
) -> None:
    p = _plan()
    rec = _produce(state, p)
    captured = {f["path"]: f["digest"] for f in rec["files"]}
    assert captured == {"out/big": digest.of_bytes(BIG), "out/sub/small": digest.of_bytes(b"small")}
    inodes = set()
    for name in ("a", "b", "c"):
        ws = consume(p, state, name)
        for rel, want in captured.items():
            staged = ws / "inputs" / "p" / rel
            assert _sha(staged) == want
            assert staged.stat().st_mode & 0o777 == 0o444
            inodes.add((rel, staged.stat().st_ino))
    # one inode per file, shared by every consumer (hard links on this filesystem;
    # a reflink would give each consumer its own)
    if len(inodes) == 2:
        store = state / "files" / "p" / "out" / "big"
        assert store.stat().st_nlink == 1  # the store itself is never handed out
        published = state / "shared" / "p" / "tree" / "out" / "big"
        assert published.stat().st_nlink == 4
    for name in ("a", "b", "c"):
        assert finish(p, state, name)["status"] == "passed"


@pytest.mark.parametrize("how", ["write", "chmod-and-write", "chmod", "truncate", "replace-inode"])
def test_a_consumer_writing_a_staged_file_is_detected_named_and_undone(
    state: Path, how: str
) -> None:
    p = _plan()
    rec = _produce(state, p)
    want = {f["path"]: f["digest"] for f in rec["files"]}
    a = consume(p, state, "a")
    consume(p, state, "b")  # staged at the same time as a: holds the same inodes
    victim = a / "inputs" / "p" / "out" / "big"
    if victim.stat().st_nlink == 1:
        pytest.skip("reflinked: every consumer has a private copy")
    if how in ("chmod-and-write", "chmod"):
        victim.chmod(0o644)
    if how in ("write", "chmod-and-write"):
        with open(victim, "r+b") as f:  # root writes a 0444 file; others chmod first
            f.write(b"EVIL")
    elif how == "truncate":
        os.truncate(victim, 10)
    elif how == "replace-inode":
        # writing in place but keeping size and mtime: only the digest shows it
        st = victim.stat()
        with open(victim, "r+b") as f:
            f.write(b"EVIL")
        os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    ra = finish(p, state, "a")
    assert ra["status"] == "failed" and ra["retryable"] is False
    assert "inputs/p/out/big" in ra["note"] and "changed while a held it" in ra["note"]
    # the store never saw it; a consumer staged afterwards gets the captured bytes
    assert _sha(state / "files" / "p" / "out" / "big") == want["out/big"]
    c = consume(p, state, "c")
    assert _sha(c / "inputs" / "p" / "out" / "big") == want["out/big"]
    assert (c / "inputs" / "p" / "out" / "big").stat().st_mode & 0o777 == 0o444
    assert finish(p, state, "c")["status"] == "passed"
    # b held the changed inode: it is told too, never silently passed
    rb = finish(p, state, "b")
    assert rb["status"] == "failed" and "changed while b held it" in rb["note"]


def test_a_change_found_when_a_later_consumer_is_staged_is_undone_first(state: Path) -> None:
    p = _plan()
    rec = _produce(state, p)
    a = consume(p, state, "a")
    victim = a / "inputs" / "p" / "out" / "sub" / "small"
    if victim.stat().st_nlink == 1:
        pytest.skip("reflinked")
    victim.chmod(0o644)
    victim.write_bytes(b"EVIL!")
    b = consume(p, state, "b")  # before a is captured
    assert (b / "inputs" / "p" / "out" / "sub" / "small").read_bytes() == b"small"
    assert _sha(b / "inputs/p/out/sub/small") == rec["files"][1]["digest"]
    ra = finish(p, state, "a")  # a still holds the changed inode: named
    assert ra["status"] == "failed" and "inputs/p/out/sub/small" in ra["note"]
    assert finish(p, state, "b")["status"] == "passed"


def test_a_touched_mtime_alone_is_not_tampering(state: Path) -> None:
    p = _plan()
    _produce(state, p)
    a = consume(p, state, "a")
    os.utime(a / "inputs" / "p" / "out" / "big", (1, 1))
    assert finish(p, state, "a")["status"] == "passed"


def test_a_store_changed_after_capture_is_refused_at_staging(state: Path) -> None:
    p = _plan()
    _produce(state, p)
    store = state / "files" / "p" / "out" / "big"
    store.chmod(0o644)
    store.write_bytes(b"x" * len(BIG))
    with pytest.raises(InputRefused, match="no longer matches the digest its capture recorded"):
        consume(p, state, "a")
    assert not (state / "work" / "a" / "inputs").exists()


def test_a_new_capture_is_published_again(state: Path) -> None:
    p = _plan()
    _produce(state, p)
    consume(p, state, "a")
    settle(p, state, "p", None, files={"out/big": b"second", "out/sub/small": b"2"})
    b = consume(p, state, "b")
    assert (b / "inputs" / "p" / "out" / "big").read_bytes() == b"second"
    assert finish(p, state, "a")["status"] == "passed"  # its old links: not a tamper


@pytest.mark.parametrize("code", [errno.EXDEV, errno.EMLINK])
def test_a_link_that_cannot_be_made_falls_back_to_a_copy(
    state: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    p = _plan()
    rec = _produce(state, p)

    def no_link(*_a: object, **_k: object) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "link", no_link)
    ws = consume(p, state, "a")
    staged = ws / "inputs" / "p" / "out" / "big"
    assert staged.stat().st_nlink == 1 and _sha(staged) == rec["files"][0]["digest"]
    assert staged.stat().st_mode & 0o777 == 0o444


def _other_fs_dir(near: Path) -> Iterator[Path]:
    shm = Path("/dev/shm")
    if not shm.is_dir() or shm.stat().st_dev == near.stat().st_dev:
        pytest.skip("no second filesystem (tmpfs at /dev/shm) here")
    d = Path(tempfile.mkdtemp(prefix="crucible-test-", dir=shm))
    try:
        yield d
    finally:
        shutil.rmtree(d)


@pytest.fixture
def other_fs(tmp_path: Path) -> Iterator[Path]:
    yield from _other_fs_dir(tmp_path)


def test_staging_across_filesystems_copies(state: Path, other_fs: Path) -> None:
    p = _plan()
    rec = _produce(state, p)
    ws = other_fs / "ws"
    StateDir(p, state).stage_inputs("a", ws)
    for f in rec["files"]:
        staged = ws / "inputs" / "p" / f["path"]
        assert staged.stat().st_nlink == 1 and _sha(staged) == f["digest"]
        assert staged.stat().st_dev != (state / "files").stat().st_dev
    assert (
        StateDir(p, state).capture("a", ws, output_file=ws / "none", exit_code=0)["status"]
        == "passed"
    )


def _reflink_dir() -> Path | None:
    """A directory on a filesystem with reflinks (XFS, btrfs): the environment
    may name one (CRUCIBLE_TEST_REFLINK_DIR); otherwise the test is skipped."""
    d = os.environ.get("CRUCIBLE_TEST_REFLINK_DIR")
    if not d:
        return None
    path = Path(tempfile.mkdtemp(prefix="crucible-test-", dir=d))
    a, b = path / "a", path / "b"
    a.write_bytes(b"x")
    with open(a, "rb") as src, open(b, "wb") as dst:
        try:
            fcntl.ioctl(dst.fileno(), FICLONE, src.fileno())
        except OSError:
            shutil.rmtree(path)
            return None
    a.unlink()
    b.unlink()
    return path


def test_with_reflinks_every_consumer_has_a_private_copy() -> None:
    root = _reflink_dir()
    if root is None:
        pytest.skip("set CRUCIBLE_TEST_REFLINK_DIR to a directory on XFS or btrfs")
    try:
        state = root / "state"
        state.mkdir()
        p = _plan()
        rec = _produce(state, p)
        a = consume(p, state, "a")
        b = consume(p, state, "b")
        va, vb = a / "inputs/p/out/big", b / "inputs/p/out/big"
        assert va.stat().st_nlink == 1 and va.stat().st_ino != vb.stat().st_ino
        va.chmod(0o644)
        va.write_bytes(b"EVIL")
        assert _sha(vb) == rec["files"][0]["digest"]  # copy-on-write: b never sees it
        assert _sha(state / "files/p/out/big") == rec["files"][0]["digest"]
    finally:
        shutil.rmtree(root)


def test_mapped_producers_and_settled_joins_share_too(state: Path) -> None:
    p = plan(
        task("src", emits={"xs": "array"}),
        task("m", needs=["src"], map="src.xs", emits_files=["o"]),
        task("j", needs=["m"], join="settled"),
        task("e", needs=["m"], epilogue=True),
    )
    settle(p, state, "src", {"xs": [1, 2]})

    settle(p, state, "m", None, key="0", files={"o": b"zero"})
    settle(p, state, "m", None, key="1", files={"o": b"one"}, exit_code=1)  # retained files
    StateDir(p, state).settle_fold("m", ["0", "1"])
    for name in ("j", "e"):
        ws = consume(p, state, name)
        assert (ws / "inputs/m/0/o").read_bytes() == b"zero"
        assert (ws / "inputs/m/1/o").read_bytes() == b"one"
    assert (state / "shared/m/0/tree/o").stat().st_nlink in (1, 3)
    assert finish(p, state, "j")["status"] == "passed"


def _du_files(*tops: Path) -> int:
    """Bytes on disk of the regular files under ``tops``, each inode once (as du)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for top in tops:
        for dirpath, _, files in os.walk(top):
            for name in files:
                st = os.lstat(os.path.join(dirpath, name))
                if (st.st_dev, st.st_ino) not in seen:
                    seen.add((st.st_dev, st.st_ino))
                    total += st.st_blocks * 512
    return total


@pytest.mark.slow
def test_a_10000_instance_fan_out_stages_at_most_twice_the_captured_bytes(
    state: Path,
) -> None:
    """Every instance gets the producer's 100 files under inputs/p/; the files
    cost the store plus one published copy on disk, whatever the fan-out
    (before: a copy per instance, 10,000 x the captured bytes)."""
    n = 10_000
    p = plan(
        task("p", emits_files=["out"], emits={"xs": "array"}),
        task("m", needs=["p"], map="p.xs"),
        version=2,
    )
    files = {f"out/f{i:03}": os.urandom(16384) for i in range(100)}
    rec = settle(p, state, "p", {"xs": list(range(n))}, files=files)
    captured = sum(f["size"] for f in rec["files"])
    work = state / "work" / "m"
    for k in range(n):
        StateDir(p, state).stage_inputs("m", work / str(k), key=str(k))
    some = work / "4321" / "inputs" / "p" / "out" / "f042"
    assert some.read_bytes() == files["out/f042"] and some.stat().st_nlink in (1, n + 1)
    trees = [work / str(k) / "inputs" / "p" for k in range(n)]
    store = _du_files(state / "files")
    # file data only: directories and the manifest are metadata (reported below)
    staged = _du_files(state / "shared" / "p" / "tree", *trees)  # links count once, as du
    if some.stat().st_nlink == 1:  # reflinks: shared extents du cannot see
        pytest.skip("reflinked: du counts every clone")
    assert store + staged <= 2 * store and store == captured, (store, staged, captured)
    du = subprocess.run(["du", "-sB1", str(state)], capture_output=True, text=True, check=True)
    meta = _du_files(state / "shared") - staged
    print(
        f"captured {captured} B; store {store} B; staged file data {staged} B on disk; "
        f"manifest {meta} B; du of the state {du.stdout.split()[0]} B"
    )


def test_a_timed_out_consumer_is_checked_when_it_is_settled(state: Path) -> None:

    p = _plan()
    _produce(state, p)
    a = consume(p, state, "a")
    victim = a / "inputs" / "p" / "out" / "big"
    if victim.stat().st_nlink == 1:
        pytest.skip("reflinked")
    victim.chmod(0o644)
    victim.write_bytes(b"EVIL")
    rec = StateDir(p, state).record_settled("a", status="failed", note="timed out after 1 s")
    assert rec["note"].startswith("timed out after 1 s; staged file inputs/p/out/big")
    b = consume(p, state, "b")
    assert (b / "inputs/p/out/big").read_bytes() == BIG


@pytest.mark.skipif(os.geteuid() == 0, reason="root unlinks from read-only directories")
def test_restaging_never_chmods_a_shared_file(state: Path) -> None:
    """A consumer that made its own inputs/p directory read-only: laying its
    inputs down again removes the old tree without chmod'ing the files in it
    (each is an inode every other consumer holds)."""
    p = _plan()
    _produce(state, p)
    a = consume(p, state, "a")
    consume(p, state, "b")
    (a / "inputs" / "p" / "out").chmod(0o555)
    consume(p, state, "a")  # the old tree is removed
    published = state / "shared" / "p" / "tree" / "out" / "big"
    assert published.stat().st_mode & 0o777 == 0o444
    assert finish(p, state, "b")["status"] == "passed"


def test_a_consumer_staged_ahead_starts_with_the_captured_bytes(state: Path) -> None:

    p = _plan()
    _produce(state, p)
    a = consume(p, state, "a")
    b = consume(p, state, "b")  # staged ahead, while a runs
    victim = a / "inputs" / "p" / "out" / "big"
    if victim.stat().st_nlink == 1:
        pytest.skip("reflinked")
    victim.chmod(0o644)
    victim.write_bytes(b"EVIL")
    assert StateDir(p, state).refresh_inputs("b", b) == ["inputs/p/out/big"]  # just before b starts
    held = b / "inputs" / "p" / "out" / "big"
    assert held.read_bytes() == BIG and held.stat().st_mode & 0o777 == 0o444
    assert StateDir(p, state).refresh_inputs("b", b) == []
    ra = finish(p, state, "a")
    assert ra["status"] == "failed" and "changed while a held it" in ra["note"]
    assert finish(p, state, "b")["status"] == "passed"
