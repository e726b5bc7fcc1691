"""Names that become path components: fan-out keys (escaped) and task names (checked).

A fan-out key is runtime data, so it is escaped, never refused. A task name is
plan data: validation refuses the unsafe ones, and stage refuses them again
(defence in depth) rather than trusting every plan it is handed.
"""

from __future__ import annotations

import hashlib

from crucible.core.contract import FILE_NAME_MAX
from crucible.core.contract import NAME_MAX_BYTES as TASK_NAME_MAX
from crucible.core.errors import InputRefused

__all__ = [
    "KEY_COMPONENT_MAX",
    "TASK_NAME_MAX",
    "check_task_name",
    "escape_key",
    "is_shortened",
    "task_name_problem",
    "unescape_key",
]

#: The longest escaped key, in bytes: 250, so that ``<escaped>.json`` (the longest
#: suffix a key gets) still fits NAME_MAX (255) on every common filesystem.
KEY_COMPONENT_MAX = FILE_NAME_MAX - len(".json")

_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_HEX = "0123456789ABCDEF"
_EMPTY = "%"  # a lone '%' never occurs otherwise: every escape is '%XX'
_SHORT_MARK = "~"  # never produced by plain escaping
_DIGEST_HEX = 64
_PREFIX_MAX = KEY_COMPONENT_MAX - len(_SHORT_MARK) - _DIGEST_HEX


def _percent(key: str) -> str:
    out: list[str] = []
    for byte in key.encode("utf-8", "surrogatepass"):
        if byte in _SAFE:
            out.append(chr(byte))
        else:
            out.append("%" + _HEX[byte >> 4] + _HEX[byte & 15])
    return "".join(out)


def escape_key(key: str) -> str:
    """One path component for a fan-out key: injective and never empty, ``.`` or ``..``.

    Every UTF-8 byte outside ``[A-Za-z0-9_-]`` becomes ``%XX`` (upper-case hex),
    so ``/``, ``\\``, NUL and every ``.`` are escaped and the result is ASCII.
    The empty key is ``%``. A result longer than :data:`KEY_COMPONENT_MAX` bytes
    is shortened to a prefix (never splitting an escape) plus ``~`` and the
    SHA-256 hex of the key's UTF-8 bytes; only such names need the raw key kept
    elsewhere (the index and the result record carry it).
    """
    if not isinstance(key, str):
        raise TypeError(f"a fan-out key is a string, not {type(key).__name__}")
    if key == "":
        return _EMPTY
    escaped = _percent(key)
    if len(escaped) <= KEY_COMPONENT_MAX:
        return escaped
    prefix = escaped[:_PREFIX_MAX]
    # Do not end inside a '%XX' triple: keeps the prefix a valid escape.
    cut = prefix.rfind("%", max(0, len(prefix) - 2))
    if cut != -1:
        prefix = prefix[:cut]
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
    return prefix + _SHORT_MARK + digest


def is_shortened(component: str) -> bool:
    return _SHORT_MARK in component


def unescape_key(component: str) -> str:
    """The raw key of an escaped component. A shortened component cannot be
    reversed from its name alone: that raises :class:`InputRefused` (read the raw
    key from the index or the result record instead)."""
    if component == _EMPTY:
        return ""
    if is_shortened(component):
        raise InputRefused(
            f"escaped key {component[:40]}… was shortened; its raw key is in the index"
        )
    data = bytearray()
    i = 0
    n = len(component)
    while i < n:
        c = component[i]
        if c == "%":
            pair = component[i + 1 : i + 3]
            if len(pair) != 2 or any(h not in _HEX for h in pair):
                raise InputRefused(f"not an escaped key: bad escape at offset {i}")
            value = int(pair, 16)
            if value in _SAFE:
                raise InputRefused(f"not an escaped key: needless escape %{pair}")
            data.append(value)
            i += 3
        elif ord(c) < 128 and ord(c) in _SAFE:
            data.append(ord(c))
            i += 1
        else:
            raise InputRefused(f"not an escaped key: character {c!r} at offset {i}")
    try:
        return bytes(data).decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        raise InputRefused("not an escaped key: not UTF-8") from None


def task_name_problem(name: object) -> str | None:
    """Why ``name`` cannot be a task name, or None. Mirrors the compile rule
    (empty, bracketed, ``.``, ``..``, a path separator, a leading ``@``) and adds
    what no file name can hold (NUL, more than :data:`TASK_NAME_MAX` bytes)."""
    if not isinstance(name, str):
        return "a task name must be a string"
    if name == "":
        return "a task name must not be empty"
    if name in (".", ".."):
        return f"task name {name!r} is a path of its own"
    if "/" in name or "\\" in name:
        return f"task name {name!r} contains a path separator"
    if name.startswith("@"):
        return f"task name {name!r} starts with '@', reserved for inputs/@values"
    if "[" in name or "]" in name:
        return f"task name {name!r} contains a bracket, reserved for fan-out instances"
    if "\x00" in name:
        return "a task name must not contain NUL"
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        return "a task name must be valid Unicode (no lone surrogates)"
    if size > TASK_NAME_MAX:
        return f"task name is {size} bytes; at most {TASK_NAME_MAX} fit a file name"
    return None


def check_task_name(name: object) -> str:
    problem = task_name_problem(name)
    if problem is not None:
        raise InputRefused(problem)
    assert isinstance(name, str)
    return name
