"""The scored loop's time budget (docs/spec/loop.md, ``time_budget``): loop time
summed over sessions, and the wall-clock moment a revision unit is stopped."""

from __future__ import annotations

import time

__all__ = ["TimeBudget"]

#: how far before the budget's end a unit's timeout counts as the budget's: the
#: worker's wall-clock deadline and this monotonic clock may disagree by a little
CUT_SLACK_S = 0.05


class TimeBudget:
    """``seconds`` of loop time (None: no budget), ``earlier_s`` of it spent in
    earlier sessions; this session's share runs from :meth:`begin`."""

    def __init__(self, seconds: float | None, earlier_s: float) -> None:
        self.seconds = seconds
        self.earlier_s = earlier_s
        self.session_start: float | None = None

    def begin(self) -> None:
        """The loop starts running in this session."""
        self.session_start = time.monotonic()

    def elapsed(self) -> float:
        start = self.session_start if self.session_start is not None else time.monotonic()
        return self.earlier_s + time.monotonic() - start

    def out_of_time(self) -> bool:
        return self.seconds is not None and self.elapsed() >= self.seconds

    def nearly_out(self) -> bool:
        """Out of time, give or take :data:`CUT_SLACK_S`: a unit's timeout now is
        the budget's."""
        return self.seconds is not None and self.elapsed() >= self.seconds - CUT_SLACK_S

    def stop_at(self) -> tuple[float, ...]:
        """The wall-clock time the budget ends (a worker stops the unit then),
        or nothing without a budget."""
        if self.seconds is None:
            return ()
        return (time.time() + max(0.0, self.seconds - self.elapsed()),)
