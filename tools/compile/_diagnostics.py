"""Diagnostics: one problem each, with a stable code and a location.

Validation collects every problem it finds; compile raises
:class:`ValidationFailed` carrying all of them. A diagnostic renders as one text
line (``file:line:col: error: message [code]``) or one NDJSON object.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from crucible.core.errors import InputRefused, Location
from crucible.core.structs import dataclass

__all__ = [
    "Diagnostic",
    "FileLocator",
    "KeyPath",
    "Location",
    "Locator",
    "ValidationFailed",
    "json_path",
]

#: where a value sits in a document, as keys and indexes (not a file path:
#: ``pathlib.Path`` is the file)
KeyPath = tuple[str | int, ...]


def json_path(path: KeyPath) -> str:
    """``("workflow", "task", 3, "needs")`` → ``$.workflow.task[3].needs``."""
    out = "$"
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.replace("_", "a").replace("-", "a").isalnum() and part[:1].isalpha():
            out += f".{part}"
        else:
            out += "[" + repr(part) + "]"
    return out


class Locator(Protocol):
    """Maps a logical path inside the source to a :class:`Location`."""

    def locate(self, path: KeyPath) -> Location: ...


class FileLocator:
    """Locates by JSON path only (plan files, stdin). Here, not with the TOML and
    Starlark locators of compile/_locate.py: loading a plan file needs none of
    their patterns (~1 ms of a dispatch's start-up to compile)."""

    def __init__(self, file: str | None) -> None:
        self.file = file

    def locate(self, path: KeyPath) -> Location:
        return Location(self.file, path=json_path(path))


@dataclass(frozen=True)
class Diagnostic:
    """One problem: its stable code, message, location and severity."""

    code: str
    message: str
    location: Location
    severity: str = "error"

    def text(self) -> str:
        where = self.location.where()
        head = f"{where}: " if where else ""
        return f"{head}{self.severity}: {self.message} [{self.code}]"

    def record(self) -> dict[str, Any]:
        """The NDJSON object of this diagnostic (absent fields omitted)."""
        rec: dict[str, Any] = {
            "code": self.code,
            "severity": self.severity,
            "message": self.message,
        }
        loc = self.location
        for key, value in (("file", loc.file), ("line", loc.line), ("col", loc.col)):
            if value is not None:
                rec[key] = value
        if loc.path is not None:
            rec["path"] = loc.path
        return rec


class ValidationFailed(InputRefused):
    """One or more validation errors (exit 1); ``diagnostics`` holds them all."""

    code = "invalid"

    def __init__(self, diagnostics: Sequence[Diagnostic]) -> None:
        errors = [d for d in diagnostics if d.severity == "error"]
        first = errors[0] if errors else diagnostics[0]
        more = len(errors) - 1
        suffix = f" (and {more} more error{'s' if more > 1 else ''})" if more > 0 else ""
        super().__init__(f"{first.message} [{first.code}]{suffix}", location=first.location)
        self.diagnostics: list[Diagnostic] = list(diagnostics)
