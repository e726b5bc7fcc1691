"""What one attempt's processes cost, from the ``wait4`` that reaps its leader.

The worker that started a task reaps its leader anyway (crucible.run._procs);
``wait4`` hands back, at no extra cost, the ``rusage`` of the leader and of
every descendant that was waited for (by the leader, or by a descendant that
was itself waited for): Linux's RUSAGE_CHILDREN semantics. No polling, so a
task of 5 ms is measured as exactly as one of 5 hours. What each field means
and its limits are written in docs/spec/run.md ("Resource usage").
"""

from __future__ import annotations

import re
import resource
from typing import Any

__all__ = [
    "USAGE_FIELDS",
    "format_memory",
    "from_rusage",
    "memory_limit_argv",
    "parse_memory",
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


def _seconds(value: Any) -> float | None:
    return round(float(value), 6) if isinstance(value, float) and value >= 0 else None


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


def memory_limit_argv(argv: list[str], limit_bytes: int) -> list[str]:
    """``argv`` started under RLIMIT_DATA = ``limit_bytes`` (``--enforce-memory``).

    The limit is set by the task's own first process before it execs the task
    (``sh -c 'ulimit -d KIB && exec "$@"'``): every process of the task
    inherits it from there, with no window. Setting it from the worker after
    the spawn (``prlimit``) would race the task, which may fork children
    before the call lands (posix_spawn has no hook between fork and exec)."""
    kib = max(1, limit_bytes // 1024)
    return ["/bin/sh", "-c", f'ulimit -d {kib} && exec "$@"', "sh", *argv]
