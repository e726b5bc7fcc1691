"""File names as people read them: one line, whatever bytes the name holds.

A bundle's names and the path on the command line can hold a newline, an escape
sequence or undecodable bytes (surfaced by Python as lone surrogates). Every name the
reader prints, on stderr or in the JSON report, goes through :func:`escaped` first, so
one problem stays one line and no byte reaches the terminal as a control sequence.
"""

from __future__ import annotations

import os

__all__ = ["escaped"]


def _char(c: str) -> str:
    o = ord(c)
    if c == "\\":
        return "\\\\"  # so the escape stays injective
    if 0xDC80 <= o <= 0xDCFF:  # an undecodable byte (surrogateescape)
        return f"\\x{o - 0xDC00:02x}"
    if o < 0x20 or 0x7F <= o <= 0x9F:
        return f"\\x{o:02x}"
    if not c.isprintable() or 0xD800 <= o <= 0xDFFF:
        return f"\\u{o:04x}" if o <= 0xFFFF else f"\\U{o:08x}"
    return c


def escaped(name: str | os.PathLike[str]) -> str:
    """``name`` with control characters, undecodable bytes and ``\\`` escaped
    (``\\n`` -> ``\\x0a``, byte 0xff -> ``\\xff``, ``\\`` -> ``\\\\``); printable text kept."""
    text = os.fspath(name)
    if text.isprintable() and "\\" not in text:
        return text  # the common case, without a per-character pass
    return "".join(_char(c) for c in text)
