"""A wide fan-out's plain instances as columns, not rows (docs/spec/run.md,
"Report", "At scale").

A mapped task with more than :data:`FOLD_ABOVE` instances keeps a row
(:class:`crucible.run.report._report.Row`, its attempts, its usage) only for
the instances a reader looks at: every one that did not pass at its first
attempt (failed, retried, skipped, interrupted, running, not started), and
its outliers (the :data:`SLOWEST` longest and the heaviest by peak RSS and by
CPU, :data:`HEAVIEST`). Each other instance, one attempt that passed, is
folded as soon as its ``task_finished`` is read: its figures in typed
arrays (~100 bytes) and its key in an index (~200 bytes with the key; 16
bytes when the keys are ``"0"`` .. ``"n-1"``, a map over an array), from
which the task's totals, spreads and the HTML page's density strip are
computed. A later event or record that
contradicts the fold (another attempt, a record that did not pass) unfolds the
instance back into a row first.
"""

from __future__ import annotations

import heapq
import math
from array import array
from collections.abc import Iterable, Iterator
from itertools import compress
from operator import and_
from typing import NamedTuple, TypeVar

from crucible.run.report._usage import UnitUsage, UsageFigures

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


_T = TypeVar("_T")


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


class _Keys:
    """A fold's keys by slot, and slots by key (any keys): a dict and a list."""

    __slots__ = ("index", "keys")

    def __init__(self) -> None:
        self.index: dict[str, int] = {}
        self.keys: list[str] = []

    def __len__(self) -> int:
        return len(self.index)

    def add(self, key: str) -> int | None:
        i = self.index[key] = len(self.keys)
        self.keys.append(key)
        return i

    def slot(self, key: str) -> int | None:
        return self.index.get(key)

    def pop(self, key: str) -> int:
        return self.index.pop(key)

    def key(self, i: int) -> str:
        return self.keys[i]


class _NumberedKeys:
    """A fold's keys when they are ``"0"`` .. ``"n-1"`` (a map over an array, the
    common wide fan-out): slots by key number and key numbers by slot in two
    integer arrays, 16 bytes an instance instead of a dict entry, an int and a
    string (~130 bytes: ~110 MiB at a million instances). A key of another form
    is not taken (:meth:`add` returns None; the fold then goes to :class:`_Keys`)."""

    __slots__ = ("count", "number", "slot_of")

    def __init__(self, n: int) -> None:
        #: the slot of each key number (-1: not folded)
        self.slot_of = array("q", [-1]) * n
        #: the key number of each slot
        self.number = array("q")
        self.count = 0

    def __len__(self) -> int:
        return self.count

    def _number(self, key: str) -> int | None:
        """The number ``key`` spells in canonical decimal (no sign, space, leading
        zero or other digits: ``str(n) == key``), below n; else None."""
        try:
            n = int(key)
        except ValueError:  # no number (or one over int's digit limit)
            return None
        return n if 0 <= n < len(self.slot_of) and str(n) == key else None

    def add(self, key: str) -> int | None:
        n = self._number(key)
        if n is None:
            return None
        i = self.slot_of[n] = len(self.number)
        self.number.append(n)
        self.count += 1
        return i

    def slot(self, key: str) -> int | None:
        n = self._number(key)
        i = -1 if n is None else self.slot_of[n]
        return None if i < 0 else i

    def pop(self, key: str) -> int:
        n = self._number(key)
        i = -1 if n is None else self.slot_of[n]
        if n is None or i < 0:
            raise KeyError(key)
        self.slot_of[n] = -1
        self.count -= 1
        return i

    def key(self, i: int) -> str:
        return str(self.number[i])

    def as_keys(self, alive: bytearray) -> _Keys:
        """The same slots in a :class:`_Keys` (``alive``: which are folded)."""
        keys = _Keys()
        keys.keys = [str(n) for n in self.number]
        keys.index = {k: i for i, k in enumerate(keys.keys) if alive[i]}
        return keys


