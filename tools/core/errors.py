"""One exception tree; each class carries the exit code of DESIGN.md.

The command edge (:mod:`crucible.core.cli`) turns any of these into one stderr
line and its exit code. Library code raises them; it never prints or exits.
"""

from __future__ import annotations

from crucible.core import structs
from crucible.core.structs import dataclass

__all__ = [
    "EXIT_BUG",
    "EXIT_OK",
    "EXIT_OPERATIONAL",
    "EXIT_REFUSED",
    "EXIT_SIGINT",
    "EXIT_SIGTERM",
    "EXIT_USAGE",
    "CrucibleError",
    "InputRefused",
    "Interrupted",
    "Location",
    "OperationalError",
    "ParseError",
    "PlanChanged",
    "StartFailed",
    "UnsupportedVersion",
    "UsageError",
    "format_where",
]

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_OPERATIONAL = 3
EXIT_BUG = 70
EXIT_SIGINT = 130
EXIT_SIGTERM = 143


def format_where(
    file: str | None = None,
    line: int | None = None,
    col: int | None = None,
    path: str | None = None,
) -> str:
    """``file:line:col`` (or ``file:$.json.path``), omitting what is unknown.

    The one place a location becomes text: every error line and diagnostic of
    every tool goes through here."""
    parts = [
        p
        for p in (file, None if line is None else str(line), None if col is None else str(col))
        if p
    ]
    where = ":".join(parts)
    if path:
        where = f"{where}:{path}" if where else path
    return where


@dataclass(frozen=True)
class Location:
    """Where a problem is: the display name of its source (a path as the user
    typed it, ``<stdin>``), a 1-based line and column, and/or the JSON path of
    the offending value (``$.workflow.task[3].needs``). Any part may be unknown."""

    file: str | None = None
    line: int | None = None
    col: int | None = None
    path: str | None = None

    def where(self) -> str:
        """The formatted location; a line wins over a JSON path when both are known."""
        if self.line is not None:
            return format_where(self.file, self.line, self.col)
        return format_where(self.file, path=self.path)

    def __str__(self) -> str:
        return self.where()

    def __bool__(self) -> bool:
        return any(v is not None for v in (self.file, self.line, self.col, self.path))

    def in_file(self, file: str) -> Location:
        """The same location in the source displayed as ``file``."""
        return structs.replace(self, file=file)


class CrucibleError(Exception):
    """Base of every anticipated failure, located by a structured :class:`Location`.

    ``location`` is what callers read; ``where`` is its formatted text, kept for
    code that still passes or reads a preformatted string (a string given as
    ``where`` is kept whole as the location's display name)."""

    exit_code: int = EXIT_REFUSED
    #: a stable, machine-readable name of the failure kind
    code: str = "error"

    def __init__(
        self,
        message: str,
        *,
        where: str | Location | None = None,
        code: str | None = None,
        location: Location | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.location: Location = _as_location(location if location is not None else where)
        if code is not None:
            self.code = code

    @property
    def where(self) -> str | None:
        return self.location.where() or None

    @where.setter
    def where(self, value: str | Location | None) -> None:
        self.location = _as_location(value)

    def name_source(self, file: str, *, placeholder: str | None = None) -> None:
        """Say which source this error is in, for library code that raised it
        knowing only a position inside (no file, or a ``placeholder`` name)."""
        if self.location.file is None or self.location.file == placeholder:
            self.location = self.location.in_file(file)

    def __str__(self) -> str:
        where = self.where
        return f"{where}: {self.message}" if where else self.message


def _as_location(value: str | Location | None) -> Location:
    if value is None or value == "":
        return Location()
    if isinstance(value, Location):
        return value
    return Location(value)


class InputRefused(CrucibleError):
    """The input was read and is refused or found wanting (exit 1)."""

    exit_code = EXIT_REFUSED
    code = "refused"


class UnsupportedVersion(InputRefused):
    """A plan ``version`` or manifest ``edition`` this engine does not run (exit 1)."""

    code = "unsupported-version"


class PlanChanged(InputRefused):
    """Resume found a plan whose digest differs from the one the run started with."""

    code = "plan-changed"


class UsageError(CrucibleError):
    """Bad command-line usage (exit 2)."""

    exit_code = EXIT_USAGE
    code = "usage"


class ParseError(CrucibleError):
    """Input that cannot be parsed at all: bad JSON, TOML, NDJSON line (exit 2)."""

    exit_code = EXIT_USAGE
    code = "parse"


class OperationalError(CrucibleError):
    """I/O failure, recording unavailable, no verdict reachable (exit 3)."""

    exit_code = EXIT_OPERATIONAL
    code = "operational"


class StartFailed(CrucibleError):
    """A child command could not be started: exit 2 when its argv names nothing
    runnable (not found, not executable), 3 for any other OS error. The base
    for a tool's own start failure (ledger's ``CannotStart``) to join the tree."""

    code = "cannot-start"

    def __init__(self, message: str, *, usage: bool, where: str | Location | None = None) -> None:
        super().__init__(message, where=where)
        self.usage = usage
        self.exit_code = EXIT_USAGE if usage else EXIT_OPERATIONAL


class Interrupted(CrucibleError):
    """Stopped by SIGINT (130) or SIGTERM (143) after recording what happened."""

    code = "interrupted"

    def __init__(self, message: str, *, signum: int = 2) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum
