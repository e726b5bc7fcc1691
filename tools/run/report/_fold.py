"""A wide fan-out's plain instances as columns, not rows (docs/spec/run.md,
"Report", "At scale").

A mapped task with more than :data:`FOLD_ABOVE` instances keeps a row
(:class:`crucible.run.report._report.Row`, its attempts, its usage) only for
the instances a reader looks at: every one that did not pass at its first
attempt (failed, retried, skipped, interrupted, running, not started), and
its outliers (the :data:`SLOWEST` longest and the heaviest by peak RSS and by
CPU, :data:`HEAVIEST`). Each other instance, one attempt that passed, is
folded as soon as its ``task_finished`` is read: its figures in typed
arrays (~100 bytes) and its key in an index (~200 bytes with the key), from
which the task's totals, spreads and the HTML page's density strip are
computed. A later event or record that
contradicts the fold (another attempt, a record that did not pass) unfolds the
instance back into a row first.
"""

from __future__ import annotations

import heapq
import math
from array import array
from collections.abc import Callable, Iterator
from typing import NamedTuple

from crucible.run.report._usage import UnitUsage

__all__ = ["FOLD_ABOVE", "HEAVIEST", "SLOWEST", "Folded", "Taken"]

#: a mapped task with more instances than this folds its plain ones (the HTML
#: page then draws at most about this many rows a task: issue 33, <= 2 MiB)
FOLD_ABOVE = 10_000
#: a folded task's longest instances kept as rows (outliers, always listed)
SLOWEST = 20
#: a folded task's heaviest instances by peak RSS and by CPU kept as rows
#: (the HTML's Resources section lists and links ten of each)
HEAVIEST = 10

_NONE = -1  # an integer column's "not measured"
_NAN = math.nan  # a float column's


def _f(v: float | None) -> float:
    return _NAN if v is None else v


def _i(v: int | None) -> int:
    return _NONE if v is None else v


class Taken(NamedTuple):
    """What a fold kept of an instance (its one attempt, passed, exit 0)."""

    session: int
    start: float
    end: float
    duration: float | None
    output_bytes: int | None
    files_bytes: int | None
    cached: bool
    usage: UnitUsage | None


