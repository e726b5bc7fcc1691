"""Helpers shared by the dispatcher tests."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

#: the ``pack`` fixture (tests/run/conftest.py): writes a pack, returns its manifest
Pack = Callable[..., Path]

DISPATCH = str(Path(sys.executable).parent / "crucible-dispatch")
REPO = Path(__file__).resolve().parents[2]
#: the example pack most run tests dispatch for real
FANOUT = REPO / "examples" / "fanout" / "pack.toml"


def dispatch(
    *args: object, cwd: Path | None = None, timeout: float = 120, **kw: Any
) -> subprocess.CompletedProcess[str]:
    """``crucible-dispatch ARGS`` as a real subprocess, text output captured."""
    return subprocess.run(
        [DISPATCH, *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=timeout, **kw
    )


def fanout_run(state: Path, fail_on: str | None = None, **kw: Any) -> Path:
    """A real run of examples/fanout into ``state``; with ``fail_on``, that instance
    fails (exit 1). ``kw`` goes to :func:`dispatch`. Returns ``state``."""
    params = ("-p", f"fail_on={fail_on}") if fail_on is not None else ()
    done = dispatch(FANOUT, "--state", state, *params, **kw)
    assert done.returncode == (0 if fail_on is None else 1), done.stderr
    return state


def write_pack(directory: Path, toml: str) -> Path:
    """``directory/pack.toml`` holding ``toml`` (dedented: packs are written inline)."""
    pack = directory / "pack.toml"
    pack.write_text(textwrap.dedent(toml).lstrip())
    return pack


def start_dispatch(
    pack: Path, state: Path, *args: str, stderr: Path | None = None
) -> subprocess.Popen[bytes]:
    """``crucible-dispatch PACK --state STATE ARGS`` in the background, stdout
    discarded, stderr into the file ``stderr`` (discarded without one)."""
    argv = [DISPATCH, str(pack), "--state", str(state), *args]
    if stderr is None:
        return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with stderr.open("wb") as err:
        return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err)


@contextlib.contextmanager
def reaped(proc: subprocess.Popen[bytes]) -> Iterator[subprocess.Popen[bytes]]:
    """``proc`` for the block; killed and reaped after it if it still runs (a
    failed assertion leaves no dispatcher behind)."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


class Gate:
    """A file a task's shell waits on (``wait``) while it exists; a ``with`` block
    opens it (removes the file) when it ends, whatever happened."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.write_text("closed")

    @property
    def wait(self) -> str:
        """The shell loop that holds until the gate opens."""
        return f"while [ -e {self.path} ]; do sleep 0.05; done"

    def open(self) -> None:
        self.path.unlink(missing_ok=True)

    def __enter__(self) -> Gate:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.open()


def finished(state: Path, key: str | None = None) -> list[dict[str, Any]]:
    """The ``task_finished`` events of the session, in order; with ``key``, of that
    instance only."""
    return [
        e
        for e in events(state)
        if e["event"] == "task_finished" and (key is None or e.get("key") == key)
    ]


def piped_dispatch(
    pack: Path, state: Path, *args: str, stdout: int = subprocess.PIPE
) -> subprocess.Popen[bytes]:
    """``crucible-dispatch PACK --state STATE ARGS`` in the background, its stderr
    (and stdout, unless ``stdout`` says otherwise) piped for ``communicate``."""
    argv = [DISPATCH, str(pack), "--state", str(state), *args]
    return subprocess.Popen(argv, stdout=stdout, stderr=subprocess.PIPE)


def wait_for(predicate: Callable[[], bool], timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("timed out waiting")


def wait_files(directory: Path, pattern: str, n: int, seconds: float = 60) -> None:
    """Until ``n`` files matching ``pattern`` hold a whole line each (a shell's
    ``echo $$ > f`` creates the file before it writes the line)."""

    def written() -> int:
        return sum(1 for p in directory.glob(pattern) if p.read_text().endswith("\n"))

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and written() < n:
        time.sleep(0.05)
    assert written() >= n, sorted(directory.iterdir())


def read_pids(directory: Path, pattern: str) -> list[int]:
    return [int(p.read_text()) for p in sorted(directory.glob(pattern))]


def wait_gone(pids: list[int], seconds: float = 20) -> list[int]:
    """Until none of ``pids`` is alive, or ``seconds`` pass: the ones still alive."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(process_alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if process_alive(p)]


def one_line(err: str) -> str:
    """The one stderr line of a refusal (never a traceback)."""
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def events(state: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (state / "session.jsonl").read_bytes().splitlines()]


def result(state: Path, task: str, key: str | None = None) -> dict[str, Any] | None:
    from crucible import stage

    return stage.load_result(state, task, key)


def run(plan: Path, state: Path, **kw: object) -> object:
    """run_plan with short backoff and grace, and a small fixed host environment."""
    from crucible.run import RunOptions
    from crucible.run.session._runner import run_plan  # typed (crucible.run loads it lazily)

    options = RunOptions(plan=plan, state=state, backoff=0.01, kill_grace=1.0, **kw)  # type: ignore[arg-type]
    return run_plan(
        options, environ={"PATH": os.environ["PATH"], "HOME": "/nonexistent", "SECRET": "s3"}
    )


def _stat_fields(pid: int) -> list[str] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):  # ESRCH: it exited between open and read
        return None
    return stat.rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, ...


def process_alive(pid: int) -> bool:
    """True for a process that exists and is not a zombie (which still answers kill 0)."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def parent_pid(pid: int) -> int:
    """The parent of ``pid``; -1 when it is gone."""
    fields = _stat_fields(pid)
    return -1 if fields is None else int(fields[1])
