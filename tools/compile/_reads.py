"""``reads``, ``sandbox`` and ``network``: a task's declared host files and the
sandbox that enforces them (edition 4; docs/spec/manifest.md, cache.md).

``reads`` is an array of globs relative to the pack directory (the manifest's
or plan's directory, ``CRUCIBLE_PACK_DIR``) or absolute paths. A relative
entry whose ``..`` components climb above the pack directory is refused: a
file outside the pack is named by its absolute path, so the plan says plainly
that it depends on the host. The same three keys under ``[workflow]`` are
defaults: compile merges them into every task (a task's ``reads`` add to the
workflow's; its ``sandbox``/``network`` replace the workflow's), so a plan task
carries everything it is keyed and sandboxed by.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from crucible.compile._checker import Checker, str_items
from crucible.core.globs import pattern_problem

if TYPE_CHECKING:
    from crucible.compile._diagnostics import KeyPath

__all__ = ["check_defaults", "check_flag", "check_reads", "inherit", "reads_problem"]

#: the keys ``[workflow]`` gives every task as defaults
DEFAULT_KEYS = ("reads", "sandbox", "network")


def reads_problem(entry: str) -> str | None:
    """Why ``entry`` is no ``reads`` glob (None when it is one)."""
    if not entry or not entry.strip():
        return "must not be empty"
    if "\x00" in entry:
        return "must not contain a NUL character"
    absolute = entry.startswith("/")
    parts = [p for p in entry.split("/") if p not in ("", ".")]
    if not absolute:
        depth = 0
        for part in parts:
            depth += -1 if part == ".." else 1
            if depth < 0:
                return (
                    "climbs above the pack directory with '..'; "
                    "name a file outside the pack by its absolute path"
                )
    if not parts:
        return "names the pack directory itself; name files or globs under it"
    return pattern_problem("/".join(parts))


def check_reads(chk: Checker, path: KeyPath, value: object) -> list[str] | None:
    """A ``reads`` array → its entries (each a glob or an absolute path), or None."""
    if not isinstance(value, list | tuple):
        chk.wrong_type(path, value, "reads must be an array of globs or absolute paths")
        return None
    items = str_items(chk, path, value, "reads")
    if items is None:
        return None
    good = []
    for i, entry in enumerate(items):
        problem = reads_problem(entry)
        if problem is not None:
            chk.error("bad-path", (*path, i), f"reads entry {entry!r} {problem}")
        else:
            good.append(entry)
    return good if len(good) == len(items) else None


def check_flag(chk: Checker, path: KeyPath, value: object, key: str, task: dict[str, Any]) -> None:
    """``sandbox`` / ``network``: a boolean, kept in the plan only when true (an
    unchanged pack's plan and cache keys stay the same bytes)."""
    if type(value) is not bool:
        chk.wrong_type(path, value, f"{key} must be a boolean")
    elif value:
        task[key] = True


def check_defaults(chk: Checker, path: KeyPath, raw: Mapping[str, Any]) -> dict[str, Any]:
    """The ``[workflow]`` defaults that are sound: ``{"reads": [...],
    "sandbox": bool, "network": bool}`` (only those given)."""
    out: dict[str, Any] = {}
    if "reads" in raw:
        reads = check_reads(chk, (*path, "reads"), raw["reads"])
        if reads is not None:
            out["reads"] = reads
    for key in ("sandbox", "network"):
        if key in raw:
            if type(raw[key]) is not bool:
                chk.wrong_type((*path, key), raw[key], f"{key} must be a boolean")
            else:
                out[key] = raw[key]
    return out


def inherit(task: dict[str, Any], raw: Mapping[str, Any], defaults: Mapping[str, Any]) -> None:
    """Merge the workflow's defaults into a checked task: the workflow's reads
    first, then the task's own that are new; a flag the task does not set is
    the workflow's."""
    reads = list(defaults.get("reads", []))
    reads += [r for r in task.get("reads", []) if r not in reads]
    if reads:
        task["reads"] = reads
    for key in ("sandbox", "network"):
        if key not in raw and defaults.get(key):
            task[key] = True
