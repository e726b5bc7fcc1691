"""What the report says about resource usage (docs/spec/run.md, "Resource usage"
and "Report"): per unit the last attempt's CPU, %CPU, peak RSS and block I/O;
per task their sum, max and median over its units; and ``report --tsv``, a
trace file in Nextflow's trace field names and raw units.

The figures are the ones each attempt's ``task_finished`` carries
(crucible.run.executors._usage); nothing here measures anything.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import IO, Any, Protocol, TypeAlias

from crucible.core.structs import dataclass

__all__ = [
    "TRACE_COLUMNS",
    "MoreUnits",
    "Stats",
    "UnitUsage",
    "UsageFigures",
    "cpu_text",
    "pct_text",
    "render_tsv",
    "rss_text",
    "size_text",
    "stats",
    "task_json",
    "unit_json",
    "unit_usage",
    "usage_figures",
    "usage_line",
]


@dataclass(frozen=True, slots=True)
class UnitUsage:
    """One attempt's figures as the report shows them (None: not measured)."""

    cpu_s: float | None
    cpu_pct: float | None
    #: the attempt's wall time (its ``duration``), the base of cpu_pct
    wall_s: float | None
    max_rss_kib: int | None
    #: max_rss_kib is only an upper bound (at or below the spawner's RSS)
    rss_bound: bool
    read_bytes: int | None
    write_bytes: int | None
    vol_ctxt: int | None
    inv_ctxt: int | None

    def figures(self) -> UsageFigures:
        """Its fields as a tuple, in their order (:func:`usage_figures`)."""
        return (
            self.cpu_s,
            self.cpu_pct,
            self.wall_s,
            self.max_rss_kib,
            self.rss_bound,
            self.read_bytes,
            self.write_bytes,
            self.vol_ctxt,
            self.inv_ctxt,
        )


#: a :class:`UnitUsage`'s fields as a tuple, in their order
UsageFigures: TypeAlias = tuple[
    float | None,
    float | None,
    float | None,
    int | None,
    bool,
    int | None,
    int | None,
    int | None,
    int | None,
]


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        return None
    return float(value)


def _count(value: Any) -> int | None:
    return value if type(value) is int and value >= 0 else None


def unit_usage(fields: dict[str, Any], duration: float | None) -> UnitUsage | None:
    """The figures of one ``task_finished`` (or a record's ``usage``), or None
    when it carries none (written before usage was recorded, or unstarted)."""
    figures = usage_figures(fields, duration)
    return None if figures is None else UnitUsage(*figures)


def usage_figures(fields: dict[str, Any], duration: float | None) -> UsageFigures | None:
    """:func:`unit_usage`'s figures as a tuple in :class:`UnitUsage`'s field
    order, without building the object (a wide fan-out's fold reads them once
    per instance)."""
    if "cpu_user_s" not in fields and "max_rss_kib" not in fields:
        return None
    user, system = _number(fields.get("cpu_user_s")), _number(fields.get("cpu_sys_s"))
    cpu = None if user is None or system is None else round(user + system, 6)
    pct = None
    if cpu is not None and duration is not None and duration > 0:
        pct = round(100.0 * cpu / duration, 1)
    rss = _count(fields.get("max_rss_kib"))
    spawner = _count(fields.get("spawner_rss_kib"))
    return (
        cpu,
        pct,
        duration,
        rss,
        rss is not None and spawner is not None and rss <= spawner,
        _count(fields.get("read_bytes")),
        _count(fields.get("write_bytes")),
        _count(fields.get("vol_ctxt")),
        _count(fields.get("inv_ctxt")),
    )


@dataclass(frozen=True, slots=True)
class Stats:
    """Sum, max and median of one figure over a task's measured units."""

    count: int
    sum: float
    max: float
    median: float

    def to_json(self, whole: bool) -> dict[str, float | int]:
        def shown(v: float) -> float | int:
            return int(v) if whole else round(v, 6)

        return {"sum": shown(self.sum), "max": shown(self.max), "median": shown(self.median)}


