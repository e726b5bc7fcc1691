"""The one bound on every duration a pack sets (docs/spec/manifest.md,
"Durations"): a task's ``timeout`` and ``deadline``, ``retry.delay`` and
``retry.max_delay``, ``[loop] time_budget``.

A duration becomes a point in time (now + duration) in the dispatcher: ``poll``
and the clock refuse one past their range (``timeout = 1e10`` ended a run with
``OverflowError: timestamp too large``), and no run waits for longer than a year.
"""

from __future__ import annotations

import math

__all__ = ["MAX_DURATION_S", "MAX_WAIT_S", "duration_problem"]

#: our choice: 365 days, far below any clock's range and above any real wait
MAX_DURATION_S = 365 * 24 * 3600
#: the longest single wait of the dispatcher (a day): poll and epoll take at most
#: 2^31−1 ms (24.8 days; a 30-day timeout was ``OverflowError: timeout is too
#: large``), so a wait for a later point in time wakes and waits again
MAX_WAIT_S = 86_400.0


def duration_problem(value: float, *, zero: bool) -> str | None:
    """Why a number of seconds is no duration (``zero``: 0 is one), or None."""
    if math.isnan(value) or value < 0 or (value == 0 and not zero):
        return "must be zero or more" if zero else "must be greater than zero"
    if value > MAX_DURATION_S:
        return f"must be at most {MAX_DURATION_S} seconds (365 days)"
    return None
