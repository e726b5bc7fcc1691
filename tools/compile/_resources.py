"""The edition-4 task key ``resources = { cpus = 2, memory = "4GiB", gpu = 1 }``.

What one unit of the task needs on the worker that runs it. The plan carries
integers: ``cpus`` and ``gpu`` counts, ``memory`` in bytes. The Dask executors
turn them into Dask worker resources of the same names; the local executor
ignores them (docs/spec/run.md, Executors; docs/spec/manifest rules in
docs/run-on-a-cluster.md).
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["RESOURCE_NAMES", "check_resources", "parse_memory"]

RESOURCE_NAMES = ("cpus", "memory", "gpu")
_MAX = 2**53 - 1
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}  # fmt: skip
_MEMORY = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)")


def parse_memory(text: str) -> int | None:
    """``"4GiB"`` → 4294967296; None when it is no size."""
    m = _MEMORY.fullmatch(text.strip())
    if m is None or m.group(2).upper() not in _UNITS:
        return None
    value = int(float(m.group(1)) * _UNITS[m.group(2).upper()])
    return value if 0 < value <= _MAX else None


def check_resources(chk: Any, path: tuple[Any, ...], raw: object, task: dict[str, Any]) -> None:
    who = f"task {task['name']!r}" if task.get("name") else "the task"
    if not isinstance(raw, dict):
        chk.error("wrong-type", path, f"resources of {who} must be a table")
        return
    out: dict[str, int] = {}
    for name, value in raw.items():
        where = (*path, name)
        if name not in RESOURCE_NAMES:
            chk.error(
                "unknown-key", where,
                f"unknown resource {name!r} of {who} (known: {', '.join(RESOURCE_NAMES)})",
            )  # fmt: skip
        elif name == "memory":
            size = parse_memory(value) if isinstance(value, str) else None
            if type(value) is int and 0 < value <= _MAX:
                size = value
            if size is None:
                chk.error(
                    "bad-value", where,
                    f"resources.memory of {who} must be bytes or a size like \"4GiB\","
                    f" not {value!r}",
                )  # fmt: skip
            else:
                out[name] = size
        elif type(value) is not int or not 0 <= value <= 100_000:
            chk.error(
                "bad-value", where,
                f"resources.{name} of {who} must be an integer from 0 to 100000, not {value!r}",
            )  # fmt: skip
        elif value:
            out[name] = value
    task["resources"] = out