def stats(values: Iterable[float | int | None]) -> Stats | None:
    """The :class:`Stats` of the values that were measured (None: none was)."""
    measured = sorted(float(v) for v in values if v is not None)
    if not measured:
        return None
    n = len(measured)
    middle = n // 2
    median = measured[middle] if n % 2 else (measured[middle - 1] + measured[middle]) / 2
    return Stats(n, sum(measured), measured[-1], median)


#: the figures a task's row aggregates: (name, attribute, whole number)
FIGURES = (
    ("cpu_s", "cpu_s", False),
    ("cpu_pct", "cpu_pct", False),
    ("max_rss_kib", "max_rss_kib", True),
    ("read_bytes", "read_bytes", True),
    ("write_bytes", "write_bytes", True),
)


class MoreUnits(Protocol):
    """Units measured without a row each (a wide fan-out's folded instances:
    crucible.run.report._fold), counted in with the rows' figures."""

    def figure(self, name: str) -> list[float]:
        """A figure (a :class:`UnitUsage` attribute) of each unit that measured it."""
        ...

    def measured(self) -> int:
        """How many of them measured anything."""
        ...


def task_stats(units: Sequence[UnitUsage], more: MoreUnits | None = None) -> dict[str, Stats]:
    """Each figure's :class:`Stats` over ``units`` and ``more`` (figures none
    measured left out)."""
    found: dict[str, Stats] = {}
    for name, attr, _ in FIGURES:
        values: Iterable[float | int | None] = (getattr(u, attr) for u in units)
        if more is not None:
            values = [*values, *more.figure(attr)]
        s = stats(values)
        if s is not None:
            found[name] = s
    return found


def task_json(units: Sequence[UnitUsage], more: MoreUnits | None = None) -> dict[str, Any] | None:
    """A mapped task's ``usage`` member of ``report --json`` (None: nothing measured)."""
    found = task_stats(units, more)
    if not found:
        return None
    whole = {name: w for name, _, w in FIGURES}
    out: dict[str, Any] = {"units": len(units) + (more.measured() if more is not None else 0)}
    out.update({name: s.to_json(whole[name]) for name, s in found.items()})
    if "cpu_pct" in out:  # a sum of percentages says nothing
        del out["cpu_pct"]["sum"]
    return out


def unit_json(u: UnitUsage) -> dict[str, Any]:
    """A unit's members of ``report --json`` (absent ones left out)."""
    data = {
        "cpu_s": u.cpu_s,
        "cpu_pct": u.cpu_pct,
        "max_rss_kib": u.max_rss_kib,
        "rss_bound": True if u.rss_bound else None,
        "read_bytes": u.read_bytes,
        "write_bytes": u.write_bytes,
        "vol_ctxt": u.vol_ctxt,
        "inv_ctxt": u.inv_ctxt,
    }
    return {k: v for k, v in data.items() if v is not None}


# -- text ---------------------------------------------------------------------


def size_text(n: float | None) -> str:
    """Bytes as people read them: ``512 B``, ``1.5 MiB``; ``-`` when unknown."""
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover - the loop returns


def rss_text(kib: float | None, bound: bool = False) -> str:
    """Peak RSS in KiB as people read it; ``<=`` when it only bounds the peak."""
    if kib is None:
        return "-"
    return ("<=" if bound else "") + size_text(kib * 1024)


def cpu_text(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.3f}s"


def pct_text(pct: float | None) -> str:
    return "-" if pct is None else f"{pct:.0f}%"


