"""The live progress display on a terminal (stderr): done, running, failed,
remaining, elapsed, ETA. The CLI only creates it when stderr is a TTY, so a pipe
or a log file never sees it."""

from __future__ import annotations

import time
from typing import IO, Any

from crucible.run.engine._units import Counts

__all__ = ["LiveProgress", "describe"]


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def describe(counts: Counts, now: float | None = None) -> str:
    """One line: ``done 12 · running 2 · failed 1 · remaining 30 · 0:00:04 · ETA 0:00:10``."""
    elapsed = (time.monotonic() if now is None else now) - counts.started_at
    remaining = max(0, counts.total - counts.settled)
    eta = "?"
    if counts.settled and remaining:
        eta = _clock(elapsed / counts.settled * remaining)
    elif not remaining:
        eta = "0:00:00"
    failed = counts.failed + counts.skipped
    return (
        f"done {counts.passed} · running {counts.running} · failed {failed} · "
        f"remaining {remaining} · elapsed {_clock(elapsed)} · ETA {eta}"
    )


class LiveProgress:
    """A rich ``Live`` line refreshed at most 8 times a second."""

    def __init__(self, stream: IO[str]) -> None:
        # lazy: rich is heavy; only __init__() needs it
        from rich.console import Console
        from rich.live import Live

        self._console = Console(file=stream)
        self._live: Any = Live(console=self._console, refresh_per_second=8, transient=False)
        self._last = 0.0
        self._counts: Counts | None = None
        self._live.start()

    def __call__(self, counts: Counts) -> None:
        self._counts = counts
        now = time.monotonic()
        if now - self._last >= 0.125:
            self._last = now
            self._render(counts)

    def _render(self, counts: Counts) -> None:
        # lazy: rich is heavy; only _render() needs it
        from rich.progress_bar import ProgressBar
        from rich.table import Table

        grid = Table.grid(padding=(0, 1))
        grid.add_row(
            ProgressBar(total=max(1, counts.total), completed=counts.settled, width=30),
            describe(counts),
        )
        self._live.update(grid)

    def close(self) -> None:
        if self._counts is not None:
            self._render(self._counts)
        self._live.stop()
