"""Helpers shared by the cache tests (docs/spec/cache.md): the cached pack and its
``Runner`` (one real ``crucible-dispatch --cache`` subprocess a run, each into a
new state directory, a task process counted by the line it appends to a file
outside the state), the cache's live values, and a dispatcher that runs a
prelude first (an fsync tracer, a module lister)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.run.dispatchtests import DISPATCH

# a -> b -> c, and d on its own. a's output follows the declared variable X; b
# prints a's file; c reads b's value.
PACK = """edition = 4

[workflow]
name = "cached"

[workflow.params.n]
type = "integer"
default = 1

[[workflow.task]]
name = "a"
env = ["X"]
emits = { n = "integer" }
emits_files = ["out/*.txt"]
run = 'echo a >> "$COUNT"; mkdir -p out && echo "data$X" > out/a.txt && echo "{\\"n\\": ${X:-7}}" > "$CRUCIBLE_OUTPUT"'

[[workflow.task]]
name = "b"
needs = ["a"]
env = ["COUNT"]
emits = { m = "integer" }
inputs = { n = "a.n" }
run = 'echo b >> "$COUNT"; cp inputs/a/out/a.txt seen.txt; echo "{\\"m\\": 3}" > "$CRUCIBLE_OUTPUT"'

[[workflow.task]]
name = "c"
needs = ["b"]
env = ["COUNT"]
inputs = { m = "b.m" }
run = 'echo c >> "$COUNT"'

[[workflow.task]]
name = "d"
env = ["COUNT"]
run = 'echo d >> "$COUNT"'
"""


class Runner:
    def __init__(self, tmp: Path, pack: str = PACK) -> None:
        self.tmp = tmp
        self.pack = tmp / "pack.toml"
        self.pack.write_text(pack.replace('env = ["X"]', 'env = ["X", "COUNT"]'))
        self.cache = tmp / "cache"
        self.count = tmp / "count"
        self.runs = 0

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CRUCIBLE_")}
        env["COUNT"] = str(self.count)
        env.update(extra)
        return env

    def run(
        self,
        *args: str,
        env: dict[str, str] | None = None,
        cache: bool = True,
        code: int | None = 0,
    ) -> tuple[list[str], subprocess.CompletedProcess[bytes]]:
        """One run into a new state dir; returns the tasks that were spawned."""
        self.runs += 1
        self.count.write_text("")
        argv = [DISPATCH, str(self.pack), "--state", str(self.state(self.runs))]
        if cache:
            argv += ["--cache", str(self.cache)]
        proc = subprocess.run(
            [*argv, *args], capture_output=True, timeout=120, env=env or self.env()
        )
        assert code is None or proc.returncode == code, proc.stderr
        return sorted(self.count.read_text().split()), proc

    def state(self, n: int) -> Path:
        return self.tmp / f"state{n}"

    def finished(self, n: int) -> dict[str, dict[str, object]]:
        lines = (self.state(n) / "session.jsonl").read_text().splitlines()
        return {
            e["task"]: e
            for e in map(json.loads, lines)
            if e["event"] == "task_finished" and "key" not in e
        }


def live_values(cache: Path) -> list[dict[str, Any]]:
    """The ledger values of the cache's live records (what a hit would restore)."""
    from crucible.run.cache._store import TaskCache

    tc = TaskCache(cache, warn=lambda _w: None)
    try:
        return [r["value"] for r in tc._live()]
    finally:
        tc.close()


def live_units(cache: Path) -> list[tuple[str, str | None]]:
    """``(task, instance)`` of every live record, sorted."""
    from crucible.run.cache._store import TaskCache

    tc = TaskCache(cache, warn=lambda _w: None)
    try:
        return sorted((r["key"]["task"], r["key"]["instance"]) for r in tc._live())
    finally:
        tc.close()


#: the dispatcher's entry point, run after a prelude in the same interpreter
_MAIN = """
sys.argv[0] = "crucible-dispatch"
from crucible.run.cli import main
main()
"""


def dispatch_with(
    prelude: str, *args: object, env: Mapping[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``crucible-dispatch ARGS`` as a real subprocess whose interpreter first runs
    ``prelude`` (which imports what it uses; ``os`` and ``sys`` at least)."""
    return subprocess.run(
        [sys.executable, "-c", prelude + _MAIN, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **env},
    )


#: every os.fsync of the dispatcher and of the processes it forks, as
#: "<pid>\t<thread>\t<path>" lines in $TRACE, after a first "<pid>\tdispatcher"
_FSYNC_TRACER = """
import os, sys, threading
trace = os.environ["TRACE"]
real = os.fsync
def traced(fd):
    real(fd)
    try:
        what = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        what = "?"
    with open(trace, "a") as f:
        f.write(f"{os.getpid()}\\t{threading.current_thread().name}\\t{what}\\n")
os.fsync = traced
with open(trace, "a") as f:
    f.write(f"{os.getpid()}\\tdispatcher\\n")
"""


@dataclass(frozen=True)
class Fsync:
    """One traced fsync: which process and thread, and the path of the file."""

    pid: int
    thread: str
    path: str


@dataclass(frozen=True)
class Traced:
    """A traced dispatch: the process, the dispatcher's pid, every fsync in order."""

    done: subprocess.CompletedProcess[str]
    dispatcher: int
    fsyncs: list[Fsync]

    def of_dispatcher(self) -> list[Fsync]:
        return [f for f in self.fsyncs if f.pid == self.dispatcher]


def traced_dispatch(trace: Path, *args: object, timeout: float = 120) -> Traced:
    """``crucible-dispatch ARGS`` with every fsync traced into the file ``trace``;
    the run must succeed."""
    done = dispatch_with(_FSYNC_TRACER, *args, env={"TRACE": str(trace)}, timeout=timeout)
    assert done.returncode == 0, done.stderr
    first, *rest = trace.read_text().splitlines()
    pid, what = first.split("\t")
    assert what == "dispatcher", first
    fsyncs = []
    for line in rest:
        who, thread, path = line.split("\t", 2)
        fsyncs.append(Fsync(int(who), thread, path))
    return Traced(done, int(pid), fsyncs)


#: the names of the dispatcher's modules, written to $MODS when it exits
MODULE_LISTER = """
import atexit, os, sys
def dump():
    with open(os.environ["MODS"], "w") as f:
        f.write("\\n".join(sorted(sys.modules)))
atexit.register(dump)
"""
