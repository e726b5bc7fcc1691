"""A batch of many record files is made durable by one syncfs of the state's
filesystem, not one fsync each (crucible.core.syncfs; docs/spec/run.md,
"Records ride the group commit"), still before the batch's lines; a batch of a
few files, or one with a file on another filesystem, fsyncs each."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from crucible.core.errors import OperationalError
from crucible.core.syncfs import SYNCFS_MIN_PATHS, FsSync, _kernel_reports_errors
from crucible.run.session import _log as session
from crucible.run.session import events
from tests.run.cachetests import dispatch_with


def _records(tmp_path: Path, n: int) -> list[str]:
    results = tmp_path / "results"
    results.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        p = results / f"t{i}.json"
        p.write_bytes(b"{}")
        paths.append(str(p))
    return [*paths, str(results)]


def _usable(tmp_path: Path) -> bool:
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        return FsSync(fd, str(tmp_path)).covers(_records(tmp_path / "probe", SYNCFS_MIN_PATHS))
    finally:
        os.close(fd)


@pytest.fixture
def traced(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The log's fsyncs (the path of each) and syncfs calls ("syncfs"), in order."""
    calls: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        real(fd)
        calls.append(os.readlink(f"/proc/self/fd/{fd}"))

    def syncfs(fs: FsSync) -> None:
        fs.sync()
        calls.append("syncfs")

    monkeypatch.setattr(session, "_fsync", fsync)
    monkeypatch.setattr(session, "_syncfs", syncfs)
    return calls


def test_a_batch_of_many_records_is_one_syncfs_before_the_lines(
    tmp_path: Path, traced: list[str]
) -> None:
    if not _usable(tmp_path):
        pytest.skip("syncfs is not used on this filesystem or kernel")
    paths = _records(tmp_path, 40)
    log = session.SessionLog(tmp_path / "session.jsonl", 1)
    log.sync(paths)
    log.emit(events.task_finished(task="t0", status="passed", note=None))
    log.close()
    assert traced == ["syncfs", str(tmp_path / "session.jsonl")]
    assert log.durable_seq == 1


def test_a_batch_of_a_few_records_fsyncs_each(tmp_path: Path, traced: list[str]) -> None:
    paths = _records(tmp_path, SYNCFS_MIN_PATHS - 2)  # + results/: one under the threshold
    log = session.SessionLog(tmp_path / "session.jsonl", 1)
    log.sync(paths)
    log.emit(events.task_finished(task="t0", status="passed", note=None))
    log.close()
    assert traced == [*paths, str(tmp_path / "session.jsonl")]


def test_a_record_on_another_filesystem_makes_the_batch_fsync_each(
    tmp_path: Path, traced: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    if not _usable(tmp_path):
        pytest.skip("syncfs is not used on this filesystem or kernel")
    paths = _records(tmp_path, 20)
    other = paths[3]
    real_lstat = os.lstat

    class _Other:
        st_dev = -1

    def lstat(p: str) -> object:
        return _Other() if p == other else real_lstat(p)

    monkeypatch.setattr(os, "lstat", lstat)
    log = session.SessionLog(tmp_path / "session.jsonl", 1)
    log.sync(paths)
    log.close()
    assert "syncfs" not in traced
    assert traced == paths  # no lines: no fsync of the log


def test_a_record_removed_meanwhile_needs_nothing(tmp_path: Path, traced: list[str]) -> None:
    if not _usable(tmp_path):
        pytest.skip("syncfs is not used on this filesystem or kernel")
    paths = _records(tmp_path, 20)
    os.unlink(paths[0])  # a retry's record
    log = session.SessionLog(tmp_path / "session.jsonl", 1)
    log.sync(paths)
    log.close()
    assert traced == ["syncfs"]


def test_a_failed_syncfs_stops_the_log_naming_the_state_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not _usable(tmp_path):
        pytest.skip("syncfs is not used on this filesystem or kernel")

    def failing(fs: FsSync) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO), fs.where)

    monkeypatch.setattr(session, "_syncfs", failing)
    log = session.SessionLog(tmp_path / "session.jsonl", 1)
    log.sync(_records(tmp_path, 20))
    log.emit(events.task_finished(task="t0", status="passed", note=None))
    with pytest.raises(OperationalError) as caught:
        log.close()
    assert "cannot write result record: Input/output error" in str(caught.value)
    assert str(tmp_path) in str(caught.value)
    assert log.durable_seq == 0
    assert (tmp_path / "session.jsonl").read_bytes() == b""  # the lines never written


