"""The verdict vocabulary: phases, codes, and the exception that carries the first problem.

A reader stops at the first refusal or finding (docs/spec/verify.md, "Precedence");
:class:`Problem` carries where it stopped: code, phase, epoch, observation, path.
"""

from __future__ import annotations

from crucible.core.errors import OperationalError
from crucible.core.structs import dataclass

__all__ = [
    "CODES",
    "FINDING_PHASES",
    "Inability",
    "Problem",
    "over_bound",
]

#: every code the reader can report, with the phase(s) it belongs to
CODES: dict[str, tuple[int, ...]] = {
    "input-over-bound": (1,),
    "input-malformed": (1,),
    "version-unread": (1,),
    "kind-unread": (1,),
    "inventory-mismatch": (1, 4, 5),
    "digest-mismatch": (2,),
    "stage-binding-mismatch": (2,),
    "preparation-mismatch": (3,),
    "selection-mismatch": (4,),
    "case-mismatch": (4,),
    "influence-mismatch": (4,),
    "output-mismatch": (4, 5),
}

#: phase 1 yields refusals (the input is not read); later phases yield findings
FINDING_PHASES = frozenset({2, 3, 4, 5})


@dataclass
class Problem(Exception):
    """The first refusal or finding; raising it ends the reading."""

    code: str
    phase: int
    message: str
    path: str | None = None
    epoch: int | None = None
    observation: int | None = None

    def __post_init__(self) -> None:
        if self.phase not in CODES.get(self.code, ()):
            raise ValueError(f"code {self.code!r} does not belong to phase {self.phase}")
        super().__init__(self.message)

    @property
    def kind(self) -> str:
        return "finding" if self.phase in FINDING_PHASES else "refusal"

    def __str__(self) -> str:
        where = [f"phase {self.phase}"]
        if self.epoch is not None:
            where.append(f"epoch {self.epoch}")
        if self.observation is not None:
            where.append(f"observation {self.observation}")
        if self.path:
            where.append(self.path)
        return f"{self.code} ({', '.join(where)}): {self.message}"


class Inability(OperationalError):
    """The reader cannot reach a verdict (I/O failure, unsupported capability): exit 3.

    Never turned into a refusal or finding (RFC 0024 §5, §8). ``where`` is the bundle
    (escaped for one line); the message says what could not be read and why.
    """

    code = "no-verdict"

    def __init__(self, message: str, *, where: str | None = None) -> None:
        super().__init__(f"no verdict: {message}", where=where)


def over_bound(message: str, path: str | None = None, epoch: int | None = None) -> Problem:
    """Phase 1's ``input-over-bound`` refusal: the one shape of every bound the
    reader checks before it trusts a size, a count or a depth."""
    return Problem("input-over-bound", 1, message, path=path, epoch=epoch)
