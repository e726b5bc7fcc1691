"""``temp_files``: the captured files a task marks temporary (edition 4; issue
33 item 2; docs/spec/run.md, "Temporary files").

Each entry is a relative path or glob that lies under one of the task's
``emits_files`` entries: equal to one, inside a literal one (a directory), or
matched by a glob one. A temporary file is staged only into the task's direct
dependants, freed from the state once they all settled, never cached and never
published: a ``[workflow.publish]`` source that could name one is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from crucible.compile._checker import Checker, check_str_list
from crucible.compile._diagnostics import KeyPath
from crucible.core.globs import GLOB_CHARS, pattern_regex

__all__ = ["check_temp_files", "check_temp_published", "temp_under"]


def _parts(pattern: str) -> tuple[str, ...]:
    return tuple(p for p in pattern.replace("\\", "/").split("/") if p not in ("", "."))


def _is_glob(pattern: str) -> bool:
    return bool(GLOB_CHARS & set(pattern))


def _covers(outer: str, inner: str) -> bool:
    """Whether every path ``inner`` names lies under ``outer`` (an
    emits_files entry): the same entry, a path inside a literal ``outer``, or a
    literal ``inner`` that ``outer``'s glob matches (or lies under a match)."""
    o, i = _parts(outer), _parts(inner)
    if o == i:
        return True
    if not _is_glob(outer):
        return len(i) > len(o) and i[: len(o)] == o
    if _is_glob(inner):
        return False
    regex = pattern_regex(o)
    return any(regex.match("/".join(i[:n])) for n in range(1, len(i) + 1))


def temp_under(emits_files: list[str], temp: str) -> bool:
    return any(_covers(e, temp) for e in emits_files)


def check_temp_files(chk: Checker, path: KeyPath, value: object, task: dict[str, Any]) -> None:
    """The ``temp_files`` key of a task: strings, each under an emits_files entry."""
    files = check_str_list(chk, path, value, "temp_files")
    if files is None:
        return
    emitted = list(task.get("emits_files") or [])
    kept: list[str] = []
    for i, pattern in enumerate(files):
        if not temp_under(emitted, pattern):
            chk.error(
                "temp-not-emitted",
                (*path, i),
                f"temp_files entry {pattern!r} is not under any emits_files entry of this "
                f"task ({', '.join(map(repr, emitted)) or 'none'}): only captured files "
                "can be temporary",
            )
            continue
        kept.append(pattern)
    if kept:
        task["temp_files"] = kept


def _overlap(a: str, b: str) -> bool:
    """Whether two patterns may name a common path (or one lies under the other)."""
    pa, pb = _parts(a), _parts(b)
    n = min(len(pa), len(pb))
    if pa[:n] == pb[:n]:
        return True
    for x, y in ((a, b), (b, a)):
        if _is_glob(x):
            regex = pattern_regex(_parts(x))
            py = _parts(y)
            if any(regex.match("/".join(py[:k])) for k in range(1, len(py) + 1)):
                return True
    return _is_glob(a) and _is_glob(b)  # two globs: assume they may meet


def check_temp_published(
    chk: Checker, where: KeyPath, src: str, task: Mapping[str, Any]
) -> None:
    """A publish source ``task:glob`` must name none of the task's temporaries."""
    temps = task.get("temp_files") or []
    glob = src.partition(":")[2]
    for temp in temps:
        if _overlap(glob, temp):
            chk.error(
                "temp-published",
                where,
                f"publish source {src!r} may name temporary files of task "
                f"{task['name']!r} (temp_files entry {temp!r}): a published file cannot be "
                "temporary; publish other files, or drop the entry from temp_files",
            )
            return
