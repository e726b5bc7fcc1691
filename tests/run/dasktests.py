"""Helpers shared by the Dask executor tests (issue 19): a dispatch, real ``dask
scheduler`` and ``dask worker`` processes, and the one-task pack whose held
attempt writes down the worker it runs on, so that a test can kill that worker
mid-task. The tests that use them skip without ``distributed``."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from tests.run.dispatchtests import DISPATCH, wait_for, write_pack

DASK = str(Path(sys.executable).parent / "dask")
#: a LocalCluster of two worker processes, started by the dispatcher
LOCAL = ("--executor", "dask-local", "--workers", "2")


def dispatch(
    pack: Path, state: Path, *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [DISPATCH, str(pack), "--state", str(state), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@contextlib.contextmanager
def cluster(
    tmp_path: Path, *, allowed_failures: int = 0
) -> Iterator[tuple[str, list[subprocess.Popen[bytes]]]]:
    """A ``dask scheduler`` on loopback (``allowed-failures`` 0, as
    docs/run-on-a-cluster.md asks, unless told otherwise); yields its address
    and a list the test adds its worker processes to (all stopped at the end)."""
    sched_file = tmp_path / "scheduler.json"
    env = {**os.environ, "DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": str(allowed_failures)}
    procs: list[subprocess.Popen[bytes]] = []
    procs.append(
        subprocess.Popen(
            [
                DASK,
                "scheduler",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--no-dashboard",
                "--scheduler-file",
                str(sched_file),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
        )
    )
    try:
        wait_for(sched_file.exists, 30)
        address = json.loads(sched_file.read_text())["address"]
        yield address, procs
    finally:
        for p in reversed(procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)


def start_worker(
    address: str,
    hide: Path | None = None,
    *,
    nanny: bool = True,
    threads: int = 1,
    preload: Path | None = None,
) -> subprocess.Popen[bytes]:
    """A ``dask worker`` process of ``threads`` threads; with ``hide``, in its own
    mount namespace where an empty tmpfs covers that directory; without a
    ``nanny``, a worker the test kills stays dead (a nanny would restart it empty);
    with ``preload``, running that script first (``--preload``)."""
    argv = [DASK, "worker", address, "--nworkers", "1", "--nthreads", str(threads),
            "--no-dashboard", "--host", "127.0.0.1", *(() if nanny else ("--no-nanny",)),
            *(() if preload is None else ("--preload", str(preload)))]  # fmt: skip
    if hide is not None:
        script = f'mount -t tmpfs none "{hide}" && exec "$@"'
        argv = ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", *argv]
    return subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )


def wait_workers(address: str, n: int) -> None:
    code = (
        "from distributed import Client\n"
        f"c = Client({address!r}, timeout=30)\n"
        f"c.wait_for_workers({n}, timeout=60)\n"
        "c.close()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=90, capture_output=True)


def held_pack(
    tmp_path: Path,
    name: str,
    *,
    held: str,
    hold: str,
    count: int | None = None,
    before: str = "",
) -> tuple[Path, Path]:
    """``pack.toml`` of one task ``t`` (``count`` instances, one retry) whose attempt
    for which the shell test ``held`` is true runs ``before``, writes its worker's
    pid ($PPID: the task's parent is the worker) to ``MARKS/worker`` and its own to
    ``MARKS/task``, then ``hold``s; every other attempt passes at once. Returns the
    pack and ``MARKS``."""
    marks = tmp_path / "marks"
    marks.mkdir()
    fanout = f"map = {{ count = {count} }}\n" if count is not None else ""
    script = (
        f"if {held}; then {before}echo $PPID > {marks}/worker; echo $$ > {marks}/task; "
        f'{hold}; fi; echo "{{}}" > "$CRUCIBLE_OUTPUT"'
    )
    toml = (
        f'edition = 4\n[workflow]\nname = "{name}"\n[[workflow.task]]\nname = "t"\n'
        f"{fanout}retries = 1\nrun = '{script}'\n"
    )
    return write_pack(tmp_path, toml), marks


#: the shell test true for instance 0's first attempt
FIRST_OF_0 = '[ "$CRUCIBLE_KEY" = 0 ] && [ "$CRUCIBLE_ATTEMPT" = 1 ]'
