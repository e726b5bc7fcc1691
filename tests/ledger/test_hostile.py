"""Hostile input to crucible-ledger (issue 12 items 1, 2, 4, 29, 30; issue 15
item 6): planted symlinks, full disks, read-only and missing directories. Real
processes throughout: what is checked is the command's exit code and stderr."""

from __future__ import annotations

import json
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

import pytest

from tests.ledger._unprivileged import run_unprivileged

LEDGER = str(Path(sys.executable).parent / "crucible-ledger")


def ledger(
    *args: str, stdin: bytes | None = None, fsize: int | None = None, stdout: IO[bytes] | None = None
) -> subprocess.CompletedProcess[bytes]:
    def limit() -> None:  # pragma: no cover - in the child
        if fsize is not None:
            # a file-size limit is a full disk for the writes past it (EFBIG)
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    return subprocess.run(
        [LEDGER, *args],
        input=stdin,
        stdout=stdout if stdout is not None else subprocess.PIPE,
        stderr=subprocess.PIPE,
        timeout=60,
        preexec_fn=limit if fsize is not None else None,
    )


def records(directory: Path) -> list[dict[str, Any]]:
    path = directory / "steps.jsonl"
    if not path.exists():
        return []
    return [json.loads(line)["r"] for line in path.read_bytes().splitlines()]


def one_line(done: subprocess.CompletedProcess[bytes]) -> str:
    text = done.stderr.decode()
    assert "Traceback" not in text
    lines = text.splitlines()
    assert len(lines) == 1, lines
    return lines[0]


@pytest.fixture
def d(tmp_path: Path) -> Path:
    directory = tmp_path / "ledger"
    directory.mkdir()
    return directory


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    victim = tmp_path / "outside.txt"
    victim.write_bytes(b"precious bytes that must survive\n")
    return victim


# -- item 1: a symlinked lock is never written through -----------------------------
def test_compact_refuses_a_symlinked_lock_and_leaves_its_target(d: Path, outside: Path) -> None:
    assert ledger("put", "--dir", str(d), "--scope", "s", "--step", "a", stdin=b"1").returncode == 0
    (d / "steps.lock").unlink()
    (d / "steps.lock").symlink_to(outside)
    before = (d / "steps.jsonl").read_bytes()
    done = ledger("compact", "--dir", str(d))
    assert done.returncode == 3
    line = one_line(done)
    assert "steps.lock" in line and "symlink" in line, line
    assert outside.read_bytes() == b"precious bytes that must survive\n"
    assert (d / "steps.jsonl").read_bytes() == before


def test_quarantine_in_run_never_writes_through_a_symlinked_lock(d: Path, outside: Path) -> None:
    (d / "steps.jsonl").write_bytes(b"garbage\nmore garbage\n")
    (d / "steps.lock").symlink_to(outside)
    done = ledger("run", "--dir", str(d), "--scope", "s", "--", "echo", "hi")
    assert done.returncode == 0 and done.stdout == b"hi\n"  # the work runs regardless
    assert b"symlink" in done.stderr and b"Traceback" not in done.stderr
    assert outside.read_bytes() == b"precious bytes that must survive\n"
    assert (d / "steps.jsonl").read_bytes() == b"garbage\nmore garbage\n"