class Folded:
    """The folded instances of one mapped task: one slot per instance, in the
    order they were folded; a slot whose instance was unfolded is dead."""

    __slots__ = (
        "_masks",
        "alive",
        "bound",
        "cached",
        "cpu",
        "duration",
        "end",
        "files_bytes",
        "known",
        "output_bytes",
        "pct",
        "pending",
        "read",
        "rss",
        "session",
        "slots",
        "start",
        "task",
        "write",
    )

    def __init__(self, task: str, numbered: int | None = None) -> None:
        """``numbered``: the task's keys are ``"0"`` .. ``"numbered-1"`` (its
        items an array), kept as numbers (:class:`_NumberedKeys`)."""
        #: the mapped task whose instances these are
        self.task = task
        #: instances that never started (no row, no slot): counted only
        self.pending = 0
        #: slot by key, key by slot
        self.slots: _Keys | _NumberedKeys = _Keys() if numbered is None else _NumberedKeys(numbered)
        #: 1 for a slot still folded (0: unfolded, dead)
        self.alive = bytearray()
        #: 1 for a slot that measured some usage figure (its row's ``usage`` not None)
        self.known = bytearray()
        #: the slot masks of :meth:`_mask`, made again after a fold or an unfold
        self._masks: dict[bool, bytes] = {}
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
        return len(self.slots)

    def __contains__(self, key: str) -> bool:
        return self.slots.slot(key) is not None

    def slot(self, key: str) -> int | None:
        """The slot of the folded instance ``key`` (None: not folded)."""
        return self.slots.slot(key)

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
        usage: UsageFigures | None,
    ) -> None:
        """Fold the instance ``key``: its one attempt, passed (the report drops
        its row); ``usage``: its figures (crucible.run.report._usage.usage_figures)."""
        if self.slots.add(key) is None:  # not a key number: every key kept as a string
            assert isinstance(self.slots, _NumberedKeys)
            self.slots = self.slots.as_keys(self.alive)
            self.slots.add(key)
        self.alive.append(1)
        self.cached.append(1 if cached else 0)
        self.session.append(session)
        self.start.append(start)
        self.end.append(end)
        self.duration.append(_f(duration))
        self.output_bytes.append(_i(output_bytes))
        self.files_bytes.append(_i(files_bytes))
        if usage is None:
            self.bound.append(0)
            self.cpu.append(_NAN)
            self.pct.append(_NAN)
            self.rss.append(_NONE)
            self.read.append(_NONE)
            self.write.append(_NONE)
            self.known.append(0)
        else:
            cpu, pct, _, rss, bound, read, write, _, _ = usage
            self.bound.append(1 if bound else 0)
            self.cpu.append(_f(cpu))
            self.pct.append(_f(pct))
            self.rss.append(_i(rss))
            self.read.append(_i(read))
            self.write.append(_i(write))
            unmeasured = cpu is None and pct is None and rss is None
            self.known.append(0 if unmeasured and read is None and write is None else 1)
        self._masks.clear()

    def take(self, key: str) -> Taken:
        """Unfold ``key``: what was kept of it, its slot dead from now on."""
        i = self.slots.pop(key)
        self.alive[i] = 0
        self._masks.clear()
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
        return compress(range(len(self.alive)), self.alive)

    def _mask(self, measured: bool = False) -> bytes | bytearray:
        """The slots to read: every live one, or (``measured``) every live one
        that measured some usage figure; made once (a wide task's figures are
        read a dozen times over) and again after a fold or an unfold."""
        if not measured:
            return self.alive
        mask = self._masks.get(measured)
        if mask is None:
            mask = self._masks[measured] = bytes(map(and_, self.alive, self.known))
        return mask

    def _live(self, column: Iterable[_T]) -> Iterator[_T]:
        """``column``'s values of the live slots, in slot order."""
        return compress(column, self.alive)

    def outliers(self) -> list[str]:
        """The keys of the folded instances that are kept as rows after all:
        the :data:`SLOWEST` by duration, the :data:`HEAVIEST` by peak RSS and by CPU."""
        chosen: set[int] = set()
        for name, n in (("duration", SLOWEST), ("max_rss_kib", HEAVIEST), ("cpu_s", HEAVIEST)):
            column = self._column(name)
            # (value, -slot) of each live slot that measured it: the largest
            # first, ties to the first folded; NaN and -1 are "not measured"
            ranked = (
                (float(v), -i)
                for v, i in zip(self._live(column), self.live(), strict=True)
                if v == v and v != _NONE
            )
            chosen.update(-i for _, i in heapq.nlargest(n, ranked))
        return [self.slots.key(i) for i in sorted(chosen)]

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
        return self._mask(measured=True).count(1)

    def usage_known(self, i: int) -> bool:
        return bool(self.known[i])

    def figure(self, name: str, *, measured: bool = False) -> list[float]:
        """A usage figure (a :class:`UnitUsage` attribute, ``duration``, or
        ``io``: read + write) of every live folded instance that has it (with
        ``measured``: only those that measured some usage figure)."""
        mask = self._mask(measured)
        if name == "io":
            r, w = compress(self.read, mask), compress(self.write, mask)
            return [
                float(max(a, 0) + max(b, 0))
                for a, b in zip(r, w, strict=True)
                if a != _NONE or b != _NONE
            ]
        column = self._column(name)
        if column.typecode == "d":
            return [v for v in compress(column, mask) if v == v]
        return [float(v) for v in compress(column, mask) if v != _NONE]

    def over_memory(self, limit_kib: float) -> int:
        """Live instances whose peak RSS (not a mere bound) is above ``limit_kib``."""
        pairs = zip(self._live(self.rss), self._live(self.bound), strict=True)
        return sum(1 for rss, bound in pairs if rss > limit_kib and not bound)

    def cached_count(self) -> int:
        return sum(self._live(self.cached))

    def totals(self) -> tuple[int, int, dict[int, list[float]], int | None, int | None, bool]:
        """(instances, attempts, busy span per session, output bytes, files
        bytes, every one cached) over the live folded instances."""
        n = self.alive.count(1)
        spans: dict[int, list[float]] = {}
        sessions = set(self._live(self.session))
        if len(sessions) == 1:  # the common case: one session, in C
            spans[sessions.pop()] = [min(self._live(self.start)), max(self._live(self.end))]
        else:
            for s, lo, hi in self.starts():
                span = spans.get(s)
                if span is None:
                    spans[s] = [lo, hi]
                else:
                    span[0] = min(span[0], lo)
                    span[1] = max(span[1], hi)
        out = [v for v in self._live(self.output_bytes) if v != _NONE]
        files = [v for v in self._live(self.files_bytes) if v != _NONE]
        return (
            n,
            n,
            spans,
            int(sum(out)) if out else None,
            int(sum(files)) if files else None,
            all(self._live(self.cached)),
        )

    def starts(self) -> Iterator[tuple[int, float, float]]:
        """(session, start, end) of each live folded instance (the HTML's strip)."""
        return zip(
            self._live(self.session), self._live(self.start), self._live(self.end), strict=True
        )

    def rss_bound_at(self, peak: float) -> bool:
        """Whether every live instance whose peak RSS is ``peak`` only bounds it."""
        pairs = zip(self._live(self.rss), self._live(self.bound), strict=True)
        return all(bound for rss, bound in pairs if rss == peak)

    def timed(self) -> tuple[float, float]:
        """(CPU, wall) summed over the instances that measured both (for %CPU)."""
        cpu = wall = 0.0
        for c, d in zip(self._live(self.cpu), self._live(self.duration), strict=True):
            if c == c and d == d and d:
                cpu += c
                wall += d
        return cpu, wall


def _opt(v: float) -> float | None:
    return None if v != v else v


def _opt_int(v: float) -> int | None:
    return None if v == _NONE else int(v)
