"""What one attempt's processes cost, from the ``wait4`` that reaps its leader.

The worker that started a task reaps its leader anyway (crucible.run.executors._procs);
``wait4`` hands back, at no extra cost, the ``rusage`` of the leader and of
every descendant that was waited for (by the leader, or by a descendant that
was itself waited for): Linux's RUSAGE_CHILDREN semantics. No polling, so a
task of 5 ms is measured as exactly as one of 5 hours. What each field means
and its limits are written in docs/spec/run.md ("Resource usage").
"""

from __future__ import annotations

import re
import resource
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from crucible.core.plan import Task

__all__ = [
    "USAGE_FIELDS",
    "data_limit_problem",
    "format_memory",
    "from_rusage",
    "hit_memory_limit",
    "memory_limit",
    "memory_limit_argv",
    "parse_memory",
    "self_peak_rss_kib",
]

#: the per-attempt members, in the order records and events carry them
USAGE_FIELDS = (
    "cpu_user_s",
    "cpu_sys_s",
    "max_rss_kib",
    "spawner_rss_kib",
    "read_bytes",
    "write_bytes",
    "vol_ctxt",
    "inv_ctxt",
)

#: rusage's block counts are 512-byte units on Linux (ru_inblock/ru_oublock are
#: the task's read_bytes/write_bytes of /proc/PID/io divided by 512)
_BLOCK = 512


def _whole(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and value >= 0 else None


def _seconds(value: Any) -> float | int | None:
    """CPU seconds to 0.1 ms, a whole number as an integer: the form canonical
    JSON writes on its fast path (crucible.core.canon: a float below 1e-4 or
    with nothing after the point would send the whole event and record down
    the slow one, measured ~150 us a task)."""
    if not isinstance(value, float) or not value >= 0:
        return None
    seconds = round(value, 4)
    return int(seconds) if seconds.is_integer() else seconds


def from_rusage(usage: Any, spawner_rss_kib: int | None) -> dict[str, Any]:
    """The usage members of an attempt from the ``rusage`` its leader's ``wait4``
    returned (None: it could not be read; every member is then None).
    ``spawner_rss_kib``: the peak RSS of the process that spawned the leader,
    read right after the spawn: the kernel carries the spawner's high-water
    mark into the leader's ``ru_maxrss`` at its exec, so a ``max_rss_kib`` at
    or below it only bounds the task's peak from above."""
    if usage is None:
        return dict.fromkeys(USAGE_FIELDS)
    inblock = _whole(getattr(usage, "ru_inblock", None))
    oublock = _whole(getattr(usage, "ru_oublock", None))
    return {
        "cpu_user_s": _seconds(getattr(usage, "ru_utime", None)),
        "cpu_sys_s": _seconds(getattr(usage, "ru_stime", None)),
        "max_rss_kib": _whole(getattr(usage, "ru_maxrss", None)),
        "spawner_rss_kib": spawner_rss_kib,
        "read_bytes": None if inblock is None else inblock * _BLOCK,
        "write_bytes": None if oublock is None else oublock * _BLOCK,
        "vol_ctxt": _whole(getattr(usage, "ru_nvcsw", None)),
        "inv_ctxt": _whole(getattr(usage, "ru_nivcsw", None)),
    }


def self_peak_rss_kib() -> int | None:
    """This process's peak RSS (KiB), or None where getrusage cannot say."""
    try:
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    except (OSError, ValueError):  # pragma: no cover - exotic platforms
        return None


_UNITS = (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))


def format_memory(size: int) -> str:
    """``size`` bytes as the largest binary unit that divides it: 536870912 →
    ``512MiB``; otherwise in bytes (``1000B``)."""
    for unit, scale in _UNITS:
        if size >= scale and size % scale == 0:
            return f"{size // scale}{unit}"
    return f"{size}B"


_MEMORY = re.compile(r"(\d+)(B|KiB|MiB|GiB)")


def parse_memory(text: str) -> int | None:
    """The bytes :func:`format_memory` wrote, or None."""
    match = _MEMORY.fullmatch(text)
    if match is None:
        return None
    scale = {"B": 1, **dict(_UNITS)}[match.group(2)]
    return int(match.group(1)) * scale


def memory_limit(task: Task, enforce: bool) -> int | None:
    """The bytes of RLIMIT_DATA a task runs under: its ``resources.memory``
    with ``--enforce-memory``, else None (no limit)."""
    if not enforce or task.resources is None:
        return None
    return task.resources.memory


#: what a program prints when an allocation fails (ENOMEM's strerror, Python's,
#: C++'s, glibc's and common runtimes'): an attempt under --enforce-memory
#: that failed with one of these in its output tail died of the limit
_OUT_OF_MEMORY = re.compile(
    r"MemoryError|Cannot allocate memory|std::bad_alloc|[Oo]ut of memory|"
    r"memory exhausted|failed to allocate|cannot allocate"
)


def hit_memory_limit(tail: str) -> bool:
    """Whether an attempt's output tail says an allocation failed."""
    return _OUT_OF_MEMORY.search(tail) is not None


def data_limit_problem(tasks: Iterable[Task]) -> str | None:
    """Why ``--enforce-memory`` cannot be applied here (None: it can): no
    RLIMIT_DATA on this platform, or a task's memory above this process's hard
    limit (no process may raise its hard limit; the task would get less than
    it asked for)."""
    limit_id = getattr(resource, "RLIMIT_DATA", None)
    if limit_id is None or not sys.platform.startswith("linux"):
        return "--enforce-memory needs Linux's RLIMIT_DATA, which this platform lacks"
    try:
        _, hard = resource.getrlimit(limit_id)
    except (OSError, ValueError) as exc:  # pragma: no cover - exotic kernels
        return f"--enforce-memory: cannot read RLIMIT_DATA: {exc}"
    if hard == resource.RLIM_INFINITY:
        return None
    for task in tasks:
        memory = memory_limit(task, True)
        if memory is not None and memory > hard:
            return (
                f"--enforce-memory: task {task.name!r} asks for memory {format_memory(memory)},"
                f" above this process's hard RLIMIT_DATA ({format_memory(hard)})"
            )
    return None


def memory_limit_argv(argv: list[str], limit_bytes: int) -> list[str]:
    """``argv`` started under RLIMIT_DATA = ``limit_bytes`` (``--enforce-memory``).

    The limit is set by the task's own first process before it execs the task
    (``sh -c 'ulimit -d KIB && exec "$@"'``): every process of the task
    inherits it from there, with no window. Setting it from the worker after
    the spawn (``prlimit``) would race the task, which may fork children
    before the call lands (posix_spawn has no hook between fork and exec)."""
    kib = max(1, limit_bytes // 1024)
    return ["/bin/sh", "-c", f'ulimit -d {kib} && exec "$@"', "sh", *argv]
