"""SIGINT/SIGTERM during a run: the first stops the run (nothing new starts,
running groups are terminated), a second stops waiting for the grace period.
The handler only records; the dispatcher's ``select`` wakes on the wake-up fd."""

from __future__ import annotations

import signal
from typing import Any

__all__ = ["StopSignals"]


class StopSignals:
    def __init__(self) -> None:
        #: the first signal received, once one was
        self.received: int | None = None
        #: a second signal: kill now, without the grace period
        self.escalate = False
        self._previous: dict[int, Any] = {}

    def install(self, wake_w: int) -> None:
        """Handle SIGINT/SIGTERM and wake ``select`` through ``wake_w`` (the
        main thread only: elsewhere the caller handles signals)."""

        def handler(signum: int, _frame: object) -> None:
            if self.received is None:
                self.received = signum
            else:
                self.escalate = True

        previous: dict[int, Any] = {}
        try:
            previous[-1] = signal.set_wakeup_fd(wake_w)
            for signum in (signal.SIGINT, signal.SIGTERM):
                previous[signum] = signal.signal(signum, handler)
        except ValueError:  # not the main thread: the caller handles signals
            previous.clear()
        self._previous = previous

    def restore(self) -> None:
        for signum, old in self._previous.items():
            if signum == -1:
                signal.set_wakeup_fd(old)
            else:
                signal.signal(signum, old)
        self._previous = {}