def usage_line(units: Sequence[UnitUsage], more: MoreUnits | None = None) -> str:
    """The line under a mapped task's row: over its measured units (``units``
    and ``more``), the sum, max and median of CPU, the median %CPU, the max
    and median peak RSS, and the sum and max of its I/O ("" with fewer than
    two: its row says it all)."""
    n = len(units) + (more.measured() if more is not None else 0)
    if n < 2:
        return ""
    s = task_stats(units, more)
    parts = []
    if "cpu_s" in s:
        c = s["cpu_s"]
        parts.append(f"cpu sum {cpu_text(c.sum)} max {cpu_text(c.max)} median {cpu_text(c.median)}")
    if "cpu_pct" in s:
        parts.append(f"%cpu median {pct_text(s['cpu_pct'].median)}")
    if "max_rss_kib" in s:
        r = s["max_rss_kib"]
        parts.append(f"peak rss max {rss_text(r.max)} median {rss_text(r.median)}")
    for figure, label in (("read_bytes", "read"), ("write_bytes", "write")):
        if figure in s:
            f = s[figure]
            parts.append(f"{label} sum {size_text(f.sum)} max {size_text(f.max)}")
    return f"usage of {n} units: " + "; ".join(parts)


# -- report --tsv: a Nextflow trace ---------------------------------------------

#: Nextflow's trace fields whose meaning is ours too (raw units: milliseconds,
#: bytes, percent as a number), then ours
TRACE_COLUMNS = (
    "task_id",
    "name",
    "status",
    "exit",
    "attempt",
    "start",
    "complete",
    "realtime",
    "%cpu",
    "peak_rss",
    "read_bytes",
    "write_bytes",
    "vol_ctxt",
    "inv_ctxt",
    "process",
    "tag",
    "session",
    "cpu_user",
    "cpu_sys",
    "spawner_rss",
    "crucible_status",
)

#: our attempt status -> Nextflow's (a cache hit is CACHED whatever it says)
_NF_STATUS = {
    "passed": "COMPLETED",
    "failed": "FAILED",
    "interrupted": "ABORTED",
    "running": "RUNNING",
}


def _cell(value: Any) -> str:
    """A TSV cell: ``-`` for none (as Nextflow writes it); text with a tab,
    newline or backslash escaped, so a cell never splits a row."""
    if value is None:
        return "-"
    text = str(value)
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


def _seconds_cell(value: Any) -> str | None:
    seconds = _number(value)
    return None if seconds is None else f"{seconds:.6f}"


def _ms(seconds: float | None) -> int | None:
    return None if seconds is None else round(seconds * 1000)


def trace_rows(attempts: Iterable[tuple[str, str | None, Any]]) -> list[list[str]]:
    """One trace row per attempt that started (``(task, key, Attempt)``), in
    start order; ``task_id`` numbers them from 1."""
    started = sorted(
        (a.start, i, task, key, a)
        for i, (task, key, a) in enumerate(attempts)
        if a.start is not None
    )
    rows = []
    for number, (start, _, task, key, a) in enumerate(started, start=1):
        f = a.fields or {}
        realtime = None if a.end is None else max(0.0, a.end - start)
        if isinstance(f.get("duration"), int | float):
            realtime = float(f["duration"])
        u = unit_usage(f, realtime)
        status = "CACHED" if f.get("cached") else _NF_STATUS.get(a.status, a.status.upper())
        rss = None if u is None or u.max_rss_kib is None else u.max_rss_kib * 1024
        spawner = _count(f.get("spawner_rss_kib"))
        values = [
            number,
            task if key is None else f"{task} ({key})",
            status,
            a.exit_code,
            a.number,
            _ms(start),
            _ms(a.end),
            _ms(realtime),
            None if u is None or u.cpu_pct is None else f"{u.cpu_pct:.1f}",
            rss,
            None if u is None else u.read_bytes,
            None if u is None else u.write_bytes,
            None if u is None else u.vol_ctxt,
            None if u is None else u.inv_ctxt,
            task,
            key,
            a.session,
            _seconds_cell(f.get("cpu_user_s")),
            _seconds_cell(f.get("cpu_sys_s")),
            None if spawner is None else spawner * 1024,
            a.status,
        ]
        rows.append([_cell(v) for v in values])
    return rows


def render_tsv(attempts: Iterable[tuple[str, str | None, Any]], out: IO[str]) -> None:
    """``report --tsv``: the header and one row per attempt."""
    out.write("\t".join(TRACE_COLUMNS) + "\n")
    for row in trace_rows(attempts):
        out.write("\t".join(row) + "\n")
