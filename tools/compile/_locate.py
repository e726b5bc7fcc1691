"""Source positions for diagnostics.

``tomllib`` reports no positions for values it parsed, so :class:`TomlLocator`
scans the manifest text once (only when a diagnostic needs it) and records
where each table header and each key starts; a lookup falls back to the
nearest enclosing key that was found. Plans are JSON and are located by JSON
path; Starlark tasks by the ``name = "…"`` literal of their ``task()`` call.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from crucible.compile._diagnostics import FileLocator, KeyPath, Location, json_path

__all__ = ["FileLocator", "StarLocator", "TomlLocator"]

_BARE = r"[A-Za-z0-9_-]+"
_QUOTED = r'"(?:[^"\\]|\\.)*"|\'[^\']*\''
_KEY = rf"(?:{_BARE}|{_QUOTED})"
_DOTTED = rf"{_KEY}(?:\s*\.\s*{_KEY})*"
_KEY_LINE = re.compile(rf"\s*({_DOTTED})\s*=")
_AOT_HEADER = re.compile(rf"\s*\[\[\s*({_DOTTED})\s*\]\]")
_TABLE_HEADER = re.compile(rf"\s*\[\s*({_DOTTED})\s*\]")
_KEY_PART = re.compile(rf"({_BARE})|({_QUOTED})")
_STRING = re.compile(_QUOTED)


def _split_dotted(text: str) -> list[str]:
    parts: list[str] = []
    for m in _KEY_PART.finditer(text):
        if m.group(1) is not None:
            parts.append(m.group(1))
        else:
            parts.append(m.group(2)[1:-1])
    return parts


def _strip_comment(line: str) -> str:
    """The line up to its first ``#`` outside a string (columns unchanged)."""
    pos = 0
    for m in _STRING.finditer(line):
        found = line.find("#", pos, m.start())
        if found >= 0:
            return line[:found]
        pos = m.end()
    found = line.find("#", pos)
    return line if found < 0 else line[:found]


def _bracket_delta(text: str) -> int:
    """Net open brackets of a line, ignoring those inside strings and comments."""
    text = _STRING.sub('""', text)
    text = text.split("#", 1)[0]
    return text.count("[") + text.count("{") - text.count("]") - text.count("}")


class TomlLocator:
    """Maps logical paths (``("workflow", "task", 2, "needs", 1)``) to line:col."""

    def __init__(self, file: str | None, text: str) -> None:
        self.file = file
        self.text = text
        self._index: dict[KeyPath, tuple[int, int]] | None = None

    def locate(self, path: KeyPath) -> Location:
        index = self._build()
        probe = tuple(path)
        while probe:
            if probe in index:
                line, col = index[probe]
                return Location(self.file, line, col, json_path(path))
            probe = probe[:-1]
        return Location(self.file, path=json_path(path))

    def _build(self) -> dict[KeyPath, tuple[int, int]]:
        if self._index is not None:
            return self._index
        index: dict[KeyPath, tuple[int, int]] = {}
        aot_counts: dict[KeyPath, int] = {}
        current: KeyPath = ()
        multiline: str | None = None
        depth = 0
        array: tuple[KeyPath, int] | None = None  # a multi-line array of strings being read
        for lineno, line in enumerate(self.text.splitlines(), start=1):
            if multiline is not None:
                if multiline in line:
                    multiline = None
                continue
            if depth > 0:
                code = _STRING.sub('""', line).split("#", 1)[0]
                if array is not None and depth == 1 and not any(c in code for c in "[{"):
                    # one more line of a multi-line array of strings: index its elements
                    array_path, count = array
                    for element in _STRING.finditer(_strip_comment(line)):
                        index.setdefault((*array_path, count), (lineno, element.start() + 1))
                        count += 1
                    array = (array_path, count)
                else:
                    array = None
                depth = max(0, depth + _bracket_delta(line))
                continue
            stripped = line.lstrip()
            col = len(line) - len(stripped) + 1
            if not stripped or stripped.startswith("#"):
                continue
            if m := _AOT_HEADER.match(line):
                keys = _split_dotted(m.group(1))
                prefix = self._resolve(keys[:-1], aot_counts)
                table = (*prefix, keys[-1])
                count = aot_counts.get(table, 0)
                aot_counts[table] = count + 1
                index.setdefault(table, (lineno, col + 2))
                current = (*table, count)
                index[current] = (lineno, col + 2)
                continue
            if m := _TABLE_HEADER.match(line):
                current = self._resolve(_split_dotted(m.group(1)), aot_counts)
                index.setdefault(current, (lineno, col + 1))
                continue
            if m := _KEY_LINE.match(line):
                key_path = (*current, *_split_dotted(m.group(1)))
                index.setdefault(key_path, (lineno, col))
                rest = line[m.end() :]
                rest_col = m.end() + 1
                self._index_value(index, key_path, rest, lineno, rest_col)
                stripped_rest = rest.strip()
                for quote in ('"""', "'''"):
                    if stripped_rest.startswith(quote) and stripped_rest.count(quote) == 1:
                        multiline = quote
                depth = max(0, _bracket_delta(rest))
                body = _STRING.sub('""', rest).split("#", 1)[0].strip()
                array = None
                if depth == 1 and body.startswith("[") and not any(c in body[1:] for c in "[{"):
                    array = (key_path, len(_STRING.findall(_strip_comment(rest))))
        self._index = index
        return index

    @staticmethod
    def _resolve(keys: Sequence[str], aot_counts: dict[KeyPath, int]) -> KeyPath:
        """Insert the current index after every array-of-tables on the way."""
        out: KeyPath = ()
        for key in keys:
            out = (*out, key)
            if out in aot_counts:
                out = (*out, aot_counts[out] - 1)
        return out

    @staticmethod
    def _index_value(
        index: dict[KeyPath, tuple[int, int]], key_path: KeyPath, rest: str, lineno: int, col0: int
    ) -> None:
        """Positions inside a one-line array (elements) or inline table (keys)."""
        code = _strip_comment(rest)
        body = code.lstrip()
        offset = col0 + (len(code) - len(body))
        if body.startswith("["):
            for i, m in enumerate(_STRING.finditer(body)):
                index.setdefault((*key_path, i), (lineno, offset + m.start()))
        elif body.startswith("{"):
            for m in re.finditer(rf"[{{,]\s*({_KEY})\s*=", body):
                name = _split_dotted(m.group(1))
                if name:
                    index.setdefault((*key_path, name[0]), (lineno, offset + m.start(1)))


class StarLocator:
    """Best effort for tasks built by Starlark: the ``name = "…"`` literal of the
    task's ``task()`` call, else the ``workflow(`` call, else the file."""

    def __init__(self, file: str, text: str, task_names: Sequence[str]) -> None:
        self.file = file
        self.text = text
        self.task_names = list(task_names)

    def _pos(self, pattern: str) -> tuple[int, int] | None:
        m = re.search(pattern, self.text)
        if m is None:
            return None
        before = self.text[: m.start()]
        line = before.count("\n") + 1
        col = m.start() - (before.rfind("\n") + 1) + 1
        return line, col

    def locate(self, path: KeyPath) -> Location:
        pos: tuple[int, int] | None = None
        if len(path) >= 3 and path[:2] == ("workflow", "task") and isinstance(path[2], int):
            i = path[2]
            if 0 <= i < len(self.task_names):
                name = re.escape(self.task_names[i])
                pos = self._pos(rf"\bname\s*=\s*([\"']){name}\1")
        if pos is None:
            pos = self._pos(r"\bworkflow\s*\(")
        if pos is None:
            return Location(self.file, path=json_path(path))
        return Location(self.file, pos[0], pos[1], json_path(path))
