"""Text for people: control characters escaped, signals named, long text cut.

Keys and notes come from tasks and may hold anything: ``\\x1b]0;...\\x07``
would retitle the terminal, ``\\r`` or ``\\n`` would split a table row, a
bidi override would reorder what follows. Everything the report prints for
people goes through :func:`escape`.
"""

from __future__ import annotations

import re
import signal

__all__ = ["clip", "escape", "name_signals", "signal_name"]

# C0 and C1 controls, DEL, the backslash (so the escape is unambiguous), line
# and paragraph separators, bidi embeddings/overrides/isolates, BOM.
_UNSAFE = re.compile(
    "[\x00-\x1f\x7f-\x9f\\\\\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069\ufeff]"
)
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\\": "\\\\"}


def _sub(match: re.Match[str]) -> str:
    ch = match.group()
    named = _NAMED.get(ch)
    if named is not None:
        return named
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape(text: str) -> str:
    """``text`` with every control character written as a backslash escape
    (``\\n``, ``\\x1b``, ``\\u202e``) and ``\\`` as ``\\\\``: one line, inert on a
    terminal, and two different strings never print alike."""
    return _UNSAFE.sub(_sub, text) if _UNSAFE.search(text) else text


def clip(text: str, limit: int) -> str:
    """At most ``limit`` characters: longer text is cut with an ellipsis."""
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


_EXITED_NEG = re.compile(r"exited with status -([0-9]+)")


def name_signals(note: str, exit_code: int | None = None) -> str:
    """A note with "exited with status -9" written as "killed by SIGKILL" (a
    negative status is the signal that ended the process); an empty note of a
    unit killed by a signal says so."""
    if "exited with status -" in note:
        note = _EXITED_NEG.sub(lambda m: f"killed by {signal_name(int(m.group(1)))}", note)
    elif not note and exit_code is not None and exit_code < 0:
        note = f"killed by {signal_name(-exit_code)}"
    return note
