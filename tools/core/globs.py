"""The glob language of ``emits_files`` (docs/spec/manifest.md), in one place.

validate refuses a pattern this module cannot translate; capture matches with
the translation. ``*`` and ``?`` stay within one path segment, ``[...]`` is a
character class (``[!...]`` negated), ``**`` as a whole segment is any number
of segments. A backslash is refused: it is no separator and no escape here.
"""

from __future__ import annotations

import re

__all__ = ["GLOB_CHARS", "pattern_problem", "pattern_regex", "segment_regex"]

GLOB_CHARS = frozenset("*?[")


def segment_regex(segment: str) -> str:
    """The regular expression (text) of one path segment's glob."""
    out: list[str] = []
    i = 0
    while i < len(segment):
        c = segment[i]
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            j = segment.find("]", i + 2 if segment[i + 1 : i + 2] in ("!", "]") else i + 1)
            if j == -1:
                out.append(re.escape(c))
            else:
                body = segment[i + 1 : j]
                if body.startswith("!"):
                    body = "^" + body[1:]
                out.append("[" + body.replace("\\", "\\\\") + "]")
                i = j
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def pattern_regex(parts: tuple[str, ...]) -> re.Pattern[str]:
    """``**`` is any number of whole segments; ``*``/``?``/``[...]`` stay in one."""
    pieces: list[str] = []
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if part == "**":
            pieces.append(".*" if last else "(?:[^/]+/)*")
        else:
            pieces.append(segment_regex(part) + ("" if last else "/"))
    return re.compile("".join(pieces) + r"\Z", re.DOTALL)


def pattern_problem(pattern: str) -> str | None:
    """Why ``pattern`` is no glob of this language (None when it is one)."""
    if "\\" in pattern:
        return "holds a backslash (no escape and no separator in emits_files)"
    for segment in pattern.split("/"):
        if GLOB_CHARS & set(segment):
            try:
                re.compile(segment_regex(segment))
            except re.error as exc:
                return f"has a bad character class: {exc.msg}"
    return None
