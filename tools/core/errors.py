"""One exception tree; each class carries the exit code of DESIGN.md.

The command edge (:mod:`crucible.core.cli`) turns any of these into one stderr
line and its exit code. Library code raises them; it never prints or exits.
"""

from __future__ import annotations

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
    "OperationalError",
    "ParseError",
    "PlanChanged",
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
    """``file:line:col`` (or ``file:$.json.path``), omitting what is unknown."""
    parts = [
        p
        for p in (file, None if line is None else str(line), None if col is None else str(col))
        if p
    ]
    where = ":".join(parts)
    if path:
        where = f"{where}:{path}" if where else path
    return where


class CrucibleError(Exception):
    """Base of every anticipated failure. ``where`` locates it (file:line:col)."""

    exit_code: int = EXIT_REFUSED
    #: a stable, machine-readable name of the failure kind
    code: str = "error"

    def __init__(self, message: str, *, where: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.where = where or None
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return f"{self.where}: {self.message}" if self.where else self.message


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


class Interrupted(CrucibleError):
    """Stopped by SIGINT (130) or SIGTERM (143) after recording what happened."""

    code = "interrupted"

    def __init__(self, message: str, *, signum: int = 2) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum
