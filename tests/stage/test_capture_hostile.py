"""Capture against a hostile or careless task (issue 12, items 8, 9, 10, 14, 15,
16, 17): every case settles as a failed attempt with a note, never a hang, an
unbounded read, a traceback or a read outside the workspace."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path
from typing import Any

import pytest

from crucible.core.errors import InputRefused, OperationalError
from crucible.core.fsio import NotRegular, open_regular, read_at_most, walk_tree
from crucible.stage import StateDir, clear_path
from crucible.stage._capture import RESULT_FILE_MAX
from crucible.stage._files import CAPTURE_DEPTH_MAX
from tests.stage.stageplans import plan, task

P = plan(task("p", emits={"n": "integer"}), version=2)


def _capture(state: Path, ws: Path, out: Path, p: dict | None = None) -> dict:  # type: ignore[type-arg]
    return StateDir(P if p is None else p, state).capture("p", ws, output_file=out, exit_code=0)


def test_a_fifo_result_file_fails_the_attempt_without_blocking(state: Path, ws: Path) -> None:
    out = ws / "out.json"
    os.mkfifo(out)
    rec = _capture(state, ws, out)  # before the fix: open() blocked forever
    assert rec["status"] == "failed" and rec["retryable"] is False
    assert "is a FIFO, not a regular file" in rec["note"]


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod of a device needs root")
def test_a_device_result_file_is_never_read(state: Path, ws: Path) -> None:
    out = ws / "out.json"
    os.mknod(out, stat.S_IFCHR | 0o666, os.makedev(1, 5))  # /dev/zero's numbers
    rec = _capture(state, ws, out)
    assert rec["status"] == "failed" and "is a character device" in rec["note"]


def test_a_symlink_to_a_device_or_fifo_outside_is_refused(
    state: Path, ws: Path, tmp_path: Path
) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    out = ws / "out.json"
    out.symlink_to(fifo)
    rec = _capture(state, ws, out)
    assert rec["status"] == "failed" and "outside the workspace" in rec["note"]


def test_a_symlink_to_a_file_outside_the_workspace_is_refused(
    state: Path, ws: Path, tmp_path: Path
) -> None:
    secret = tmp_path / "secret.json"
    secret.write_text('{"n": 1}')
    out = tmp_path / "result-link.json"  # CRUCIBLE_OUTPUT itself lives outside the workspace
    out.symlink_to(secret)
    rec = _capture(state, ws, out)
    assert rec["status"] == "failed" and rec["retryable"] is False
    assert "outside the workspace" in rec["note"] and "output" not in rec


def test_a_symlink_to_a_result_inside_the_workspace_is_followed(
    state: Path, ws: Path, tmp_path: Path
) -> None:
    (ws / "r.json").write_text('{"n": 1}')
    out = tmp_path / "result-link.json"
    out.symlink_to(ws / "r.json")
    assert _capture(state, ws, out)["status"] == "passed"


def test_a_symlink_inside_the_workspace_to_a_fifo_inside_is_not_waited_on(
    state: Path, ws: Path
) -> None:
    os.mkfifo(ws / "fifo")
    out = ws / "out.json"
    out.symlink_to(ws / "fifo")
    rec = _capture(state, ws, out)
    assert rec["status"] == "failed" and "is a FIFO" in rec["note"]


def test_a_result_file_over_the_bound_is_a_measured_failure(
    state: Path, ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("crucible.stage._capture.RESULT_FILE_MAX", 100)
    out = ws / "out.json"
    out.write_text('{"n": 1, "pad": "' + "x" * 200 + '"}')
    rec = _capture(state, ws, out)
    assert rec["status"] == "failed" and rec["retryable"] is False
    assert "more than 100 bytes" in rec["note"] and "emits_files" in rec["note"]
    assert RESULT_FILE_MAX == 64 * 1024 * 1024


def test_a_directory_left_where_the_result_file_goes_fails_the_attempt(
    state: Path, ws: Path
) -> None:
    out = ws / "t.json"
    (out / "x").mkdir(parents=True)
    rec = _capture(state, ws, out)
    assert rec["status"] == "failed" and "is a directory, not a regular file" in rec["note"]


def test_clear_path_removes_whatever_an_earlier_attempt_left(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("k")
    for make in (
        lambda p: (p / "x" / "y").mkdir(parents=True),
        lambda p: os.chmod((p.mkdir(), p)[1], 0o500),
        lambda p: os.mkfifo(p),
        lambda p: p.symlink_to(outside),
        lambda p: p.write_text("old"),
    ):
        target = tmp_path / "2" / "t.json"
        target.parent.mkdir(exist_ok=True)
        make(target)
        clear_path(target)
        assert not os.path.lexists(target)
    clear_path(tmp_path / "2" / "missing")  # nothing there: fine
    assert (outside / "keep").read_text() == "k"


@pytest.fixture
def nest(request: pytest.FixtureRequest) -> object:
    """Make ``depth`` nested directories ``d`` under a root (os.makedirs and
    pytest's own cleanup both recurse once per level), removed afterwards
    iteratively."""
    made: list[Path] = []

    def make(root: Path, depth: int) -> None:
        root.mkdir(parents=True, exist_ok=True)
        made.append(root)
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for _ in range(depth):
                os.mkdir("d", dir_fd=fd)
                nxt = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
                os.close(fd)
                fd = nxt
        finally:
            os.close(fd)

    def cleanup() -> None:
        for root in made:
            for rel in reversed(walk_tree(str(root), max_depth=100_000)):
                path = os.path.join(root, rel)
                if os.path.isdir(path) and not os.path.islink(path):
                    os.rmdir(path)
                else:
                    os.unlink(path)

    request.addfinalizer(cleanup)
    return make


@pytest.mark.parametrize("pattern", ["out", "out/**", "**"])
def test_deeply_nested_directories_fail_measured_not_with_recursion_error(
    state: Path, ws: Path, pattern: str, nest: Any
) -> None:
    nest(ws / "out", 1500)
    p = plan(task("p", emits_files=[pattern]), version=2)
    rec = StateDir(p, state).capture("p", ws, output_file=ws / "none", exit_code=0)
    assert rec["status"] == "failed" and rec["retryable"] is False
    assert f"nested more than {CAPTURE_DEPTH_MAX} directories" in rec["note"]
    assert not (state / "files" / "p").exists()


def test_nesting_within_the_bound_is_captured(state: Path, ws: Path) -> None:
    deep = os.path.join(ws, "out", *(["d"] * (CAPTURE_DEPTH_MAX - 2)))
    os.makedirs(deep)
    Path(deep, "f").write_text("f")
    for pattern in ("out", "out/**/f"):
        p = plan(task("p", emits_files=[pattern]), version=2)
        rec = StateDir(p, state).capture("p", ws, output_file=ws / "none", exit_code=0)
        assert rec["status"] == "passed", rec["note"]
        assert [f["path"].count("/") for f in rec["files"]] == [CAPTURE_DEPTH_MAX - 1]


@pytest.mark.parametrize("pattern", ["[!]", "[z-a]", "out/[z-a].txt"])
def test_a_bad_glob_is_a_plan_error_never_re_error(state: Path, ws: Path, pattern: str) -> None:
    p = plan(task("p", emits_files=[pattern]), version=2)
    with pytest.raises(InputRefused, match="not a valid glob"):
        StateDir(p, state).capture("p", ws, output_file=ws / "none", exit_code=0)
    assert not (state / "results").exists()


def test_a_directory_renamed_mid_capture_fails_the_attempt(
    state: Path, ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for d in ("out/a", "out/b"):
        (ws / d).mkdir(parents=True)
        (ws / d / "f").write_text("f")
    real_scandir = os.scandir

    def renaming_scandir(path: object) -> object:
        if str(path).endswith("/b"):  # a daemon moved it between listing and entering
            os.rename(str(path), str(path) + "-moved")
        return real_scandir(path)  # type: ignore[call-overload]

    monkeypatch.setattr(os, "scandir", renaming_scandir)
    for pattern in ("out", "out/**"):
        os.rename(ws / "out" / "b-moved", ws / "out" / "b") if (
            ws / "out/b-moved"
        ).exists() else None
        p = plan(task("p", emits_files=[pattern]), version=2)
        rec = StateDir(p, state).capture("p", ws, output_file=ws / "none", exit_code=0)
        assert rec["status"] == "failed" and rec["retryable"] is False, rec
        assert "vanished" in rec["note"]


def test_a_daemon_renaming_directories_never_breaks_capture(state: Path, ws: Path) -> None:
    """The real race, measured: every capture returns a record."""
    for i in range(30):
        (ws / "out" / f"d{i}").mkdir(parents=True)
        (ws / "out" / f"d{i}" / "f").write_text("f")
    stop = threading.Event()

    def daemon() -> None:
        n = 0
        while not stop.is_set():
            i = n % 30
            a, b = ws / "out" / f"d{i}", ws / "out" / f"e{i}"
            try:
                os.rename(a, b)
                os.rename(b, a)
            except OSError:
                pass
            n += 1

    t = threading.Thread(target=daemon)
    t.start()
    statuses = []
    try:
        for pattern in ["out", "out/**/f"] * 10:
            p = plan(task("p", emits_files=[pattern]), version=2)
            statuses.append(
                StateDir(p, state).capture("p", ws, output_file=ws / "none", exit_code=0)["status"]
            )
    finally:
        stop.set()
        t.join()
    assert set(statuses) <= {"passed", "failed"} and len(statuses) == 20


def test_open_regular_and_read_at_most(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"12345")
    fd, st = open_regular(f)
    try:
        assert st.st_size == 5 and read_at_most(fd, 5) == b"12345"
    finally:
        os.close(fd)
    fd, _ = open_regular(f)
    try:
        with pytest.raises(OverflowError):
            read_at_most(fd, 4)
    finally:
        os.close(fd)
    (tmp_path / "l").symlink_to(f)
    os.mkfifo(tmp_path / "fifo")
    for name, what in (("l", "a symlink"), ("fifo", "a FIFO"), ("", "a directory")):
        with pytest.raises(NotRegular, match=what):
            open_regular(tmp_path / name)
    with pytest.raises(FileNotFoundError):
        open_regular(tmp_path / "missing")


def test_walk_tree_is_iterative_and_bounded(tmp_path: Path, nest: Any) -> None:
    nest(tmp_path / "t", 1500)
    from crucible.core.fsio import TooDeep

    with pytest.raises(TooDeep):
        walk_tree(str(tmp_path / "t"), max_depth=256)
    assert len(walk_tree(str(tmp_path / "t"), max_depth=2000)) == 1500


def test_clear_path_reports_what_it_cannot_remove(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root removes from read-only directories")
    d = tmp_path / "ro"
    d.mkdir()
    (d / "f").write_text("f")
    d.chmod(0o500)
    try:
        with pytest.raises(OperationalError):
            clear_path(d / "f")
    finally:
        d.chmod(0o700)
