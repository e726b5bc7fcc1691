"""References to a producer's value: ``producer.field`` with element and member paths.

One parser for every place a pack names another task's value — an input, a
``map``, a matrix axis, a run result — used by the compiler and the dispatcher
alike (docs/spec/manifest.md, "References")::

    a.items            producer a, field items
    a.items[0]         … its first element
    a.config.region    … the member region of the object in field config
    a.rows[2].name     paths chain: element, then member

Grammar (ours): ``PRODUCER "." FIELD STEP*`` where ``STEP`` is ``"[" INDEX "]"``
(a decimal integer ≥ 0, no sign, no leading zero) or ``"." MEMBER`` (an
identifier, as field names are). Task names may hold dots but never brackets,
so the text before the first ``[`` is the dotted part. Which dot ends the
producer is decided by the task names when they are known: the **longest**
prefix that names a task (so a reference that meant ``task.field`` before member
paths existed keeps its meaning); without task names, or when no prefix names a
task, the last dot of the dotted part does (the rule of editions 1–3).
"""

from __future__ import annotations

import re
from collections.abc import Container, Sequence
from typing import Any

from crucible.core.structs import dataclass

__all__ = [
    "MAX_INDEX",
    "Ref",
    "RefMissing",
    "RefSyntax",
    "parse_ref",
    "path_text",
    "resolve_path",
    "split_head",
]

#: the largest element index a reference may name (canonical JSON's safe integers)
MAX_INDEX = 2**53 - 1

_IDENT = r"[A-Za-z_][A-Za-z0-9_-]*"
_IDENT_RE = re.compile(rf"\A{_IDENT}\Z")
_STEP_RE = re.compile(rf"\[(0|[1-9][0-9]*)\]|\.({_IDENT})")

Step = int | str


class RefSyntax(ValueError):
    """The text is not a reference; ``message`` says why, in one line."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class RefMissing(LookupError):
    """A path step found nothing in the value (run time: the consumer fails with it)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def path_text(path: Sequence[Step]) -> str:
    """``[0].region`` for the steps ``(0, "region")``."""
    return "".join(f"[{s}]" if isinstance(s, int) else f".{s}" for s in path)


@dataclass(frozen=True)
class Ref:
    """A parsed reference: the producer task, its emitted field, and the path
    into the field's value (empty for a plain ``producer.field``)."""

    producer: str
    field: str
    path: tuple[Step, ...] = ()

    @property
    def text(self) -> str:
        """The reference as written (the canonical spelling: nothing else parses)."""
        return f"{self.producer}.{self.field}{path_text(self.path)}"

    def at(self, value: Any) -> Any:
        """The value the path names inside ``value`` (the field's value); raises
        :class:`RefMissing` naming the reference and the step that found nothing."""
        return resolve_path(value, self.path, f"{self.producer}.{self.field}")


def resolve_path(value: Any, path: Sequence[Step], label: str) -> Any:
    """Walk ``path`` into ``value``; ``label`` starts the message of a miss
    (``a.items[3]: index out of range (2 items)``)."""
    for i, step in enumerate(path):
        where = label + path_text(path[: i + 1])
        if isinstance(step, int):
            if not isinstance(value, list):
                raise RefMissing(f"{where}: not an array ({_json_type(value)})")
            if step >= len(value):
                n = len(value)
                raise RefMissing(f"{where}: index out of range ({n} item{'' if n == 1 else 's'})")
            value = value[step]
        else:
            if not isinstance(value, dict):
                raise RefMissing(f"{where}: not an object ({_json_type(value)})")
            if step not in value:
                raise RefMissing(f"{where}: no member {step!r}")
            value = value[step]
    return value


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def split_head(text: str) -> tuple[str, tuple[Step, ...]]:
    """``"a.rows[2].name"`` → (``"a.rows"``, ``(2, "name")``): the dotted part
    before the first ``[`` and the steps after it. Raises :class:`RefSyntax`."""
    cut = text.find("[")
    if cut < 0:
        return text, ()
    head, tail = text[:cut], text[cut:]
    steps: list[Step] = []
    at = 0
    while at < len(tail):
        m = _STEP_RE.match(tail, at)
        if m is None:
            raise RefSyntax(
                f"at character {cut + at + 1}: expected [INDEX] or .MEMBER "
                "(an index is a decimal integer >= 0; a member a letter or _, then "
                "letters, digits, _ or -)"
            )
        if m.group(1) is not None:
            index = int(m.group(1))
            if index > MAX_INDEX:
                raise RefSyntax(f"at character {cut + at + 1}: index {index} is too large")
            steps.append(index)
        else:
            steps.append(m.group(2))
        at = m.end()
    return head, tuple(steps)


def parse_ref(text: object, tasks: Container[str] | None = None) -> Ref:
    """Parse a reference (module doc); ``tasks``: the workflow's task names, which
    decide the producer of a dotted part with several dots. Raises :class:`RefSyntax`."""
    if not isinstance(text, str) or not text:
        raise RefSyntax("a reference is a non-empty string")
    head, steps = split_head(text)
    parts = head.split(".")
    if len(parts) < 2:
        raise RefSyntax('not of the form "producer.field"')
    cut = len(parts) - 1  # editions 1-3: the field is after the last dot
    if tasks is not None:
        for k in range(len(parts) - 1, 0, -1):
            if ".".join(parts[:k]) in tasks and all(_IDENT_RE.match(p) for p in parts[k:]):
                cut = k
                break
    producer = ".".join(parts[:cut])
    if not producer:
        raise RefSyntax('not of the form "producer.field" (the producer is empty)')
    names = parts[cut:]
    for name in names:
        if not _IDENT_RE.match(name):
            raise RefSyntax(
                f"{name!r} is not a field or member name "
                "(a letter or _, then letters, digits, _ or -)"
            )
    return Ref(producer, names[0], (*names[1:], *steps))