class Folded:
    """The folded instances of one mapped task: one slot per instance, in the
    order they were folded; a slot whose instance was unfolded is dead."""

    __slots__ = (
        "alive",
        "bound",
        "cached",
        "cpu",
        "duration",
        "end",
        "files_bytes",
        "index",
        "keys",
        "output_bytes",
        "pct",
        "pending",
        "read",
        "rss",
        "session",
        "start",
        "task",
        "write",
    )

    def __init__(self, task: str) -> None:
        #: the mapped task whose instances these are
        self.task = task
        #: instances that never started (no row, no slot): counted only
        self.pending = 0
        self.index: dict[str, int] = {}
        self.keys: list[str] = []
        self.alive = bytearray()
        self.cached = bytearray()
        self.bound = bytearray()
        self.session = array("I")
        self.start = array("d")
        self.end = array("d")
        self.duration = array("d")
        self.output_bytes = array("q")
        self.files_bytes = array("q")
        self.cpu = array("d")
        self.pct = array("d")
        self.rss = array("q")
        self.read = array("q")
        self.write = array("q")

    def __len__(self) -> int:
        return len(self.index)

    def __contains__(self, key: object) -> bool:
        return key in self.index

    def add(
        self,
        key: str,
        session: int,
        start: float,
        end: float,
        duration: float | None,
        output_bytes: int | None,
        files_bytes: int | None,
        cached: bool,
        usage: UnitUsage | None,
    ) -> None:
        """Fold the instance ``key``: its one attempt, passed (the report drops its row)."""
        u = usage
        self.index[key] = len(self.keys)
        self.keys.append(key)
        self.alive.append(1)
        self.cached.append(1 if cached else 0)
        self.bound.append(1 if u is not None and u.rss_bound else 0)
        self.session.append(session)
        self.start.append(start)
        self.end.append(end)
        self.duration.append(_f(duration))
        self.output_bytes.append(_i(output_bytes))
        self.files_bytes.append(_i(files_bytes))
        self.cpu.append(_NAN if u is None else _f(u.cpu_s))
        self.pct.append(_NAN if u is None else _f(u.cpu_pct))
        self.rss.append(_NONE if u is None else _i(u.max_rss_kib))
        self.read.append(_NONE if u is None else _i(u.read_bytes))
        self.write.append(_NONE if u is None else _i(u.write_bytes))

    def take(self, key: str) -> Taken:
        """Unfold ``key``: what was kept of it, its slot dead from now on."""
        i = self.index.pop(key)
        self.alive[i] = 0
        return Taken(
            session=self.session[i],
            start=self.start[i],
            end=self.end[i],
            duration=_opt(self.duration[i]),
            output_bytes=_opt_int(self.output_bytes[i]),
            files_bytes=_opt_int(self.files_bytes[i]),
            cached=bool(self.cached[i]),
            usage=self.usage(i),
        )

    def usage(self, i: int) -> UnitUsage | None:
        cpu, pct, rss = _opt(self.cpu[i]), _opt(self.pct[i]), _opt_int(self.rss[i])
        read, write = _opt_int(self.read[i]), _opt_int(self.write[i])
        if cpu is None and rss is None and pct is None and read is None and write is None:
            return None
        return UnitUsage(
            cpu_s=cpu,
            cpu_pct=pct,
            wall_s=_opt(self.duration[i]),
            max_rss_kib=rss,
            rss_bound=bool(self.bound[i]),
            read_bytes=read,
            write_bytes=write,
            vol_ctxt=None,
            inv_ctxt=None,
        )

    def live(self) -> Iterator[int]:
        """The slots of the instances still folded."""
        return (i for i, a in enumerate(self.alive) if a)

    def outliers(self) -> list[str]:
        """The keys of the folded instances that are kept as rows after all:
        the :data:`SLOWEST` by duration, the :data:`HEAVIEST` by peak RSS and by CPU."""
        chosen: set[int] = set()
        for name, n in (("duration", SLOWEST), ("max_rss_kib", HEAVIEST), ("cpu_s", HEAVIEST)):
            column = self._column(name)
            measured = (i for i in self.live() if column[i] == column[i] and column[i] != _NONE)
            # ties: the first folded (a generator: nothing a million long is built)
            chosen.update(heapq.nlargest(n, measured, key=_ranked(column)))
        return [self.keys[i] for i in sorted(chosen)]

    def _column(self, name: str) -> array[float] | array[int]:
        if name in ("duration", "wall_s"):
            return self.duration
        if name == "cpu_s":
            return self.cpu
        if name == "cpu_pct":
            return self.pct
        if name == "max_rss_kib":
            return self.rss
        if name == "read_bytes":
            return self.read
        if name == "write_bytes":
            return self.write
        raise KeyError(name)

    # -- what the report's totals read --------------------------------------

    def measured(self) -> int:
        """Folded instances with some usage figure (a row's ``usage`` not None)."""
        return sum(1 for i in self.live() if self.usage_known(i))

    def usage_known(self, i: int) -> bool:
        return (
            self.cpu[i] == self.cpu[i]
            or self.rss[i] != _NONE
            or self.pct[i] == self.pct[i]
            or self.read[i] != _NONE
            or self.write[i] != _NONE
        )

    def figure(self, name: str, *, measured: bool = False) -> list[float]:
        """A usage figure (a :class:`UnitUsage` attribute, ``duration``, or
        ``io``: read + write) of every live folded instance that has it (with
        ``measured``: only those that measured some usage figure)."""
        live = (i for i in self.live() if self.usage_known(i)) if measured else self.live()
        if name == "io":
            r, w = self.read, self.write
            return [
                float(max(r[i], 0) + max(w[i], 0)) for i in live if r[i] != _NONE or w[i] != _NONE
            ]
        column = self._column(name)
        if column.typecode == "d":
            return [column[i] for i in live if column[i] == column[i]]
        return [float(column[i]) for i in live if column[i] != _NONE]

    def over_memory(self, limit_kib: float) -> int:
        """Live instances whose peak RSS (not a mere bound) is above ``limit_kib``."""
        return sum(1 for i in self.live() if self.rss[i] > limit_kib and not self.bound[i])

    def cached_count(self) -> int:
        return sum(1 for i in self.live() if self.cached[i])

    def totals(self) -> tuple[int, int, dict[int, list[float]], int | None, int | None, bool]:
        """(instances, attempts, busy span per session, output bytes, files
        bytes, every one cached) over the live folded instances."""
        n = 0
        spans: dict[int, list[float]] = {}
        out = files = 0
        out_known = files_known = False
        cached = True
        for i in self.live():
            n += 1
            s, lo, hi = self.session[i], self.start[i], self.end[i]
            span = spans.get(s)
            if span is None:
                spans[s] = [lo, hi]
            else:
                span[0] = min(span[0], lo)
                span[1] = max(span[1], hi)
            if self.output_bytes[i] != _NONE:
                out += self.output_bytes[i]
                out_known = True
            if self.files_bytes[i] != _NONE:
                files += self.files_bytes[i]
                files_known = True
            cached = cached and bool(self.cached[i])
        return (
            n,
            n,
            spans,
            out if out_known else None,
            files if files_known else None,
            cached,
        )

    def starts(self) -> Iterator[tuple[int, float, float]]:
        """(session, start, end) of each live folded instance (the HTML's strip)."""
        return ((self.session[i], self.start[i], self.end[i]) for i in self.live())

    def rss_bound_at(self, peak: float) -> bool:
        """Whether every live instance whose peak RSS is ``peak`` only bounds it."""
        return all(self.bound[i] for i in self.live() if self.rss[i] == peak)

    def timed(self) -> tuple[float, float]:
        """(CPU, wall) summed over the instances that measured both (for %CPU)."""
        cpu = wall = 0.0
        for i in self.live():
            c, d = self.cpu[i], self.duration[i]
            if c == c and d == d and d:
                cpu += c
                wall += d
        return cpu, wall


def _ranked(column: array[float] | array[int]) -> Callable[[int], tuple[float, int]]:
    """A slot's rank by ``column`` (ties: the first folded first)."""

    def rank(i: int) -> tuple[float, int]:
        return (float(column[i]), -i)

    return rank


def _opt(v: float) -> float | None:
    return None if v != v else v


def _opt_int(v: float) -> int | None:
    return None if v == _NONE else int(v)
