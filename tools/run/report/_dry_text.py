"""``-n`` for people (docs/spec/run.md, "Dry run"): one line of counts per
action, then the units that will run — or, with ``--all``, every unit. A fan-out
whose instances share an action is one line with their count; ``--all`` lists
each instance. ``--json`` prints every unit, one object a line, as before."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["ACTION_WORDS", "dry_run_text"]

#: the action of a line → its word in the counts, in the counts' order
ACTION_WORDS = {"run": "run", "cached": "cached", "keep": "kept", "not selected": "not selected"}


def _counts(lines: Iterable[Mapping[str, Any]]) -> str:
    found: dict[str, int] = dict.fromkeys(("run", "cached", "kept", "skipped"), 0)
    total = 0
    for line in lines:
        total += 1
        word = ACTION_WORDS.get(line["action"], line["action"])
        if word == "kept" and str(line.get("reason", "")).startswith("skipped"):
            word = "skipped"  # kept as settled: it was skipped
        found[word] = found.get(word, 0) + 1
    parts = ", ".join(f"{n} {word}" for word, n in found.items())
    return f"{total} unit{'s' if total != 1 else ''}: {parts}"


def _grouped(
    lines: list[Mapping[str, Any]], instances: Mapping[str, int]
) -> list[tuple[Mapping[str, Any], int, int]]:
    """(first line, lines in the group, instances of the task) per task and
    action, in plan order."""
    groups: list[tuple[Mapping[str, Any], int, int]] = []
    index: dict[tuple[str, str], int] = {}
    for line in lines:
        if "key" not in line:
            groups.append((line, 1, 0))
            continue
        at = (line["task"], line["action"])
        if at in index:
            first, n, of = groups[index[at]]
            groups[index[at]] = (first, n + 1, of)
        else:
            index[at] = len(groups)
            groups.append((line, 1, instances[line["task"]]))
    return groups


def dry_run_text(
    lines: list[Mapping[str, Any]], *, show_all: bool, printable: Callable[[str], str]
) -> list[str]:
    out = [_counts(lines)]
    shown = lines if show_all else [line for line in lines if line["action"] == "run"]
    rows: list[tuple[str, str, str]] = []
    instances: dict[str, int] = {}
    for line in lines:
        if "key" in line:
            instances[line["task"]] = instances.get(line["task"], 0) + 1
    if show_all:
        for line in shown:
            unit = line["task"] if "key" not in line else f"{line['task']}[{line['key']}]"
            rows.append((line["action"], printable(unit), line["reason"]))
    else:
        for first, n, of in _grouped(shown, instances):
            unit = printable(first["task"])
            if of:
                unit += f" ({n} of {of} instances)" if n != of else f" ({of} instances)"
                if n == 1:
                    unit = printable(f"{first['task']}[{first['key']}]") + f" (1 of {of})"
            rows.append((first["action"], unit, first["reason"]))
    width = min(max((len(u) for _, u, _ in rows), default=0), 40)
    out.extend(f"{action:<12} {unit:<{width}}  {reason}" for action, unit, reason in rows)
    return out