def test_a_dangling_lock_symlink_creates_nothing_outside(d: Path, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere" / "created-by-us"
    target.parent.mkdir()
    (d / "steps.lock").symlink_to(target)
    done = ledger("run", "--dir", str(d), "--scope", "s", "--", "echo", "hi")
    assert done.returncode == 0 and done.stdout == b"hi\n"
    assert b"not recorded" in done.stderr and b"symlink" in done.stderr
    assert not target.exists()
    assert (d / "steps.lock").is_symlink()


# -- item 2: a symlinked ledger is quarantined, never written through -------------
@pytest.mark.parametrize("dangling", [False, True])
def test_a_symlinked_ledger_is_quarantined_not_written_through(
    d: Path, outside: Path, tmp_path: Path, dangling: bool
) -> None:
    target = tmp_path / "nowhere.jsonl" if dangling else outside
    (d / "steps.jsonl").symlink_to(target)
    done = ledger("run", "--dir", str(d), "--scope", "s", "--", "echo", "hi")
    assert done.returncode == 0 and done.stdout == b"hi\n"
    assert b"links are not followed" in done.stderr and b"quarantined" in done.stderr
    if dangling:
        assert not target.exists()
    else:
        assert outside.read_bytes() == b"precious bytes that must survive\n"
    [aside] = d.glob("steps.jsonl.quarantine-*")
    assert aside.is_symlink() and aside.readlink() == target  # kept as it was
    assert not (d / "steps.jsonl").is_symlink()
    assert [r["step"].startswith("run:") for r in records(d)] == [True]
    replay = ledger("run", "--dir", str(d), "--scope", "s", "--", "echo", "hi")
    assert replay.returncode == 0 and b"cached: replayed" in replay.stderr


def test_readers_never_follow_a_symlinked_ledger(d: Path, tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    assert (
        ledger("put", "--dir", str(real), "--scope", "s", "--step", "a", stdin=b"1").returncode == 0
    )
    (d / "steps.jsonl").symlink_to(real / "steps.jsonl")
    done = ledger("get", "--dir", str(d), "--scope", "s", "--step", "a")
    assert done.returncode == 1 and b"links are not followed" in done.stderr
    assert (d / "steps.jsonl").is_symlink()  # a reader changes nothing
    verify = ledger("verify", "--dir", str(d))
    assert verify.returncode == 3 and "links are not followed" in one_line(verify)


# -- item 4: a failed live copy of the output is exit 3, never 0 --------------------
def test_run_passthrough_on_a_full_disk_exits_3(d: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    with out.open("wb") as f:
        done = ledger(
            "run", "--dir", str(d), "--scope", "s", "--", "seq", "1", "100000",
            fsize=40960, stdout=f,
        )  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert "cannot write the command's stdout" in done.stderr.decode()
    assert "Traceback" not in done.stderr.decode()
    assert out.stat().st_size <= 40960
    # replayed onto the same full disk: exit 3 as well
    ok = ledger("run", "--dir", str(d), "--scope", "s", "--", "seq", "1", "100000")
    assert ok.returncode == 0 and ok.stdout.endswith(b"\n100000\n")
    with out.open("wb") as f:
        again = ledger(
            "run", "--dir", str(d), "--scope", "s", "--", "seq", "1", "100000",
            fsize=40960, stdout=f,
        )  # fmt: skip
    assert again.returncode == 3 and b"Traceback" not in again.stderr


@pytest.mark.parametrize("verb", ["ls", "get"])
def test_ls_and_get_on_a_full_disk_exit_3(d: Path, tmp_path: Path, verb: str) -> None:
    value = json.dumps({"blob": "x" * 100_000}).encode()
    assert (
        ledger("put", "--dir", str(d), "--scope", "s", "--step", "a", stdin=value).returncode == 0
    )
    args = ["--scope", "s", "--step", "a"] if verb == "get" else []
    with (tmp_path / "out").open("wb") as f:
        done = ledger(verb, "--dir", str(d), *args, fsize=4096, stdout=f)
    assert done.returncode == 3
    assert "No space" in one_line(done) or "too large" in one_line(done)


# -- item 29: a read-only --dir names EACCES on steps.lock --------------------------
@pytest.mark.parametrize("verb", ["compact", "put"])
def test_read_only_dir_names_the_lock_and_permission(verb: str) -> None:
    from tests.ledger._unprivileged import shared_tempdir

    d = shared_tempdir() / "ro"
    d.mkdir()
    d.chmod(0o555)

    def call() -> int:
        import io

        from crucible.ledger.cli import main

        sys.stdin = io.TextIOWrapper(io.BytesIO(b"1"))
        main([verb, "--dir", str(d), *(["--scope", "s", "--step", "x"] if verb == "put" else [])])
        return 70

    try:
        done = run_unprivileged(call)
    finally:
        d.chmod(0o755)
        shutil.rmtree(d.parent)  # this test's own directory, nothing shared
    assert done.code == 3, done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert "steps.lock" in line and "Permission denied" in line, done.stderr
    assert "No such file" not in done.stderr


# -- item 30: no subcommand ---------------------------------------------------------
def test_no_subcommand_is_one_line_with_the_help_hint() -> None:
    done = ledger()
    assert done.returncode == 2
    assert (
        one_line(done) == "crucible-ledger: error: missing command (see 'crucible-ledger --help')"
    )
    assert done.stdout == b""


# -- issue 15 item 6: a missing directory is created ---------------------------------
def test_run_creates_a_missing_directory_with_its_parents(tmp_path: Path) -> None:
    d = tmp_path / "a" / "b" / ".ledger"
    done = ledger("run", "--dir", str(d), "--scope", "s", "--", "echo", "hi")
    assert done.returncode == 0 and done.stdout == b"hi\n" and done.stderr == b""
    assert len(records(d)) == 1
    put = ledger("put", "--dir", str(tmp_path / "p"), "--scope", "s", "--step", "x", stdin=b"1")
    assert put.returncode == 0 and len(records(tmp_path / "p")) == 1


def test_run_without_a_possible_directory_runs_unrecorded_with_one_warning(
    tmp_path: Path,
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    done = ledger(
        "run", "--dir", str(blocker / "sub"), "--scope", "s", "--", "sh", "-c", "echo hi; exit 4"
    )
    assert done.returncode == 4 and done.stdout == b"hi\n"
    line = one_line(done)
    assert line.startswith("crucible-ledger: warning: cannot create the ledger directory")
    assert "running sh unrecorded" in line
    assert blocker.read_text() == "not a directory"
    put = ledger("put", "--dir", str(blocker / "sub"), "--scope", "s", "--step", "x", stdin=b"1")
    assert put.returncode == 3 and "nothing recorded" in one_line(put)


def test_readers_of_a_missing_directory_see_an_empty_ledger_and_create_nothing(
    tmp_path: Path,
) -> None:
    d = tmp_path / "missing"
    assert ledger("get", "--dir", str(d), "--scope", "s", "--step", "x").returncode == 1
    assert ledger("ls", "--dir", str(d)).returncode == 0
    assert ledger("verify", "--dir", str(d)).returncode == 0
    assert ledger("compact", "--dir", str(d)).returncode == 0
    assert not d.exists()