def test_the_real_syncfs_reports_no_error_on_a_healthy_filesystem(tmp_path: Path) -> None:
    if not _usable(tmp_path):
        pytest.skip("syncfs is not used on this filesystem or kernel")
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        FsSync(fd, str(tmp_path)).sync()
    finally:
        os.close(fd)


@pytest.mark.parametrize(
    ("release", "ok"),
    [("5.8.0", True), ("6.18.44-fc-v1045", True), ("5.7.19-200.fc32.x86_64", False),
     ("4.19.0-6-amd64", False), ("weird", False), ("10.0", True)],
)  # fmt: skip
def test_syncfs_is_used_only_where_it_reports_writeback_errors(release: str, ok: bool) -> None:
    assert _kernel_reports_errors(release) is ok


#: a dispatcher prelude tracing the log's fsyncs and syncfs calls in $TRACE
TRACED = """
import os, sys
from crucible.run.session import _log as _session
trace = os.environ["TRACE"]
def note(line):
    with open(trace, "a") as f:
        f.write(line + "\\n")
real_fsync, real_syncfs = _session._fsync, _session._syncfs
def fsync(fd):
    real_fsync(fd)
    note("fsync " + os.readlink(f"/proc/self/fd/{fd}"))
def syncfs(fs):
    real_syncfs(fs)
    note("syncfs")
_session._fsync, _session._syncfs = fsync, syncfs
"""


def _record_then_hit(tmp_path: Path, pack: Path, jobs: str) -> list[str]:
    """A recording run, then a run that hits: the hit's traced lines."""
    cache = tmp_path / "cache"
    for state in ("rec", "hit"):
        trace = tmp_path / f"trace-{state}.txt"
        done = dispatch_with(
            TRACED, pack, "--state", tmp_path / state, "-j", jobs, "--cache", cache,
            env={"TRACE": str(trace)}, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    return trace.read_text().splitlines()


def test_a_fully_cached_rerun_fsyncs_no_record_file_one_by_one(tmp_path: Path) -> None:
    if not _usable(tmp_path):
        pytest.skip("syncfs is not used on this filesystem or kernel")
    body = "".join(
        f'[[workflow.task]]\nname = "t{i}"\nrun = \'printf "{{}}" > "$CRUCIBLE_OUTPUT"\'\n'
        for i in range(30)
    )
    pack = tmp_path / "pack.toml"
    pack.write_text('edition = 3\n\n[workflow]\nname = "many"\n\n' + body)
    lines = _record_then_hit(tmp_path, pack, "2")
    assert not [line for line in lines if "/results/" in line]
    assert lines.count("syncfs") >= 1
    # every batch's records before its lines: the first syncfs precedes the log's fsync
    assert lines.index("syncfs") < lines.index(f"fsync {tmp_path / 'hit' / 'session.jsonl'}")
    records = sorted(p.name for p in (tmp_path / "hit" / "results").iterdir())
    assert records == sorted(f"t{i}.json" for i in range(30))


def test_a_few_hits_fsync_their_linked_records_before_the_lines(tmp_path: Path) -> None:
    """Below the syncfs threshold each restored record is fsynced (a linked one
    through its results/ name: the store's inode) with its directory, before
    the batch's lines, whether it was linked or written (a keyed unit's line)."""
    body = (
        '[[workflow.task]]\nname = "a"\nrun = \'printf "{}" > "$CRUCIBLE_OUTPUT"\'\n'
        '[[workflow.task]]\nname = "m"\nmap = ["x"]\nrun = "true"\n'
    )
    pack = tmp_path / "pack.toml"
    pack.write_text('edition = 4\n\n[workflow]\nname = "few"\n\n' + body)
    lines = _record_then_hit(tmp_path, pack, "1")
    results = tmp_path / "hit" / "results"
    log_sync = lines.index(f"fsync {tmp_path / 'hit' / 'session.jsonl'}")
    for synced in (results / "a.json", results, results / "m.jsonl"):
        assert lines.index(f"fsync {synced}") < log_sync
    assert "syncfs" not in lines
    assert os.stat(results / "a.json").st_nlink == 2  # linked from the store
